"""Config files from someone careless or hostile (issue 29, finding 4): alias bombs, huge files, deep
nesting, and random damage to real config files. Every case must end in the settings or one
:class:`ConfigurationError` of one line naming the file (never another exception, a hang or a memory
blow-up), through each way a config file is read: ``drivetrain launch --config_file``, the default file,
and ``DRIVETRAIN_CONFIG_FILE`` in a script.

CI runs ``DRIVETRAIN_FUZZ_CASES`` cases (default 300, a few seconds). More, with another seed:

    DRIVETRAIN_FUZZ_CASES=20000 DRIVETRAIN_FUZZ_SEED=7 python -m pytest tests/settings/test_config_fuzz.py -q

A failing case prints its number and mutation; rerun it alone with ``DRIVETRAIN_FUZZ_ONLY=<number>``.
"""

from __future__ import annotations

import os
import random
import resource
import subprocess
import sys
import textwrap

import pytest

from drivetrain.config import sources
from drivetrain.config.bounded_yaml import MAX_DEPTH, MAX_FILE_BYTES
from drivetrain.config.file import ConfigFile, load_config
from drivetrain.errors import ConfigurationError

CASES = int(os.environ.get("DRIVETRAIN_FUZZ_CASES", "300"))
SEED = int(os.environ.get("DRIVETRAIN_FUZZ_SEED", "0"))
ONLY = os.environ.get("DRIVETRAIN_FUZZ_ONLY")


