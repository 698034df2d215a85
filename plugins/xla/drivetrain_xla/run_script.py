"""What ``drivetrain launch --tpu`` runs on one machine: the script under torch_xla's launcher.

``python -m drivetrain_xla.run_script [--main_training_function NAME] -- script.py args...``: with a main
training function the script is imported (not as ``__main__``) and ``NAME()`` is called in every process
``torch_xla.launch`` starts (one per device on a TPU VM, one on the CPU device); without one, the script runs
as ``__main__`` in this process.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import runpy
import sys


class _MainFunction:
    """Picklable for torch_xla's process pool: imports the script in the worker, then calls the function."""

    def __init__(self, script: str, name: str) -> None:
        self.script = script
        self.name = name

    def __call__(self, index: int = 0) -> None:
        spec = importlib.util.spec_from_file_location("drivetrain_launched_script", self.script)
        if spec is None or spec.loader is None:
            raise SystemExit(f"drivetrain launch: cannot import {self.script}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        function = getattr(module, self.name, None)
        if not callable(function):
            raise SystemExit(
                f"drivetrain launch: --main_training_function {self.name}: {self.script} defines no function "
                f"{self.name!r}"
            )
        function()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m drivetrain_xla.run_script")
    parser.add_argument("--main_training_function", default=None)
    parser.add_argument("script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    script = os.path.abspath(args.script)
    sys.argv = [script, *args.script_args]
    sys.path.insert(0, os.path.dirname(script))
    if args.main_training_function is None:
        runpy.run_path(script, run_name="__main__")
        return 0
    import torch_xla

    torch_xla.launch(_MainFunction(script, args.main_training_function), args=())
    return 0


if __name__ == "__main__":
    sys.exit(main())
