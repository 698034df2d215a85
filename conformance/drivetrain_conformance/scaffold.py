"""``drivetrain new-plugin NAME``: a new backend package rendered from contrib/plugin-template.

The template is a cookiecutter template; it uses only plain ``{{ cookiecutter.KEY }}`` substitutions, so it is
rendered here without cookiecutter (conformance/tests checks the output equals cookiecutter's).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

#: contrib/plugin-template of the source tree this package is installed from (editable or source installs).
DEFAULT_TEMPLATE = Path(__file__).resolve().parents[2] / "contrib" / "plugin-template"
PLUGIN_NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
_FIELD = re.compile(r"\{\{\s*cookiecutter\.(\w+)(?:\.replace\('-', '_'\))?\s*\}\}")


def context_for(name: str, template: Path, **overrides: str) -> dict[str, str]:
    """The template's variables (cookiecutter.json) for plugin ``name``."""
    defaults = json.loads((template / "cookiecutter.json").read_text())
    context = {key: value for key, value in defaults.items() if "{{" not in value}
    context.update(overrides, plugin_name=name)
    context["distribution"] = f"drivetrain-{name}"
    context["package"] = f"drivetrain_{name.replace('-', '_')}"
    return context


def _render(text: str, context: dict[str, str]) -> str:
    def value(match: re.Match) -> str:
        found = context[match.group(1)]
        return found.replace("-", "_") if ".replace(" in match.group(0) else found

    return _FIELD.sub(value, text)


def render(name: str, output_dir: Path, template: Path = DEFAULT_TEMPLATE, **overrides: str) -> Path:
    """Render the template for backend ``name`` into ``output_dir``; returns the new project folder.
    Raises ValueError (one line) for a bad name, a missing template or an existing folder."""
    if not PLUGIN_NAME.match(name):
        raise ValueError(
            f"plugin name {name!r} is not valid: use lower-case letters, digits and single hyphens, "
            "starting with a letter (e.g. my-backend)"
        )
    if not (template / "cookiecutter.json").is_file():
        raise ValueError(f"no plugin template at {template}; pass --template contrib/plugin-template")
    context = context_for(name, template, **overrides)
    (root,) = [path for path in template.iterdir() if path.is_dir() and "cookiecutter" in path.name]
    project = output_dir / _render(root.name, context)
    if project.exists():
        raise ValueError(f"{project} already exists; choose another name or --output-dir")
    for source in sorted(root.rglob("*")):
        if "__pycache__" in source.parts:
            continue
        target = project / _render(str(source.relative_to(root)), context)
        if source.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(_render(source.read_text(), context))
    return project
