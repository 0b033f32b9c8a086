"""An interrupted fine-tune resumes from the trials its --out folder keeps and ends with the
result of an uninterrupted one."""

import json

import numpy as np
import pytest

from kroberta.downstream import finetuning, trial
from kroberta.errors import InputError
from kroberta.run_layout import TRIALS_FILE
from tests.downstream.tasks import marker_task

GRID = dict(
    learning_rates=[3e-3, 1e-3], seeds=2, epochs=1, batch_size=32, max_length=16, widen=False
)


def _scores(result):
    return [(t.learning_rate, t.seed, t.scores) for t in result.trials]


def test_an_interrupted_grid_resumes_to_the_uninterrupted_result(
    downstream_model, tmp_path, monkeypatch, caplog
):
    train, validation = marker_task(tmp_path, train=96, validation=32)
    whole = finetuning.finetune(
        downstream_model, data=train, validation=validation, out=str(tmp_path / "whole"), **GRID
    )
    run_trial, calls = trial.run_trial, []

    def interrupted_at_the_third(*args):
        calls.append(args[3:5])  # (seed, learning rate)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return run_trial(*args)

    monkeypatch.setattr(trial, "run_trial", interrupted_at_the_third)
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        finetuning.finetune(
            downstream_model, data=train, validation=validation, out=str(out), **GRID
        )
    assert len((out / TRIALS_FILE).read_text().splitlines()) == 2
    caplog.set_level("INFO", logger="kroberta")
    resumed = finetuning.finetune(
        downstream_model, data=train, validation=validation, out=str(out), **GRID
    )
    assert f"{out}: 2 finished pretrained trial(s) kept from an earlier run" in caplog.text
    # Only the two unfinished trials ran again (seed, rate of calls 3 to 5 = the 3rd and 4th).
    assert calls[3:] == calls[2:3] + [(1, 1e-3)]
    assert _scores(resumed) == _scores(whole)
    assert resumed.best_learning_rate == whole.best_learning_rate
    for a, b in zip(resumed.classifier.get_weights(), whole.classifier.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_a_trial_does_not_depend_on_the_ones_before_it(downstream_model, tmp_path):
    train, validation = marker_task(tmp_path, train=96, validation=32)
    both = finetuning.finetune(
        downstream_model,
        data=train,
        validation=validation,
        **{**GRID, "learning_rates": [1e-3], "seeds": [0, 1]},
    )
    alone = finetuning.finetune(
        downstream_model,
        data=train,
        validation=validation,
        **{**GRID, "learning_rates": [1e-3], "seeds": [1]},
    )
    assert both.trials[1].scores == alone.trials[0].scores


def test_other_settings_in_the_same_folder_are_refused(downstream_model, tmp_path):
    train, validation = marker_task(tmp_path, train=96, validation=32)
    out = str(tmp_path / "out")
    grid = {**GRID, "learning_rates": [3e-3], "seeds": 1}
    finetuning.finetune(downstream_model, data=train, validation=validation, out=out, **grid)
    rows = [json.loads(line) for line in open(f"{out}/{TRIALS_FILE}")]
    assert [(r["grid"], r["learning_rate"], r["seed"]) for r in rows] == [("pretrained", 3e-3, 0)]
    with pytest.raises(
        InputError,
        match=r"--out .*holds trials of another fine-tune \(epochs "
        r"differ\); give another --out",
    ):
        finetuning.finetune(
            downstream_model, data=train, validation=validation, out=out, **{**grid, "epochs": 2}
        )


def test_an_out_that_is_a_file_is_refused_before_any_work(downstream_model, tmp_path):
    (tmp_path / "notadir.txt").write_text("hi")
    with pytest.raises(InputError, match=r"--out .*notadir.txt: a file, not a folder"):
        finetuning.finetune(
            downstream_model, data="x", validation="y", out=str(tmp_path / "notadir.txt")
        )
