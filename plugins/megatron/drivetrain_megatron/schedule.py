"""megatron-core's schedules driving a prepared model: with ``pp_degree > 1`` or ``num_micro_batches > 1``,
``model(**batch)`` in training mode is one whole step of forward and backward passes over the micro-batches
(``megatron.core.pipeline_parallel.get_forward_backward_func()``: the 1F1B pipeline schedule, or
``forward_backward_no_pipelining`` with one stage), as Accelerate's Megatron engine does.

Gradients go through megatron-core's own ``DistributedDataParallel`` (its contiguous gradient buffer,
``param.main_grad``) and ``finalize_model_grads`` (the data-parallel all-reduce, the sequence-parallel
layer-norm and the shared-embedding reductions), exactly as Megatron-LM's training loop runs them; afterwards
``param.grad`` is the finished gradient, so ``accelerator.clip_grad_norm_``, ``optimizer.step()`` and
``optimizer.zero_grad()`` work unchanged. ``accelerator.backward(outputs.loss)`` is then a no-op.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from drivetrain.plugin_api import ConfigurationError, PluginAccelerator
from drivetrain_megatron.config import MegatronLMPlugin

#: Marks a prepared model whose forward runs megatron-core's schedule.
SCHEDULED_ATTRIBUTE = "_drivetrain_megatron_scheduled"


def uses_schedule(config: MegatronLMPlugin) -> bool:
    """Whether prepared models run megatron-core's schedule in megatron-core's DistributedDataParallel: with
    pipeline stages, several micro-batches, or the distributed optimizer (which shards that wrapper's
    gradient buffer; CUDA only, refused elsewhere before this is asked)."""
    return config.pp_degree > 1 or config.num_micro_batches > 1 or bool(config.use_distributed_optimizer)


def cuda_device_calls_resolve() -> bool:
    """Whether ``torch.cuda.current_device()`` answers here: megatron-core 0.16.1's schedules, point-to-point
    communication, gradient buffers and sequence-parallel all-gathers allocate on that device (and on the
    literal ``"cuda"``), so on a torch without CUDA they cannot run."""
    try:
        torch.cuda.current_device()
    except (AssertionError, RuntimeError):
        return False
    return True


def _split(batch: Any, parts: int) -> list[Any]:
    """``batch`` (a tensor, or a dict / tuple / list of tensors) cut into ``parts`` equal micro-batches
    along the first dimension."""
    if isinstance(batch, torch.Tensor):
        rows = batch.shape[0]
        if rows % parts:
            raise ConfigurationError(
                f"MegatronLMPlugin.num_micro_batches={parts} must divide the batch size ({rows} rows per "
                "process); change the data loader's batch_size or num_micro_batches"
            )
        return list(batch.split(rows // parts))
    if isinstance(batch, dict):
        columns = {key: _split(value, parts) for key, value in batch.items()}
        return [{key: value[index] for key, value in columns.items()} for index in range(parts)]
    if isinstance(batch, (tuple, list)):
        columns_list = [_split(value, parts) for value in batch]
        return [type(batch)(column[index] for column in columns_list) for index in range(parts)]
    return [batch] * parts


def _rows(batch: Any) -> int:
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    values = batch.values() if isinstance(batch, dict) else batch
    for value in values:
        if isinstance(value, (torch.Tensor, dict, tuple, list)):
            return _rows(value)
    raise ConfigurationError("a scheduled megatron step needs a batch holding at least one tensor")


def prepare_stage(model: torch.nn.Module, config: MegatronLMPlugin) -> None:
    """Give ``model`` what megatron-core's schedules and ``finalize_model_grads`` look up on a stage, where it
    lacks them (megatron-core's own models have them all): ``config`` (the run's ``model_parallel_config()``),
    ``model_type`` (decoder-only), ``pre_process`` / ``post_process`` (first / last stage),
    ``share_embeddings_and_output_weights`` (False: no weight shared between stages) and, with one stage,
    ``set_input_tensor`` (nothing to receive)."""
    from megatron.core import parallel_state
    from megatron.core.enums import ModelType

    if getattr(model, "config", None) is None:
        model.config = config.model_parallel_config()
    if config.pp_degree > 1:
        if not callable(getattr(model, "set_input_tensor", None)):
            raise ConfigurationError(
                f"MegatronLMPlugin.pp_degree={config.pp_degree}: the model ({type(model).__name__}) needs a "
                "set_input_tensor(tensors) method: megatron-core's pipeline schedule hands every stage but the "
                "first its input through it (see docs/megatron.md, 'Pipeline parallelism')"
            )
        if getattr(model.config, "hidden_size", None) is None:
            raise ConfigurationError(
                f"MegatronLMPlugin.pp_degree={config.pp_degree}: model.config needs hidden_size (the stages "
                "exchange activations of shape (seq_length, micro_batch, hidden_size)); build the model with "
                "plugin.model_parallel_config(num_layers=..., hidden_size=..., num_attention_heads=...)"
            )
        if config.seq_length is None:
            raise ConfigurationError(
                f"MegatronLMPlugin.pp_degree={config.pp_degree} needs seq_length: the stages exchange "
                "activations of shape (seq_length, micro_batch, hidden_size); set MegatronLMPlugin(seq_length=...)"
            )
    elif not hasattr(model, "set_input_tensor"):
        setattr(model, "set_input_tensor", lambda tensors: None)  # noqa: B010 (megatron-core calls it)
    defaults = {
        "model_type": ModelType.encoder_or_decoder,
        "pre_process": parallel_state.is_pipeline_first_stage(),
        "post_process": parallel_state.is_pipeline_last_stage(),
        "share_embeddings_and_output_weights": False,
    }
    for name, value in defaults.items():
        if not hasattr(model, name):
            setattr(model, name, value)


class ScheduledModel(torch.nn.Module):
    """A model whose training forward is one step of megatron-core's schedule (see the module docstring);
    ``module`` is megatron-core's ``DistributedDataParallel`` around the user's stage."""

    def __init__(
        self, module: torch.nn.Module, accelerator: PluginAccelerator, config: MegatronLMPlugin
    ) -> None:
        super().__init__()
        #: megatron-core's DistributedDataParallel (its methods are not torch's)
        self.module: Any = module
        self.__dict__[SCHEDULED_ATTRIBUTE] = True
        self._accelerator = weakref.ref(accelerator)
        self._config = config
        self._train_step: Any = None
        stage_config: Any = module.config
        stage_config.finalize_model_grads_func = self._finalize_gradients
        stage_config.grad_scale_func = self._scale_loss

    # -- what the schedule calls ------------------------------------------------------------------------------
    def _scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The last stage's loss before backward: divided by the accumulation steps (as accelerator.backward
        divides a loss) so that a step accumulated over several calls averages them."""
        accelerator = self._accelerator()
        steps = accelerator.gradient_state.plugin_kwargs.get("num_steps", 1) if accelerator else 1
        return loss / steps if steps > 1 else loss

    def _finalize_gradients(self, *args: Any, **kwargs: Any) -> None:
        """megatron-core's ``finalize_model_grads`` at synchronisation steps (inside
        ``accelerator.accumulate``'s skipped steps the gradients stay local, as ``no_sync`` does)."""
        from megatron.core.distributed import finalize_model_grads

        accelerator = self._accelerator()
        if accelerator is not None and not accelerator.sync_gradients:
            return
        finalize_model_grads(*args, **kwargs)

    # -- the step -----------------------------------------------------------------------------------------------
    def train_step(self) -> Any:
        """The run's train step (``custom_train_step_class`` or ``GPTTrainStep``), built at the first call so
        that a script may set the plugin's train-step fields after ``Accelerator(...)``."""
        if self._train_step is None:
            from drivetrain_megatron.train_steps import train_step_for

            self._train_step = train_step_for(self._config)
        return self._train_step

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs and args:
            raise TypeError("a scheduled megatron model takes one batch: model(**batch) or model(batch)")
        batch = kwargs if kwargs else (args[0] if len(args) == 1 else args)
        training = self.module.training and torch.is_grad_enabled()
        return self._run(batch, forward_only=not training)

    def _run(self, batch: Any, forward_only: bool) -> Any:
        from megatron.core import parallel_state
        from megatron.core.pipeline_parallel import get_forward_backward_func

        config = self._config
        parts = config.num_micro_batches
        micro_batches = _split(batch, parts)
        stage: torch.nn.Module = self.module.module
        parameters = [parameter for parameter in stage.parameters() if parameter.requires_grad]
        if not forward_only:
            self._start_gradients(parameters)
        step = self.train_step()
        loss_dicts = get_forward_backward_func()(
            forward_step_func=step.forward_step,
            data_iterator=iter(micro_batches),
            model=[self.module],
            num_microbatches=parts,
            seq_length=config.seq_length or 1,
            micro_batch_size=_rows(batch) // parts,
            decoder_seq_length=config.decoder_seq_length,
            forward_only=forward_only,
        )
        if not forward_only:
            # the finished gradients (views of megatron-core's buffer) where torch optimizers read them
            for parameter in parameters:
                parameter.grad = parameter.main_grad  # type: ignore[attr-defined]  # megatron-core's buffer view
        losses: dict[str, torch.Tensor] = {}
        for key in loss_dicts[0] if loss_dicts else ():
            values = [entry[key] for entry in loss_dicts]
            if values[0].dim() == 0:
                losses[key] = sum(values) / len(values)
            else:
                losses[key] = torch.cat(values)
        # on the accelerator's device: the stages without a loss take part in the broadcast (NCCL on CUDA)
        accelerator = self._accelerator()
        assert accelerator is not None  # the Accelerator outlives the models it prepared
        device = accelerator.device
        loss = sum((value for value in losses.values() if value.dim() == 0), torch.zeros((), device=device))
        loss = loss.detach().float().reshape(())
        if parallel_state.get_pipeline_model_parallel_world_size() > 1:
            torch.distributed.broadcast(
                loss,
                src=parallel_state.get_pipeline_model_parallel_last_rank(),
                group=parallel_state.get_pipeline_model_parallel_group(),
            )
        output_class = getattr(step, "model_output_class", None)
        if output_class is None:
            return loss
        return output_class(loss=loss, losses=losses, logits=losses.get("logits"))

    def _start_gradients(self, parameters: list[torch.nn.Parameter]) -> None:
        """Gradients accumulate in megatron-core's buffer. When the optimizer dropped them
        (``zero_grad()``), the buffer starts from zero; backward must not find ``param.grad`` pointing into
        the buffer (megatron-core's hook adds ``param.grad`` to it)."""
        if all(parameter.grad is None for parameter in parameters):
            self.module.zero_grad_buffer()
        for parameter in parameters:
            parameter.grad = None


