"""The properties that run inside the launched processes, one function each.

Every check runs identically on every rank (so ranks stay in step even when a check fails) and raises
:class:`PropertyFailure` with a reason a backend author can act on. Expected values come from the
reference backend ``local`` (the oracle run, compared by the runner) or from plain torch computing what
``local`` does: no wrapper, ``loss.backward()``, ``torch.autocast``.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

FEATURES = 6
#: Samples each process trains on per optimizer step.
PER_RANK = 4
TRAINING_STEPS = 3
_DTYPES = {"no": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class PropertyFailure(AssertionError):
    """A property does not hold; the message is the verdict's reason."""


class ConformanceNet(torch.nn.Module):
    """The user's model class (unwrap_model must hand this class back)."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = torch.nn.Linear(FEATURES, 16)
        self.out = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.hidden(x)))


def reference_loader(dataloader: Any, accelerator: Any) -> Any:
    """``dataloader`` sharded the way the reference backend shards it (not through the backend under test)."""
    from drivetrain.plugin_api import ShardingOptions
    from drivetrain.plugin_api.data import prepare_data_loader

    options = ShardingOptions(
        device=accelerator.device,
        num_processes=accelerator.num_processes,
        process_index=accelerator.process_index,
    )
    return prepare_data_loader(dataloader, **options.to_kwargs())


def make_model() -> ConformanceNet:
    torch.manual_seed(0)
    return ConformanceNet()


def make_data(count: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(count, FEATURES, generator=generator)
    y = torch.sin(x.sum(dim=1, keepdim=True))
    return x, y


class Context:
    """What a check needs: the backend under test, this process's place, and a place to record tensors."""

    def __init__(
        self,
        backend: str,
        info: Any,
        workdir: str,
        plugins: tuple[str, ...] = (),
        target_id: str = "",
        oracle_checkpoints: str | None = None,
    ) -> None:
        from drivetrain.plugin_api.state import PartialState

        state = PartialState(cpu=True, backend=backend)
        self.backend = backend
        self.info = info
        #: plugins every Accelerator of the checks names (``Accelerator(plugins=[...])``): a device or feature
        #: plugin checked over the backend (the oracle never names any)
        self.plugins = tuple(plugins)
        self.workdir = workdir
        self.target_id = target_id
        #: where the oracle saved the reference backend's recipe checkpoints (checkpoint_portable)
        self.oracle_checkpoints = oracle_checkpoints
        self.processes = state.num_processes
        self.rank = state.process_index
        self.tensors: dict[str, list[torch.Tensor]] = {}
        self.x, self.y = make_data()

    def accelerator(self, **kwargs: Any) -> Any:
        from drivetrain.plugin_api.tooling import Accelerator

        return Accelerator(backend=self.backend, cpu=True, plugins=list(self.plugins), **kwargs)

    def rows(self, step: int, rank: int | None = None, per_rank: int = PER_RANK) -> slice:
        """Rows of ``rank``'s share of global batch ``step`` (global batch = ``processes * per_rank`` rows)."""
        rank = self.rank if rank is None else rank
        start = step * self.processes * per_rank + rank * per_rank
        return slice(start, start + per_rank)

    def batch(self, step: int, rank: int | None = None, per_rank: int = PER_RANK) -> tuple[torch.Tensor, ...]:
        rows = self.rows(step, rank, per_rank)
        return self.x[rows], self.y[rows]


def loss_of(model: Any, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    # Batches are built on the CPU; a backend computing elsewhere (the xla backend's CPU device) gets them on
    # its model's device (a no-op for CPU models).
    device = next(model.parameters()).device
    x, y = (tensor.to(device) for tensor in batch)
    return torch.nn.functional.mse_loss(model(x).float(), y)


def parameters_of(model: Any) -> list[torch.Tensor]:
    """Current weights, read through the prepared model (independent of unwrap_model)."""
    return [_full(parameter) for parameter in model.parameters()]


def max_difference(left: list[torch.Tensor], right: list[torch.Tensor]) -> float:
    return max(float((a.float() - b.float()).abs().max()) for a, b in zip(left, right, strict=True))


def require_close(
    what: str,
    actual: list[torch.Tensor],
    expected: list[torch.Tensor],
    rtol: float = 1e-5,
    atol: float = 1e-6,
) -> None:
    if len(actual) != len(expected):
        raise PropertyFailure(f"{what}: {len(actual)} tensors, expected {len(expected)}")
    for a, e in zip(actual, expected):
        if a.shape != e.shape or not torch.allclose(a.float(), e.float(), rtol=rtol, atol=atol):
            raise PropertyFailure(
                f"{what}: max difference {max_difference(actual, expected):.3g} "
                f"(allowed {atol:g} + {rtol:g}*|expected|)"
            )


def reference_gradients(batch: tuple[torch.Tensor, ...], scale: float = 1.0) -> list[torch.Tensor]:
    """Gradients of the initial model on ``batch`` computed by plain torch (what ``local`` does)."""
    model = make_model()
    (loss_of(model, batch) * scale).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor on CPU in fp32, assembling a sharded DTensor (FSDP) on every rank."""
    tensor = tensor.detach()
    if hasattr(tensor, "full_tensor"):
        tensor = tensor.full_tensor()
    return tensor.float().cpu().clone()


def current_gradients(model: Any) -> list[torch.Tensor]:
    return [torch.zeros(p.shape) if p.grad is None else _full(p.grad) for p in model.parameters()]


# ---------------------------------------------------------------------------------------------------------
# Oracle: the reference backend on combined batches
# ---------------------------------------------------------------------------------------------------------
def train_steps(
    accelerator: Any, model: Any, optimizer: Any, batches: list[tuple[torch.Tensor, ...]]
) -> None:
    for batch in batches:
        accelerator.backward(loss_of(model, batch))
        optimizer.step()
        optimizer.zero_grad()


def oracle(ctx: Context, processes_counts: tuple[int, ...] = (1,), checkpoints: str | None = None) -> None:
    """What the reference backend ``local`` does in one process on the combined batches of N processes,
    for each N in ``processes_counts`` and each reference precision: SGD training, the AdamW recipe, and the
    mistakes the suite names when a backend does not match (gradients summed, schedule not applied).
    With ``checkpoints``, also the recipe's checkpoint after RESUME_AT steps (``local-N`` in that folder)."""
    for precision in ("no", "bf16", "fp16"):
        for processes in processes_counts:
            for name, lr in (("oracle", 0.1), ("oracle-summed", 0.1 * processes)):
                if name == "oracle-summed" and processes == 1:
                    continue
                accelerator = ctx.accelerator(mixed_precision=precision)
                model, optimizer = prepared_with_sgd(accelerator, ctx, lr=lr)
                x, y = ctx.x, ctx.y
                per_step = processes * PER_RANK
                batches = [
                    (x[s * per_step : (s + 1) * per_step], y[s * per_step : (s + 1) * per_step])
                    for s in range(TRAINING_STEPS)
                ]
                train_steps(accelerator, model, optimizer, batches)
                ctx.tensors[f"{name}/{precision}/{processes}"] = parameters_of(model)
            for name, variant in (
                ("recipe", {}),
                ("recipe-unbound", {"scheduler_bound": False}),
                ("recipe-unclipped", {"clip": False}),
            ):
                run = Recipe(ctx, precision, processes, combined=True, **variant)
                run.train(range(RECIPE_STEPS))
                run.record(ctx.tensors, f"{name}/{precision}/{processes}")
            if checkpoints is not None and precision == "no":
                run = Recipe(ctx, precision, processes, combined=True, portable=True)
                run.train(range(RESUME_AT))
                run.accelerator.save_state(os.path.join(checkpoints, f"local-{processes}"))
                ctx.tensors[f"recipe-at-resume/no/{processes}/moments"] = run.moments() or []


def resume_on_local(ctx: Context, folder: str, processes: int) -> None:
    """Load a backend's checkpoint (saved after RESUME_AT recipe steps on ``processes`` processes) with the
    reference backend, record the optimizer state it holds, train on to RECIPE_STEPS and record the weights."""
    run = Recipe(ctx, "no", processes, combined=True, portable=True)
    run.accelerator.load_state(folder)
    ctx.tensors["loaded-moments"] = run.moments() or []
    run.train(range(RESUME_AT, RECIPE_STEPS))
    ctx.tensors["resumed-weights"] = parameters_of(run.model)


# ---------------------------------------------------------------------------------------------------------
# Worker properties
# ---------------------------------------------------------------------------------------------------------
def training_loader(ctx: Context, batch_size: int = PER_RANK) -> torch.utils.data.DataLoader:
    """Prepared beside every model: some backends size their engine from the loader (DeepSpeed's "auto"
    micro batch size). The checks feed batches by hand, so the backend's sharding plays no part here."""
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ctx.x, ctx.y), batch_size=batch_size)


