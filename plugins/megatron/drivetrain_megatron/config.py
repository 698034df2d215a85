"""``MegatronLMPlugin``: what a user tells the megatron backend, from code, launch flags, a config file or the
environment.

Sources, highest precedence first (resolved by the kernel, ``plugin_api.resolve_backend_config``): the object
passed as ``Accelerator(megatron_lm_plugin=...)``; what ``drivetrain launch`` hands over (its
``--megatron_lm_*`` flags and the config file's ``megatron_lm_config`` section, in
``DRIVETRAIN_BACKEND_CONFIG``); Accelerate's ``MEGATRON_LM_<FIELD>`` environment variables; the config file
named by ``DRIVETRAIN_CONFIG_FILE``; the default. Keys may carry Accelerate's ``megatron_lm_`` prefix. A field
set in two places must agree, or resolution fails naming both values.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import attrs

from drivetrain.plugin_api import ConfigurationError
from drivetrain.plugin_api.settings import BackendConfigReader, resolve_backend_config, to_bool

#: Accelerate's environment prefix (``MEGATRON_LM_TP_DEGREE=2``).
ENV_PREFIX = "MEGATRON_LM_"
#: Accelerate's key prefix in ``megatron_lm_config`` and on ``accelerate launch`` flags.
KEY_PREFIX = "megatron_lm_"


def _check_int(name: str, minimum: int) -> Callable[[Any], int | None]:
    def convert(value: Any) -> int | None:
        if value is None:
            return None
        text = str(value).strip()
        if isinstance(value, bool) or not text.lstrip("-").isdigit() or int(text) < minimum:
            raise ConfigurationError(
                f"MegatronLMPlugin.{name} must be an integer >= {minimum}, got {value!r}"
            )
        return int(text)

    return convert


def _check_float(name: str) -> Callable[[Any], float | None]:
    def convert(value: Any) -> float | None:
        if value is None:
            return None
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigurationError(f"MegatronLMPlugin.{name} must be a number, got {value!r}") from None
        if number < 0:
            raise ConfigurationError(f"MegatronLMPlugin.{name} must be >= 0, got {value!r}")
        return number

    return convert


def _check_bool(name: str) -> Callable[[Any], bool | None]:
    return lambda value: None if value is None else to_bool(value, f"MegatronLMPlugin.{name}")


def _check_choice(name: str, choices: tuple[str, ...]) -> Callable[[Any], str | None]:
    def convert(value: Any) -> str | None:
        if value is None:
            return None
        if str(value) not in choices:
            raise ConfigurationError(
                f"MegatronLMPlugin.{name}={value!r} is not valid; choose one of: {', '.join(choices)}"
            )
        return str(value)

    return convert


def _check_callable(name: str) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if value is not None and not callable(value):
            raise ConfigurationError(f"MegatronLMPlugin.{name} must be callable, got {value!r}")
        return value

    return convert


def _check_dict(name: str) -> Callable[[Any], dict | None]:
    def convert(value: Any) -> dict | None:
        if value is not None and not isinstance(value, dict):
            raise ConfigurationError(f"MegatronLMPlugin.{name} must be a dict, got {type(value).__name__}")
        return value

    return convert


def _consumed_samples(value: Any) -> list[int] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [item for item in value.split(",") if item.strip()]
    try:
        numbers = [int(item) for item in value]
    except (TypeError, ValueError):
        raise ConfigurationError(
            f"MegatronLMPlugin.consumed_samples must be a list of integers (train, valid, test), got {value!r}"
        ) from None
    return numbers


def _field(converter: Callable[[Any], Any], default: Any, help: str, environment: bool = True) -> Any:
    """A field whose ``None`` means "not set here"; ``default`` applies when no source sets it."""
    return attrs.field(
        default=None,
        converter=converter,
        metadata={"default": default, "help": help, "environment": environment},
    )


@attrs.define(slots=False)
class MegatronLMPlugin:
    """Tensor, pipeline and sequence parallelism on megatron-core (Accelerate's ``MegatronLMPlugin``).

    Fields left unset (``None``) take the value of the launch flags / config file / ``MEGATRON_LM_*``
    environment, else their default (listed in docs/megatron.md).
    """

    backend_name = "megatron"

    # parallel degrees
    tp_degree: int = _field(_check_int("tp_degree", 1), 1, "tensor parallelism degree")
    pp_degree: int = _field(_check_int("pp_degree", 1), 1, "pipeline parallelism degree")
    num_micro_batches: int = _field(
        _check_int("num_micro_batches", 1), 1, "micro-batches per step, run by megatron-core's schedule"
    )
    gradient_clipping: float = _field(
        _check_float("gradient_clipping"), 1.0, "clip gradients to this global L2 norm (0: off)"
    )
    sequence_parallelism: bool = _field(
        _check_bool("sequence_parallelism"), False, "shard activations along the sequence over the tp group"
    )
    recompute_activations: bool = _field(
        _check_bool("recompute_activations"), False, "selective activation recomputation"
    )
    use_distributed_optimizer: bool = _field(
        _check_bool("use_distributed_optimizer"), False, "shard optimizer state over the data-parallel group"
    )
    pipeline_model_parallel_split_rank: int | None = _field(
        _check_int("pipeline_model_parallel_split_rank", 0), None, "encoder/decoder split rank (T5)"
    )
    num_layers_per_virtual_pipeline_stage: int | None = _field(
        _check_int("num_layers_per_virtual_pipeline_stage", 1), None, "interleaved pipeline schedule"
    )
    context_parallel_size: int = _field(_check_int("context_parallel_size", 1), 1, "context parallelism")
    expert_model_parallel_size: int = _field(
        _check_int("expert_model_parallel_size", 1), 1, "expert model parallelism"
    )
    # batches and schedules
    is_train_batch_min: bool = _field(
        _check_bool("is_train_batch_min"), True, "with several train loaders, the smallest sets the steps"
    )
    train_iters: int | None = _field(_check_int("train_iters", 1), None, "total training steps")
    train_samples: int | None = _field(_check_int("train_samples", 1), None, "total training samples")
    weight_decay_incr_style: str = _field(
        _check_choice("weight_decay_incr_style", ("constant", "linear", "cosine")), "constant", "weight decay"
    )
    start_weight_decay: float | None = _field(
        _check_float("start_weight_decay"), None, "initial weight decay"
    )
    end_weight_decay: float | None = _field(_check_float("end_weight_decay"), None, "final weight decay")
    lr_decay_style: str = _field(
        _check_choice("lr_decay_style", ("constant", "linear", "cosine", "inverse-square-root", "WSD")),
        "linear",
        "learning-rate decay",
    )
    lr_decay_iters: int | None = _field(_check_int("lr_decay_iters", 1), None, "steps to decay over")
    lr_decay_samples: int | None = _field(_check_int("lr_decay_samples", 1), None, "samples to decay over")
    lr_warmup_iters: int | None = _field(_check_int("lr_warmup_iters", 0), None, "warm-up steps")
    lr_warmup_samples: int | None = _field(_check_int("lr_warmup_samples", 0), None, "warm-up samples")
    lr_warmup_fraction: float | None = _field(_check_float("lr_warmup_fraction"), None, "warm-up fraction")
    min_lr: float = _field(_check_float("min_lr"), 0.0, "smallest learning rate")
    consumed_samples: list[int] | None = _field(_consumed_samples, None, "samples already consumed")
    no_wd_decay_cond: Callable | None = _field(
        _check_callable("no_wd_decay_cond"), None, "(name, param) -> no weight decay", environment=False
    )
    scale_lr_cond: Callable | None = _field(
        _check_callable("scale_lr_cond"), None, "(name, param) -> scale the lr by lr_mult", environment=False
    )
    lr_mult: float = _field(_check_float("lr_mult"), 1.0, "learning-rate multiplier for scale_lr_cond")
    # data and evaluation
    megatron_dataset_flag: bool = _field(
        _check_bool("megatron_dataset_flag"), False, "the data loader is a MegatronLMDummyDataLoader"
    )
    seq_length: int | None = _field(_check_int("seq_length", 1), None, "sequence length")
    encoder_seq_length: int | None = _field(_check_int("encoder_seq_length", 1), None, "encoder length")
    decoder_seq_length: int | None = _field(_check_int("decoder_seq_length", 1), None, "decoder length")
    tensorboard_dir: str | None = _field(lambda value: value, None, "tensorboard folder")
    set_all_logging_options: bool = _field(_check_bool("set_all_logging_options"), False, "log everything")
    eval_iters: int = _field(_check_int("eval_iters", 0), 100, "evaluation steps")
    eval_interval: int = _field(_check_int("eval_interval", 1), 1000, "steps between evaluations")
    return_logits: bool = _field(_check_bool("return_logits"), False, "GPT: return logits with the loss")
    no_save_optim: bool = _field(_check_bool("no_save_optim"), False, "save_state skips optimizer state")
    no_load_optim: bool = _field(_check_bool("no_load_optim"), False, "load_state skips optimizer state")
    # hooks
    custom_train_step_class: Any = _field(lambda value: value, None, "AbstractTrainStep subclass", False)
    custom_train_step_kwargs: dict | None = _field(
        _check_dict("custom_train_step_kwargs"), None, "keyword arguments of the train step", False
    )
    custom_model_provider_function: Callable | None = _field(
        _check_callable("custom_model_provider_function"), None, "builds the model", False
    )
    custom_prepare_model_function: Callable | None = _field(
        _check_callable("custom_prepare_model_function"), None, "prepares the model", False
    )
    custom_megatron_datasets_provider_function: Callable | None = _field(
        _check_callable("custom_megatron_datasets_provider_function"), None, "builds datasets", False
    )
    custom_get_batch_function: Callable | None = _field(
        _check_callable("custom_get_batch_function"), None, "data iterator -> batch", False
    )
    custom_loss_function: Callable | None = _field(
        _check_callable("custom_loss_function"), None, "loss of a micro-batch", False
    )
    other_megatron_args: dict | None = _field(
        _check_dict("other_megatron_args"), None, "further megatron arguments", False
    )

    def __attrs_post_init__(self) -> None:
        # Filled when data loaders are prepared: micro-batch size x micro-batches x data-parallel size.
        self.micro_batch_size: int | None = None
        self.global_batch_size: int | None = None
        self.megatron_lm_default_args: dict[str, Any] = {}

    def resolved(self) -> MegatronLMPlugin:
        """A copy with every unset field taken from the launch flags / config file / environment, else its
        default (see :func:`resolve_config`)."""
        return resolve_config(attrs.evolve(self))

    def check(self) -> None:
        """Combinations that cannot run, with what would."""
        if self.sequence_parallelism and self.tp_degree == 1:
            raise ConfigurationError(
                "MegatronLMPlugin.sequence_parallelism=True needs tp_degree > 1 (it shards activations over the "
                "tensor-parallel group)"
            )
        if self.context_parallel_size != 1 or self.expert_model_parallel_size != 1:
            raise ConfigurationError(
                "MegatronLMPlugin: context_parallel_size and expert_model_parallel_size must be 1; "
                "drivetrain-megatron runs tensor, pipeline, sequence and data parallelism"
            )

    def model_parallel_config(self, **overrides: Any) -> Any:
        """megatron-core's ``ModelParallelConfig`` for building layers of this run (tensor/pipeline degrees,
        sequence parallelism, CPU initialisation when there is no CUDA); ``overrides`` set other fields. Pass
        ``num_layers``/``hidden_size``/``num_attention_heads`` to get a ``TransformerConfig`` instead."""
        import torch
        from megatron.core.model_parallel_config import ModelParallelConfig

        values: dict[str, Any] = {
            "tensor_model_parallel_size": self.tp_degree,
            "pipeline_model_parallel_size": self.pp_degree,
            "sequence_parallel": self.sequence_parallelism,
            "use_cpu_initialization": not torch.cuda.is_available(),
            "pipeline_dtype": torch.float32 if self.pp_degree > 1 else None,
        }
        values.update(overrides)
        if "hidden_size" in values:
            from megatron.core.transformer import TransformerConfig

            if self.recompute_activations:
                values.setdefault("recompute_granularity", "selective")
            return TransformerConfig(**values)
        return ModelParallelConfig(**values)

    @property
    def data_parallel_size(self) -> int:
        """Processes / (tp_degree x pp_degree), once the process group is set up."""
        from megatron.core import parallel_state

        return parallel_state.get_data_parallel_world_size()


def _field_name(key: str) -> str:
    name = key.removeprefix("--").removeprefix(KEY_PREFIX)
    known = {field.name for field in attrs.fields(MegatronLMPlugin)}
    if name not in known:
        raise ConfigurationError(
            f"unknown megatron setting {key!r}; valid: {', '.join(sorted(KEY_PREFIX + item for item in known))}"
        )
    return name


def script_settings(config: MegatronLMPlugin) -> dict[str, Any]:
    """The fields the script set on ``config`` (those not None; once resolved, what they were before)."""
    recorded = getattr(config, "_script_fields", None)
    if recorded is not None:
        return dict(recorded)
    return {
        field.name: getattr(config, field.name)
        for field in attrs.fields(MegatronLMPlugin)
        if getattr(config, field.name) is not None
    }


def parse_settings(raw: dict[str, Any], origin: str) -> dict[str, Any]:
    """Settings from ``drivetrain launch`` / the config file (``megatron_lm_config``) or a ``MEGATRON_LM_*``
    variable, as the plugin holds them."""
    fields = attrs.fields_dict(MegatronLMPlugin)
    settings = {}
    for key, value in raw.items():
        if value is not None:
            name = _field_name(str(key))
            convert: Any = fields[name].converter
            settings[name] = convert(value)
    return settings


def variables() -> list[tuple[str, dict[str, Any]]]:
    """Accelerate's ``MEGATRON_LM_<FIELD>`` variables that are set, one source each."""
    found = []
    for field in attrs.fields(MegatronLMPlugin):
        variable = ENV_PREFIX + field.name.upper()
        if field.metadata["environment"] and os.environ.get(variable):
            found.append((f"environment variable {variable}", {field.name: os.environ[variable]}))
    return found


