"""Was pretraining worth it: the pretrained start's score minus a random start's, with
an interval.

Each start has its own best learning rate and several seeds; its figure is the median
over those seeds of the main metric. The difference of the two medians gets a 95%
interval from a bootstrap over the validation examples: each resample draws the
examples with replacement, scores every seed's predictions on it (kept from each
trial's best epoch), takes each start's median over its seeds, and subtracts. So the
interval says how much the difference owes to which examples happened to be in the
validation split; the spread over seeds is in each start's own [min, max].
"""

import numpy as np

from kroberta.downstream import metrics

RESAMPLES = 1000
CONFIDENCE = 0.95
METHOD = (f"bootstrap over the validation examples ({RESAMPLES} resamples; each resample "
          "scores every seed, takes each start's median over its seeds and subtracts)")


def _best_predictions(result) -> np.ndarray:
    """(seeds, n) predictions of the best rate's finished trials."""
    return np.array([t.predictions for t in result.trials
                     if t.learning_rate == result.best_learning_rate and t.scores])


def compare(pretrained, baseline, labels: np.ndarray, seed: int = 0) -> dict:
    """The pretrained start's median minus the baseline's, on the split that chose the
    rates, with its bootstrap interval (both in the metric's units).

    Args:
        pretrained, baseline: `recipe.FinetuneResult`s of one task.
        labels: (n,) the labels of the split that chose the rates.
        seed: the resampling's seed (the interval is reproducible).

    Returns:
        {"metric", "difference", "low", "high", "confidence", "examples", "method"}.
    """
    low, high = bootstrap_interval(pretrained.metric, labels, _best_predictions(pretrained),
                                   _best_predictions(baseline), seed)
    return {"metric": pretrained.metric,
            "difference": pretrained.median[pretrained.split] - baseline.median[baseline.split],
            "low": low, "high": high, "confidence": CONFIDENCE, "examples": len(labels),
            "method": METHOD}


def bootstrap_interval(metric: str, labels: np.ndarray, ours: np.ndarray, theirs: np.ndarray,
                       seed: int = 0) -> tuple[float, float]:
    """The `CONFIDENCE` interval of `metric`(ours) - `metric`(theirs) over the examples:
    each resample draws the n examples with replacement, scores every row of predictions
    on it, takes each side's median over its rows and subtracts.

    Args:
        metric: a name in `metrics.METRICS`.
        labels: (n,) the examples' labels (or targets).
        ours, theirs: (rows, n) predictions of the same examples (seeds, or one row).
        seed: the resampling's seed (the interval is reproducible).

    Returns:
        (low, high), in the metric's units.
    """
    score = metrics.METRICS[metric]
    rng = np.random.default_rng(seed)
    n = len(labels)
    differences = np.empty(RESAMPLES)
    for r in range(RESAMPLES):
        rows = rng.integers(0, n, n)
        differences[r] = (np.median([score(labels[rows], p[rows]) for p in ours])
                          - np.median([score(labels[rows], p[rows]) for p in theirs]))
    tail = (1 - CONFIDENCE) / 2
    low, high = np.quantile(differences, [tail, 1 - tail])
    return float(low), float(high)
