"""The learning-rate search: a learning-rate x seed grid, the best rate by validation
score, the grid widened at its edges.

As Hugging Face's run_glue and the RoBERTa paper: AdamW, linear decay after 6%
warmup, a few epochs at batch 32, each learning rate run with several seeds; the
rate whose median validation score (the task's main metric, first evaluation split)
is highest wins, and the median and range over its seeds are reported (fine-tuning
small sets varies a lot from seed to seed). Each trial keeps its best epoch
(`trial`). A trial whose loss diverged is never a score: a rate all of whose
trials diverged is dropped, and one with fewer diverged trials is preferred. When the
best rate is at an edge of the grid, the grid is widened by factors of 3 (at most
`MAX_ADDED_RATES` rates) until it is inside, as a fair comparison of two starts needs (a
random start wants larger rates than a pretrained one); otherwise the next rate to try
is named. The rates accepted are checked with the settings (`settings.check_rates`).
"""

import dataclasses
import logging

import numpy as np

from kroberta.downstream.results import FinetuneResult
from kroberta.downstream.settings import HIGHEST, LOWEST
from kroberta.downstream.trial import Setup, TrialLog, finished_trial
from kroberta.errors import DivergedError

logger = logging.getLogger(__name__)

FACTOR = 3.0  # a grid widens by this factor at its edge
MAX_ADDED_RATES = 4  # rates a grid may gain by widening


def learning_rates(model_config) -> tuple:
    """The default grid: GLUE's from hidden 768; small models (CPU) want larger steps, a
    random start larger still, so their grid starts where docs/benchmarks/downstream.md
    found both starts' best rates (and widens from there)."""
    return (1e-5, 3e-5, 5e-5) if model_config.hidden_dim >= 768 else (3e-4, 1e-3, 3e-3)


def run_grid(
    classifier, setup: Setup, starts, learning_rates, seeds, log: TrialLog, widen: bool = True
) -> FinetuneResult:
    """Fine-tunes `classifier` (compiled by `classifiers.compile_classifier`) once per
    learning rate and seed, from `starts(seed)`'s backbone weights, widening the grid
    while its best rate is at an edge (`widen`, for grids of two rates or more); returns
    the result with the classifier holding the best run's weights. Trials `log` holds
    as finished are taken from it, not run again; each one run is added to it."""
    rates, trials, notes, added = list(learning_rates), {}, [], 0  # added: rates widening added
    kept = {}  # rate -> (score, trial, weights; None: in the log)
    split = next(iter(setup.evaluation))
    while True:
        for learning_rate in rates:
            for seed in seeds:
                if (learning_rate, seed) not in trials:
                    trials[learning_rate, seed] = finished_trial(
                        classifier, setup, starts, seed, learning_rate, log, kept, split
                    )
        best_rate = _best_rate(rates, trials, seeds, setup, split, log.grid, notes)
        rate = _widened(best_rate, rates, widen, added, log.grid, notes)
        if rate is None:
            break
        rates.append(rate)
        added += 1
    return _summarise(classifier, setup, list(trials.values()), best_rate, kept, split, log, notes)


def _best_rate(rates, trials, seeds, setup, split, grid, notes) -> float:
    """The rate with the fewest diverged trials, then the highest median score; rates
    whose every trial diverged are dropped (said once each); all of them: DivergedError."""
    metric = setup.spec.metric
    finished = {
        rate: [
            trials[rate, s].scores[split][metric]
            for s in seeds  # not diverged
            if trials[rate, s].scores
        ]
        for rate in rates
    }
    for rate in rates:
        line = (
            f"{grid} start, lr {rate:g}: every trial diverged (the loss became NaN or inf); "
            "the rate is dropped: lower the learning rate"
        )
        if not finished[rate] and line not in notes:
            notes.append(line)
            logger.warning("%s", line)
    candidates = [rate for rate in rates if finished[rate]]
    if not candidates:
        raise DivergedError(
            f"{setup.spec.name}: every fine-tuning trial diverged (the loss became NaN or inf) "
            f"at learning rate(s) {', '.join(f'{r:g}' for r in rates)}; lower the learning rate"
        )
    return max(candidates, key=lambda rate: (len(finished[rate]), np.median(finished[rate])))


def _widened(best_rate, rates, widen, added, grid, notes) -> float | None:
    """The rate to add when the best is at an edge of the grid tried (and widening may
    go on: fewer than MAX_ADDED_RATES `added` so far), else None; an edge that stays is
    said with the next rate to try."""
    if len(rates) < 2 or min(rates) < best_rate < max(rates):
        return None
    upward = best_rate == max(rates)
    # A factor of 3 up or down, at three significant digits (3e-4 -> 9e-4).
    rate = float(f"{best_rate * FACTOR if upward else best_rate / FACTOR:.3g}")
    edge = (
        f"{grid} start: the best learning rate, {best_rate:g}, is at the "
        f"{'top' if upward else 'bottom'} of the grid ({', '.join(f'{r:g}' for r in sorted(rates))})"
    )
    if not widen:
        why = "try also " + f"{rate:g}"
    elif not LOWEST <= rate <= HIGHEST:
        why = f"not widened: {rate:g} is outside {LOWEST:g} to {HIGHEST:g}"
    elif added >= MAX_ADDED_RATES:
        why = f"not widened further: {MAX_ADDED_RATES} rates were added already"
    else:
        line = f"{edge}: adding {rate:g}"
        notes.append(line)
        logger.info("%s", line)
        return rate
    line = f"{edge}; {why}"
    notes.append(line)
    logger.warning("%s", line)
    return None


def _summarise(classifier, setup, trials, best_rate, kept, split, log, notes) -> FinetuneResult:
    metric = setup.spec.metric

    def main_scores(name):
        return [t.scores[name][metric] for t in trials if t.learning_rate == best_rate and t.scores]

    _, kept_trial, weights = kept[best_rate]
    classifier.set_weights(log.best_weights(best_rate) if weights is None else weights)
    names = list(setup.evaluation)
    return FinetuneResult(
        task=setup.spec.name,
        metric=metric,
        split=split,
        label_names=setup.label_names,
        trials=trials,
        best_learning_rate=best_rate,
        median={n: float(np.median(main_scores(n))) for n in names},
        low={n: float(np.min(main_scores(n))) for n in names},
        high={n: float(np.max(main_scores(n))) for n in names},
        classifier=classifier,
        kept=kept_trial,
        notes=notes,
        recipe=setup.config.recipe(),
        config=dataclasses.asdict(setup.config),
    )
