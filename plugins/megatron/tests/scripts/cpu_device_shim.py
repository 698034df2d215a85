"""TEST-ONLY device shim: lets megatron-core 0.16.1's CUDA-bound code run on a CPU-only torch, so that the CPU
tests drive megatron-core's real pipeline schedules, point-to-point send/recv (over gloo), its
DistributedDataParallel gradient buffers and its sequence-parallel all-gather / reduce-scatter.

megatron-core picks the device of the buffers it allocates with ``torch.cuda.current_device()``
(p2p_communication's receive buffers, param_and_grad_buffer's gradient buffer, tensor_parallel's
GlobalMemoryBuffer and mappings), and ``pipeline_parallel.schedules`` allocates ``total_num_tokens`` on the
literal ``"cuda"``; on a torch built without CUDA each of these raises. ``install()`` changes, in the
calling process only:

- ``torch.cuda.current_device()`` returns ``torch.device("cpu")`` (instead of raising);
- ``torch.cuda.synchronize()`` does nothing (p2p_communication calls it after batched send/recv; CPU work
  is already synchronous);
- ``megatron.core.pipeline_parallel.schedules`` sees a ``torch`` whose ``zeros(..., device="cuda")``
  allocates on the CPU (everything else is torch itself);
- the "CUDA" random state that megatron-core's model-parallel RNG tracker (``model_parallel_cuda_manual_seed``,
  forked around dropout in GPTModel's attention) saves and restores is the CPU generator's
  (``torch.cuda.manual_seed``/``get_rng_state`` and ``tensor_parallel.random``'s get/set helpers). The tracker
  then warns "CPU RNG state changed within GPU RNG context"; the tests use no dropout.

Nothing in drivetrain or drivetrain-megatron is patched: the backend runs the code it runs on CUDA (it
refuses these features on a CPU-only torch without the shim, see ``check_degrees``).
"""

from __future__ import annotations

import types
from typing import Any

import torch


class _SchedulesTorch(types.ModuleType):
    """torch, except that ``zeros`` places a ``device="cuda"`` tensor on the CPU."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def zeros(*args: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
        return torch.zeros(*args, device="cpu" if device == "cuda" else device, **kwargs)


def install() -> None:
    if torch.cuda.is_available():
        return  # a real GPU: nothing to stand in for
    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment]
    torch.cuda.synchronize = lambda *args, **kwargs: None  # type: ignore[assignment]
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.tensor_parallel import random

    schedules.torch = _SchedulesTorch("torch")
    torch.cuda.manual_seed = torch.manual_seed  # type: ignore[assignment]
    torch.cuda.get_rng_state = torch.cuda.random.get_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    random._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    random._set_cuda_rng_state = lambda state, *args, **kwargs: torch.set_rng_state(state)
