"""gather_for_metrics drops exactly the duplicated samples however the loader is consumed: a fresh iterator
taken for one batch, a loop broken early, two interleaved iterators, skip_first_batches. Run on 2 processes.

Prints ``CHECK <name> ok`` per check (drivetrain.testing.assert_checks_passed)."""

from __future__ import annotations

import torch

from drivetrain import Accelerator, skip_first_batches


def check(name: str, got: list, expected: list) -> None:
    if got != expected:
        raise AssertionError(f"{name}: gathered {got}, expected {expected}")
    if Accelerator().is_main_process:
        print(f"CHECK {name} ok", flush=True)


def gathered(accelerator: Accelerator, batch: torch.Tensor) -> list[int]:
    return accelerator.gather_for_metrics(batch).tolist()


def main() -> None:
    accelerator = Accelerator(cpu=True)
    # 9 samples, batch 5, 2 processes: one global batch of 10 with one duplicate.
    one_batch = accelerator.prepare(torch.utils.data.DataLoader(torch.arange(9), batch_size=5))
    check("next_iter", sorted(gathered(accelerator, next(iter(one_batch)))), list(range(9)))
    check("next_iter_again", sorted(gathered(accelerator, next(iter(one_batch)))), list(range(9)))

    # 22 samples, batch 3, 2 processes: 4 global batches of 6, the last holding 4 real samples.
    loader = accelerator.prepare(torch.utils.data.DataLoader(torch.arange(22), batch_size=3))
    for step, batch in enumerate(loader):
        if step == 1:
            middle = gathered(accelerator, batch)
            break
    check("loop_broken_early", sorted(middle), list(range(6, 12)))

    first, second = iter(loader), iter(loader)
    a = [gathered(accelerator, next(first))]
    b = [gathered(accelerator, next(second))]
    a += [gathered(accelerator, batch) for batch in first]
    b += [gathered(accelerator, batch) for batch in second]
    check("interleaved_first", sorted(sum(a, [])), list(range(22)))
    check("interleaved_second", sorted(sum(b, [])), list(range(22)))

    skipped = skip_first_batches(loader, 2)
    rest = [gathered(accelerator, batch) for batch in skipped]
    check("skip_first_batches", sorted(sum(rest, [])), list(range(12, 22)))
    full = [gathered(accelerator, batch) for batch in loader]
    check("full_loop_after_all_that", sorted(sum(full, [])), list(range(22)))
    accelerator.end_training()


if __name__ == "__main__":
    main()
