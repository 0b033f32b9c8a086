"""The downstream metrics against hand-computed values and scipy's / scikit-learn's."""

import numpy as np
import pytest

from kroberta.downstream import metrics

LABELS = np.array([1, 1, 1, 0, 0, 0, 1, 0, 1, 1])
PREDICTIONS = np.array([1, 1, 0, 0, 0, 1, 1, 0, 0, 1])
# tp 4, fn 2, fp 1, tn 3


def test_classification_metrics_equal_hand_computed_values():
    assert metrics.accuracy(LABELS, PREDICTIONS) == pytest.approx(0.7)
    assert metrics.f1(LABELS, PREDICTIONS) == pytest.approx(2 * 4 / (2 * 4 + 2 + 1))
    expected_mcc = (4 * 3 - 1 * 2) / np.sqrt((4 + 1) * (4 + 2) * (3 + 1) * (3 + 2))
    assert metrics.matthews(LABELS, PREDICTIONS) == pytest.approx(expected_mcc)


def test_degenerate_predictions_score_zero_not_nan():
    constant = np.zeros_like(LABELS)
    assert metrics.matthews(LABELS, constant) == 0.0
    assert metrics.f1(np.zeros(4), np.zeros(4)) == 0.0
    assert metrics.pearson([1.0, 2.0, 3.0], [5.0, 5.0, 5.0]) == 0.0


def test_correlations_equal_hand_computed_values():
    assert metrics.pearson([1, 2, 3, 4], [2, 4, 6, 8]) == pytest.approx(1.0)
    assert metrics.pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    # Monotone but not linear: Spearman 1, Pearson below 1.
    assert metrics.spearman([1, 2, 3, 4], [1, 10, 100, 1000]) == pytest.approx(1.0)
    assert metrics.pearson([1, 2, 3, 4], [1, 10, 100, 1000]) < 0.9
    # Ties take their mean rank: ranks (1.5, 1.5, 3) against (1, 2, 3).
    assert metrics.spearman([0, 0, 1], [1, 2, 3]) == pytest.approx(np.sqrt(3) / 2)


def test_correlations_equal_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    x = rng.normal(size=200)
    y = x + rng.normal(size=200)
    ties = np.round(y)  # many ties
    assert metrics.pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0], abs=1e-12)
    assert metrics.spearman(x, ties) == pytest.approx(stats.spearmanr(x, ties)[0], abs=1e-12)


def test_classification_metrics_equal_scikit_learn():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2, 300)
    predictions = np.where(rng.random(300) < 0.7, labels, 1 - labels)
    assert metrics.f1(labels, predictions) == pytest.approx(
        sklearn_metrics.f1_score(labels, predictions)
    )
    assert metrics.matthews(labels, predictions) == pytest.approx(
        sklearn_metrics.matthews_corrcoef(labels, predictions)
    )
    three = rng.integers(0, 3, 300)
    guess = np.where(rng.random(300) < 0.5, three, rng.integers(0, 3, 300))
    assert metrics.matthews(three, guess) == pytest.approx(
        sklearn_metrics.matthews_corrcoef(three, guess)
    )


def test_score_names_the_metrics_asked_for():
    assert list(metrics.score(("f1", "accuracy"), LABELS, PREDICTIONS)) == ["f1", "accuracy"]
