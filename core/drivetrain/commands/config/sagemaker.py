"""Accelerate's ``accelerate.commands.config.sagemaker``: questions for Amazon SageMaker, provided by a
SageMaker plugin (importable here; using it names the distribution to install)."""

from drivetrain.contract.reexport import reexport

__getattr__, __dir__, __all__ = reexport(__name__, {})
