"""One fine-tuning trial: epochs with an evaluation after each, the best epoch kept.

As Hugging Face's Trainer with `eval_strategy="epoch"`, `load_best_model_at_end` and
`EarlyStoppingCallback`: the validation split that chooses the learning rate is scored
after every pass, the trial's result is its best epoch (its weights are put back at
the end), and with a patience the trial ends after that many passes without a better
score. A loss that becomes NaN or inf ends the trial at once as diverged: it is never
scored. While a trial runs, a live bar (terminal, notebook) or a logged row every few
seconds (a file, a pipe) shows its step, loss and time left.
"""

import dataclasses
import logging
import math
import sys

import keras
import numpy as np

from kroberta import console
from kroberta.downstream import classifiers, encoding, metrics, prediction
from kroberta.downstream.examples import REGRESSION

EPOCH_SEEDS = 1000  # pass p of seed s shuffles with s * 1000 + p
HEAD_EPOCHS = 500  # LP-FT's head-only pass p of seed s: s * 1000 + 500 + p

logger = logging.getLogger(__name__)


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
    ordered = prediction.outputs(classifier, *setup.evaluation_batches[split], len(labels))  # (n, K)
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

    def say(self, line: str):
        """A line of its own: above the live bar, or logged."""
        self.bar.note(line)

    def close(self):
        self.bar.erase()  # the trial's summary line takes its place


def run_trial(classifier, setup, start: list, seed: int, learning_rate: float,
              title: str) -> Outcome:
    """Fine-tunes from `start` for up to `setup.epochs` passes (`setup.patience`: passes
    without a better score before it stops), scoring every split after each; leaves
    the classifier holding the best epoch's weights."""
    classifiers.reset(classifier, start, seed, learning_rate)
    if setup.config.probe_epochs:
        diverged = train_head(classifier, setup, seed, learning_rate, title)
        if diverged:
            return Outcome(None, None, None, 0, diverged)
    split = next(iter(setup.evaluation))
    steps_per_epoch = encoding.batch_count(setup.train, setup.batch_size, setup.max_length)
    watch = _Watch(title, steps_per_epoch, setup.epochs)
    best, since_best, epoch = None, 0, 0  # best: (score, epoch, scores, predictions, weights)
    try:
        for epoch in range(1, setup.epochs + 1):
            train, _ = encoding.dataset(setup.train, setup.batch_size, setup.max_length,
                                        seed * EPOCH_SEEDS + epoch - 1)  # each pass its own order
            watch.first_step = (epoch - 1) * steps_per_epoch
            classifier.fit(train, epochs=1, verbose=0, shuffle=False, callbacks=[watch])
            if watch.diverged:
                return Outcome(None, None, None, epoch, f"epoch {epoch}, {watch.diverged}")
            predicted = {name: predictions_of(classifier, setup, name) for name in setup.evaluation}
            scores = {name: score(setup, name, p) for name, p in predicted.items()}
            main = scores[split][setup.spec.metric]
            better = best is None or main > best[0]
            watch.say(f"{title}: epoch {epoch}/{setup.epochs}: loss {watch.loss:.4f}, {split} "
                      f"{setup.spec.metric} {main:.4f}" + (" (best)" if better else ""))
            if better:
                # On the host: the device's copy goes on training.
                best = (main, epoch, scores, predicted[split], classifier.get_weights())
                since_best = 0
            else:
                since_best += 1
                if setup.patience and since_best >= setup.patience:
                    watch.say(f"{title}: stopped early: no better {split} {setup.spec.metric} "
                              f"in {since_best} epoch(s) (patience {setup.patience})")
                    break
    finally:
        watch.close()
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
    steps_per_epoch = encoding.batch_count(setup.train, setup.batch_size, setup.max_length)
    watch = _Watch(f"{title} (head)", steps_per_epoch, epochs)
    classifier.backbone.trainable = False
    try:
        classifiers.compile_classifier(classifier, setup.spec.kind, epochs * steps_per_epoch,
                                       setup.steps_per_execution)
        classifier.kroberta_schedule.scale.assign(learning_rate)
        for epoch in range(1, epochs + 1):
            train, _ = encoding.dataset(setup.train, setup.batch_size, setup.max_length,
                                        seed * EPOCH_SEEDS + HEAD_EPOCHS + epoch - 1)
            watch.first_step = (epoch - 1) * steps_per_epoch
            classifier.fit(train, epochs=1, verbose=0, shuffle=False, callbacks=[watch])
            if watch.diverged:
                return f"head epoch {epoch}, {watch.diverged}"
    finally:
        watch.close()
        classifier.backbone.trainable = True
        classifiers.compile_classifier(classifier, setup.spec.kind, setup.steps,
                                       setup.steps_per_execution, setup.config.layer_decay)
        classifier.kroberta_schedule.scale.assign(learning_rate)
    return None
