"""Train steps: how one micro-batch becomes a loss, in the shape megatron-core's schedules call
(``forward_step(data_iterator, model) -> (output, loss_func)``, ``loss_func(output) -> (loss, {name: value})``).

``AbstractTrainStep`` holds the three functions; ``GPTTrainStep``, ``BertTrainStep`` and ``T5TrainStep``
give the batch layout and loss of each model family; ``MegatronLMPlugin.custom_train_step_class`` (with
``custom_train_step_kwargs``), ``custom_get_batch_function`` and ``custom_loss_function`` replace them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import attrs
import torch


@attrs.define
class StepOutput:
    """What ``model(**batch)`` returns from a step that megatron-core's schedule ran (``pp_degree > 1`` or
    ``num_micro_batches > 1``) with a shipped train step: ``loss`` (the sum of the loss function's logged
    values, averaged over the micro-batches, on every pipeline stage), ``losses`` (each logged value, on the
    last stage; empty elsewhere) and ``logits`` (when the loss function logs ``"logits"``)."""

    loss: torch.Tensor
    losses: dict[str, torch.Tensor] = attrs.field(factory=dict)
    logits: torch.Tensor | None = None


def avg_losses_across_data_parallel_group(losses: list[torch.Tensor]) -> torch.Tensor:
    """The mean of each loss over megatron-core's data-parallel group (one value per loss)."""
    from megatron.core import parallel_state

    averaged = torch.cat([loss.clone().detach().reshape(1).float() for loss in losses])
    torch.distributed.all_reduce(averaged, group=parallel_state.get_data_parallel_group())
    return averaged / parallel_state.get_data_parallel_world_size()


class AbstractTrainStep:
    """A train step's batch, forward and loss functions (override the ``get_*`` methods)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.get_batch = self.get_batch_func()
        self.loss_func = self.get_loss_func()
        self.forward_step = self.get_forward_step_func()

    def get_batch_func(self) -> Callable[[Iterator[Any]], Any]:
        raise NotImplementedError(f"{type(self).__name__}.get_batch_func")

    def get_forward_step_func(self) -> Callable[[Iterator[Any], torch.nn.Module], Any]:
        raise NotImplementedError(f"{type(self).__name__}.get_forward_step_func")

    def get_loss_func(self) -> Callable[..., Any]:
        raise NotImplementedError(f"{type(self).__name__}.get_loss_func")


def _plugin_option(plugin: Any, name: str) -> Any:
    return getattr(plugin, name, None) if plugin is not None else None


class _FamilyTrainStep(AbstractTrainStep):
    """The shipped model families: the plugin's ``custom_get_batch_function`` and ``custom_loss_function``
    replace the family's own batch and loss functions (``_batch_func``, ``_loss_func``)."""

    #: what a scheduled ``model(**batch)`` returns (a script's own AbstractTrainStep gets the loss tensor)
    model_output_class = StepOutput

    def __init__(self, name: str, megatron_args: Any) -> None:
        self.megatron_args = megatron_args
        self.custom_get_batch = _plugin_option(megatron_args, "custom_get_batch_function")
        self.custom_loss = _plugin_option(megatron_args, "custom_loss_function")
        super().__init__(name)

    def get_batch_func(self) -> Callable[[Iterator[Any]], Any]:
        return self.custom_get_batch if self.custom_get_batch is not None else self._batch_func()

    def get_loss_func(self) -> Callable[..., Any]:
        return self.custom_loss if self.custom_loss is not None else self._loss_func()

    def _batch_func(self) -> Callable[[Iterator[Any]], Any]:
        raise NotImplementedError(f"{type(self).__name__}._batch_func")

    def _loss_func(self) -> Callable[..., Any]:
        return _masked_mean_loss


