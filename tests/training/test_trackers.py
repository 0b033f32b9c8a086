"""Experiment trackers (train.trackers): W&B (offline) and MLflow (a local sqlite store)
receive every metrics.jsonl row with its step and the config as parameters; a resumed
run continues the same tracker run; process 1 writes nothing; a missing package is a
one-line error naming the extra."""

import glob
import importlib.util
import json
import logging
import os
import struct
import sys
import types

import numpy as np
import pytest

from kroberta import train
from kroberta.config import validate
from kroberta.errors import ConfigError, TrackerError
from kroberta.training import run_callbacks, trackers
from tests.conftest import tiny_config

needs_wandb = pytest.mark.skipif(
    importlib.util.find_spec("wandb") is None,
    reason='the W&B tracker needs: pip install "kroberta[wandb]"',
)
needs_mlflow = pytest.mark.skipif(
    importlib.util.find_spec("mlflow") is None,
    reason='the MLflow tracker needs: pip install "kroberta[mlflow]"',
)


def _rows(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def _logged(rows) -> dict:
    """{(split/key, step): value} of every number in metrics.jsonl."""
    return {(f"{r['split']}/{k}", r["step"]): v for r in rows for k, v in trackers.numeric_items(r)}


# A real run twice over (to step 20, then resumed): slow. Their fast twin:
# test_the_wandb_tracker_resumes_its_run (and the unit tests below).
@pytest.fixture(scope="module")
def tracked_run(tiny_data, tmp_path_factory):
    """A tiny run to step 20, resumed to 40, logging to W&B (offline) and MLflow (sqlite)."""
    root = tmp_path_factory.mktemp("tracked")
    run_dir = root / "run"
    config = tiny_config(
        tiny_data,
        run_dir,
        steps=40,
        eval_every=20,
        checkpoint_every=20,
        trackers=("tensorboard", "wandb", "mlflow"),
    )
    uri = f"sqlite:///{root / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_MODE", "offline")
        patch.setenv("WANDB_SILENT", "true")
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        train(config, until_step=20)
        ids_after_first = trackers.read_ids(str(run_dir))
        train(config)
    import wandb

    wandb.teardown()  # the offline files whole before they are read (see the test below)
    return run_dir, uri, ids_after_first


@pytest.mark.slow
@needs_wandb
@needs_mlflow
def test_mlflow_holds_every_row_of_metrics_jsonl_in_one_resumed_run(tracked_run):
    from mlflow.tracking import MlflowClient

    run_dir, uri, first_ids = tracked_run
    client = MlflowClient(tracking_uri=uri)
    run_id = trackers.read_ids(str(run_dir))["mlflow"]
    assert run_id == first_ids["mlflow"]  # the resume continued the same run
    experiment = client.get_experiment_by_name("kroberta")
    assert len(client.search_runs([experiment.experiment_id])) == 1
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["train.steps"] == "40"
    assert run.data.params["data.validation"].endswith('validation.tfrecord"]')
    expected = _logged(_rows(run_dir))
    got = {
        (key, m.step): m.value
        for key in {k for k, _ in expected}
        for m in client.get_metric_history(run_id, key)
    }
    assert got == pytest.approx(expected)
    assert {
        ("validation/loss", 20),
        ("validation/loss", 40),
        ("checkpoint/checkpoint_blocked_seconds", 20),
        ("train/loss", 10),
        ("train/loss", 40),
    } <= set(got)


def _wandb_records(path):
    """The protobuf records of a .wandb file (a LevelDB-style log of 32 KiB blocks)."""
    from wandb.proto import wandb_internal_pb2

    data, block, position, pending = open(path, "rb").read(), 32768, 7, b""
    assert data[:4] == b":W&B"
    while position + 7 <= len(data):
        left = block - position % block
        if left < 7:  # a block's tail too short for a header is padding
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        chunk = data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # FULL, LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending + chunk)
            pending = b""
            yield record
        elif kind in (2, 3):  # FIRST, MIDDLE
            pending += chunk
        else:
            position += left - 7 - length  # zero padding to the block's end


