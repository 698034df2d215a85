"""``drivetrain to-fsdp2``: rewrite a config file's FSDP1 settings as FSDP2 ones (Accelerate's ``accelerate
to-fsdp2``). Works on Accelerate's format (the ``fsdp_config`` section) and drivetrain's (``backend: fsdp``
with a ``backend_config`` section).

What changes: ``fsdp_sharding_strategy`` becomes ``fsdp_reshard_after_forward`` (FULL_SHARD and HYBRID_SHARD:
true; the others: false); the settings FSDP2 has no use for are dropped, each with a note (``fsdp_backward_prefetch``,
``fsdp_forward_prefetch``, ``fsdp_sync_module_states``, ``fsdp_use_orig_params``); ``fsdp_version`` becomes 2.
Other keys are kept as they are.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

#: FSDP1 sharding strategy -> FSDP2's reshard_after_forward.
RESHARD_AFTER_FORWARD = {
    "FULL_SHARD": True,
    "SHARD_GRAD_OP": False,
    "HYBRID_SHARD": True,
    "HYBRID_SHARD_ZERO2": False,
    "NO_SHARD": False,
}
#: FSDP1 settings FSDP2 drops, and why.
DROPPED = {
    "backward_prefetch": "FSDP2 prefetches backward by itself",
    "backward_prefetch_policy": "FSDP2 prefetches backward by itself",
    "forward_prefetch": "not carried over to FSDP2 by Accelerate's converter",
    "sync_module_states": "FSDP2 needs no separate switch (cpu_ram_efficient_loading broadcasts)",
    "use_orig_params": "FSDP2 always keeps the original parameters",
}


def register_parser(parser: argparse.ArgumentParser) -> None:
    # both spellings, as Accelerate's parser takes them
    parser.add_argument(
        "--config_file", "--config-file", dest="config_file", required=True, help="the config file to convert"
    )
    parser.add_argument(
        "--output_file",
        "--output-file",
        dest="output_file",
        help="where to write the converted file (default: needs --overwrite)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="write the result over --config_file when --output_file is unset",
    )


def _strategy_name(value: Any) -> str:
    text = str(value).strip().upper()
    if text.isdigit() and 1 <= int(text) <= len(RESHARD_AFTER_FORWARD):
        return list(RESHARD_AFTER_FORWARD)[int(text) - 1]
    return text


def convert_section(section: dict[str, Any], prefix: str) -> tuple[dict[str, Any], list[str]]:
    """(the FSDP2 section, notes on what was dropped). ``prefix`` is ``"fsdp_"`` (Accelerate's keys) or ``""``
    (drivetrain's ``backend_config``; keys may still carry the prefix)."""
    converted: dict[str, Any] = {}
    notes: list[str] = []
    for key, value in section.items():
        bare = key.removeprefix("fsdp_")  # fsdp_version -> version
        if bare in DROPPED:
            notes.append(f"{key} dropped: {DROPPED[bare]}")
            continue
        if bare in ("sharding_strategy", "reshard_after_forward") and not isinstance(value, bool):
            strategy = _strategy_name(value)
            if strategy in RESHARD_AFTER_FORWARD:
                converted[f"{prefix}reshard_after_forward"] = RESHARD_AFTER_FORWARD[strategy]
                if strategy.startswith("HYBRID") or strategy == "NO_SHARD":
                    notes.append(
                        f"{key}: {strategy} becomes reshard_after_forward; describe its mesh with a "
                        "parallelism_config section (dp_replicate_size x dp_shard_size)"
                    )
                continue
        if bare == "version":
            continue
        converted[key] = value
    converted["fsdp_version"] = 2
    return converted, notes


def convert(config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The whole config file converted; notes say what was dropped or left as it was."""
    config = dict(config)
    if isinstance(config.get("fsdp_config"), dict) and config["fsdp_config"]:
        section, prefix, where = config["fsdp_config"], "fsdp_", "fsdp_config"
    elif config.get("backend") == "fsdp" and isinstance(config.get("backend_config"), dict):
        section, prefix, where = config["backend_config"], "", "backend_config"
    else:
        return config, [
            "no FSDP settings found (fsdp_config, or backend: fsdp with backend_config); nothing to do"
        ]
    version = section.get("fsdp_version", section.get("version", 1))
    if str(version) == "2":
        return config, [f"{where} already says fsdp_version: 2; nothing to do"]
    config[where], notes = convert_section(section, prefix)
    return config, notes


def run(args: argparse.Namespace) -> int:
    import yaml

    source = Path(args.config_file)
    if not source.is_file():
        print(f"error: config file {source} does not exist", file=sys.stderr)
        return 2
    if args.output_file is None and not args.overwrite:
        print("error: pass --output_file PATH, or --overwrite to replace --config_file", file=sys.stderr)
        return 2
    target = Path(args.output_file) if args.output_file else source
    if target.exists() and target != source and not args.overwrite:
        print(f"error: {target} exists; pass --overwrite to replace it", file=sys.stderr)
        return 2
    data = yaml.safe_load(source.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not data:
        print(f"error: config file {source} is empty or not a mapping", file=sys.stderr)
        return 2
    converted, notes = convert(data)
    for note in notes:
        print(note, file=sys.stderr)
    temporary = target.with_name(target.name + ".tmp")
    temporary.write_text(yaml.safe_dump(converted, sort_keys=False), encoding="utf-8")
    temporary.replace(target)
    print(f"wrote {target}")
    return 0
