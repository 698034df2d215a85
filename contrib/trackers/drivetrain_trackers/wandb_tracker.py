"""Weights & Biases. ``WANDB_MODE=offline`` (or ``init_kwargs={"wandb": {"mode": "offline"}}``) writes
the run to disk for a later ``wandb sync``."""

from __future__ import annotations

from typing import Any, cast

from drivetrain.plugin_api.tracking import GeneralTracker, on_main_process


class WandBTracker(GeneralTracker):
    """One wandb run.

    :param run_name: the W&B project.
    :param kwargs: passed to ``wandb.init`` (``entity``, ``name``, ``mode``, ``dir``, ``tags``...).
    """

    name = "wandb"
    requires_logging_directory = False
    requires = ("wandb",)

    @on_main_process
    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        import wandb

        self.run_name = run_name
        self.run = wandb.init(project=run_name, **kwargs)

    @property
    def tracker(self) -> Any:
        return getattr(self, "run", None)

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        self.run.config.update(values, allow_val_change=True)

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Anything ``wandb.log`` accepts; ``kwargs`` go to ``run.log`` (``commit``...)."""
        self.run.log(values, step=step, **kwargs)

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """``values`` maps a key to a list of images (arrays, PIL images or tensors); ``kwargs`` go to
        ``wandb.Image`` (``caption``...)."""
        import wandb

        self.run.log(
            {key: [wandb.Image(image, **kwargs) for image in images] for key, images in values.items()},
            step=step,
        )

    @on_main_process
    def log_table(
        self,
        table_name: str,
        columns: list[str] | None = None,
        data: list[list[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Log a ``wandb.Table`` built from ``columns`` and ``data`` rows, or from a pandas ``dataframe``."""
        import wandb

        table = wandb.Table(columns=cast(Any, columns), data=data, dataframe=dataframe)
        self.run.log({table_name: table}, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        self.run.finish()
