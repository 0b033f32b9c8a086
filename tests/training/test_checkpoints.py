"""Asynchronous checkpoints: equal to synchronous ones bit for bit, committed in the background."""

import json
import os
import threading

import keras
import numpy as np
import orbax.checkpoint as ocp
import pytest

from kroberta import train
from kroberta.training import checkpoint
from tests.conftest import tiny_config
from tests.pretraining.test_train import _weights


def _state(path):
    """A checkpoint's variables as numpy arrays, by key."""
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as reader:
        state = reader.restore(path, args=ocp.args.Composite(state=ocp.args.StandardRestore()))[
            "state"
        ]
    return {
        f"{group}/{i}": np.asarray(value)
        for group, values in state.items()
        for i, value in enumerate(values)
    }


def _checkpoint_rows(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["split"] == "checkpoint"]


@pytest.mark.slow  # async saves and their resume are also under kill -9 in the default suite
def test_async_and_sync_checkpoints_are_bitwise_equal_and_resume_alike(tiny_data, tmp_path):
    runs = {}
    for mode in ("async", "sync"):
        runs[mode] = tmp_path / mode
        config = tiny_config(
            tiny_data,
            runs[mode],
            steps=40,
            checkpoint_every=10,
            eval_every=20,
            keep_checkpoints=4,
            async_checkpoints=(mode == "async"),
        )
        if mode == "async":  # stopped and resumed: the resume reads an async checkpoint
            train(config, until_step=20)
        train(config)
    saved = {mode: dict(checkpoint.list_checkpoints(str(d))) for mode, d in runs.items()}
    assert sorted(saved["async"]) == sorted(saved["sync"]) == [10, 20, 30, 40]
    for step in (10, 20, 30, 40):
        a, s = _state(saved["async"][step]), _state(saved["sync"][step])
        assert a.keys() == s.keys() and len(a) > 30
        for key in a:
            np.testing.assert_array_equal(a[key], s[key], err_msg=f"step {step} {key}")
    final_async, final_sync = _weights(runs["async"]), _weights(runs["sync"])
    for key in final_sync:
        np.testing.assert_array_equal(final_async[key], final_sync[key])
    # One row per checkpoint with the time the step loop was blocked.
    for run_dir in runs.values():
        rows = _checkpoint_rows(run_dir)
        assert [r["step"] for r in rows] == [10, 20, 30, 40]
        assert all(
            isinstance(r["checkpoint_blocked_seconds"], float)
            and r["checkpoint_blocked_seconds"] >= 0
            for r in rows
        )


@pytest.fixture
def model(tiny_data, tmp_path):
    from kroberta.model.mlm import build_compiled_model
    from kroberta.perf.plan import for_local_devices

    keras.distribution.set_distribution(None)
    return build_compiled_model(for_local_devices(tiny_config(tiny_data, tmp_path)))


@pytest.fixture
def held_commits(monkeypatch):
    """Asynchronous writes whose commit waits for `release.set()` (files already written)."""
    release = threading.Event()
    real = checkpoint._checkpointer

    def gated(asynchronous=False):
        if not asynchronous:
            return real()
        options = ocp.options.AsyncOptions(post_finalization_callback=release.wait)
        return ocp.AsyncCheckpointer(ocp.CompositeCheckpointHandler(), async_options=options)

    monkeypatch.setattr(checkpoint, "_checkpointer", gated)
    yield release
    release.set()  # never leave a background thread waiting


def test_save_returns_before_the_commit_with_the_values_of_its_step(model, tmp_path, held_commits):
    run_dir = str(tmp_path / "run")
    at_save = [np.array(v.value) for v in model.variables]
    writer = checkpoint.Writer(run_dir, keep=2, asynchronous=True)
    writer.save(model, 7)
    assert checkpoint.list_checkpoints(run_dir) == [], "not committed while the commit is held"
    # Training goes on meanwhile: the next steps replace every variable's value.
    for v in model.variables:
        v.assign(v.value + 1 if "float" in str(v.dtype) else v.value)
    held_commits.set()
    assert writer.wait() >= 0
    writer.close()
    [(step, path)] = checkpoint.list_checkpoints(run_dir)
    assert step == 7
    checkpoint.restore(model, path)
    for v, value in zip(model.variables, at_save):
        np.testing.assert_array_equal(np.asarray(v.value), value, err_msg=v.path)


def test_old_checkpoints_are_removed_only_after_the_new_one_committed(
    model, tmp_path, held_commits
):
    run_dir = str(tmp_path / "run")
    writer = checkpoint.Writer(run_dir, keep=1, asynchronous=True)
    held_commits.set()
    writer.save(model, 1)
    writer.wait()
    held_commits.clear()
    writer.save(model, 2)  # the step-2 commit is held
    assert [s for s, _ in checkpoint.list_checkpoints(run_dir)] == [1]
    held_commits.set()
    writer.close()  # waits for the commit, then keeps the newest one
    assert [s for s, _ in checkpoint.list_checkpoints(run_dir)] == [2]


def test_a_sync_writer_has_committed_when_save_returns(model, tmp_path):
    run_dir = str(tmp_path / "run")
    writer = checkpoint.Writer(run_dir, keep=2, asynchronous=False)
    for step in (1, 2, 3):
        assert writer.save(model, step) > 0
        assert checkpoint.list_checkpoints(run_dir)[-1][0] == step
    writer.close()
    assert [s for s, _ in checkpoint.list_checkpoints(run_dir)] == [2, 3]


def test_the_protected_step_outlives_newer_checkpoints(model, tmp_path):
    # train.keep_best: the best checkpoint is protected beside the newest `keep`.
    run_dir = str(tmp_path / "run")
    writer = checkpoint.Writer(run_dir, keep=1, asynchronous=False)
    writer.save(model, 1)
    writer.protected_step = 1
    for step in (2, 3):
        writer.save(model, step)
    assert [s for s, _ in checkpoint.list_checkpoints(run_dir)] == [1, 3]
    writer.protected_step = 3
    writer.save(model, 4)
    writer.close()
    assert [s for s, _ in checkpoint.list_checkpoints(run_dir)] == [3, 4]
