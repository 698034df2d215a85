"""The training step under megatron-core's groups: gradients averaged over the data-parallel group,
sequence-parallel gradients summed over the tensor-parallel group, and the gradient norm of a model whose
weights are split across tensor-parallel ranks."""

from __future__ import annotations

import math
from typing import Any, cast

import torch

from drivetrain.plugin_api import ConfigurationError, PluginAccelerator, release_at_shutdown
from drivetrain_megatron import optimizer as megatron_optimizer
from drivetrain_megatron import schedule
from drivetrain_megatron.config import MegatronLMPlugin
from drivetrain_megatron.schedule import uses_schedule

#: Set on a model this backend prepared (so a second prepare leaves it alone).
PREPARED_ATTRIBUTE = "_drivetrain_megatron_prepared"
#: Set on an optimizer step that clips first (so a second prepare does not clip twice).
CLIPS_ATTRIBUTE = "_drivetrain_megatron_clips"


def wrap_for_data_parallel(
    model: torch.nn.Module, accelerator: PluginAccelerator, config: MegatronLMPlugin, evaluation_mode: bool
) -> torch.nn.Module | None:
    """With megatron-core's schedule (``pp_degree > 1``, ``num_micro_batches > 1`` or
    ``use_distributed_optimizer=True``): the model in
    megatron-core's DistributedDataParallel, driven by the schedule (schedule.py). Otherwise the model in
    torch's DistributedDataParallel over megatron-core's data-parallel group (gradients are averaged among the
    replicas of the same tensor/pipeline shard only), unchanged with one replica: megatron-core's wrapper
    allocates its gradient buffer on ``torch.cuda.current_device()``, which a CPU-only torch does not have,
    while torch's wrapper on the same group computes the same average on any device."""
    from megatron.core import parallel_state

    from drivetrain_ddp.wrapper import DrivetrainDDP

    if evaluation_mode or model.__dict__.get(PREPARED_ATTRIBUTE) or isinstance(model, DrivetrainDDP):
        return None
    refuse_distributed_optimizer_off_cuda(accelerator.device, config)
    if config.custom_prepare_model_function is not None:
        model = config.custom_prepare_model_function(model) or model
    model.__dict__[PREPARED_ATTRIBUTE] = True
    if uses_schedule(config):
        scheduled = schedule.wrap(model, accelerator, config)
        scheduled.__dict__[PREPARED_ATTRIBUTE] = True
        return scheduled
    if parallel_state.get_data_parallel_world_size() == 1:
        return model
    if not any(parameter.requires_grad for parameter in model.parameters()):
        return model
    kwargs: dict[str, Any] = {"process_group": parallel_state.get_data_parallel_group()}
    device = accelerator.device
    if device.type == "cuda" and device.index is not None:
        kwargs.update(device_ids=[device.index], output_device=device.index)
    wrapped = DrivetrainDDP(model, **kwargs)
    wrapped.__dict__[PREPARED_ATTRIBUTE] = True
    return release_at_shutdown(wrapped)


def record_batch_sizes(dataloader: Any, config: MegatronLMPlugin, options: Any) -> None:
    """Accelerate's ``megatron_lm_plugin.global_batch_size``: micro-batch x micro-batches x data-parallel size.
    A batch of the loader is one step: ``num_micro_batches`` micro-batches (the schedule cuts it)."""
    batch_size = getattr(dataloader, "batch_size", None)
    if batch_size is None:
        sampler = getattr(dataloader, "batch_sampler", None)
        batch_size = getattr(sampler, "batch_size", None)
    if batch_size is None:
        return
    per_step = batch_size // options.num_processes if options.split_batches else batch_size
    config.micro_batch_size = per_step // config.num_micro_batches
    config.global_batch_size = per_step * options.num_processes


DISTRIBUTED_OPTIMIZER_NEEDS_CUDA = (
    "MegatronLMPlugin.use_distributed_optimizer=True needs CUDA: megatron-core 0.16.1's distributed optimizer "
    "accepts only parameters whose type() is 'torch.cuda.*Tensor', shards them in megatron-core's "
    "DistributedDataParallel gradient buffer (allocated on torch.cuda.current_device()) and clips with CUDA "
    "tensors; on {device} leave it off (the prepared torch optimizer steps on the data-parallel-averaged "
    "gradients)"
)


def refuse_distributed_optimizer_off_cuda(device: torch.device, config: MegatronLMPlugin) -> None:
    if config.use_distributed_optimizer and device.type != "cuda":
        raise ConfigurationError(DISTRIBUTED_OPTIMIZER_NEEDS_CUDA.format(device=device.type))


def _scheduled_chunk(
    optimizer: torch.optim.Optimizer, accelerator: PluginAccelerator
) -> torch.nn.Module | None:
    """megatron-core's DistributedDataParallel of the prepared scheduled model whose parameters
    ``optimizer`` updates, if any."""
    wanted = {id(parameter) for group in optimizer.param_groups for parameter in group["params"]}
    for model in accelerator.prepared.models:
        model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
        if not model.__dict__.get(schedule.SCHEDULED_ATTRIBUTE):
            continue
        if any(id(parameter) in wanted for parameter in model.parameters()):
            return cast(torch.nn.Module, model.module)
    return None


