"""The model wrapper the ddp backend returns from ``prepare``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class DrivetrainDDP(torch.nn.parallel.DistributedDataParallel):
    """``torch.nn.parallel.DistributedDataParallel`` plus ``trigger_sync_in_backward()``.

    It is a ``DistributedDataParallel`` in every other respect (``isinstance`` checks, ``.module``,
    ``no_sync()``, ``Join``), so code written against torch's class keeps working.
    """

    @contextlib.contextmanager
    def trigger_sync_in_backward(self) -> Iterator[None]:
        """Make the next backward all-reduce gradients even though the forward ran under ``no_sync()``.

        DDP decides in forward whether the coming backward synchronises; a forward run under ``no_sync``
        left the reducer unprepared, so it is prepared here (every parameter counts as used).
        """
        saved = (self.require_backward_grad_sync, self.require_forward_param_sync)
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self.reducer.prepare_for_backward([])
        try:
            yield
        finally:
            self.require_backward_grad_sync, self.require_forward_param_sync = saved
