"""Downstream metrics in numpy, as GLUE scores them (scikit-learn's and scipy's
definitions, without needing either).

Classification metrics take (n,) integer labels and predictions; F1 is for two
classes (class 1 positive), macro-F1 the unweighted mean of every class's F1 (as
scikit-learn's `f1_score(average="macro")`, which an unbalanced set needs beside
accuracy); Matthews' general form holds for any number of classes. Pearson and
Spearman take (n,) floats. `per_class` is scikit-learn's classification report.
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
    confusion = (labels[:, None] == classes)[:, :, None] & (predictions[:, None] == classes)[
        :, None, :
    ]
    c = confusion.sum(0).astype(np.float64)  # (K, K): true class x predicted class
    n, correct = c.sum(), np.trace(c)
    true_counts, predicted_counts = c.sum(1), c.sum(0)
    numerator = correct * n - true_counts @ predicted_counts
    denominator = np.sqrt(
        (n**2 - predicted_counts @ predicted_counts) * (n**2 - true_counts @ true_counts)
    )
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


def per_class(labels, predictions, num_classes: int) -> list:
    """Precision, recall, F1 and support of each class id 0..num_classes-1 (a list of
    dicts in id order); a ratio with nothing to divide is 0, as scikit-learn's
    `zero_division=0`."""
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    result = []
    for k in range(num_classes):
        true_positive = float(np.sum((labels == k) & (predictions == k)))
        predicted, actual = float(np.sum(predictions == k)), float(np.sum(labels == k))
        precision = true_positive / predicted if predicted else 0.0
        recall = true_positive / actual if actual else 0.0
        both = precision + recall
        result.append(
            {
                "precision": precision,
                "recall": recall,
                "f1": 2 * precision * recall / both if both else 0.0,
                "support": int(actual),
            }
        )
    return result


def macro_f1(labels, predictions) -> float:
    """The mean F1 over the classes present in the labels or the predictions."""
    classes = np.union1d(np.asarray(labels), np.asarray(predictions))
    # Relabelled 0..K-1, so per_class covers exactly the classes present.
    labels, predictions = (np.searchsorted(classes, a) for a in (labels, predictions))
    return float(np.mean([row["f1"] for row in per_class(labels, predictions, len(classes))]))


METRICS = {
    "accuracy": accuracy,
    "f1": f1,
    "macro_f1": macro_f1,
    "matthews": matthews,
    "pearson": pearson,
    "spearman": spearman,
}


def score(names, labels, predictions) -> dict:
    """{name: value} for each metric in `names`."""
    return {name: METRICS[name](labels, predictions) for name in names}
