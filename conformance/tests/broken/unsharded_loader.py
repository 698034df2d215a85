"""Breaks dataloader_modes: every process iterates the whole data set."""

from drivetrain import hookimpl
from drivetrain.plugin_api.data import prepare_data_loader
from drivetrain_ddp.plugin import PLUGIN_INFO, setup_process_group, wrap_model  # noqa: F401


@hookimpl
def shard_dataloader(dataloader, options):
    return prepare_data_loader(dataloader, **{**options.to_kwargs(), "num_processes": 1, "process_index": 0})
