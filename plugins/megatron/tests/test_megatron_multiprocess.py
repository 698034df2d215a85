"""The megatron backend in real processes (gloo on loopback): tp=2 on 2 processes and tp=2 x dp=2 on 4 train a
model of megatron-core Column/RowParallelLinear layers to the same weights as the dense model trained by the
``local`` backend (tolerance: rtol=1e-5, atol=1e-6; float32 sums differ only in order), resume exactly from
save_state, and refuse a checkpoint saved with other degrees.

The pipeline (pp=2), micro-batch (num_micro_batches > 1) and sequence-parallel runs need megatron-core code that
allocates on CUDA; their scripts install ``scripts/cpu_device_shim.py`` first, a test-only stand-in that makes
``torch.cuda.current_device()`` answer the CPU (and ``synchronize`` a no-op, the schedules' one literal
``device="cuda"`` allocation land on the CPU, and megatron-core's CUDA RNG tracker keep the CPU generator's
state), so megatron-core's real schedules, gloo send/recv, DistributedDataParallel, sequence-parallel
collectives and GPTModel run unchanged; drivetrain-megatron itself is not patched."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from drivetrain.testing import assert_checks_passed, launch_script

SCRIPTS = Path(__file__).parent / "scripts"
sys.path.insert(0, str(SCRIPTS))
import megatron_checks as checks  # noqa: E402
import megatron_schedule as scheduled  # noqa: E402

RTOL, ATOL = 1e-5, 1e-6


def dense_with_local(
    initial: dict[str, torch.Tensor], batch_size: int
) -> tuple[dict[str, torch.Tensor], list]:
    """The same model as dense torch layers, trained by the reference backend on the whole batch."""
    from drivetrain import Accelerator, reset_state

    reset_state()
    accelerator = Accelerator(backend="local", cpu=True)
    model = torch.nn.ModuleDict(
        {"up": torch.nn.Linear(checks.HIDDEN, checks.FFN), "down": torch.nn.Linear(checks.FFN, checks.HIDDEN)}
    )
    model.load_state_dict(initial)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = torch.utils.data.DataLoader(checks.dataset(), batch_size=batch_size)
    prepared, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for _, (x, y) in zip(range(checks.STEPS), loader):
        out = model["down"](torch.nn.functional.gelu(model["up"](x)))
        loss = torch.nn.functional.mse_loss(out, y)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), checks.CLIP)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    reset_state()
    return {name: value.detach() for name, value in model.state_dict().items()}, losses


def assert_matches_dense(result_file: Path, batch_size: int) -> None:
    result = torch.load(result_file)
    dense, losses = dense_with_local(result["initial"], batch_size)
    for name, value in dense.items():
        torch.testing.assert_close(result["final"][name], value, rtol=RTOL, atol=ATOL, msg=name)
    assert result["losses"] == pytest.approx(losses, rel=RTOL, abs=ATOL)
    assert not torch.equal(result["final"]["up.weight"], result["initial"]["up.weight"])


@pytest.mark.multiprocess
@pytest.mark.slow
def test_tensor_and_data_parallel_match_dense_local(tmp_path):
    env = {
        "TMPDIR": str(tmp_path),
        "MEGATRON_OUT": str(tmp_path),
        "MEGATRON_TP": "2",
        "PYTHONWARNINGS": "ignore",
    }
    saved = tmp_path / "tp2_checkpoint"
    common = ["distributed_type", "state_plugin_is_script_object", "groups", "global_batch_size"]
    common += ["batches_per_share", "tp_peers_same_batch", "dp_shares_differ", "gather_for_metrics_dp_once"]
    common += ["reduce_over_all_processes", "scheduler_steps_per_share"]

    two = launch_script(str(SCRIPTS / "megatron_checks.py"), 2, env={**env, "MEGATRON_SAVE": str(saved)})
    assert_checks_passed(two, [*common, "resume_exact", "checkpoint_per_tp_rank"])
    assert_matches_dense(tmp_path / "train_2.pt", checks.BATCH)

    four = launch_script(str(SCRIPTS / "megatron_checks.py"), 4, env={**env, "MEGATRON_FOREIGN": str(saved)})
    assert_checks_passed(four, [*common, "other_degrees_refused"])
    assert_matches_dense(tmp_path / "train_4.pt", 2 * checks.BATCH)


def dense_pipeline_with_local(initial: dict[str, torch.Tensor], micro_batches: int, shares: int) -> tuple:
    """The 4 layers as one dense model, trained by ``local`` with gradient accumulation over the same
    micro-batches (``shares`` data-parallel shares of 2-row micro-batches make one accumulated step)."""
    from drivetrain import Accelerator, reset_state

    reset_state()
    accelerator = Accelerator(backend="local", cpu=True, gradient_accumulation_steps=micro_batches)
    layers = torch.nn.ModuleList(torch.nn.Linear(scheduled.HIDDEN, scheduled.HIDDEN) for _ in range(4))
    layers.load_state_dict(initial)
    optimizer = torch.optim.SGD(layers.parameters(), lr=0.1, momentum=0.9)
    # a share's micro-batch i and the other shares' micro-batch i together: 2 x shares rows
    loader = torch.utils.data.DataLoader(scheduled.dataset(), batch_size=2 * shares)
    layers, optimizer, loader = accelerator.prepare(layers, optimizer, loader)
    rows = list(scheduled.dataset())
    losses, step_loss = [], 0.0
    for index in range(scheduled.STEPS * micro_batches):
        step, micro = divmod(index, micro_batches)
        # share s of step t holds rows [(t * shares + s) * 2m, ... + 2m); micro-batch i is its rows 2i, 2i + 1
        picked = [
            rows[(step * shares + share) * 2 * micro_batches + 2 * micro + offset]
            for share in range(shares)
            for offset in range(2)
        ]
        x = torch.stack([row[0] for row in picked])
        y = torch.stack([row[1] for row in picked])
        with accelerator.accumulate(layers):
            hidden = x
            for layer in layers:
                hidden = torch.tanh(layer(hidden))
            loss = torch.nn.functional.mse_loss(hidden, y)
            accelerator.backward(loss)
            step_loss += loss.item() / micro_batches
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(layers.parameters(), scheduled.CLIP)
            optimizer.step()
            optimizer.zero_grad()
        if micro == micro_batches - 1:
            losses.append(step_loss)
            step_loss = 0.0
    reset_state()
    return {name: value.detach() for name, value in layers.state_dict().items()}, losses


def assert_scheduled_matches_dense(result_file: Path, micro_batches: int, shares: int) -> None:
    result = torch.load(result_file)
    dense, losses = dense_pipeline_with_local(result["initial"], micro_batches, shares)
    for name, value in dense.items():
        torch.testing.assert_close(result["final"][name], value, rtol=RTOL, atol=ATOL, msg=name)
    assert result["losses"] == pytest.approx(losses, rel=RTOL, abs=ATOL)
    assert not torch.equal(result["final"]["0.weight"], result["initial"]["0.weight"])


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize(
    "mode, micro_batches, shares, checks_expected",
    [
        # pp=2: megatron-core's 1F1B schedule over 4 micro-batches, gloo send/recv between the stages
        ("pipeline", 4, 1, ["resume_exact", "checkpoint_per_stage"]),
        # pp=1, dp=2: forward_backward_no_pipelining over 2 micro-batches, megatron-core's DDP averaging
        ("micro", 2, 2, ["accumulate_keeps_gradients_local", "accumulate_averages_at_sync"]),
    ],
)
def test_megatron_schedule_matches_dense_local(tmp_path, mode, micro_batches, shares, checks_expected):
    env = {"TMPDIR": str(tmp_path), "MEGATRON_OUT": str(tmp_path), "MEGATRON_MODE": mode}
    env["PYTHONWARNINGS"] = "ignore"
    if mode == "micro":  # the data-parallel run also reads an indexed dataset (2 shares, 2 micro-batches)
        documents = write_indexed_dataset(tmp_path / "corpus")
        env["MEGATRON_DATA"] = str(tmp_path / "corpus")
        checks_expected = [*checks_expected, "train_labels_shifted", "valid_labels_shifted"]
        checks_expected += [
            "gpt_step_scheduled_loss",
            "gpt_step_trains_shares_alike",
            "accumulate_equals_one_call",
        ]
    result = launch_script(str(SCRIPTS / "megatron_schedule.py"), 2, env=env)
    common = ["groups", "global_batch_size", "loss_on_every_stage", "eval_loss_on_every_stage"]
    assert_checks_passed(result, [*common, *checks_expected])
    assert_scheduled_matches_dense(tmp_path / f"{mode}.pt", micro_batches, shares)
    if mode == "micro":
        assert_indexed_splits(torch.load(tmp_path / "indexed.pt"), documents)


#: token counts of the documents written to the indexed dataset (each ends with the eod token 0)
DOCUMENT_LENGTHS = [5, 7, 3, 9, 6, 4, 8, 5]


def write_indexed_dataset(prefix: Path) -> list[list[int]]:
    """A real .bin/.idx pair written by megatron-core's IndexedDatasetBuilder: 8 documents of distinct
    tokens, each closed by the end-of-document token 0."""
    import numpy
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder, get_bin_path, get_idx_path

    documents = [
        [100 + 10 * index + offset for offset in range(length - 1)] + [0]
        for index, length in enumerate(DOCUMENT_LENGTHS)
    ]
    builder = IndexedDatasetBuilder(get_bin_path(str(prefix)), dtype=numpy.uint16)
    for document in documents:
        builder.add_document(torch.tensor(document), [len(document)])
    builder.finalize(get_idx_path(str(prefix)))
    return documents


def follows_documents(sample: list[int], documents: list[list[int]]) -> bool:
    """Whether ``sample`` is a window of documents joined end to end: inside a document the next token,
    after a document's last token its end-of-document 0, after a 0 the first token of some document."""
    next_in_document = {a: b for document in documents for a, b in zip(document, document[1:])}
    starts = {document[0] for document in documents}
    return all((b in starts) if a == 0 else next_in_document.get(a) == b for a, b in zip(sample, sample[1:]))