def prepare_training(
    ctx: Context, accelerator: Any, model: Any, *objects: Any, batch_size: int = PER_RANK
) -> tuple[Any, ...]:
    prepared = accelerator.prepare(model, *objects, training_loader(ctx, batch_size))
    return prepared[:-1]


def prepared_with_sgd(accelerator: Any, ctx: Context, lr: float = 0.1) -> tuple[Any, Any]:
    model = make_model()
    return prepare_training(ctx, accelerator, model, torch.optim.SGD(model.parameters(), lr=lr))


def training(ctx: Context) -> str:
    """Record this rank's weights after TRAINING_STEPS steps in each checked precision; the runner compares
    them with the oracle (one process on the combined batch)."""
    from drivetrain_conformance.properties import checked_precisions

    precisions = checked_precisions(ctx.info)
    for precision in precisions:
        accelerator = ctx.accelerator(mixed_precision=precision)
        model, optimizer = prepared_with_sgd(accelerator, ctx)
        train_steps(accelerator, model, optimizer, [ctx.batch(step) for step in range(TRAINING_STEPS)])
        ctx.tensors[f"training/{precision}"] = parameters_of(model)
    return "precisions: " + ", ".join(precisions)


def gradient_accumulation(ctx: Context) -> str:
    full = ctx.accelerator()
    model, optimizer = prepared_with_sgd(full, ctx)
    train_steps(full, model, optimizer, [ctx.batch(step) for step in range(2)])
    expected = parameters_of(model)
    del model, optimizer

    accelerator = ctx.accelerator(gradient_accumulation_steps=2)
    model, optimizer = prepared_with_sgd(accelerator, ctx)
    initial = parameters_of(model)
    flags = []
    for micro in range(4):
        x, y = ctx.batch(micro // 2)
        half = slice((micro % 2) * 2, (micro % 2) * 2 + 2)
        with accelerator.accumulate(model):
            accelerator.backward(loss_of(model, (x[half], y[half])))
            optimizer.step()
            optimizer.zero_grad()
        flags.append(accelerator.sync_gradients)
        if micro == 0 and max_difference(parameters_of(model), initial) != 0:
            raise PropertyFailure("the optimizer stepped on a non-boundary accumulation step")
    if flags != [False, True, False, True]:
        raise PropertyFailure(
            f"sync_gradients over 4 batches with 2 accumulation steps was {flags}, "
            "expected [False, True, False, True]"
        )
    require_close(
        "2 steps accumulating 2 half batches vs 2 steps on the full batches",
        parameters_of(model),
        expected,
        rtol=1e-4,
        atol=1e-6,
    )

    # The end of the data loader forces a sync (loader prepared by the reference backend: this property
    # is about accumulation, dataloader_modes checks the backend's own loaders).
    dataset = torch.utils.data.TensorDataset(ctx.x[: 6 * ctx.processes], ctx.y[: 6 * ctx.processes])
    loader = reference_loader(torch.utils.data.DataLoader(dataset, batch_size=2), accelerator)
    flags = []
    for batch in loader:
        with accelerator.accumulate(model):
            accelerator.backward(loss_of(model, batch))
            optimizer.step()
            optimizer.zero_grad()
        flags.append(accelerator.sync_gradients)
    if flags != [False, True, True]:
        raise PropertyFailure(
            f"sync_gradients over a 3-batch loader with 2 accumulation steps was {flags}, "
            "expected [False, True, True] (the loader's end forces a sync)"
        )
    return "boundaries and full-batch equality hold"


def require_direction(what: str, actual: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    """``actual`` is a positive multiple of ``expected``: where gradients come from, whatever their scale
    (the scale under accumulation is the gradient_accumulation property's business)."""
    flat_actual = torch.cat([t.reshape(-1).double() for t in actual])
    flat_expected = torch.cat([t.reshape(-1).double() for t in expected])
    scale = float(flat_actual @ flat_expected / (flat_expected @ flat_expected))
    if scale <= 0 or not torch.allclose(flat_actual, scale * flat_expected, rtol=1e-4, atol=1e-7):
        off = float((flat_actual - scale * flat_expected).abs().max())
        raise PropertyFailure(f"{what}: off by up to {off:.3g}")


#: The likely mistake when a synchronised backward leaves each process's own gradients.
NOT_AVERAGED_BY_BACKWARD = (
    "gradients must be averaged by the end of the synchronised backward (accelerator.backward), not later: "
    "clip_grad_norm_ reads them before optimizer.step()"
)


def no_sync(ctx: Context) -> str:
    accelerator = ctx.accelerator()
    model, optimizer = prepared_with_sgd(accelerator, ctx)
    accelerator.backward(loss_of(model, ctx.batch(0)) + loss_of(model, ctx.batch(1)))
    synchronised_once = current_gradients(model)
    if ctx.processes > 1:
        # What one synchronised backward leaves: the processes' gradients averaged (any positive multiple of
        # the average: the scale is multi_process_matches_combined_batch's business).
        every = [
            [
                a + b
                for a, b in zip(
                    reference_gradients(ctx.batch(0, rank)), reference_gradients(ctx.batch(1, rank))
                )
            ]
            for rank in range(ctx.processes)
        ]
        averaged = [sum(grads) / ctx.processes for grads in zip(*every)]
        try:
            require_direction("", synchronised_once, averaged)
        except PropertyFailure:
            own = every[ctx.rank]
            if max_difference(synchronised_once, own) <= 1e-5 * max(float(t.abs().max()) for t in own):
                raise PropertyFailure(
                    "gradients after a synchronised backward are this process's own, not averaged over the "
                    f"processes: {NOT_AVERAGED_BY_BACKWARD}"
                ) from None
            raise
    del model, optimizer

    model, optimizer = prepared_with_sgd(accelerator, ctx)
    with accelerator.no_sync(model):
        accelerator.backward(loss_of(model, ctx.batch(0)))
    require_close(
        "gradients after a backward inside no_sync() (expected this process's own gradients: the wrapped "
        "model's no_sync() must skip the gradient all-reduce)",
        current_gradients(model),
        reference_gradients(ctx.batch(0)),
    )
    accelerator.backward(loss_of(model, ctx.batch(1)))
    after = current_gradients(model)
    own_both = [a + b for a, b in zip(reference_gradients(ctx.batch(0)), reference_gradients(ctx.batch(1)))]
    if ctx.processes > 1 and max_difference(after, own_both) <= 1e-5 * max(
        float(t.abs().max()) for t in own_both
    ):
        raise PropertyFailure(
            "gradients after the synchronised backward that follows no_sync() are this process's own, not "
            f"averaged: {NOT_AVERAGED_BY_BACKWARD}"
        )
    require_close(
        "gradients after the synchronised backward that follows no_sync() (expected those of one "
        "synchronised backward of both losses)",
        after,
        synchronised_once,
        rtol=1e-4,
    )
    del model, optimizer

    accelerator = ctx.accelerator(gradient_accumulation_steps=2)
    model, optimizer = prepared_with_sgd(accelerator, ctx)
    with accelerator.accumulate(model):
        accelerator.backward(loss_of(model, ctx.batch(0)))
    require_direction(
        "gradients on a non-boundary accumulate() step (expected this process's own gradients)",
        current_gradients(model),
        reference_gradients(ctx.batch(0)),
    )
    with accelerator.accumulate(model):
        accelerator.backward(loss_of(model, ctx.batch(1)))
    require_direction(
        "gradients on the accumulate() boundary (expected a synchronised backward of both losses)",
        current_gradients(model),
        synchronised_once,
    )
    return "local inside no_sync and between boundaries, synchronised after"


def _expect(what: str, actual: Any, expected: Any) -> None:
    same = torch.equal(actual, expected) if isinstance(expected, torch.Tensor) else actual == expected
    if not same:
        raise PropertyFailure(f"{what}: got {actual!r}, expected {expected!r}")


def collectives(ctx: Context) -> str:
    accelerator = ctx.accelerator()
    n, r = ctx.processes, ctx.rank
    mine = torch.full((2, 3), float(r))
    in_order = torch.cat([torch.full((2, 3), float(rank)) for rank in range(n)])
    _expect("gather (rank order along dim 0)", accelerator.gather(mine), in_order)
    nested = accelerator.gather({"a": mine, "b": [mine * 2]})
    _expect("gather of a nested structure", nested["a"], in_order)
    _expect("gather of a nested structure", nested["b"][0], in_order * 2)

    from drivetrain import utils as operations

    _expect("gather_object", operations.gather_object([f"rank{r}"]), [f"rank{rank}" for rank in range(n)])
    _expect(
        "broadcast from the last process",
        operations.broadcast(torch.full((3,), float(r)), from_process=n - 1),
        torch.full((3,), float(n - 1)),
    )
    _expect(
        "broadcast_object_list from process 0",
        operations.broadcast_object_list([f"from{r}"], from_process=0),
        ["from0"],
    )
    _expect(
        "reduce sum",
        accelerator.reduce(torch.tensor([r + 1.0]), reduction="sum"),
        torch.tensor([n * (n + 1) / 2]),
    )
    _expect(
        "reduce mean",
        accelerator.reduce(torch.tensor([r + 1.0]), reduction="mean"),
        torch.tensor([(n + 1) / 2]),
    )
    ragged = torch.arange(1.0, r + 2)
    expected_padded = torch.cat([ragged, torch.zeros(n - r - 1)])
    _expect("pad_across_processes", accelerator.pad_across_processes(ragged), expected_padded)
    _expect(
        "pad_across_processes(pad_first=True)",
        accelerator.pad_across_processes(ragged, pad_first=True),
        torch.cat([torch.zeros(n - r - 1), ragged]),
    )
    items = list(range(2 * n + 1))
    with accelerator.split_between_processes(items) as share:
        shares = operations.gather_object([share])
    _expect(
        "split_between_processes (shares in rank order cover the inputs once)",
        [item for part in shares for item in part],
        items,
    )
    if r == n - 1:
        accelerator.set_trigger()
    _expect("check_trigger after the last process set it", accelerator.check_trigger(), True)
    _expect("check_trigger once it was seen", accelerator.check_trigger(), False)

    # gather_for_metrics drops exactly the samples added to even out the last batch.
    count = 2 * n * PER_RANK + 3
    loader = reference_loader(
        torch.utils.data.DataLoader(torch.arange(count), batch_size=PER_RANK), accelerator
    )
    gathered = torch.cat([accelerator.gather_for_metrics(batch) for batch in loader])
    _expect(f"gather_for_metrics over a {count}-sample loader", gathered, torch.arange(count))
    objects = [item for batch in loader for item in accelerator.gather_for_metrics(batch.tolist())]
    _expect("gather_for_metrics of Python objects", objects, list(range(count)))
    return "all documented results hold"


#: (mode, DataLoaderConfiguration fields, dataset kind, shuffle)
DATALOADER_MODES = (
    ("batch sampler sharding, even_batches", {}, "map", False),
    ("even_batches=False", {"even_batches": False}, "map", False),
    ("split_batches", {"split_batches": True}, "map", False),
    ("dispatch_batches", {"dispatch_batches": True}, "map", False),
    ("iterable dataset", {}, "iterable", False),
    ("seedable shuffled sampler", {"use_seedable_sampler": True, "data_seed": 7}, "map", True),
    # Each process starts from a different global random state: the loader must synchronise it (rng_types).
    ("shuffled sampler, processes seeded differently", {}, "map", True),
)
#: The likely mistake when a mode loses or repeats samples.
_MODE_HINTS = {
    "shuffled sampler, processes seeded differently": (
        "the processes shuffled differently: the random state is not synchronised at the start of the "
        "epoch (pass ShardingOptions.rng_types on to prepare_data_loader)"
    ),
}
_DEFAULT_MODE_HINT = "each process must get its own share of every batch (shard_dataloader / ShardingOptions)"


class _Numbers(torch.utils.data.IterableDataset):
    def __init__(self, count: int) -> None:
        self.count = count

    def __iter__(self):
        return iter(torch.arange(self.count).split(1))


def _global_batches(ctx: Context, batches: list[list[int]]) -> list[list[int]]:
    """Every rank's batches as global batches (batch ``s`` of every rank, ranks in order), gathered as
    rank-tagged objects so that the result does not depend on the gather's order."""
    from drivetrain import utils as operations

    per_rank = [rank_batches for _, rank_batches in sorted(operations.gather_object([(ctx.rank, batches)]))]
    steps = max(len(rank_batches) for rank_batches in per_rank)
    return [
        [item for rank_batches in per_rank if step < len(rank_batches) for item in rank_batches[step]]
        for step in range(steps)
    ]


def dataloader_modes(ctx: Context) -> str:
    from drivetrain import DataLoaderConfiguration

    count = 2 * ctx.processes * PER_RANK + 3
    problems, failed_modes = [], []
    for mode, config, kind, shuffle in DATALOADER_MODES:
        accelerator = ctx.accelerator(dataloader_config=DataLoaderConfiguration(**config))
        if mode in _MODE_HINTS:
            torch.manual_seed(1000 + ctx.rank)
        dataset = _Numbers(count) if kind == "iterable" else torch.arange(count)
        batch_size = PER_RANK * ctx.processes if config.get("split_batches") else PER_RANK
        loader = accelerator.prepare(
            torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=shuffle)
        )
        batches, ends, remainder = [], [], -1
        for batch in loader:
            batches.append(batch.reshape(-1).tolist())
            ends.append(accelerator.gradient_state.end_of_dataloader)
            remainder = accelerator.gradient_state.remainder
        if not batches or ends != [False] * (len(ends) - 1) + [True]:
            problems.append(
                f"{mode}: end_of_dataloader over the batches was {ends}, expected True only on the last"
            )
            continue
        global_batches = _global_batches(ctx, batches)
        sequence = [item for batch in global_batches for item in batch]
        if len(sequence) > count:
            # The documented padding (removed by gather_for_metrics): the last global batch keeps its first
            # `remainder` samples; a loader of unknown length pads at the very end.
            if remainder > 0:
                sequence = sequence[: len(sequence) - len(global_batches[-1]) + remainder]
            elif remainder == -1:
                sequence = sequence[:count]
        if sorted(sequence) != list(range(count)):
            missing = sorted(set(range(count)) - set(sequence))
            duplicates = len(sequence) - len(set(sequence))
            problems.append(
                f"{mode}: {len(sequence)} samples after removing the padding, expected each of "
                f"{count} once (missing {missing[:5]}, {duplicates} duplicated)"
            )
            failed_modes.append(mode)
        elif not shuffle and sequence != list(range(count)):
            problems.append(f"{mode}: samples out of order: {sequence[:12]}...")
    if problems:
        # A mode-specific mistake only when that mode alone loses samples (else sharding itself is wrong).
        hint = _MODE_HINTS.get(failed_modes[0], _DEFAULT_MODE_HINT) if len(failed_modes) == 1 else None
        raise PropertyFailure("; ".join(problems) + ": " + (hint or _DEFAULT_MODE_HINT))
    return f"{len(DATALOADER_MODES)} modes, {count} samples each"


def agree(ctx: Context, problem: str | None) -> None:
    """Raise on every rank when ``problem`` is set on any: a rank that fails alone would leave the others
    waiting in a collective of the next step."""
    if ctx.processes > 1:
        from drivetrain import utils as operations

        problems = [p for _, p in sorted(operations.gather_object([(ctx.rank, problem)])) if p]
        problem = problems[0] if problems else None
    if problem:
        raise PropertyFailure(problem)


#: The likely mistake when load_state refuses what save_state wrote.
MISFIT = (
    "what save_state wrote does not fit the objects it was saved from: optimizer state saved without "
    "consolidating its shards, or one process's shard saved as if it were the whole state?"
)


def _load_problem(
    ctx: Context,
    accelerator: Any,
    folder: str,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    saved: list[torch.Tensor],
    saved_state: list[torch.Tensor],
    saved_lr: list[float],
) -> str | None:
    """What load_state failed to restore on this rank, or None."""
    where = f"rank {ctx.rank}: " if ctx.processes > 1 else ""
    try:
        accelerator.load_state(folder)
    except Exception as exc:
        return (
            where + f"load_state raised {type(exc).__name__}: {' '.join(str(exc).split())[:300]} -- {MISFIT}"
        )
    if max_difference(parameters_of(model), saved) != 0:
        return where + (
            f"after load_state the weights differ from the saved ones by "
            f"{max_difference(parameters_of(model), saved):.3g}: load_state does not restore the model"
        )
    loaded_state = _state_tensors(optimizer)
    if len(loaded_state) != len(saved_state) or any(
        a.shape != b.shape or not torch.equal(a, b) for a, b in zip(loaded_state, saved_state)
    ):
        return where + (
            "after load_state the optimizer state this process holds differs from the one it saved: "
            "load_state does not restore the optimizer, or each process saved its shard under one name "
            "(a shard saved as if it were the whole state)"
        )
    if scheduler.get_last_lr() != saved_lr:
        return where + (
            f"after load_state the learning rate is {scheduler.get_last_lr()}, saved {saved_lr}: load_state "
            "does not restore the scheduler"
        )
    return None


def checkpoint_resume(ctx: Context) -> str:
    accelerator = ctx.accelerator()
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    model, optimizer, scheduler = prepare_training(ctx, accelerator, model, optimizer, scheduler)

    def steps(which: range) -> None:
        for step in which:
            accelerator.backward(loss_of(model, ctx.batch(step)))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()

    folder = os.path.join(ctx.workdir, f"checkpoint-{ctx.target_id or ctx.backend}")
    steps(range(2))
    saved = parameters_of(model)
    saved_state = [t.detach().clone() for t in _state_tensors(optimizer)]
    saved_lr = scheduler.get_last_lr()
    accelerator.save_state(folder)
    steps(range(2, 4))
    uninterrupted = parameters_of(model)
    agree(
        ctx,
        _load_problem(ctx, accelerator, folder, model, optimizer, scheduler, saved, saved_state, saved_lr),
    )
    steps(range(2, 4))
    resumed = parameters_of(model)
    if max_difference(resumed, uninterrupted) != 0:
        raise PropertyFailure(
            f"training on after load_state differs from the uninterrupted run by "
            f"{max_difference(resumed, uninterrupted):.3g} although weights, optimizer state and learning rate "
            "were restored (random state or gradient scaler state not restored?)"
        )
    return "bit-identical continuation (model, Adam, StepLR)"


def prepare_synchronises_weights(ctx: Context) -> str:
    """Processes seeded differently build different initial weights (a script that seeds by rank, or forgets
    ``set_seed``); after ``prepare`` every process must hold process 0's, and keep training in step. Every
    other property starts all processes from the same weights, so only this one sees a backend that never
    broadcasts them."""
    from drivetrain import utils as operations

    torch.manual_seed(100 + ctx.rank)
    model = ConformanceNet()
    initial = [p.detach().clone() for p in model.parameters()]
    first = [weights for _, weights in sorted(operations.gather_object([(ctx.rank, initial)]))][0]
    accelerator = ctx.accelerator()
    model, optimizer = prepare_training(ctx, accelerator, model, torch.optim.SGD(model.parameters(), lr=0.1))
    held = parameters_of(model)
    every = [weights for _, weights in sorted(operations.gather_object([(ctx.rank, held)]))]
    problem = None
    if any(max_difference(weights, every[0]) != 0 for weights in every[1:]):
        problem = (
            "after prepare the processes hold different weights (they were seeded differently before building "
            "the model): wrap_model must broadcast the parameters and buffers from process 0 when it wraps "
            "(torch's DDP does; a wrapper of your own calls torch.distributed.broadcast(tensor, src=0) on each)"
        )
    elif max_difference(held, first) != 0:
        problem = (
            f"after prepare every process holds the same weights, but not process 0's initial ones (max "
            f"difference {max_difference(held, first):.3g}): broadcast from process 0"
        )
    agree(ctx, problem)
    train_steps(accelerator, model, optimizer, [ctx.batch(0)])
    every = [weights for _, weights in sorted(operations.gather_object([(ctx.rank, parameters_of(model))]))]
    if any(max_difference(weights, every[0]) != 0 for weights in every[1:]):
        raise PropertyFailure("after one training step from process 0's weights the processes disagree")
    return "every process holds process 0's initial weights after prepare"


def _same(left: list[torch.Tensor], right: list[torch.Tensor]) -> bool:
    return len(left) == len(right) and all(
        a.shape == b.shape and torch.equal(a, b) for a, b in zip(left, right)
    )


def checkpoint_per_process_state(ctx: Context) -> str:
    """A checkpoint taken while the processes hold different state loads back into each process as its
    own: its random state, its place in its share of a shuffled loader, its shard of a sharded backend's
    optimizer state; and the model the checkpoint holds is the main process's (the consolidated model of
    a sharded backend), also where the processes' weights diverged (a step inside ``no_sync()``)."""
    from drivetrain import utils as operations

    accelerator = ctx.accelerator()
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    count = 4 * ctx.processes * PER_RANK
    loader = torch.utils.data.DataLoader(torch.arange(count), batch_size=PER_RANK, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    batches = iter(loader)
    next(batches)
    train_steps(accelerator, model, optimizer, [ctx.batch(0)])
    caps = ctx.info.capabilities
    if ctx.processes > 1 and caps.local_gradients and not caps.sharded_state:
        # Each process steps on its own gradients: the weights diverge, as in a script stepping inside
        # no_sync(); Accelerate's checkpoint then holds the main process's model.
        with accelerator.no_sync(model):
            accelerator.backward(loss_of(model, ctx.batch(1)))
        optimizer.step()
        optimizer.zero_grad()
    every = [weights for _, weights in sorted(operations.gather_object([(ctx.rank, parameters_of(model))]))]
    main_model = every[0]
    diverged = any(not _same(weights, main_model) for weights in every[1:])
    own_state = [t.detach().clone() for t in _state_tensors(optimizer)] if caps.sharded_state else []
    torch.manual_seed(2000 + ctx.rank)  # each process's own random state
    folder = os.path.join(ctx.workdir, f"per-process-{ctx.target_id or ctx.backend}")
    accelerator.save_state(folder)
    expected_draw = torch.rand(4)
    expected_batch = next(batches).tolist()

    torch.manual_seed(0)  # whatever the process holds now must not survive the load
    problem = None
    where = f"rank {ctx.rank}: " if ctx.processes > 1 else ""
    try:
        accelerator.load_state(folder)
    except Exception as exc:
        problem = (
            where + f"load_state raised {type(exc).__name__}: {' '.join(str(exc).split())[:300]} -- {MISFIT}"
        )
    agree(ctx, problem)  # every process stops here if one could not load: the steps below are collective
    if problem is None:
        draw = torch.rand(4)
        batch = next(iter(loader)).tolist()
        loaded = parameters_of(model)
        if not _same(loaded, main_model):
            writer = next((r for r, weights in enumerate(every) if r > 0 and _same(loaded, weights)), None)
            if diverged and writer is not None:
                problem = (
                    f"{where}after load_state the model holds process {writer}'s weights, not the main "
                    "process's: the checkpoint's shared files must be written by the main process only "
                    "(every process wrote its own view into the same files)"
                )
            else:
                problem = (
                    f"{where}after load_state the model differs from the main process's model at the save by "
                    f"{max_difference(loaded, main_model):.3g}: the checkpoint must hold the main process's "
                    "(consolidated) model"
                )
        elif not torch.equal(draw, expected_draw):
            problem = (
                f"{where}after load_state the random state is not the one this process saved (each process "
                "restores its own)"
            )
        elif batch != expected_batch:
            problem = (
                f"{where}after load_state the loader's next batch is {batch}, expected {expected_batch} (this "
                "process's share of the batch that followed the save)"
            )
        elif caps.sharded_state and not _same([t.detach() for t in _state_tensors(optimizer)], own_state):
            problem = (
                f"{where}after load_state the optimizer state this process holds is not the shard it saved"
            )
    safetensors_file = os.path.join(folder, "model.safetensors")
    if problem is None and ctx.info.capabilities.portable_checkpoints and os.path.isfile(safetensors_file):
        from safetensors.torch import load_file

        stored = load_file(safetensors_file)
        keys = list(accelerator.unwrap_model(model).state_dict())
        if set(stored) != set(keys) or not _same([stored[k].float() for k in keys], main_model):
            problem = (
                "model.safetensors does not hold the main process's model under the user's module's keys "
                f"({sorted(stored)[:4]}...): with portable_checkpoints=True the file is the reference format"
            )
    agree(ctx, problem)
    return (
        "random state, loader position"
        + (", optimizer shard" if caps.sharded_state else "")
        + (" and the main process's diverged weights" if diverged else " and the model")
        + " restored per process"
    )


def unwrap_model(ctx: Context) -> str:
    accelerator = ctx.accelerator()
    original = make_model()
    keys = list(original.state_dict())
    model, optimizer = prepare_training(
        ctx, accelerator, original, torch.optim.SGD(original.parameters(), lr=0.1)
    )
    train_steps(accelerator, model, optimizer, [ctx.batch(0)])
    unwrapped = accelerator.unwrap_model(model)
    # isinstance, not type identity: FSDP2 shards in place by swapping in a subclass (FSDPConformanceNet).
    if not isinstance(unwrapped, ConformanceNet):
        raise PropertyFailure(
            f"unwrap_model returned {type(unwrapped).__name__}, expected the user's ConformanceNet"
        )
    if list(unwrapped.state_dict()) != keys:
        raise PropertyFailure(f"unwrapped state_dict keys {list(unwrapped.state_dict())} differ from {keys}")
    if not ctx.info.capabilities.sharded_state:
        require_close(
            "weights of the unwrapped module vs the prepared model after a step",
            [v.float().cpu() for v in unwrapped.state_dict().values()],
            parameters_of(model),
            0,
            0,
        )
    return "user's class, keys and trained weights"


def autocast(ctx: Context) -> str:
    from drivetrain import AutocastKwargs
    from drivetrain_conformance.properties import checked_precisions

    for precision in checked_precisions(ctx.info):
        accelerator = ctx.accelerator(mixed_precision=precision)
        layer = torch.nn.Linear(4, 4).to(accelerator.device)
        x = torch.randn(2, 4, generator=torch.Generator().manual_seed(0)).to(accelerator.device)
        with accelerator.autocast():
            dtype = layer(x).dtype
        _expect(
            f"dtype of a Linear under autocast() with mixed_precision={precision!r}",
            dtype,
            _DTYPES[precision],
        )
        with accelerator.autocast(autocast_handler=AutocastKwargs(enabled=False)):
            _expect("dtype under autocast(AutocastKwargs(enabled=False))", layer(x).dtype, torch.float32)
        model, _ = prepared_with_sgd(accelerator, ctx)
        _expect(
            f"output dtype of a prepared model with mixed_precision={precision!r}",
            model(x[:, :1].repeat(1, FEATURES)).dtype,
            torch.float32,
        )
    return "precisions: " + ", ".join(checked_precisions(ctx.info))


def second_accelerator(ctx: Context) -> str:
    first = ctx.accelerator()
    model_1, optimizer_1 = prepared_with_sgd(first, ctx)
    train_steps(first, model_1, optimizer_1, [ctx.batch(0)])
    second = ctx.accelerator()
    model_2, optimizer_2 = prepared_with_sgd(second, ctx)
    train_steps(second, model_2, optimizer_2, [ctx.batch(0)])
    train_steps(first, model_1, optimizer_1, [ctx.batch(1)])
    train_steps(second, model_2, optimizer_2, [ctx.batch(1)])
    require_close(
        "weights of the first and the second Accelerator's models after the same steps",
        parameters_of(model_1),
        parameters_of(model_2),
        0,
        0,
    )
    if max_difference(parameters_of(model_1), parameters_of(make_model())) == 0:
        raise PropertyFailure("the models did not train")
    return "both train, identically"


# ---------------------------------------------------------------------------------------------------------
# The recipe: AdamW, an LR scheduler, gradient accumulation and clipping, as a user trains
# ---------------------------------------------------------------------------------------------------------
#: Optimizer steps of the recipe; checkpoint_portable saves after RESUME_AT of them.
RECIPE_STEPS = 4
RESUME_AT = 2
RECIPE_ACCUMULATION = 2
#: Small enough that clipping changes the gradients on every step.
RECIPE_MAX_NORM = 0.05


def recipe_lambda(step: int) -> float:
    return 1.0 / (1.0 + step)


#: The backend settings ``drivetrain launch`` hands to the processes (docs/launching.md), as JSON.
BACKEND_SETTINGS_VARIABLE = "DRIVETRAIN_BACKEND_CONFIG"


@contextlib.contextmanager
def clipping_setting(info: Any, max_norm: float) -> Iterator[None]:
    """For a backend whose optimizer step clips by a setting of its own configuration
    (``Capabilities.clipping_setting``: DeepSpeed's and Megatron's ``gradient_clipping``) that setting at
    ``max_norm`` (0: no clipping) while the block runs, handed over the way ``drivetrain launch
    --<setting> <max_norm>`` does. Nothing for other backends: they clip in ``clip_grad_norm_`` only."""
    setting = info.capabilities.clipping_setting if info is not None else None
    if setting is None:
        yield
        return
    before = os.environ.get(BACKEND_SETTINGS_VARIABLE)
    os.environ[BACKEND_SETTINGS_VARIABLE] = json.dumps({**json.loads(before or "{}"), setting: max_norm})
    try:
        yield
    finally:
        if before is None:
            del os.environ[BACKEND_SETTINGS_VARIABLE]
        else:
            os.environ[BACKEND_SETTINGS_VARIABLE] = before


class Recipe:
    """One training run of the recipe: AdamW + LambdaLR + 2 accumulation steps + clip_grad_norm_.

    ``combined=False``: this rank trains its share of each global batch through the backend under test.
    ``combined=True``: one process trains on the combined batches of ``processes`` processes (the oracle);
    its scheduler advances ``processes`` steps per optimizer step, as the kernel's AcceleratedScheduler does
    when N processes each consume 1/N of a global batch. ``scheduler_bound=False`` is the mistake the suite
    names: the learning rate never follows the schedule."""

    def __init__(
        self,
        ctx: Context,
        precision: str,
        processes: int,
        combined: bool,
        scheduler_bound: bool = True,
        portable: bool = False,
        clip: bool = True,
    ) -> None:
        self.ctx, self.processes, self.combined = ctx, processes, combined
        self.scheduler_bound, self.clip = scheduler_bound, clip
        from drivetrain import GradScalerKwargs

        with clipping_setting(ctx.info, RECIPE_MAX_NORM if clip and not combined else 0.0):
            self.accelerator = ctx.accelerator(
                mixed_precision=precision,
                gradient_accumulation_steps=RECIPE_ACCUMULATION,
                # fp16's default initial loss scale (2**16) overflows on some micro batches and not on others,
                # so N processes would skip other steps than one process on the combined batch.
                kwargs_handlers=[GradScalerKwargs(init_scale=256.0)],
            )
            model = make_model()
            optimizer = torch.optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.01)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, recipe_lambda)
            if portable:
                # A checkpoint resumed on another number of processes: no data loader in it (a loader's
                # position is refused on another number of processes, by design).
                self.model, self.optimizer, self.scheduler = self.accelerator.prepare(
                    model, optimizer, scheduler
                )
            else:
                self.model, self.optimizer, self.scheduler = prepare_training(
                    ctx, self.accelerator, model, optimizer, scheduler
                )
        self.lrs: list[float] = []

    def micro_batch(self, step: int, micro: int) -> tuple[torch.Tensor, ...]:
        size = PER_RANK // RECIPE_ACCUMULATION
        ranks = range(self.processes) if self.combined else [self.ctx.rank]
        rows = [
            slice(start, start + size)
            for start in (step * self.processes * PER_RANK + rank * PER_RANK + micro * size for rank in ranks)
        ]
        return torch.cat([self.ctx.x[r] for r in rows]), torch.cat([self.ctx.y[r] for r in rows])

    def train(self, steps: range) -> None:
        accelerator, model = self.accelerator, self.model
        for step in steps:
            for micro in range(RECIPE_ACCUMULATION):
                with accelerator.accumulate(model):
                    accelerator.backward(loss_of(model, self.micro_batch(step, micro)))
                    if accelerator.sync_gradients and self.clip:
                        accelerator.clip_grad_norm_(model.parameters(), RECIPE_MAX_NORM)
                    self.optimizer.step()
                    if self.scheduler_bound:
                        self.scheduler.step()
                        if self.combined and accelerator.sync_gradients:
                            for _ in range(self.processes - 1):
                                self.scheduler.scheduler.step()
                    self.optimizer.zero_grad()
            # The learning rate of the optimizer the user holds, after the step (what the next step uses).
            self.lrs.append(float(self.optimizer.param_groups[0]["lr"]))

    def moments(self) -> list[torch.Tensor] | None:
        """AdamW's exp_avg and exp_avg_sq of every parameter, in parameter order, from the prepared
        optimizer's state_dict; None where that is not the whole state in torch's layout (sharded state)."""
        try:
            state = self.optimizer.state_dict()["state"]
        except Exception:
            return None
        count = len(list(self.model.parameters()))
        if sorted(state) != list(range(count)):
            return None
        try:
            return [_full(state[i][key]) for i in range(count) for key in ("exp_avg", "exp_avg_sq")]
        except KeyError:
            return None

    def record(self, tensors: dict[str, list[torch.Tensor]], key: str) -> None:
        tensors[f"{key}/weights"] = parameters_of(self.model)
        tensors[f"{key}/lrs"] = [torch.tensor(self.lrs, dtype=torch.float64)]
        moments = self.moments()
        if moments is not None:
            tensors[f"{key}/moments"] = moments


