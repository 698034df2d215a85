"""drivetrain-deepspeed: the DeepSpeed backend (ZeRO stages 0-3, offload, several engines).

Importing this package does not import deepspeed; the engine modules import it when a run needs it.
"""

from drivetrain_deepspeed.config import DeepSpeedPlugin, HfDeepSpeedConfig
from drivetrain_deepspeed.dummies import DummyOptim, DummyScheduler
from drivetrain_deepspeed.selection import get_active_deepspeed_plugin, select_deepspeed_plugin

__all__ = [
    "DeepSpeedPlugin",
    "DummyOptim",
    "DummyScheduler",
    "HfDeepSpeedConfig",
    "get_active_deepspeed_plugin",
    "select_deepspeed_plugin",
]
