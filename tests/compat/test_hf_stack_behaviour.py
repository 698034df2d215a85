"""What transformers, peft and trl rely on in Accelerate's behaviour (issue 28: found running them on
drivetrain). Each test asserts what Accelerate 1.15.0 does; drivetrain-accelerate serves these objects as
``accelerate.*``."""

from __future__ import annotations

import pytest
import torch

from drivetrain.big_modeling import get_max_memory
from drivetrain.config.dataclasses import TorchDynamoPlugin
from drivetrain.config.enums import (
    ComputeEnvironment,
    DistributedType,
    DynamoBackend,
    SageMakerDistributedType,
)


def test_dynamo_plugin_reads_none_as_accelerate_does(monkeypatch):
    # transformers' Trainer builds TorchDynamoPlugin(backend=None, mode=None, dynamic=None) when torch_compile
    # is off; Accelerate reads None as "the launcher's ACCELERATE_DYNAMO_* variable, else off".
    for name in ("BACKEND", "MODE", "USE_FULLGRAPH", "USE_DYNAMIC"):
        monkeypatch.delenv(f"ACCELERATE_DYNAMO_{name}", raising=False)
    plugin = TorchDynamoPlugin(backend=None, mode=None, fullgraph=None, dynamic=None)
    assert plugin.backend == DynamoBackend.NO
    assert plugin.fullgraph is False
    assert plugin.dynamic is None
    assert not plugin.enabled

    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "inductor")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_FULLGRAPH", "true")
    plugin = TorchDynamoPlugin(backend=None, mode=None, fullgraph=None)
    assert plugin.backend == DynamoBackend.INDUCTOR
    assert plugin.fullgraph is True


def test_dynamo_plugin_still_refuses_a_backend_that_does_not_exist():
    with pytest.raises(Exception, match=r"TorchDynamoPlugin.backend='nonsense' is not valid; choose one of"):
        TorchDynamoPlugin(backend="nonsense")


def test_get_max_memory_converts_the_callers_dict_in_place():
    # transformers' get_max_memory passes the user's max_memory on and then compares its values with the
    # returned ones: Accelerate converted them in place ("300KB" -> 300000), keys as given.
    max_memory = {"cpu": "300KB", "disk": "2GiB"}
    returned = get_max_memory(max_memory)
    assert max_memory == {"cpu": 300_000, "disk": 2 * 2**30}
    assert returned == {"cpu": 300_000, "disk": 2 * 2**30}
    assert returned is not max_memory
    untouched = {"cpu": 1024}
    get_max_memory(untouched)
    assert untouched == {"cpu": 1024}


def test_distributed_type_prints_as_accelerate_prints_it():
    # Accelerate declares these plain (str, Enum): str() and f-strings give 'Class.MEMBER' (Python 3.11),
    # while members still compare equal to their value.
    assert str(DistributedType.MULTI_CPU) == "DistributedType.MULTI_CPU"
    assert f"{DistributedType.DEEPSPEED}" == "DistributedType.DEEPSPEED"
    assert str(SageMakerDistributedType.NO) == "SageMakerDistributedType.NO"
    assert str(ComputeEnvironment.LOCAL_MACHINE) == "ComputeEnvironment.LOCAL_MACHINE"
    assert DistributedType.MULTI_CPU == "MULTI_CPU"
    assert DistributedType("FSDP") is DistributedType.FSDP
    # the enums Accelerate builds on its BaseEnum print their value
    assert str(DynamoBackend.INDUCTOR) == "INDUCTOR"


def test_dispatch_model_looks_check_device_map_up_at_call_time(monkeypatch):
    # transformers' skip_device_map_check swaps accelerate.big_modeling.check_device_map for a no-op around a
    # dispatch whose map leaves parameters out on purpose; the swap must reach dispatch_model.
    import drivetrain.big_modeling as big_modeling

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    incomplete = {"0": "cpu"}  # module "1" left out
    with pytest.raises(ValueError, match="1"):
        big_modeling.dispatch_model(model, incomplete)
    calls = []
    monkeypatch.setattr(big_modeling, "check_device_map", lambda *args: calls.append(args))
    big_modeling.dispatch_model(model, {"": "cpu"})
    assert calls == [(model, {"": "cpu"})]


def test_auto_device_map_of_a_gpt2_skeleton_is_accelerates():
    # The big-model recipe: build the skeleton under init_empty_weights, then infer a map. Accelerate's
    # init_empty_weights undoes the lm_head/wte tie transformers makes inside the block, so the head counts
    # and goes apart (to disk here); after model.tie_weights() it goes with the embedding. The expected
    # maps are Accelerate 1.15.0's with transformers 5.23.0.
    transformers = pytest.importorskip("transformers")
    from drivetrain.big_modeling import infer_auto_device_map, init_empty_weights

    config = transformers.GPT2Config(n_layer=1, vocab_size=50, n_embd=32, n_head=2, n_positions=64)
    with init_empty_weights():
        model = transformers.GPT2LMHeadModel(config)
    assert model.lm_head.weight is not model.transformer.wte.weight
    placed = infer_auto_device_map(model, max_memory={"cpu": "60KB"})
    assert dict(placed) == {
        "transformer.wte": "cpu",
        "transformer.wpe": "cpu",
        "transformer.drop": "cpu",
        "transformer.h.0.ln_1": "cpu",
        "transformer.h.0.attn": "cpu",
        "transformer.h.0.ln_2": "cpu",
        "transformer.ln_f": "disk",
        "lm_head": "disk",
        "transformer.h.0.mlp": "disk",
    }
    config = transformers.GPT2Config(n_layer=1, vocab_size=50, n_embd=16, n_head=2, n_positions=64)
    with init_empty_weights():
        model = transformers.GPT2LMHeadModel(config)
    model.tie_weights()
    placed = infer_auto_device_map(model, max_memory={"cpu": "10KB"})
    assert dict(placed) == {
        "transformer.wte": "cpu",
        "lm_head": "cpu",
        "transformer.wpe": "disk",
        "transformer.drop": "disk",
        "transformer.h": "disk",
        "transformer.ln_f": "disk",
    }


