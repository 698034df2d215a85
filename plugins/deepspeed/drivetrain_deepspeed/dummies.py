"""Stand-ins for an optimizer and a scheduler that the DeepSpeed config defines (``"optimizer"`` /
``"scheduler"`` sections): a script passes them to ``prepare`` and DeepSpeed builds the real ones.

``DummyOptim`` is a real ``torch.optim.Optimizer`` (so ``prepare`` sees it as the model's optimizer); its
``lr``/``weight_decay``/other keyword arguments fill the config's ``"auto"`` optimizer parameters. A
``DummyScheduler`` registers itself on its ``DummyOptim`` so the engine built from that optimizer finds it.
"""

from __future__ import annotations

from typing import Any

import torch


class DummyOptim(torch.optim.Optimizer):
    """Placeholder for the optimizer of the DeepSpeed config. ``params`` as for any torch optimizer."""

    def __init__(self, params: Any, lr: float = 0.001, weight_decay: float = 0.0, **kwargs: Any) -> None:
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay})
        self.lr = lr
        self.weight_decay = weight_decay
        self.kwargs = kwargs
        self.scheduler: DummyScheduler | None = None

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        raise RuntimeError(
            "DummyOptim cannot step: pass it to accelerator.prepare() with its model so that DeepSpeed builds "
            'the optimizer of the config\'s "optimizer" section'
        )


class DummyScheduler:
    """Placeholder for the scheduler of the DeepSpeed config (or built by ``lr_scheduler_callable(optimizer)``
    when the config has no ``"scheduler"`` section). ``total_num_steps``/``warmup_num_steps`` fill its
    ``"auto"`` parameters."""

    def __init__(
        self,
        optimizer: DummyOptim,
        total_num_steps: int | None = None,
        warmup_num_steps: int = 0,
        lr_scheduler_callable: Any = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(optimizer, DummyOptim):
            raise TypeError(
                f"DummyScheduler needs the DummyOptim it schedules, got {type(optimizer).__name__}; with a real "
                "optimizer, use a real torch scheduler"
            )
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.lr_scheduler_callable = lr_scheduler_callable
        self.kwargs = kwargs
        #: the scheduler DeepSpeed built (set when the engine is created); it steps inside the engine
        self.engine_scheduler: Any = None
        optimizer.scheduler = self

    def step(self, *args: Any, **kwargs: Any) -> None:
        # The engine steps its scheduler with every optimizer step it takes (inside accelerator.backward).
        return None

    def get_last_lr(self) -> list[float]:
        if self.engine_scheduler is None:
            return [group["lr"] for group in self.optimizer.param_groups]
        return self.engine_scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        # Saved inside the engine's checkpoint.
        return self.engine_scheduler.state_dict() if self.engine_scheduler is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.engine_scheduler is not None and state_dict:
            self.engine_scheduler.load_state_dict(state_dict)
