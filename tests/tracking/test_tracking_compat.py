"""Accelerate's tracking API: ``GeneralTracker.start()`` called by ``init_trackers`` (after building every
tracker, before the configuration is stored), ``register_tracker_class``, ``LOGGER_TYPE_TO_CLASS``,
``filter_trackers`` and the tracker classes importable from ``drivetrain.tracking``."""

from __future__ import annotations

import json
import pathlib
import warnings

import pytest

from drivetrain import Accelerator
from drivetrain.tracking import GeneralTracker, on_main_process, register_tracker_class
from drivetrain.tracking import trackers as tracker_registry


class WriterAtStart(GeneralTracker):
    """Like Accelerate's built-in trackers: its writer exists only once ``start()`` ran."""

    name = "writer_at_start"
    requires_logging_directory = True

    def __init__(self, run_name, logging_dir):
        super().__init__()
        self.path = pathlib.Path(logging_dir, f"{run_name}.jsonl")
        self.writer = None

    @on_main_process
    def start(self):
        self.writer = self.path.open("a")
        self.writer.write(json.dumps({"event": "start"}) + "\n")

    @property
    def tracker(self):
        return self.writer

    @on_main_process
    def store_init_configuration(self, values):
        self.writer.write(json.dumps({"event": "config", "values": values}) + "\n")

    @on_main_process
    def log(self, values, step=None, **kwargs):
        self.writer.write(json.dumps({"event": "log", "values": values, "step": step}) + "\n")

    @on_main_process
    def finish(self):
        self.writer.close()


@pytest.fixture
def registered():
    register_tracker_class(WriterAtStart)
    yield
    tracker_registry._USER_TRACKERS.pop(WriterAtStart.name, None)


def test_a_registered_tracker_is_started_before_its_configuration_is_stored(tmp_path, registered):
    accelerator = Accelerator(cpu=True, log_with="writer_at_start", project_dir=tmp_path)
    accelerator.init_trackers("run", config={"lr": 0.1})
    accelerator.log({"loss": 0.5}, step=1)
    accelerator.end_training()
    lines = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert lines == [
        {"event": "start"},
        {"event": "config", "values": {"lr": 0.1}},
        {"event": "log", "values": {"loss": 0.5}, "step": 1},
    ]


def test_register_tracker_class_checks_the_class_and_warns_when_it_takes_a_name_over(registered):
    with pytest.raises(ValueError, match="subclass of `GeneralTracker`"):
        register_tracker_class(dict)

    class Nameless(GeneralTracker):
        requires_logging_directory = False
        tracker = None

    with pytest.raises(ValueError, match="non-empty `name`"):
        register_tracker_class(Nameless)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        register_tracker_class(WriterAtStart)
    assert any("already registered" in str(warning.message) for warning in caught)


def test_logger_type_to_class_and_filter_trackers(tmp_path, registered):
    from drivetrain.tracking import LOGGER_TYPE_TO_CLASS, filter_trackers, get_available_trackers

    assert LOGGER_TYPE_TO_CLASS["writer_at_start"] is WriterAtStart
    for name in (
        "aim",
        "comet_ml",
        "mlflow",
        "tensorboard",
        "wandb",
        "clearml",
        "dvclive",
        "swanlab",
        "trackio",
    ):
        assert LOGGER_TYPE_TO_CLASS[name].__name__.lower().startswith(name.replace("_", "")[:4])
    assert filter_trackers(["writer_at_start"], logging_dir=tmp_path) == ["writer_at_start"]
    with pytest.raises(ValueError, match="requires a `logging_dir`"):
        filter_trackers(["writer_at_start"])
    with pytest.raises(ValueError, match="Unsupported logging capability: nope"):
        filter_trackers(["nope"])
    assert "writer_at_start" in get_available_trackers()


def test_every_accelerate_tracker_class_is_importable_from_drivetrain_tracking():
    import drivetrain.tracking as tracking

    for class_name in (
        "AimTracker CometMLTracker MLflowTracker TensorBoardTracker WandBTracker ClearMLTracker DVCLiveTracker "
        "SwanLabTracker TrackioTracker"
    ).split():
        cls = getattr(tracking, class_name)
        assert cls.__name__ == class_name
