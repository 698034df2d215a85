"""Each tracker against its real library, writing real local output that is read back with the library's
own reader. One test per library (several import slowly); each skips when its library is absent."""

from __future__ import annotations

import glob
import json
import os
import struct
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from drivetrain import Accelerator

# -- reading an offline W&B run file ---------------------------------------------------------------------
# The file is W&B's framing of the LevelDB log format: a 7-byte header (":W&B", magic, version), then
# 32 KiB blocks of chunks, each with a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle,
# 4 last). The payloads are wandb_internal_pb2.Record messages. wandb no longer ships a Python reader.

_BLOCK = 32768
_HEADER = struct.Struct("<IHB")


def raw_records(path: str) -> Iterator[bytes]:
    data = open(path, "rb").read()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B run file")
    position, pending = 7, b""
    while position + _HEADER.size <= len(data):
        left_in_block = _BLOCK - position % _BLOCK
        if left_in_block < _HEADER.size:  # the writer pads the end of a block
            position += left_in_block
            continue
        _crc, length, kind = _HEADER.unpack_from(data, position)
        chunk = data[position + _HEADER.size : position + _HEADER.size + length]
        position += _HEADER.size + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            yield pending + chunk


def wandb_records(path: str) -> Iterator[tuple[str, object]]:
    """(record type, record) pairs: ``history``, ``config``, ``run``..."""
    from wandb.proto import wandb_internal_pb2

    for payload in raw_records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        yield kind, getattr(record, kind)


CONFIG = {"lr": 0.01, "optimizer": "adam", "layers": 3}


def run_training(tracker: str, project_dir, init_kwargs: dict | None = None) -> Accelerator:
    """init_trackers with CONFIG, then log loss at steps 1 and 2 (one as a tensor, as scripts do)."""
    accelerator = Accelerator(cpu=True, log_with=tracker, project_dir=project_dir)
    accelerator.init_trackers("drivetrain-test", config=CONFIG, init_kwargs={tracker: init_kwargs or {}})
    accelerator.log({"loss": torch.tensor(0.5)}, step=1)
    accelerator.log({"loss": 0.25}, step=2)
    return accelerator


def test_plugin_registers_every_tracker():
    from drivetrain.tracking import registered_trackers

    trackers = registered_trackers()
    assert {name for name, (plugin, _cls) in trackers.items() if plugin == "trackers"} == {
        "tensorboard",
        "wandb",
        "mlflow",
        "aim",
        "dvclive",
        "comet_ml",
        "clearml",
        "swanlab",
        "trackio",
    }
    assert all(cls.name == name for name, (_plugin, cls) in trackers.items())


def test_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    accelerator = run_training("tensorboard", tmp_path)
    tracker = accelerator.get_tracker("tensorboard")
    accelerator.log({"note": "hello", "group": {"a": 1.0, "b": 2.0}}, step=3)
    tracker.log_images({"samples": np.zeros((2, 3, 4, 4), dtype=np.float32)}, step=3)
    accelerator.end_training()

    run_dir = tmp_path / "drivetrain-test"
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 0.5), (2, 0.25)]
    assert [(image.step, image.width, image.height) for image in events.Images("samples")] == [(3, 8, 4)]
    assert b"hello" in events.Tensors("note/text_summary")[0].tensor_proto.string_val[0]
    hparams = {}
    for content in events.PluginTagToContent("hparams").values():
        data = plugin_data_pb2.HParamsPluginData.FromString(content)
        hparams.update(
            {
                key: value.WhichOneof("kind") and getattr(value, value.WhichOneof("kind"))
                for key, value in data.session_start_info.hparams.items()
            }
        )
    assert hparams == CONFIG
    assert (run_dir / "hparams.yml").read_text().count(":") == 3
    grouped = EventAccumulator(str(run_dir / "group_a"))
    grouped.Reload()
    assert [e.value for e in grouped.Scalars("group")] == [1.0]


