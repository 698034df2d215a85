"""The architecture, checked: plugins use only the declared plugin API, the kernel names no backend, and no
package has an import cycle. See docs/architecture.md."""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from pathlib import Path

import pytest

import drivetrain.plugin_api as plugin_api
from drivetrain.plugin_api._moved import moved

ROOT = Path(__file__).resolve().parents[2]
KERNEL = ROOT / "core" / "drivetrain"

#: Code that is a plugin: it may import from the kernel only ``drivetrain.plugin_api`` (and ``hookimpl``).
PLUGIN_PACKAGES = sorted(
    path
    for path in [
        *ROOT.glob("plugins/*/drivetrain_*"),
        *ROOT.glob("contrib/*/drivetrain_*"),
        KERNEL / "backends",
    ]
    if (path / "__init__.py").is_file() or path.name == "backends"
)
#: The conformance suite runs user scripts as well: it may also use the public user API.
CONFORMANCE = ROOT / "conformance" / "drivetrain_conformance"
USER_API_MODULES = {"drivetrain", "drivetrain.utils", "drivetrain.testing"}

#: Names of objects the kernel hands to plugins; an underscore attribute of one is private.
KERNEL_OBJECTS = {
    "accelerator",
    "state",
    "partial_state",
    "gradient_state",
    "registry",
    "environment",
    "options",
    "prepared",
    "manager",
}

#: Backend, device and precision-library words the kernel must not contain outside its one compatibility
#: file. Matched in string literals and identifiers, case-insensitively, not inside a longer word.
BACKEND_WORDS = (
    "ddp fsdp deepspeed megatron xla tpu ipex mps xpu npu mlu musa hpu sdaa fp8 torchao transformer_engine msamp"
).split()
_WORD = re.compile(r"(?<![a-z0-9])(" + "|".join(BACKEND_WORDS) + r")(?![a-z0-9])")
_DISTRIBUTION = re.compile(r"pip install drivetrain-[a-z0-9]+")

#: The compatibility tables: the one place where the kernel names backends (core/drivetrain/compat/).
COMPAT_TABLES = ("paths", "install_hints", "cli_options", "availability", "distributions")

#: The exceptions, in one place: Accelerate's names that a script passes or compares against.
ALLOWED = {
    # Accelerate's names that belong to backends, by kind (paths, install hints, CLI options, availability).
    **{f"core/drivetrain/compat/{kind}.py": {"*"} for kind in COMPAT_TABLES},
    # Accelerate's enum values (DistributedType.DEEPSPEED, PrecisionType.FP8, ...).
    "core/drivetrain/config/enums.py": {"*"},
    # Accelerate's ParallelismConfig property (the mesh dimensions a sharding backend runs over), and its
    # sp_backend default (a fact of its API, valid without the plugin that runs it).
    "core/drivetrain/config/parallelism.py": {"fsdp_dim_names", "deepspeed"},
    # Accelerate's Accelerator keyword arguments (each an alias of backend_config=), resolved into its settings.
    "core/drivetrain/config/accelerator_settings.py": {
        "deepspeed_plugin",
        "fsdp_plugin",
        "megatron_lm_plugin",
        "deepspeed_plugins",
    },
    # Accelerate's Accelerator keyword arguments (each an alias of backend_config=).
    "core/drivetrain/accelerator.py": {
        "deepspeed_plugin",
        "fsdp_plugin",
        "megatron_lm_plugin",
        "deepspeed_plugins",
        # Accelerate's check that prepare_model asks by this module's name (tests patch it there)
        "is_xpu_available",
        "is_bitsandbytes_multi_backend_available",
    },
}


def _python_files(folder: Path) -> list[Path]:
    return sorted(path for path in folder.rglob("*.py") if "tests" not in path.relative_to(folder).parts)


