"""Big model inference: build a model without memory, load a checkpoint straight to its devices, run it
across GPUs, CPU and disk.

The kernel plans and loads (sizes, device maps, checkpoint streaming). Running a model whose weights are
offloaded or spread over devices needs the offload plugin (``pip install drivetrain-offload``), which
provides the module hooks, ``cpu_offload``, ``disk_offload`` and friends; they are importable from here too.
"""

from __future__ import annotations

from typing import Any

from drivetrain.big_modeling.device_map import (
    check_device_map,
    clean_device_map,
    find_tied_parameters,
    infer_auto_device_map,
)
from drivetrain.big_modeling.dispatch import dispatch_model, load_checkpoint_and_dispatch
from drivetrain.big_modeling.empty_init import init_empty_weights, init_on_device
from drivetrain.big_modeling.loading import LoadResult, load_checkpoint_in_model
from drivetrain.big_modeling.sizes import (
    compute_module_sizes,
    get_balanced_memory,
    get_max_memory,
    parse_size,
)
from drivetrain.compat.paths import MODULE_HOOK_NAMES, OFFLOAD_FUNCTION_NAMES, PLUGIN_NAMES_BY_PATH

# Provided by the offload plugin, resolved on first use.
PLUGIN_NAMES = (*MODULE_HOOK_NAMES, *OFFLOAD_FUNCTION_NAMES, *PLUGIN_NAMES_BY_PATH["accelerate.big_modeling"])

__all__ = [
    "LoadResult",
    "check_device_map",
    "clean_device_map",
    "compute_module_sizes",
    "dispatch_model",
    "find_tied_parameters",
    "get_balanced_memory",
    "get_max_memory",
    "infer_auto_device_map",
    "init_empty_weights",
    "init_on_device",
    "load_checkpoint_and_dispatch",
    "load_checkpoint_in_model",
    "parse_size",
    "logger",
    *dict.fromkeys(PLUGIN_NAMES),
]


# Accelerate calls this guard where DeepSpeed's Ulysses sequence parallelism wraps the model in prepare(); the
# deepspeed plugin does not set Ulysses up yet (docs/deepspeed.md), so nothing here calls it. It stays because
# it is the reference's name at this path, which the reference's own tests import (the peer suite's
# RefuseRecurrentLayersTester); whoever wires Ulysses into the deepspeed plugin offers it through the plugin API
# and calls it there.
def _refuse_recurrent_layers_under_sequence_parallelism(model: Any) -> None:
    """Refuse a model whose configuration lists linear-attention layers when its sequence is to be sharded:
    those layers carry a state along the sequence outside the attention call a sequence-parallel backend wraps,
    so each rank would restart it from zero and the gradients would be wrong without any error (Accelerate's
    check, same message)."""
    config = getattr(model, "config", None)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    recurrent = sorted(
        {kind for kind in getattr(config, "layer_types", None) or [] if "linear_attention" in kind}
    )
    if recurrent:
        raise ValueError(
            f"Sequence parallelism does not support attention layers of type {recurrent} (model "
            f"{type(model).__name__}). Those layers carry a recurrent state along the sequence and bypass the "
            "attention interface, so sharding the sequence restarts the state on every rank and produces wrong "
            "gradients without failing. Use a full-attention model, or disable sequence parallelism."
        )


def __getattr__(name: str) -> Any:
    if name in PLUGIN_NAMES:
        from drivetrain.contract.reexport import plugin_name

        value = plugin_name(name, PLUGIN_NAMES_BY_PATH["accelerate.big_modeling"].get(name), __name__)
        globals()[name] = value
        return value
    if name == "logger":
        from drivetrain.logging import get_logger

        return get_logger(__name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
