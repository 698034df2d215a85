"""Which fp8 library runs, and whether it can run with the distribution backend and device of this run.

The library is chosen, in this order, by:

1. the fp8 recipe handler in ``Accelerator(kwargs_handlers=[...])`` (``AORecipeKwargs`` -> torchao,
   ``TERecipeKwargs`` -> TransformerEngine, ``MSAMPRecipeKwargs`` -> MS-AMP, ``FP8RecipeKwargs`` -> its
   ``backend``);
2. ``drivetrain launch --fp8_backend`` / the config file's ``fp8_config: {backend: ...}``;
3. the first installed of torchao, TransformerEngine, MS-AMP (Accelerate's order).

A handler and a launch setting that disagree are an error, as any two configuration sources are.
"""

from __future__ import annotations

from typing import Any

import attrs

from drivetrain.plugin_api import ConfigurationError, PluginError
from drivetrain_fp8.backends import AUTOMATIC_ORDER, BY_NAME, MSAMP, TORCHAO, TRANSFORMER_ENGINE, Fp8Library
from drivetrain_fp8.recipes import (
    RECIPE_CLASSES,
    AORecipeKwargs,
    FP8RecipeKwargs,
    MSAMPRecipeKwargs,
    TERecipeKwargs,
)


class Fp8LibraryMissing(PluginError, ImportError):
    """The chosen fp8 library is not installed (an ImportError too, as in Accelerate)."""


@attrs.define(frozen=True)
class Choice:
    library: Fp8Library
    recipe: Any
    #: what chose it, for messages
    chosen_by: str


def library_of(handler: Any) -> Fp8Library:
    if isinstance(handler, FP8RecipeKwargs):
        return BY_NAME[str(handler.backend).lower()]
    if isinstance(handler, AORecipeKwargs):
        return TORCHAO
    if isinstance(handler, TERecipeKwargs):
        return TRANSFORMER_ENGINE
    return MSAMP


def _default_recipe(library: Fp8Library) -> Any:
    return {"ao": AORecipeKwargs, "te": TERecipeKwargs, "msamp": MSAMPRecipeKwargs}[library.name]()


def choose(handlers: list[Any], launched: dict[str, Any]) -> Choice:
    """The library and recipe for a run, from the script's kwargs handlers and the launch settings."""
    recipes = [handler for handler in handlers if isinstance(handler, RECIPE_CLASSES)]
    if len(recipes) > 1:
        names = " and ".join(type(handler).__name__ for handler in recipes)
        raise ConfigurationError(f"kwargs_handlers holds {names}; pass one fp8 recipe handler")
    launched_backend = launched.get("backend")
    if recipes:
        recipe = recipes[0]
        library = library_of(recipe)
        chosen_by = f"{type(recipe).__name__} in kwargs_handlers"
        if launched_backend is not None and launched_backend != library.name:
            raise ConfigurationError(
                f"{chosen_by} selects fp8 backend {library.name!r} but --fp8_backend / fp8_config.backend says "
                f"{launched_backend!r}; make them agree or drop one"
            )
    elif launched_backend is not None:
        library = BY_NAME[launched_backend]
        chosen_by = f"--fp8_backend / fp8_config.backend {launched_backend!r}"
        recipe = None
    else:
        installed = [library for library in AUTOMATIC_ORDER if library.available]
        if not installed:
            raise Fp8LibraryMissing(
                "mixed_precision='fp8' needs an fp8 library and none is installed: pip install torchao (CPU and "
                "GPU); on NVIDIA GPUs transformer-engine or MS-AMP work too"
            )
        library = installed[0]
        chosen_by = (
            "automatic choice (first installed of " + ", ".join(lib.module for lib in AUTOMATIC_ORDER) + ")"
        )
        recipe = None
    if not library.available:
        raise Fp8LibraryMissing(library.missing_message(chosen_by))
    return Choice(
        library=library,
        recipe=recipe if recipe is not None else _default_recipe(library),
        chosen_by=chosen_by,
    )


#: fp8 library -> distribution backend -> why that pair cannot run
UNSUPPORTED = {
    "msamp": {
        "fsdp": "MS-AMP's fp8 weights cannot be sharded by FSDP2; use ddp, or torchao with fsdp",
        "deepspeed": "MS-AMP's DeepSpeed integration replaces deepspeed.initialize, which the deepspeed backend "
        "owns; use ddp, or torchao with deepspeed",
    },
}
#: fp8 libraries that need an NVIDIA GPU
GPU_ONLY = ("te", "msamp")


def check_composition(library: Fp8Library, backend: str, device_type: str) -> None:
    """One-line error when ``library`` cannot run under distribution ``backend`` on ``device_type``."""
    reason = UNSUPPORTED.get(library.name, {}).get(backend)
    if reason is not None:
        raise ConfigurationError(
            f"fp8 backend {library.name!r} cannot run with backend {backend!r}: {reason}"
        )
    if library.name in GPU_ONLY and device_type != "cuda":
        raise ConfigurationError(
            f"fp8 backend {library.name!r} ({library.label}) needs {library.needs}; this process runs on "
            f"{device_type!r} (torchao runs fp8 on CPU: pass AORecipeKwargs or --fp8_backend ao)"
        )
