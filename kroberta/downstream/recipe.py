"""The fine-tuning recipe: a learning-rate x seed grid, the best rate by validation score.

As Hugging Face's run_glue and the RoBERTa paper: AdamW, linear decay after 6%
warmup, a few epochs at batch 32, each learning rate run with several seeds; the
rate whose median validation score (the task's main metric, first evaluation split)
is highest wins, and the median and range over its seeds are reported (fine-tuning
small sets varies a lot from seed to seed). Training, evaluation and prediction are
Keras' compiled steps, sharded over the local devices (Keras' DataParallel) when
there are several.
"""

import dataclasses
import functools
import logging
import time

import numpy as np

from kroberta.downstream import classifiers
from kroberta.downstream import encoding, metrics, prediction
from kroberta.downstream.trials import TrialLog
from kroberta.downstream.examples import REGRESSION, TaskSpec

logger = logging.getLogger(__name__)

MAX_EPOCHS = 5
EPOCH_SEEDS = 1000  # pass p of seed s shuffles with s * 1000 + p


def learning_rates(model_config) -> tuple:
    """The default grid: GLUE's from hidden 768; small models (CPU) want larger steps."""
    return (1e-5, 3e-5, 5e-5) if model_config.hidden_dim >= 768 else (1e-4, 3e-4)


@dataclasses.dataclass(frozen=True)
class Trial:
    """One fine-tune: its learning rate and seed, {split: {metric: value}}, seconds."""

    learning_rate: float
    seed: int
    scores: dict
    seconds: float


@dataclasses.dataclass
class FinetuneResult:
    """What `kroberta.finetune` returns.

    Attributes:
        task: the task's name; metric: its main metric; split: the split that chose.
        label_names: the class names in id order (None for regression).
        trials: every (learning rate, seed) run.
        best_learning_rate: the rate with the highest median score.
        median, low, high: the main metric's median, min and max over the best
            rate's seeds, per evaluation split.
        classifier: the best rate's best-seed classifier (a keras-hub
            `RobertaTextClassifier`), with `tokenizer`, `label_names`, `max_length`.
        baseline: the same recipe from a random initialisation, when asked for.
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
    baseline: "FinetuneResult | None" = None

    def to_json(self) -> dict:
        # Field by field: `dataclasses.asdict` would deep-copy the classifier, which Keras
        # does by saving and reloading the whole model (with its optimizer's warnings).
        result = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.name not in ("classifier", "baseline", "trials")}
        result["trials"] = [dataclasses.asdict(t) for t in self.trials]
        if self.baseline is not None:
            result["baseline"] = self.baseline.to_json()
        return result


@dataclasses.dataclass(frozen=True)
class Setup:
    """What every run of a task shares: the task, the encoded splits and the schedule."""

    spec: TaskSpec
    label_names: tuple | None
    train: encoding.Encoded
    evaluation: dict  # split name -> Encoded
    max_length: int
    batch_size: int
    epochs: int
    steps_per_execution: int = 8

    @functools.cached_property
    def evaluation_batches(self) -> dict:
        """{split: `encoding.dataset`'s (batches, rows)}: built once, predicted after every run."""
        return {name: encoding.dataset(encoded, self.batch_size, self.max_length)
                for name, encoded in self.evaluation.items()}

    @property
    def steps(self) -> int:
        """Training steps of one run: `epochs` passes of the bucketed batches."""
        return self.epochs * encoding.batch_count(self.train, self.batch_size, self.max_length)


def evaluate(classifier, setup: Setup, split: str) -> dict:
    """{metric: value} of one evaluation split."""
    labels = setup.evaluation[split].labels
    ordered = prediction.outputs(classifier, *setup.evaluation_batches[split], len(labels))  # (n, K)
    predictions = ordered[:, 0] if setup.spec.kind == REGRESSION else ordered.argmax(-1)
    names = setup.spec.metrics(len(setup.label_names or ()))
    return metrics.score(names, labels, predictions)


def run_grid(classifier, setup: Setup, starts, learning_rates, seeds,
             log: TrialLog) -> FinetuneResult:
    """Fine-tunes `classifier` (compiled by `classifiers.compile_classifier`) once per
    learning rate and seed, from `starts(seed)`'s backbone weights; returns the result
    with the classifier holding the best run's weights. Trials `log` holds as finished
    are taken from it, not run again; each one run is added to it."""
    trials, best_weights = [], {}  # best_weights: rate -> (score, weights; None: in the log)
    split = next(iter(setup.evaluation))
    for learning_rate in learning_rates:
        for seed in seeds:
            done = log.finished.get((learning_rate, seed))
            if done is not None:
                trial = Trial(learning_rate, seed, done["scores"], done["seconds"])
            else:
                began = time.perf_counter()
                scores = _run_trial(classifier, setup, starts(seed), seed, learning_rate)
                trial = Trial(learning_rate, seed, scores, time.perf_counter() - began)
                logger.info("%s (%s start) lr %g seed %d: %s (%.1f s)", setup.spec.name,
                            log.grid, learning_rate, seed, _describe(scores), trial.seconds)
            trials.append(trial)
            kept = best_weights.get(learning_rate)
            score = trial.scores[split][setup.spec.metric]
            best = kept is None or score > kept[0]
            if best:
                best_weights[learning_rate] = (score, None if done else classifier.get_weights())
            if done is None:
                log.record(learning_rate, seed, trial.scores, trial.seconds,
                           best_weights[learning_rate][1] if best else None)
    return _summarise(classifier, setup, trials, best_weights, split, log)


def _run_trial(classifier, setup: Setup, start: list, seed: int, learning_rate: float) -> dict:
    """One fine-tune from `start`; its {split: {metric: value}}."""
    classifiers.reset(classifier, start, seed, learning_rate)
    for epoch in range(setup.epochs):  # each pass shuffled by its own seed
        train, _ = encoding.dataset(setup.train, setup.batch_size, setup.max_length,
                                    seed * EPOCH_SEEDS + epoch)
        classifier.fit(train, epochs=1, verbose=0, shuffle=False)
    return {name: evaluate(classifier, setup, name) for name in setup.evaluation}


def _describe(scores: dict) -> str:
    return "; ".join(f"{split} " + ", ".join(f"{k} {v:.4f}" for k, v in values.items())
                     for split, values in scores.items())


def _summarise(classifier, setup: Setup, trials, best_weights, split, log) -> FinetuneResult:
    metric = setup.spec.metric

    def main_scores(rate, name):
        return [t.scores[name][metric] for t in trials if t.learning_rate == rate]

    best_rate = max(best_weights, key=lambda rate: np.median(main_scores(rate, split)))
    weights = best_weights[best_rate][1]
    classifier.set_weights(log.best_weights(best_rate) if weights is None else weights)
    names = list(setup.evaluation)
    return FinetuneResult(
        task=setup.spec.name, metric=metric, split=split, label_names=setup.label_names,
        trials=trials, best_learning_rate=best_rate,
        median={n: float(np.median(main_scores(best_rate, n))) for n in names},
        low={n: float(np.min(main_scores(best_rate, n))) for n in names},
        high={n: float(np.max(main_scores(best_rate, n))) for n in names},
        classifier=classifier)
