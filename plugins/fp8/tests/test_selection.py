"""Choosing the fp8 library (handler, launch setting, what is installed) and refusing what cannot run.

Which libraries are "installed" is set per test, so the TransformerEngine and MS-AMP paths are covered on a
machine that has neither; torchao is really installed here.
"""

from __future__ import annotations

import re

import pytest

from drivetrain import Accelerator
from drivetrain.errors import ConfigurationError
from drivetrain_fp8 import backends
from drivetrain_fp8.recipes import AORecipeKwargs, FP8RecipeKwargs, MSAMPRecipeKwargs, TERecipeKwargs
from drivetrain_fp8.selection import Fp8LibraryMissing, check_composition, choose


@pytest.fixture
def installed(monkeypatch):
    def only(*modules):
        monkeypatch.setattr(backends, "module_installed", lambda module: module in modules)

    return only


@pytest.mark.parametrize(
    ("make_handler", "library"),
    [
        (AORecipeKwargs, "ao"),
        (TERecipeKwargs, "te"),
        (MSAMPRecipeKwargs, "msamp"),
        (lambda: FP8RecipeKwargs(backend="te"), "te"),
        (lambda: FP8RecipeKwargs(backend="msamp"), "msamp"),
    ],
)
def test_the_handler_chooses(installed, make_handler, library):
    installed("torchao", "transformer_engine", "msamp")
    handler = make_handler()
    choice = choose([handler], {})
    assert choice.library.name == library
    assert choice.recipe is handler


@pytest.mark.parametrize(
    ("modules", "library"),
    [
        (("torchao", "transformer_engine", "msamp"), "ao"),
        (("transformer_engine", "msamp"), "te"),
        (("msamp",), "msamp"),
    ],
)
def test_automatic_order(installed, modules, library):
    installed(*modules)
    choice = choose([], {})
    assert choice.library.name == library
    assert (
        type(choice.recipe).__name__
        == {"ao": "AORecipeKwargs", "te": "TERecipeKwargs", "msamp": "MSAMPRecipeKwargs"}[library]
    )


def test_launch_setting_chooses_when_no_handler(installed):
    installed("torchao", "transformer_engine")
    assert choose([], {"backend": "te"}).library.name == "te"


def test_nothing_installed(installed):
    installed()
    with pytest.raises(Fp8LibraryMissing, match="none is installed: pip install torchao") as caught:
        choose([], {})
    assert isinstance(caught.value, ImportError)


def test_missing_library_names_the_install_command(installed):
    installed("torchao")
    with pytest.raises(
        Fp8LibraryMissing,
        match=r"fp8 backend 'te' \(NVIDIA TransformerEngine, asked for by TERecipeKwargs in kwargs_handlers\) "
        r"needs the 'transformer_engine' package, which is not installed: pip install --no-build-isolation "
        r"transformer-engine\[pytorch\]",
    ):
        choose([TERecipeKwargs()], {})
    with pytest.raises(Fp8LibraryMissing, match="MS-AMP is not on PyPI; build it from source"):
        choose([], {"backend": "msamp"})


def test_two_handlers_or_a_disagreeing_launch_setting(installed):
    installed("torchao", "transformer_engine")
    with pytest.raises(
        ConfigurationError, match="kwargs_handlers holds AORecipeKwargs and TERecipeKwargs; pass one"
    ):
        choose([AORecipeKwargs(), TERecipeKwargs()], {})
    with pytest.raises(
        ConfigurationError,
        match="AORecipeKwargs in kwargs_handlers selects fp8 backend 'ao' but --fp8_backend / fp8_config.backend says 'te'",
    ):
        choose([AORecipeKwargs()], {"backend": "te"})


@pytest.mark.parametrize(
    ("library", "backend", "device", "message"),
    [
        ("msamp", "fsdp", "cuda", "fp8 backend 'msamp' cannot run with backend 'fsdp': MS-AMP's fp8 weights"),
        ("msamp", "deepspeed", "cuda", "fp8 backend 'msamp' cannot run with backend 'deepspeed'"),
        ("te", "ddp", "cpu", "fp8 backend 'te' (NVIDIA TransformerEngine) needs an NVIDIA GPU"),
        ("msamp", "local", "cpu", "this process runs on 'cpu'"),
    ],
)
def test_combinations_that_cannot_work(library, backend, device, message):
    with pytest.raises(ConfigurationError, match=re.escape(message)) as caught:
        check_composition(backends.BY_NAME[library], backend, device)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("backend", ["local", "ddp", "fsdp", "deepspeed"])
def test_torchao_composes_with_every_backend(backend):
    check_composition(backends.TORCHAO, backend, "cpu")
    check_composition(backends.TRANSFORMER_ENGINE, backend, "cuda")


def test_te_on_this_cpu_is_refused_at_prepare(installed):
    # What a user sees: the one-line error comes from prepare (building the Accelerator imports nothing).
    import torch

    installed("torchao", "transformer_engine")
    accelerator = Accelerator(mixed_precision="fp8", cpu=True, kwargs_handlers=[TERecipeKwargs()])
    with pytest.raises(ConfigurationError, match="fp8 backend 'te' .* needs an NVIDIA GPU"):
        accelerator.prepare(torch.nn.Sequential(torch.nn.Linear(16, 16)))
