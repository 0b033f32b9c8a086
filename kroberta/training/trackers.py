"""Where a run's metrics go besides metrics.jsonl (`train.trackers`).

"tensorboard" (run_dir/tensorboard), "wandb" (Weights & Biases) and "mlflow". Only
process 0 opens trackers. Each receives every metrics.jsonl row (train, validation,
checkpoint and the probe's "downstream/<task>" rows) with its step, each number as
"<split>/<key>"; W&B and MLflow also receive the resolved config as the run's parameters. A resumed run continues the same tracker run: the W&B and
MLflow run ids are kept in run_dir/trackers.json.

W&B reads its usual environment (WANDB_PROJECT, WANDB_ENTITY, WANDB_MODE=offline,
WANDB_DIR: the files default to run_dir/wandb); MLflow reads MLFLOW_TRACKING_URI
(default: MLflow's own, a store in the current directory) and MLFLOW_EXPERIMENT_NAME (default "kroberta").
"""

import contextlib
import errno
import importlib
import json
import os
import time
import uuid

from kroberta import storage
from kroberta.config import to_dict
from kroberta.errors import ConfigError, TrackerError

IDS_FILE = "trackers.json"
EXPERIMENT = "kroberta"  # W&B project and MLflow experiment when the environment names none


def numeric_items(row: dict):
    """(key, float) for the row's numbers (not its step, split, or flags)."""
    for key, value in row.items():
        if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
            yield key, float(value)


def read_ids(run_dir: str) -> dict:
    """{tracker: run id} of the trackers this run directory's run has used."""
    path = storage.join(run_dir, IDS_FILE)
    if not storage.isfile(path):
        return {}
    return json.loads(storage.read_text(path))


def forget_runs(run_dir: str):
    """Makes the next run in `run_dir` start new tracker runs (`--force`: another model)."""
    storage.remove(storage.join(run_dir, IDS_FILE))


def _keep_id(run_dir: str, tracker: str, run_id: str):
    ids = read_ids(run_dir)
    if ids.get(tracker) != run_id:
        ids[tracker] = run_id
        storage.write_text(storage.join(run_dir, IDS_FILE), json.dumps(ids, indent=1))


def _import(tracker: str):
    try:
        return importlib.import_module(tracker)
    except ImportError:
        raise ConfigError(
            f'train.trackers: "{tracker}" needs the {tracker} package: '
            f'pip install "kroberta[{tracker}]"'
        ) from None


def _flat_params(config) -> dict:
    """The resolved config as {"section.key": value}, values as strings."""
    flat = {}
    for name, value in to_dict(config).items():
        if isinstance(value, dict):
            flat.update({f"{name}.{k}": v for k, v in value.items()})
        else:
            flat[name] = value
    return {k: json.dumps(v) if isinstance(v, (list, tuple)) else str(v) for k, v in flat.items()}


class TensorBoard:
    """Scalars under "<split>/<key>" in run_dir/tensorboard.

    On a URL run dir the event files are written in a local temporary directory and
    uploaded (whole: object stores have no append) after every row, through the same
    filesystem as the run's other files (TensorFlow's own knows gs:// only).
    """

    def __init__(self, config, run_dir: str):
        # start-up: TensorFlow loads when a TensorBoard run opens
        import tensorflow as tf

        self._tf = tf
        self._target = storage.join(run_dir, "tensorboard")
        self._staging = storage.staging_dir(run_dir, "tensorboard")
        self._writer = tf.summary.create_file_writer(self._staging or self._target)

    def log(self, row: dict):
        with self._writing():
            with self._writer.as_default(step=row["step"]):
                for key, value in numeric_items(row):
                    self._tf.summary.scalar(f"{row['split']}/{key}", value)
            if self._staging is not None:
                self._writer.flush()
                storage.put_tree(self._staging, self._target)

    def close(self, failed: bool = False):
        # After a failure (a full disk, say) the first error is the one to report.
        with (
            contextlib.suppress(Exception) if failed else contextlib.nullcontext(),
            self._writing(),
        ):
            self._writer.close()
            if self._staging is not None:
                storage.put_tree(self._staging, self._target, remove=True)

    @contextlib.contextmanager
    def _writing(self):
        """A failed write is one StorageError (`storage.writing`). TensorFlow's event writer
        reports a full disk as its ResourceExhaustedError, which would read as the host's
        memory running out: it becomes the OSError it stands for."""
        with storage.writing(
            self._target,
            "TensorBoard events",
            "the checkpoints are intact; free some space and run the same training again to resume",
        ):
            try:
                yield
            except self._tf.errors.OpError as error:
                full = "No space left on device" in error.message
                raise OSError(
                    errno.ENOSPC if full else errno.EIO,
                    os.strerror(errno.ENOSPC) if full else error.message.strip().splitlines()[0],
                ) from None


