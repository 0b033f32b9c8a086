"""Downstream metrics in numpy, as GLUE scores them (scikit-learn's and scipy's
definitions, without needing either).

Classification metrics take (n,) integer labels and predictions; F1 and Matthews
correlation are for two classes (class 1 positive; Matthews' general form is used,
so it also holds for more). Pearson and Spearman take (n,) floats.
"""

import numpy as np


def accuracy(labels, predictions) -> float:
    return float(np.mean(np.asarray(labels) == np.asarray(predictions)))


def f1(labels, predictions) -> float:
    """Binary F1 of class 1; 0 when there is no true or predicted positive."""
    labels, predictions = np.asarray(labels) == 1, np.asarray(predictions) == 1
    true_positive = np.sum(labels & predictions)
    denominator = np.sum(labels) + np.sum(predictions)
    return float(2 * true_positive / denominator) if denominator else 0.0


def matthews(labels, predictions) -> float:
    """Matthews correlation from the confusion matrix (Gorodkin's K-class form); 0 when
    either side holds a single class."""
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    classes = np.union1d(labels, predictions)
    confusion = (labels[:, None] == classes)[:, :, None] & (predictions[:, None] == classes)[:, None, :]
    c = confusion.sum(0).astype(np.float64)  # (K, K): true class x predicted class
    n, correct = c.sum(), np.trace(c)
    true_counts, predicted_counts = c.sum(1), c.sum(0)
    numerator = correct * n - true_counts @ predicted_counts
    denominator = np.sqrt((n**2 - predicted_counts @ predicted_counts)
                          * (n**2 - true_counts @ true_counts))
    return float(numerator / denominator) if denominator else 0.0


def pearson(labels, predictions) -> float:
    x = np.asarray(labels, np.float64) - np.mean(labels)
    y = np.asarray(predictions, np.float64) - np.mean(predictions)
    denominator = np.sqrt(np.sum(x * x) * np.sum(y * y))
    return float(np.sum(x * y) / denominator) if denominator else 0.0


def _ranks(values) -> np.ndarray:
    """Ranks from 1, ties given their mean rank (as scipy.stats.rankdata)."""
    values = np.asarray(values, np.float64)
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    # Each run of equal values gets the mean of the ranks it spans.
    starts = np.r_[True, sorted_values[1:] != sorted_values[:-1]]
    run = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    last = np.r_[first[1:], len(values)] - 1
    ranks = np.empty(len(values))
    ranks[order] = (first[run] + last[run]) / 2 + 1
    return ranks


def spearman(labels, predictions) -> float:
    return pearson(_ranks(labels), _ranks(predictions))


METRICS = {"accuracy": accuracy, "f1": f1, "matthews": matthews, "pearson": pearson,
           "spearman": spearman}


def score(names, labels, predictions) -> dict:
    """{name: value} for each metric in `names`."""
    return {name: METRICS[name](labels, predictions) for name in names}
