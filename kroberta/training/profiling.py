"""A `jax.profiler` trace of a window of training steps: `train.profile = "START:STOP"`.

The trace covers the optimizer steps START+1 .. STOP and lands in
`run_dir/profile/plugins/profile/<timestamp>/` as `<host>.xplane.pb` (TensorBoard's
profile tab: `tensorboard --logdir run_dir/profile`) and `perfetto_trace.json.gz`
(https://ui.perfetto.dev, "Open trace file"). Writing needs nothing beyond jax.

Steps run K per dispatch (`train.steps_per_execution`): a trace can only begin and
end between dispatches, so START is rounded down and STOP up to multiples of K
(and STOP to at most train.steps); the run logs the window it traces. Outside the
window the profiler is neither started nor consulted: the callback compares two
integers per dispatch.
"""

import logging
import os

import jax
import keras

from kroberta import storage

PROFILE_DIR = "profile"  # under the run directory

logger = logging.getLogger(__name__)


def aligned_window(window: tuple[int, int], k: int, steps: int) -> tuple[int, int]:
    """The window widened to dispatch boundaries: START down and STOP up to multiples
    of K, STOP at most `steps` (the run's last step ends a dispatch too)."""
    start, stop = window
    return start - start % k, min(steps, -(-stop // k) * k)


class ProfileWindow(keras.callbacks.Callback):
    """Starts a trace before the dispatch that runs step START+1 and stops it once step
    STOP has run, each after waiting for the steps already dispatched (so the trace
    holds the window's steps, whole)."""

    def __init__(self, run_dir: str, window: tuple[int, int], start_step: int):
        super().__init__()
        self.directory = storage.join(run_dir, PROFILE_DIR)
        # A URL run dir: traced into a local directory, uploaded when the trace ends.
        self._local = storage.staging_dir(run_dir, "profile") or self.directory
        self.start, self.stop = window
        self.step = start_step  # optimizer steps done before the current log interval
        self.active = False
        self.done = start_step >= self.stop

    def on_epoch_begin(self, epoch, logs=None):
        # fit synced the state at the last interval's end: the counter is exact and cheap.
        self.step = int(self.model.optimizer.iterations.numpy())

    def on_train_batch_begin(self, batch, logs=None):
        if self.done:
            return
        step = self.step + batch  # steps done before this dispatch
        if not self.active and self.start <= step < self.stop:
            self._wait_for_devices()
            os.makedirs(self._local, exist_ok=True)
            jax.profiler.start_trace(self._local, create_perfetto_trace=True)
            self.active = True
            logger.info(f"profile: tracing steps {step + 1}-{self.stop} into {self.directory}")
        elif self.active and step >= self.stop:
            self._finish()

    def on_epoch_end(self, epoch, logs=None):
        # Before the evaluation and checkpoint of a window that ends on a log boundary.
        if self.active and int(self.model.optimizer.iterations.numpy()) >= self.stop:
            self._finish()

    def close(self):
        """Ends a trace still running when training stops (preemption, --until-step, or
        an error); training may span several `fit` calls, so `on_train_end` does not."""
        if self.active:
            self._finish()

    def _wait_for_devices(self):
        # During fit Keras keeps the last dispatch's output state here (for callbacks
        # that need it); between fits the model's variables hold it.
        state = getattr(self.model, "_jax_state", None)
        if state is None:
            state = [v.value for v in self.model.variables]
        jax.block_until_ready(state)

    def _finish(self):
        self._wait_for_devices()
        jax.profiler.stop_trace()
        self.active = False
        self.done = True
        if self._local != self.directory:
            storage.put_tree(self._local, self.directory, remove=True)
        logger.info(
            f"profile: trace written to {self.directory} (tensorboard --logdir "
            f"{self.directory}, or perfetto_trace.json.gz in https://ui.perfetto.dev)"
        )
