"""Configuration: every object and source of a setting.

dataclasses.py      ProjectConfiguration, DataLoaderConfiguration, GradientAccumulationPlugin, TorchDynamoPlugin
kwargs_handlers.py  KwargsHandler and the handlers that pass non-default fields to torch
parallelism.py      ParallelismConfig: the parallel dimensions of a run
enums.py            DistributedType, PrecisionType and Accelerate's other enumerations
sources.py          where a setting comes from (script > environment > config file > default)
file.py             the launch config file: schema, Accelerate's format, reading and writing
environment_variables.py  patch_environment / clear_environment: the environment changed for a block
"""
