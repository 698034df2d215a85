"""Breaks dataloader_modes: the loader does not synchronise the random state, so processes seeded
differently shuffle differently (samples repeated and lost)."""

from drivetrain import hookimpl
from drivetrain.plugin_api.data import prepare_data_loader
from drivetrain_ddp.plugin import PLUGIN_INFO, setup_process_group, wrap_model  # noqa: F401


@hookimpl
def shard_dataloader(dataloader, options):
    return prepare_data_loader(dataloader, **{**options.to_kwargs(), "rng_types": None})