def alias_bomb(levels: int = 9, width: int = 9, holder: str = "backend_config") -> str:
    """A mapping under ``holder`` whose entry ``a<N>`` lists the previous one ``width`` times:
    ``width ** levels`` strings once expanded (9 levels of 9: 387 million), from a few hundred bytes. The
    last entry is also anchored as ``&bomb`` for use elsewhere in the file."""
    lines = [f"{holder}:", "  a0: &a0 [" + ", ".join(["lol"] * width) + "]"]
    for level in range(1, levels):
        anchor = "bomb" if level == levels - 1 else f"a{level}"
        lines.append(f"  a{level}: &{anchor} [" + ", ".join([f"*a{level - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


#: Real config files, in both formats, that the mutations start from.
SEED_FILES = [
    textwrap.dedent(
        """\
        backend: ddp
        num_processes: 2
        use_cpu: true
        mixed_precision: bf16
        gradient_accumulation_steps: 4
        main_process_port: 29501
        monitor_interval: 0.5
        env:
          NCCL_DEBUG: WARN
          OMP_NUM_THREADS: 1
        backend_config:
          bucket_cap_mb: 25
        parallelism_config:
          dp_shard_size: 2
        """
    ),
    textwrap.dedent(
        """\
        compute_environment: LOCAL_MACHINE
        debug: false
        distributed_type: MULTI_GPU
        downcast_bf16: 'no'
        dynamo_config:
          dynamo_backend: INDUCTOR
        enable_cpu_affinity: false
        gpu_ids: all
        machine_rank: 0
        main_training_function: main
        mixed_precision: 'no'
        num_machines: 1
        num_processes: 2
        rdzv_backend: static
        same_network: true
        tpu_env: []
        tpu_use_cluster: false
        tpu_use_sudo: false
        use_cpu: false
        """
    ),
    textwrap.dedent(
        """\
        compute_environment: LOCAL_MACHINE
        distributed_type: FSDP
        fsdp_config:
          fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
          fsdp_sharding_strategy: FULL_SHARD
          fsdp_state_dict_type: SHARDED_STATE_DICT
        num_processes: 4
        """
    ),
]

#: What a mutation inserts or puts in place of a value.
TOKENS = [
    "&a ",
    "*a",
    "*undefined",
    "&x [*x]",
    "!!python/object/apply:os.system ['echo pwned']",
    "!!python/name:os.system",
    "!!binary AAAA====",
    "!!set {a, b}",
    "!!omap [a: 1]",
    "!!timestamp 2001-02-30",
    "2001-13-45",
    "9" * 5000,
    "-1",
    "0x1F",
    "0o17",
    "1e999",
    ".nan",
    "-.inf",
    "~",
    "''",
    '"\\x00"',
    '"\\uD800"',
    "[",
    "]",
    "{",
    "}",
    ": ",
    "- ",
    "? ",
    "|",
    ">-",
    "\t",
    "\x00",
    "\ufeff",
    "%YAML 1.1\n---\n",
    "\n---\n",
    "\n...\n",
    "<<: *a",
    "[1, [2, [3, [4]]]]",
    "{a: {b: {c: d}}}",
    "é€😀",
]


def _mutate(text: str, rng: random.Random) -> tuple[bytes, str]:
    """One random mutation of a config file's text; returns the bytes to write and what was done."""
    kind = rng.choice(
        ["flip", "truncate", "insert", "value", "duplicate", "indent", "bomb", "deep", "binary", "anchors"]
    )
    data = text.encode("utf-8")
    if kind == "flip":
        position = rng.randrange(len(data))
        data = data[:position] + bytes([rng.randrange(256)]) + data[position + 1 :]
        return data, f"flip byte {position}"
    if kind == "truncate":
        position = rng.randrange(len(data) + 1)
        return data[:position], f"truncate at {position}"
    lines = text.splitlines()
    line = rng.randrange(len(lines))
    if kind == "insert":
        token = rng.choice(TOKENS)
        position = rng.randrange(len(text) + 1)
        return (text[:position] + token + text[position:]).encode(
            "utf-8", "surrogatepass"
        ), f"insert {token!r}"
    if kind == "value":
        token = rng.choice(TOKENS)
        key = lines[line].split(":")[0]
        lines[line] = f"{key}: {token}"
        return "\n".join(lines).encode("utf-8", "surrogatepass"), f"line {line} value {token[:40]!r}"
    if kind == "duplicate":
        lines.insert(line, lines[line])
        return "\n".join(lines).encode(), f"duplicate line {line}"
    if kind == "indent":
        lines[line] = " " * rng.choice([1, 2, 3, 8]) + lines[line]
        return "\n".join(lines).encode(), f"indent line {line}"
    if kind == "bomb":
        levels, width = rng.randrange(2, 12), rng.randrange(2, 12)
        key = lines[line].split(":")[0]
        holder = rng.choice(["backend_config", "env", "parallelism_config", "fsdp_config", "extra"])
        lines = [text_line for text_line in lines if not text_line.startswith(holder + ":")]
        line = min(line, len(lines) - 1)
        key = lines[line].split(":")[0]
        lines[line] = f"{key}: *bomb"
        bomb = alias_bomb(levels, width, holder)
        return (bomb + "\n".join(lines)).encode(), f"alias bomb {width}**{levels} in {holder}, also as {key}"
    if kind == "deep":
        depth = rng.choice([MAX_DEPTH - 2, MAX_DEPTH + 1, 200])  # 100 000: its own test below
        key = lines[line].split(":")[0]
        lines[line] = f"{key}: " + "[" * depth + "]" * rng.choice([0, depth])
        return "\n".join(lines).encode(), f"nesting {depth} as {key}"
    if kind == "binary":
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 2000))), "random bytes"
    # anchors and aliases used as intended, around a real value
    key = lines[line].split(":")[0]
    lines[line] = f"{key}: &shared {lines[line].split(':', 1)[-1].strip() or '{}'}"
    lines.append(f"{rng.choice(['env', 'backend_config', 'extra'])}: *shared")
    return "\n".join(lines).encode(), f"anchor {key} reused"


def _check_outcome(load, path, case: str) -> None:
    try:
        outcome = load(path)
    except ConfigurationError as exc:
        message = str(exc)
        assert "\n" not in message and len(message) < 1500, f"{case}: not one line: {message[:3000]!r}"
        assert "config file" in message, f"{case}: the file is not named: {message!r}"
    except Exception as exc:  # the failure this test looks for
        raise AssertionError(f"{case}: {type(exc).__name__}: {exc}"[:3000]) from exc
    else:
        assert isinstance(outcome, (ConfigFile, tuple)), case


@pytest.fixture(scope="module")
def declarations():
    """What the installed plugins declare (FSDP's section, Accelerate's distributed types, ...)."""
    from drivetrain.contract.registry import get_plugin_registry

    return get_plugin_registry().config_declarations()


