"""Cost of calling a hook through pluggy's hook caller, the one calling mechanism of contract 1.1.

    python bench/hook_dispatch.py [--calls 200000]

A prepared training step calls one hook (``backward``; ``autocast`` too with mixed precision). This times a
first-result hook called through the Accelerator's ``PluginStack`` (pluggy's ``HookCaller``) against calling
the same implementation directly, with the reference backend alone and with two plugins in front of it that
answer ``None``. Prints microseconds per call; compare with bench/step_overhead.py's per-step time.
"""

from __future__ import annotations

import argparse
import time
import types

import torch

from drivetrain import Accelerator, hookimpl, reset_state
from drivetrain.plugin_api import PluginInfo, get_plugin_manager


def per_call_us(function, calls: int, **arguments) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        function(**arguments)
    return (time.perf_counter() - start) / calls * 1e6


def declining_plugin() -> types.SimpleNamespace:
    plugin = types.SimpleNamespace(PLUGIN_INFO=PluginInfo(kind="feature"))
    plugin.clip_grad_norm = hookimpl(lambda parameters: None)
    return plugin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    parameters = [torch.nn.Parameter(torch.zeros(1))]
    local = get_plugin_manager().load("local").module

    def direct(parameters, max_norm, norm_type, accelerator):
        return local.clip_grad_norm(parameters=parameters, max_norm=max_norm, norm_type=norm_type)

    arguments = dict(parameters=parameters, max_norm=1.0, norm_type=2.0)
    print(
        f"direct call of the implementation: {per_call_us(direct, args.calls, accelerator=None, **arguments):.2f} us"
    )
    for extra in (0, 2):
        reset_state()
        names = []
        for index in range(extra):
            get_plugin_manager().register(f"decline{index}", declining_plugin())
            names.append(f"decline{index}")
        accelerator = Accelerator(cpu=True, plugins=names)
        caller = accelerator.state.plugins.caller("clip_grad_norm")
        cost = per_call_us(caller, args.calls, accelerator=accelerator, **arguments)
        print(f"through pluggy's hook caller, {extra} plugin(s) before local: {cost:.2f} us")
        for name in names:
            get_plugin_manager().unregister(name)


if __name__ == "__main__":
    main()
