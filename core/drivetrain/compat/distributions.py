"""The distributions the kernel names when something is missing: one constant each for those named in
several tables, and the ones nobody publishes yet."""

#: Installed when a script runs in several processes and no installed backend handles that.
MULTIPROCESS_BACKEND_DISTRIBUTION = "drivetrain-ddp"

#: The distribution of Accelerate's offloading machinery (the ``dispatch_module`` hook) and of its built-in
#: experiment trackers, for the error when none is installed.
OFFLOAD_DISTRIBUTION = "drivetrain-offload"

TRACKERS_DISTRIBUTION = "drivetrain-trackers"

QUANTIZATION_DISTRIBUTION = "drivetrain-bnb"

PIPELINE_DISTRIBUTION = "drivetrain-pippy"

SAGEMAKER_DISTRIBUTION = "drivetrain-sagemaker"

#: Distributions named above that no one publishes yet, with what they would provide: a placeholder for one of
#: their names says that, rather than asking for a ``pip install`` of a package that does not exist.
UNPUBLISHED_DISTRIBUTIONS = {
    PIPELINE_DISTRIBUTION: "PiPPy pipeline-parallel inference",
    SAGEMAKER_DISTRIBUTION: "SageMaker launching",
}
