"""Behaviour Accelerate ties to a backend or precision, asked of the plugins that declare it (contract 1.3):
``Capabilities.joinable``, ``PluginInfo.sp_backend``, ``PluginInfo.grad_scaler`` and
``PluginInfo.autocast_dtype``. A plugin that declares one gets the behaviour; one that does not, does not."""

from __future__ import annotations

import contextlib
import types
import warnings

import pytest
import torch

from drivetrain.config.enums import DistributedType
from drivetrain.contract.info import Capabilities, PluginInfo
from drivetrain.contract.registry import get_plugin_registry, reset_plugin_registry
from drivetrain.errors import ConfigurationError, PluginError

SHARDED_GRAD_SCALER = "torch.distributed.fsdp.sharded_grad_scaler:ShardedGradScaler"


def _register(name: str, **declared) -> None:
    capabilities = declared.pop("capabilities", Capabilities())
    kind = declared.pop("kind", "backend")
    plugin = types.SimpleNamespace(PLUGIN_INFO=PluginInfo(kind=kind, capabilities=capabilities, **declared))
    get_plugin_registry().register(name, plugin)


@pytest.fixture
def only_the_reference_backend(monkeypatch):
    """No installed plugin but ``local``: the test registers the ones it needs."""
    monkeypatch.setenv("DRIVETRAIN_LOAD_PLUGINS", "local")
    reset_plugin_registry()


# -- Capabilities.joinable -------------------------------------------------------------------------------------
@pytest.fixture
def joins(monkeypatch):
    """Records each torch ``Join`` entered (no process group is needed to tell whether it was)."""
    entered: list[list] = []

    @contextlib.contextmanager
    def recording_join(joinables, *args, **kwargs):
        entered.append(list(joinables))
        yield

    monkeypatch.setattr("torch.distributed.algorithms.join.Join", recording_join)
    return entered


def _join_block(distributed_type: DistributedType, backend: str) -> list[str]:
    """Run an empty ``join_uneven_inputs`` block as the Accelerator of a multi-process run does; its warnings."""
    from drivetrain.data.samplers import join_uneven_inputs

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with join_uneven_inputs(["model"], [], None, True, distributed_type, backend):
            pass
    return [str(warning.message) for warning in caught]


def test_a_joinable_backend_runs_join_uneven_inputs_under_join(only_the_reference_backend, joins):
    _register("joiner", capabilities=Capabilities(multi_process=True, joinable=True))
    assert _join_block(DistributedType.MULTI_CPU, "joiner") == []
    assert joins == [["model"]]


def test_a_backend_not_declaring_joinable_warns_and_runs_without_join(only_the_reference_backend, joins):
    _register("engine", capabilities=Capabilities(multi_process=True))
    messages = _join_block(DistributedType.MULTI_GPU, "engine")
    assert joins == []
    assert any("only supported for multi-GPU" in message for message in messages), messages


def test_a_backend_written_for_contract_1_2_keeps_joining_plain_multi_process_runs(
    only_the_reference_backend, joins
):
    """1.2 had no declaration: the kernel joined every MULTI_* run. A minor version must not change that for a
    plugin written before it; a sharded engine's own type still answers no."""
    _register("old-ddp", contract="1.2", capabilities=Capabilities(multi_process=True))
    assert _join_block(DistributedType.MULTI_CPU, "old-ddp") == []
    assert joins == [["model"]]
    _register(
        "old-engine", contract="1.2", distributed_type="FSDP", capabilities=Capabilities(multi_process=True)
    )
    assert any("only supported" in message for message in _join_block(DistributedType.FSDP, "old-engine"))
    assert joins == [["model"]]


def test_the_backend_answering_a_named_distributed_type_decides(only_the_reference_backend, joins):
    """Accelerate's tests set ``state.distributed_type = FSDP`` in a DDP run and expect the warning: the type's
    own backend (declaring no joinable) answers, or nobody when it is not installed."""
    _register("joiner", capabilities=Capabilities(multi_process=True, joinable=True))
    assert any("only supported" in message for message in _join_block(DistributedType.FSDP, "joiner"))
    _register("sharder", distributed_type="FSDP", capabilities=Capabilities(multi_process=True))
    assert any("only supported" in message for message in _join_block(DistributedType.FSDP, "joiner"))
    assert joins == []


def test_the_in_tree_data_parallel_backend_is_joinable_and_sharded_ones_are_not():
    registry = get_plugin_registry()
    names = registry.names()
    if "ddp" in names:
        assert registry.info("ddp").capabilities.joinable
    for name in ("fsdp", "deepspeed", "megatron", "xla"):
        if name in names:
            assert not registry.info(name).capabilities.joinable, name


