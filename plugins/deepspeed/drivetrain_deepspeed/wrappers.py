"""Accelerate's wrappers around what ``deepspeed.initialize`` returns (``accelerate.utils`` exports them).

The backend uses the first two itself: ``accelerator.backward`` drives a :class:`DeepSpeedEngineWrapper`, and
the optimizer ``prepare`` returns is a :class:`DeepSpeedOptimizerWrapper`. Because the engine steps inside
``backward``, the wrapped optimizer's and scheduler's own ``step``/``zero_grad`` do nothing.
"""

from __future__ import annotations

from typing import Any

from drivetrain.plugin_api.training import AcceleratedOptimizer, AcceleratedScheduler


class DeepSpeedEngineWrapper:
    """``backward`` for a ``DeepSpeedEngine``: one call per micro batch does the engine's backward, then
    ``engine.step()``, which updates (clips, steps the optimizer and a config-defined scheduler, zeroes the
    gradients) only when ``sync_gradients`` marks an accumulation boundary."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def backward(self, loss: Any, sync_gradients: bool = True, **kwargs: Any) -> None:
        """``kwargs`` go to ``engine.backward`` (``retain_graph``, ``scale_wrt_gas``)."""
        self.engine.set_gradient_accumulation_boundary(bool(sync_gradients))
        self.engine.backward(loss, **kwargs)
        self.before_step(bool(sync_gradients))
        # DeepSpeed counts micro steps in step() and updates only on boundaries, so it is called every time.
        self.engine.step()

    def before_step(self, boundary: bool) -> None:
        """Called between the backward and the step (the backend records a gradient norm here)."""

    def get_global_grad_norm(self) -> float | None:
        """The global gradient norm of the last update, as a number (None before the first one)."""
        norm = self.engine.get_global_grad_norm()
        return norm.item() if hasattr(norm, "item") else norm


class DeepSpeedOptimizerWrapper(AcceleratedOptimizer):
    """The engine's optimizer as ``prepare`` returns it: ``step``/``zero_grad`` do nothing (the engine did them
    in ``accelerator.backward``); ``step_was_skipped`` says whether the last update was skipped (fp16 overflow).
    ``engine``, when given, is asked (DeepSpeed's bf16/ZeRO optimizers do not all carry ``overflow``)."""

    def __init__(self, optimizer: Any, engine: Any = None) -> None:
        super().__init__(optimizer, scaler=None)
        self.engine = engine

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        return None

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        return None

    @property
    def step_was_skipped(self) -> bool:  # type: ignore[override]
        if self.engine is not None:
            return not self.engine.was_step_applied()
        return bool(getattr(self.optimizer, "overflow", False))

    @step_was_skipped.setter
    def step_was_skipped(self, value: bool) -> None:
        pass  # computed from the engine

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError(
            "a DeepSpeed engine's optimizer cannot be pickled; save it with accelerator.save_state()"
        )


class DeepSpeedSchedulerWrapper(AcceleratedScheduler):
    """A scheduler the engine steps itself (one from the DeepSpeed config's ``"scheduler"`` section):
    ``step`` does nothing; ``get_last_lr``/``state_dict`` read the engine's scheduler."""

    def __init__(self, scheduler: Any, optimizers: Any) -> None:
        super().__init__(scheduler, optimizers)

    def step(self, *args: Any, **kwargs: Any) -> None:
        return None
