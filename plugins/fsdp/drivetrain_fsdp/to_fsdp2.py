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
import enum
import logging
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


# -- Accelerate's ``accelerate.commands.to_fsdp2`` names (tools and tests call them) ---------------------------
class ConversionStatus(enum.Enum):
    """Why an FSDP1 key has no FSDP2 counterpart (values of :data:`ARGUMENT_KEY_MAPPING`)."""

    NOT_YET_IMPLEMENTED = 0
    REMOVED = -1


#: FSDP1 key -> its FSDP2 key, or why it has none (Accelerate's table).
ARGUMENT_KEY_MAPPING: dict[str, Any] = {
    "fsdp_version": "fsdp_version",
    "fsdp_reshard_after_forward": "fsdp_reshard_after_forward",
    "fsdp_auto_wrap_policy": "fsdp_auto_wrap_policy",
    "fsdp_backward_prefetch": ConversionStatus.REMOVED,
    "fsdp_forward_prefetch": ConversionStatus.NOT_YET_IMPLEMENTED,
    "fsdp_cpu_ram_efficient_loading": "fsdp_cpu_ram_efficient_loading",
    "fsdp_offload_params": "fsdp_offload_params",
    "fsdp_sharding_strategy": "fsdp_reshard_after_forward",
    "fsdp_state_dict_type": "fsdp_state_dict_type",
    "fsdp_sync_module_states": ConversionStatus.REMOVED,
    "fsdp_transformer_layer_cls_to_wrap": "fsdp_transformer_layer_cls_to_wrap",
    "fsdp_min_num_params": "fsdp_min_num_params",
    "fsdp_use_orig_params": ConversionStatus.REMOVED,
    "fsdp_activation_checkpointing": "fsdp_activation_checkpointing",
}
#: FSDP1 values -> FSDP2 values, per key (sharding strategies become ``reshard_after_forward``).
ARGUMENT_VALUE_MAPPING = {
    key: dict(RESHARD_AFTER_FORWARD) for key in ("fsdp_sharding_strategy", "fsdp_reshard_after_forward")
}

logger = logging.getLogger(__name__)


def convert_config_to_fsdp2(config: dict[str, Any]) -> dict[str, Any]:
    """The config file's keys with ``fsdp_config`` converted to FSDP2 (what was dropped is logged)."""
    converted, notes = convert(config)
    for note in notes:
        logger.warning(note)
    return converted


def load_config(config_file: str) -> dict[str, Any]:
    """The YAML config file as a dict; an empty file is refused."""
    import yaml

    with open(config_file, encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    if not config:
        raise ValueError("Config file is empty")
    return config


def to_fsdp2_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``to-fsdp2`` parser (added to ``subparsers`` when given); ``args.func`` is :func:`to_fsdp2_command`."""
    description = "Convert an FSDP1 config file to FSDP2"
    if subparsers is not None:
        parser = subparsers.add_parser("to-fsdp2", description=description)
    else:
        parser = argparse.ArgumentParser(prog="drivetrain to-fsdp2", description=description)
    register_parser(parser)
    parser.set_defaults(func=to_fsdp2_command)
    return parser


def to_fsdp2_command(args: argparse.Namespace) -> None:
    """Convert ``args.config_file`` into ``args.output_file`` (or over itself with ``--overwrite``); raises
    FileNotFoundError, ValueError or FileExistsError on bad arguments, as Accelerate's does."""
    import yaml

    if not Path(args.config_file).exists():
        raise FileNotFoundError(f"Config file {args.config_file} not found")
    if not args.overwrite and args.output_file is None:
        raise ValueError("If --overwrite is not set, --output_file must be provided")
    if not args.overwrite and Path(args.output_file).exists():
        raise FileExistsError(f"Output file {args.output_file} already exists and --overwrite is not set")
    converted = convert_config_to_fsdp2(load_config(args.config_file))
    target = Path(args.output_file or args.config_file)
    target.write_text(yaml.safe_dump(converted, sort_keys=False), encoding="utf-8")


def main() -> None:
    to_fsdp2_command(to_fsdp2_command_parser().parse_args())
