"""Accelerate's ``accelerate.commands.config.config_utils``: what the config questions offer."""

from __future__ import annotations

import argparse

from drivetrain.config.enums import DynamoBackend

#: The ``torch.compile`` backends a config may name (Accelerate's list, by value).
DYNAMO_BACKENDS = [backend.value for backend in DynamoBackend if backend != DynamoBackend.NO]


class SubcommandHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help without the ``{default,update}`` choices line Accelerate leaves out of its subcommands' usage."""

    def _format_usage(self, usage, actions, groups, prefix):  # type: ignore[no-untyped-def]
        return super()._format_usage(usage, actions, groups, prefix).replace("<command> [<args>] ", "")


__all__ = ["DYNAMO_BACKENDS", "SubcommandHelpFormatter"]
