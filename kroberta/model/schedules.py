"""Learning-rate schedule: linear warmup to the peak, then linear decay to zero."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="kroberta")
class WarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """lr(step) = peak * step / warmup for step < warmup, then decays linearly to 0 at total_steps.

    A pure function of the optimizer's step counter, so a resumed run continues the
    schedule exactly where the checkpoint left it.
    """

    def __init__(self, peak_learning_rate, warmup_steps, total_steps):
        self.peak_learning_rate = float(peak_learning_rate)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)

    def __call__(self, step):
        step = ops.cast(step, "float32")
        warmup = ops.maximum(float(self.warmup_steps), 1.0)
        decay_span = ops.maximum(float(self.total_steps - self.warmup_steps), 1.0)
        rising = step / warmup
        falling = ops.maximum(0.0, (float(self.total_steps) - step) / decay_span)
        factor = ops.where(step < self.warmup_steps, rising, ops.minimum(1.0, falling))
        return self.peak_learning_rate * factor

    def get_config(self):
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
        }
