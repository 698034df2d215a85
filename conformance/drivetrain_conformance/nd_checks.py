"""The N-D layout properties, run inside the launched processes (see nd_suite.py).

Usage: ``python -m torch.distributed.run ... nd_checks.py --out DIR --backend NAME --layouts JSON`` where
JSON is a list of ``{"tp_size": 2, ...}``. For each layout every rank appends one JSON line per property to
``DIR/nd.rank<R>.jsonl``: ``{"layout": "tp=2", "property": ..., "ok": ..., "detail": ...}``.

Expected values are what the reference backend computes, by plain torch on the combined batch (no wrapper,
``loss.backward()``, SGD): every layout of N processes must train the model to the same weights.
"""

from __future__ import annotations

import argparse
import json
import os
import traceback
from typing import Any

import torch

FEATURES = 6
HIDDEN = 16
SEQUENCE = 8
#: Rows of one optimizer step, split over the data-parallel shares.
GLOBAL_BATCH = 8
STEPS = 3
LR = 0.1
#: fp32 training, differences only from summation order.
RTOL, ATOL = 1e-4, 1e-5
#: Megatron-style plan for the model below (used when the layout has a tp dimension).
TP_PLAN = {"hidden": "colwise", "out": "rowwise"}


class PropertyFailure(AssertionError):
    """An N-D property does not hold; the message is the verdict's reason."""


class NDNet(torch.nn.Module):
    """Works token by token, on ``(batch, features)`` or ``(batch, sequence, features)``."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = torch.nn.Linear(FEATURES, HIDDEN)
        self.out = torch.nn.Linear(HIDDEN, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.hidden(x)))


def make_model() -> NDNet:
    torch.manual_seed(0)
    return NDNet()


def make_data(sequence: bool) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    shape = (STEPS * GLOBAL_BATCH, SEQUENCE, FEATURES) if sequence else (STEPS * GLOBAL_BATCH, FEATURES)
    x = torch.randn(*shape, generator=generator)
    return x, torch.sin(x.sum(dim=-1, keepdim=True))


def reference(sequence: bool, steps: int = STEPS) -> list[torch.Tensor]:
    """What the reference backend reaches on one process, training on whole global batches."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = make_data(sequence)
    for step in range(steps):
        rows = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
        torch.nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
        optimizer.step()
        optimizer.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def _full(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.detach()
    if hasattr(tensor, "full_tensor"):
        tensor = tensor.full_tensor()
    return tensor.float().cpu().clone()


def _require_close(what: str, actual: list[torch.Tensor], expected: list[torch.Tensor]) -> str:
    worst = max(float((a - e).abs().max()) for a, e in zip(actual, expected, strict=True))
    for a, e in zip(actual, expected):
        if not torch.allclose(a, e, rtol=RTOL, atol=ATOL):
            raise PropertyFailure(f"{what}: weights differ from the reference by up to {worst:.3g}")
    return f"max difference {worst:.1e}"


def layout_name(sizes: dict[str, int]) -> str:
    return " x ".join(f"{key.removesuffix('_size')}={value}" for key, value in sizes.items())


class Layout:
    """One layout's Accelerator and what its checks share."""

    def __init__(self, backend: str, sizes: dict[str, int], workdir: str) -> None:
        from drivetrain import Accelerator
        from drivetrain.plugin_api.state import reset_state
        from drivetrain.utils import ParallelismConfig, TorchTensorParallelConfig

        reset_state()
        handler = TorchTensorParallelConfig(tp_plan=TP_PLAN) if sizes.get("tp_size", 1) > 1 else None
        self.sizes = sizes
        self.config = ParallelismConfig(tp_handler=handler, **sizes)
        self.sequence = self.config.cp_size > 1
        self.accelerator = Accelerator(backend=backend, cpu=True, parallelism_config=self.config)
        self.workdir = workdir

    @property
    def shares(self) -> tuple[int, int]:
        options = self.accelerator.sharding_options(device_placement=False)
        return options.num_processes, options.process_index

    def prepared(self) -> tuple[Any, Any]:
        """A fresh model and optimizer, the only ones prepared (so a checkpoint holds just them)."""
        self.accelerator.free_memory()
        model = make_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        return self.accelerator.prepare(model, optimizer)

    def train(self, model: Any, optimizer: Any, steps: range) -> None:
        x, y = make_data(self.sequence)
        count, share = self.shares
        per_share = GLOBAL_BATCH // count
        for step in steps:
            first = step * GLOBAL_BATCH + share * per_share
            batch_x, batch_y = x[first : first + per_share].clone(), y[first : first + per_share].clone()
            with (
                self.accelerator.maybe_context_parallel(buffers=[batch_x, batch_y], buffer_seq_dims=[1, 1])
                if (self.sequence)
                else _nothing()
            ):
                self.accelerator.backward(torch.nn.functional.mse_loss(model(batch_x), batch_y))
            optimizer.step()
            optimizer.zero_grad()


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *args: Any) -> None:
        return None


def _gather_objects(value: Any) -> list[Any]:
    import torch.distributed as dist

    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


# -- the properties ------------------------------------------------------------------------------------------------
def nd_mesh(layout: Layout) -> str:
    mesh = layout.accelerator.torch_device_mesh
    wanted = {key.removesuffix("_size"): value for key, value in layout.sizes.items() if value > 1}
    if mesh is None:
        raise PropertyFailure("accelerator.torch_device_mesh is None: the backend built no mesh")
    found = {name: mesh[name].size() for name in wanted if name in (mesh.mesh_dim_names or ())}
    if found != wanted:
        raise PropertyFailure(f"the mesh has {dict(zip(mesh.mesh_dim_names, mesh.shape))}, expected {wanted}")
    return f"mesh {dict(zip(mesh.mesh_dim_names, mesh.shape))}"


