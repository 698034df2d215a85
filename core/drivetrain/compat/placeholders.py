"""Placeholders for plugin-provided names whose plugin is not installed: importable, and every use raises the
ImportError naming the distribution to install. No drivetrain imports (the kernel's lazy namespaces use it)."""

from __future__ import annotations

from typing import Any


class _MissingPluginName(type):
    """Type of a placeholder for a plugin-provided name whose plugin is not installed: importable, and every
    use raises the ImportError naming the distribution. ``isinstance(x, Placeholder)`` is False for every x,
    so code that tests against it (``isinstance(handler, FP8RecipeKwargs)``) keeps working."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise ImportError(cls.missing_message)

    def __getattr__(cls, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        raise ImportError(cls.missing_message)

    def __instancecheck__(cls, instance: Any) -> bool:
        return False

    def __subclasscheck__(cls, subclass: Any) -> bool:
        return subclass is cls

    def __repr__(cls) -> str:
        return f"<{cls.__name__}: {cls.missing_message}>"


def missing_plugin_name(name: str, distribution: str, module: str, unpublished: str | None = None) -> Any:
    """A placeholder for ``name`` (see :class:`_MissingPluginName`). ``unpublished``: what the distribution
    would provide, when it does not exist yet."""
    if unpublished is None:
        message = f"{name} is provided by a plugin that is not installed: pip install {distribution}"
    else:
        message = (
            f"{name} is not available in drivetrain yet: {unpublished} belongs to a {distribution} plugin that "
            "is not published (docs/migrating.md lists what is missing)"
        )
    return _MissingPluginName(
        name, (), {"missing_message": message, "distribution": distribution, "__module__": module}
    )
