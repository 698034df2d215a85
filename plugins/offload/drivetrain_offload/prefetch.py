"""Bringing the next offloaded block's weights in while the current block computes.

The order of blocks is learnt from the forwards themselves (the first guess is the device map's order):
when block B runs right after block A, A's successor is B. After fetching A's weights, B's are loaded in
the background: by a worker thread (disk pages read and cast off the main thread), and on CUDA through a
side stream so the host-to-device copy overlaps the kernels of A. At most one block is in flight, so the
memory cost is one extra block.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

import torch

from drivetrain_offload.weights import read_unique, read_weight, source_key


class Prefetcher:
    def __init__(self, hooks: list[Any]) -> None:
        self.successor: dict[int, Any] = {id(a): b for a, b in zip(hooks, hooks[1:])}
        self.last: Any = None
        self.pending: tuple[Any, concurrent.futures.Future] | None = None
        self.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="drivetrain-prefetch"
        )
        self.stream: Any = None
        self.hits = 0
        self.misses = 0

    def _load(self, hook: Any) -> tuple[dict[str, torch.Tensor], Any]:
        device = hook.execution_device or torch.device("cpu")
        # Tied weights are left to the hook: another active hook may lend it the tensor (tied_params_map),
        # which is known only when the block runs; reading them ahead could read them twice.
        tied = hook.tied_params_map or {}
        names = [name for name in hook.tensor_names if _key(hook.weights_map, name) not in tied]
        if device.type == "cuda":
            if self.stream is None:
                self.stream = torch.cuda.Stream(device)

            def to_device(name: str) -> torch.Tensor:
                source = read_weight(hook.weights_map, name)
                if not source.is_pinned():
                    source = source.pin_memory()
                return source.to(device, non_blocking=True)

            with torch.cuda.stream(self.stream):
                tensors = read_unique(names, hook.weights_map, to_device)
                event = torch.cuda.Event()
                event.record(self.stream)
            return tensors, event

        # Disk weights come back with their pages already read in: reading them here, off the main
        # thread, is the prefetch.
        return read_unique(
            names, hook.weights_map, lambda name: read_weight(hook.weights_map, name).to(device)
        ), None

    def fetch(self, hook: Any) -> dict[str, torch.Tensor]:
        if self.last is not None and self.last is not hook:
            self.successor[id(self.last)] = hook
        self.last = hook
        tensors = None
        if self.pending is not None:
            pending_hook, future = self.pending
            self.pending = None
            result = future.result()
            if pending_hook is hook:
                tensors, event = result
                if event is not None:
                    current = torch.cuda.current_stream(hook.execution_device)
                    current.wait_event(event)
                    for tensor in tensors.values():
                        tensor.record_stream(current)
                self.hits += 1
        if tensors is None:
            self.misses += 1
            tensors = hook.load_weights()
        following = self.successor.get(id(hook))
        if following is not None:
            self.pending = (following, self.executor.submit(self._load, following))
        return tensors

    def close(self) -> None:
        self.pending = None
        self.executor.shutdown(wait=True)


def _key(weights: Any, name: str) -> Any:
    try:
        return source_key(weights, name)
    except (KeyError, TypeError):
        return None
