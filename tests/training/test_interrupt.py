"""Ctrl-C (a notebook's interrupt) mid-fit, in-process: the run stays resumable and the
process usable (predict from the last checkpoint, then train again)."""

import io
import json
import math
import signal
import sys

import numpy as np
import pytest

import kroberta
from kroberta.data import pipeline as data_lib
from kroberta import train
from kroberta.model.mlm import compile_model
from kroberta.training.run_callbacks import RunLogger
from tests.conftest import tiny_config


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _interrupt_at(step, monkeypatch):
    """SIGINT (what Ctrl-C and Jupyter's interrupt send) when `step` is about to run."""
    real = RunLogger.on_train_batch_begin

    def on_train_batch_begin(self, batch, logs=None):
        if self._epoch_start_step + batch == step:
            signal.raise_signal(signal.SIGINT)
        return real(self, batch, logs)

    monkeypatch.setattr(RunLogger, "on_train_batch_begin", on_train_batch_begin)


def test_interrupt_mid_fit_then_predict_and_train_again(tiny_data, tmp_path, monkeypatch, capsys):
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    sigterm_before = signal.getsignal(signal.SIGTERM)
    config = tiny_config(tiny_data, tmp_path, steps=40, eval_every=20, checkpoint_every=20)
    terminal = _Terminal()
    with monkeypatch.context() as patch:
        _interrupt_at(25, patch)
        patch.setattr(sys, "stdout", terminal)
        with pytest.raises(KeyboardInterrupt):
            train.main(config)
    screen = [line.split("\r")[-1].rstrip() for line in terminal.getvalue().split("\n")]
    assert any(line.startswith("step 20/40 [") and "loss" in line for line in screen)
    assert any(line.startswith("step 20/40 [validation]") for line in screen)
    assert screen[-2].startswith("interrupted: the checkpoint at step 20 is kept; run the same "
                                 "training again")
    assert signal.getsignal(signal.SIGTERM) is sigterm_before  # the SIGTERM handler is undone
    assert not (tmp_path / "model.weights.h5").exists()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_00000020"]

    # The next cell: predict with the last checkpoint.
    model = kroberta.load(str(tmp_path))
    assert "no final model yet; loading the checkpoint at step 20" in capsys.readouterr().err
    out = kroberta.predict(model, str(tiny_data / "validation.tfrecord"), output="loss")
    assert out["loss"].shape == (70,) and np.isfinite(out["loss"]).all()
    # The checkpoint's model, not a fresh one: on the same validation batches it has
    # the validation loss training logged at step 20.
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    logged = [r["loss"] for r in rows if r["split"] == "validation"]
    spec = data_lib.inspect_files(data_lib.resolve_files(config.data.validation, "v"), "v")
    batches = data_lib.eval_dataset(spec, config.data, config.model.vocabulary_size, 16,
                                    config.train.seed)
    compile_model(model, config)
    logs = model.evaluate(batches, verbose=0, return_dict=True)
    assert len(logged) == 1 and math.log(logs["perplexity"]) == pytest.approx(logged[0], rel=1e-5)

    # And train again: it resumes at step 20 and finishes.
    summary = train.main(config)
    assert (summary["start_step"], summary["final_step"]) == (20, 40)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == [10, 20, 30, 40]
    kroberta.load(str(tmp_path))
    assert "no final model yet" not in capsys.readouterr().err
