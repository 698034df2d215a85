"""Started by test_ipex_multiprocess.py as ``drivetrain launch --num_processes 2 --ipex`` (ddp over gloo).

The script names no plugin: the launch flag asks for ipex. Each rank checks that ipex converted its model
and optimizer and that DDP wrapped the converted model, then compares its weights after training with one
process that converts the same model with ipex.optimize by hand and trains on the combined batches.
Prints ``CHECK <name> ok`` per passed check; a failed check raises.
"""

from __future__ import annotations

import sys

import intel_extension_for_pytorch as ipex
import torch
import torch.distributed as dist

from drivetrain import Accelerator

PER_RANK = 8
FEATURES = 6
STEPS = 4
#: |2 processes - 1 process| allowed: fp32 differs by summation order only (all-reduce vs one batch);
#: bf16 rounds the bf16 weights and the all-reduced bf16 gradients (measured: see the test's docstring).
TOLERANCE = {"no": 1e-6, "bf16": 2e-3}


def check(name: str, condition: bool, detail: str = "") -> None:
    if not condition:
        raise AssertionError(f"check {name} failed: {detail}")
    if dist.get_rank() == 0:
        print(f"CHECK {name} ok", flush=True)
        if detail:
            print(f"  {name}: {detail}", flush=True)


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def global_batches(processes: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    found = []
    for _ in range(STEPS):
        x = torch.randn(processes * PER_RANK, FEATURES, generator=generator)
        found.append((x, x.sum(dim=1, keepdim=True).sin()))
    return found


def weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [tensor.detach().float().clone() for tensor in model.state_dict().values()]


def max_difference(left: list[torch.Tensor], right: list[torch.Tensor]) -> float:
    return max(float((a - b).abs().max()) for a, b in zip(left, right, strict=True))


def one_process(precision: str, batches: list, prepack: bool) -> list[torch.Tensor]:
    """The same model converted with ipex.optimize by hand, trained on the combined batches."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    dtype = torch.bfloat16 if precision == "bf16" else None
    options = {} if prepack else {"weights_prepack": False}
    ipex.optimize(model, optimizer=optimizer, dtype=dtype, inplace=True, **options)
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            output = model(x)
        torch.nn.functional.mse_loss(output.float(), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    return weights(model)


def plain_torch(batches: list) -> list[torch.Tensor]:
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches:
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    return weights(model)


def main() -> None:
    from drivetrain_ipex.optimize import bf16_prepack_supported

    for precision in ("no", "bf16"):
        accelerator = Accelerator(mixed_precision=precision)
        rank, processes = accelerator.process_index, accelerator.num_processes
        model = make_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        prepared, prepared_optimizer = accelerator.prepare(model, optimizer)
        check(
            f"{precision}_ipex_converted_then_ddp_wrapped",
            hasattr(optimizer, "params_attr")
            and isinstance(prepared, torch.nn.parallel.DistributedDataParallel)
            and prepared.module is model
            and accelerator.unwrap_model(prepared) is model
            and {p.dtype for p in model.parameters()}
            == {torch.bfloat16 if precision == "bf16" else torch.float32},
            f"backend {accelerator.state.backend_name}, {processes} processes",
        )
        batches = global_batches(processes)
        for x, y in batches:
            rows = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
            accelerator.backward(torch.nn.functional.mse_loss(prepared(x[rows]).float(), y[rows]))
            prepared_optimizer.step()
            prepared_optimizer.zero_grad()
        mine = weights(model)
        gathered = [torch.cat([w.reshape(-1) for w in mine])]
        replicas = [torch.empty_like(gathered[0]) for _ in range(processes)]
        dist.all_gather(replicas, gathered[0])
        check(f"{precision}_replicas_equal", all(torch.equal(replicas[0], other) for other in replicas))
        prepack = precision != "bf16" or bf16_prepack_supported()
        difference = max_difference(mine, one_process(precision, batches, prepack))
        check(
            f"{precision}_equals_one_process",
            difference <= TOLERANCE[precision],
            f"max difference {difference:.2e} (allowed {TOLERANCE[precision]:g})",
        )
        if precision == "no":
            difference = max_difference(mine, plain_torch(batches))
            check("no_equals_plain_torch", difference <= TOLERANCE["no"], f"max difference {difference:.2e}")
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
