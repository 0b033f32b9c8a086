"""Ctrl-C (a notebook's interrupt) mid-fit, in-process: a checkpoint is written at the step
reached, the run stays resumable and the process usable (predict from that checkpoint,
then train again); a second Ctrl-C stops at once."""

import io
import json
import logging
import signal
import sys

import numpy as np
import pytest

import kroberta
from kroberta import train
from kroberta.training import preemption
from kroberta.training.run_callbacks import RunLogger
from tests.conftest import tiny_config


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _interrupt_at(step, monkeypatch, times=1):
    """SIGINT (what Ctrl-C and Jupyter's interrupt send) when `step` is about to run."""
    real = RunLogger.on_train_batch_begin

    def on_train_batch_begin(self, batch, logs=None):
        if self._interval_start_step + batch == step:
            for _ in range(times):
                signal.raise_signal(signal.SIGINT)
        return real(self, batch, logs)

    monkeypatch.setattr(RunLogger, "on_train_batch_begin", on_train_batch_begin)


def test_interrupt_mid_fit_then_predict_and_train_again(
    tiny_data, tmp_path, monkeypatch, capsys, caplog
):
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    sigterm_before = signal.getsignal(signal.SIGTERM)
    config = tiny_config(
        tiny_data, tmp_path, steps=40, eval_every=20, checkpoint_every=20, steps_per_execution=1
    )
    terminal = _Terminal()
    with monkeypatch.context() as patch:
        _interrupt_at(25, patch)
        patch.setattr(sys, "stdout", terminal)
        # As in a notebook or script that configured no logging: kroberta's messages on
        # stdout (kroberta.runtime.logs.show_messages), here below the bar.
        kroberta_logger = logging.getLogger("kroberta")
        patch.setattr(kroberta_logger, "handlers", [])
        patch.setattr(kroberta_logger, "propagate", False)
        with pytest.raises(KeyboardInterrupt):
            train(config)
    screen = [line.split("\r")[-1].rstrip() for line in terminal.getvalue().split("\n")]
    assert any(line.startswith("step 20/40 [") and "loss" in line for line in screen)
    assert any(line.startswith("step 20/40 [validation]") for line in screen)
    # The step in flight at the Ctrl-C runs, then a checkpoint is written there.
    assert screen[-2].startswith(
        "interrupted at step 26: checkpoint written; run the same training again"
    )
    assert "press Ctrl-C again to stop at once" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is sigterm_before  # the handlers are undone
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert not (tmp_path / "model.weights.h5").exists()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step_00000020",
        "step_00000026",
    ]

    # The next cell: predict with the last checkpoint.
    caplog.clear()
    model = kroberta.load(str(tmp_path))
    assert "no final model yet; loading the checkpoint at step 26" in caplog.text
    out = kroberta.predict(model, str(tiny_data / "validation.tfrecord"), output="loss")
    assert out["loss"].shape == (70,) and np.isfinite(out["loss"]).all()

    # And train again: it resumes at step 20 and finishes.
    summary = train(config)
    assert (summary["start_step"], summary["final_step"]) == (26, 40)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == [10, 20, 26, 30, 40]
    caplog.clear()
    kroberta.load(str(tmp_path))
    assert "no final model yet" not in caplog.text


def test_interrupt_before_the_first_checkpoint_keeps_the_run(tiny_data, tmp_path, monkeypatch):
    config = tiny_config(
        tiny_data, tmp_path, steps=40, eval_every=40, checkpoint_every=40, steps_per_execution=1
    )
    with monkeypatch.context() as patch:
        _interrupt_at(3, patch)
        with pytest.raises(KeyboardInterrupt):
            train(config)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_00000004"]
    summary = train(config)
    assert (summary["start_step"], summary["final_step"]) == (4, 40)


def test_a_second_interrupt_stops_at_once(tiny_data, tmp_path, monkeypatch, caplog):
    config = tiny_config(
        tiny_data, tmp_path, steps=40, eval_every=20, checkpoint_every=20, steps_per_execution=1
    )
    with monkeypatch.context() as patch:
        _interrupt_at(25, patch, times=2)
        patch.setattr(preemption, "SAME_INTERRUPT_SECONDS", 0.0)  # a person's second Ctrl-C
        with pytest.raises(KeyboardInterrupt):
            train(config)
    assert "interrupted: the checkpoint at step 20 is kept" in caplog.text
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_00000020"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_interrupt_after_the_last_dispatch_of_an_interval_stops_there(
    tiny_data, tmp_path, monkeypatch, caplog
):
    """The interval's steps were all dispatched (their polls said no) when Ctrl-C came:
    one checkpoint at the interval's end, and fit starts no other interval."""
    config = tiny_config(
        tiny_data, tmp_path, steps=40, eval_every=0, checkpoint_every=40, steps_per_execution=1
    )
    real = RunLogger.on_epoch_end

    def on_epoch_end(self, epoch, logs=None):
        if epoch == 0:  # steps 1-10 (log_every) have run
            signal.raise_signal(signal.SIGINT)
        return real(self, epoch, logs)

    with monkeypatch.context() as patch:
        patch.setattr(RunLogger, "on_epoch_end", on_epoch_end)
        with pytest.raises(KeyboardInterrupt):
            train(config)
    assert "interrupted at step 10: checkpoint written" in caplog.text
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_00000010"]


def test_a_second_interrupt_before_any_checkpoint_says_nothing_was_kept(
    tiny_data, tmp_path, monkeypatch, caplog
):
    config = tiny_config(
        tiny_data, tmp_path, steps=40, eval_every=0, checkpoint_every=40, steps_per_execution=1
    )
    with monkeypatch.context() as patch:
        _interrupt_at(3, patch, times=2)
        patch.setattr(preemption, "SAME_INTERRUPT_SECONDS", 0.0)  # a person's second Ctrl-C
        with pytest.raises(KeyboardInterrupt):
            train(config)
    out = caplog.text
    assert "interrupted before the first checkpoint: nothing was kept" in out
    assert "to resume" not in out
    assert not list((tmp_path / "checkpoints").glob("step_*"))


@pytest.mark.fast
def test_one_interrupt_delivered_twice_is_one_request(monkeypatch, capsys):
    """`timeout -s INT` signals the process and then its process group: the same
    interrupt arrives twice within milliseconds and must not stop the run at once."""
    flag = preemption.PreemptionFlag()
    flag._handle_interrupt(signal.SIGINT, None)
    flag._handle_interrupt(signal.SIGINT, None)  # the same interrupt, again
    assert flag.requested and flag.interrupted
    assert capsys.readouterr().err.count("press Ctrl-C again") == 1
    monkeypatch.setattr(preemption, "SAME_INTERRUPT_SECONDS", 0.0)  # later: a person's second
    with pytest.raises(KeyboardInterrupt):
        flag._handle_interrupt(signal.SIGINT, None)
