"""``ipex.optimize`` of a model and its optimizer, in place, inside the wrap_model / wrap_optimizer chain.

ipex.optimize converts a model and its optimizer *together* (prepacked weight layouts, bf16 weights whose fp32
master copies live in the optimizer, a fused optimizer step), while the kernel wraps every model of a
``prepare`` call before its optimizers. The two hooks share the work:

- ``wrap_model``: when an optimizer of the same ``prepare`` call holds the model's parameters
  (``accelerator.prepared.pending_optimizers``), optimise the pair now, before a backend (ddp) wraps the
  model. A model in eval mode with no optimizer is optimised for inference. A training model whose optimizer
  has not been seen yet is remembered.
- ``wrap_optimizer``: an optimizer already optimised with its model is left alone; one holding a remembered
  model's parameters optimises the pair then (only while no other plugin has wrapped that model: a wrapper
  such as DDP keeps references to the parameters ipex would replace).

Everything is converted in place (``inplace=True``, as Accelerate calls it): the model and the optimizer the
user holds *are* the converted ones. So ``accelerator.unwrap_model`` returns the user's module, learning-rate
schedulers keep driving the optimizer that steps, and neither hook returns a replacement object.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import weakref
from collections.abc import Iterator
from importlib import metadata
from typing import Any

import torch

from drivetrain.plugin_api import ConfigurationError, PluginAccelerator, PluginError
from drivetrain.plugin_api.training import AcceleratedOptimizer, track_step_for_schedulers
from drivetrain_ipex.settings import Request

#: The distribution and the torch it was built for (IPEX's last release; the project is end-of-life).
IPEX_DISTRIBUTION = "intel-extension-for-pytorch"
INSTALL_HINT = (
    "pip install 'drivetrain-ipex[ipex]' (torch 2.8 with IPEX 2.8.0, its last release; see docs/ipex.md)"
)

#: How each model was optimised: "training" or "inference".
_optimised_models: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()
#: Optimizers converted together with their model.
_optimised_optimizers: weakref.WeakSet[Any] = weakref.WeakSet()
#: Per Accelerator: training models prepared before their optimizer.
_waiting: weakref.WeakKeyDictionary[Any, weakref.WeakSet[torch.nn.Module]] = weakref.WeakKeyDictionary()
_noticed: set[str] = set()


def ipex_installed() -> bool:
    try:
        metadata.version(IPEX_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return False
    return True


def wants_ipex(request: Request) -> bool:
    """Whether models are optimised: asked for, or Accelerate's ``use_xpu`` with IPEX installed."""
    return request.optimize or (request.use_xpu and ipex_installed())


