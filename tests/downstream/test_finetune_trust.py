"""What a fine-tune reports can be trusted: a diverged trial is never a score, each trial
keeps its best epoch, early stopping stops, the grid widens at its edge, and the
comparison of two starts has the interval its documentation describes."""

import json
import math

import numpy as np
import pytest

from kroberta.downstream import finetuning, results, search, settings
from kroberta.downstream.tasks import TaskSpec
from kroberta.downstream.trial import Outcome, Setup, TrialLog
from kroberta.errors import DivergedError
from tests.downstream.tasks import marker_task, write_jsonl

RECIPE = dict(seeds=1, epochs=2, batch_size=32, max_length=16)


def test_a_rate_whose_loss_becomes_nan_is_dropped_never_scored(
    downstream_model, tmp_path, monkeypatch, caplog
):
    # The command line refuses 3e4 (settings.check_rates); here it is let through to diverge.
    monkeypatch.setattr(settings, "check_rates", lambda rates, option=None: tuple(rates))
    train, validation = marker_task(tmp_path, train=128, validation=32)
    out = tmp_path / "out"
    result = finetuning.finetune(
        downstream_model,
        data=train,
        validation=validation,
        learning_rates=[3e-3, 3e4],
        widen=False,
        out=str(out),
        **{**RECIPE, "epochs": 4},
    )
    diverged = [t for t in result.trials if t.learning_rate == 3e4]
    assert diverged and all(t.scores is None and "loss nan" in t.diverged for t in diverged)
    assert diverged[0].epochs_run < 4  # stopped at once, not after every epoch
    assert result.best_learning_rate == 3e-3
    assert (
        "lr 30000: every trial diverged" in caplog.text and "lower the learning rate" in caplog.text
    )
    assert any("lr 30000: every trial diverged" in note for note in result.notes)
    assert all(np.isfinite(w).all() for w in result.classifier.get_weights())
    # The kept trials are strict JSON (a reader that refuses NaN reads them).
    rows = [
        json.loads(line, parse_constant=pytest.fail)
        for line in (out / "trials.jsonl").read_text().splitlines()
    ]
    assert [r["scores"] is None for r in rows] == [False, True]


def test_every_trial_diverging_is_a_diverged_error(downstream_model, tmp_path):
    # Regression labels whose squares overflow float32: the loss is inf from the first step.
    rows = [{"text": f"The apple river {i}", "label": 1e30 * (1 + i % 3)} for i in range(64)]
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    validation = write_jsonl(tmp_path / "validation.jsonl", rows[:16])
    with pytest.raises(
        DivergedError,
        match=r"every fine-tuning trial diverged .* lower the "
        r"learning rate",
    ):
        finetuning.finetune(
            downstream_model,
            data=train,
            validation=validation,
            kind="regression",
            learning_rates=[1e-3],
            widen=False,
            **RECIPE,
        )


def test_the_best_epoch_is_kept_and_early_stopping_stops(downstream_model, tmp_path):
    train, validation = marker_task(tmp_path, train=96, validation=48, random_labels=True)
    result = finetuning.finetune(
        downstream_model,
        data=train,
        validation=validation,
        learning_rates=[3e-3],
        seeds=[0, 1, 2],
        epochs=6,
        early_stopping=1,
        batch_size=32,
        max_length=16,
    )
    for trial in result.trials:
        assert 1 <= trial.best_epoch <= trial.epochs_run <= 6
        if trial.epochs_run < 6:  # stopped: exactly `patience` epochs after its best
            assert trial.epochs_run == trial.best_epoch + 1
    assert any(t.epochs_run < 6 for t in result.trials)  # labels are coin flips: it stops
    # The classifier holds the kept trial's best epoch: its predictions score as recorded.
    setup_labels = np.array([json.loads(line)["label"] for line in open(validation)])
    predicted = np.argmax(
        np.stack(
            [[p[str(k)] for k in range(2)] for p in _probabilities(result.classifier, validation)]
        ),
        -1,
    )
    assert np.mean(predicted == setup_labels) == pytest.approx(
        result.kept.scores["validation"]["accuracy"]
    )
    assert result.kept.predictions == predicted.tolist()


def _probabilities(classifier, path):
    from kroberta.downstream import prediction

    texts = [json.loads(line)["text"] for line in open(path)]
    probabilities = prediction.predict_texts(classifier, texts)["probabilities"]
    return [{str(k): p[k] for k in range(len(p))} for p in probabilities]


class _Weights:
    """Stands in for a classifier: the grid only moves its weights about."""

    def get_weights(self):
        return []

    def set_weights(self, weights):
        pass


def _known_peak(peak: float, diverge_above: float = math.inf):
    """A trial whose score is highest at `peak` and falls with the distance in log10."""

    def run(classifier, setup, start, seed, learning_rate, title):
        if learning_rate > diverge_above:
            return Outcome(None, None, None, 1, "epoch 1, step 3: loss nan")
        score = 1 - abs(math.log10(learning_rate / peak)) / 10 + seed / 1000
        return Outcome({"validation": {"accuracy": score}}, [0], 1, 1)

    return run


