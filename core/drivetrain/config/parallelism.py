"""``ParallelismConfig``: how many ways the processes of a run split data, parameters and sequences.

One named ``DeviceMesh`` describes the layout. Its dimensions, outermost first:

* ``dp_replicate``: data parallel, every group holds a full copy of the model (gradients all-reduced);
* ``dp_shard``: data parallel, parameters, gradients and optimizer state sharded (FSDP);
* ``cp``: context parallel, each rank holds a slice of every sequence;
* ``sp``: sequence parallel of a backend that runs its own groups (Accelerate's ALST/Ulysses);
* ``tp``: tensor parallel, each rank holds a slice of the weight matrices.

Data is split over the data-parallel dimensions only: the ranks of one ``cp``/``sp``/``tp`` group see the
same batches. The backend builds the mesh in ``setup_process_group`` (:meth:`build_device_mesh`); a backend
that cannot do a dimension says so, naming it (``Capabilities.mesh_dimensions``).

Every size may come from the constructor, the environment (``DRIVETRAIN_PARALLELISM_CONFIG_TP_SIZE``, or
Accelerate's ``PARALLELISM_CONFIG_TP_SIZE``) or the config file's ``parallelism_config`` section; two sources
that set different values are an error naming both. Names and behaviour are Accelerate's
(``accelerate.parallelism_config.ParallelismConfig``); docs/nd-parallelism.md says where they differ.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from drivetrain.config import sources
from drivetrain.errors import ConfigurationError

#: Mesh dimensions, outermost first (the order torch's device mesh lays out ranks in: ``tp`` innermost, so
#: the ranks of one tensor-parallel group are neighbours).
MESH_DIMENSIONS = ("dp_replicate", "dp_shard", "cp", "sp", "tp")
#: The dimensions over which data is split.
DATA_PARALLEL_DIMENSIONS = ("dp_replicate", "dp_shard")
CONTEXT_PARALLEL_BACKENDS = ("torch",)
#: ``sp_backend``'s default: a fact of Accelerate's API (its ``ParallelismConfig`` dataclass defaults to it), so
#: it stays a constant, valid whether or not a plugin running it is installed. The other valid values are those
#: the installed backends declare (``PluginInfo.sp_backend``).
ACCELERATE_SP_BACKEND = "deepspeed"
CP_COMM_STRATEGIES = ("allgather", "alltoall")
#: Environment prefixes: drivetrain's (what ``drivetrain launch`` exports) and Accelerate's launcher's.
ENV_PREFIX = "DRIVETRAIN_PARALLELISM_CONFIG_"
ACCELERATE_ENV_PREFIX = "PARALLELISM_CONFIG_"
#: Set by Accelerate's launcher when it exported a parallelism config; drivetrain's equivalent.
USE_ENV = ("DRIVETRAIN_USE_PARALLELISM_CONFIG", "ACCELERATE_USE_PARALLELISM_CONFIG")
#: The config file's section (keys with or without Accelerate's ``parallelism_config_`` prefix).
FILE_SECTION = "parallelism_config"
SIZE_FIELDS = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size")
#: Settings read from the environment and the config file: field -> converter of the raw value.
SETTINGS = (*SIZE_FIELDS, "cp_backend", "sp_backend")


def _size_value(name: str, value: Any) -> int:
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) < 1:
        raise ConfigurationError(f"ParallelismConfig.{name} must be a whole number >= 1, got {value!r}")
    return int(text)


def _choice_value(name: str, value: Any, choices: tuple[str, ...]) -> str:
    text = str(value).strip().lower()
    if text not in choices:
        raise ConfigurationError(
            # starts with Accelerate's wording ("Invalid cp_comm_strategy: x"), which its users match on
            f"Invalid {name}: {value}. ParallelismConfig.{name}={value!r} is not valid; choose one of: "
            f"{', '.join(choices)}"
        )
    return text


#: The installed backends' ``sp_backend`` values, registered by ``drivetrain.contract.registry`` (this layer sits
#: below the plugin registry and cannot ask it itself).
_declared_sp_backends: Callable[[], Iterable[str]] | None = None


def use_declared_sp_backends(declared: Callable[[], Iterable[str]]) -> None:
    """Make ``declared()`` the source of the ``sp_backend`` values the installed backends declare."""
    global _declared_sp_backends
    _declared_sp_backends = declared


def sequence_parallel_backends() -> tuple[str, ...]:
    """The valid ``sp_backend`` values: Accelerate's default first, then what the installed backends declare
    (imports every plugin module)."""
    declared = tuple(_declared_sp_backends()) if _declared_sp_backends is not None else ()
    return tuple(dict.fromkeys((ACCELERATE_SP_BACKEND, *declared)))


def _sp_backend_value(value: Any) -> str:
    # The default needs no plugin, and asking the registry would import every plugin module.
    if str(value).strip().lower() == ACCELERATE_SP_BACKEND:
        return ACCELERATE_SP_BACKEND
    return _choice_value("sp_backend", value, sequence_parallel_backends())


def _convert(name: str, value: Any) -> Any:
    if name == "cp_comm_strategy":
        return _choice_value(name, value, CP_COMM_STRATEGIES)
    if name == "cp_backend":
        return _choice_value(name, value, CONTEXT_PARALLEL_BACKENDS)
    if name == "sp_backend":
        return _sp_backend_value(value)
    return _size_value(name, value)


def _file_section() -> tuple[str | None, dict[str, Any]]:
    """The ``parallelism_config`` section of the config file named by DRIVETRAIN_CONFIG_FILE, keys without
    Accelerate's ``parallelism_config_`` prefix."""
    path, values = sources.config_file_values()
    section = values.get(FILE_SECTION)
    if not section:
        return path, {}
    if not isinstance(section, dict):
        raise ConfigurationError(
            f"config file {path}: {FILE_SECTION} must be a mapping of settings, not {type(section).__name__}"
        )
    return path, {str(key).removeprefix("parallelism_config_"): value for key, value in section.items()}