def load_ipex(request: Request) -> Any:
    """Import IPEX, or raise one line saying why it cannot be used. IPEX refuses a torch of another minor
    version by crashing at import (``os.exit``), so the versions are compared first, from package metadata."""
    try:
        version = metadata.version(IPEX_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise PluginError(
            f"{request.source} asks for ipex.optimize, but {IPEX_DISTRIBUTION} is not installed: {INSTALL_HINT}"
        ) from None
    wanted, found = ".".join(version.split(".")[:2]), ".".join(torch.__version__.split(".")[:2])
    if wanted != found:
        raise PluginError(
            f"{request.source} asks for ipex.optimize, but {IPEX_DISTRIBUTION} {version} works only with torch "
            f"{wanted}.* and this is torch {torch.__version__}: {INSTALL_HINT}"
        )
    import intel_extension_for_pytorch as ipex

    return ipex


def ipex_for(request: Request, accelerator: PluginAccelerator) -> Any:
    """IPEX, when it can optimise on this run's device; None when only Accelerate's ``use_xpu`` asked and the
    installed IPEX cannot (a notice says so). IPEX's PyPI wheels are CPU builds; its XPU builds come from
    Intel's package index (``_C._has_xpu()``)."""
    ipex = load_ipex(request)
    if accelerator.device.type != "xpu":
        return ipex
    has_xpu = getattr(ipex._C, "_has_xpu", None)
    if has_xpu is not None and has_xpu():
        return ipex
    if request.optimize:
        raise PluginError(
            f"{request.source} asks for ipex.optimize on {accelerator.device}, but intel-extension-for-pytorch "
            f"{ipex.__version__} is a CPU build; install IPEX's XPU build (Intel's package index), or do not ask "
            "for ipex to train on the XPU with torch alone"
        )
    notice(
        f"intel-extension-for-pytorch {ipex.__version__} is a CPU build: training on the XPU with torch alone",
        accelerator,
    )
    return None


def bf16_prepack_supported() -> bool:
    """Whether oneDNN can prepack bf16 weights on this CPU (AVX-512 BW/VL/DQ, AVX-NE-CONVERT or AMX): the test
    ipex.optimize asserts when it prepacks bf16 weights."""
    from intel_extension_for_pytorch import _C

    check = getattr(_C, "onednn_has_bf16_support", None)
    if check is not None:
        return bool(check())
    return torch.backends.cpu.get_cpu_capability() == "AVX512"


def notice(message: str, accelerator: PluginAccelerator) -> None:
    """One line on stderr, once per process, from each machine's first process."""
    if message in _noticed or not accelerator.is_local_main_process:
        return
    _noticed.add(message)
    print(f"drivetrain-ipex: {message}", file=sys.stderr, flush=True)


class _DropDeprecationNotes(logging.Filter):
    """IPEX logs that 'fuse_update_step' and 'split_master_weight_for_bf16' "will be deprecated" on every
    optimize at level O1, which turns them on itself: nothing a user can act on."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "will be deprecated in a future release" not in record.getMessage()


@contextlib.contextmanager
def _quiet_deprecation_notes() -> Iterator[None]:
    ipex_logger, note_filter = logging.getLogger("IPEX"), _DropDeprecationNotes()
    ipex_logger.addFilter(note_filter)
    try:
        yield
    finally:
        ipex_logger.removeFilter(note_filter)


def optimize_options(accelerator: PluginAccelerator, training: bool) -> dict[str, Any]:
    """ipex.optimize's keyword arguments for this run (besides model and optimizer)."""
    options: dict[str, Any] = {"inplace": True, "level": "O1"}
    # bf16 converts the weights (fp32 master copies in the optimizer); fp16 keeps fp32 weights under the
    # kernel's fp16 autocast, as Accelerate does.
    options["dtype"] = torch.bfloat16 if accelerator.mixed_precision == "bf16" else None
    if not training:
        # Folding conv/linear + batch norm traces a copy with torch.fx: the user's module would no longer be
        # the optimised one (and the copy would lose the kernel's autocast forward). Dropout is already a
        # no-op in eval mode; replacing it would change the module if it trains later.
        options.update(conv_bn_folding=False, linear_bn_folding=False, replace_dropout_with_identity=False)
    if (
        options["dtype"] is torch.bfloat16
        and accelerator.device.type == "cpu"
        and not bf16_prepack_supported()
    ):
        options["weights_prepack"] = False
        notice(
            "this CPU has no AVX-512 (BW/VL/DQ), AVX-NE-CONVERT or AMX, which bf16 weight prepacking needs; "
            "optimising with weights_prepack=False (same results, less speed-up)",
            accelerator,
        )
    return options


def _converted_in_place(model: torch.nn.Module, result: torch.nn.Module) -> torch.nn.Module:
    """The user's module, converted. Prepacking swaps a Linear/Conv for IPEX's class, which for the root module
    itself means a new object sharing the old one's ``__dict__``; giving the user's object that class makes it
    that module, so the object the user holds is the one that trains."""
    if result is model:
        return model
    if getattr(result, "__dict__", None) is model.__dict__:
        model.__class__ = type(result)
        return model
    return result


def _optimise(
    ipex: Any, model: torch.nn.Module, optimizer: Any, accelerator: PluginAccelerator
) -> torch.nn.Module:
    training = optimizer is not None
    options = optimize_options(accelerator, training)
    was_training = model.training
    with _quiet_deprecation_notes():
        if training:
            # ipex.optimize decides training vs inference by the module's mode (an eval-mode module with an
            # optimizer is an AssertionError); the user's mode is restored afterwards.
            model.train()
            step_before = optimizer.step
            result, converted_optimizer = ipex.optimize(model, optimizer=optimizer, **options)
            model.train(was_training)
            if converted_optimizer is not optimizer:  # in place, so never; guards a future IPEX
                raise PluginError("ipex.optimize(inplace=True) returned another optimizer object")
            if getattr(step_before, "_wrapped_by_lr_sched", False):
                # a scheduler built on this optimizer tracked its step; IPEX's fused step replaced it
                track_step_for_schedulers(optimizer)
            _optimised_optimizers.add(optimizer)
        else:
            result = ipex.optimize(model, **options)
    converted = _converted_in_place(model, result)
    _optimised_models[converted] = "training" if training else "inference"
    return converted


def _parameters_of(optimizer: Any) -> list[torch.Tensor]:
    return [parameter for group in optimizer.param_groups for parameter in group["params"]]


def optimizer_for(model: torch.nn.Module, optimizers: list[Any]) -> Any:
    """The one optimizer among ``optimizers`` that holds ``model``'s parameters, or None. ipex.optimize
    converts one model with one optimizer, so sharing either way is an error."""
    mine = {id(parameter) for parameter in model.parameters()}
    found = []
    for optimizer in optimizers:
        if isinstance(optimizer, AcceleratedOptimizer):
            continue  # prepared before: converted then, or never
        held = [id(parameter) in mine for parameter in _parameters_of(optimizer)]
        if not any(held):
            continue
        if not all(held):
            raise ConfigurationError(
                f"ipex: a {type(optimizer).__name__} holds parameters of {type(model).__name__} and of other "
                "modules; ipex.optimize converts one model with one optimizer: give each model its own optimizer"
            )
        found.append(optimizer)
    if len(found) > 1:
        raise ConfigurationError(
            f"ipex: {len(found)} optimizers hold parameters of one {type(model).__name__}; ipex.optimize converts "
            "one model with one optimizer: use one optimizer (with parameter groups) per model"
        )
    return found[0] if found else None


def wrap_model(
    model: torch.nn.Module, accelerator: PluginAccelerator, request: Request
) -> torch.nn.Module | None:
    if model in _optimised_models:
        return None  # prepared again
    ipex = ipex_for(request, accelerator)  # a missing IPEX is reported now, whatever comes next
    if ipex is None:
        return None
    optimizer = optimizer_for(model, list(accelerator.prepared.pending_optimizers))
    if optimizer is not None:
        return _optimise(ipex, model, optimizer, accelerator)
    if not model.training:
        return _optimise(ipex, model, None, accelerator)
    # Training, and its optimizer comes in a later prepare() call (or never: then it stays as it is).
    _waiting.setdefault(accelerator, weakref.WeakSet()).add(model)
    return None


def _wrapped_by_another_plugin(model: torch.nn.Module, accelerator: PluginAccelerator) -> bool:
    return any(
        prepared is not model and accelerator.unwrap_model(prepared) is model
        for prepared in accelerator.prepared.models
    )


def wrap_optimizer(optimizer: Any, accelerator: PluginAccelerator, request: Request) -> None:
    if optimizer in _optimised_optimizers:
        return
    for model in list(_waiting.get(accelerator, ())):
        if optimizer_for(model, [optimizer]) is None:
            continue
        if _wrapped_by_another_plugin(model, accelerator):
            raise ConfigurationError(
                f"ipex: the optimizer of {type(model).__name__} was prepared in a later prepare() call than the "
                "model, which the backend has wrapped since (ipex.optimize must convert both before that): "
                "prepare the model and its optimizer in one call"
            )
        _waiting[accelerator].discard(model)
        _optimise(ipex_for(request, accelerator), model, optimizer, accelerator)
        return
    for model, how in list(_optimised_models.items()):
        if how == "inference" and optimizer_for(model, [optimizer]) is not None:
            raise ConfigurationError(
                f"ipex: {type(model).__name__} was optimised for inference (it was in eval mode and prepared "
                "without an optimizer); prepare it together with its optimizer to train it"
            )