def _masked_mean_loss(loss_mask: torch.Tensor, output: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
    """Per-token losses averaged over the tokens the mask keeps; the logged value is also averaged over the
    data-parallel group."""
    losses = output.float().reshape(-1)
    mask = loss_mask.reshape(-1).float()
    loss = (losses * mask).sum() / mask.sum().clamp(min=1)
    return loss, {"lm loss": avg_losses_across_data_parallel_group([loss])[0]}


class GPTTrainStep(_FamilyTrainStep):
    """Decoder-only language model: ``{"input_ids": [b, s + 1]}`` (or ``"text"``) gives tokens and the labels
    shifted by one, a causal attention mask, position ids and a loss mask (``eod_token`` masked with
    ``eod_mask_loss``). The model is called ``model(tokens, position_ids, attention_mask, labels=labels)`` and
    returns per-token losses."""

    def __init__(self, megatron_args: Any = None, eod_token: int | None = None, **kwargs: Any) -> None:
        self.eod_token = eod_token
        self.eod_mask_loss = bool(kwargs.get("eod_mask_loss", _plugin_option(megatron_args, "eod_mask_loss")))
        super().__init__("GPTTrainStep", megatron_args)

    def _batch_func(self) -> Callable[[Iterator[Any]], Any]:
        def get_batch(data_iterator: Iterator[Any]) -> tuple[torch.Tensor, ...]:
            data = next(data_iterator)
            if "tokens" in data and "labels" in data:
                # megatron-core's GPTDataset samples (MegatronLMDummyDataLoader with data_path): already
                # shifted, with their own masks and positions
                tokens, labels = data["tokens"].long(), data["labels"].long()
            else:
                tokens_ = data["input_ids"] if "input_ids" in data else data["text"]
                tokens_ = tokens_.long()
                tokens, labels = tokens_[:, :-1].contiguous(), tokens_[:, 1:].contiguous()
            length = tokens.shape[1]
            attention_mask = data.get("attention_mask")
            if attention_mask is None:
                attention_mask = torch.tril(torch.ones(1, 1, length, length, device=tokens.device)) < 0.5
            position_ids = data.get("position_ids")
            if position_ids is None:
                position_ids = torch.arange(length, device=tokens.device).unsqueeze(0).expand_as(tokens)
            loss_mask = data.get("loss_mask")
            if loss_mask is None:
                loss_mask = torch.ones_like(tokens, dtype=torch.float)
                if self.eod_mask_loss and self.eod_token is not None:
                    loss_mask[tokens == self.eod_token] = 0.0
            return tokens, labels, loss_mask.float(), attention_mask, position_ids

        return get_batch

    def get_forward_step_func(self) -> Callable[[Iterator[Any], torch.nn.Module], Any]:
        def forward_step(
            data_iterator: Iterator[Any], model: torch.nn.Module
        ) -> tuple[torch.Tensor, Callable]:
            tokens, labels, loss_mask, attention_mask, position_ids = self.get_batch(data_iterator)
            output = model(tokens, position_ids, attention_mask, labels=labels)
            return output, partial(self.loss_func, loss_mask)

        return forward_step


class BertTrainStep(_FamilyTrainStep):
    """Encoder with masked-LM and (optional) sentence-order losses: batch keys ``text``, ``types``,
    ``labels``, ``is_random``, ``loss_mask``, ``padding_mask``; the model returns
    ``(lm_loss_per_token, sop_logits)``."""

    def __init__(self, megatron_args: Any = None, binary_head: bool = True) -> None:
        self.binary_head = binary_head
        super().__init__("BertTrainStep", megatron_args)

    def _batch_func(self) -> Callable[[Iterator[Any]], Any]:
        def get_batch(data_iterator: Iterator[Any]) -> tuple[torch.Tensor, ...]:
            data = next(data_iterator)
            return (
                data["text"].long(),
                data["types"].long(),
                data["labels"].long(),
                data["is_random"].long(),
                data["loss_mask"].float(),
                data["padding_mask"].long(),
            )

        return get_batch

    def _loss_func(self) -> Callable[..., Any]:
        def loss_func(loss_mask: torch.Tensor, sentence_order: torch.Tensor, output: Any) -> Any:
            lm_loss_per_token, sop_logits = output
            lm_loss = (lm_loss_per_token.float().reshape(-1) * loss_mask.reshape(-1)).sum() / loss_mask.sum()
            if sop_logits is None or not self.binary_head:
                return lm_loss, {"lm loss": avg_losses_across_data_parallel_group([lm_loss])[0]}
            sop_loss = torch.nn.functional.cross_entropy(
                sop_logits.view(-1, 2).float(), sentence_order.view(-1)
            )
            averaged = avg_losses_across_data_parallel_group([lm_loss, sop_loss])
            return lm_loss + sop_loss, {"lm loss": averaged[0], "sop loss": averaged[1]}

        return loss_func

    def get_forward_step_func(self) -> Callable[[Iterator[Any], torch.nn.Module], Any]:
        def forward_step(data_iterator: Iterator[Any], model: torch.nn.Module) -> tuple[Any, Callable]:
            tokens, types, lm_labels, sentence_order, loss_mask, padding_mask = self.get_batch(data_iterator)
            output = model(
                tokens, padding_mask, tokentype_ids=types if self.binary_head else None, lm_labels=lm_labels
            )
            return output, partial(self.loss_func, loss_mask, sentence_order)

        return forward_step


class T5TrainStep(_FamilyTrainStep):
    """Encoder-decoder: batch keys ``text_enc``, ``text_dec``, ``labels``, ``loss_mask``, ``enc_mask``,
    ``dec_mask``, ``enc_dec_mask``; the model returns per-token losses."""

    def __init__(self, megatron_args: Any = None) -> None:
        super().__init__("T5TrainStep", megatron_args)

    def _batch_func(self) -> Callable[[Iterator[Any]], Any]:
        def get_batch(data_iterator: Iterator[Any]) -> tuple[torch.Tensor, ...]:
            data = next(data_iterator)
            return (
                data["text_enc"].long(),
                data["text_dec"].long(),
                data["labels"].long(),
                data["loss_mask"].float(),
                data["enc_mask"] < 0.5,
                data["dec_mask"] < 0.5,
                data["enc_dec_mask"] < 0.5,
            )

        return get_batch

    def get_forward_step_func(self) -> Callable[[Iterator[Any], torch.nn.Module], Any]:
        def forward_step(data_iterator: Iterator[Any], model: torch.nn.Module) -> tuple[Any, Callable]:
            enc, dec, labels, loss_mask, enc_mask, dec_mask, enc_dec_mask = self.get_batch(data_iterator)
            output = model(enc, dec, enc_mask, dec_mask, enc_dec_mask, tokentype_ids=None, lm_labels=labels)
            return output, partial(self.loss_func, loss_mask)

        return forward_step


def train_step_for(config: Any, default: type[AbstractTrainStep] = GPTTrainStep) -> AbstractTrainStep:
    """The train step a run uses: ``custom_train_step_class(config, **custom_train_step_kwargs)`` or
    ``default(config)``."""
    cls = config.custom_train_step_class or default
    return cls(config, **(config.custom_train_step_kwargs or {}))
