"""Behaviour scripts written for Accelerate rely on, found by the peer suite (issue 17): each test asserts
what such a script observes."""

from __future__ import annotations

import dataclasses
import pickle
import sys
import types
import warnings

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, TensorDataset

from drivetrain import Accelerator
from drivetrain.config.kwargs_handlers import KwargsHandler
from drivetrain.data.samplers import BatchSamplerShard


def test_scheduler_does_not_step_when_the_optimizer_step_was_skipped():
    # Accelerate's AcceleratedOptimizer keeps the overflow flag in `_is_overflow`; scripts set it directly.
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lambda n: 1 - n / 10)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    optimizer._is_overflow = False
    scheduler.step()
    assert scheduler.get_last_lr()[0] == pytest.approx(0.9)
    optimizer._is_overflow = True
    assert optimizer.step_was_skipped
    scheduler.step()
    assert scheduler.get_last_lr()[0] == pytest.approx(0.9)


def test_user_dataclass_kwargs_handler_reports_changed_fields():
    @dataclasses.dataclass
    class MyHandler(KwargsHandler):
        a: int = 0
        b: bool = False
        c: float = 3.0
        d: list = dataclasses.field(default_factory=list)

    assert MyHandler().to_kwargs() == {}
    assert MyHandler(a=2).to_kwargs() == {"a": 2}
    assert MyHandler(a=2, c=2.25, d=[1]).to_kwargs() == {"a": 2, "c": 2.25, "d": [1]}


def test_batch_sampler_without_batch_size_pads_whole_batches_with_even_batches():
    batches = [[0, 1, 2], [3, 4], [5, 6, 7, 8], [9, 10, 11], [12, 13]]
    shards = [BatchSamplerShard(batches, 2, rank, even_batches=True) for rank in range(2)]
    assert list(shards[0]) == [[0, 1, 2], [5, 6, 7, 8], [12, 13]]
    assert list(shards[1]) == [[3, 4], [9, 10, 11], [0, 1, 2]]
    assert len(shards[0]) == len(shards[1]) == 3
    three = [BatchSamplerShard([[0], [1, 2], [3], [4, 5]], 3, rank, even_batches=True) for rank in range(3)]
    assert [list(shard) for shard in three] == [[[0], [4, 5]], [[1, 2], [0]], [[3], [1, 2]]]
    with pytest.raises(ValueError, match="split_batches=True"):
        BatchSamplerShard(batches, 2, 0, split_batches=True)


def test_unwrap_keeps_compile_but_removes_data_parallel_inside_it():
    model = torch.nn.Linear(2, 2)
    compiled_parallel = torch.compile(torch.nn.DataParallel(model))
    accelerator = Accelerator(cpu=True)
    unwrapped = accelerator.unwrap_model(compiled_parallel, keep_torch_compile=True)
    assert unwrapped._orig_mod is model
    assert isinstance(compiled_parallel._orig_mod, torch.nn.DataParallel)  # the caller's object is untouched
    assert accelerator.unwrap_model(compiled_parallel, keep_torch_compile=False) is model


def test_torch_device_variable_overrides_the_detected_device(monkeypatch):
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "cpu:3")
    monkeypatch.setattr(torch.cpu, "set_device", lambda device: None, raising=False)
    assert str(Accelerator().device) == "cpu:3"


def test_torch_device_variable_rejects_a_non_device(monkeypatch):
    monkeypatch.setenv("DRIVETRAIN_TORCH_DEVICE", "warp-drive")
    with pytest.raises(Exception, match="DRIVETRAIN_TORCH_DEVICE='warp-drive' is not a torch device"):
        Accelerator()


def test_custom_tracker_is_started_before_configuration_and_logs(tmp_path):
    from drivetrain.tracking import GeneralTracker

    class ListTracker(GeneralTracker):
        name = "list_tracker"
        requires_logging_directory = False

        def __init__(self):
            super().__init__()
            self.writer = None

        def start(self):
            self.writer = []

        @property
        def tracker(self):
            return self.writer

        def store_init_configuration(self, values):
            self.writer.append(("config", values))

        def log(self, values, step=None, **kwargs):
            self.writer.append(("log", values, step))

    tracker = ListTracker()
    accelerator = Accelerator(cpu=True, log_with=tracker)
    accelerator.init_trackers("run", {"lr": 0.1})
    accelerator.log({"loss": 1.0}, step=3)
    accelerator.end_training()
    assert tracker.writer == [("config", {"lr": 0.1}), ("log", {"loss": 1.0}, 3)]


