"""Experiment tracking through the Accelerator: resolving log_with, the tracker lifecycle, and which process
writes. The trackers here are real GeneralTracker subclasses that write JSON lines, registered through a
plugin's ``register_extensions`` hook exactly as drivetrain-trackers registers its own."""

from __future__ import annotations

import json
import os
import pathlib
import textwrap
import types

import pytest
import torch

from drivetrain import Accelerator, hookimpl
from drivetrain.config.enums import LoggerType
from drivetrain.contract.registry import get_plugin_registry
from drivetrain.errors import ConfigurationError
from drivetrain.tracking import GeneralTracker, on_main_process, resolve_log_with, validate_log_with


class JsonLinesTracker(GeneralTracker):
    """Appends every call as one JSON line to ``<logging_dir>/<run_name>/<name>.jsonl``."""

    name = "jsonlines"
    requires_logging_directory = True

    def __init__(self, run_name, logging_dir, suffix=""):
        super().__init__()
        self.path = pathlib.Path(logging_dir, run_name, f"{self.name}{suffix}.jsonl")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.write("init", run_name)

    def write(self, kind, payload):
        with self.path.open("a") as handle:
            handle.write(json.dumps({"kind": kind, "payload": payload}) + "\n")

    @property
    def tracker(self):
        return self.path

    def store_init_configuration(self, values):
        self.write("config", values)

    def log(self, values, step=None, **kwargs):
        self.write("log", {"values": values, "step": step, **kwargs})

    def finish(self):
        self.write("finish", None)


class NoDirTracker(JsonLinesTracker):
    name = "nodir"
    requires_logging_directory = False

    def __init__(self, run_name, where):
        GeneralTracker.__init__(self)
        self.path = pathlib.Path(where, f"{run_name}.jsonl")
        self.write("init", run_name)


class MissingLibraryTracker(JsonLinesTracker):
    name = "needs-missing-lib"
    requires = ("drivetrain_no_such_library_xyz",)


def read(path) -> list[dict]:
    return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines()]


@pytest.fixture
def registered(monkeypatch):
    """Register the test trackers the way a plugin does, with no other tracker plugin loaded (installed
    tracker plugins are tested in contrib/trackers/tests)."""
    monkeypatch.setenv("DRIVETRAIN_LOAD_PLUGINS", "local,ddp")
    plugin = types.SimpleNamespace(
        register_extensions=hookimpl(
            lambda registry: [
                registry.add_tracker(cls.name, cls)
                for cls in (JsonLinesTracker, NoDirTracker, MissingLibraryTracker)
            ]
        )
    )
    get_plugin_registry().register("test-trackers", plugin)
    yield
    get_plugin_registry().unregister("test-trackers")


def test_named_tracker_lifecycle(tmp_path, registered):
    accelerator = Accelerator(cpu=True, log_with="jsonlines", project_dir=tmp_path)
    accelerator.init_trackers(
        "run1", config={"lr": 0.1, "layers": 2}, init_kwargs={"jsonlines": {"suffix": "-a"}}
    )
    accelerator.log(
        {"loss": torch.tensor(0.5), "acc": torch.tensor([0.25]), "note": "hi"},
        step=3,
        log_kwargs={"jsonlines": {"extra": 1}, "other": {"ignored": True}},
    )
    tracker = accelerator.get_tracker("jsonlines")
    assert isinstance(tracker, JsonLinesTracker)
    assert accelerator.get_tracker("jsonlines", unwrap=True) == tmp_path / "run1" / "jsonlines-a.jsonl"
    assert accelerator.trackers == [tracker]
    accelerator.end_training()
    records = read(tmp_path / "run1" / "jsonlines-a.jsonl")
    assert records == [
        {"kind": "init", "payload": "run1"},
        {"kind": "config", "payload": {"lr": 0.1, "layers": 2}},
        # tensors arrive as Python numbers; only this tracker's log_kwargs reach it
        {
            "kind": "log",
            "payload": {"values": {"loss": 0.5, "acc": 0.25, "note": "hi"}, "step": 3, "extra": 1},
        },
        {"kind": "finish", "payload": None},
    ]
    with pytest.raises(
        ValueError, match="'wandb' is not a tracker of this Accelerator; its trackers: jsonlines"
    ):
        accelerator.get_tracker("wandb")


def test_instances_names_and_enum_mix(tmp_path, registered):
    class Custom(GeneralTracker):
        name = "custom"
        requires_logging_directory = False

        def __init__(self):
            super().__init__()
            self.logged = []

        @property
        def tracker(self):
            return self.logged

        def log(self, values, step=None, **kwargs):
            self.logged.append((values, step))

    custom = Custom()
    accelerator = Accelerator(
        cpu=True, log_with=[custom, "jsonlines", "jsonlines", LoggerType.ALL], project_dir=tmp_path
    )
    accelerator.init_trackers("run", init_kwargs={"nodir": {"where": str(tmp_path)}})
    # order kept, duplicates dropped, "all" adds every other available tracker (not the one missing its library)
    assert [t.name for t in accelerator.trackers] == ["custom", "jsonlines", "nodir"]
    accelerator.log({"x": 1}, step=7)
    assert custom.logged == [({"x": 1}, 7)]
    assert accelerator.get_tracker("custom", unwrap=True) is custom.logged
    assert read(tmp_path / "run.jsonl")[-1]["payload"]["values"] == {"x": 1}


