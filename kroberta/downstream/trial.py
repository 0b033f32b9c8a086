"""One fine-tuning trial, and the log of finished trials that resumes a fine-tune.

A trial is one (learning rate, seed) run, as Hugging Face's Trainer with
`eval_strategy="epoch"`, `load_best_model_at_end` and `EarlyStoppingCallback`: the
validation split that chooses the learning rate is scored after every pass, the
trial's result is its best epoch (its weights are put back at the end), and with a
patience the trial ends after that many passes without a better score. A loss that
becomes NaN or inf ends the trial at once as diverged: it is never scored. While a
trial runs, a live bar (terminal, notebook) or a logged row every few seconds (a file,
a pipe) shows its step, loss and time left.

Each trial starts from the same state whatever ran before it (`classifiers.reset`), so
a rerun that takes the finished trials from the output folder (`TrialLog`) and runs the
others ends with the result one uninterrupted run gives. The folder holds
`trials.jsonl` (a row per finished trial, with the settings it ran under) and, per grid
and learning rate, the weights of that rate's best trial so far (`trials/*.npz`): the
classifier the result keeps is one of those.
"""

import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import sys
import time

import keras
import numpy as np

from kroberta import console, storage
from kroberta.atomic import atomic_path, atomic_write
from kroberta.downstream import classifiers, encoding, metrics, prediction
from kroberta.downstream.results import Trial
from kroberta.downstream.settings import FinetuneConfig
from kroberta.downstream.tasks import REGRESSION, TaskSpec
from kroberta.errors import InputError
from kroberta.run_layout import TRIALS_FILE

EPOCH_SEEDS = 1000  # pass p of seed s shuffles with s * 1000 + p
HEAD_EPOCHS = 500  # LP-FT's head-only pass p of seed s: s * 1000 + 500 + p
WEIGHTS_DIR = "trials"  # in the output folder: each rate's best trial's weights

logger = logging.getLogger(__name__)


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
    # The settings it was made from (the patience, pooling and recipe options).
    config: FinetuneConfig = dataclasses.field(default_factory=FinetuneConfig)

    @functools.cached_property
    def evaluation_batches(self) -> dict:
        """{split: `encoding.dataset`'s (batches, rows)}: built once, predicted after every run."""
        return {
            name: encoding.dataset(encoded, self.batch_size, self.max_length)
            for name, encoded in self.evaluation.items()
        }

    @functools.cached_property
    def steps_per_epoch(self) -> int:
        """Training steps of one pass: the bucketed batches."""
        return encoding.batch_count(self.train, self.batch_size, self.max_length)

    @property
    def steps(self) -> int:
        """Training steps of one run: `epochs` passes."""
        return self.epochs * self.steps_per_epoch


def finished_trial(
    classifier, setup, starts, seed: int, learning_rate: float, log, kept: dict, split: str
) -> Trial:
    """The trial of (`learning_rate`, `seed`): from `log` when it holds it, else run now
    from `starts(seed)` and recorded there. `kept` ({rate: (score, trial, weights; None:
    in the log)}) keeps each rate's best trial so far."""
    done = log.finished.get((learning_rate, seed))
    if done is not None:
        trial = Trial(**{f.name: done.get(f.name) for f in dataclasses.fields(Trial)})
    else:
        began = time.perf_counter()
        title = f"{setup.spec.name} ({log.grid} start) lr {learning_rate:g} seed {seed}"
        outcome = run_trial(classifier, setup, starts(seed), seed, learning_rate, title)
        trial = Trial(learning_rate, seed, seconds=time.perf_counter() - began, **vars(outcome))
        if trial.diverged:
            logger.warning("%s: diverged at %s; lower the learning rate", title, trial.diverged)
        else:
            logger.info(
                "%s: %s at epoch %d of %d (%.1f s)",
                title,
                _describe(trial.scores),
                trial.best_epoch,
                trial.epochs_run,
                trial.seconds,
            )
    score = trial.scores[split][setup.spec.metric] if trial.scores else None
    best = score is not None and (learning_rate not in kept or score > kept[learning_rate][0])
    if best:
        kept[learning_rate] = (score, trial, None if done else classifier.get_weights())
    if done is None:
        log.record(trial, kept[learning_rate][2] if best else None)
    return trial


def _describe(scores: dict) -> str:
    return "; ".join(
        f"{split} " + ", ".join(f"{k} {v:.4f}" for k, v in values.items())
        for split, values in scores.items()
    )


@dataclasses.dataclass
class Outcome:
    """What a trial ends with.

    Attributes:
        scores: {split: {metric: value}} of its best epoch; None when it diverged.
        predictions: the first split's (n,) predictions at the best epoch (class ids,
            or values for regression), for the comparison of two starts; None when
            it diverged.
        best_epoch: the best epoch, from 1 (None: diverged).
        epochs_run: the passes it ran (fewer than asked after early stopping).
        diverged: where the loss stopped being finite ("epoch 1, step 12: loss nan").
    """

    scores: dict | None
    predictions: list | None
    best_epoch: int | None
    epochs_run: int
    diverged: str | None = None


