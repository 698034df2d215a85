"""The recipe handlers, the ``--fp8_*`` flags and the ``fp8_config`` section: values, defaults and errors.

None of these import an fp8 library, so they run anywhere (TransformerEngine and MS-AMP included).
"""

from __future__ import annotations

import argparse

import pytest

from drivetrain.errors import ConfigurationError
from drivetrain_fp8 import options
from drivetrain_fp8.recipes import AORecipeKwargs, FP8RecipeKwargs, MSAMPRecipeKwargs, TERecipeKwargs
from drivetrain_fp8.transformer_engine import recipe_arguments


def test_te_defaults_are_accelerates():
    recipe = TERecipeKwargs()
    assert (recipe.margin, recipe.interval, recipe.fp8_format) == (0, 1, "HYBRID")
    assert (recipe.amax_history_len, recipe.amax_compute_algo) == (1024, "most_recent")
    assert recipe.override_linear_precision == (False, False, False)
    assert recipe.use_autocast_during_eval is False and recipe.use_mxfp8_block_scaling is False
    # every field holds its effective value, so all reach the recipe (as Accelerate's to_kwargs does)
    assert set(recipe.to_kwargs()) == set(TERecipeKwargs.DEFAULTS)


def test_te_values_are_normalised():
    recipe = TERecipeKwargs(
        fp8_format="e4m3", amax_compute_algo="MAX", override_linear_precision="false,true,0"
    )
    assert recipe.fp8_format == "E4M3"
    assert recipe.amax_compute_algo == "max"
    assert recipe.override_linear_precision == (False, True, False)
    assert recipe.given == {"fp8_format", "amax_compute_algo", "override_linear_precision"}


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("fp8_format", "E3M4", "TERecipeKwargs.fp8_format='E3M4': 'E3M4' is not one of HYBRID, E4M3, E5M2"),
        ("amax_compute_algo", "mean", "is not one of max, most_recent"),
        ("margin", -1, "TERecipeKwargs.margin=-1: -1 is below the minimum 0"),
        ("interval", 0, "below the minimum 1"),
        ("amax_history_len", "long", "'long' is not an integer"),
        ("override_linear_precision", (True, False), "must hold three booleans"),
    ],
)
def test_te_bad_values_name_the_field(field, value, expected):
    with pytest.raises(ConfigurationError, match=expected.replace("(", r"\(").replace(")", r"\)")) as caught:
        TERecipeKwargs(**{field: value})
    assert "\n" not in str(caught.value)


def test_msamp_opt_level():
    assert MSAMPRecipeKwargs().opt_level == "O2"
    assert MSAMPRecipeKwargs(opt_level="o1").opt_level == "O1"
    with pytest.raises(
        ConfigurationError, match=r"MSAMPRecipeKwargs.opt_level='O3': 'O3' is not one of O1, O2"
    ):
        MSAMPRecipeKwargs(opt_level="O3")


def test_ao_defaults_and_config_conflict():
    recipe = AORecipeKwargs()
    assert recipe.pad_inner_dim is True
    assert recipe.enable_fsdp_float8_all_gather is None  # decided by the backend: on under fsdp
    with pytest.raises(
        ConfigurationError, match="AORecipeKwargs.config must be a torchao.float8.Float8LinearConfig"
    ):
        AORecipeKwargs(config={"pad_inner_dim": True})
    with pytest.raises(ConfigurationError, match="AORecipeKwargs.module_filter_func must be a function"):
        AORecipeKwargs(module_filter_func="first")


def test_ao_config_with_fields_is_an_error():
    from torchao.float8 import Float8LinearConfig

    with pytest.raises(ConfigurationError, match="pass either config or pad_inner_dim, not both"):
        AORecipeKwargs(config=Float8LinearConfig(), pad_inner_dim=False)


def test_ao_float8_config_follows_the_backend():
    recipe = AORecipeKwargs()
    assert recipe.float8_config(under_fsdp=True).enable_fsdp_float8_all_gather is True
    assert recipe.float8_config(under_fsdp=False).enable_fsdp_float8_all_gather is False
    assert recipe.float8_config(under_fsdp=False).pad_inner_dim is True
    assert (
        AORecipeKwargs(enable_fsdp_float8_all_gather=False).float8_config(True).enable_fsdp_float8_all_gather
        is False
    )


