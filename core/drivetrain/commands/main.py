"""``drivetrain``: the command line. Built-in subcommands live one per module next to this file; plugins add
theirs through the ``register_extensions`` hook (``registry.add_command``).

A user error prints one line, ``drivetrain: error: ...``, and exits with code 2; never a traceback.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys
from collections.abc import Callable, Sequence

from drivetrain.errors import ConfigurationError, DrivetrainError, PluginError

#: subcommand -> module under drivetrain.commands (each defines ``register_parser(parser)``, ``run(args)``
#: and ``HELP``).
BUILTIN_COMMANDS = {
    "config": "config",
    "env": "env",
    "estimate-memory": "estimate_memory",
    "launch": "launch",
    "plugins": "plugins",
    "test": "test",
}
USAGE_ERROR = 2


class UsageError(DrivetrainError):
    """A bad flag or value on the command line (exit code 2)."""


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


def _plugin_commands(errors: list[str]) -> dict[str, tuple[str, object, object, str]]:
    """Load every plugin and return the subcommands they register. A plugin that fails to load is skipped
    here (``drivetrain plugins`` reports it)."""
    from drivetrain.plugins import get_plugin_manager

    manager = get_plugin_manager()
    for name in manager.names():
        try:
            manager.load(name)
        except PluginError as exc:
            errors.append(str(exc))
    return dict(manager.extensions.commands)


def build_parser(plugin_errors: list[str] | None = None) -> ArgumentParser:
    parser = ArgumentParser(
        prog="drivetrain",
        description="Run one PyTorch training script on any hardware and distribution backend.",
        epilog="Run `drivetrain <command> --help` for a command's options.",
    )
    from drivetrain import __version__

    parser.add_argument("--version", action="version", version=f"drivetrain {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="<command>", title="commands")
    for command, module_name in BUILTIN_COMMANDS.items():
        module = importlib.import_module(f"drivetrain.commands.{module_name}")
        sub = subparsers.add_parser(command, help=module.HELP, description=module.HELP)
        module.register_parser(sub)
        sub.set_defaults(_run=module.run)
    errors = plugin_errors if plugin_errors is not None else []
    for command, (plugin, register, run, help_text) in sorted(_plugin_commands(errors).items()):
        if command in BUILTIN_COMMANDS:
            errors.append(f"plugin {plugin!r} registers command {command!r}, which is built in; ignored")
            continue
        label = f"{help_text} [plugin: {plugin}]" if help_text else f"[plugin: {plugin}]"
        sub = subparsers.add_parser(command, help=label, description=label)
        register(sub)  # type: ignore[operator]
        sub.set_defaults(_run=run)
    return parser


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


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["launch"]:
        # The launcher only needs its own parser: skip building every other command's.
        from drivetrain.commands import launch

        return launch.main(argv[1:])

    def run() -> int | None:
        plugin_errors: list[str] = []
        parser = build_parser(plugin_errors)
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            for problem in plugin_errors:
                print(f"warning: {problem}", file=sys.stderr)
            return USAGE_ERROR
        return args._run(args)

    return exit_code_of(run)


if __name__ == "__main__":  # pragma: no cover
    # Through the canonical module, so the error classes caught are the ones the subcommands raise.
    from drivetrain.commands.main import main as _main

    sys.exit(_main())