def environment_settings() -> dict[str, sources.Setting]:
    """Every parallelism setting the environment and the config file set, by field name. Two sources that
    disagree are an error naming both."""
    found: dict[str, sources.Setting] = {}
    path, section = _file_section()
    for name in (*SETTINGS, "cp_comm_strategy"):
        candidates = []
        for prefix in (ENV_PREFIX, ACCELERATE_ENV_PREFIX):
            variable = prefix + name.upper()
            if os.environ.get(variable, "") not in ("", "None"):
                candidates.append(
                    sources.Setting(os.environ[variable], f"environment {variable}={os.environ[variable]}")
                )
        if section.get(name) is not None:
            candidates.append(
                sources.Setting(
                    section[name], f"config file {path} ({FILE_SECTION}: {name}: {section[name]})"
                )
            )
        if not candidates:
            continue
        first = candidates[0]
        first_value = _convert(name, first.value)
        for other in candidates[1:]:
            if _convert(name, other.value) != first_value:
                raise ConfigurationError(
                    f"conflicting ParallelismConfig.{name}: {first.source} but {other.source}; remove one of them "
                    "or make them agree"
                )
        found[name] = sources.Setting(first_value, first.source)
    unknown = sorted(set(section) - {*SETTINGS, "cp_comm_strategy"})
    if unknown:
        raise ConfigurationError(
            f"config file {path}: {FILE_SECTION} has unknown key(s) {', '.join(unknown)}; valid keys: "
            f"{', '.join((*SETTINGS, 'cp_comm_strategy'))} (optionally prefixed with parallelism_config_)"
        )
    return found


def check_section(value: Any) -> dict[str, Any]:
    """A config file's ``parallelism_config`` section, checked: keys without Accelerate's
    ``parallelism_config_`` prefix, values normalised. Raises ValueError saying what is valid."""
    if not isinstance(value, dict):
        raise ValueError("expected a mapping (key: value lines)")
    checked: dict[str, Any] = {}
    for key, item in value.items():
        name = str(key).removeprefix("parallelism_config_")
        if name not in (*SETTINGS, "cp_comm_strategy"):
            raise ValueError(
                f"unknown key {key!r}; valid keys: {', '.join((*SETTINGS, 'cp_comm_strategy'))} (optionally "
                "prefixed with parallelism_config_)"
            )
        if item is None:
            continue
        try:
            checked[name] = _convert(name, item)
        except ConfigurationError as exc:
            raise ValueError(str(exc)) from None
    return checked