def build(given: MegatronLMPlugin | None, settings: dict[str, Any]) -> MegatronLMPlugin:
    """Every field: the script's, else ``settings``, else the default. The script keeps its object, filled in
    (Accelerate's scripts set fields on ``accelerator.state.megatron_lm_plugin``)."""
    values = {**(script_settings(given) if given is not None else {}), **settings}
    config = MegatronLMPlugin(
        **{
            field.name: values[field.name]
            if values.get(field.name) is not None
            else field.metadata["default"]
            for field in attrs.fields(MegatronLMPlugin)
        }
    )
    config.check()
    if given is None:
        return config
    # what the script set, kept for script_settings: filling in the fields below hides it
    setattr(given, "_script_fields", script_settings(given))  # noqa: B010 (an attribute of ours, not a field)
    for field in attrs.fields(MegatronLMPlugin):
        setattr(given, field.name, getattr(config, field.name))
    return given


#: How the kernel reads this backend's configuration (``plugin_api.resolve_backend_config``).
READER = BackendConfigReader(MegatronLMPlugin, script_settings, parse_settings, build, variables)


def resolve_config(given: Any) -> MegatronLMPlugin:
    """The script's MegatronLMPlugin with unset fields from launch flags / config file / environment, else
    their defaults; resolved once per run by the kernel (the process groups, the Accelerator and its
    checkpoints share it)."""
    return resolve_backend_config(READER, given)
