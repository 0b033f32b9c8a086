"""Fault injection: kill -9, SIGTERM, planted NaN, unwritable run_dir, disk full, bad data."""

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from kroberta import train
from kroberta.data.synthetic import make_sequences, write_tfrecord
from kroberta.errors import InputError, StorageError
from kroberta.training import checkpoint
from tests.conftest import REPO, tiny_config
from tests.pretraining.test_train import _rows, _weights

STEPS = 200


def _command(data_dir, run_dir, *extra):
    return [
        sys.executable,
        "-m",
        "kroberta.train",
        "--config",
        "tiny",
        f"--data.train={data_dir}/train-*.tfrecord",
        f"--run_dir={run_dir}",
        f"--train.steps={STEPS}",
        "--train.checkpoint_every=20",
        "--train.eval_every=0",
        "--train.log_every=10",
        *extra,
    ]


def _start_and_wait_for_step(command, run_dir, step, timeout=240, committed=False):
    """Starts `command`; returns once it logged `step` (and, with `committed`, once a
    checkpoint is committed: asynchronous ones commit some steps after their own)."""
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    metrics = os.path.join(run_dir, "metrics.jsonl")
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.isfile(metrics):
            with open(metrics) as f:
                steps = [json.loads(line)["step"] for line in f if line.strip().endswith("}")]
            if (
                steps
                and steps[-1] >= step
                and (not committed or checkpoint.list_checkpoints(str(run_dir)))
            ):
                return process
        if process.poll() is not None:
            raise AssertionError(f"training ended early: {process.stderr.read().decode()[-2000:]}")
        time.sleep(0.05)
    process.kill()
    raise AssertionError("training did not reach the step in time")


@pytest.fixture(scope="module")
def reference(tiny_data, tmp_path_factory):
    """The uninterrupted run every interrupted one must reproduce."""
    run_dir = tmp_path_factory.mktemp("reference")
    train(tiny_config(tiny_data, run_dir, steps=STEPS, checkpoint_every=20, eval_every=0))
    return _weights(run_dir)


def _assert_same_run(run_dir, reference, stopped_at=None):
    for key, value in _weights(run_dir).items():
        np.testing.assert_array_equal(value, reference[key])  # bitwise on CPU
    steps = [r["step"] for r in _rows(run_dir)]
    # One row per log interval, none repeated or missing; a SIGTERM adds one row for
    # the partial interval it cut short.
    expected = sorted(set(range(10, STEPS + 1, 10)) | ({stopped_at} if stopped_at else set()))
    assert steps == expected, "no duplicated or missing steps"


