"""Learning-rate schedules: linear warmup to the peak, then "linear", "cosine",
"constant", "inverse_sqrt" or "wsd" (`train.schedule`).

With w = warmup_steps (a config's `train.effective_warmup_steps()`), T = total_steps,
p = (step - w) / (T - w) the fraction of the decay done, m = min_learning_rate (the
floor) and, for "wsd", D = decay_steps and q = (step - (T - D)) / D, for step >= w:

    linear        m + (peak - m) * (1 - p)                    m at T (BERT, RoBERTa: m = 0)
    cosine        m + (peak - m) * (1 + cos(pi * p)) / 2      m at T
    constant      peak
    inverse_sqrt  max(m, peak * sqrt(w / step))               (fairseq; never reaches 0)
    wsd           peak until T - D, then m + (peak - m) * (1 - q)   m at T
                  (warmup-stable-decay: the run's length can grow without a new warmup)

and peak * step / w before. Steps are optimizer steps (accumulated micro-batches
count once). Fine-tuning uses the linear one at peak 1 times its `scale`, an optimizer
variable holding the peak: one compiled step serves every learning rate of a grid.
"""

import math

import keras
from keras import ops

from kroberta.config import SCHEDULES  # the names train.schedule accepts


@keras.saving.register_keras_serializable(package="kroberta")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """lr(step): linear warmup over `warmup_steps`, then the `decay` above.

    A pure function of the optimizer's step counter (and `scale`), so a resumed run
    continues the schedule exactly where the checkpoint left it.

    Args:
        peak_learning_rate: the rate reached at the end of the warmup.
        warmup_steps: steps of the linear warmup from 0.
        total_steps: the run's length (T above).
        decay: one of `SCHEDULES`.
        min_learning_rate: the floor every decaying schedule ends at (m above).
        decay_steps: for "wsd", the steps of the final decay (D above).

    Attributes:
        scale: None, or a variable the rate is multiplied by (set after the optimizer
            is built, which owns it): fine-tuning's peak, changed without recompiling.
    """

    def __init__(
        self,
        peak_learning_rate,
        warmup_steps,
        total_steps,
        decay="linear",
        min_learning_rate=0.0,
        decay_steps=0,
    ):
        if decay not in SCHEDULES:
            raise ValueError(f"decay must be one of {SCHEDULES}, got {decay!r}")
        self.peak_learning_rate = float(peak_learning_rate)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.decay = decay
        self.min_learning_rate = float(min_learning_rate)
        self.decay_steps = int(decay_steps)
        self.scale = None

    def __call__(self, step):
        step = ops.cast(step, "float32")
        warmup = float(max(self.warmup_steps, 1))
        rising = self.peak_learning_rate * step / warmup
        rate = ops.where(step < self.warmup_steps, rising, self._after_warmup(step))
        return rate if self.scale is None else self.scale * rate

    def _after_warmup(self, step):
        """The rate from warmup_steps on."""
        peak, floor = self.peak_learning_rate, self.min_learning_rate
        if self.decay == "constant":
            return peak * ops.ones_like(step)
        if self.decay == "inverse_sqrt":
            return ops.maximum(
                peak * ops.sqrt(float(max(self.warmup_steps, 1)) / ops.maximum(step, 1.0)), floor
            )
        if self.decay == "wsd":
            begin = max(self.total_steps - self.decay_steps, self.warmup_steps)
        else:
            begin = self.warmup_steps
        span = float(max(self.total_steps - begin, 1))
        done = ops.clip((step - begin) / span, 0.0, 1.0)  # p (q for wsd)
        if self.decay == "cosine":
            factor = 0.5 * (1.0 + ops.cos(math.pi * done))
        else:
            factor = 1.0 - done
        return floor + (peak - floor) * factor

    def get_config(self):
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "decay": self.decay,
            "min_learning_rate": self.min_learning_rate,
            "decay_steps": self.decay_steps,
        }


def from_train_config(t) -> WarmupSchedule:
    """The schedule `train.*` describes (a `TrainConfig`)."""
    return WarmupSchedule(
        t.learning_rate,
        t.effective_warmup_steps(),
        t.steps,
        t.schedule,
        min_learning_rate=t.min_learning_rate,
        decay_steps=t.wsd_decay_steps(),
    )