def recipe(ctx: Context) -> str:
    """Train the recipe in each checked precision; the runner compares weights, the learning rates and
    (where every rank holds it) AdamW's state with the reference backend on the combined batches."""
    from drivetrain_conformance.properties import checked_precisions

    precisions = checked_precisions(ctx.info)
    for precision in precisions:
        run = Recipe(ctx, precision, ctx.processes, combined=False)
        run.train(range(RECIPE_STEPS))
        run.record(ctx.tensors, f"recipe/{precision}")
    return "precisions: " + ", ".join(precisions)


def checkpoint_portable(ctx: Context) -> str:
    """Save the recipe after RESUME_AT steps (the runner resumes it on ``local``), and resume the reference
    backend's checkpoint of the same point here; the runner compares both continuations with the oracle."""
    run = Recipe(ctx, "no", ctx.processes, combined=False, portable=True)
    run.train(range(RESUME_AT))
    run.accelerator.save_state(os.path.join(ctx.workdir, f"portable-{ctx.target_id}"))
    del run
    local_checkpoint = os.path.join(ctx.oracle_checkpoints or "", f"local-{ctx.processes}")
    if not os.path.isdir(local_checkpoint):
        raise PropertyFailure(
            f"the reference backend's checkpoint {local_checkpoint} is missing (suite error)"
        )
    run = Recipe(ctx, "no", ctx.processes, combined=False, portable=True)
    problem = None
    try:
        run.accelerator.load_state(local_checkpoint)
    except Exception as exc:
        problem = (
            f"load_state of a checkpoint written by the reference backend raised {type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:300]}; the backend declares portable_checkpoints=True, so it must "
            "read the reference files (model.safetensors, optimizer.bin, scheduler.bin): return None from "
            "load_state to reuse the reference backend's reading"
        )
    agree(ctx, problem)
    run.train(range(RESUME_AT, RECIPE_STEPS))
    ctx.tensors["portable/resumed-from-local"] = parameters_of(run.model)
    return "saved, and resumed a reference checkpoint"


