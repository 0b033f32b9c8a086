"""Learning-rate schedules: linear warmup to the peak, then "linear", "cosine",
"constant" or "inverse_sqrt" (`train.schedule`).

With w = warmup_steps, T = total_steps and p = (step - w) / (T - w) the fraction
of the decay done, for step >= w:

    linear        peak * (1 - p)                    0 at T (BERT, RoBERTa)
    cosine        peak * (1 + cos(pi * p)) / 2      0 at T
    constant      peak
    inverse_sqrt  peak * sqrt(w / step)             (fairseq; never reaches 0)

and peak * step / w before. Steps are optimizer steps (accumulated micro-batches
count once).
"""

import math

import keras
from keras import ops

from kroberta.config import SCHEDULES  # the names train.schedule accepts


@keras.saving.register_keras_serializable(package="kroberta")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """lr(step): linear warmup over `warmup_steps`, then the `decay` above.

    A pure function of the optimizer's step counter, so a resumed run continues the
    schedule exactly where the checkpoint left it.
    """

    def __init__(self, peak_learning_rate, warmup_steps, total_steps, decay="linear"):
        if decay not in SCHEDULES:
            raise ValueError(f"decay must be one of {SCHEDULES}, got {decay!r}")
        self.peak_learning_rate = float(peak_learning_rate)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.decay = decay

    def __call__(self, step):
        step = ops.cast(step, "float32")
        warmup = float(max(self.warmup_steps, 1))
        rising = step / warmup
        factor = ops.where(step < self.warmup_steps, rising, self._after_warmup(step))
        return self.peak_learning_rate * factor

    def _after_warmup(self, step):
        """The factor (of the peak) from warmup_steps on."""
        if self.decay == "constant":
            return ops.ones_like(step)
        if self.decay == "inverse_sqrt":
            return ops.sqrt(float(max(self.warmup_steps, 1)) / ops.maximum(step, 1.0))
        span = float(max(self.total_steps - self.warmup_steps, 1))
        done = ops.clip((step - self.warmup_steps) / span, 0.0, 1.0)  # p
        if self.decay == "cosine":
            return 0.5 * (1.0 + ops.cos(math.pi * done))
        return 1.0 - done

    def get_config(self):
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "decay": self.decay,
        }


@keras.saving.register_keras_serializable(package="kroberta")
class WarmupLinearDecay(WarmupSchedule):
    """`WarmupSchedule(..., decay="linear")`, under the name earlier saved models use."""

    def __init__(self, peak_learning_rate, warmup_steps, total_steps):
        super().__init__(peak_learning_rate, warmup_steps, total_steps, "linear")

    def get_config(self):
        config = super().get_config()
        del config["decay"]
        return config
