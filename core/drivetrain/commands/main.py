"""``drivetrain``: the command line. Built-in subcommands live one per module next to this file; plugins add
theirs through the ``register_extensions`` hook (``registry.add_command``).

A user error prints one line, ``drivetrain: error: ...``, and exits with code 2; never a traceback.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from drivetrain.commands.parsing import USAGE_ERROR, ArgumentParser, exit_code_of
from drivetrain.errors import PluginError

#: subcommand -> module under drivetrain.commands (each defines ``register_parser(parser)``, ``run(args)``
#: and ``HELP``).
BUILTIN_COMMANDS = {
    "config": "config",
    "env": "env",
    "estimate-memory": "estimate_memory",
    "launch": "launch",
    "merge-weights": "merge",
    "plugins": "plugins",
    "test": "test",
}


def _plugin_commands(errors: list[str]) -> dict[str, tuple[str, object, object, str]]:
    """Load every plugin and return the subcommands they register. A plugin that fails to load is skipped
    here (``drivetrain plugins`` reports it)."""
    from drivetrain.contract.registry import get_plugin_registry

    manager = get_plugin_registry()
    for name in manager.names():
        try:
            manager.load(name)
        except PluginError as exc:
            errors.append(str(exc))
    return dict(manager.extensions.commands)


def build_parser(plugin_errors: list[str] | None = None, plugin_commands: bool = True) -> ArgumentParser:
    """The parser of every command; ``plugin_commands=False`` leaves out the commands plugins add, so that
    building it imports no plugin (a built-in command such as ``drivetrain plugins`` must work whatever an
    installed plugin does when imported)."""
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
        sub = subparsers.add_parser(
            command, help=module.HELP, description=getattr(module, "DESCRIPTION", module.HELP)
        )
        if module_name == "launch":  # its parser holds every plugin's launch options, unless told not to
            module.register_parser(sub, plugin_options=plugin_commands)
        else:
            module.register_parser(sub)
        sub.set_defaults(_run=module.run)
    errors = plugin_errors if plugin_errors is not None else []
    added = _plugin_commands(errors) if plugin_commands else {}
    from drivetrain.commands.plugin_commands import stand_in
    from drivetrain.compat.cli_options import ACCELERATE_PLUGIN_COMMANDS

    for command in ACCELERATE_PLUGIN_COMMANDS:  # Accelerate's plugin commands, when no plugin provides them
        if command not in added:
            register, run, help_text = stand_in(command)
            sub = subparsers.add_parser(command, help=help_text, description=help_text)
            register(sub)
            sub.set_defaults(_run=run)
    for command, (plugin, register, run, help_text) in sorted(added.items()):
        if command in BUILTIN_COMMANDS:
            errors.append(f"plugin {plugin!r} registers command {command!r}, which is built in; ignored")
            continue
        label = f"{help_text} [plugin: {plugin}]" if help_text else f"[plugin: {plugin}]"
        sub = subparsers.add_parser(command, help=label, description=label)
        register(sub)  # type: ignore[operator]
        sub.set_defaults(_run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["launch"]:
        # The launcher only needs its own parser: skip building every other command's.
        from drivetrain.commands import launch

        return launch.main(argv[1:])

    def run() -> int | None:
        plugin_errors: list[str] = []
        # A built-in command runs the same whatever plugins add (one that registers a built-in name is
        # ignored), so its parser imports no plugin.
        parser = build_parser(plugin_errors, plugin_commands=not argv or argv[0] not in BUILTIN_COMMANDS)
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            for problem in plugin_errors:
                print(f"warning: {problem}", file=sys.stderr)
            return USAGE_ERROR
        return args._run(args)

    return exit_code_of(run)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
