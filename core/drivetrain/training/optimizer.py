"""AcceleratedOptimizer: steps only on gradient-sync boundaries and through the GradScaler in fp16."""

from __future__ import annotations

from typing import Any

import torch

from drivetrain.state import GradientState


class AcceleratedOptimizer(torch.optim.Optimizer):
    """Wraps the user's optimizer. ``step`` and ``zero_grad`` do nothing while gradients accumulate; with a
    GradScaler, ``step`` unscales, skips steps whose gradients overflowed (``step_was_skipped``) and updates
    the scale. Everything else is the wrapped optimizer's.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, scaler: Any = None) -> None:
        # Deliberately not calling Optimizer.__init__: this object shares the wrapped optimizer's state.
        self.optimizer = optimizer
        self.scaler = scaler
        self.gradient_state = GradientState()
        # Accelerate's attribute name: scripts written for it set or read `_is_overflow` directly.
        self._is_overflow = False

    # -- the wrapped optimizer's data ------------------------------------------------------------------
    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @property
    def param_groups(self) -> Any:  # type: ignore[override]
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: Any) -> None:
        self.optimizer.param_groups = value

    @property
    def defaults(self) -> Any:  # type: ignore[override]
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: Any) -> None:
        self.optimizer.defaults = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    # -- stepping --------------------------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.gradient_state.sync_gradients:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        if not self.gradient_state.sync_gradients:
            return None
        if self.scaler is None:
            self.step_was_skipped = False
            return self.optimizer.step(closure) if closure is not None else self.optimizer.step()
        scale_before = self.scaler.get_scale()
        result = (
            self.scaler.step(self.optimizer, closure)
            if closure is not None
            else self.scaler.step(self.optimizer)
        )
        self.scaler.update()
        # The scaler lowers its scale exactly when it skipped the step because of inf/nan gradients.
        self.step_was_skipped = self.scaler.get_scale() < scale_before
        return result

    def train(self) -> None:
        """For optimizers with a train/eval mode (schedule-free)."""
        if hasattr(self.optimizer, "train"):
            self.optimizer.train()

    def eval(self) -> None:
        if hasattr(self.optimizer, "eval"):
            self.optimizer.eval()

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last ``step`` was skipped (fp16 gradients overflowed); the scheduler does not step then."""
        return self._is_overflow

    @step_was_skipped.setter
    def step_was_skipped(self, value: bool) -> None:
        self._is_overflow = value

    @property
    def is_overflow(self) -> bool:
        return self._is_overflow

    def __getstate__(self) -> dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if key != "gradient_state"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.gradient_state = GradientState()

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"


def make_grad_scaler(state: Any, handler: Any) -> torch.amp.GradScaler | None:
    """The loss scaler of an fp16 run on ``state`` (torch's ``GradScaler``, with the script's
    ``GradScalerKwargs`` ``handler``), or None: other precisions need none, and a backend that manages precision
    (DeepSpeed's engine) scales the loss itself."""
    if state.mixed_precision != "fp16" or state.backend_info.manages_precision:
        return None
    return torch.amp.GradScaler(state.device.type, **(handler.to_kwargs() if handler else {}))


def unscale_gradients(scaler: Any, optimizer: Any, prepared: list[Any]) -> None:
    """Divide the gradients of ``optimizer`` (one, a list, or None: every ``prepared`` optimizer) by the fp16
    loss scale of ``scaler``; nothing without a scaler."""
    if scaler is None:
        return
    optimizers = (
        [optimizer] if optimizer is not None and not isinstance(optimizer, list) else (optimizer or prepared)
    )
    for each in optimizers:
        scaler.unscale_(each.optimizer if isinstance(each, AcceleratedOptimizer) else each)