def test_a_state_set_up_automatically_takes_the_backend_the_first_accelerator_names():
    # transformers' TrainingArguments builds a PartialState before its Trainer builds the Accelerator with
    # fsdp_plugin= or deepspeed_plugin=: as in Accelerate, that names the backend; a choice made on purpose
    # still is never overridden.
    pytest.importorskip("drivetrain_fsdp")
    from drivetrain import Accelerator, PartialState
    from drivetrain.errors import ConfigurationError
    from drivetrain.state import reset_state

    try:
        state = PartialState(cpu=True)
        assert state.backend_name == "local"
        accelerator = Accelerator(backend="fsdp", cpu=True)
        assert accelerator.distributed_type == DistributedType.FSDP
        assert PartialState().backend_name == "fsdp"
        assert PartialState().backend_source.startswith("Accelerator(backend='fsdp'), after ")
        with pytest.raises(ConfigurationError, match="already runs backend 'fsdp'"):
            Accelerator(backend="local", cpu=True)
    finally:
        reset_state(destroy_process_group=True)


@pytest.mark.parametrize(
    ("samples", "drop_last", "remainder", "gathered"),
    [(10, False, 2, 10), (12, False, 0, 12), (10, True, -1, 8)],
)
def test_one_process_gather_for_metrics_cuts_a_batch_sized_last_result_as_accelerate(
    samples, drop_last, remainder, gathered
):
    # transformers' evaluation loop repeats each batch's loss to the *first* batch's size and gathers it with
    # gather_for_metrics; Accelerate cuts the last one to len(dataset) % batch_size on one process too, so the
    # short last batch counts once per real sample (the eval loss is the references).
    import drivetrain
    from drivetrain import Accelerator

    drivetrain.reset_state()
    accelerator = Accelerator(cpu=True)
    loader = accelerator.prepare(
        torch.utils.data.DataLoader(
            torch.arange(samples, dtype=torch.float32), batch_size=4, drop_last=drop_last
        )
    )
    first_size, kept = None, []
    for batch in loader:
        first_size = first_size or len(batch)
        loss = batch.mean()
        kept.append(accelerator.gather_for_metrics(loss.repeat(first_size)))
    assert loader.remainder == remainder
    assert sum(len(part) for part in kept) == gathered
    # the weighted mean over real samples: each batch's mean counted once per sample it holds
    expected = torch.arange(gathered, dtype=torch.float32).reshape(-1).split(4)
    assert torch.cat(kept).mean() == pytest.approx(
        sum(part.mean().item() * len(part) for part in expected) / gathered
    )
    drivetrain.reset_state()


def test_partial_state_backend_names_torch_distributed_backend_as_in_accelerate(tmp_path):
    # transformers' TrainingArguments(ddp_backend="gloo") builds PartialState(backend="gloo", timeout=...):
    # Accelerate's `backend` is torch.distributed's; a name that is no plugin's goes to init_process_group and
    # the plugin is chosen as if none were named (ddp on 2 processes). Real processes, launched as users do.
    import os
    import subprocess
    import sys

    script = tmp_path / "state.py"
    script.write_text(
        "import datetime, torch, torch.distributed as dist\n"
        "from drivetrain import PartialState\n"
        "state = PartialState(backend='gloo', timeout=datetime.timedelta(seconds=120))\n"
        "total = torch.tensor([state.process_index + 1.0])\n"
        "dist.all_reduce(total)\n"
        "print(f'rank {state.process_index}: {state.backend} {state.backend_name} {state.num_processes} "
        "{total.item()}', flush=True)\n"
        "state.destroy_process_group()\n"
    )
    env = {
        **{
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("DRIVETRAIN_", "ACCELERATE_"))
        },
        "OMP_NUM_THREADS": "1",
        "TMPDIR": str(tmp_path),
        "DRIVETRAIN_CONFIG_DIR": str(tmp_path / "no-config"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "drivetrain.launch", "--cpu", "--num_processes", "2", str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    import re

    # the two ranks' lines may reach the launcher's stdout interleaved
    lines = sorted(re.findall(r"rank \d: \S+ \S+ \d+ [\d.]+", done.stdout))
    assert lines == ["rank 0: gloo ddp 2 3.0", "rank 1: gloo ddp 2 3.0"], done.stdout


def test_partial_state_backend_still_names_plugins():
    from drivetrain import PartialState
    from drivetrain.errors import PluginError
    from drivetrain.state import reset_state

    try:
        assert PartialState(backend="local").backend_name == "local"
        reset_state()
        with pytest.raises(PluginError, match="unknown drivetrain plugin 'glooo'"):
            PartialState(backend="glooo")
    finally:
        reset_state()