# -- PluginInfo.sp_backend ---------------------------------------------------------------------------------------
def test_sp_backend_accepts_what_an_installed_backend_declares(only_the_reference_backend):
    from drivetrain.parallelism_config import ParallelismConfig

    with pytest.raises(ConfigurationError, match="Invalid sp_backend: ring.*choose one of: deepspeed$"):
        ParallelismConfig(sp_backend="ring")
    _register("ringer", sp_backend="ring", capabilities=Capabilities(multi_process=True))
    assert ParallelismConfig(sp_backend="ring").sp_backend == "ring"
    with pytest.raises(ConfigurationError, match="choose one of: deepspeed, ring$"):
        ParallelismConfig(sp_backend="other")


def test_sp_backend_keeps_accelerates_default_without_the_plugin_running_it(only_the_reference_backend):
    from drivetrain.parallelism_config import ParallelismConfig

    assert ParallelismConfig().sp_backend == "deepspeed"
    assert ParallelismConfig(sp_backend="DeepSpeed").sp_backend == "deepspeed"


def test_sp_backend_of_a_non_backend_plugin_is_not_read(only_the_reference_backend):
    from drivetrain.parallelism_config import ParallelismConfig

    _register("feature", kind="feature", sp_backend="ring")
    with pytest.raises(ConfigurationError, match="Invalid sp_backend: ring"):
        ParallelismConfig(sp_backend="ring")


# -- PluginInfo.grad_scaler --------------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled")
def test_get_grad_scaler_builds_the_scaler_the_answering_backend_declares(only_the_reference_backend):
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    from drivetrain.utils import get_grad_scaler

    _register("sharder", distributed_type="FSDP", grad_scaler=SHARDED_GRAD_SCALER)
    assert isinstance(get_grad_scaler(DistributedType.FSDP), ShardedGradScaler)
    assert isinstance(get_grad_scaler("FSDP", init_scale=8.0), ShardedGradScaler)
    scaler = get_grad_scaler(DistributedType.MULTI_CPU)
    assert type(scaler) is torch.amp.GradScaler


@pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled")
def test_get_grad_scaler_of_a_backend_declaring_none_is_torchs(only_the_reference_backend):
    from drivetrain.utils import get_grad_scaler

    _register("sharder", distributed_type="FSDP")
    assert type(get_grad_scaler(DistributedType.FSDP)) is torch.amp.GradScaler


def test_get_grad_scaler_of_a_backend_not_installed_names_its_distribution(only_the_reference_backend):
    from drivetrain.utils import get_grad_scaler

    with pytest.raises(PluginError, match="pip install drivetrain-fsdp"):
        get_grad_scaler(DistributedType.FSDP)


@pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled")
def test_get_grad_scaler_fsdp_is_torchs_sharded_scaler_with_the_fsdp_plugin():
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    from drivetrain.utils import get_grad_scaler

    if "fsdp" not in get_plugin_registry().names():
        pytest.skip("the fsdp plugin is not installed")
    assert isinstance(get_grad_scaler(distributed_type=DistributedType.FSDP), ShardedGradScaler)


# -- PluginInfo.autocast_dtype -----------------------------------------------------------------------------------
def _autocast_of(monkeypatch, precision: str):
    from drivetrain.state import AcceleratorState
    from drivetrain.utils import get_mixed_precision_context_manager

    state = types.SimpleNamespace(mixed_precision=precision, device=torch.device("cpu"))

    class StateOfAPrecision(AcceleratorState):  # keeps the class methods that resetting the state calls
        def __new__(cls, *args, **kwargs):
            return state

    monkeypatch.setattr("drivetrain.state.AcceleratorState", StateOfAPrecision)
    return get_mixed_precision_context_manager(native_amp=True)


def test_autocast_of_a_plugin_precision_computes_in_the_dtype_it_declares(
    only_the_reference_backend, monkeypatch
):
    _register("fp-eight", kind="precision", precisions=("fp8",), autocast_dtype="bfloat16")
    context = _autocast_of(monkeypatch, "fp8")
    assert isinstance(context, torch.autocast) and context.fast_dtype == torch.bfloat16
    assert _autocast_of(monkeypatch, "bf16").fast_dtype == torch.bfloat16
    assert _autocast_of(monkeypatch, "fp16").fast_dtype == torch.float16


def test_autocast_of_a_plugin_precision_declaring_no_dtype_is_torchs_default(
    only_the_reference_backend, monkeypatch
):
    _register("fp-eight", kind="precision", precisions=("fp8",))
    assert _autocast_of(monkeypatch, "fp8").fast_dtype == torch.get_autocast_dtype("cpu")


def test_autocast_dtype_must_name_a_floating_torch_dtype(only_the_reference_backend, monkeypatch):
    _register("fp-eight", kind="precision", precisions=("fp8",), autocast_dtype="int8")
    with pytest.raises(PluginError, match="autocast_dtype='int8' is not a floating torch dtype"):
        _autocast_of(monkeypatch, "fp8")


def test_autocast_of_a_precision_no_plugin_provides_names_what_to_install(
    only_the_reference_backend, monkeypatch
):
    with pytest.raises(PluginError, match="pip install drivetrain-fp8"):
        _autocast_of(monkeypatch, "fp8")