def _state_tensors(obj: Any, depth: int = 0, seen: set[int] | None = None) -> list[torch.Tensor]:
    """The tensors of an optimizer's per-parameter state this process holds: ``obj.state`` of the optimizer
    and of the optimizers it wraps (``.optimizer``, ``.optim``: AcceleratedOptimizer, ZeRO wrappers)."""
    seen = set() if seen is None else seen
    if obj is None or id(obj) in seen or depth > 3:
        return []
    seen.add(id(obj))
    found = []
    state = getattr(obj, "state", None)
    if isinstance(state, dict) and id(state) not in seen:  # wrappers often share their inner state dict
        seen.add(id(state))
        for per_parameter in state.values():
            if isinstance(per_parameter, dict):
                for tensor in per_parameter.values():
                    if isinstance(tensor, torch.Tensor) and tensor.dim() > 0 and id(tensor) not in seen:
                        seen.add(id(tensor))
                        found.append(tensor.to_local() if hasattr(tensor, "to_local") else tensor)
    for attribute in ("optimizer", "optim"):
        found += _state_tensors(getattr(obj, attribute, None), depth + 1, seen)
    return found


def _local_elements(tensors: Any) -> int:
    return sum((t.to_local() if hasattr(t, "to_local") else t).numel() for t in tensors)


