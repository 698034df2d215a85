"""Meta-tests of the plugin contract: every hook is tested, documented, and documented with its real
signature; the kernel names no backend library."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from drivetrain.contract.registry import HOOK_SPECS

ROOT = Path(__file__).resolve().parents[2]
HOOK_DOCS = ROOT / "docs" / "hooks.md"


def _test_function_names() -> set[str]:
    names = set()
    for path in [*ROOT.glob("tests/**/*.py"), *ROOT.glob("plugins/*/tests/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                names.add(node.name)
    return names


def _documented_signatures() -> dict[str, list[str]]:
    """Hook name -> argument names, from each '## <hook>' section's first ``def`` line."""
    text = HOOK_DOCS.read_text()
    found = {}
    for match in re.finditer(r"^## (\w+)\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M):
        definition = re.search(r"def (\w+)\(([^)]*)\)", match.group(2))
        if definition:
            assert definition.group(1) == match.group(1), (
                f"section {match.group(1)} documents {definition.group(1)}"
            )
            found[match.group(1)] = [arg.strip() for arg in definition.group(2).split(",") if arg.strip()]
    return found


def test_there_are_at_most_twelve_hooks():
    assert len(HOOK_SPECS) <= 12, sorted(HOOK_SPECS)


@pytest.mark.parametrize("hook", sorted(HOOK_SPECS))
def test_every_hook_has_a_test(hook):
    tests = _test_function_names()
    assert any(name.startswith(f"test_hook_{hook}") for name in tests), (
        f"no test named test_hook_{hook}_... exercises hook {hook!r}"
    )


@pytest.mark.parametrize("hook", sorted(HOOK_SPECS))
def test_every_hook_is_documented_with_its_exact_signature(hook):
    documented = _documented_signatures()
    assert hook in documented, f"docs/hooks.md has no '## {hook}' section with its signature"
    assert documented[hook] == HOOK_SPECS[hook], (
        f"docs/hooks.md documents {hook}({', '.join(documented[hook])}) but the spec is "
        f"{hook}({', '.join(HOOK_SPECS[hook])})"
    )


def test_docs_document_no_hook_that_does_not_exist():
    assert set(_documented_signatures()) <= set(HOOK_SPECS)


def test_every_spec_says_how_it_is_called_and_the_kernel_reads_that_from_the_spec():
    from drivetrain.contract import hookspecs

    words = {"first": "**first result**", "chain": "**chain**", "broadcast": "**broadcast**"}
    for hook in HOOK_SPECS:
        doc = getattr(hookspecs, hook).__doc__
        style, chained = hookspecs.HOOK_STYLES[hook]
        assert words[style] in doc, f"{hook}: the spec is {style} but its docstring does not say so"
        firstresult = getattr(hookspecs, hook).drivetrain_spec["firstresult"]
        assert firstresult == (style == "first"), hook
        assert (chained in HOOK_SPECS[hook]) if style == "chain" else chained is None, hook


BACKEND_LIBRARIES = (
    "deepspeed",
    "torch_xla",
    "intel_extension_for_pytorch",
    "transformer_engine",
    "msamp",
    "megatron",
    "torchao",
)


def test_the_kernel_imports_no_backend_library():
    offenders = []
    for path in (ROOT / "core" / "drivetrain").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            modules = []
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module]
            offenders += [
                f"{path.relative_to(ROOT)}: {m}"
                for m in modules
                if m.split(".")[0] in BACKEND_LIBRARIES or m.startswith("drivetrain_")
            ]
    assert offenders == []
