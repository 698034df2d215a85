"""What every ``drivetrain`` subcommand shares: the parser class, option spellings, and how a user error
becomes one line and an exit code (never a traceback)."""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable

from drivetrain.errors import ConfigurationError, DrivetrainError, PluginError, UsageError

USAGE_ERROR = 2


class ArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line error, and without prefix matching (``--num`` must not mean
    ``--num_processes``)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        # argparse's own, plus the closest known option for each unknown one (`--num_procs`: --num_processes)
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            hints = {}
            for extra in extras:
                flag = extra.split("=", 1)[0]
                if flag.startswith("-"):
                    close = difflib.get_close_matches(flag, list(self._option_string_actions), n=1)
                    if close:
                        hints[flag] = close[0]
            if len(extras) == 1 and hints:
                hint = f"; did you mean {next(iter(hints.values()))}?"
            else:
                hint = "".join(f"; {flag}: did you mean {close}?" for flag, close in hints.items())
            self.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return namespace

    def error(self, message: str) -> None:  # type: ignore[override]
        command = self.prog.removeprefix("drivetrain").strip()
        raise UsageError(f"{command + ': ' if command else ''}{message} (see `{self.prog} --help`)")


class HelpFormatter(argparse.HelpFormatter):
    """Shows ``--num_processes N`` once, hiding its ``--num-processes`` twin."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=36, width=110)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        strings = action.option_strings
        visible = [
            s
            for s in strings
            if not (s.startswith("--") and "--" + s[2:].replace("-", "_") in strings and "-" in s[2:])
        ]
        if visible != strings:
            action = argparse.Action(
                visible,
                action.dest,
                nargs=action.nargs,
                metavar=action.metavar,
                help=action.help,
                default=action.default,
                required=action.required,
            )
        return super()._format_action_invocation(action)


def add_option(group: argparse._ActionsContainer, *names: str, **kwargs) -> argparse.Action:
    """Add an option under its ``--snake_case`` name and its ``--kebab-case`` twin."""
    spellings: list[str] = []
    for name in names:
        spellings.append(name)
        if name.startswith("--") and "_" in name:
            spellings.append("--" + name[2:].replace("_", "-"))
    return group.add_argument(*spellings, **kwargs)


def error_line(message: str) -> str:
    """One line, whatever the message holds."""
    return "drivetrain: error: " + " ".join(str(message).split())


def exit_code_of(run: Callable[[], int | None]) -> int:
    """Run a command and turn user errors into one line on stderr and an exit code, never a traceback:
    2 for bad flags, values and configuration, 1 for other drivetrain errors, 130 when interrupted."""
    try:
        return int(run() or 0)
    except (UsageError, ConfigurationError, PluginError) as exc:
        print(error_line(str(exc)), file=sys.stderr)
        return USAGE_ERROR
    except DrivetrainError as exc:
        print(error_line(str(exc)), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(error_line("interrupted"), file=sys.stderr)
        return 130