def section_product(section: dict[str, Any]) -> int:
    """The number of processes a checked ``parallelism_config`` section asks for (its sizes multiplied)."""
    total = 1
    for name in SIZE_FIELDS:
        total *= int(section.get(name, 1))
    return total


# -- the handlers of the tensor- and context-parallel dimensions ----------------------------------------------
@dataclasses.dataclass
class TorchTensorParallelConfig:
    """Options of the tensor-parallel dimension (``ParallelismConfig(tp_handler=...)``).

    ``tp_plan`` (drivetrain's addition) is the plan handed to ``torch.distributed.tensor.parallel.
    parallelize_module``: module name (``*`` matches one level, ``"blocks.*.up"``) -> a ``ParallelStyle`` or
    a style name (``"colwise"``, ``"rowwise"``, ``"colwise_rep"``, ``"rowwise_rep"``, ``"replicate"``,
    ``"sequence_parallel"``). Without it the backend uses the model's own plan (a transformers model's
    ``tp_plan``), or accepts a model whose parameters are already tensor-parallel ``DTensor`` objects.
    """

    #: Accelerate's field; asynchronous tensor parallelism is not implemented (a warning says so), as there.
    enable_async_tp: bool = False
    tp_plan: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.enable_async_tp:
            warnings.warn(
                "TorchTensorParallelConfig.enable_async_tp is not supported; it is ignored",
                UserWarning,
                stacklevel=3,
            )
        if self.tp_plan is not None and not isinstance(self.tp_plan, dict):
            raise ConfigurationError(
                "TorchTensorParallelConfig.tp_plan must be a dict of module name -> ParallelStyle or style name, "
                f"got {type(self.tp_plan).__name__}"
            )


@dataclasses.dataclass
class TorchContextParallelConfig:
    """Options of the context-parallel dimension (``ParallelismConfig(cp_handler=...)``): how ranks exchange
    keys and values in ring attention. ``None`` reads ``PARALLELISM_CONFIG_CP_COMM_STRATEGY``, else
    ``"allgather"``."""

    cp_comm_strategy: str | None = None

    def __post_init__(self) -> None:
        if self.cp_comm_strategy is None:
            setting = environment_settings().get("cp_comm_strategy")
            self.cp_comm_strategy = setting.value if setting else "allgather"
        self.cp_comm_strategy = _choice_value("cp_comm_strategy", self.cp_comm_strategy, CP_COMM_STRATEGIES)


@dataclasses.dataclass
class TorchTensorParallelPlugin:
    """Accelerate's deprecated ``Accelerator(torch_tp_plugin=...)``: becomes ``ParallelismConfig(tp_size=...)``."""

    tp_size: int = 1
    torch_device_mesh: Any = None