def _transformer_config(config: Any) -> Any:
    """The ``TransformerConfig`` megatron-core's DistributedDataParallel, schedule and gradient finalisation
    read: the stage's own, or (a model of plain Column/RowParallelLinear layers with one stage, built from a
    ``ModelParallelConfig``) a copy of its settings; the network sizes it then holds (1) are read only to
    shape activations passed between stages, and there is one stage."""
    import dataclasses

    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.transformer import TransformerConfig

    if isinstance(config, TransformerConfig):
        return config
    values = {
        field.name: getattr(config, field.name)
        for field in dataclasses.fields(ModelParallelConfig)
        if field.init
    }
    return TransformerConfig(**values, num_layers=1, hidden_size=1, num_attention_heads=1)


def wrap(model: torch.nn.Module, accelerator: PluginAccelerator, config: MegatronLMPlugin) -> ScheduledModel:
    """``model`` (one pipeline stage) in megatron-core's ``DistributedDataParallel`` and the schedule."""
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    if parallel_state.get_virtual_pipeline_model_parallel_world_size() is not None:
        raise ConfigurationError(
            "MegatronLMPlugin.num_layers_per_virtual_pipeline_stage: megatron-core's interleaved schedule runs "
            "several model chunks per stage, and drivetrain-megatron prepares one model per stage; leave it "
            "unset (the 1F1B schedule runs)"
        )
    prepare_stage(model, config)
    ddp = DistributedDataParallel(
        config=_transformer_config(model.config),
        ddp_config=DistributedDataParallelConfig(
            use_distributed_optimizer=bool(config.use_distributed_optimizer), overlap_grad_reduce=False
        ),
        module=model,
    )
    return ScheduledModel(ddp, accelerator, config)


def is_scheduled_loss(loss: torch.Tensor, accelerator: PluginAccelerator) -> bool:
    """A loss returned by a scheduled step (already back-propagated by the schedule): it carries no graph and
    a scheduled model is prepared."""
    if loss.requires_grad:
        return False
    return any(model.__dict__.get(SCHEDULED_ATTRIBUTE) for model in accelerator.prepared.models)