@pytest.mark.slow
@needs_wandb
@needs_mlflow
def test_wandb_offline_files_hold_every_row_of_metrics_jsonl_in_one_resumed_run(tracked_run):
    run_dir, _, first_ids = tracked_run
    run_id = trackers.read_ids(str(run_dir))["wandb"]
    assert run_id == first_ids["wandb"]
    files = _wandb_run_files(run_dir, run_id)
    assert len(files) == 2  # one per invocation, both of the same W&B run
    got, config = {}, {}
    for path in files:
        for record in _wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                items = {
                    i.key or "/".join(i.nested_key): json.loads(i.value_json)
                    for i in record.history.item
                }
                got.update({(k, items["step"]): v for k, v in items.items() if "/" in k})
            elif kind in ("run", "config"):
                update = record.run.config.update if kind == "run" else record.config.update
                config.update({i.key: json.loads(i.value_json) for i in update})
    assert got == pytest.approx(_logged(_rows(run_dir)))
    assert config["train.steps"] == "40" and config["model.hidden_dim"] == "32"


@pytest.mark.slow
@needs_wandb
@needs_mlflow
def test_tensorboard_is_a_tracker_like_the_others(tracked_run):
    run_dir, _, _ = tracked_run
    assert os.listdir(os.path.join(run_dir, "tensorboard"))


def _wandb_run_files(run_dir, run_id) -> list[str]:
    """The offline files of W&B run `run_id`, one per invocation, in the order W&B made them."""

    def started(path):
        # offline-run-<time>-<id>, and "-1", "-2", ... after it for a run that resumed
        # within the same second (plain sorting puts "-1" first).
        name = os.path.basename(os.path.dirname(path))
        stamp, _, rest = name[len("offline-run-") :].partition(f"-{run_id}")
        return stamp, int(rest.lstrip("-") or 0)

    return sorted(
        glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", f"run-{run_id}.wandb")),
        key=started,
    )


def _wandb_history(run_dir, run_id) -> list[dict]:
    rows = []
    for path in _wandb_run_files(run_dir, run_id):
        for record in _wandb_records(path):
            if record.WhichOneof("record_type") == "history":
                items = {
                    i.key or "/".join(i.nested_key): json.loads(i.value_json)
                    for i in record.history.item
                }
                rows.append({k: v for k, v in items.items() if not k.startswith("_")})
    return rows


@needs_wandb
def test_the_wandb_tracker_resumes_its_run(tmp_path, monkeypatch):
    import wandb

    from kroberta.config import Config

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    first = trackers.WandB(Config(), str(tmp_path))
    first.log({"step": 10, "split": "train", "loss": 2.0, "grad_norm": 1.5})
    first.log({"step": 10, "split": "checkpoint", "checkpoint_blocked_seconds": 0.1})
    first.close()
    again = trackers.WandB(Config(), str(tmp_path))  # a resume: the id from trackers.json
    again.log({"step": 20, "split": "validation", "loss": 1.0})
    again.close()
    # W&B's service writes the offline file beside sending, and finish() waits only for the
    # sending: its teardown waits for the writing too, so the file is whole when read.
    wandb.teardown()
    run_id = trackers.read_ids(str(tmp_path))["wandb"]
    assert _wandb_history(tmp_path, run_id) == [
        {"step": 10, "train/loss": 2.0, "train/grad_norm": 1.5},
        {"step": 10, "checkpoint/checkpoint_blocked_seconds": 0.1},
        {"step": 20, "validation/loss": 1.0},
    ]


def _logger(config, write_files):
    return run_callbacks.RunLogger(
        config, 0, 16, 32, None, stop_step=10, write_files=write_files, save_checkpoints=False
    )


@pytest.mark.fast
def test_process_1_writes_nothing(tiny_data, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'never.db'}")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = validate(tiny_config(tiny_data, run_dir, trackers=("tensorboard", "wandb", "mlflow")))
    logger = _logger(config, write_files=False)
    assert logger._trackers == []
    logger.close()
    assert os.listdir(run_dir) == [] and os.listdir(tmp_path) == ["run"]


class _Optimizer:
    def __init__(self, step):
        self.iterations = types.SimpleNamespace(numpy=lambda: step)
        self.learning_rate = np.float32(1e-3)


def test_every_number_the_step_logs_reaches_the_row_the_line_and_the_trackers(
    tiny_data, tmp_path, caplog
):
    caplog.set_level(logging.INFO, logger="kroberta")
    config = validate(
        tiny_config(
            tiny_data,
            tmp_path,
            trackers=(),
            log_every=10,
            steps=10,
            warmup_steps=0,
            steps_per_execution=10,
        )
    )
    logger = _logger(config, write_files=True)
    seen = []
    logger._trackers = [types.SimpleNamespace(log=seen.append, close=lambda failed: None)]
    logger.set_model(types.SimpleNamespace(optimizer=_Optimizer(10), stop_training=False))
    logger.on_epoch_begin(0)
    logger.on_train_batch_begin(0)
    logger.on_epoch_end(
        0,
        {
            "loss": 9.0,
            "perplexity": np.float32(np.e),
            "masked_accuracy": 0.5,
            "grad_norm": np.float32(2.5),
            "note": "text",
        },
    )
    logger.close()
    [row] = [r for r in _rows(tmp_path) if r["split"] == "train"]
    assert row["grad_norm"] == 2.5 and row["loss"] == pytest.approx(1.0) and "note" not in row
    assert seen[0] == row
    assert "grad_norm 2.5" in caplog.text