def _grid(monkeypatch, rates, peak, widen=True, diverge_above=math.inf):
    monkeypatch.setattr("kroberta.downstream.trial.run_trial", _known_peak(peak, diverge_above))
    setup = Setup(TaskSpec("known"), ("0", "1"), None, {"validation": None}, 16, 4, 1)
    return search.run_grid(
        _Weights(),
        setup,
        lambda seed: [],
        rates,
        [0, 1, 2],
        TrialLog(None, "pretrained", {}),
        widen,
    )


@pytest.mark.fast
def test_the_grid_widens_until_its_best_rate_is_inside(monkeypatch):
    upward = _grid(monkeypatch, [1e-5, 3e-5], peak=1e-3)
    assert sorted({t.learning_rate for t in upward.trials}) == [
        1e-5,
        3e-5,
        9e-5,
        2.7e-4,
        8.1e-4,
        2.43e-3,
    ]
    assert upward.best_learning_rate == 8.1e-4  # inside: 2.43e-3 scored lower
    assert "adding 9e-05" in upward.notes[0]
    downward = _grid(monkeypatch, [1e-2, 3e-2], peak=3e-3)
    assert downward.best_learning_rate == 3.33e-3
    assert min(t.learning_rate for t in downward.trials) == 1.11e-3


@pytest.mark.fast
def test_a_grid_that_cannot_widen_says_why(monkeypatch):
    far = _grid(monkeypatch, [1e-6, 3e-6], peak=1e-1)  # more than four x3 steps away
    assert far.notes[-1].endswith("not widened further: 4 rates were added already")
    kept = _grid(monkeypatch, [1e-5, 3e-5], peak=1e-3, widen=False)
    assert {t.learning_rate for t in kept.trials} == {1e-5, 3e-5}
    assert kept.notes == [
        "pretrained start: the best learning rate, 3e-05, is at the top of the "
        "grid (1e-05, 3e-05); try also 9e-05"
    ]
    top = _grid(monkeypatch, [0.3, 1.0], peak=3.0)
    assert "not widened: 3 is outside 1e-08 to 1" in top.notes[-1]


@pytest.mark.fast
def test_a_diverging_rate_bounds_the_grid_and_is_dropped(monkeypatch):
    result = _grid(monkeypatch, [1e-3, 3e-3], peak=1e-1, diverge_above=5e-3)
    # 3e-3 was the top; 9e-3 diverged, so 3e-3 is inside the rates tried and the search ends.
    assert sorted({t.learning_rate for t in result.trials}) == [1e-3, 3e-3, 9e-3]
    assert result.best_learning_rate == 3e-3
    assert any("lr 0.009: every trial diverged" in note for note in result.notes)


@pytest.mark.fast
@pytest.mark.parametrize(
    "raw, message",
    [
        ("3e4", r"--learning-rates 30000: outside 1e-08 to 1 \(.*\); did you mean 0.0003\?"),
        ("2e-9", r"--learning-rates 2e-09: outside 1e-08 to 1"),
        ("1e-4,x", "expected numbers separated by commas"),
    ],
)
def test_a_learning_rate_out_of_range_is_refused_naming_the_likely_one(raw, message):
    from kroberta.errors import InputError

    with pytest.raises(InputError, match=message):
        settings.parse_rates(raw)
    assert settings.parse_rates("1e-4,3e-4") == (1e-4, 3e-4)


def _result(predictions, rate=1e-3):
    trials = [
        results.Trial(rate, s, {"v": {"accuracy": 0.0}}, 1.0, 1, 1, None, list(p))
        for s, p in enumerate(predictions)
    ]
    labels = np.array([0, 1, 1, 0, 1, 0, 0, 1])
    scores = [float(np.mean(np.asarray(p) == labels)) for p in predictions]
    return results.FinetuneResult(
        "t",
        "accuracy",
        "v",
        ("0", "1"),
        trials,
        rate,
        {"v": float(np.median(scores))},
        {"v": min(scores)},
        {"v": max(scores)},
    ), labels


@pytest.mark.fast
def test_the_comparison_is_the_difference_of_medians_with_a_bootstrap_interval():
    right = [0, 1, 1, 0, 1, 0, 0, 1]
    wrong = [1 - y for y in right]
    ours, labels = _result([right, right, wrong])  # median: all right
    theirs, _ = _result([wrong, wrong, right])  # median: all wrong
    compared = results.compare(ours, theirs, labels)
    # Every resample: each start's median is all right / all wrong: the interval is a point.
    assert compared["difference"] == 1.0 and (compared["low"], compared["high"]) == (1.0, 1.0)
    same = results.compare(ours, ours, labels)
    assert (same["difference"], same["low"], same["high"]) == (0.0, 0.0, 0.0)
    half = [0, 1, 1, 0, 0, 1, 1, 0]  # right on the first four only
    mixed, _ = _result([half, half, half])
    compared = results.compare(mixed, theirs, labels)
    assert compared["difference"] == 0.5
    assert compared["low"] < 0.5 < compared["high"] and "bootstrap" in compared["method"]
    assert results.compare(mixed, theirs, labels) == compared  # a fixed seed: reproducible