def predictions_of(classifier, setup, split: str) -> np.ndarray:
    """(n,) class ids (or regression values) the classifier predicts for a split."""
    labels = setup.evaluation[split].labels
    ordered = prediction.outputs(
        classifier, *setup.evaluation_batches[split], len(labels)
    )  # (n, K)
    return ordered[:, 0] if setup.spec.kind == REGRESSION else ordered.argmax(-1)


def score(setup, split: str, predictions) -> dict:
    """{metric: value} of one split's predictions."""
    names = setup.spec.metrics(len(setup.label_names or ()))
    return metrics.score(names, setup.evaluation[split].labels, predictions)


class _Watch(keras.callbacks.Callback):
    """Runs beside a trial's `fit`: stops it at a non-finite loss, shows its progress.

    Overriding on_train_batch_end makes Keras fetch the logs after each dispatch
    (`steps_per_execution` steps), a sync a fine-tune can afford and what an at-once
    stop on NaN needs."""

    def __init__(self, title: str, steps_per_epoch: int, epochs: int):
        super().__init__()
        self.steps_per_epoch = steps_per_epoch
        self.total = epochs * steps_per_epoch
        self.first_step = 0  # steps of the trial before this epoch
        self.step = 0
        self.loss = math.nan
        self.diverged = None
        # A live line, or (in a log) a row every 10 seconds.
        self.bar = console.Progress(self.total, stream=sys.stdout, rows=logger.info, title=title)

    def on_train_batch_end(self, batch, logs=None):
        # `batch` is the dispatch's last step counted from 0 in this epoch (Keras counts a
        # whole `steps_per_execution` even where the epoch ends sooner).
        self.step = self.first_step + min(batch + 1, self.steps_per_epoch)
        self.loss = float(logs["loss"])  # the epoch's running mean: NaN stays NaN
        if not math.isfinite(self.loss):
            self.diverged = f"step {self.step}: loss {self.loss}"
            self.model.stop_training = True
            return
        self.bar.update(self.step, {"loss": self.loss})

    def fit_pass(self, classifier, setup, epoch: int, order: int):
        """Fits `classifier` to one pass over the training split shuffled by seed `order`,
        the `epoch`th (from 1) this watch sees."""
        train, _ = encoding.dataset(setup.train, setup.batch_size, setup.max_length, order)
        self.first_step = (epoch - 1) * self.steps_per_epoch
        classifier.fit(train, epochs=1, verbose=0, shuffle=False, callbacks=[self])


def run_trial(
    classifier, setup, start: list, seed: int, learning_rate: float, title: str
) -> Outcome:
    """Fine-tunes from `start` for up to `setup.epochs` passes (`early_stopping`: passes
    without a better score before it stops), scoring every split after each; leaves
    the classifier holding the best epoch's weights."""
    classifiers.reset(classifier, start, seed, learning_rate)
    if setup.config.probe_epochs:
        diverged = train_head(classifier, setup, seed, learning_rate, title)
        if diverged:
            return Outcome(None, None, None, 0, diverged)
    split, patience = next(iter(setup.evaluation)), setup.config.early_stopping
    watch = _Watch(title, setup.steps_per_epoch, setup.epochs)
    best, since_best, epoch = None, 0, 0  # best: (score, epoch, scores, predictions, weights)
    try:
        for epoch in range(1, setup.epochs + 1):
            # Each pass its own order.
            watch.fit_pass(classifier, setup, epoch, seed * EPOCH_SEEDS + epoch - 1)
            if watch.diverged:
                return Outcome(None, None, None, epoch, f"epoch {epoch}, {watch.diverged}")
            predicted = {name: predictions_of(classifier, setup, name) for name in setup.evaluation}
            scores = {name: score(setup, name, p) for name, p in predicted.items()}
            main = scores[split][setup.spec.metric]
            better = best is None or main > best[0]
            watch.bar.note(  # above the live bar, or logged
                f"{title}: epoch {epoch}/{setup.epochs}: loss {watch.loss:.4f}, {split} "
                f"{setup.spec.metric} {main:.4f}" + (" (best)" if better else "")
            )
            if better:
                # On the host: the device's copy goes on training.
                best = (main, epoch, scores, predicted[split], classifier.get_weights())
                since_best = 0
            else:
                since_best += 1
                if patience and since_best >= patience:
                    watch.bar.note(
                        f"{title}: stopped early: no better {split} {setup.spec.metric} "
                        f"in {since_best} epoch(s) (patience {patience})"
                    )
                    break
    finally:
        watch.bar.erase()  # the trial's summary line takes its place
    _, best_epoch, scores, predicted, weights = best
    if best_epoch != epoch:
        classifier.set_weights(weights)
    return Outcome(scores, predicted.tolist(), best_epoch, epoch)


