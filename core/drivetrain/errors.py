"""Exception types that name their cause and fix."""


class DrivetrainError(Exception):
    """Base class of drivetrain's own errors."""


class PluginError(DrivetrainError):
    """A plugin is unknown, invalid, or failed to load."""


class ConfigurationError(DrivetrainError, ValueError):
    """Two configuration sources disagree, or a value is invalid."""


class CheckpointError(DrivetrainError):
    """A checkpoint is missing, partial, or does not match its manifest."""


class CheckpointMismatchError(CheckpointError, RuntimeError):
    """Strict loading found missing or unexpected keys; a RuntimeError too, as torch's ``load_state_dict``."""


class UsageError(DrivetrainError):
    """A bad flag or value on the command line: ``drivetrain`` prints it as one line and exits with code 2."""


class CheckpointWarning(UserWarning):
    """Something about a checkpoint needs the user's attention, though the operation succeeded (an old
    checkpoint that pruning could not delete)."""


class ModelNotFoundError(UsageError, OSError):
    """A model name that is no local folder, file or class and no model available offline; an OSError too,
    as transformers' ``from_pretrained`` raises for a repository that does not exist."""