@pytest.mark.parametrize("kill_seed", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_kill_9_at_a_random_moment_then_resume(tiny_data, tmp_path, reference, kill_seed):
    run_dir = tmp_path / "run"
    command = _command(tiny_data, run_dir)
    process = _start_and_wait_for_step(command, run_dir, 30, committed=True)
    time.sleep(random.Random(kill_seed).uniform(0.0, 1.0))  # somewhere in a step or a checkpoint
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL
    resumed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming from" in resumed.stderr
    _assert_same_run(run_dir, reference)


def test_kill_9_during_an_asynchronous_checkpoint_write_then_resume(tiny_data, tmp_path, reference):
    run_dir, marker = tmp_path / "run", tmp_path / "holding-the-commit"
    # The 2nd checkpoint (step 40) is written in the background and never committed.
    gated = [
        sys.executable,
        "tests/training/checkpoint_gate_worker.py",
        "2",
        str(marker),
        *_command(tiny_data, run_dir)[3:],
    ]
    process = _start_and_wait_for_step(gated, run_dir, 50)  # trained on during the write
    deadline = time.time() + 120
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "the step-40 write never reached its commit"
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert [s for s, _ in checkpoint.list_checkpoints(str(run_dir))] == [20]
    assert [
        n
        for n in os.listdir(run_dir / "checkpoints")
        if n.startswith("step_00000040.orbax-checkpoint-tmp")
    ], "killed mid-write"
    resumed = subprocess.run(
        _command(tiny_data, run_dir), cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "(step 20)" in resumed.stderr
    _assert_same_run(run_dir, reference)


def test_sigterm_writes_a_checkpoint_at_the_current_step_and_resume_matches(
    tiny_data, tmp_path, reference
):
    run_dir = tmp_path / "run"
    command = _command(tiny_data, run_dir)
    process = _start_and_wait_for_step(command, run_dir, 30)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 143
    saved = checkpoint.list_checkpoints(str(run_dir))
    last_step = saved[-1][0]
    assert last_step >= 30
    assert not (run_dir / "model.weights.h5").exists(), "a stopped run is not a finished model"
    resumed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"(step {last_step})" in resumed.stderr
    _assert_same_run(run_dir, reference, stopped_at=last_step)


@pytest.mark.slow  # a real half-written one (kill -9 mid-write, above) stays in the default suite
def test_half_written_checkpoints_are_never_loaded(tiny_data, tmp_path):
    run_dir = tmp_path / "run"
    config = tiny_config(tiny_data, run_dir, steps=40, checkpoint_every=20, eval_every=0)
    train(config, until_step=20)
    root = run_dir / "checkpoints"
    # What a kill during a checkpoint write leaves: Orbax's temporary directory, or a
    # directory whose completion marker (written last) is missing.
    partial = root / "step_00000030.orbax-checkpoint-tmp-1234"
    partial.mkdir()
    (partial / "state").mkdir()
    (root / "step_00000030").mkdir()
    (root / "step_00000030" / "state").mkdir()
    assert [s for s, _ in checkpoint.list_checkpoints(str(run_dir))] == [20]
    summary = train(config)
    assert summary["start_step"] == 20 and summary["final_step"] == 40
    assert not partial.exists()


def test_keeps_only_the_last_checkpoints(tiny_data, tmp_path):
    run_dir = tmp_path / "run"
    train(
        tiny_config(
            tiny_data, run_dir, steps=60, checkpoint_every=10, eval_every=0, keep_checkpoints=3
        )
    )
    assert [s for s, _ in checkpoint.list_checkpoints(str(run_dir))] == [40, 50, 60]
    # A checkpoint whose data files were cut short (a partial copy): one error naming it.
    import glob

    import kroberta

    step = dict(checkpoint.list_checkpoints(str(run_dir)))[60]
    for path in glob.glob(os.path.join(step, "state", "**", "d", "*"), recursive=True):
        with open(path, "r+b") as f:
            f.truncate(10)
    with pytest.raises(InputError, match=rf"{step}: cannot read this checkpoint: damaged"):
        kroberta.load(str(run_dir), checkpoint=60)


def test_nan_loss_stops_with_the_step_and_the_run_resumes_from_the_last_good_checkpoint(
    tiny_data, tmp_path
):
    run_dir = tmp_path / "run"
    config = tiny_config(
        tiny_data,
        run_dir,
        steps=200,
        checkpoint_every=10,
        eval_every=0,
        learning_rate=1e9,
        clip_norm=0.0,
        warmup_steps=0,
    )
    with pytest.raises(
        FloatingPointError,
        match=r"loss became (nan|inf) by step (\d+).*"
        r"train.learning_rate.*train.clip_norm",
    ):
        train(config)
    saved = [s for s, _ in checkpoint.list_checkpoints(str(run_dir))]
    rows = _rows(run_dir)
    bad_step = next(r["step"] for r in rows if not np.isfinite(r["loss"]))
    assert all(s < bad_step for s in saved), "no checkpoint at or after the step that diverged"
    # The fix the message points at: a sane learning rate; the run resumes and trains.
    sane = tiny_config(tiny_data, run_dir, steps=200, checkpoint_every=10, eval_every=0)
    summary = train(
        dataclasses.replace(sane, train=dataclasses.replace(sane.train, steps=200)),
        until_step=(saved[-1] if saved else 0) + 10,
    )
    assert summary["start_step"] == (saved[-1] if saved else 0)
    assert np.isfinite(_rows(run_dir)[-1]["loss"])


def test_unwritable_run_dir_fails_before_any_work(tiny_data, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    config = tiny_config(tiny_data, blocker / "run", steps=10, warmup_steps=0)
    with pytest.raises(
        StorageError,
        match=r"^run_dir .*/a_file/run: .*/a_file is a file, not a "
        r"folder; choose another run_dir$",
    ):
        train(config)


@pytest.mark.slow  # the background-write case stays in the default suite
def test_disk_full_during_a_checkpoint_keeps_the_previous_ones(tiny_data, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    config = tiny_config(tiny_data, run_dir, steps=40, checkpoint_every=20, eval_every=0)
    train(config, until_step=20)
    before = checkpoint.list_checkpoints(str(run_dir))
    real = checkpoint._checkpointer

    class FullDisk:
        """Starts writing like Orbax (a temporary directory), then the disk is full."""

        def __init__(self, inner):
            self.inner = inner  # restoring still works

        def __enter__(self):
            self.inner.__enter__()
            return self

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

        def restore(self, *args, **kwargs):
            return self.inner.restore(*args, **kwargs)

        def save(self, path, **kwargs):
            os.makedirs(path + ".orbax-checkpoint-tmp-77/state")
            raise OSError(28, "No space left on device")

        def wait_until_finished(self):
            pass

        def close(self):
            self.inner.close()

    monkeypatch.setattr(checkpoint, "_checkpointer", lambda asynchronous=False: FullDisk(real()))
    with pytest.raises(
        StorageError,
        match=r"step 40 .*No space left on device \([0-9.]+ MiB free there\); "
        r"the previous checkpoints are intact",
    ):
        train(config)
    assert checkpoint.list_checkpoints(str(run_dir)) == before
    assert not [n for n in os.listdir(run_dir / "checkpoints") if "tmp" in n]


def test_disk_full_in_the_background_write_fails_the_run_and_keeps_the_previous_ones(
    tiny_data, tmp_path, monkeypatch
):
    run_dir = tmp_path / "run"
    config = tiny_config(tiny_data, run_dir, steps=40, checkpoint_every=20, eval_every=0)
    train(config, until_step=20)
    before = checkpoint.list_checkpoints(str(run_dir))
    assert not (run_dir / "model.weights.h5").exists()  # --until-step: no final model yet
    real = checkpoint._checkpointer

    class FullDiskLater:
        """An asynchronous write that starts fine; the disk fills while it runs."""

        def __init__(self, inner):
            self.inner = inner

        def save(self, path, **kwargs):
            os.makedirs(path + ".orbax-checkpoint-tmp-78/state")

        def wait_until_finished(self):
            raise OSError(28, "No space left on device")

        def close(self):
            self.inner.close()

    monkeypatch.setattr(
        checkpoint,
        "_checkpointer",
        lambda asynchronous=False: FullDiskLater(real(asynchronous)) if asynchronous else real(),
    )
    # The step-40 write fails after its save returned: the end of the run waits for it.
    with pytest.raises(
        StorageError,
        match=r"step 40 .*No space left on device \([0-9.]+ MiB free there\); "
        r"the previous checkpoints are intact",
    ):
        train(config)
    assert checkpoint.list_checkpoints(str(run_dir)) == before
    assert not [n for n in os.listdir(run_dir / "checkpoints") if "tmp" in n]
    assert not (run_dir / "model.weights.h5").exists(), "no final model without its checkpoint"


def test_bad_data_from_the_command_line_is_exit_2_with_file_record_feature(tmp_path):
    ids, mask = make_sequences(40, 32, 512, seed=1)
    ids[27, 3] = 600
    write_tfrecord(str(tmp_path / "train-0.tfrecord"), ids, mask)
    result = subprocess.run(
        _command(tmp_path, tmp_path / "run"), cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 2
    assert (
        "train-0.tfrecord: record 27: feature 'input_ids' holds id 600 outside the vocabulary"
        in result.stderr
    )
    assert "Traceback" not in result.stderr


def test_a_corrupt_record_under_static_masking_is_named_before_training(tiny_data, tmp_path):
    """Static masking samples the labels before training starts: a byte flipped inside a
    record is named by file and record there too, not raised as TensorFlow's DataLossError."""
    from kroberta.data.synthetic import write_seed_format

    path = tmp_path / "train-0.tfrecord"
    write_seed_format(str(path), 64, 32, 512, seed=3)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    config = tiny_config(tmp_path, tmp_path / "run", steps=2, warmup_steps=0)
    config = dataclasses.replace(
        config, data=dataclasses.replace(config.data, masking="static", validation=())
    )
    with pytest.raises(InputError, match=r"train-0.tfrecord: record \d+: corrupt or truncated"):
        train(config)
