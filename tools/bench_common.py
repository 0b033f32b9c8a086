"""What tools/bench.py and tools/bench_predict.py share: simulated CPU devices and a timed `fit`."""

import os
import sys
import time


def simulate_cpu_devices(count: int):
    """`count` CPU devices and the repository on sys.path; call before jax is imported."""
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def fit_timer():
    """A Keras callback whose `seconds` is the wall time of an epoch's steps 1..n.

    Step 0 (iterator start-up, first-call compile) is left out. It defines
    on_train_batch_end as RunLogger does, so Keras runs the callbacks
    synchronously and has synced step 0 when step 1 begins."""
    import keras

    class Timer(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == 1:
                self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            pass

        def on_epoch_end(self, epoch, logs=None):
            self.seconds = time.perf_counter() - self.start

    return Timer()


def fit_samples_per_second(model, dataset, steps: int, global_batch: int) -> float:
    """Samples/s of `steps` training steps of `model.fit`, as kroberta.train runs
    them: with a `fit_timer` callback. Step 0 is not timed."""
    timer = fit_timer()
    model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[timer], shuffle=False)
    return (steps - 1) * global_batch / timer.seconds
