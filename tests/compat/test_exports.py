"""Every documented public name resolves: ``from drivetrain import X`` / ``from drivetrain.utils import X``."""

from __future__ import annotations

import importlib

import pytest

import drivetrain
import drivetrain.utils
from drivetrain.compat.install_hints import PLUGIN_EXPORTS
from drivetrain.compat.paths import GENERATED_MODULES, ON_IMPORT

#: Accelerate's paths generated from their tables (drivetrain.utils, ...), except those whose import does
#: something (ON_IMPORT: a handler installed, a warning).
GENERATED_PATHS = sorted(name for name in GENERATED_MODULES if name not in ON_IMPORT)


@pytest.mark.parametrize("module_name", ["drivetrain", *GENERATED_PATHS])
def test_every_listed_name_resolves(module_name):
    module = importlib.import_module(module_name)
    table = drivetrain._EXPORTS if module_name == "drivetrain" else GENERATED_MODULES[module_name]
    unresolved = []
    for name in table:
        try:
            getattr(module, name)
        except (AttributeError, ImportError) as exc:
            unresolved.append(f"{name}: {exc}")
    assert unresolved == []


def test_accelerate_script_imports_work():
    from drivetrain import Accelerator, DistributedType, PartialState  # noqa: F401
    from drivetrain.utils import (  # noqa: F401
        DataLoaderConfiguration,
        GradientAccumulationPlugin,
        ProjectConfiguration,
        gather_object,
        set_seed,
        tqdm,
    )


def test_plugin_names_resolve_or_name_their_distribution():
    for name, distribution in PLUGIN_EXPORTS.items():
        try:
            getattr(drivetrain, name)
        except ImportError as exc:
            assert f"pip install {distribution}" in str(exc)


def test_version_gates_written_for_accelerate_take_the_accelerate_path():
    import importlib.metadata

    from packaging.version import Version

    import drivetrain

    assert drivetrain.__version__ == importlib.metadata.version("drivetrain")
    assert Version(drivetrain.__version__) >= Version(drivetrain.__accelerate_api__)
    # Gates seen in scripts and libraries written for Accelerate.
    for minimum in ("0.20.0", "0.28.0", "1.0.0", "1.10.0"):
        assert Version(drivetrain.__version__) >= Version(minimum)
    assert Version(drivetrain.__version__) < Version("1.16.0")


def test_accelerates_utility_packages_reach_their_submodules_as_attributes():
    """``drivetrain.utils`` and ``drivetrain.test_utils`` have no file: after ``import drivetrain.utils`` its
    submodules are attributes, as in Accelerate; ``drivetrain.utils.tqdm`` is the function (Accelerate's package
    imports it over its submodule); ``drivetrain.rich`` installs rich's traceback handler when reached."""
    import subprocess
    import sys

    pytest.importorskip("rich")
    code = (
        "import sys, types, drivetrain, drivetrain.utils, drivetrain.test_utils\n"
        "hook = sys.excepthook\n"
        "print(drivetrain.utils.modeling.__name__, drivetrain.test_utils.testing.get_backend.__name__,\n"
        "      isinstance(drivetrain.utils.tqdm, types.FunctionType), 'drivetrain.utils.rich' in sys.modules)\n"
        "print(drivetrain.rich is sys.modules['drivetrain.utils.rich'], sys.excepthook is not hook)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == [
        "drivetrain.utils.modeling",
        "get_backend",
        "True",
        "False",
        "True",
        "True",
    ]
