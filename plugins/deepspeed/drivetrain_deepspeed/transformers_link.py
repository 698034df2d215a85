"""What transformers sees of DeepSpeed: the object behind ``transformers.integrations.is_deepspeed_zero3_enabled()``
and ``deepspeed_config()``.

transformers keeps a weak reference to one config object and asks it ``is_zero3()`` when it builds a model
(``from_pretrained``/``from_config`` then create the parameters inside ``deepspeed.zero.Init``), resizes
embeddings or generates. Accelerate hands it a new object each time a plugin is selected; here one object
answers for whatever is active *now*: the active plugin of the running Accelerator when it runs the deepspeed
backend (so ``state.select_deepspeed_plugin("teacher")`` switches what transformers sees), otherwise the
plugin that called ``set_deepspeed_weakref()`` last.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import Any

from drivetrain.plugin_api import ConfigurationError
from drivetrain.plugin_api.state import initialized_accelerator_state


def running_mixed_precision() -> str:
    """The running Accelerator's mixed precision ("no" before one exists)."""
    state = initialized_accelerator_state()
    return getattr(state, "mixed_precision", "no") if state is not None else "no"


#: ``get_active_deepspeed_plugin``, set by selection.py when it is imported (the package imports it first);
#: injected rather than imported so that this module depends on no other module of the plugin.
active_plugin_of: Callable[[Any], Any] | None = None


def _active_plugin() -> Any:
    state = initialized_accelerator_state()
    if (
        state is not None
        and getattr(state, "backend_name", None) == "deepspeed"
        and active_plugin_of is not None
    ):
        return active_plugin_of(state)
    return _pinned() if _pinned is not None else None


class ActiveDeepSpeedConfig:
    """The object transformers' weakref points at (one per process, kept alive by this module)."""

    def plugin(self) -> Any:
        return _active_plugin()

    def is_zero3(self) -> bool:
        plugin = _active_plugin()
        return plugin is not None and plugin.stage == 3

    @property
    def config(self) -> dict[str, Any] | None:
        """The active configuration as ``zero.Init`` takes it (no "auto" left; see zero_init_config)."""
        from drivetrain_deepspeed.zero_init import zero_init_config

        plugin = _active_plugin()
        return None if plugin is None else zero_init_config(plugin, running_mixed_precision())


_ACTIVE = ActiveDeepSpeedConfig()
_pinned: weakref.ref | None = None


def pin(plugin: Any) -> None:
    """Make ``plugin`` what transformers sees while no Accelerator runs the deepspeed backend."""
    global _pinned
    _pinned = weakref.ref(plugin)


def register_with_transformers(required: bool) -> ActiveDeepSpeedConfig | None:
    """Point transformers' DeepSpeed weakref at :data:`_ACTIVE`. Without transformers: an error when
    ``required``, else nothing (callers that merely keep it current check ``sys.modules`` first)."""
    try:
        from transformers.integrations import deepspeed as hf_deepspeed
    except ImportError:
        if required:
            raise ConfigurationError(
                "DeepSpeedPlugin.set_deepspeed_weakref() tells transformers about the DeepSpeed config: pip install "
                "transformers"
            ) from None
        return None
    hf_deepspeed.set_hf_deepspeed_config(_ACTIVE)
    return _ACTIVE


def keep_transformers_current() -> None:
    """Register with transformers when the script already imported it (no import cost otherwise)."""
    if "transformers" in sys.modules:
        register_with_transformers(required=False)
