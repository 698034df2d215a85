"""The trackers plugin: registers every tracker class by its name (``log_with="tensorboard"``...)."""

from __future__ import annotations

from drivetrain import hookimpl
from drivetrain.plugin_api import ExtensionRegistry, PluginInfo
from drivetrain_trackers.aim_tracker import AimTracker
from drivetrain_trackers.clearml_tracker import ClearMLTracker
from drivetrain_trackers.comet_tracker import CometMLTracker
from drivetrain_trackers.dvclive_tracker import DVCLiveTracker
from drivetrain_trackers.mlflow_tracker import MLflowTracker
from drivetrain_trackers.swanlab_tracker import SwanLabTracker
from drivetrain_trackers.tensorboard_tracker import TensorBoardTracker
from drivetrain_trackers.trackio_tracker import TrackioTracker
from drivetrain_trackers.wandb_tracker import WandBTracker

PLUGIN_INFO = PluginInfo(
    kind="extension",
    description="experiment trackers: tensorboard, wandb, mlflow, aim, dvclive, comet_ml, clearml, swanlab, trackio "
    "(each needs its own library: pip install 'drivetrain-trackers[<name>]')",
)

TRACKERS = (
    TensorBoardTracker,
    WandBTracker,
    MLflowTracker,
    AimTracker,
    DVCLiveTracker,
    CometMLTracker,
    ClearMLTracker,
    SwanLabTracker,
    TrackioTracker,
)


@hookimpl
def register_extensions(registry: ExtensionRegistry) -> None:
    for tracker_class in TRACKERS:
        registry.add_tracker(tracker_class.name, tracker_class)