def test_prepared_dataloaders_and_accelerator_pickle():
    accelerator = Accelerator(cpu=True)
    loader = DataLoader(TensorDataset(torch.arange(10)), batch_size=2)
    prepared = accelerator.prepare(loader)
    restored = pickle.loads(pickle.dumps(prepared))
    assert [batch[0].tolist() for batch in restored] == [batch[0].tolist() for batch in prepared]
    restored_accelerator = pickle.loads(pickle.dumps(accelerator))
    assert len(restored_accelerator._dataloaders) == 1


def test_join_warns_for_single_process_and_iterable_loaders():
    accelerator = Accelerator(cpu=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with accelerator.join_uneven_inputs([torch.nn.Linear(1, 1)], even_batches=False):
            pass
    assert any(issubclass(w.category, UserWarning) for w in caught)


def test_batch_sampler_shard_round_robin_still_exact():
    sampler = BatchSampler(range(10), batch_size=3, drop_last=False)
    shards = [list(BatchSamplerShard(sampler, 2, rank, even_batches=True)) for rank in range(2)]
    assert shards == [[[0, 1, 2], [6, 7, 8]], [[3, 4, 5], [9, 0, 1]]]


@pytest.mark.parametrize(
    ("dispatch_batches", "stateful"),
    [(False, False), (True, False), (True, True)],
    ids=["shard", "dispatch", "dispatch-stateful"],
)
def test_resume_with_worker_processes_skips_the_consumed_batches(tmp_path, dispatch_batches, stateful):
    # torch's multi-worker iterator asks the index sampler for two iterators as it starts: the resume
    # position went to the discarded one, and the whole epoch came again (64 batches where 61 were left).
    pytest.importorskip("torchdata")
    from drivetrain.utils import DataLoaderConfiguration

    config = DataLoaderConfiguration(dispatch_batches=dispatch_batches, use_stateful_dataloader=stateful)
    accelerator = Accelerator(cpu=True, dataloader_config=config)
    data = TensorDataset(torch.arange(36))
    loader = accelerator.prepare(DataLoader(data, batch_size=3, shuffle=True, num_workers=2))
    rest = []
    for step, (batch,) in enumerate(loader):
        if step == 2:
            accelerator.save_state(tmp_path / "state")
        if step > 2:
            rest.append(batch.tolist())
    accelerator.load_state(tmp_path / "state")
    assert [batch.tolist() for (batch,) in loader] == rest
    assert len(rest) == 9


@pytest.mark.parametrize("safe_serialization", [True, False], ids=["safetensors", "pickle"])
def test_save_model_gathers_weights_offloaded_to_cpu_and_disk(tmp_path, safe_serialization):
    pytest.importorskip("drivetrain_offload")
    from drivetrain.big_modeling import load_checkpoint_and_dispatch

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 5)).eval()
    inputs = torch.randn(3, 3)
    expected = model(inputs)
    accelerator = Accelerator(cpu=True)
    accelerator.save_model(model, tmp_path / "plain", safe_serialization=safe_serialization)
    device_map = {"0": "cpu", "1": "disk", "2": "cpu"}
    load_checkpoint_and_dispatch(
        model, tmp_path / "plain", device_map=device_map, offload_folder=tmp_path / "off"
    )
    assert model[1].weight.device.type == "meta"  # held by the offload hook between forwards
    accelerator.save_model(model, tmp_path / "again", safe_serialization=safe_serialization)
    fresh = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 5)).eval()
    load_checkpoint_and_dispatch(fresh, tmp_path / "again")
    assert torch.allclose(fresh(inputs), expected, atol=1e-6)


