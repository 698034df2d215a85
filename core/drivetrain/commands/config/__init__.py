"""``drivetrain config`` (the command lives in :mod:`drivetrain.commands.config_command`), and Accelerate's
``accelerate.commands.config`` package: its parsers and the config file classes (``config_args``)."""

from drivetrain.commands.config_command import HELP, Questions, questionnaire, register_parser, run
from drivetrain.contract.reexport import reexport

_getattr, __dir__, _names = reexport(
    __name__,
    {
        "config_command_parser": "drivetrain.commands.config.config",
        "default_command_parser": "drivetrain.commands.config.default",
        "update_command_parser": "drivetrain.commands.config.update",
        "get_config_parser": "drivetrain.commands.config.config",
        "main": "drivetrain.commands.config.config",
        "default_config_file": "drivetrain.commands.config.config_args",
        "load_config_from_file": "drivetrain.commands.config.config_args",
    },
)
__getattr__ = _getattr
__all__ = [
    "HELP",
    "Questions",
    "config_command_parser",
    "default_command_parser",
    "default_config_file",
    "get_config_parser",
    "load_config_from_file",
    "main",
    "questionnaire",
    "register_parser",
    "run",
    "update_command_parser",
]