def train_head(classifier, setup, seed: int, learning_rate: float, title: str) -> str | None:
    """LP-FT's first phase (Kumar et al. 2022): `setup.config.probe_epochs` passes that
    train the head alone, the backbone frozen (`trainable = False`, compiled again so the
    optimizer holds the head's variables only), at the trial's learning rate with the
    recipe's warmup and decay over these passes; then the classifier is compiled again
    for the whole model (`setup.steps`). Returns where the loss diverged, else None."""
    epochs = setup.config.probe_epochs
    watch = _Watch(f"{title} (head)", setup.steps_per_epoch, epochs)
    classifier.backbone.trainable = False
    try:
        classifiers.compile_classifier(
            classifier, setup.spec.kind, epochs * setup.steps_per_epoch, setup.steps_per_execution
        )
        classifier.kroberta_schedule.scale.assign(learning_rate)
        for epoch in range(1, epochs + 1):
            watch.fit_pass(classifier, setup, epoch, seed * EPOCH_SEEDS + HEAD_EPOCHS + epoch - 1)
            if watch.diverged:
                return f"head epoch {epoch}, {watch.diverged}"
    finally:
        watch.bar.erase()
        classifier.backbone.trainable = True
        classifiers.compile_classifier(
            classifier,
            setup.spec.kind,
            setup.steps,
            setup.steps_per_execution,
            setup.config.layer_decay,
        )
        classifier.kroberta_schedule.scale.assign(learning_rate)
    return None


class TrialLog:
    """The finished trials of one grid (the pretrained start, or the random baseline).

    Args:
        directory: the fine-tune's output folder, or None to keep nothing (no resume).
        grid: the grid's name in the folder ("pretrained", "random").
        settings: what decides a trial's result besides its rate and seed (task, data
            sizes, epochs, batch, length, the starting weights' fingerprint), as JSON
            values; rows written under other settings are refused, not reused.
    """

    def __init__(self, directory: str | None, grid: str, settings: dict):
        self.directory, self.grid = directory, grid
        self.settings = json.loads(json.dumps(settings))  # as it reads back
        self.finished = {}  # (learning rate, seed) -> row
        for row in self._rows():
            if row["grid"] != grid:
                continue
            if row["settings"] != self.settings:
                # Both sides' keys: an option on in only one of them is named too.
                changed = sorted(
                    k
                    for k in {**row["settings"], **self.settings}
                    if row["settings"].get(k) != self.settings.get(k)
                )
                raise InputError(
                    f"--out {directory}: holds trials of another fine-tune ({', '.join(changed)} "
                    "differ); give another --out, or remove its trials.jsonl to start over"
                )
            self.finished[(row["learning_rate"], row["seed"])] = row
        if self.finished:
            logger.info(
                "%s: %d finished %s trial(s) kept from an earlier run",
                directory,
                len(self.finished),
                grid,
            )

    def _rows(self) -> list:
        if self.directory is None:
            return []
        path = os.path.join(self.directory, TRIALS_FILE)
        if not os.path.isfile(path):
            return []
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    def _weights_path(self, learning_rate: float) -> str:
        return os.path.join(self.directory, WEIGHTS_DIR, f"{self.grid}-lr{learning_rate:g}.npz")

    def record(self, trial, best_weights: list | None):
        """Keeps a finished trial (`Trial`; a diverged one too, so a resumed grid
        does not run it again) and its weights when it is its rate's best so far: the
        weights first, so a row never names weights that were not written. A failed write
        (a full disk) is a StorageError; the trials recorded before it stay."""
        if self.directory is None:
            return
        then = (
            "the trials that finished before are kept; free some space and run the same "
            "command again to resume from them"
        )
        folder = os.path.join(self.directory, WEIGHTS_DIR)
        with storage.writing(folder, "trial's weights", then):
            os.makedirs(folder, exist_ok=True)
            if best_weights is not None:
                with atomic_path(self._weights_path(trial.learning_rate)) as tmp:
                    np.savez(tmp, *best_weights)
        row = {"grid": self.grid, **dataclasses.asdict(trial), "settings": self.settings}
        rows = self._rows() + [row]
        path = os.path.join(self.directory, TRIALS_FILE)
        with storage.writing(path, "trial log", then), atomic_write(path) as f:
            f.writelines(json.dumps(r, allow_nan=False) + "\n" for r in rows)

    def best_weights(self, learning_rate: float) -> list:
        """The weights of the rate's best finished trial, as `get_weights` gives them."""
        with np.load(self._weights_path(learning_rate)) as f:
            return [f[f"arr_{i}"] for i in range(len(f.files))]


def fingerprint(weights: list) -> str:
    """A short digest of a list of arrays: which starting point a grid ran from."""
    digest = hashlib.sha256()
    for w in weights:
        digest.update(np.ascontiguousarray(w).tobytes())
    return digest.hexdigest()[:16]
