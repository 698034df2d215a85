"""Accelerate's ``accelerate.commands.utils``: its argument parser classes. drivetrain's parser
(:class:`drivetrain.commands.parsing.ArgumentParser`) gives one-line errors and no prefix matching."""

from __future__ import annotations

import argparse

from drivetrain.commands.parsing import ArgumentParser


class CustomArgumentParser(ArgumentParser):
    """Accelerate's parser name: every ``--snake_case`` option also answers to ``--kebab-case``."""

    def add_argument(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        spellings = list(args)
        for name in args:
            if isinstance(name, str) and name.startswith("--") and "_" in name:
                spellings.append("--" + name[2:].replace("_", "-"))
        if len(spellings) > len(args):
            kwargs.setdefault("dest", args[0][2:])
        return super().add_argument(*dict.fromkeys(spellings), **kwargs)


class CustomArgumentGroup(argparse._ArgumentGroup):
    """Accelerate's argument group name (options added to it get the ``--kebab-case`` twin too)."""

    def add_argument(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        spellings = list(args)
        for name in args:
            if isinstance(name, str) and name.startswith("--") and "_" in name:
                spellings.append("--" + name[2:].replace("_", "-"))
        if len(spellings) > len(args):
            kwargs.setdefault("dest", args[0][2:])
        return super().add_argument(*dict.fromkeys(spellings), **kwargs)


__all__ = ["CustomArgumentGroup", "CustomArgumentParser"]