def sharded_state(ctx: Context) -> str:
    """The ``sharded_state`` declaration matches what the processes hold after an AdamW step: sharded means
    some process holds less than the whole model + optimizer state; not sharded means every process holds it
    all."""
    from drivetrain import utils as operations

    run = Recipe(ctx, "no", ctx.processes, combined=False)
    run.train(range(1))
    model_whole = sum(p.numel() for p in make_model().parameters())
    whole = model_whole * 3  # weights, exp_avg, exp_avg_sq
    held = _local_elements(run.model.parameters()) + _local_elements(_state_tensors(run.optimizer))
    counts = [count for _, count in sorted(operations.gather_object([(ctx.rank, held)]))]
    declared = ctx.info.capabilities.sharded_state
    if declared and all(count >= whole for count in counts):
        raise PropertyFailure(
            f"the backend declares sharded_state=True but every process holds the whole model and AdamW "
            f"state ({counts} elements per rank, whole: {whole}): declare sharded_state=False"
        )
    if not declared and any(count < whole for count in counts):
        raise PropertyFailure(
            f"the backend declares sharded_state=False but processes hold only part of the model and AdamW "
            f"state ({counts} elements per rank, whole: {whole}): declare sharded_state=True (and make "
            "save_state gather the shards if its checkpoints should be portable)"
        )
    return f"elements held per rank {counts} (whole: {whole})"