def test_mlflow(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    accelerator = run_training(
        "mlflow", tmp_path, {"tracking_uri": uri, "run_name": "first", "tags": {"t": "1"}}
    )
    tracker = accelerator.get_tracker("mlflow")
    tracker.log_table({"a": [1, 2], "b": [3, 4]}, artifact_file="table.json")
    run_id = accelerator.get_tracker("mlflow", unwrap=True).info.run_id
    accelerator.end_training()

    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "first" and run.data.tags["t"] == "1"
    assert run.data.params == {key: str(value) for key, value in CONFIG.items()}
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")] == [(1, 0.5), (2, 0.25)]
    assert client.get_experiment(run.info.experiment_id).name == "drivetrain-test"
    assert [artifact.path for artifact in client.list_artifacts(run_id)] == ["table.json"]


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


def test_wandb_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    for variable in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(variable, str(tmp_path / variable.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")
    accelerator = run_training("wandb", tmp_path, {"mode": "offline", "dir": str(tmp_path)})
    tracker = accelerator.get_tracker("wandb")
    tracker.log_images({"samples": [np.zeros((4, 4, 3), dtype=np.uint8)]}, step=3)
    tracker.log_table("predictions", columns=["x", "y"], data=[[1, 2], [3, 4]], step=3)
    accelerator.end_training()

    (run_file,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    config, history, kinds = {}, [], []
    for kind, record in wandb_records(run_file):
        kinds.append(kind)
        if kind == "run":  # the config may travel with the run record or in config records
            config.update({_key(item): json.loads(item.value_json) for item in record.config.update})
        elif kind == "config":
            config.update({_key(item): json.loads(item.value_json) for item in record.update})
        elif kind == "history":
            history.append({_key(item): json.loads(item.value_json) for item in record.item})
    # Which records the run file held, in order, so that a failure here says what W&B wrote.
    assert {key: config.get(key) for key in CONFIG} == CONFIG, f"config {config}; records {kinds}"
    assert [(row["_step"], row["loss"]) for row in history if "loss" in row] == [(1, 0.5), (2, 0.25)]
    media = [row for row in history if row.get("_step") == 3][0]
    assert media["samples/count"] == 1 and media["predictions/nrows"] == 2
    files = os.path.dirname(run_file)
    table = json.loads(open(os.path.join(files, "files", media["predictions/path"])).read())
    assert table["columns"] == ["x", "y"] and table["data"] == [[1, 2], [3, 4]]


def test_dvclive(tmp_path):
    pytest.importorskip("dvclive")
    import yaml

    out = tmp_path / "dvclive"
    accelerator = run_training("dvclive", tmp_path, {"dir": str(out), "save_dvc_exp": False})
    accelerator.get_tracker("dvclive").log_images({"sample.png": np.zeros((4, 4, 3), dtype=np.uint8)}, step=2)
    accelerator.end_training()

    assert yaml.safe_load((out / "params.yaml").read_text()) == CONFIG
    assert (out / "plots" / "metrics" / "loss.tsv").read_text().split() == [
        "step",
        "loss",
        "1",
        "0.5",
        "2",
        "0.25",
    ]
    assert json.loads((out / "metrics.json").read_text()) == {"loss": 0.25, "step": 2}
    assert (out / "plots" / "images" / "sample.png").stat().st_size > 0


def test_aim(tmp_path):
    """Aim 3.29 does not read back a closed run from a local repository here (``Repo.get_run`` returns
    None), so this checks that the run is created in the repository and that tracking calls succeed."""
    pytest.importorskip("aim")
    from aim import Repo

    accelerator = run_training(
        "aim", tmp_path, {"system_tracking_interval": None, "capture_terminal_logs": False}
    )
    run = accelerator.get_tracker("aim", unwrap=True)
    run_hash = run.hash
    assert run.name == "drivetrain-test" and run["hparams"] == CONFIG
    accelerator.get_tracker("aim").log_images({"sample": np.zeros((4, 4, 3), dtype=np.uint8)}, step=2)
    accelerator.end_training()
    assert run_hash in list(Repo(str(tmp_path)).list_all_runs())


def test_comet_ml_offline(tmp_path):
    comet_ml = pytest.importorskip("comet_ml")

    experiment_config = comet_ml.ExperimentConfig(
        offline_directory=str(tmp_path / "comet"),
        log_code=False,
        log_git_metadata=False,
        log_git_patch=False,
        log_env_details=False,
        auto_output_logging=False,
        display_summary_level=0,
    )
    accelerator = run_training(
        "comet_ml", tmp_path, {"online": False, "experiment_config": experiment_config}
    )
    accelerator.log({"stage": "warmup"}, step=3)
    accelerator.get_tracker("comet_ml").log_table("table.csv", columns=["x", "y"], data=[[1, 2]])
    accelerator.end_training()

    (archive,) = glob.glob(str(tmp_path / "comet" / "*.zip"))
    messages = [
        json.loads(line) for line in zipfile.ZipFile(archive).read("messages.json").decode().splitlines()
    ]
    params = {
        m["payload"]["param"]["paramName"]: m["payload"]["param"]["paramValue"]
        for m in messages
        if m["type"] == "parameter_msg"
    }
    assert {key: params[key] for key in CONFIG} == CONFIG
    metrics = [
        (m["payload"]["metric"]["step"], m["payload"]["metric"]["metricValue"])
        for m in messages
        if m["type"] == "metric_msg" and m["payload"]["metric"]["metricName"] == "loss"
    ]
    assert metrics == [(1, 0.5), (2, 0.25)]
    assert {"key": "stage", "value": "warmup"} in [
        {k: m["payload"][k] for k in ("key", "value")} for m in messages if m["type"] == "log_other"
    ]
    uploads = [m["payload"]["additional_params"]["fileName"] for m in messages if m["type"] == "file_upload"]
    assert "table.csv" in uploads


CLEARML_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from clearml import Task
    from drivetrain import Accelerator

    Task.set_offline(True)
    accelerator = Accelerator(cpu=True, log_with="clearml")
    accelerator.init_trackers("drivetrain-test", config={"lr": 0.01}, init_kwargs={"clearml": {
        "auto_connect_frameworks": {"detect_repository": False, "pytorch": False, "tensorboard": False,
                                    "matplotlib": False},
        "auto_resource_monitoring": False, "auto_connect_streams": False, "auto_connect_arg_parser": False}})
    accelerator.log({"eval_loss": 0.5}, step=1)
    accelerator.log({"train_loss": 0.25}, step=2)
    tracker = accelerator.get_tracker("clearml")
    tracker.log_table("predictions", columns=["x", "y"], data=[[1, 2]], step=2)
    tracker.log_images({"sample": np.zeros((4, 4, 3), dtype=np.uint8)}, step=2)
    print("FOLDER", tracker.tracker.get_offline_mode_folder())
    accelerator.end_training()
    """
)


def test_clearml_offline(tmp_path):
    """In a child process: ClearML reads its configuration and home folder when it is imported."""
    pytest.importorskip("clearml")
    config = tmp_path / "clearml.conf"
    config.write_text("sdk { development { report_use_subprocess: false } }\n")
    (tmp_path / "home").mkdir()
    script = tmp_path / "clearml_run.py"
    script.write_text(CLEARML_SCRIPT)
    env = {
        **os.environ,
        "HOME": str(tmp_path / "home"),
        "CLEARML_CONFIG_FILE": str(config),
        "CLEARML_CACHE_DIR": str(tmp_path / "cache"),
        "OMP_NUM_THREADS": "1",
    }
    result = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    folder = next(line.split(" ", 1)[1] for line in result.stdout.splitlines() if line.startswith("FOLDER "))
    events = [event for line in open(os.path.join(folder, "metrics.jsonl")) for event in json.loads(line)]
    scalars = [
        (e["metric"], e["variant"], e["iter"], e["value"])
        for e in events
        if e["type"] == "training_stats_scalar"
    ]
    assert scalars == [("loss", "eval", 1, 0.5), ("loss", "train", 2, 0.25)]
    assert {(e["type"], e["metric"]) for e in events} >= {
        ("plot", "predictions"),
        ("training_debug_image", "sample"),
    }
    task = json.load(open(os.path.join(folder, "task.json")))
    assert task["configuration"]["General"]["value"] == "lr = 0.01"
    assert os.path.exists(folder + ".zip")


def test_trackio(tmp_path):
    """The run lands in trackio's local SQLite file for the project, read back with trackio's own storage. In a
    child process: trackio reads ``TRACKIO_DIR`` when it is imported."""
    pytest.importorskip("trackio")
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, sys
            sys.path.insert(0, {os.path.dirname(__file__)!r})
            from test_trackers import run_training
            from trackio.sqlite_storage import SQLiteStorage

            accelerator = run_training("trackio", {str(tmp_path)!r}, {{"name": "run-1"}})
            started = accelerator.get_tracker("trackio").tracker is not None
            accelerator.end_training()
            logs = SQLiteStorage.get_logs("drivetrain-test", "run-1")
            config = SQLiteStorage.get_run_config("drivetrain-test", "run-1")
            print("RESULT", json.dumps({{"started": started, "logs": logs, "config": config}}, default=str))
            """
        )
    )
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio")}
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    found = json.loads(line.removeprefix("RESULT "))
    assert found["started"]  # start() made the run, as in Accelerate
    assert (tmp_path / "trackio" / "drivetrain-test.db").is_file()
    assert [(entry["step"], entry["loss"]) for entry in found["logs"] if "loss" in entry] == [
        (1, 0.5),
        (2, 0.25),
    ]
    assert {key: found["config"][key] for key in CONFIG} == CONFIG


def test_swanlab_offline(tmp_path):
    """An offline run is one ``.swanlab`` record file, read back with swanlab's own reader."""
    pytest.importorskip("swanlab")
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    logdir = tmp_path / "swanlog"
    accelerator = run_training(
        "swanlab", tmp_path, {"experiment_name": "run-1", "mode": "offline", "logdir": str(logdir)}
    )
    assert accelerator.get_tracker("swanlab").tracker is not None  # start() made the run
    accelerator.end_training()

    (record_file,) = glob.glob(str(logdir / "run-*" / "run-*.swanlab"))
    reader = DataStoreReader()
    reader.open(record_file)
    scalars = []
    for payload in reader:
        record = Record()
        record.ParseFromString(payload)
        if record.WhichOneof("record_type") == "scalar":
            scalars.append((record.scalar.key, record.scalar.step, record.scalar.value.number))
    reader.close()
    assert scalars == [("loss", 1, 0.5), ("loss", 2, 0.25)]
    import yaml

    (config_file,) = glob.glob(str(logdir / "run-*" / "files" / "config.yaml"))
    stored = yaml.safe_load(open(config_file, encoding="utf-8"))
    values = {
        key: (entry["value"] if isinstance(entry, dict) and "value" in entry else entry)
        for key, entry in stored.items()
    }
    assert {key: values[key] for key in CONFIG} == CONFIG


@pytest.mark.parametrize("name", ["aim", "comet_ml", "mlflow"])
def test_building_a_tracker_touches_no_process_state_and_starts_no_run(tmp_path, monkeypatch, name):
    # Accelerate's trackers start their run in start() (init_trackers calls it): a script may build one before
    # the Accelerator, which must still be free to set the processes up.
    pytest.importorskip(name)
    from drivetrain.state import PartialState
    from drivetrain_trackers.aim_tracker import AimTracker
    from drivetrain_trackers.comet_tracker import CometMLTracker
    from drivetrain_trackers.mlflow_tracker import MLflowTracker

    monkeypatch.chdir(tmp_path)
    PartialState._reset_state()
    tracker = {
        "aim": lambda: AimTracker("run", repo=str(tmp_path)),
        "comet_ml": lambda: CometMLTracker("run", online=False),
        "mlflow": lambda: MLflowTracker(experiment_name="e", tracking_uri=f"sqlite:///{tmp_path / 'm.db'}"),
    }[name]()
    assert PartialState._shared_state == {} and tracker.tracker is None
    assert not any(tmp_path.iterdir())  # no repository, archive or store written yet
    Accelerator(log_with=tracker)
    assert PartialState._shared_state != {}


@pytest.mark.parametrize(
    ("value", "nested"), [("False", False), ("off", False), ("0", False), ("on", True), ("Yes", True)]
)
def test_mlflow_nested_run_variable_turns_nesting_on_and_off(monkeypatch, value, nested):
    pytest.importorskip("mlflow")
    from drivetrain_trackers.mlflow_tracker import MLflowTracker

    monkeypatch.setenv("MLFLOW_NESTED_RUN", value)
    assert MLflowTracker(experiment_name="e", nested_run=not nested).nested_run is nested
    monkeypatch.setenv("MLFLOW_NESTED_RUN", "maybe")
    with pytest.raises(ValueError, match="MLFLOW_NESTED_RUN"):
        MLflowTracker(experiment_name="e")


def test_dvclive_logs_strings_beside_numbers_at_their_steps(tmp_path):
    # Accelerate hands DVCLive every value it can log: its .tsv files hold strings as written
    pytest.importorskip("dvclive")
    out = tmp_path / "dvclive"
    accelerator = Accelerator(log_with="dvclive", project_dir=str(tmp_path))
    accelerator.init_trackers("p", init_kwargs={"dvclive": {"dir": str(out), "save_dvc_exp": False}})
    accelerator.log({"loss": 0.5, "phase": "warmup"})
    accelerator.log({"loss": 0.25, "phase": "main"}, step=3)
    accelerator.log({"loss": 0.125, "skipped": [1, 2]}, step=4)  # a list is no metric: skipped
    accelerator.end_training()
    assert json.loads((out / "metrics.json").read_text()) == {"loss": 0.125, "phase": "main", "step": 4}
    phase = (out / "plots" / "metrics" / "phase.tsv").read_text().split()
    assert phase[2:] == ["0", "warmup", "3", "main"]
    assert not (out / "plots" / "metrics" / "skipped.tsv").exists()