def test_fp8_recipe_kwargs_backend(monkeypatch):
    from drivetrain_fp8 import backends

    monkeypatch.setattr(backends, "module_installed", lambda module: False)
    assert FP8RecipeKwargs().backend == "TE"  # Accelerate: MS-AMP when installed, else TransformerEngine
    monkeypatch.setattr(backends, "module_installed", lambda module: module == "msamp")
    assert FP8RecipeKwargs().backend == "MSAMP"
    recipe = FP8RecipeKwargs(backend="msamp", opt_level="O1", fp8_format="E4M3")
    assert (recipe.backend, recipe.opt_level, recipe.fp8_format) == ("MSAMP", "O1", "E4M3")
    with pytest.raises(
        ConfigurationError, match="FP8RecipeKwargs selects te or msamp; for torchao pass AORecipeKwargs"
    ):
        FP8RecipeKwargs(backend="ao")
    with pytest.raises(ConfigurationError, match="'cuda' is not an fp8 backend; choose one of ao, te, msamp"):
        FP8RecipeKwargs(backend="cuda")


def test_launched_settings_fill_unset_fields(launched_fp8):
    launched_fp8(fp8_backend="te", fp8_margin="2", fp8_format="E4M3", fp8_override_linear_precision=[0, 0, 1])
    recipe = TERecipeKwargs(margin=5)
    assert recipe.margin == 5  # the script's own value wins
    assert recipe.fp8_format == "E4M3"
    assert recipe.override_linear_precision == (False, False, True)
    assert recipe.given == {"margin"}
    assert FP8RecipeKwargs().backend == "TE"


def test_launch_flags_parse_and_reject():
    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    args = parser.parse_args(
        ["--fp8_backend", "TorchAO", "--fp8_format", "e5m2", "--fp8_use_autocast_during_eval"]
    )
    assert (args.fp8_backend, args.fp8_format, args.fp8_use_autocast_during_eval) == ("ao", "E5M2", True)
    assert args.fp8_margin is None  # unset flags are not passed on
    with pytest.raises(SystemExit):
        parser.parse_args(["--fp8_opt_level", "O3"])


def test_fp8_config_section_accepts_accelerates_spellings():
    # what `accelerate config` writes, and what the seed documentation shows
    section = {
        "backend": "TE",
        "amax_compute_algorithm": "max",
        "amax_history_length": 1024,
        "fp8_format": "HYBRID",
        "interval": 1,
        "margin": 0,
        "override_linear_precision": False,
        "use_autocast_during_eval": False,
        "optimization_level": "O1",
    }
    assert options.check_fp8_config(section) == {
        "backend": "te",
        "amax_compute_algo": "max",
        "amax_history_len": 1024,
        "fp8_format": "HYBRID",
        "interval": 1,
        "margin": 0,
        "override_linear_precision": (False, False, False),
        "use_autocast_during_eval": False,
        "opt_level": "O1",
    }
    with pytest.raises(ValueError, match=r"fp8_config.amax_len is not an fp8 setting; valid keys: "):
        options.check_fp8_config({"amax_len": 3})
    with pytest.raises(ValueError, match=r"fp8_config.margin: 'x' is not an integer"):
        options.check_fp8_config({"margin": "x"})


class _DelayedScalingV2:
    """The constructor arguments of TransformerEngine 2.x's DelayedScaling (no interval, no override)."""

    FIELDS = {"margin", "fp8_format", "amax_history_len", "amax_compute_algo", "scaling_factor_compute_algo"}


def test_te_recipe_arguments_follow_the_installed_recipe():
    recipe = TERecipeKwargs(margin=1)
    arguments = recipe_arguments(recipe, "DelayedScaling", _DelayedScalingV2.FIELDS)
    assert arguments == {
        "margin": 1,
        "fp8_format": "HYBRID",
        "amax_history_len": 1024,
        "amax_compute_algo": "most_recent",
    }
    old = {
        "margin",
        "interval",
        "fp8_format",
        "amax_history_len",
        "amax_compute_algo",
        "override_linear_precision",
    }
    assert set(recipe_arguments(recipe, "DelayedScaling", old)) == old
    with pytest.raises(
        ConfigurationError,
        match="TERecipeKwargs.interval=4: the installed TransformerEngine's DelayedScaling takes no 'interval'",
    ):
        recipe_arguments(TERecipeKwargs(interval=4), "DelayedScaling", _DelayedScalingV2.FIELDS)
    # MXFP8 block scaling keeps no amax history: Accelerate's defaults are dropped, a chosen value is an error
    mxfp8 = {"margin", "fp8_format"}
    assert recipe_arguments(TERecipeKwargs(use_mxfp8_block_scaling=True), "MXFP8BlockScaling", mxfp8) == {
        "margin": 0,
        "fp8_format": "HYBRID",
    }
    with pytest.raises(ConfigurationError, match="MXFP8BlockScaling takes no 'amax_history_len'"):
        recipe_arguments(TERecipeKwargs(amax_history_len=16), "MXFP8BlockScaling", mxfp8)
