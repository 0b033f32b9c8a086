"""The signals a run is tuned by: the best checkpoint kept and loadable (train.keep_best),
the early stop (train.early_stop_patience, train.target_eval_loss), numeric step logs
flowing into every row, and evaluation masks fixed per example (data.eval_mask_rate)."""

import dataclasses
import json
import logging
import math
import os
import subprocess
import sys

import jax
import keras_hub
import numpy as np
import pytest

import kroberta
from kroberta import masking, train
from kroberta.config import validate
from kroberta.errors import ConfigError
from kroberta.training import run_data, signals
from tests.conftest import REPO, tiny_config

# The validation losses the scripted evaluations return at steps 5, 10, 15, ...: down,
# up twice, down to the best (step 25), then up for three evaluations.
SCRIPTED = [3.0, 2.0, 2.5, 2.6, 1.5, 1.8, 1.9, 2.0, 1.0, 1.0, 1.0, 1.0]


def _rows(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def stopped_run(tiny_data, tmp_path_factory):
    """A tiny run (keep_checkpoints 1, keep_best, patience 3) whose evaluations return
    SCRIPTED, resumed once at step 20; its summaries and log."""
    run_dir = tmp_path_factory.mktemp("stopped")
    config = tiny_config(
        tiny_data,
        run_dir,
        steps=60,
        log_every=5,
        eval_every=5,
        checkpoint_every=5,
        keep_checkpoints=1,
        keep_best=True,
        early_stop_patience=3,
        steps_per_execution=5,
    )
    calls = []

    def evaluate(self, *args, **kwargs):
        loss = SCRIPTED[len(calls)]
        calls.append(loss)
        return {"perplexity": math.exp(loss), "masked_accuracy": 0.5}

    lines = []
    heard = logging.Handler()
    heard.emit = lambda record: lines.append(record.getMessage())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(keras_hub.models.RobertaMaskedLM, "evaluate", evaluate)
        patch.setattr(logging.getLogger("kroberta.pretraining.train"), "handlers", [heard])
        first = train(config, until_step=20)
        model_file = os.path.join(run_dir, "model.weights.h5")
        assert not os.path.exists(model_file)  # --until-step: the run is not over
        second = train(config)
        kept_after_second = signals.best_checkpoint(str(run_dir))
        saved_at = os.stat(model_file).st_mtime_ns
        third = train(config)  # ended early: nothing to train
        assert os.stat(model_file).st_mtime_ns == saved_at  # and nothing written again
    return run_dir, (first, second, third), lines, kept_after_second


# Three invocations of a real run: slow. Their fast twins: the EvalWatch tests below and
# tests/training/test_checkpoints.py::test_the_protected_step_outlives_newer_checkpoints.
@pytest.mark.slow
def test_early_stop_ends_at_the_evaluation_the_patience_runs_out(stopped_run):
    run_dir, (first, second, third), lines, _ = stopped_run
    assert first["final_step"] == 20 and second["start_step"] == 20
    # Best at 25; 30, 35 and 40 do not improve on it: the run ends at 40, exit 0.
    assert second["final_step"] == 40 and "step 25" in second["stopped_early"]
    assert any(
        line.startswith(
            "early stop at step 40 of 60: validation loss has not "
            "improved on 1.5 (step 25) for 3 evaluation(s)"
        )
        for line in lines
    )
    assert [r["step"] for r in _rows(run_dir) if r["split"] == "validation"] == list(
        range(5, 41, 5)
    )
    assert os.path.isfile(os.path.join(run_dir, "model.weights.h5"))
    assert third["final_step"] == 40 and third["stopped_early"]
    assert any(line.startswith("the run ended early at step 40") for line in lines)


@pytest.mark.slow
def test_keep_best_keeps_the_lowest_validation_loss_beside_the_newest(stopped_run):
    run_dir, _, _, best = stopped_run
    kept = sorted(os.listdir(os.path.join(run_dir, "checkpoints")))
    # keep_checkpoints = 1: the newest (40), and the best (25) though three are newer.
    assert kept == ["step_00000025", "step_00000040"]
    assert best[0] == 25 and best[2] == pytest.approx(1.5)
    model = kroberta.load(str(run_dir), checkpoint="best")
    assert model.kroberta_step == 25
    assert kroberta.load(str(run_dir), checkpoint="last").kroberta_step == 40
    with pytest.raises(FileNotFoundError, match=r"no checkpoint at step 20 \(kept: 25, 40\)"):
        kroberta.load(str(run_dir), checkpoint=20)


def test_the_best_so_far_is_kept_while_the_loss_goes_up():
    watch = signals.EvalWatch(_train(keep_best=True))
    bests = []
    for step, loss in zip(range(10, 60, 10), [3.0, 2.0, 2.5, 2.6, 1.5]):
        watch.record(step, loss)
        bests.append(watch.best_step)
    assert bests == [10, 20, 20, 20, 50]


def test_target_eval_loss_ends_at_the_first_evaluation_at_or_below_it():
    watch = signals.EvalWatch(_train(target_eval_loss=2.0))
    reasons = [watch.record(step, loss) for step, loss in [(10, 3.0), (20, 2.1), (30, 2.0)]]
    assert reasons[:2] == [None, None]
    assert reasons[2] == "validation loss 2 reached train.target_eval_loss=2"


def test_a_resumed_watch_decides_as_an_uninterrupted_one():
    history = [(10, 3.0), (20, 2.0), (30, 2.5)]
    resumed = signals.EvalWatch(_train(early_stop_patience=2), history)
    assert resumed.record(40, 2.6) is not None
    assert resumed.best == (20, 2.0)


def _train(**changes):
    from kroberta.config import TrainConfig

    return dataclasses.replace(TrainConfig(), **changes)


def test_signals_need_validation_data(tiny_data, tmp_path):
    config = tiny_config(tiny_data, tmp_path, keep_best=True)
    config = dataclasses.replace(config, data=dataclasses.replace(config.data, validation=()))
    with pytest.raises(ConfigError, match=r"train.keep_best: needs validation data"):
        train(config)


def test_eval_mask_rate_needs_dynamic_masking(tiny_data, tmp_path):
    config = tiny_config(tiny_data, tmp_path)
    config = dataclasses.replace(
        config, data=dataclasses.replace(config.data, masking="static", eval_mask_rate=0.3)
    )
    with pytest.raises(ConfigError, match=r"data.eval_mask_rate: static masking evaluates"):
        validate(config)


def _eval_batches(tiny_data, tmp_path, shard=None, batch=8):
    config = tiny_config(tiny_data, tmp_path)
    config = dataclasses.replace(
        config, data=dataclasses.replace(config.data, mask_rate=0.3, eval_mask_rate=0.15)
    )
    run = run_data.run_data_for(validate(config))
    host = [
        (x["token_ids"].numpy(), x["mask_positions"].numpy(), y.numpy())
        for x, y in run_data.validation_batches(run, batch, shard=shard, device_masks=False)
    ]
    # What the evaluation step draws from the keyed batches (compile_model's
    # evaluation masker): the same masks.
    data = run.config.data
    mask = jax.jit(
        masking.masker(
            dataclasses.replace(data, mask_rate=data.evaluation_mask_rate()),
            run.config.model.vocabulary_size,
        )
    )
    for x, (ids, positions, labels) in zip(
        run_data.validation_batches(run, batch, shard=shard), host, strict=True
    ):
        step_x, step_labels = mask({k: v.numpy() for k, v in x.items()})
        np.testing.assert_array_equal(np.asarray(step_x["token_ids"]), ids)
        np.testing.assert_array_equal(np.asarray(step_x["mask_positions"]), positions)
        np.testing.assert_array_equal(np.asarray(step_labels), labels)
    return host


def test_eval_masks_are_fixed_per_example_at_the_eval_rate(tiny_data, tmp_path):
    first = _eval_batches(tiny_data, tmp_path)
    second = _eval_batches(tiny_data, tmp_path)
    for a, b in zip(first, second, strict=True):
        for u, v in zip(a, b):
            np.testing.assert_array_equal(u, v)
    # The evaluation rate, not the training rate: 15% of the 32 tokens, ~5 per row.
    labelled = np.concatenate([(labels != -100).sum(axis=1) for _, _, labels in first])
    real = labelled[labelled > 0]
    assert 3 <= real.mean() <= 6
    # Two processes, each its half of every global batch: together the same masks.
    halves = [_eval_batches(tiny_data, tmp_path, shard=(2, p), batch=8) for p in range(2)]
    for whole, low, high in zip(first, *halves, strict=True):
        for u, v, w in zip(whole, low, high):
            np.testing.assert_array_equal(u, np.concatenate([v, w]))


@pytest.mark.slow  # a fresh Python with TensorFlow; the same-process repeat above is its twin
def test_eval_masks_are_identical_in_another_process(tiny_data, tmp_path):
    mine = _eval_batches(tiny_data, tmp_path)
    code = (
        "import sys, numpy as np; sys.path.insert(0, sys.argv[1]);"
        "import tests.conftest; import pathlib;"
        "from tests.training.test_signals import _eval_batches;"
        "b = _eval_batches(pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3]));"
        "np.save(sys.argv[4], np.concatenate([p for _, p, _ in b]))"
    )
    out = tmp_path / "positions.npy"
    subprocess.run(
        [sys.executable, "-c", code, REPO, str(tiny_data), str(tmp_path), str(out)],
        check=True,
        cwd=REPO,
        capture_output=True,
    )
    np.testing.assert_array_equal(np.load(out), np.concatenate([p for _, p, _ in mine]))