def nd_data_parallel_shares(layout: Layout) -> str:
    """Ranks of one share see the same batches; the shares split the data, each sample once."""
    loader = layout.accelerator.prepare(torch.utils.data.DataLoader(torch.arange(24), batch_size=2))
    mine = [int(i) for batch in loader for i in batch]
    everyone = _gather_objects((layout.shares[1], mine))
    by_share: dict[int, list[int]] = {}
    for share, seen in everyone:
        if by_share.setdefault(share, seen) != seen:
            raise PropertyFailure(f"ranks of data-parallel share {share} saw different samples")
    count = layout.shares[0]
    if sorted(by_share) != list(range(count)):
        raise PropertyFailure(f"expected {count} data-parallel shares, found {sorted(by_share)}")
    together = sorted(i for seen in by_share.values() for i in seen)
    if together != list(range(24)):
        raise PropertyFailure(f"the shares do not cover the 24 samples once: {together}")
    return f"{count} share(s) of {len(mine)} samples"


def nd_gather_for_metrics(layout: Layout) -> str:
    loader = layout.accelerator.prepare(torch.utils.data.DataLoader(torch.arange(10), batch_size=3))
    seen = torch.cat([layout.accelerator.gather_for_metrics(batch) for batch in loader]).tolist()
    if sorted(seen) != list(range(10)):
        raise PropertyFailure(f"gather_for_metrics over 10 samples returned {seen}")
    return "each of 10 samples once"


def nd_training_matches_local(layout: Layout) -> str:
    model, optimizer = layout.prepared()
    layout.train(model, optimizer, range(STEPS))
    return _require_close("training", [_full(p) for p in model.parameters()], reference(layout.sequence))


def nd_checkpoint_resume(layout: Layout) -> str:
    folder = os.path.join(layout.workdir, "nd_checkpoint_" + layout_name(layout.sizes).replace(" ", ""))
    model, optimizer = layout.prepared()
    layout.train(model, optimizer, range(1))
    layout.accelerator.save_state(folder)
    model, optimizer = layout.prepared()
    layout.accelerator.load_state(folder)
    layout.train(model, optimizer, range(1, STEPS))
    return _require_close("resumed", [_full(p) for p in model.parameters()], reference(layout.sequence))


CHECKS = {
    "nd_mesh": nd_mesh,
    "nd_data_parallel_shares": nd_data_parallel_shares,
    "nd_gather_for_metrics": nd_gather_for_metrics,
    "nd_training_matches_local": nd_training_matches_local,
    "nd_checkpoint_resume": nd_checkpoint_resume,
}


def undeclared_dimension_refused(backend: str, dimension: str, processes: int) -> str:
    """A dimension the backend does not declare is refused, with an error naming the size and the backend."""
    from drivetrain import Accelerator
    from drivetrain.plugin_api import ConfigurationError
    from drivetrain.plugin_api.state import reset_state
    from drivetrain.utils import ParallelismConfig

    reset_state()
    try:
        Accelerator(
            backend=backend,
            cpu=True,
            parallelism_config=ParallelismConfig(**{f"{dimension}_size": processes}),
        )
    except ConfigurationError as exc:
        message = str(exc)
        if f"{dimension}_size={processes}" in message and backend in message:
            return message
        raise PropertyFailure(
            f"the error does not name {dimension}_size={processes} and {backend!r}: {message}"
        ) from None
    raise PropertyFailure(
        f"{dimension}_size={processes} was accepted, but the backend does not declare {dimension}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--backend", required=True)
    parser.add_argument("--layouts", required=True, help="JSON list of ParallelismConfig sizes")
    parser.add_argument("--undeclared", default="", help="a dimension the backend does not declare")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    path = os.path.join(args.out, f"nd.rank{rank}.jsonl")

    def emit(layout: str, prop: str, ok: bool, detail: str) -> None:
        with open(path, "a") as stream:
            stream.write(json.dumps({"layout": layout, "property": prop, "ok": ok, "detail": detail}) + "\n")

    def run(layout: str, prop: str, check: Any) -> None:
        try:
            emit(layout, prop, True, check())
        except Exception as exc:
            where = traceback.extract_tb(exc.__traceback__)[-1]
            detail = (
                str(exc)
                if isinstance(exc, PropertyFailure)
                else f"{type(exc).__name__}: {exc} (at line {where.lineno})"
            )
            emit(layout, prop, False, " ".join(detail.split()))

    for sizes in json.loads(args.layouts):
        name = layout_name(sizes)
        try:
            layout = Layout(args.backend, sizes, args.out)
        except Exception as exc:
            for prop in CHECKS:
                emit(name, prop, False, f"the layout did not start: {type(exc).__name__}: {exc}")
            continue
        for prop, check in CHECKS.items():
            run(name, prop, lambda check=check, layout=layout: check(layout))
    if args.undeclared:
        run(
            "-",
            "nd_undeclared_dimension_refused",
            lambda: undeclared_dimension_refused(args.backend, args.undeclared, processes),
        )
    from drivetrain.plugin_api.state import reset_state

    reset_state(destroy_process_group=True)
    with open(path, "a") as stream:
        stream.write(json.dumps({"finished": True}) + "\n")


if __name__ == "__main__":
    main()