def assert_indexed_splits(seen: dict, documents: list[list[int]]) -> None:
    """Split 6:1:1 by document (6, 1 and 1 of the 8); a split's documents, in megatron-core's seeded
    shuffled order, joined into one token stream cut into samples of seq_length + 1 = 5 tokens overlapping by
    one (a sample's last label is the next sample's first token). Over 2 data-parallel shares of one-sample
    micro-batches x 2 micro-batches, gather_for_metrics returns every sample exactly once."""
    # 34 train tokens -> (34 - 1) // 4 = 8 samples: 2 steps of 2 shares x 2 samples; 8 valid tokens and 5
    # test tokens -> 1 sample each (one batch per share, the second share's a padding copy that
    # gather_for_metrics drops)
    assert (len(seen["train"]), len(seen["valid"]), len(seen["test"])) == (8, 1, 1)
    assert (seen["train_batches"], seen["valid_batches"], seen["test_batches"]) == (2, 1, 1)
    for name, chosen in (("valid", documents[6]), ("test", documents[7])):  # one document: one order
        expected = sorted(chosen[4 * index : 4 * index + 5] for index in range((len(chosen) - 1) // 4))
        assert sorted(seen[name]) == expected, name
    train_documents = documents[:6]
    assert all(follows_documents(sample, train_documents) for sample in seen["train"]), seen["train"]
    # the 8 samples tile 32 distinct stream positions: no token drawn twice, none from another split
    heads = [token for sample in seen["train"] for token in sample[:4] if token != 0]
    assert len(heads) == len(set(heads))
    assert set(heads) <= {token for document in train_documents for token in document}
    assert len(heads) + sum(sample[:4].count(0) for sample in seen["train"]) == 32


def dense_sequence_mlp_with_local(initial: dict[str, torch.Tensor]) -> tuple:
    from drivetrain import Accelerator, reset_state

    reset_state()
    accelerator = Accelerator(backend="local", cpu=True)
    model = torch.nn.ModuleDict(
        {
            "norm": torch.nn.LayerNorm(scheduled.HIDDEN),
            "up": torch.nn.Linear(scheduled.HIDDEN, scheduled.FFN),
            "down": torch.nn.Linear(scheduled.FFN, scheduled.HIDDEN),
        }
    )
    model.load_state_dict(initial)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = torch.utils.data.DataLoader(scheduled.dataset(), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for _, (x, y) in zip(range(scheduled.STEPS), loader):
        out = model["down"](torch.nn.functional.gelu(model["up"](model["norm"](x))))
        loss = torch.nn.functional.mse_loss(out, y)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), scheduled.CLIP)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    reset_state()
    return {name: value.detach() for name, value in model.state_dict().items()}, losses


@pytest.mark.multiprocess
@pytest.mark.slow
def test_sequence_parallel_matches_dense_local(tmp_path):
    """tp=2 with sequence_parallelism: each rank normalises half the sequence; the all-gather before the
    column-parallel matmul and the reduce-scatter after the row-parallel one are megatron-core's; the layer
    norm's and the row bias's gradients are summed over the tensor-parallel group by the backend."""
    env = {"TMPDIR": str(tmp_path), "MEGATRON_OUT": str(tmp_path), "MEGATRON_MODE": "sequence"}
    env["PYTHONWARNINGS"] = "ignore"
    result = launch_script(str(SCRIPTS / "megatron_schedule.py"), 2, env=env)
    assert_checks_passed(result, ["sequence_parallel_config", "tp_ranks_agree_on_norm"])
    saved = torch.load(tmp_path / "sequence.pt")
    dense, losses = dense_sequence_mlp_with_local(saved["initial"])
    for name, value in dense.items():
        torch.testing.assert_close(saved["final"][name], value, rtol=RTOL, atol=ATOL, msg=name)
    assert saved["losses"] == pytest.approx(losses, rel=RTOL, abs=ATOL)
    assert not torch.equal(saved["final"]["norm.weight"], saved["initial"]["norm.weight"])


@pytest.mark.multiprocess
@pytest.mark.slow
def test_gpt_model_pipeline_matches_the_whole_model_by_hand(tmp_path):
    """megatron-core's GPTModel in two pipeline stages with GPTTrainStep and the 1F1B schedule over 2
    micro-batches (3 SGD steps) ends with the weights of the whole GPTModel trained by hand in one process on
    the same micro-batches (same tolerance; here they came out identical)."""
    env = {"TMPDIR": str(tmp_path), "MEGATRON_OUT": str(tmp_path), "PYTHONWARNINGS": "ignore"}
    pipeline = launch_script(
        str(SCRIPTS / "megatron_schedule.py"), 2, env={**env, "MEGATRON_MODE": "gpt_pipeline"}
    )
    assert_checks_passed(pipeline, ["gpt_pipeline_trained"])
    reference = launch_script(
        str(SCRIPTS / "megatron_schedule.py"), 1, env={**env, "MEGATRON_MODE": "gpt_reference"}
    )
    assert_checks_passed(reference, ["gpt_reference_trained"])
    staged = torch.load(tmp_path / "gpt_pipeline.pt")
    whole = torch.load(tmp_path / "gpt_reference.pt")
    final = scheduled.stages_to_whole(staged["final"])
    assert set(final) == set(whole["final"])
    for name, value in whole["final"].items():
        torch.testing.assert_close(final[name], value, rtol=RTOL, atol=ATOL, msg=name)
    assert staged["losses"] == pytest.approx(whole["losses"], rel=RTOL, abs=ATOL)
    initial = scheduled.stages_to_whole(staged["initial"])
    assert not torch.equal(
        final["decoder.layers.1.mlp.linear_fc1.weight"], initial["decoder.layers.1.mlp.linear_fc1.weight"]
    )