@pytest.mark.parametrize("cls_name", ["DataLoaderShard", "DataLoaderDispatcher", "SkipDataLoader"])
def test_loader_constructors_take_use_stateful_dataloader(cls_name):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    import drivetrain.data_loader as data_loader

    cls = getattr(data_loader, cls_name)
    extra = {"skip_batches": 2} if cls_name == "SkipDataLoader" else {}
    loader = cls(list(range(16)), batch_size=4, use_stateful_dataloader=True, **extra)
    assert isinstance(loader, cls) and isinstance(loader, stateful.StatefulDataLoader)
    assert loader.use_stateful_dataloader and loader.base_dataloader is loader
    expected = (
        [[8, 9, 10, 11], [12, 13, 14, 15]]
        if extra
        else [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    )
    assert [batch.tolist() for batch in loader] == expected
    assert not cls(list(range(4)), batch_size=2).use_stateful_dataloader


def test_a_sampler_yielding_batches_is_sharded_like_a_batch_sampler():
    from torch.utils.data import SequentialSampler, default_collate

    from drivetrain.data_loader import prepare_data_loader

    data = TensorDataset(torch.arange(10))
    shards = []
    for rank in range(2):
        sampler = BatchSampler(SequentialSampler(data), batch_size=2, drop_last=False)
        loader = DataLoader(data, sampler=sampler, batch_size=None, collate_fn=default_collate)
        prepared = prepare_data_loader(loader, num_processes=2, process_index=rank, put_on_device=False)
        shards.append([batch[0].tolist() for batch in prepared])
    assert shards == [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], [0, 1]]]


def test_state_after_reset_says_what_happened():
    from drivetrain import PartialState
    from drivetrain.state import AcceleratorState

    state = PartialState(cpu=True)
    with pytest.raises(AttributeError, match="'PartialState' object has no attribute 'someotherthing'"):
        state.someotherthing  # noqa: B018
    state._reset_state()
    with pytest.raises(AttributeError, match=r"`PartialState._reset_state\(\)` was called"):
        state.num_processes  # noqa: B018
    state.someotherthing = "value"
    assert state.someotherthing == "value"
    AcceleratorState._reset_state()
    with pytest.raises(AttributeError, match=r"`AcceleratorState._reset_state\(\)` was called"):
        AcceleratorState.__new__(AcceleratorState).num_processes  # noqa: B018


def test_register_for_checkpointing_names_the_item_without_state_dict():
    accelerator = Accelerator(cpu=True)
    with pytest.raises(ValueError, match="Item at index 0 .*Item at index 1"):
        accelerator.register_for_checkpointing(torch.zeros(1), torch.ones(1), torch.nn.Linear(1, 1))


def test_prepare_marks_what_it_prepared_and_does_not_prepare_a_model_twice():
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    loader = DataLoader(TensorDataset(torch.arange(4)), batch_size=2)
    other = [1, 2, 3]
    prepared = accelerator.prepare(model, optimizer, scheduler, loader, other)
    assert [getattr(obj, "_is_accelerate_prepared", False) for obj in prepared] == [True] * 4 + [False]
    count = len(accelerator._models)
    assert accelerator.prepare_model(prepared[0]) is prepared[0]
    assert len(accelerator._models) == count


