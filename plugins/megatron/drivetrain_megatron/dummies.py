"""Accelerate's Megatron placeholders: ``MegatronLMDummyScheduler`` (megatron-core's learning-rate and
weight-decay schedule on the prepared optimizer) and ``MegatronLMDummyDataLoader`` (train/validation/test
loaders built from Megatron dataset arguments)."""

from __future__ import annotations

from typing import Any, cast

import torch

from drivetrain.plugin_api import ConfigurationError, PluginAccelerator
from drivetrain_megatron.config import MegatronLMPlugin, resolve_config


def _active_config() -> MegatronLMPlugin:
    from drivetrain.plugin_api.state import initialized_accelerator_state

    state = initialized_accelerator_state()
    return resolve_config(state.backend_config if state is not None else None)


def _data_parallel_size() -> int:
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return 1
    return parallel_state.get_data_parallel_world_size()


class MegatronLMDummyScheduler:
    """Megatron-LM's schedule (``megatron.core.optimizer_param_scheduler.OptimizerParamScheduler``): warm-up
    from 0 to the optimizer's learning rate over ``warmup_num_steps``, then ``lr_decay_style`` down to
    ``min_lr`` over ``lr_decay_iters`` (default ``total_num_steps``); weight decay from ``start_weight_decay``
    to ``end_weight_decay`` (default: the optimizer's). One ``step()`` per optimizer step."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        total_num_steps: int | None = None,
        warmup_num_steps: int = 0,
        **kwargs: Any,
    ) -> None:
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.kwargs = kwargs
        self._schedule: Any = None
        #: what AcceleratedScheduler counts while gradients accumulate (adjust_scheduler)
        self._step_count = 0
        from drivetrain.plugin_api.state import initialized_accelerator_state

        if initialized_accelerator_state() is not None:
            # Built now, so that the first optimizer step already runs at the warm-up's first rate (0).
            self._built()

    @property
    def optimizer(self) -> Any:
        return self._optimizer

    @optimizer.setter
    def optimizer(self, optimizer: Any) -> None:
        """The optimizer the schedule drives; when prepare replaces it (megatron-core's optimizer on CUDA),
        an already built schedule moves to the replacement and sets its current rates there."""
        self._optimizer = optimizer
        schedule = self.__dict__.get("_schedule")
        if schedule is not None and schedule.optimizer is not optimizer:
            schedule.optimizer = optimizer
            schedule.step(0)

    def _built(self) -> Any:
        if self._schedule is None:
            from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

            config = _active_config()
            decay_steps = config.lr_decay_iters or self.total_num_steps or config.train_iters
            if not decay_steps:
                raise ConfigurationError(
                    "MegatronLMDummyScheduler needs the number of steps to decay over: pass total_num_steps=... "
                    "or set MegatronLMPlugin.lr_decay_iters / train_iters"
                )
            group = self.optimizer.param_groups[0]
            # the peak rate, kept where torch's LR schedulers keep it: the schedule is about to set "lr" to the
            # warm-up's first rate, and an optimizer built from this one later (megatron-core's) needs the peak
            for each in self.optimizer.param_groups:
                each.setdefault("initial_lr", each["lr"])
            weight_decay = float(group.get("weight_decay", 0.0))
            start_wd = config.start_weight_decay if config.start_weight_decay is not None else weight_decay
            end_wd = config.end_weight_decay if config.end_weight_decay is not None else weight_decay
            warmup = config.lr_warmup_iters if config.lr_warmup_iters is not None else self.warmup_num_steps
            if config.lr_warmup_fraction is not None:
                warmup = int(config.lr_warmup_fraction * decay_steps)
            # The prepared scheduler is stepped once per data-parallel share per optimizer step (as Megatron-LM
            # advances its schedule by the samples of all shares): the lengths are counted in those steps.
            shares = _data_parallel_size()
            self._schedule = OptimizerParamScheduler(
                self.optimizer,
                init_lr=0.0,
                max_lr=float(group["initial_lr"]),
                min_lr=config.min_lr,
                lr_warmup_steps=warmup * shares,
                lr_decay_steps=decay_steps * shares,
                lr_decay_style=config.lr_decay_style,
                start_wd=start_wd,
                end_wd=end_wd,
                wd_incr_steps=(self.total_num_steps or decay_steps) * shares,
                wd_incr_style=config.weight_decay_incr_style,
            )
        return self._schedule

    def step(self, increment: int = 1) -> None:
        self._step_count += 1
        self._built().step(increment)

    def get_last_lr(self) -> list[float]:
        self._built()
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return self._built().state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._built().load_state_dict(state_dict)


class MegatronLMDummyDataLoader(torch.utils.data.DataLoader):
    """Megatron dataset arguments (``data_path``, ``splits_string``, ``seq_length``, ``micro_batch_size``,
    ...). Prepared up to three times, it becomes the train, validation and test loaders, each shared out over
    the data-parallel group, of the datasets that
    ``MegatronLMPlugin.custom_megatron_datasets_provider_function(**dataset_args)`` returns
    (``(train, valid, test)``) or, without a provider, of megatron-core's GPT datasets built from the indexed
    dataset at ``data_path`` (indexed_data.py). A loader's batch is one step: ``micro_batch_size`` x
    ``num_micro_batches`` samples."""

    def __init__(self, **dataset_kwargs: Any) -> None:
        # A data loader of nothing until prepared, so that Accelerator.prepare hands it to the backend.
        super().__init__(cast(Any, []))
        self.dataset_args = dataset_kwargs
        self._datasets: tuple[Any, Any, Any] | None = None
        self._served = 0

    def build(self, accelerator: PluginAccelerator, config: MegatronLMPlugin, options: Any) -> Any:
        from drivetrain.plugin_api.data import prepare_data_loader

        config.megatron_dataset_flag = True
        micro_batch_size = int(self.dataset_args.get("micro_batch_size", 1))
        config.micro_batch_size = micro_batch_size
        config.global_batch_size = micro_batch_size * config.num_micro_batches * options.num_processes
        provider = config.custom_megatron_datasets_provider_function
        if self._datasets is None:
            if provider is not None:
                self._datasets = tuple(provider(**self.dataset_args))
            elif self.dataset_args.get("data_path") is not None:
                from drivetrain_megatron.indexed_data import build_gpt_datasets

                self._datasets = build_gpt_datasets(self.dataset_args, config, config.global_batch_size)
            else:
                raise ConfigurationError(
                    "MegatronLMDummyDataLoader needs data_path=<indexed dataset prefix> or "
                    "MegatronLMPlugin.custom_megatron_datasets_provider_function (dataset arguments -> "
                    "(train, valid, test) datasets)"
                )
        if self._served >= 3:
            raise ConfigurationError(
                "MegatronLMDummyDataLoader is prepared at most 3 times (train, valid, test)"
            )
        dataset = self._datasets[self._served]
        self._served += 1
        if dataset is None:
            return None
        # megatron-core's datasets are already shuffled by their seed and read in order (as Megatron-LM's
        # sampler does); a provider's train split is shuffled by the loader
        shuffle = self._served == 1 and provider is not None
        # one batch per step: num_micro_batches micro-batches, which megatron-core's schedule cuts apart
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=micro_batch_size * config.num_micro_batches, shuffle=shuffle
        )
        return prepare_data_loader(loader, **options.to_kwargs())
