"""An Accelerator's settings, resolved before anything starts: its arguments checked against each other and
completed from the environment and the config file (see :mod:`drivetrain.config.sources`), into one frozen
:class:`AcceleratorSettings` that the facade reads. Building one starts no process group and loads no plugin,
so every rule here is testable on its own.

The process-wide settings (backend, precision, CPU) are resolved by the process state from the values kept
here, since a ``PartialState`` built without an Accelerator resolves them the same way.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from drivetrain.compat.paths import BACKEND_CONFIG_KWARGS
from drivetrain.config import sources
from drivetrain.config.dataclasses import (
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    ProjectConfiguration,
    TorchDynamoPlugin,
)
from drivetrain.config.enums import RNGType
from drivetrain.config.kwargs_handlers import InitProcessGroupKwargs, KwargsHandler
from drivetrain.config.parallelism import ParallelismConfig
from drivetrain.errors import ConfigurationError


class BackendConfigGroup(dict):
    """Several configurations of one backend, keyed by the user's names (``deepspeed_plugins={...}``); the
    backend chooses the active one."""

    def __init__(self, configs: dict[str, Any], backend_name: str) -> None:
        super().__init__(configs)
        self.backend_name = backend_name


@dataclasses.dataclass(frozen=True)
class AcceleratorSettings:
    """What an ``Accelerator(...)`` call asks for, checked and completed. The configuration objects inside
    (``dataloader_config``, ``project_configuration``, ...) are the user's own, which scripts keep changing."""

    device_placement: bool
    #: the script's backend name, or None (the state decides with the environment and the config file)
    backend: str | None
    #: the script's backend configuration object (or :class:`BackendConfigGroup`), or None
    backend_config: Any
    #: the script's ParallelismConfig (``torch_tp_plugin`` folded in), or None
    parallelism_config: ParallelismConfig | None
    #: the feature plugins the script named, in its order
    feature_plugins: tuple[str, ...]
    #: the script's precision, or None (the state resolves it with the environment and the config file)
    mixed_precision: str | None
    cpu: bool
    kwargs_handlers: tuple[KwargsHandler, ...]
    dynamo_plugin: TorchDynamoPlugin
    gradient_accumulation_plugin: GradientAccumulationPlugin
    dataloader_config: DataLoaderConfiguration
    project_configuration: ProjectConfiguration
    rng_types: tuple[str, ...]
    step_scheduler_with_optimizer: bool
    log_with: Any

    @classmethod
    def resolve(
        cls,
        device_placement: bool = True,
        split_batches: bool | None = None,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int = 1,
        cpu: bool = False,
        dataloader_config: DataLoaderConfiguration | None = None,
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        torch_tp_plugin: Any = None,
        megatron_lm_plugin: Any = None,
        rng_types: list[str | RNGType] | None = None,
        log_with: Any = None,
        project_dir: str | None = None,
        project_config: ProjectConfiguration | None = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: list[KwargsHandler] | None = None,
        dynamo_backend: str | None = None,
        dynamo_plugin: TorchDynamoPlugin | None = None,
        deepspeed_plugins: Any = None,
        parallelism_config: Any = None,
        backend: str | None = None,
        backend_config: Any = None,
        plugins: list[str] | tuple[str, ...] = (),
    ) -> AcceleratorSettings:
        """The settings of ``Accelerator(**arguments)`` (the same arguments, the same defaults)."""
        named_configs = dict(zip(BACKEND_CONFIG_KWARGS, (deepspeed_plugin, fsdp_plugin, megatron_lm_plugin)))
        return cls(
            device_placement=device_placement,
            backend=backend,
            backend_config=_backend_config_from(backend_config, named_configs, deepspeed_plugins),
            parallelism_config=_parallelism_config_from(parallelism_config, torch_tp_plugin),
            feature_plugins=tuple(plugins),
            mixed_precision=mixed_precision,
            cpu=cpu,
            kwargs_handlers=_checked_kwargs_handlers(kwargs_handlers or []),
            dynamo_plugin=_dynamo_plugin(dynamo_backend, dynamo_plugin),
            gradient_accumulation_plugin=_accumulation(
                gradient_accumulation_steps, gradient_accumulation_plugin
            ),
            dataloader_config=_dataloader_config(dataloader_config, split_batches),
            project_configuration=_project_configuration(project_config, project_dir),
            rng_types=_checked_rng_types(rng_types),
            step_scheduler_with_optimizer=step_scheduler_with_optimizer,
            log_with=log_with,
        )

    def handler(self, handler_class: type) -> Any:
        """The script's kwargs handler of ``handler_class`` (or a subclass), or None."""
        return next((handler for handler in self.kwargs_handlers if isinstance(handler, handler_class)), None)

    @property
    def init_kwargs(self) -> dict[str, Any]:
        """``init_process_group``'s arguments from the script's ``InitProcessGroupKwargs`` (only those set)."""
        handler = self.handler(InitProcessGroupKwargs)
        return handler.to_kwargs() if handler else {}


