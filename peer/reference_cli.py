"""Run with the reference's interpreter: writes every option of the reference's commands (launch, config,
env, estimate-memory, merge-weights, to-fsdp2, tpu-config, test) as JSON to the path given, for
peer/reference_cli.json (``python -m peer.names --cli-snapshot PYTHON``). Reads the reference's parsers only."""

import json, argparse, sys
from accelerate.commands.accelerate_cli import main
from accelerate.commands import launch, env, estimate, merge, to_fsdp2, tpu, test
from accelerate.commands.config import get_config_parser
from accelerate.commands.config import default, update
out = {}
def opts(parser):
    res = []
    for a in parser._actions:
        if a.option_strings: res.append(sorted(a.option_strings))
        elif not isinstance(a, argparse._SubParsersAction): res.append([a.dest])
    return res
out["launch"] = opts(launch.launch_command_parser())
out["env"] = opts(env.env_command_parser())
out["estimate-memory"] = opts(estimate.estimate_command_parser())
out["merge-weights"] = opts(merge.merge_command_parser())
out["to-fsdp2"] = opts(to_fsdp2.to_fsdp2_command_parser())
out["tpu-config"] = opts(tpu.tpu_command_parser())
out["test"] = opts(test.test_command_parser())
cp = get_config_parser(); out["config"] = opts(cp)
sub = [a for a in cp._actions if isinstance(a, argparse._SubParsersAction)][0]
out["config default"] = opts(sub.choices["default"])
out["config update"] = opts(sub.choices["update"])
json.dump(out, open(sys.argv[1], "w"), indent=1)
print({k: len(v) for k, v in out.items()})
