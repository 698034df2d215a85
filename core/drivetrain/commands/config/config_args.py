"""Accelerate's ``accelerate.commands.config.config_args``: the config file as dataclasses
(:class:`BaseConfig`, :class:`ClusterConfig`, :class:`SageMakerConfig`), read from and written to YAML or JSON
with Accelerate's keys. ``drivetrain launch`` reads the same files (:mod:`drivetrain.config.file`); the default
file is drivetrain's (``drivetrain config`` writes it)."""

from __future__ import annotations

import dataclasses
import enum
import json
import os
from typing import Any

from drivetrain.compat import cli_options
from drivetrain.config.enums import ComputeEnvironment, DistributedType, SageMakerDistributedType
from drivetrain.config.file import default_config_path

#: Accelerate's cache folders (``$HF_HOME``, else ``$XDG_CACHE_HOME/huggingface``), for scripts that read them.
hf_cache_home = os.path.expanduser(
    os.environ.get("HF_HOME", os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"))
)
cache_dir = os.path.join(hf_cache_home, "accelerate")
#: The file ``drivetrain config`` writes and ``drivetrain launch`` reads by default.
default_config_file = str(default_config_path())
default_yaml_config_file = default_config_file
default_json_config_file = default_config_file


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()} or None
    return value


@dataclasses.dataclass
class BaseConfig:
    """What every config file holds; subclasses add their keys. Unknown keys are refused when reading."""

    compute_environment: ComputeEnvironment
    distributed_type: DistributedType | SageMakerDistributedType
    mixed_precision: str
    use_cpu: bool
    debug: bool

    def to_dict(self) -> dict[str, Any]:
        """The keys as written to a file: enums as their values, empty sections and None values left out."""
        return {
            key: value
            for key, value in ((key, _plain(value)) for key, value in vars(self).items())
            if value is not None
        }

    @staticmethod
    def process_config(config_dict: dict[str, Any]) -> dict[str, Any]:
        """Fill in the keys older files lack and convert their old spellings (``fp16: true``,
        ``dynamo_backend``); a file without ``distributed_type`` is refused."""
        config_dict.setdefault("compute_environment", ComputeEnvironment.LOCAL_MACHINE)
        if "distributed_type" not in config_dict:
            raise ValueError("A `distributed_type` must be specified in the config file.")
        if "num_processes" not in config_dict and config_dict["distributed_type"] == DistributedType.NO:
            config_dict["num_processes"] = 1
        if "mixed_precision" not in config_dict:
            config_dict["mixed_precision"] = "fp16" if config_dict.get("fp16") else None
        config_dict.pop("fp16", None)
        if "dynamo_backend" in config_dict:
            backend = config_dict.pop("dynamo_backend")
            config_dict["dynamo_config"] = {} if backend == "NO" else {"dynamo_backend": backend}
        config_dict.setdefault("use_cpu", False)
        config_dict.setdefault("debug", False)
        config_dict.setdefault("enable_cpu_affinity", False)
        return config_dict

    @classmethod
    def _from_dict(cls, config_dict: dict[str, Any], path: str) -> BaseConfig:
        config_dict = cls.process_config(config_dict)
        unknown = sorted(set(config_dict) - {field.name for field in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(
                f"The config file at {path} had unknown keys ({unknown}), please try upgrading your `accelerate`"
                " version or fix (and potentially remove) these keys from your config file."
            )
        return cls(**config_dict)

    @classmethod
    def from_json_file(cls, json_file: str | None = None) -> BaseConfig:
        path = json_file or default_json_config_file
        with open(path, encoding="utf-8") as handle:
            return cls._from_dict(json.load(handle), path)

    def to_json_file(self, json_file: str) -> None:
        with open(json_file, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_yaml_file(cls, yaml_file: str | None = None) -> BaseConfig:
        from drivetrain.config.bounded_yaml import load_mapping

        path = yaml_file or default_yaml_config_file
        return cls._from_dict(load_mapping(path, f"config file {path}"), path)

    def to_yaml_file(self, yaml_file: str) -> None:
        import yaml

        with open(yaml_file, "w", encoding="utf-8") as handle:
            yaml.safe_dump(self.to_dict(), handle)

    def __post_init__(self) -> None:
        if isinstance(self.compute_environment, str):
            self.compute_environment = ComputeEnvironment(self.compute_environment)
        if isinstance(self.distributed_type, str):
            if self.compute_environment == ComputeEnvironment.AMAZON_SAGEMAKER:
                self.distributed_type = SageMakerDistributedType(self.distributed_type)
            else:
                self.distributed_type = DistributedType(self.distributed_type)
        if getattr(self, "dynamo_config", None) is None:
            self.dynamo_config = {}


def _cluster_post_init(self: Any) -> None:
    for name, default in cli_options.ACCELERATE_CLUSTER_CONFIG_FIELDS:
        if default is dict and getattr(self, name) is None:
            setattr(self, name, {})
    BaseConfig.__post_init__(self)


#: A machine (or cluster of machines) of the local kind: processes, machines, rendezvous, and the sections
#: backends read (Accelerate's field names and defaults).
ClusterConfig = dataclasses.make_dataclass(
    "ClusterConfig",
    [
        (name, Any, dataclasses.field(default=None if default in (dict, list) else default))
        for name, default in cli_options.ACCELERATE_CLUSTER_CONFIG_FIELDS
    ],
    bases=(BaseConfig,),
    namespace={"__post_init__": _cluster_post_init, "__module__": __name__},
)


@dataclasses.dataclass
class SageMakerConfig(BaseConfig):
    """A run on Amazon SageMaker (launching there needs a SageMaker plugin; the file is read and written)."""

    ec2_instance_type: str
    iam_role_name: str
    image_uri: str | None = None
    profile: str | None = None
    region: str = "us-east-1"
    num_machines: int = 1
    gpu_ids: str = "all"
    base_job_name: str = "accelerate-sagemaker-1"
    pytorch_version: str = "1.10.2"
    transformers_version: str = "4.17.0"
    py_version: str = "py38"
    sagemaker_inputs_file: str | None = None
    sagemaker_metrics_file: str | None = None
    additional_args: dict | None = None
    dynamo_config: dict | None = None
    enable_cpu_affinity: bool = False


def load_config_from_file(config_file: str | None) -> BaseConfig:
    """The config file (the default one when None) as a :class:`ClusterConfig`, or a :class:`SageMakerConfig`
    for a SageMaker file; a ``.json`` name is read as JSON, anything else as YAML."""
    if config_file is not None and not os.path.isfile(config_file):
        raise FileNotFoundError(
            f"The passed configuration file `{config_file}` does not exist. Please pass an existing file to "
            "`drivetrain launch`, or use the default one created through `drivetrain config` and run "
            "`drivetrain launch` without the `--config_file` argument."
        )
    path = str(config_file or default_config_file)
    if path.endswith(".json"):
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    else:
        from drivetrain.config.bounded_yaml import load_mapping

        data = load_mapping(path, f"config file {path}")
    local = (
        data.get("compute_environment", ComputeEnvironment.LOCAL_MACHINE) == ComputeEnvironment.LOCAL_MACHINE
    )
    config_class = ClusterConfig if local else SageMakerConfig
    return config_class.from_json_file(path) if path.endswith(".json") else config_class.from_yaml_file(path)


__all__ = [
    "BaseConfig",
    "ClusterConfig",
    "SageMakerConfig",
    "cache_dir",
    "default_config_file",
    "default_json_config_file",
    "default_yaml_config_file",
    "hf_cache_home",
    "load_config_from_file",
]
