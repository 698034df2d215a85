"""drivetrain-deepspeed: the DeepSpeed backend (ZeRO stages 0-3, offload, several engines).

Importing this package does not import deepspeed; the engine modules import it when a run needs it.
"""

from drivetrain_deepspeed.config import DeepSpeedPlugin
from drivetrain_deepspeed.cpu_optimizers import map_pytorch_optim_to_deepspeed
from drivetrain_deepspeed.dummies import DummyOptim, DummyScheduler
from drivetrain_deepspeed.hf_config import HfDeepSpeedConfig
from drivetrain_deepspeed.selection import get_active_deepspeed_plugin, select_deepspeed_plugin
from drivetrain_deepspeed.wrappers import (
    DeepSpeedEngineWrapper,
    DeepSpeedOptimizerWrapper,
    DeepSpeedSchedulerWrapper,
)

__all__ = [
    "DeepSpeedEngineWrapper",
    "DeepSpeedOptimizerWrapper",
    "DeepSpeedPlugin",
    "DeepSpeedSchedulerWrapper",
    "DummyOptim",
    "DummyScheduler",
    "HfDeepSpeedConfig",
    "get_active_deepspeed_plugin",
    "map_pytorch_optim_to_deepspeed",
    "select_deepspeed_plugin",
]
