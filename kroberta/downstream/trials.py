"""A fine-tune's finished trials, kept in its output folder so an interrupted run resumes.

Each (learning rate, seed) trial starts from the same state whatever ran before it
(`classifiers.reset`), so a rerun that takes the finished trials from the folder and
runs the others ends with the result one uninterrupted run gives. The folder holds
`trials.jsonl` (a row per finished trial, with the settings it ran under) and, per grid
and learning rate, the weights of that rate's best trial so far (`trials/*.npz`): the
classifier the result keeps is one of those.
"""

import hashlib
import json
import logging
import os

import numpy as np

from kroberta import storage
from kroberta.atomic import atomic_path, atomic_write
from kroberta.errors import InputError

TRIALS_FILE = "trials.jsonl"
WEIGHTS_DIR = "trials"

logger = logging.getLogger(__name__)


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
                changed = sorted(k for k in {**row["settings"], **self.settings}
                                 if row["settings"].get(k) != self.settings.get(k))
                raise InputError(
                    f"--out {directory}: holds trials of another fine-tune ({', '.join(changed)} "
                    "differ); give another --out, or remove its trials.jsonl to start over")
            self.finished[(row["learning_rate"], row["seed"])] = row
        if self.finished:
            logger.info("%s: %d finished %s trial(s) kept from an earlier run", directory,
                        len(self.finished), grid)

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
        """Keeps a finished trial (`recipe.Trial`; a diverged one too, so a resumed grid
        does not run it again) and its weights when it is its rate's best so far: the
        weights first, so a row never names weights that were not written. A failed write
        (a full disk) is a StorageError; the trials recorded before it stay."""
        if self.directory is None:
            return
        then = ("the trials that finished before are kept; free some space and run the same "
                "command again to resume from them")
        folder = os.path.join(self.directory, WEIGHTS_DIR)
        with storage.writing(folder, "trial's weights", then):
            os.makedirs(folder, exist_ok=True)
            if best_weights is not None:
                with atomic_path(self._weights_path(trial.learning_rate)) as tmp:
                    np.savez(tmp, *best_weights)
        row = {"grid": self.grid, "learning_rate": trial.learning_rate, "seed": trial.seed,
               "scores": trial.scores, "seconds": trial.seconds, "best_epoch": trial.best_epoch,
               "epochs_run": trial.epochs_run, "diverged": trial.diverged,
               "predictions": trial.predictions, "settings": self.settings}
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