def _from_environment(path):
    """The DRIVETRAIN_CONFIG_FILE path, as a script's Accelerator reads it."""
    os.environ[sources.CONFIG_FILE_ENV] = str(path)
    try:
        return sources.config_file_values()
    finally:
        del os.environ[sources.CONFIG_FILE_ENV]


def test_fuzzed_config_files_load_or_fail_in_one_line(tmp_path, declarations):
    memory_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for number in [int(ONLY)] if ONLY else range(CASES):
        rng = random.Random(f"{SEED}-{number}")  # each case on its own, to rerun it alone
        seed = rng.choice(SEED_FILES)
        data, what = _mutate(seed, rng)
        path = tmp_path / f"case_{number}.yaml"
        path.write_bytes(data)
        case = f"case {number} ({what})"
        _check_outcome(lambda p: load_config(p, plugins=declarations), path, case)
        _check_outcome(_from_environment, path, case + " through DRIVETRAIN_CONFIG_FILE")
        path.unlink()
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - memory_before) / 1024
    assert grown_mb < 300, f"memory grew by {grown_mb:.0f} MB over the cases"


def test_an_alias_bomb_is_refused_in_one_line_naming_the_file(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text("backend: ddp\n" + alias_bomb())
    with pytest.raises(ConfigurationError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"config file {path} expands to more than") and "alias" in message
    with pytest.raises(ConfigurationError, match="DRIVETRAIN_CONFIG_FILE"):
        _from_environment(path)


def test_a_huge_config_file_is_refused_unread(tmp_path):
    path = tmp_path / "huge.yaml"
    with open(path, "wb") as handle:  # 100 MB of settings (sparse: the disk is not filled for it)
        handle.write(b"backend: ddp\n")
        handle.seek(100 * 1024 * 1024)
        handle.write(b"\nnum_processes: 2\n")
    with pytest.raises(
        ConfigurationError, match=r"is larger than 1024 KiB; a config file holds a few settings"
    ):
        load_config(path)
    # a file just under the limit is read (the limit is on size, not on what is in it)
    path.write_text(
        "env:\n" + "".join(f"  VARIABLE_{i}: '{'x' * 20}'\n" for i in range(MAX_FILE_BYTES // 64))
    )
    assert len(load_config(path).values["env"]) == MAX_FILE_BYTES // 64


def test_deep_nesting_is_refused_without_a_recursion_error(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("backend_config: " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ConfigurationError, match=f"nests deeper than {MAX_DEPTH} levels"):
        load_config(path)


def test_aliases_used_as_meant_still_load(tmp_path):
    """A block written once and reused (what anchors are for) reads as if written out twice."""
    path = tmp_path / "anchors.yaml"
    path.write_text(
        "env: &common\n  NCCL_DEBUG: WARN\n  OMP_NUM_THREADS: 2\nbackend: ddp\nbackend_config:\n  <<: *common\n"
        "  bucket_cap_mb: 25\n"
    )
    values = load_config(path).values
    assert values["env"] == {"NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": 2}
    assert values["backend_config"] == {"NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": 2, "bucket_cap_mb": 25}


def _environment(tmp_path) -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TMPDIR": str(tmp_path),
        "DRIVETRAIN_CONFIG_DIR": str(tmp_path / "no-config"),
    }


def test_launch_with_an_alias_bomb_config_file_is_one_line_and_exit_code_2(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text("backend: local\n" + alias_bomb())
    (tmp_path / "train.py").write_text("print('the script ran')\n")
    done = subprocess.run(
        [sys.executable, "-m", "drivetrain.launch", "--config_file", path, "train.py"],
        capture_output=True,
        text=True,
        env=_environment(tmp_path),
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 2 and "the script ran" not in done.stdout
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"drivetrain: error: config file {path} expands to more than"), done.stderr


def test_a_script_with_an_alias_bomb_in_drivetrain_config_file_gets_a_configuration_error(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb() + "mixed_precision: *bomb\n")
    script = (
        "from drivetrain import Accelerator\n"
        "from drivetrain.errors import ConfigurationError\n"
        "try:\n    Accelerator(cpu=True)\n"
        "except ConfigurationError as exc:\n    print('REFUSED', exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**_environment(tmp_path), sources.CONFIG_FILE_ENV: str(path)},
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert f"REFUSED config file {path} (from DRIVETRAIN_CONFIG_FILE) expands to more than" in done.stdout