# -- the configuration -----------------------------------------------------------------------------------------
@dataclasses.dataclass(repr=False)
class ParallelismConfig:
    """Sizes of the parallel dimensions of a run (see the module docstring). ``None`` reads the environment
    and the config file, else 1; after construction every size is a whole number. Their product must equal
    the number of processes; when every size is 1 in a run of several processes, the backend's first
    data-parallel dimension takes them all (``dp_replicate`` with ddp, ``dp_shard`` with fsdp)."""

    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    tp_size: int | None = None
    cp_size: int | None = None
    cp_backend: str | None = None
    sp_size: int | None = None
    sp_backend: str | None = None
    #: options of the tensor-, context- and sequence-parallel dimensions (handler objects)
    tp_handler: Any = None
    cp_handler: Any = None
    sp_handler: Any = None
    #: the mesh, once the backend built it (``get_device_mesh``)
    device_mesh: Any = dataclasses.field(default=None, init=False)

    def __post_init__(self) -> None:
        found = environment_settings()
        for name in SETTINGS:
            given = getattr(self, name)
            setting = found.get(name)
            if given is not None:
                value = _convert(name, given)
                if setting is not None and setting.value != value:
                    raise ConfigurationError(
                        f"conflicting ParallelismConfig.{name}: ParallelismConfig({name}={given!r}) in the script "
                        f"but {setting.source}; remove one of them or make them agree"
                    )
            elif setting is not None:
                value = setting.value
            else:
                value = {"cp_backend": "torch", "sp_backend": ACCELERATE_SP_BACKEND}.get(name, 1)
            setattr(self, name, value)
        # every size is a whole number from here on (the loop above filled the Nones)
        assert self.tp_size is not None and self.cp_size is not None and self.sp_size is not None
        if self.tp_size > 1 and self.tp_handler is None:
            self.tp_handler = TorchTensorParallelConfig()
        if self.cp_size > 1 and self.cp_handler is None:
            self.cp_handler = TorchContextParallelConfig()
        if self.cp_handler is not None and not isinstance(self.cp_handler, TorchContextParallelConfig):
            raise ConfigurationError(
                f"ParallelismConfig.cp_handler must be a TorchContextParallelConfig for cp_backend="
                f"{self.cp_backend!r}, got {type(self.cp_handler).__name__}"
            )
        if self.tp_handler is not None and not isinstance(self.tp_handler, TorchTensorParallelConfig):
            raise ConfigurationError(
                "ParallelismConfig.tp_handler must be a TorchTensorParallelConfig, got "
                f"{type(self.tp_handler).__name__}"
            )
        if self.cp_size > 1 and self.sp_size > 1:
            raise ConfigurationError(
                f"ParallelismConfig: context parallelism (cp_size={self.cp_size}) and sequence parallelism "
                f"(sp_size={self.sp_size}) are mutually exclusive; set one of them to 1"
            )

    # -- Accelerate's views of the dimensions ------------------------------------------------------------------
    def size_of(self, dimension: str) -> int:
        return getattr(self, f"{dimension}_size") or 1

    @property
    def dp_replicate_enabled(self) -> bool:
        return self.size_of("dp_replicate") > 1

    @property
    def dp_shard_enabled(self) -> bool:
        return self.size_of("dp_shard") > 1

    @property
    def tp_enabled(self) -> bool:
        return self.size_of("tp") > 1

    @property
    def cp_enabled(self) -> bool:
        return self.size_of("cp") > 1

    @property
    def sp_enabled(self) -> bool:
        return self.size_of("sp") > 1

    @property
    def dp_dim_names(self) -> list[str]:
        """The enabled dimensions data is split over."""
        return [name for name in DATA_PARALLEL_DIMENSIONS if self.size_of(name) > 1]

    @property
    def non_dp_dim_names(self) -> list[str]:
        """The enabled dimensions whose ranks see the same batches (Accelerate's order: tp, cp, sp)."""
        return [name for name in ("tp", "cp", "sp") if self.size_of(name) > 1]

    @property
    def dp_shard_cp_dim_names(self) -> list[str]:
        """The enabled dimensions flattened into the one FSDP shards parameters over (``dp_shard_cp``)."""
        return [name for name in ("dp_shard", "cp") if self.size_of(name) > 1]

    @property
    def dp_cp_dim_names(self) -> list[str]:
        """The enabled dimensions a loss is averaged over (``dp_cp``)."""
        return [name for name in ("dp_replicate", "dp_shard", "cp") if self.size_of(name) > 1]

    @property
    def fsdp_dim_names(self) -> list[str]:
        """The mesh dimensions FSDP runs over: ``dp_replicate`` (when enabled) and ``dp_shard_cp``."""
        return [*(["dp_replicate"] if self.dp_replicate_enabled else []), "dp_shard_cp"]

    @property
    def active_mesh_dims(self) -> list[str]:
        """The enabled dimensions: data-parallel ones, then tp, cp, sp (Accelerate's order)."""
        return self.dp_dim_names + self.non_dp_dim_names

    @property
    def total_size(self) -> int:
        total = 1
        for dimension in MESH_DIMENSIONS:
            total *= self.size_of(dimension)
        return total

    @property
    def data_parallel_size(self) -> int:
        return self.size_of("dp_replicate") * self.size_of("dp_shard")

    @property
    def non_data_parallel_size(self) -> int:
        return self.size_of("tp") * self.size_of("cp") * self.size_of("sp")

    def sizes(self) -> str:
        """``dp_replicate=1 x dp_shard=2 x cp=1 x sp=1 x tp=2``: for messages."""
        return " x ".join(f"{dimension}={self.size_of(dimension)}" for dimension in MESH_DIMENSIONS)

    # -- fitting the run ---------------------------------------------------------------------------------------
    def fill_world(self, world_size: int, dimension: str = "dp_replicate") -> None:
        """When every size is 1 in a run of ``world_size`` > 1 processes, give ``dimension`` all of them (a
        ``ParallelismConfig()`` means plain data parallelism, as in Accelerate)."""
        if self.total_size == 1 and world_size > 1:
            if dimension not in DATA_PARALLEL_DIMENSIONS:
                raise ConfigurationError(f"fill_world takes a data-parallel dimension, not {dimension!r}")
            setattr(self, f"{dimension}_size", world_size)

    def check_world_size(self, world_size: int) -> None:
        """One-line error naming both values when the sizes do not multiply to ``world_size``."""
        if self.total_size != world_size:
            raise ConfigurationError(
                f"ParallelismConfig sizes multiply to {self.total_size} ({self.sizes()}) but the run has "
                f"{world_size} processes; make the product equal to the number of processes"
            )

    def check_dimensions(self, backend: str, supported: tuple[str, ...]) -> None:
        """One-line error when an enabled dimension is not in ``supported`` (what backend ``backend``
        declares), naming the size and the backend."""
        for dimension in self.active_mesh_dims:
            if dimension not in supported:
                can = ", ".join(supported) if supported else "none"
                raise ConfigurationError(
                    f"ParallelismConfig.{dimension}_size={self.size_of(dimension)}: backend {backend!r} cannot "
                    f"split the {dimension} dimension (it supports: {can}); choose a backend that does "
                    "(`drivetrain plugins` lists them) or set it to 1"
                )

    # -- the mesh -----------------------------------------------------------------------------------------------
    def mesh_shape(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """(names, sizes) of the mesh: the enabled dimensions in mesh order."""
        names = tuple(name for name in MESH_DIMENSIONS if self.size_of(name) > 1)
        return names, tuple(self.size_of(name) for name in names)

    def _get_mesh(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """Accelerate's private name for :meth:`mesh_shape`, which code written for it (and its tests) call."""
        return self.mesh_shape()

    def flattened_dim_names(self) -> dict[str, list[str]]:
        """The flattened dimensions :meth:`build_device_mesh` adds, each with the enabled dimensions it spans:
        ``dp`` (data parallel), ``dp_shard_cp`` (what FSDP shards over), ``dp_cp`` (what a loss is averaged
        over). A single enabled part is flattened too, so that every flat name exists whenever it is used."""
        found = (
            ("dp", self.dp_dim_names),
            ("dp_shard_cp", self.dp_shard_cp_dim_names),
            ("dp_cp", self.dp_cp_dim_names),
        )
        return {name: parts for name, parts in found if parts}

    def build_device_mesh(self, device_type: str) -> Any:
        """torch's ``DeviceMesh`` over every process with the enabled dimensions in mesh order, plus the
        flattened dimensions of :meth:`flattened_dim_names` (reach them through :meth:`submesh`). ``None`` when
        no dimension is enabled. Collective: every process calls it, in the same order."""
        from torch.distributed.device_mesh import init_device_mesh

        names, shape = self.mesh_shape()
        if not names:
            return None
        mesh = init_device_mesh(device_type, shape, mesh_dim_names=names)
        for flat, parts in self.flattened_dim_names().items():
            # Sliced by the config's list itself, as Accelerate does (code that wraps init_device_mesh sees it).
            mesh[parts]._flatten(flat)  # type: ignore[index]  # torch slices by any sequence of names
        return mesh

    def submesh(self, mesh: Any, *names: str) -> Any:
        """``mesh[names]`` for enabled and flattened dimensions alike (``submesh(mesh, "dp")``), without
        slicing a flattened dimension from the root mesh, which torch deprecates since 2.11 ("bookkeep the
        flattened mesh directly"): flattening a dimension's parts again returns the mesh torch keeps for it,
        and a flattened dimension beside others (HSDP's ``"dp_replicate", "dp_shard_cp"``) is the flattened
        mesh of all their parts unflattened into those names (built once per mesh, its groups reused)."""
        flattened = self.flattened_dim_names()
        if not any(name in flattened for name in names):
            return mesh[names if len(names) > 1 else names[0]]
        if len(names) == 1:
            return mesh[tuple(flattened[names[0]])]._flatten(names[0])
        built: dict[tuple[int, tuple[str, ...]], Any] = self.__dict__.setdefault("_submeshes", {})
        key = (id(mesh), names)
        if key not in built:
            parts = [part for name in names for part in flattened.get(name, [name])]
            flat = next((name for name, spans in flattened.items() if spans == parts), "_".join(parts))
            sizes = tuple(
                math.prod(self.size_of(part) for part in flattened.get(name, [name])) for name in names
            )
            built[key] = mesh[tuple(parts)]._flatten(flat)._unflatten(0, sizes, names)
        return built[key]

    def get_device_mesh(self, device_type: str | None = None) -> Any:
        """The mesh (built on first use when ``device_type`` is given)."""
        if self.device_mesh is None:
            if device_type is None:
                raise ConfigurationError(
                    "ParallelismConfig.get_device_mesh: no mesh yet; pass a device_type (e.g. 'cuda') to build it"
                )
            self.device_mesh = self.build_device_mesh(device_type)
        elif device_type is not None and self.device_mesh.device_type != device_type:
            raise ConfigurationError(
                f"ParallelismConfig.get_device_mesh: the mesh was built for {self.device_mesh.device_type!r}, "
                f"not {device_type!r}"
            )
        return self.device_mesh

    def to_json(self) -> str:
        """The settings as JSON (the handlers by their fields; the mesh left out)."""

        def plain(value: Any) -> Any:
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                return {field.name: plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
            if isinstance(value, dict):
                return {str(key): plain(item) for key, item in value.items()}
            if isinstance(value, (str, int, float, bool)) or value is None:
                return value
            return repr(value)

        fields = [field.name for field in dataclasses.fields(self) if field.name != "device_mesh"]
        return json.dumps({name: plain(getattr(self, name)) for name in fields}, sort_keys=True)

    def __repr__(self) -> str:
        fields = ", ".join(
            f"{field.name}={getattr(self, field.name)!r}"
            for field in dataclasses.fields(self)
            if field.name != "device_mesh"
        )
        return f"ParallelismConfig({fields}, total_size={self.total_size})"

    @classmethod
    def from_environment(cls) -> ParallelismConfig | None:
        """The configuration a run gets when the script passes none: built when the environment or the config
        file sets one of its settings (``drivetrain launch --parallelism_config_*``) or Accelerate's launcher
        said to use one; else ``None``."""
        asked = sources.env_flag(*USE_ENV)
        if asked or environment_settings():
            return cls()
        return None


def warn_unused_handlers(config: ParallelismConfig) -> None:
    """Accelerate's warning for a handler whose dimension has size 1 (it is ignored)."""
    for dimension in ("tp", "cp", "sp"):
        if config.size_of(dimension) == 1 and getattr(config, f"{dimension}_handler") is not None:
            warnings.warn(
                f"ParallelismConfig.{dimension}_handler is set but {dimension}_size is 1; the handler is ignored",
                UserWarning,
                stacklevel=4,
            )