def _kernel_imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) for every import of a ``drivetrain`` module in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "drivetrain" or node.module.startswith("drivetrain."):
                found.append((node.lineno, node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "drivetrain" or alias.name.startswith("drivetrain."):
                    found.append((node.lineno, alias.name, []))
    return found


#: The plugin API's modules (the package and its namespaces) -> the names each declares.
PLUGIN_API_MODULES = {
    "drivetrain.plugin_api": set(plugin_api.__all__) | set(plugin_api.NAMESPACES),
    **{
        f"drivetrain.plugin_api.{name}": set(importlib.import_module(f"drivetrain.plugin_api.{name}").__all__)
        for name in plugin_api.NAMESPACES
    },
}


def _plugin_import_problems(path: Path, extra_modules: set[str]) -> list[str]:
    problems = []
    for line, module, names in _kernel_imports(path):
        where = f"{path.relative_to(ROOT)}:{line}"
        if module in PLUGIN_API_MODULES:
            # Contract 1.1's flat names still import (with a warning); in-tree code uses their 1.2 place.
            for name in sorted(set(names) - PLUGIN_API_MODULES[module]):
                place = moved().get(name)
                hint = f"import it from drivetrain.plugin_api.{place}" if place else "it is not plugin API"
                problems.append(f"{where}: imports {name} from {module}: {hint}")
            continue
        if module in extra_modules:
            continue
        if module == "drivetrain" and names == ["hookimpl"]:
            continue
        problems.append(f"{where}: imports {module} {names or ''}".rstrip())
    return problems


@pytest.mark.parametrize("package", PLUGIN_PACKAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_plugins_import_only_the_plugin_api(package):
    problems = [
        problem for path in _python_files(package) for problem in _plugin_import_problems(path, set())
    ]
    assert not problems, "plugins may import from the kernel only drivetrain.plugin_api:\n" + "\n".join(
        problems
    )


def test_conformance_imports_only_the_plugin_api_and_the_user_api():
    problems = [
        problem
        for path in _python_files(CONFORMANCE)
        for problem in _plugin_import_problems(path, USER_API_MODULES)
    ]
    assert not problems, "\n".join(problems)


def _private_reads(path: Path) -> list[str]:
    problems = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        target, attribute = None, None
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            target, attribute = node.value, node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and node.args[1].value.startswith("_")
            and not node.args[1].value.startswith("__")
        ):
            target, attribute = node.args[0], node.args[1].value
        while isinstance(target, ast.Attribute) and target.attr not in KERNEL_OBJECTS:
            target = target.value
        name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", None)
        if name in KERNEL_OBJECTS:
            problems.append(f"{path.relative_to(ROOT)}:{node.lineno}: reads {name}.{attribute}")
    return problems


@pytest.mark.parametrize("package", [*PLUGIN_PACKAGES, CONFORMANCE], ids=lambda p: str(p.relative_to(ROOT)))
def test_plugins_read_no_private_attribute_of_kernel_objects(package):
    problems = [problem for path in _python_files(package) for problem in _private_reads(path)]
    assert not problems, "plugins use documented attributes and hook arguments only:\n" + "\n".join(problems)


def _unannotated_accelerators(path: Path) -> list[str]:
    """Functions of ``path`` taking an ``accelerator`` not annotated with the protocol plugins see."""
    problems = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        arguments = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
        for argument in arguments:
            if argument.arg != "accelerator":
                continue
            annotation = ast.unparse(argument.annotation) if argument.annotation is not None else "nothing"
            if annotation.replace('"', "") not in ("PluginAccelerator", "PluginAccelerator | None"):
                problems.append(
                    f"{path.relative_to(ROOT)}:{node.lineno}: {node.name}(accelerator: {annotation})"
                )
    return problems


@pytest.mark.parametrize("package", PLUGIN_PACKAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_plugins_annotate_the_accelerator_with_the_protocol(package):
    """``accelerator: PluginAccelerator`` lets mypy (scripts/test) check that a plugin reads only plugin API."""
    problems = [problem for path in _python_files(package) for problem in _unannotated_accelerators(path)]
    assert not problems, "annotate accelerator: PluginAccelerator (drivetrain.plugin_api):\n" + "\n".join(
        problems
    )


def test_type_checkers_see_the_plugin_api_as_it_imports():
    """No module ``__getattr__`` a type checker would read as "any name exists, typed Any": the one that serves
    contract 1.1's flat names is defined under ``if not TYPE_CHECKING``."""
    problems = []
    for path in sorted((KERNEL / "plugin_api").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
                problems.append(
                    f"{path.relative_to(ROOT)}:{node.lineno}: module __getattr__ seen by type checkers"
                )
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                hidden = ast.unparse(node.test).startswith("not ")
                if not hidden and not node.body[1:] and isinstance(node.body[0], ast.Pass):
                    problems.append(f"{path.relative_to(ROOT)}:{node.lineno}: an empty TYPE_CHECKING block")
    assert not problems, "\n".join(problems)


def _code_tokens(path: Path) -> list[tuple[int, str]]:
    """(line, text) of the identifiers and string literals of ``path``, docstrings and comments left out."""
    source = path.read_text(encoding="utf-8")
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    docstrings.add(body[0].lineno)
    tokens = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.NAME or (
            token.type == tokenize.STRING and token.start[0] not in docstrings
        ):
            tokens.append((token.start[0], token.string))
    return tokens


def test_the_kernel_names_no_backend():
    problems = []
    for path in _python_files(KERNEL):
        relative = str(path.relative_to(ROOT))
        allowed = ALLOWED.get(relative, set())
        if "*" in allowed:
            continue
        for line, text in _code_tokens(path):
            if text in allowed or (text[:1] in "\"'" and text.strip("\"'") in allowed):
                continue
            lowered = text.lower()
            hit = _WORD.search(lowered) or _DISTRIBUTION.search(lowered)
            if hit:
                problems.append(f"{relative}:{line}: {text[:80]}")
    assert not problems, (
        "the kernel names no backend (backend facts come from the plugins' PluginInfo; Accelerate's names "
        "go in the tables of core/drivetrain/compat/):\n" + "\n".join(problems)
    )


def _cycles(package: str) -> list[list[str]]:
    """Strongly connected components of more than one module in ``package``'s import graph (every import
    statement counts, including those inside functions and under TYPE_CHECKING)."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph(package)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = [0]

    def visit(module: str) -> None:
        index[module] = low[module] = counter[0]
        counter[0] += 1
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return components


PACKAGES = [
    "drivetrain",
    *sorted(path.name for path in PLUGIN_PACKAGES if path.name.startswith("drivetrain_")),
]


@pytest.mark.parametrize("package", [*PACKAGES, "drivetrain_conformance"])
def test_no_import_cycles(package):
    cycles = _cycles(package)
    assert not cycles, f"import cycles in {package}: " + "; ".join(" <-> ".join(cycle) for cycle in cycles)


def test_the_plugin_api_reference_is_generated_from_the_module():
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "plugin_api_doc.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def test_an_accelerator_that_saves_its_state_loads_no_big_model_code(tmp_path):
    """Checkpoints read safetensors files through ``drivetrain.safetensors_reader``, below both checkpoint and
    big_modeling: building an Accelerator, saving and loading its state (a model in safetensors) leaves
    ``drivetrain.big_modeling`` unimported in a fresh process."""
    import subprocess
    import sys

    script = f"""
import sys, torch
from drivetrain import Accelerator
accelerator = Accelerator(cpu=True)
model = torch.nn.Linear(2, 2)
model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
accelerator.save_state({str(tmp_path / "state")!r})
accelerator.load_state({str(tmp_path / "state")!r})
print(sorted(name for name in sys.modules if name.startswith("drivetrain.big_modeling")))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
    assert any(path.suffix == ".safetensors" for path in (tmp_path / "state").rglob("*"))


#: The kernel's files stay small enough to read in one sitting (docs/architecture.md).
MAX_KERNEL_FILE_LINES = 800


def test_no_kernel_file_is_over_800_lines():
    too_long = {
        str(path.relative_to(ROOT)): lines
        for path in sorted(KERNEL.rglob("*.py"))
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_KERNEL_FILE_LINES
    }
    assert not too_long, f"split these files (at most {MAX_KERNEL_FILE_LINES} lines each): {too_long}"
