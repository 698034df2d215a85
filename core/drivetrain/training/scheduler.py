"""AcceleratedScheduler: keeps a learning-rate schedule in step with the optimizer steps that happened."""

from __future__ import annotations

import functools
import weakref
from typing import Any

from drivetrain.state import AcceleratorState, GradientState


class AcceleratedScheduler:
    """Wraps an LR scheduler.

    With ``step_with_optimizer`` (the default) it steps only when the optimizer did: not while gradients
    accumulate (but counts the step when ``adjust_scheduler``), not when fp16 skipped the step. When batches
    are not split, each data-parallel share (each process, without tensor parallelism) consumed 1/N of a global
    batch, so the schedule advances N steps per call, as a single process seeing the same data would.
    """

    def __init__(
        self, scheduler: Any, optimizers: Any, step_with_optimizer: bool = True, split_batches: bool = False
    ) -> None:
        self.scheduler = scheduler
        self.optimizers = optimizers if isinstance(optimizers, (list, tuple)) else [optimizers]
        self.step_with_optimizer = step_with_optimizer
        self.split_batches = split_batches
        self.gradient_state = GradientState()

    def step(self, *args: Any, **kwargs: Any) -> None:
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradient_state.sync_gradients:
            if self.gradient_state.adjust_scheduler:
                self.scheduler._step_count += 1
            return
        if any(getattr(optimizer, "step_was_skipped", False) for optimizer in self.optimizers):
            return
        # One step per share of the data: processes of one tensor-parallel group consumed the same batch.
        repeats = 1 if self.split_batches else AcceleratorState().environment.data_shards[0]
        total_steps = getattr(self.scheduler, "total_steps", None)
        for _ in range(repeats):
            # OneCycleLR raises past its last step; with uneven last batches we may get there.
            if total_steps is not None and self.scheduler._step_count > total_steps:
                break
            self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> Any:
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def get_lr(self) -> Any:
        return self.scheduler.get_lr()

    def print_lr(self, *args: Any, **kwargs: Any) -> Any:
        return self.scheduler.print_lr(*args, **kwargs)

    def __repr__(self) -> str:
        return f"AcceleratedScheduler({self.scheduler!r})"


def optimizers_stepping(scheduler: Any, prepared: list[Any], replaced: dict[int, Any]) -> list[Any]:
    """The prepared optimizers whose steps ``scheduler`` follows: the one it is bound to (rebound first when a
    plugin replaced the user's optimizer, DeepSpeed's engine optimizer or a ZeRO wrapper, so that it changes the
    learning rate of the optimizer that steps), else every prepared optimizer. ``replaced``: id of the user's
    optimizer -> its prepared replacement."""
    bound = getattr(scheduler, "optimizer", None)
    replacement = replaced.get(id(bound))
    if replacement is not None:
        rebind_scheduler(scheduler, replacement.optimizer)
        bound = replacement.optimizer
    return [
        optimizer for optimizer in prepared if bound is optimizer or bound is optimizer.optimizer
    ] or list(prepared)


def rebind_scheduler(scheduler: Any, optimizer: Any) -> None:
    """Make ``scheduler`` drive ``optimizer``, a replacement a plugin made for the one it was built with:
    the replacement's parameter groups get the schedule's current and initial learning rates, and its
    ``step`` is tracked the way torch's LR schedulers track the optimizer they are built with (so they do
    not warn that the optimizer stepped out of order)."""
    old_groups, new_groups = scheduler.optimizer.param_groups, optimizer.param_groups
    if len(old_groups) == len(new_groups):
        for old, new in zip(old_groups, new_groups):
            if old is not new:
                for key in ("lr", "initial_lr"):
                    if key in old:
                        new[key] = old[key]
    scheduler.optimizer = optimizer
    track_step_for_schedulers(optimizer)


def track_step_for_schedulers(optimizer: Any) -> None:
    """Wrap ``optimizer.step`` the way torch's LR schedulers do when they are built on an optimizer, unless
    it is wrapped already. Needed when a plugin replaced the optimizer, or replaced its ``step`` in place
    after a scheduler was built (a fused step): otherwise every ``scheduler.step()`` warns that the
    optimizer's step was overridden or not called."""
    step = optimizer.step
    if getattr(step, "_wrapped_by_lr_sched", False):
        return
    owner = weakref.ref(optimizer)

    @functools.wraps(step)
    def tracked_step(*args: Any, **kwargs: Any) -> Any:
        stepped = owner()
        if stepped is not None:
            stepped._opt_called = True
        return step(*args, **kwargs)

    tracked_step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    optimizer.step = tracked_step
