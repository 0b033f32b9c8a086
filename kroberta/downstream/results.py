"""What a fine-tune returns: each trial, the result of a grid, and the verdict on
pretraining.

`Trial` is one (learning rate, seed) run; `FinetuneResult` a grid's outcome (the best
rate, the median and range over its seeds, the kept classifier), as `kroberta.finetune`
returns it and result.json holds it (`to_json`).

Was pretraining worth it (`compare`): the pretrained start's score minus a random
start's, with an interval. Each start has its own best learning rate and several seeds;
its figure is the median over those seeds of the main metric. The difference of the two
medians gets a 95% interval from a bootstrap over the validation examples: each resample
draws the examples with replacement, scores every seed's predictions on it (kept from
each trial's best epoch), takes each start's median over its seeds, and subtracts. So
the interval says how much the difference owes to which examples happened to be in the
validation split; the spread over seeds is in each start's own [min, max].
"""

import dataclasses

import numpy as np

from kroberta.downstream import metrics


@dataclasses.dataclass(frozen=True)
class Trial:
    """One fine-tune: its learning rate and seed, {split: {metric: value}} of its best
    epoch (None when it diverged), seconds, the best epoch and the epochs it ran,
    where it diverged, and the first split's predictions at its best epoch (kept
    for comparing two starts, not written to result.json)."""

    learning_rate: float
    seed: int
    scores: dict | None
    seconds: float
    best_epoch: int | None = None
    epochs_run: int | None = None
    diverged: str | None = None
    predictions: list | None = dataclasses.field(default=None, repr=False)


@dataclasses.dataclass
class FinetuneResult:
    """What `kroberta.finetune` returns.

    Attributes:
        task: the task's name; metric: its main metric; split: the split that chose.
        label_names: the class names in id order (None for regression).
        trials: every (learning rate, seed) run, in the order run (widening adds rates).
        best_learning_rate: the rate with the highest median score.
        median, low, high: the main metric's median, min and max over the best
            rate's finished seeds, per evaluation split.
        classifier: the best rate's best-seed classifier (a keras-hub
            `RobertaTextClassifier`), with `tokenizer`, `label_names`, `max_length`.
        kept: the trial whose weights `classifier` holds.
        notes: what was said about the grid (a rate dropped as diverged, an edge).
        per_class: {split: {class name: precision, recall, f1, support}} of `classifier`
            (classification).
        baseline: the same recipe from a random initialisation, when asked for.
        comparison: the pretrained start's median minus the baseline's, with its
            interval (`compare`), when there is a baseline.
        recipe: the optional steps it ran with (`FinetuneConfig.recipe`).
        adaptation: with `adapt_steps`, the masked-LM loss on the training texts before
            and after adapting each start ({"seed" (None: the one pretrained start),
            "loss_before", "loss_after"}); None without.
        config: the settings it ran with (`FinetuneConfig`'s fields).
    """

    task: str
    metric: str
    split: str
    label_names: tuple | None
    trials: list
    best_learning_rate: float
    median: dict
    low: dict
    high: dict
    classifier: object = None
    kept: Trial | None = None
    notes: list = dataclasses.field(default_factory=list)
    per_class: dict | None = None
    baseline: "FinetuneResult | None" = None
    comparison: dict | None = None
    recipe: dict | None = None
    adaptation: list | None = None
    config: dict | None = None

    def to_json(self) -> dict:
        """The result as JSON values (strict JSON: a diverged trial's scores are null)."""
        # Field by field: `dataclasses.asdict` would deep-copy the classifier, which Keras
        # does by saving and reloading the whole model (with its optimizer's warnings).
        result = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("classifier", "baseline", "trials", "kept")
        }
        result["trials"] = [_trial_json(t) for t in self.trials]
        result["kept"] = _trial_json(self.kept) if self.kept else None
        if self.baseline is not None:
            result["baseline"] = self.baseline.to_json()
        return result


def _trial_json(trial: Trial) -> dict:
    return {
        f.name: getattr(trial, f.name) for f in dataclasses.fields(trial) if f.name != "predictions"
    }


RESAMPLES = 1000
CONFIDENCE = 0.95
METHOD = (
    f"bootstrap over the validation examples ({RESAMPLES} resamples; each resample "
    "scores every seed, takes each start's median over its seeds and subtracts)"
)


def _best_predictions(result) -> np.ndarray:
    """(seeds, n) predictions of the best rate's finished trials."""
    return np.array(
        [
            t.predictions
            for t in result.trials
            if t.learning_rate == result.best_learning_rate and t.scores
        ]
    )


def compare(pretrained, baseline, labels: np.ndarray, seed: int = 0) -> dict:
    """The pretrained start's median minus the baseline's, on the split that chose the
    rates, with its bootstrap interval (both in the metric's units).

    Args:
        pretrained, baseline: `FinetuneResult`s of one task.
        labels: (n,) the labels of the split that chose the rates.
        seed: the resampling's seed (the interval is reproducible).

    Returns:
        {"metric", "difference", "low", "high", "confidence", "examples", "method"}.
    """
    low, high = bootstrap_interval(
        pretrained.metric, labels, _best_predictions(pretrained), _best_predictions(baseline), seed
    )
    return {
        "metric": pretrained.metric,
        "difference": pretrained.median[pretrained.split] - baseline.median[baseline.split],
        "low": low,
        "high": high,
        "confidence": CONFIDENCE,
        "examples": len(labels),
        "method": METHOD,
    }


def bootstrap_interval(
    metric: str, labels: np.ndarray, ours: np.ndarray, theirs: np.ndarray, seed: int = 0
) -> tuple[float, float]:
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
        differences[r] = np.median([score(labels[rows], p[rows]) for p in ours]) - np.median(
            [score(labels[rows], p[rows]) for p in theirs]
        )
    tail = (1 - CONFIDENCE) / 2
    low, high = np.quantile(differences, [tail, 1 - tail])
    return float(low), float(high)