class WandB:
    """One W&B run per run directory: "<split>/<key>" against the run's own "step".

    The step is a logged metric (W&B's `define_metric`), not W&B's internal step
    counter, which only grows: a resumed run logs again from its checkpoint's step.
    """

    def __init__(self, config, run_dir: str):
        wandb = _import("wandb")
        # W&B ids: up to 64 lowercase letters and digits, unique in the project.
        run_id = read_ids(run_dir).get("wandb") or uuid.uuid4().hex[:16]
        # W&B keeps its local files in a directory: a URL run dir leaves them to W&B's default.
        directory = os.environ.get("WANDB_DIR") or (None if storage.is_url(run_dir) else run_dir)
        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or EXPERIMENT,
            name=storage.basename(storage.absolute(run_dir)),
            id=run_id,
            resume="allow",
            dir=directory,
            config=_flat_params(config),
            reinit="create_new",
            # Read now: W&B reads its environment once per process, so a WANDB_MODE set in
            # a notebook after a failed start would be ignored.
            mode=os.environ.get("WANDB_MODE") or None,
        )
        self._run.define_metric("step")
        self._run.define_metric("*", step_metric="step")
        _keep_id(run_dir, "wandb", run_id)

    def log(self, row: dict):
        self._run.log(
            {"step": row["step"], **{f"{row['split']}/{k}": v for k, v in numeric_items(row)}}
        )

    def close(self, failed: bool = False):
        self._run.finish(exit_code=1 if failed else 0)


class MLflow:
    """One MLflow run per run directory, in the experiment MLFLOW_EXPERIMENT_NAME."""

    def __init__(self, config, run_dir: str):
        _import("mlflow")
        # the mlflow extra: loads when an MLflow run opens
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient()
        run_id = read_ids(run_dir).get("mlflow")
        if run_id:
            self._client.update_run(run_id, status="RUNNING")
        else:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or EXPERIMENT
            experiment = self._client.get_experiment_by_name(name)
            experiment_id = (
                experiment.experiment_id if experiment else self._client.create_experiment(name)
            )
            run_id = self._client.create_run(
                experiment_id, run_name=storage.basename(storage.absolute(run_dir))
            ).info.run_id
            # Parameters once: MLflow refuses a parameter logged again with another value.
            params = [Param(k, v) for k, v in _flat_params(config).items()]
            for i in range(0, len(params), 100):  # MLflow's batch limit
                self._client.log_batch(run_id, params=params[i : i + 100])
            _keep_id(run_dir, "mlflow", run_id)
        self._run_id = run_id

    def log(self, row: dict):
        # the mlflow extra
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._client.log_batch(
            self._run_id,
            metrics=[
                Metric(f"{row['split']}/{k}", v, now, row["step"]) for k, v in numeric_items(row)
            ],
        )

    def close(self, failed: bool = False):
        self._client.set_terminated(self._run_id, status="FAILED" if failed else "FINISHED")


_KINDS = {"tensorboard": TensorBoard, "wandb": WandB, "mlflow": MLflow}


def check_installed(names):
    """Raises the one-line ConfigError of a tracker of `names` (`train.trackers`) whose
    package is missing."""
    for name in names:
        if name != "tensorboard":
            _import(name)


# What to do when a tracker's own start fails.
_START_HINTS = {
    "wandb": "log in (wandb login, or WANDB_API_KEY) or set WANDB_MODE=offline",
    "mlflow": "check MLFLOW_TRACKING_URI and that its server is up",
    "tensorboard": "check that run_dir/tensorboard can be written",
}


def open_trackers(config, run_dir: str) -> list:
    """The trackers `train.trackers` names, opened (resuming their runs); process 0 only.
    A tracker that fails to start is a one-line TrackerError naming it."""
    opened = []
    for name in config.train.trackers:
        try:
            opened.append(_KINDS[name](config, run_dir))
        except ConfigError:
            raise
        except Exception as error:  # each library raises its own kinds
            first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise TrackerError(
                f'train.trackers: "{name}" could not start the run: '
                f"{first_line[:300]}; {_START_HINTS[name]}"
            ) from None
    return opened