def prepare_optimizer(
    optimizer: torch.optim.Optimizer, accelerator: PluginAccelerator, config: MegatronLMPlugin
) -> Any | None:
    """On CUDA, for a model in megatron-core's DistributedDataParallel (the schedule path, always taken with
    ``use_distributed_optimizer=True``): megatron-core's optimizer with the settings of ``optimizer``
    (optimizer.py), which clips to ``gradient_clipping`` itself. Otherwise ``optimizer`` itself, its ``step``
    first clipping the gradients to ``gradient_clipping`` over the whole model (as Megatron-LM's optimizer step
    does), where the gradients are final: the kernel calls ``step`` only at synchronisation steps."""
    from drivetrain.plugin_api.training import track_step_for_schedulers

    device = accelerator.device
    refuse_distributed_optimizer_off_cuda(device, config)
    if isinstance(optimizer, megatron_optimizer.MegatronCoreOptimizer):
        return None
    if device.type == "cuda" and uses_schedule(config):
        chunk = _scheduled_chunk(optimizer, accelerator)
        if chunk is not None:
            return megatron_optimizer.build(optimizer, chunk, config, str(accelerator.mixed_precision))
        if config.use_distributed_optimizer:
            raise ConfigurationError(
                "MegatronLMPlugin.use_distributed_optimizer=True: the optimizer's parameters belong to no model "
                "prepared by this accelerator; prepare the model before the optimizer (or in the same "
                "accelerator.prepare call) and build the optimizer from model.parameters()"
            )
    if not config.gradient_clipping or getattr(optimizer.step, CLIPS_ATTRIBUTE, False):
        return None
    step = optimizer.step
    max_norm = config.gradient_clipping

    def clipped_step(*args: Any, **kwargs: Any) -> Any:
        parameters = [parameter for group in optimizer.param_groups for parameter in group["params"]]
        clip_grad_norm(parameters, max_norm, 2.0)
        return step(*args, **kwargs)

    setattr(clipped_step, CLIPS_ATTRIBUTE, True)
    optimizer.step = clipped_step  # type: ignore[method-assign]
    track_step_for_schedulers(optimizer)
    return None


def run_backward(
    loss: torch.Tensor,
    accelerator: PluginAccelerator,
    backward_kwargs: dict[str, Any],
    config: MegatronLMPlugin,
) -> None:
    """backward; at a synchronisation step the gradients are final afterwards (DDP averaged them over the
    data-parallel group during backward), and those of sequence-parallel weights are summed over the
    tensor-parallel group. The loss of a scheduled step was back-propagated by the schedule: nothing to do."""
    if uses_schedule(config) and schedule.is_scheduled_loss(loss, accelerator):
        return  # the schedule already ran backward (Accelerate's Megatron backward is a no-op too)
    loss.backward(**backward_kwargs)
    if accelerator.sync_gradients and config.sequence_parallelism:
        reduce_sequence_parallel_gradients(accelerator.prepared.models)


def reduce_sequence_parallel_gradients(models: list[torch.nn.Module]) -> None:
    """Sum, over the tensor-parallel group, the gradients of weights applied to a sequence shard (layer
    norms and row-parallel biases under sequence parallelism): each rank saw only its part of the sequence."""
    from megatron.core import parallel_state

    if parallel_state.get_tensor_model_parallel_world_size() == 1:
        return
    grads = [
        parameter.grad
        for model in models
        for parameter in model.parameters()
        if getattr(parameter, "sequence_parallel", False) and parameter.grad is not None
    ]
    if not grads:
        return
    flat = torch._utils._flatten_dense_tensors(grads)
    torch.distributed.all_reduce(flat, group=parallel_state.get_tensor_model_parallel_group())
    for grad, reduced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
        grad.copy_(reduced)


def grad_norm(parameters: list[torch.nn.Parameter], norm_type: float) -> torch.Tensor:
    """The norm of the whole model's gradient: shards of split weights counted on every tensor-parallel rank,
    replicated weights once, stages of a pipeline summed."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

    grads = [
        parameter.grad.detach()
        for parameter in parameters
        if parameter.grad is not None and param_is_not_tensor_parallel_duplicate(parameter)
    ]
    device = grads[0].device if grads else torch.device("cpu")
    group = parallel_state.get_model_parallel_group()
    if math.isinf(norm_type):
        local = max((grad.abs().max().float() for grad in grads), default=torch.tensor(0.0, device=device))
        total = local.reshape(1).to(device)
        torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.MAX, group=group)
        return total[0]
    local = torch.zeros(1, dtype=torch.float32, device=device)
    for grad in grads:
        local += torch.linalg.vector_norm(grad.float(), norm_type) ** norm_type
    torch.distributed.all_reduce(local, group=group)
    return local[0] ** (1.0 / norm_type)


def clip_grad_norm(parameters: list[torch.nn.Parameter], max_norm: float, norm_type: float) -> torch.Tensor:
    total = grad_norm(parameters, norm_type)
    coefficient = max_norm / (total + 1e-6)
    if coefficient < 1:
        for parameter in parameters:
            if parameter.grad is not None:
                parameter.grad.detach().mul_(coefficient.to(parameter.grad.dtype))
    return total