def join_uneven_inputs(ctx: Context) -> str:
    """A backend declaring ``Capabilities.joinable`` is plain data parallelism as torch's ``Join`` knows it:
    its prepared models are ``Joinable`` (DDP), and process ``r`` training ``r + 1`` batches under
    ``join_uneven_inputs`` neither hangs nor ends with processes holding different weights (DDP's join hook
    shadows the missing all-reduces and hands every process the last one's model)."""
    from torch.distributed.algorithms.join import Joinable

    from drivetrain import utils as operations

    accelerator = ctx.accelerator()
    model, optimizer = prepared_with_sgd(accelerator, ctx)
    if not isinstance(model, Joinable):
        raise PropertyFailure(
            f"the backend declares joinable=True but prepares a {type(model).__name__}, not a torch Joinable "
            "(DistributedDataParallel is): torch's Join would refuse it; declare joinable=False"
        )
    # the optimizer too where it takes part in Join (a ZeroRedundancyOptimizer), as a script passes it
    joinables = [
        model,
        *(o for o in (optimizer, getattr(optimizer, "optimizer", None)) if isinstance(o, Joinable)),
    ]
    with accelerator.join_uneven_inputs(joinables, even_batches=False):
        train_steps(accelerator, model, optimizer, [ctx.batch(step) for step in range(ctx.rank + 1)])
    every = [weights for _, weights in sorted(operations.gather_object([(ctx.rank, parameters_of(model))]))]
    if any(max_difference(weights, every[0]) != 0 for weights in every[1:]):
        raise PropertyFailure(
            "after training different numbers of batches under join_uneven_inputs the processes hold "
            f"different weights (max difference {max(max_difference(w, every[0]) for w in every[1:]):.3g}): "
            "the prepared model's join hook must shadow the collectives of the processes still training and "
            "synchronise the final model (DistributedDataParallel's does)"
        )
    return f"Join over {', '.join(type(j).__name__ for j in joinables)}; processes trained 1 to {ctx.processes} batches"


