"""The fine-tuning recipe: a learning-rate x seed grid, the best rate by validation score.

As Hugging Face's run_glue and the RoBERTa paper: AdamW, linear decay after 6%
warmup, a few epochs at batch 32, each learning rate run with several seeds; the
rate whose median validation score (the task's main metric, first evaluation split)
is highest wins, and the median and range over its seeds are reported (fine-tuning
small sets varies a lot from seed to seed). Each trial keeps its best epoch
(`trial_run`). A trial whose loss diverged is never a score: a rate all of whose
trials diverged is dropped, and one with fewer diverged trials is preferred. When the
best rate is at an edge of the grid, the grid is widened by factors of 3 until it is
inside (`widen`), as a fair comparison of two starts needs (a random start wants
larger rates than a pretrained one); otherwise the next rate to try is named.
Training, evaluation and prediction are Keras' compiled steps, sharded over the
local devices (Keras' DataParallel) when there are several.
"""

import dataclasses
import functools
import logging
import time

import numpy as np

from kroberta.downstream import encoding, rate_grid, trial_run
from kroberta.downstream.examples import TaskSpec
from kroberta.downstream.settings import FinetuneConfig
from kroberta.downstream.trials import TrialLog
from kroberta.errors import DivergedError

logger = logging.getLogger(__name__)

MAX_ADDED_RATES = 4  # rates a grid may gain by widening


def learning_rates(model_config) -> tuple:
    """The default grid: GLUE's from hidden 768; small models (CPU) want larger steps, a
    random start larger still, so their grid starts where docs/benchmarks/downstream.md
    found both starts' best rates (and widens from there)."""
    return (1e-5, 3e-5, 5e-5) if model_config.hidden_dim >= 768 else (3e-4, 1e-3, 3e-3)


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
            interval (`verdict.compare`), when there is a baseline.
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
        result = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.name not in ("classifier", "baseline", "trials", "kept")}
        result["trials"] = [_trial_json(t) for t in self.trials]
        result["kept"] = _trial_json(self.kept) if self.kept else None
        if self.baseline is not None:
            result["baseline"] = self.baseline.to_json()
        return result


def _trial_json(trial: Trial) -> dict:
    return {f.name: getattr(trial, f.name) for f in dataclasses.fields(trial)
            if f.name != "predictions"}


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
    patience: int | None = None  # epochs without a better score before a trial stops
    steps_per_execution: int = 8
    pooling: str = "first"  # what the head reads (`settings.POOLINGS`)
    # The settings it was made from (their recipe options: `starts`, `trial_run`).
    config: FinetuneConfig = dataclasses.field(default_factory=FinetuneConfig)

    @functools.cached_property
    def evaluation_batches(self) -> dict:
        """{split: `encoding.dataset`'s (batches, rows)}: built once, predicted after every run."""
        return {name: encoding.dataset(encoded, self.batch_size, self.max_length)
                for name, encoded in self.evaluation.items()}

    @property
    def steps(self) -> int:
        """Training steps of one run: `epochs` passes of the bucketed batches."""
        return self.epochs * encoding.batch_count(self.train, self.batch_size, self.max_length)


def run_grid(classifier, setup: Setup, starts, learning_rates, seeds, log: TrialLog,
             widen: bool = True) -> FinetuneResult:
    """Fine-tunes `classifier` (compiled by `classifiers.compile_classifier`) once per
    learning rate and seed, from `starts(seed)`'s backbone weights, widening the grid
    while its best rate is at an edge (`widen`, for grids of two rates or more); returns
    the result with the classifier holding the best run's weights. Trials `log` holds
    as finished are taken from it, not run again; each one run is added to it."""
    rates, trials, notes = list(learning_rates), {}, []
    kept = {}  # rate -> (score, trial, weights; None: in the log)
    split = next(iter(setup.evaluation))
    while True:
        for learning_rate in rates:
            for seed in seeds:
                if (learning_rate, seed) not in trials:
                    trials[learning_rate, seed] = _trial(classifier, setup, starts, seed,
                                                         learning_rate, log, kept, split)
        best_rate = _best_rate(rates, trials, seeds, setup, split, log.grid, notes)
        added = _widened(best_rate, rates, widen, log.grid, notes)
        if added is None:
            break
        rates.append(added)
    return _summarise(classifier, setup, list(trials.values()), best_rate, kept, split, log,
                      notes)


