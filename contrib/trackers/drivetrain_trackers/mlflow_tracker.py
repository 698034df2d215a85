"""MLflow. The store is MLflow's own choice (``MLFLOW_TRACKING_URI``, default ``./mlruns``) unless
``tracking_uri`` is given (``init_kwargs={"mlflow": {"tracking_uri": "sqlite:///mlflow.db"}}``)."""

from __future__ import annotations

import json
import os
from typing import Any

from drivetrain.plugin_api.settings import to_bool
from drivetrain.plugin_api.tracking import GeneralTracker, on_main_process
from drivetrain_trackers._values import flat_params, is_number, warn_skipped

# MLflow accepts at most this many parameters per call.
_PARAMS_PER_BATCH = 100


class MLflowTracker(GeneralTracker):
    """One MLflow run, in the experiment named ``experiment_name`` (created when missing).

    :param experiment_name: the experiment (``MLFLOW_EXPERIMENT_NAME`` wins when set).
    :param logging_dir: artifact location of a newly created experiment.
    :param run_id: resume this run (``MLFLOW_RUN_ID`` wins when set).
    :param tags: run and experiment tags (dict, or JSON in ``MLFLOW_TAGS``).
    :param nested_run: start the run nested in the active one (``MLFLOW_NESTED_RUN``).
    :param run_name: display name of the run.
    :param description: run description.
    :param tracking_uri: where runs are stored (``file:...``, ``sqlite:///...``, ``http://...``).
    """

    name = "mlflow"
    requires_logging_directory = False
    requires = ("mlflow",)

    def __init__(
        self,
        experiment_name: str | None = None,
        logging_dir: str | os.PathLike | None = None,
        run_id: str | None = None,
        tags: dict[str, Any] | str | None = None,
        nested_run: bool | str = False,
        run_name: str | None = None,
        description: str | None = None,
        tracking_uri: str | None = None,
    ) -> None:
        # the run is started by start() (init_trackers calls it): building the tracker before the Accelerator
        # touches no process state and no tracking store, as in Accelerate. MLflow's variables win over the
        # arguments, as MLflow's own tools read them.
        super().__init__()
        self.experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", experiment_name)
        self.logging_dir = logging_dir
        self.run_id = os.environ.get("MLFLOW_RUN_ID", run_id)
        tags = os.environ.get("MLFLOW_TAGS", tags)
        self.tags = json.loads(tags) if isinstance(tags, str) else tags
        self.nested_run = _as_bool(os.environ.get("MLFLOW_NESTED_RUN", nested_run))
        self.run_name = run_name
        self.description = description
        self.tracking_uri = tracking_uri
        self.active_run: Any = None

    @on_main_process
    def start(self) -> None:
        import mlflow

        if self.tracking_uri is not None:
            mlflow.set_tracking_uri(self.tracking_uri)
        name = self.experiment_name
        experiment = mlflow.get_experiment_by_name(name) if name else None
        if experiment is not None:
            experiment_id = experiment.experiment_id
        elif name:
            artifact_location = os.fspath(self.logging_dir) if self.logging_dir is not None else None
            experiment_id = mlflow.create_experiment(
                name, artifact_location=artifact_location, tags=self.tags
            )
        else:
            experiment_id = None
        self.active_run = mlflow.start_run(
            run_id=self.run_id,
            experiment_id=experiment_id,
            run_name=self.run_name,
            nested=self.nested_run,
            tags=self.tags,
            description=self.description,
        )

    @property
    def tracker(self) -> Any:
        return self.active_run

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        """Parameters, flattened (``a/b``) and cut to MLflow's length limit, sent in batches of 100."""
        import mlflow

        try:
            from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH
        except ImportError:  # pragma: no cover - moved in some MLflow version
            MAX_PARAM_VAL_LENGTH = 500
        params = {key: str(value)[:MAX_PARAM_VAL_LENGTH] for key, value in flat_params(values).items()}
        items = list(params.items())
        for start in range(0, len(items), _PARAMS_PER_BATCH):
            mlflow.log_params(dict(items[start : start + _PARAMS_PER_BATCH]))

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Numbers become metrics; MLflow stores nothing else as a metric."""
        import mlflow

        metrics = {key: value for key, value in values.items() if is_number(value)}
        warn_skipped(self.name, [key for key in values if key not in metrics])
        mlflow.log_metrics(metrics, step=step, **kwargs)

    @on_main_process
    def log_figure(self, figure: Any, artifact_file: str, **kwargs: Any) -> None:
        """A matplotlib or plotly figure saved as the artifact ``artifact_file``."""
        import mlflow

        mlflow.log_figure(figure=figure, artifact_file=artifact_file, **kwargs)

    @on_main_process
    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        import mlflow

        mlflow.log_artifact(local_path=local_path, artifact_path=artifact_path)

    @on_main_process
    def log_artifacts(self, local_dir: str, artifact_path: str | None = None) -> None:
        import mlflow

        mlflow.log_artifacts(local_dir=local_dir, artifact_path=artifact_path)

    @on_main_process
    def log_table(self, data: Any, artifact_file: str) -> None:
        """A dict of columns or a pandas DataFrame saved as a JSON table artifact."""
        import mlflow

        mlflow.log_table(data=data, artifact_file=artifact_file)

    @on_main_process
    def finish(self) -> None:
        import mlflow

        mlflow.end_run()


def _as_bool(value: bool | str) -> bool:
    """``MLFLOW_NESTED_RUN`` (or the ``nested_run`` argument) in the one boolean vocabulary of drivetrain's
    settings; empty means false. It can turn nesting off as well as on."""
    if isinstance(value, str) and not value.strip():
        return False
    return to_bool(value, "MLFLOW_NESTED_RUN")
