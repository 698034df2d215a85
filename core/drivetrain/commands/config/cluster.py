"""Accelerate's ``accelerate.commands.config.cluster``: the questions for a local machine or cluster."""

from drivetrain.commands.config.config import get_user_input as get_cluster_input

__all__ = ["get_cluster_input"]