def test_log_with_errors(tmp_path, registered):
    with pytest.raises(
        ConfigurationError,
        match=r"unknown tracker 'jsonline'.*installed: jsonlines, needs-missing-lib, "
        r"nodir",
    ):
        Accelerator(cpu=True, log_with=["jsonline"], project_dir=tmp_path)
    with pytest.raises(ConfigurationError, match=r"pip install 'drivetrain-trackers\[wandb\]'"):
        validate_log_with(["wandb"])
    with pytest.raises(ConfigurationError, match="drivetrain_no_such_library_xyz does not import"):
        validate_log_with("needs-missing-lib")
    with pytest.raises(ConfigurationError, match="pass an instance"):
        validate_log_with(JsonLinesTracker)
    with pytest.raises(ConfigurationError, match="not int"):
        validate_log_with([3])
    with pytest.raises(ConfigurationError, match="requires a `logging_dir`"):
        resolve_log_with("jsonlines", logging_dir=None)
    # No project_dir: refused when the Accelerator is built, as Accelerate does, not later in the run.
    with pytest.raises(ConfigurationError, match="Logging with `jsonlines` requires a `logging_dir`"):
        Accelerator(cpu=True, log_with="jsonlines")
    with pytest.raises(ValueError, match="call accelerator.init_trackers"):
        Accelerator(cpu=True).get_tracker("jsonlines")


def test_all_without_logging_dir_leaves_out_trackers_that_need_one(registered):
    resolved = resolve_log_with("all", logging_dir=None)
    names = [entry.name for entry in resolved]
    assert "jsonlines" not in names and "needs-missing-lib" not in names and "nodir" in names


def test_general_tracker_checks_its_subclass():
    class Nameless(GeneralTracker):
        requires_logging_directory = False

    with pytest.raises(NotImplementedError, match="must define: `name`"):
        Nameless()


def test_on_main_process_decorator_respects_main_process_only(monkeypatch):
    class Counting(GeneralTracker):
        name = "counting"
        requires_logging_directory = False
        calls = 0

        @on_main_process
        def log(self, values, step=None, **kwargs):
            type(self).calls += 1

    monkeypatch.setenv("RANK", "1")  # no process state yet: the launcher's rank decides
    tracker = Counting()
    tracker.log({})
    assert Counting.calls == 0
    tracker.main_process_only = False
    tracker.log({})
    assert Counting.calls == 1


MULTIPROCESS_SCRIPT = textwrap.dedent(
    """
    import json, pathlib, sys, types
    sys.path.insert(0, {tests_dir!r})
    from test_tracking import JsonLinesTracker
    from drivetrain import Accelerator, hookimpl
    from drivetrain.contract.registry import get_plugin_registry

    class EveryRank(JsonLinesTracker):
        name = "everyrank"
        main_process_only = False

        def __init__(self, run_name, logging_dir):
            from drivetrain.state import PartialState
            super().__init__(run_name, logging_dir, suffix=str(PartialState().process_index))

    plugin = types.SimpleNamespace(register_extensions=hookimpl(
        lambda registry: [registry.add_tracker(c.name, c) for c in (JsonLinesTracker, EveryRank)]))
    get_plugin_registry().register("test-trackers", plugin)

    accelerator = Accelerator(cpu=True, log_with=["jsonlines", "everyrank"], project_dir=sys.argv[1])
    accelerator.init_trackers("run", config={{"rank_seen": accelerator.process_index}})
    accelerator.log({{"loss": 1.0 + accelerator.process_index}}, step=1)
    names = [t.name for t in accelerator.trackers]
    inactive = accelerator.get_tracker("jsonlines")
    if accelerator.process_index == 1:
        assert inactive.tracker is None
        inactive.log_images({{"x": 1}})  # any method: a no-op away from the main process
    print(f"rank {{accelerator.process_index}} trackers={{names}} unwrap={{accelerator.get_tracker('jsonlines', unwrap=True)}}")
    accelerator.end_training()
    """
)


@pytest.mark.multiprocess
def test_only_main_process_writes_unless_tracker_says_otherwise(tmp_path):
    from drivetrain.testing import launch_script

    script = tmp_path / "track.py"
    script.write_text(MULTIPROCESS_SCRIPT.format(tests_dir=os.path.dirname(__file__)))
    out = tmp_path / "out"
    result = launch_script(
        str(script),
        num_processes=2,
        args=[str(out)],
        env={"TMPDIR": str(tmp_path), "DRIVETRAIN_LOAD_PLUGINS": "local,ddp"},
    )
    assert "rank 0 trackers=['jsonlines', 'everyrank'] unwrap=" in result.stdout
    assert "rank 1 trackers=['everyrank'] unwrap=<inactive tracker 'jsonlines'" in result.stdout
    assert sorted(p.name for p in (out / "run").iterdir()) == [
        "everyrank0.jsonl",
        "everyrank1.jsonl",
        "jsonlines.jsonl",
    ]
    main = read(out / "run" / "jsonlines.jsonl")
    assert [r["kind"] for r in main] == ["init", "config", "log", "finish"]
    assert main[1]["payload"] == {"rank_seen": 0} and main[2]["payload"]["values"] == {"loss": 1.0}
    for rank in (0, 1):
        records = read(out / "run" / f"everyrank{rank}.jsonl")
        assert records[2]["payload"]["values"] == {"loss": 1.0 + rank}
        assert records[-1]["kind"] == "finish"
