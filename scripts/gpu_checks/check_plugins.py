"""The installed plugins are discoverable: `drivetrain plugins` lists every backend the checks use."""

from __future__ import annotations

import subprocess
import sys

from common import run_checks

WANTED = ("local", "ddp", "fsdp", "deepspeed", "megatron", "fp8", "offload")


def listed():
    command = [
        sys.executable,
        "-c",
        "import sys; from drivetrain.commands.main import main; sys.exit(main())",
    ]
    output = subprocess.run([*command, "plugins"], capture_output=True, text=True, timeout=50)
    print(output.stdout, output.stderr)
    words = set(output.stdout.replace("|", " ").split())
    missing = [name for name in WANTED if name not in words]
    return (
        output.returncode == 0 and not missing,
        len(WANTED) - len(missing),
        f"of {len(WANTED)} plugins listed by `drivetrain plugins`; missing: {missing or 'none'}",
    )


if __name__ == "__main__":
    sys.exit(run_checks([("plugins_discoverable", listed)]))