@pytest.mark.parametrize("name", ["wandb", "mlflow"])
@pytest.mark.fast
def test_a_missing_tracker_package_is_a_one_line_error(tiny_data, tmp_path, monkeypatch, name):
    monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed
    config = validate(tiny_config(tiny_data, tmp_path, trackers=(name,)))
    with pytest.raises(
        ConfigError,
        match=rf'"{name}" needs the {name} package: '
        rf'pip install "kroberta\[{name}\]"',
    ):
        trackers.check_installed(config.train.trackers)


@pytest.mark.fast
def test_a_missing_tracker_package_is_named_before_the_data_are_read(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    # Files that are no TFRecords: reading them first would be an InputError.
    data = tmp_path / "no-data"
    data.mkdir()
    for name in ("train-0.tfrecord", "validation.tfrecord"):
        (data / name).write_text("not a TFRecord")
    config = tiny_config(data, tmp_path / "run", trackers=("wandb",))
    with pytest.raises(ConfigError, match=r'"wandb" needs the wandb package'):
        train(config)


@pytest.mark.fast
def test_a_tracker_that_fails_to_start_is_a_one_line_error(tiny_data, tmp_path, monkeypatch):
    class Refusing:
        def __init__(self, config, run_dir):
            raise RuntimeError(
                "No API key configured. Use `wandb login` to log in.\n"
                "  (the library's own second line)"
            )

    monkeypatch.setitem(trackers._KINDS, "wandb", Refusing)
    config = validate(tiny_config(tiny_data, tmp_path, trackers=("wandb",)))
    with pytest.raises(TrackerError) as raised:
        trackers.open_trackers(config, str(tmp_path))
    assert str(raised.value) == (
        'train.trackers: "wandb" could not start the run: No API key '
        "configured. Use `wandb login` to log in.; log in (wandb login, "
        "or WANDB_API_KEY) or set WANDB_MODE=offline"
    )


@pytest.mark.fast
def test_an_unknown_tracker_is_a_config_error(tiny_data, tmp_path):
    with pytest.raises(ConfigError, match=r"train.trackers: unknown tracker 'neptune'"):
        validate(tiny_config(tiny_data, tmp_path, trackers=("tensorboard", "neptune")))


@pytest.mark.fast
def test_another_model_forced_into_the_run_dir_starts_new_tracker_runs(tmp_path):
    trackers._keep_id(str(tmp_path), "mlflow", "abc")
    assert trackers.read_ids(str(tmp_path)) == {"mlflow": "abc"}
    trackers.forget_runs(str(tmp_path))  # what train --force does for another model
    assert trackers.read_ids(str(tmp_path)) == {}


@needs_wandb
def test_wandb_mode_set_after_a_failed_start_is_taken(tmp_path):
    """In a notebook: W&B refuses to start without an account, the user sets WANDB_MODE as
    the error says, and the next start is offline (W&B reads its environment once per
    process: the mode is passed to it each time). In a fresh process, as a notebook is."""
    import subprocess

    script = (
        "import os\n"
        "from kroberta.config import Config\n"
        "from kroberta.errors import KrobertaError\n"
        "from kroberta.training.trackers import WandB\n"
        "try:\n"
        f"    WandB(Config(), {str(tmp_path / 'run')!r})\n"
        "except Exception as e:\n"
        "    print('refused:', type(e).__name__)\n"
        "os.environ['WANDB_MODE'] = 'offline'\n"
        f"run = WandB(Config(), {str(tmp_path / 'run')!r})\n"
        "run.log({'step': 1, 'split': 'train', 'loss': 1.0})\n"
        "run.close()\n"
        "print('offline run closed')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "HOME": str(tmp_path), "WANDB_SILENT": "true"},
        cwd=tmp_path,
    )
    assert done.stdout.splitlines() == ["refused: UsageError", "offline run closed"], done.stderr
    assert glob.glob(str(tmp_path / "run" / "wandb" / "offline-run-*"))
