"""Accelerate's base classes and helper of ``accelerate.data_loader``: :class:`DataLoaderStateMixin` and
:class:`DataLoaderAdapter`, which drivetrain's prepared loaders count as (``isinstance`` holds from the moment
either class can be imported: they are registered here), and :func:`get_sampler`. ``drivetrain.data_loader``
(generated from its table in drivetrain.compat.paths) serves them with the loaders of :mod:`drivetrain.data`."""

from __future__ import annotations

import abc
import contextlib
from typing import Any

from drivetrain.data.loaders import _PreparedDataLoader


class DataLoaderStateMixin(metaclass=abc.ABCMeta):  # noqa: B024 - ABCMeta for register(), no abstract method
    """State a data loader shares with the ``GradientState`` while it iterates: ``end_of_dataloader`` (the last
    batch is being yielded) and ``remainder`` (samples in the last batch, -1 when unknown). A subclass creates a
    ``GradientState`` as ``self.gradient_state`` and calls :meth:`begin` and :meth:`end` around iteration."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.end_of_dataloader = False
        cls.remainder = -1

    def reset(self) -> None:
        self.end_of_dataloader = False
        self.remainder = -1

    def begin(self) -> None:
        """Register with the gradient state; the remainder is known when the last batch is kept."""
        self.reset()
        with contextlib.suppress(Exception):  # datasets without a length leave it unknown
            if not self._drop_last:
                length = getattr(self.dataset, "total_dataset_length", len(self.dataset))
                self.remainder = length % self.total_batch_size
        self.gradient_state._add_dataloader(self)

    def end(self) -> None:
        self.gradient_state._remove_dataloader(self)


class DataLoaderAdapter(metaclass=abc.ABCMeta):  # noqa: B024 - ABCMeta for register(), no abstract method
    """A torch ``DataLoader`` (or, with ``use_stateful_dataloader``, torchdata's ``StatefulDataLoader``) built
    from the arguments, that this object stands for: attributes are the loader's, ``isinstance(adapter,
    DataLoader)`` holds, and ``state_dict()`` gives the loader's state as of the last batch yielded."""

    def __init__(
        self, dataset: Any, use_stateful_dataloader: bool = False, batch_sampler: Any = None, **kwargs: Any
    ):
        from torch.utils.data import DataLoader

        self.use_stateful_dataloader = use_stateful_dataloader
        if use_stateful_dataloader:
            import importlib.util

            if importlib.util.find_spec("torchdata.stateful_dataloader") is None:
                raise ImportError(
                    "use_stateful_dataloader=True needs torchdata 0.8.0 or newer: pip install 'torchdata>=0.8.0'"
                )
            from torchdata.stateful_dataloader import StatefulDataLoader

            self.base_dataloader = StatefulDataLoader(dataset, batch_sampler=batch_sampler, **kwargs)
        else:
            self.base_dataloader = DataLoader(dataset, batch_sampler=batch_sampler, **kwargs)
        if hasattr(self.base_dataloader, "state_dict"):
            self.dl_state_dict = self.base_dataloader.state_dict()

    def __getattr__(self, name: str) -> Any:
        if name == "base_dataloader":  # not built yet: no recursion
            raise AttributeError(name)
        return getattr(self.base_dataloader, name)

    def state_dict(self) -> dict[str, Any]:
        return self.dl_state_dict

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.base_dataloader.load_state_dict(state_dict)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # code that checks isinstance(loader, DataLoader) keeps working
        return self.base_dataloader.__class__

    def __len__(self) -> int:
        return len(self.base_dataloader)

    def _update_state_dict(self) -> None:
        if hasattr(self.base_dataloader, "state_dict"):
            self.dl_state_dict = self.base_dataloader.state_dict()


# drivetrain's prepared loaders play both roles
DataLoaderStateMixin.register(_PreparedDataLoader)
DataLoaderAdapter.register(_PreparedDataLoader)


def get_sampler(dataloader: Any) -> Any:
    """The sampler behind ``dataloader`` (the one its batch sampler draws from; when the loader's sampler is
    itself a batch sampler, the sampler inside that)."""
    from torch.utils.data import BatchSampler

    if isinstance(dataloader.sampler, BatchSampler):
        return getattr(dataloader.sampler, "sampler", None)
    return getattr(dataloader.batch_sampler, "sampler", None)