@pytest.mark.multiprocess
def test_two_ranks_with_their_own_folders_save_and_resume_one_checkpoint(tmp_path):
    pytest.importorskip("torchdata")
    from pathlib import Path

    from drivetrain.testing import launch_script

    script = Path(__file__).parents[1] / "scripts" / "accelerate_behaviour.py"
    result = launch_script(
        str(script), num_processes=2, env={"TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    )
    assert result.stdout.count("accelerate_behaviour OK") == 2


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _even_ranks_fail():
    from drivetrain import PartialState

    if PartialState().process_index % 2 == 0:
        raise RuntimeError("even rank refuses")


@pytest.mark.multiprocess
def test_notebook_launcher_failure_is_torchs_child_failed_error_too():
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from drivetrain import notebook_launcher
    from drivetrain.errors import DrivetrainError

    with pytest.raises(ChildFailedError, match="even rank refuses") as caught:
        notebook_launcher(_even_ranks_fail, (), num_processes=2, monitor_interval=0.05, use_port=_free_port())
    assert isinstance(caught.value, DrivetrainError)
    assert str(caught.value).startswith("process of rank 0 failed")


def test_notebook_launcher_refuses_to_fork_after_bitsandbytes_was_imported(monkeypatch):
    """As Accelerate: bitsandbytes may set up the device on import, so forking after it is refused."""
    from drivetrain import notebook_launcher

    monkeypatch.setitem(sys.modules, "bitsandbytes", types.ModuleType("bitsandbytes"))
    started = []
    with pytest.raises(RuntimeError, match=r"\(bitsandbytes\)\. Please keep these imports inside"):
        notebook_launcher(started.append, (1,), num_processes=2, use_port=_free_port())
    assert started == []


class _ThreeLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = torch.nn.Linear(3, 4)  # 64 bytes
        self.batchnorm = torch.nn.BatchNorm1d(4)  # 72 bytes (with its running statistics)
        self.linear2 = torch.nn.Linear(4, 5)  # 100 bytes


def test_device_map_keeps_room_for_the_largest_layer_on_the_first_device():
    from drivetrain.big_modeling import infer_auto_device_map

    # Device 0 keeps 100 bytes for linear2 (offloaded layers visit it), so batchnorm starts device 1.
    assert infer_auto_device_map(_ThreeLayers(), max_memory={0: 200, 1: 200}) == {
        "linear1": 0,
        "batchnorm": 1,
        "linear2": 1,
    }
    stacked = torch.nn.Sequential(_ThreeLayers(), _ThreeLayers(), _ThreeLayers())
    assert infer_auto_device_map(stacked, max_memory={0: 500, 1: 500}) == {
        "0": 0,
        "1.linear1": 0,
        "1.batchnorm": 0,
        "1.linear2": 1,
        "2": 1,
    }
    kept = infer_auto_device_map(
        stacked, max_memory={0: 500, 1: 500}, no_split_module_classes=["_ThreeLayers"]
    )
    assert kept == {"0": 0, "1": 1, "2": 1}


def test_device_map_fallback_allocation_and_offloaded_buffer_warning(caplog):
    from collections import OrderedDict

    from drivetrain.big_modeling import infer_auto_device_map

    inner = torch.nn.Sequential(
        OrderedDict(
            [
                ("linear1", torch.nn.Linear(10, 4)),
                ("linear2", torch.nn.Linear(4, 4)),
                ("linear3", torch.nn.Linear(4, 8)),
            ]
        )
    )
    model = torch.nn.Sequential(OrderedDict([("module", inner)]))
    with caplog.at_level("INFO"):
        plain = infer_auto_device_map(model, max_memory={0: 256})
    assert set(plain.values()) == {"disk"} and "insufficient memory" in caplog.text
    fallback = infer_auto_device_map(model, max_memory={0: 256}, fallback_allocation=True)
    assert fallback == {"module.linear1": "disk", "module.linear2": 0, "module.linear3": "disk"}

    buffered = _ThreeLayers()
    buffered.batchnorm.register_buffer("extra", torch.zeros(10, 3))
    buffered.linear2.register_buffer("extra", torch.zeros(10, 3))
    with pytest.warns(UserWarning, match="offload_buffers=True"):
        infer_auto_device_map(buffered, max_memory={0: 300, "cpu": "1GB"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        infer_auto_device_map(buffered, max_memory={0: 300, "cpu": "1GB"}, offload_buffers=True)


@pytest.mark.parametrize("multi_backend", [False, True])
@pytest.mark.parametrize("where", ["disk", "cpu"])
def test_a_quantized_model_offloaded_is_refused_unless_bitsandbytes_computes_on_the_cpu(
    monkeypatch, where, multi_backend
):
    import drivetrain.accelerator

    # Patched where Accelerate's tests patch it (and so bitsandbytes is not imported into this process: the
    # notebook launcher refuses to fork after it).
    monkeypatch.setattr(
        drivetrain.accelerator,
        "is_bitsandbytes_multi_backend_available",
        lambda: multi_backend,
        raising=False,
    )
    model = torch.nn.Linear(2, 2)
    model.is_loaded_in_8bit = True
    model.hf_device_map = {"": where}
    if where == "cpu" and multi_backend:
        # As in Accelerate: a bitsandbytes built for several backends computes on the CPU, so CPU modules train.
        assert Accelerator(cpu=True).prepare_model(model) is not None
        return
    with pytest.raises(ValueError, match="CPU or disk offload"):
        Accelerator(cpu=True).prepare_model(model)


def test_split_between_processes_gives_each_process_rows_of_a_dataset():
    # Accelerate's test_script: a `datasets.Dataset` is split by rows (slicing one gives a dict of columns).
    datasets = pytest.importorskip("datasets")
    from drivetrain.state import split_for_process

    even = datasets.Dataset.from_list([{"k": v} for v in range(4)])
    shares = [split_for_process(even, 2, rank) for rank in range(2)]
    assert [share["k"] for share in shares] == [[0, 1], [2, 3]]
    odd = datasets.Dataset.from_list([{"k": v} for v in range(3)])
    assert [split_for_process(odd, 2, rank)["k"] for rank in range(2)] == [[0, 1], [2]]
    assert [split_for_process(odd, 2, rank, apply_padding=True)["k"] for rank in range(2)] == [[0, 1], [2, 2]]


def test_split_between_processes_pads_with_the_last_input_element():
    from drivetrain.state import split_for_process

    data = [0, 1, 2, 3, 4]
    assert [split_for_process(data, 4, rank, apply_padding=True) for rank in range(4)] == [
        [0, 1],
        [2, 4],
        [3, 4],
        [4, 4],
    ]
    tensor = torch.arange(5)
    assert split_for_process(tensor, 4, 1, apply_padding=True).tolist() == [2, 4]


def test_destroy_process_group_on_a_state_kept_across_a_reset():
    # Accelerate's test_script ends with `state.destroy_process_group()` on an AcceleratorState built before
    # `AcceleratorState._reset_state()`: the process group belongs to PartialState, so it still works.
    from drivetrain.state import AcceleratorState, PartialState

    Accelerator(cpu=True)
    state = AcceleratorState()
    AcceleratorState._reset_state()
    with pytest.raises(AttributeError, match="`AcceleratorState` object has no attribute"):
        state.mixed_precision  # noqa: B018
    state.destroy_process_group()
    state.destroy_process_group()  # twice is fine
    assert PartialState().initialized


def test_parallelism_config_get_mesh_gives_names_and_sizes_in_mesh_order():
    from drivetrain import ParallelismConfig

    config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, tp_size=2, cp_size=2)
    assert config._get_mesh() == (("dp_replicate", "dp_shard", "cp", "tp"), (2, 2, 2, 2))
    assert ParallelismConfig(dp_shard_size=4, cp_size=2)._get_mesh() == (("dp_shard", "cp"), (4, 2))


def test_build_device_mesh_flattens_the_configs_own_dimension_lists(monkeypatch):
    # Code that wraps torch's init_device_mesh (Accelerate's tests do) sees the config's lists as the slices.
    import torch.distributed.device_mesh as device_mesh

    from drivetrain import ParallelismConfig

    sliced: list = []

    class RecordingMesh:
        def __init__(self, shape, names):
            self.shape, self.mesh_dim_names = shape, names

        def __getitem__(self, key):
            mesh = self

            class Submesh:
                def _flatten(self, name):
                    sliced.append((key, name))
                    return mesh

            return Submesh()

    monkeypatch.setattr(
        device_mesh,
        "init_device_mesh",
        lambda device, shape, mesh_dim_names: RecordingMesh(shape, mesh_dim_names),
    )
    config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, cp_size=2)
    mesh = config.build_device_mesh("cpu")
    assert (mesh.shape, mesh.mesh_dim_names) == ((2, 2, 2), ("dp_replicate", "dp_shard", "cp"))
    assert sliced == [
        (config.dp_dim_names, "dp"),
        (config.dp_shard_cp_dim_names, "dp_shard_cp"),
        (config.dp_cp_dim_names, "dp_cp"),
    ]
    assert sliced[0][0] == ["dp_replicate", "dp_shard"]


def test_a_loader_dropped_mid_epoch_is_collected_with_its_accelerator():
    import gc
    import weakref

    accelerator = Accelerator(cpu=True)
    loader = accelerator.prepare_data_loader(DataLoader(list(range(16)), batch_size=4))
    batches = iter(loader)
    assert next(batches).tolist() == [0, 1, 2, 3]
    assert loader.gradient_state.active_dataloader is loader
    assert loader.gradient_state.sync_gradients == accelerator.gradient_state.sync_gradients
    references = [weakref.ref(accelerator), weakref.ref(loader)]
    del accelerator, loader, batches
    gc.collect()
    assert [reference() for reference in references] == [None, None]


def test_concatenate_returns_a_single_batch_of_any_type_as_it_is():
    from drivetrain.utils import concatenate

    assert concatenate(["text"]) == "text"
    assert concatenate([[torch.ones(1), "label"]])[1] == "label"
    with pytest.raises(TypeError, match="can only concatenate tensors, got str"):
        concatenate(["a", "b"])


def test_device_map_entries_naming_nothing_warn_and_unused_checkpoint_weights_are_logged(tmp_path, caplog):
    from drivetrain.utils import check_device_map, load_checkpoint_in_model

    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    with pytest.warns(UserWarning, match=r"device_map keys do not match any submodules.*'typo'"):
        check_device_map(model, {"0": "cpu", "1.weight": "cpu", "1.bias": "cpu", "typo": "cpu"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_device_map(model, {"": "cpu"})

    state = {**model.state_dict(), "extra": torch.ones(2)}
    path = tmp_path / "model.pt"
    torch.save(state, path)
    fresh = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    with caplog.at_level("WARNING"):
        load_checkpoint_in_model(fresh, path)
    assert "were not used when loading" in caplog.text and "extra" in caplog.text
    assert torch.equal(fresh[0].weight, model[0].weight)
    # strict: an error that is also torch's RuntimeError (load_state_dict raises one)
    with pytest.raises(RuntimeError, match="unexpected"):
        load_checkpoint_in_model(fresh, path, strict=True)


def test_save_with_safetensors_says_which_shared_tensors_it_stored_once(tmp_path, caplog):
    from safetensors.torch import load_file

    from drivetrain.utils import save

    model = torch.nn.Module()
    model.a = torch.nn.Linear(3, 3)
    model.b = model.a
    with caplog.at_level("WARNING"):
        save(model.state_dict(), tmp_path / "model.safetensors", safe_serialization=True)
    assert [r.getMessage() for r in caplog.records if "Removed shared tensor" in r.getMessage()] != []
    assert "b.weight" in caplog.text
    assert sorted(load_file(tmp_path / "model.safetensors")) == ["a.bias", "a.weight"]


def test_prepare_multi_gpu_env_takes_a_partial_namespace_and_picks_a_free_port():
    import argparse

    from drivetrain.commands.launch import prepare_multi_gpu_env

    args = argparse.Namespace(
        num_processes=2, num_machines=1, main_process_ip="127.0.0.1", main_process_port=0
    )
    environment = prepare_multi_gpu_env(args)
    assert args.master_port.isdigit() and args.master_port != "0"
    assert environment["PATH"]  # the launcher's environment is the current one plus its variables


def test_estimating_an_unknown_model_is_an_os_error_and_a_one_line_cli_error(capsys):
    from drivetrain.commands.estimate import estimate_command, estimate_command_parser
    from drivetrain.commands.main import main as cli_main

    with pytest.raises(OSError, match="'somebrokenname' is not a local folder"):
        estimate_command(estimate_command_parser().parse_args(["somebrokenname"]))
    assert cli_main(["estimate-memory", "somebrokenname"]) == 2
    assert "'somebrokenname' is not a local folder" in capsys.readouterr().err


def test_recursively_apply_error_on_other_type_uses_accelerates_wording():
    from drivetrain.utils import recursively_apply

    with pytest.raises(TypeError) as error:
        recursively_apply(torch.tensor, (torch.tensor(1), 1), error_on_other_type=True)
    assert str(error.value) == (
        "Unsupported types (<class 'int'>) passed to `tensor`. Only nested list/tuple/dicts of objects that are "
        "valid for `is_torch_tensor` should be passed."
    )


def test_unwrapping_undoes_a_convert_outputs_to_fp32_forward_saved_in_original_forward():
    from drivetrain.utils import convert_outputs_to_fp32, extract_model_from_parallel

    model = torch.nn.Linear(2, 1)
    model._original_forward = model.forward
    model.forward = convert_outputs_to_fp32(model.forward)
    unwrapped = extract_model_from_parallel(model, keep_fp32_wrapper=False)
    assert "forward" not in unwrapped.__dict__ and "_original_forward" not in unwrapped.__dict__
    restored = pickle.loads(pickle.dumps(unwrapped))
    assert torch.equal(restored(torch.ones(1, 2)), model(torch.ones(1, 2)))


def test_sagemaker_hyperparameters_are_typed_and_flags_without_values_refused():
    from drivetrain.utils.launch import _convert_nargs_to_dict

    args = [
        "--model_name_or_path",
        "bert",
        "--do_train",
        "False",
        "--epochs",
        "3",
        "--lr",
        "5e-5",
        "--steps",
        "50.5",
    ]
    assert _convert_nargs_to_dict(args) == {
        "model_name_or_path": "bert",
        "do_train": False,
        "epochs": 3,
        "lr": 5e-5,
        "steps": 50.5,
    }
    assert type(_convert_nargs_to_dict(args)["epochs"]) is int
    with pytest.raises(ValueError, match="'--do_test' has no value"):
        _convert_nargs_to_dict(["--do_test", "--epochs", "3"])
    with pytest.raises(ValueError, match="'--do_predict' has no value"):
        _convert_nargs_to_dict(["--epochs", "3", "--do_predict"])


def test_prepare_multi_gpu_env_ignores_the_defaults_of_backends_the_namespace_does_not_select():
    import argparse

    from drivetrain.commands.launch import prepare_multi_gpu_env

    # what Accelerate's launcher hands over: every backend's options at Accelerate's defaults
    args = argparse.Namespace(
        num_processes=1, num_machines=1, main_process_ip="127.0.0.1", main_process_port=0, machine_rank=0,
        use_fsdp=False, fsdp_offload_params=False, fsdp_min_num_params=0, fsdp_use_orig_params=False,
        use_megatron_lm=False, megatron_lm_tp_degree=1, megatron_lm_pp_degree=1,
        megatron_lm_gradient_clipping=1.0, use_tp=False, tp_size=1, use_parallelism_config=False,
    )  # fmt: skip
    prepare_multi_gpu_env(args)
    assert args.master_port.isdigit() and args.master_port != "0"


def test_an_invalid_cp_comm_strategy_is_named_in_accelerates_wording(monkeypatch):
    from drivetrain.utils import ParallelismConfig, TorchContextParallelConfig

    with pytest.raises(
        ValueError, match="Invalid cp_comm_strategy: ring.*choose one of: allgather, alltoall"
    ):
        TorchContextParallelConfig(cp_comm_strategy="ring")
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "ring")
    with pytest.raises(ValueError, match="Invalid cp_comm_strategy: ring"):
        ParallelismConfig(cp_size=2)


def test_env_command_returns_the_report_and_says_when_the_console_command_is_not_on_path(monkeypatch, capsys):
    # Scripts call Accelerate's env_command for a dict of the report (its keys), e.g. to check the install.
    import shutil

    from drivetrain.commands import env

    args = env.env_command_parser().parse_args([])
    info = env.env_command(args)
    assert info["`accelerate` bash location"] == shutil.which("drivetrain")
    assert info["PyTorch version"] == torch.__version__
    monkeypatch.setattr(env, "which", lambda name: None)
    info = env.env_command(args)
    assert info["`accelerate` bash location"] == "Not found"
    assert "- `drivetrain` bash location: Not found" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("devices", "multi_backend", "on_xpu", "refused"),
    [
        ({"": "cpu"}, False, False, True),  # the quantization library computes on accelerators only
        ({"": "cpu"}, True, False, False),  # a multi-backend build trains CPU modules
        ({"": "cpu"}, True, True, True),  # ... but not beside an XPU
        ({"a": "disk"}, True, False, True),  # disk offload is never trainable
    ],
)
def test_a_quantized_model_with_offloaded_modules_is_refused_unless_its_library_trains_on_cpu(
    monkeypatch, devices, multi_backend, on_xpu, refused
):
    import drivetrain.accelerator as accelerator_module

    # Accelerate's prepare_model asks these checks by these module names; scripts patch them there
    monkeypatch.setattr(accelerator_module, "is_bitsandbytes_multi_backend_available", lambda: multi_backend)
    monkeypatch.setattr(accelerator_module, "is_xpu_available", lambda: on_xpu)
    model = torch.nn.Linear(2, 2)
    model.is_loaded_in_8bit = True
    model.hf_device_map = devices
    accelerator = Accelerator(cpu=True)
    if refused:
        with pytest.raises(ValueError, match="CPU or disk offload"):
            accelerator.prepare_model(model)
    else:
        assert accelerator.prepare_model(model) is not None


def test_verify_on_hub_answers_gated_or_repo_as_accelerate_does(monkeypatch):
    huggingface_hub = pytest.importorskip("huggingface_hub")
    from huggingface_hub.utils import GatedRepoError, RepositoryNotFoundError

    from drivetrain.commands.estimate import verify_on_hub

    def raising(kind):
        error = kind.__new__(kind)  # the Hub's errors want an HTTP response; the message is all that matters
        OSError.__init__(error, "from the Hub")

        def model_info(repo, token=None):
            raise error

        return model_info

    monkeypatch.setattr(huggingface_hub, "model_info", raising(GatedRepoError))
    assert verify_on_hub("owner/gated") == "gated"
    monkeypatch.setattr(huggingface_hub, "model_info", raising(RepositoryNotFoundError))
    assert verify_on_hub("owner/missing") == "repo"
    monkeypatch.setattr(huggingface_hub, "model_info", raising(ConnectionError))  # offline or unreachable
    assert verify_on_hub("owner/any") == "gated"
    seen = []
    monkeypatch.setattr(
        huggingface_hub, "model_info", lambda repo, token=None: seen.append((repo, token)) or "info"
    )
    assert verify_on_hub("owner/model", token="t") == "info" and seen == [("owner/model", "t")]


def test_estimate_memory_of_a_model_that_is_not_available_offline_is_an_os_error():
    # Accelerate raises OSError (EnvironmentError) for a gated or missing repository; scripts catch that.
    from drivetrain.commands.estimate import estimate_command, estimate_command_parser

    args = estimate_command_parser().parse_args(["no-such-owner/no-such-model"])
    with pytest.raises(OSError, match="no-such-owner/no-such-model"):
        estimate_command(args)


def test_launch_help_says_once_that_flags_take_hyphens_or_underscores_and_both_parse_alike():
    from drivetrain.commands.launch import launch_command_parser

    parser = launch_command_parser()
    help_text = parser.format_help()
    assert help_text.count("--num-processes") == 1 and "--num_processes=2" in help_text
    hyphen = parser.parse_args(["--num-processes", "3", "--main-process-port", "29600", "train.py"])
    underscore = parser.parse_args(["--num_processes", "3", "--main_process_port", "29600", "train.py"])
    assert (
        (hyphen.num_processes, hyphen.main_process_port)
        == (underscore.num_processes, underscore.main_process_port)
        == (3, 29600)
    )


def test_base_dataloader_is_an_instance_attribute_as_in_accelerate():
    from drivetrain.data_loader import DataLoaderShard

    loader = DataLoaderShard(range(16), batch_size=4)
    assert isinstance(loader.base_dataloader, DataLoader)
    assert [batch.tolist() for batch in loader.base_dataloader][0] == [0, 1, 2, 3]
    assert not hasattr(DataLoaderShard, "base_dataloader")  # on the class it is not there, as in Accelerate


def test_an_iterable_dataset_with_enough_file_shards_gives_each_process_its_own_shards():
    datasets = pytest.importorskip("datasets")
    from drivetrain.data.samplers import IterableDatasetShard
    from drivetrain.data_loader import prepare_data_loader

    dataset = datasets.Dataset.from_dict({"x": list(range(10))}).to_iterable_dataset(num_shards=2)
    seen = []
    for rank in range(2):
        loader = prepare_data_loader(
            DataLoader(dataset, batch_size=4), num_processes=2, process_index=rank, dispatch_batches=False
        )
        assert not isinstance(loader.dataset, IterableDatasetShard)
        seen.append([x for batch in loader for x in batch["x"].tolist()])
    assert seen == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]  # whole shards, each read by one process only
    # fewer shards than processes: sample-level sharding, as before
    one_shard = datasets.Dataset.from_dict({"x": list(range(8))}).to_iterable_dataset(num_shards=1)
    loader = prepare_data_loader(
        DataLoader(one_shard, batch_size=2), num_processes=2, process_index=1, dispatch_batches=False
    )
    assert isinstance(loader.dataset, IterableDatasetShard)