def _backend_config_from(backend_config: Any, named: dict[str, Any], deepspeed_plugins: Any) -> Any:
    """Merge ``backend_config`` with its Accelerate-style aliases; more than one is an error."""
    given = {name: value for name, value in named.items() if value is not None}
    if deepspeed_plugins is not None:
        given["deepspeed_plugins"] = deepspeed_plugins
    if backend_config is not None:
        given["backend_config"] = backend_config
    if len(given) > 1:
        raise ConfigurationError(
            f"several backend configurations were passed ({', '.join(given)}); an Accelerator runs one "
            "distribution backend, pass only one"
        )
    if not given:
        return None
    config = next(iter(given.values()))
    if isinstance(config, dict):
        # A dict of configurations of one backend (several DeepSpeed models): the backend handles selection.
        backends = {getattr(value, "backend_name", None) for value in config.values()}
        if len(backends) != 1 or None in backends:
            raise ConfigurationError(
                "a dict of backend configurations must hold configurations of one backend"
            )
        return BackendConfigGroup(config, str(backends.pop()))
    return config


def _parallelism_config_from(config: ParallelismConfig | None, tp_plugin: Any) -> ParallelismConfig | None:
    """The script's ParallelismConfig; Accelerate's deprecated ``torch_tp_plugin`` becomes one with its
    ``tp_size``. None lets the state build one from launch flags / the config file, if they set any."""
    if tp_plugin is None:
        return config
    warnings.warn(
        "torch_tp_plugin (TorchTensorParallelPlugin) is deprecated: pass "
        "parallelism_config=ParallelismConfig(tp_size=...) instead",
        FutureWarning,
        stacklevel=5,  # the script's Accelerator(...) call
    )
    if config is not None:
        if config.tp_size != tp_plugin.tp_size:
            raise ConfigurationError(
                f"torch_tp_plugin asks for tp_size={tp_plugin.tp_size} but parallelism_config has "
                f"tp_size={config.tp_size}; pass only parallelism_config"
            )
        return config
    return ParallelismConfig(tp_size=tp_plugin.tp_size)


def _checked_kwargs_handlers(handlers: list[Any]) -> tuple[KwargsHandler, ...]:
    seen: set[type] = set()
    for handler in handlers:
        if not isinstance(handler, KwargsHandler):
            raise ConfigurationError(
                f"kwargs_handlers accepts KwargsHandler objects (e.g. GradScalerKwargs), got {type(handler).__name__}"
            )
        if type(handler) in seen:
            raise ConfigurationError(f"kwargs_handlers holds two {type(handler).__name__}; pass one")
        seen.add(type(handler))
    return tuple(handlers)


def _dynamo_plugin(dynamo_backend: str | None, dynamo_plugin: TorchDynamoPlugin | None) -> TorchDynamoPlugin:
    if dynamo_plugin is not None and dynamo_backend is not None:
        raise ConfigurationError("pass either dynamo_backend or dynamo_plugin, not both")
    if dynamo_plugin is not None:
        return dynamo_plugin
    setting = sources.resolve("dynamo_backend", dynamo_backend, default="no", convert=_dynamo_name)
    return TorchDynamoPlugin(backend=setting.value)


def _dynamo_name(value: Any) -> str:
    """A torch.compile backend name as the settings compare it (``"INDUCTOR"`` and ``"inductor"`` agree)."""
    return str(getattr(value, "value", value)).strip().lower()


def _accumulation(steps: int, plugin: GradientAccumulationPlugin | None) -> GradientAccumulationPlugin:
    if plugin is not None:
        if steps != 1:
            raise ConfigurationError(
                "pass gradient_accumulation_steps either to the Accelerator or inside the "
                "GradientAccumulationPlugin, not both"
            )
    else:
        resolved = sources.resolve(
            "gradient_accumulation_steps",
            steps if steps != 1 else None,  # 1 is the default: it states no choice
            default=1,
            convert=sources.to_int,
        ).value
        if resolved < 1:
            raise ConfigurationError(f"gradient_accumulation_steps must be >= 1, got {resolved}")
        plugin = GradientAccumulationPlugin(num_steps=resolved)
    if plugin.num_steps is None:
        plugin.num_steps = 1
    return plugin


def _dataloader_config(
    config: DataLoaderConfiguration | None, split_batches: bool | None
) -> DataLoaderConfiguration:
    if config is None:
        config = DataLoaderConfiguration()
    if split_batches is not None:
        if split_batches != config.split_batches and config.split_batches:
            raise ConfigurationError(
                "split_batches was passed both to the Accelerator and in dataloader_config with other values"
            )
        config.split_batches = split_batches
    return config


def _project_configuration(
    config: ProjectConfiguration | None, project_dir: str | None
) -> ProjectConfiguration:
    if config is None:
        return ProjectConfiguration(project_dir=project_dir)
    if project_dir is not None:
        config.set_directories(project_dir)
    return config


def _checked_rng_types(rng_types: list[Any] | None) -> tuple[str, ...]:
    if rng_types is None:
        return (RNGType.GENERATOR.value,)
    checked = []
    for rng_type in rng_types:
        try:
            checked.append(RNGType(str(rng_type)).value)
        except ValueError:
            raise ConfigurationError(
                f"rng_types entry {rng_type!r} is not valid; choose from: {', '.join(RNGType.list())}"
            ) from None
    return tuple(checked)
