"""Cost of dispatching the per-step hook: the Accelerator's per-step caller, pluggy's hook caller, and calling
the implementation directly.

    python bench/hook_dispatch.py [--calls 200000] [--repeats 7]

A prepared training step calls one hook (``backward``; ``autocast`` too with mixed precision). This times the
``backward`` hook with a loss whose ``backward()`` does nothing, so what is left is dispatch: called through
``PluginStack.caller`` (what ``Accelerator.backward`` uses: plain first-result implementations called directly,
in pluggy's order), through pluggy's ``HookCaller`` (``stack.hook.backward``), and the implementation called by
hand, with the reference backend alone and with two plugins in front of it that answer ``None``. Prints the
fastest repeat in microseconds per call; compare with bench/step_overhead.py's per-step time.
"""

from __future__ import annotations

import argparse
import time
import types

import torch

from drivetrain import Accelerator, hookimpl, reset_state
from drivetrain.plugin_api import PluginInfo
from drivetrain.plugin_api.tooling import get_plugin_registry


class NoOpLoss:
    def backward(self, **kwargs) -> None:
        pass


def per_call_us(function, calls: int, repeats: int, **arguments) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            function(**arguments)
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def declining_plugin() -> types.SimpleNamespace:
    plugin = types.SimpleNamespace(PLUGIN_INFO=PluginInfo(kind="feature"))
    plugin.backward = hookimpl(lambda loss: None)
    return plugin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    local = get_plugin_registry().load("local").module
    arguments = dict(loss=NoOpLoss(), backward_kwargs={})

    reset_state()
    accelerator = Accelerator(cpu=True)
    direct = per_call_us(local.backward, args.calls, args.repeats, accelerator=accelerator, **arguments)
    print(f"implementation called by hand:           {direct:6.2f} us")
    for extra in (0, 2):
        reset_state()
        names = []
        for index in range(extra):
            get_plugin_registry().register(f"decline{index}", declining_plugin())
            names.append(f"decline{index}")
        accelerator = Accelerator(cpu=True, plugins=names)
        stack = accelerator.state.plugins
        per_step = per_call_us(
            stack.caller("backward"), args.calls, args.repeats, accelerator=accelerator, **arguments
        )
        pluggy = per_call_us(
            stack.hook.backward, args.calls, args.repeats, accelerator=accelerator, **arguments
        )
        print(
            f"{extra} plugin(s) before local: per-step caller {per_step:6.2f} us, pluggy's hook caller {pluggy:6.2f} us"
        )
        for name in names:
            get_plugin_registry().unregister(name)


if __name__ == "__main__":
    main()
