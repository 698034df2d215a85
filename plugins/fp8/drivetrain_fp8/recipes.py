"""The fp8 recipe handlers a script passes in ``Accelerator(kwargs_handlers=[...])``.

One per library (``AORecipeKwargs``, ``TERecipeKwargs``, ``MSAMPRecipeKwargs``) plus Accelerate's older
``FP8RecipeKwargs`` (TransformerEngine or MS-AMP, chosen by ``backend``). Passing one also chooses the fp8
library. A field left at ``None`` takes the value from ``drivetrain launch --fp8_*`` / the config file's
``fp8_config`` when the script was launched with them, else Accelerate's default; after construction every
field holds its effective value.

Building a handler never imports its library: a script (and these handlers' tests) run anywhere, and a
missing library is reported once, when the Accelerator is prepared, with the command that installs it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import attrs

from drivetrain.plugin_api import ConfigurationError
from drivetrain.plugin_api.settings import KwargsHandler
from drivetrain_fp8 import options


def _launched() -> dict[str, Any]:
    try:
        return options.launched_settings()
    except ValueError as error:
        raise ConfigurationError(f"fp8 launch settings: {error}") from None


@attrs.define
class _Recipe(KwargsHandler):
    """Shared behaviour: normalise given fields, then fill unset ones from the launch settings or defaults."""

    #: field -> default used when neither the script nor the launcher set it
    DEFAULTS: ClassVar[dict[str, Any]] = {}
    #: names of the fields the script itself set (so "not supported" errors name only real choices)
    given: frozenset[str] = attrs.field(init=False, factory=frozenset, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        given = set()
        for name in self.DEFAULTS:
            value = getattr(self, name)
            if value is None:
                continue
            given.add(name)
            setattr(self, name, self._normalised(name, value))
        launched = _launched()
        for name, default in self.DEFAULTS.items():
            if getattr(self, name) is None:
                setattr(self, name, launched.get(name, default))
        self.given = frozenset(given)

    def _normalised(self, name: str, value: Any) -> Any:
        try:
            return options.NORMALISERS[name](value)
        except ValueError as error:
            raise ConfigurationError(f"{type(self).__name__}.{name}={value!r}: {error}") from None

    def to_kwargs(self) -> dict[str, Any]:
        kwargs = super().to_kwargs()
        kwargs.pop("given", None)
        return kwargs


@attrs.define
class AORecipeKwargs(_Recipe):
    """torchao float8 training (``convert_to_float8_training``).

    ``config``: a ``torchao.float8.Float8LinearConfig``; without one it is built from ``pad_inner_dim``
    (default true: matmul dimensions padded to multiples of 16) and ``enable_fsdp_float8_all_gather``
    (default: true under the fsdp backend, where FSDP2 then all-gathers weights in float8; off elsewhere, where
    nothing all-gathers weights). ``module_filter_func(module, name) -> bool`` chooses the layers to convert;
    the default leaves the first and last Linear and those with dimensions not divisible by 16 in high
    precision.
    """

    DEFAULTS: ClassVar[dict[str, Any]] = {"pad_inner_dim": True, "enable_fsdp_float8_all_gather": None}

    config: Any = None
    module_filter_func: Callable[[Any, str], bool] | None = None
    pad_inner_dim: bool | None = None
    enable_fsdp_float8_all_gather: bool | None = None

    def __attrs_post_init__(self) -> None:
        if self.config is not None:
            if type(self.config).__name__ != "Float8LinearConfig":
                raise ConfigurationError(
                    f"AORecipeKwargs.config must be a torchao.float8.Float8LinearConfig, got "
                    f"{type(self.config).__name__}"
                )
            both = [name for name in self.DEFAULTS if getattr(self, name) is not None]
            if both:
                raise ConfigurationError(
                    f"AORecipeKwargs: pass either config or {', '.join(both)}, not both (set them in the "
                    "Float8LinearConfig)"
                )
        if self.module_filter_func is not None and not callable(self.module_filter_func):
            raise ConfigurationError(
                "AORecipeKwargs.module_filter_func must be a function (module, name) -> bool, got "
                f"{type(self.module_filter_func).__name__}"
            )
        super().__attrs_post_init__()

    def float8_config(self, under_fsdp: bool) -> Any:
        """The ``Float8LinearConfig`` to convert with (``under_fsdp``: the fsdp backend will shard the model)."""
        if self.config is not None:
            return self.config
        from torchao.float8 import Float8LinearConfig

        all_gather = self.enable_fsdp_float8_all_gather
        return Float8LinearConfig(
            pad_inner_dim=bool(self.pad_inner_dim),
            enable_fsdp_float8_all_gather=under_fsdp if all_gather is None else bool(all_gather),
        )


#: The TransformerEngine fields, with Accelerate's defaults.
_TE_DEFAULTS: dict[str, Any] = {
    "use_autocast_during_eval": False,
    "margin": 0,
    "interval": 1,
    "fp8_format": "HYBRID",
    "amax_history_len": 1024,
    "amax_compute_algo": "most_recent",
    "override_linear_precision": (False, False, False),
    "use_mxfp8_block_scaling": False,
}


@attrs.define
class TERecipeKwargs(_Recipe):
    """NVIDIA TransformerEngine: ``nn.Linear``/``nn.LayerNorm`` become ``te`` layers and forward runs under
    TransformerEngine's fp8 autocast with a ``DelayedScaling`` recipe (``MXFP8BlockScaling`` with
    ``use_mxfp8_block_scaling``). Fields as in Accelerate: ``fp8_format`` (HYBRID, E4M3, E5M2), ``margin``,
    ``interval``, ``amax_history_len``, ``amax_compute_algo`` (max, most_recent),
    ``override_linear_precision`` (fprop, dgrad, wgrad in high precision), ``use_autocast_during_eval``.
    """

    DEFAULTS: ClassVar[dict[str, Any]] = _TE_DEFAULTS

    use_autocast_during_eval: bool | None = None
    margin: int | None = None
    interval: int | None = None
    fp8_format: str | None = None
    amax_history_len: int | None = None
    amax_compute_algo: str | None = None
    override_linear_precision: tuple[bool, bool, bool] | None = None
    use_mxfp8_block_scaling: bool | None = None


@attrs.define
class MSAMPRecipeKwargs(_Recipe):
    """Microsoft MS-AMP: ``msamp.initialize(model, optimizer, opt_level)``. ``opt_level`` O1 (fp8 weights
    and gradient communication) or O2 (also fp8/fp16 optimizer states; the default)."""

    DEFAULTS: ClassVar[dict[str, Any]] = {"opt_level": "O2"}

    opt_level: str | None = None


@attrs.define
class FP8RecipeKwargs(TERecipeKwargs):
    """Accelerate's first fp8 handler: ``backend="te"`` (TransformerEngine, with the TERecipeKwargs fields)
    or ``backend="msamp"`` (MS-AMP, with ``opt_level``). Without ``backend``: ``--fp8_backend`` / the config
    file, else MS-AMP when it is installed, else TransformerEngine (Accelerate's rule)."""

    DEFAULTS: ClassVar[dict[str, Any]] = {**_TE_DEFAULTS, "opt_level": "O2"}

    opt_level: str | None = None
    backend: str | None = None

    def __attrs_post_init__(self) -> None:
        from drivetrain_fp8.backends import MSAMP

        if self.backend is None:
            self.backend = _launched().get("backend") or ("msamp" if MSAMP.available else "te")
        backend = _backend_of(self.backend)
        if backend not in ("te", "msamp"):
            raise ConfigurationError(
                f"FP8RecipeKwargs.backend={self.backend!r}: FP8RecipeKwargs selects te or msamp; for torchao "
                "pass AORecipeKwargs"
            )
        self.backend = backend.upper()
        super().__attrs_post_init__()


def _backend_of(value: Any) -> str:
    try:
        return options.to_backend(value)
    except ValueError as error:
        raise ConfigurationError(f"FP8RecipeKwargs.backend: {error}") from None


#: every fp8 recipe handler class, for finding the one among a script's kwargs_handlers
RECIPE_CLASSES = (FP8RecipeKwargs, AORecipeKwargs, TERecipeKwargs, MSAMPRecipeKwargs)