#: What a check was doing, for a verdict when it raised something other than PropertyFailure (a torch error
#: alone does not say which promise broke).
DOING = {
    "one_process_matches_local": "training a model with SGD in each declared precision",
    "multi_process_matches_combined_batch": "training a model with SGD in each declared precision",
    "adamw_schedule_matches_local": (
        "training with AdamW, a LambdaLR scheduler, 2 accumulation steps and clip_grad_norm_ (wrap_optimizer "
        "must return an optimizer built like the user's: same class, param groups and settings)"
    ),
    "gradient_accumulation": "training under accumulate() with 2 accumulation steps",
    "no_sync": "backward passes inside no_sync() and accumulate()",
    "collectives": "the collectives of the DistributedEnvironment's Collectives",
    "dataloader_modes": "iterating the loaders shard_dataloader returned",
    "checkpoint_resume": "save_state / load_state of model, Adam and StepLR",
    "checkpoint_portable": "saving, or loading a reference checkpoint (AdamW, LambdaLR, no data loader)",
    "checkpoint_per_process_state": (
        "save_state / load_state while the processes hold different random states and weights"
    ),
    "prepare_synchronises_weights": "preparing a model whose processes built different initial weights",
    "sharded_state": "counting the model and AdamW state each process holds",
    "join_uneven_inputs": "training different numbers of batches per process under join_uneven_inputs",
    "unwrap_model": "unwrap_model after a training step",
    "autocast": "forward passes under accelerator.autocast()",
    "second_accelerator": "training with a second Accelerator beside the first",
}

CHECKS: dict[str, Callable[[Context], str]] = {
    "one_process_matches_local": training,
    "multi_process_matches_combined_batch": training,
    "adamw_schedule_matches_local": recipe,
    "checkpoint_portable": checkpoint_portable,
    "checkpoint_per_process_state": checkpoint_per_process_state,
    "prepare_synchronises_weights": prepare_synchronises_weights,
    "sharded_state": sharded_state,
    "gradient_accumulation": gradient_accumulation,
    "no_sync": no_sync,
    "collectives": collectives,
    "dataloader_modes": dataloader_modes,
    "checkpoint_resume": checkpoint_resume,
    "join_uneven_inputs": join_uneven_inputs,
    "unwrap_model": unwrap_model,
    "autocast": autocast,
    "second_accelerator": second_accelerator,
}