def _trial(classifier, setup, starts, seed, learning_rate, log, kept, split) -> Trial:
    """A finished trial, from the log or run now (and recorded)."""
    done = log.finished.get((learning_rate, seed))
    if done is not None:
        trial = Trial(learning_rate, seed, done["scores"], done["seconds"],
                      done.get("best_epoch"), done.get("epochs_run"), done.get("diverged"),
                      done.get("predictions"))
    else:
        began = time.perf_counter()
        title = f"{setup.spec.name} ({log.grid} start) lr {learning_rate:g} seed {seed}"
        outcome = _run_trial(classifier, setup, starts(seed), seed, learning_rate, title)
        trial = Trial(learning_rate, seed, outcome.scores, time.perf_counter() - began,
                      outcome.best_epoch, outcome.epochs_run, outcome.diverged,
                      outcome.predictions)
        if trial.diverged:
            logger.warning("%s: diverged at %s; lower the learning rate", title, trial.diverged)
        else:
            logger.info("%s: %s at epoch %d of %d (%.1f s)", title, _describe(trial.scores),
                        trial.best_epoch, trial.epochs_run, trial.seconds)
    score = trial.scores[split][setup.spec.metric] if trial.scores else None
    best = score is not None and (learning_rate not in kept or score > kept[learning_rate][0])
    if best:
        kept[learning_rate] = (score, trial, None if done else classifier.get_weights())
    if done is None:
        log.record(trial, kept[learning_rate][2] if best else None)
    return trial


def _run_trial(classifier, setup: Setup, start: list, seed: int, learning_rate: float,
               title: str) -> trial_run.Outcome:
    """One trial (`trial_run.run_trial`): a name of this module's, where tests interrupt it."""
    return trial_run.run_trial(classifier, setup, start, seed, learning_rate, title)


def _describe(scores: dict) -> str:
    return "; ".join(f"{split} " + ", ".join(f"{k} {v:.4f}" for k, v in values.items())
                     for split, values in scores.items())


def _rate_scores(trials, rate, seeds, split, metric) -> list:
    """The main scores of a rate's finished (not diverged) trials."""
    return [trials[rate, s].scores[split][metric] for s in seeds if trials[rate, s].scores]


def _best_rate(rates, trials, seeds, setup, split, grid, notes) -> float:
    """The rate with the fewest diverged trials, then the highest median score; rates
    whose every trial diverged are dropped (said once each); all of them: DivergedError."""
    metric = setup.spec.metric
    finished = {rate: _rate_scores(trials, rate, seeds, split, metric) for rate in rates}
    for rate in rates:
        line = (f"{grid} start, lr {rate:g}: every trial diverged (the loss became NaN or inf); "
                "the rate is dropped: lower the learning rate")
        if not finished[rate] and line not in notes:
            notes.append(line)
            logger.warning("%s", line)
    candidates = [rate for rate in rates if finished[rate]]
    if not candidates:
        raise DivergedError(
            f"{setup.spec.name}: every fine-tuning trial diverged (the loss became NaN or inf) "
            f"at learning rate(s) {', '.join(f'{r:g}' for r in rates)}; lower the learning rate")
    return max(candidates, key=lambda rate: (len(finished[rate]), np.median(finished[rate])))


def _widened(best_rate, rates, widen, grid, notes) -> float | None:
    """The rate to add when the best is at an edge of the grid tried (and widening may
    go on), else None; an edge that stays is said with the next rate to try."""
    if len(rates) < 2 or min(rates) < best_rate < max(rates):
        return None
    upward = best_rate == max(rates)
    added = rate_grid.next_rate(best_rate, upward)
    edge = f"{grid} start: the best learning rate, {best_rate:g}, is at the "            f"{'top' if upward else 'bottom'} of the grid ({', '.join(f'{r:g}' for r in sorted(rates))})"
    if not widen:
        why = "try also " + f"{added:g}"
    elif not rate_grid.LOWEST <= added <= rate_grid.HIGHEST:
        why = f"not widened: {added:g} is outside {rate_grid.LOWEST:g} to {rate_grid.HIGHEST:g}"
    elif sum(": adding " in note for note in notes) >= MAX_ADDED_RATES:
        why = f"not widened further: {MAX_ADDED_RATES} rates were added already"
    else:
        line = f"{edge}: adding {added:g}"
        notes.append(line)
        logger.info("%s", line)
        return added
    line = f"{edge}; {why}"
    notes.append(line)
    logger.warning("%s", line)
    return None


def _summarise(classifier, setup, trials, best_rate, kept, split, log, notes) -> FinetuneResult:
    metric = setup.spec.metric

    def main_scores(name):
        return [t.scores[name][metric] for t in trials
                if t.learning_rate == best_rate and t.scores]

    _, kept_trial, weights = kept[best_rate]
    classifier.set_weights(log.best_weights(best_rate) if weights is None else weights)
    names = list(setup.evaluation)
    return FinetuneResult(
        task=setup.spec.name, metric=metric, split=split, label_names=setup.label_names,
        trials=trials, best_learning_rate=best_rate,
        median={n: float(np.median(main_scores(n))) for n in names},
        low={n: float(np.min(main_scores(n))) for n in names},
        high={n: float(np.max(main_scores(n))) for n in names},
        classifier=classifier, kept=kept_trial, notes=notes)
