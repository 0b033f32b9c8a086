"""K steps per dispatch inside `fit` / `evaluate` on Keras 3.15 (the one version check).

Keras >= 3.16 fuses `steps_per_execution = K` itself: its JAX trainer scans the
model's `train_step` / `test_step` over (K, batch, ...) super-batches
(`_build_multi_step_scan`, `get_jax_iterator(super_batch=K)`) and sends the next
super-batch to the devices while one computes (`_one_batch_ahead_iterator`). There
`StepsPerDispatch` is an empty mixin and Keras' own path runs.

Keras 3.15 runs K steps as a Python loop over a one-step jitted program
(keras/src/backend/jax/trainer.py, `_make_function`): K dispatches and K transfers,
each made only when its step needs it. On 3.15 `StepsPerDispatch` does what 3.16
does, for the model class that mixes it in (`kroberta.model.masked_lm`):

- the data iterator yields super-batches, every leaf (K, batch, ...): a tf.data
  dataset of (x, y) batches is batched by K inside tf.data (one Python-level
  `next` per dispatch), any other input is stacked on the host;
- `train_function` / `test_function` run `kroberta.model.super_batch.scan_steps` of the
  model's `train_step` / `test_step`: one program, one dispatch, the state carried on
  the devices; the metrics accumulate over all K steps, exactly as K separate steps;
- super-batches go to the devices ahead of use (`PREFETCH_DEPTH`), sharded as the
  step expects (batch axis second) under any Keras distribution and across processes.

A last group with fewer than K batches is scanned at its own length (one more
compilation, once). Callbacks see one `on_train_batch_begin/end` per dispatch, with
step numbers counting single steps, as Keras shows them for steps_per_execution = K.

This module goes when the lowest supported Keras is 3.16 (docs/stacks.md): only
`prefetch_to_devices` is then worth keeping, if a measurement shows Keras' one batch
of lookahead is not enough.
"""

import collections
import contextlib

import jax
import keras
import numpy as np
import tensorflow as tf

from kroberta.model.super_batch import scan_steps, super_batch_sharding

PREFETCH_DEPTH = 2  # super-batches on the devices: the one computing and the next
# The one version check of the training step: Keras fuses steps_per_execution itself from 3.16.
KERAS_FUSES_STEPS = tuple(int(part) for part in keras.version().split(".")[:2]) >= (3, 16)


class SuperBatch:
    """What the super-batch iterator yields: `data`, every leaf (K, batch, ...), on the
    devices. Anything else reaching a train/test function (`train_on_batch`'s single
    batch) runs as one step."""

    __slots__ = ("data",)

    def __init__(self, data):
        self.data = data


def _dispatcher(step, out_shardings):
    """The train/test function: a `SuperBatch` as one scanned dispatch, else one step."""
    fused = jax.jit(scan_steps(step), donate_argnums=0, out_shardings=out_shardings)
    single = jax.jit(step, donate_argnums=0, out_shardings=out_shardings)

    def function(state, iterator):
        data = next(iterator)
        if isinstance(data, SuperBatch):
            return fused(state, data.data)  # K steps, one dispatch
        return single(state, data)

    return function


class _FusedStepsOnKeras315:
    """`fit` / `evaluate` with K steps per dispatch on Keras 3.15 (see the module)."""

    def make_train_function(self, force=False):
        if self.train_function is not None and not force:
            return
        out_shardings = None
        if keras.distribution.distribution() is not None:
            out_shardings = (None, self._get_state_sharding_spec())
        self.train_function = _dispatcher(self.train_step, out_shardings)

    def make_test_function(self, force=False):
        if self.test_function is not None and not force:
            return
        out_shardings = None
        if keras.distribution.distribution() is not None:
            trainable, non_trainable, _, metrics = self._get_state_sharding_spec()
            out_shardings = (None, (trainable, non_trainable, metrics))
        self.test_function = _dispatcher(self.test_step, out_shardings)

    def fit(self, *args, **kwargs):
        with _super_batch_epoch_iterator():
            return super().fit(*args, **kwargs)

    def evaluate(self, *args, **kwargs):
        with _super_batch_epoch_iterator():
            return super().evaluate(*args, **kwargs)


class _KerasFusesSteps:
    """Keras >= 3.16 runs K steps per dispatch itself: nothing to add."""


StepsPerDispatch = _KerasFusesSteps if KERAS_FUSES_STEPS else _FusedStepsOnKeras315


@contextlib.contextmanager
def _super_batch_epoch_iterator():
    # Keras 3.15's fit/evaluate construct `JAXEpochIterator` by its module-level name;
    # no public hook chooses the epoch iterator (3.16 needs none: it batches by K itself).
    from keras.src.backend.jax import trainer as jax_trainer

    saved = jax_trainer.JAXEpochIterator
    if getattr(saved, "yields_super_batches", False):
        # Already in place: an `evaluate` called by a callback inside `fit`.
        yield
        return
    jax_trainer.JAXEpochIterator = _super_batch_iterator_class(saved)
    try:
        yield
    finally:
        jax_trainer.JAXEpochIterator = saved


def _super_batch_iterator_class(epoch_iterator):
    """Keras 3.15's JAX epoch iterator class made to yield device super-batches
    (K, batch, ...) ahead of use."""

    class SuperBatchEpochIterator(epoch_iterator):
        yields_super_batches = True

        def __init__(
            self,
            x,
            y=None,
            sample_weight=None,
            batch_size=None,
            steps_per_epoch=None,
            shuffle=False,
            class_weight=None,
            steps_per_execution=1,
        ):
            self._flat_batches = None
            self._grouped_in_tf = isinstance(x, tf.data.Dataset) and class_weight is None
            if self._grouped_in_tf:
                size = int(x.cardinality())
                self._flat_batches = size if size >= 0 else None
                # Super-batches of K (a shorter last one), their cardinality hidden: Keras
                # counts steps in single batches (steps_per_epoch, or the flat dataset's
                # size) and would read a known count of super-batches as one of those.
                x = (
                    x.batch(steps_per_execution, drop_remainder=False)
                    .filter(lambda *_: True)
                    .prefetch(tf.data.AUTOTUNE)
                )
            super().__init__(
                x,
                y=y,
                sample_weight=sample_weight,
                batch_size=batch_size,
                steps_per_epoch=steps_per_epoch,
                shuffle=shuffle,
                class_weight=class_weight,
                steps_per_execution=steps_per_execution,
            )
            self._count_single_batches()

        def _count_single_batches(self):
            # Keras counts an epoch in single batches; the adapter sees super-batches
            # (and their hidden cardinality), so the count comes from the flat dataset.
            if self._grouped_in_tf:
                self._num_batches = self._flat_batches

        def reset(self):
            super().reset()
            self._count_single_batches()

        def _get_iterator(self):
            batches = self.data_adapter.get_numpy_iterator()
            if not self._grouped_in_tf:
                batches = _stack_groups(batches, self.steps_per_execution)
            return prefetch_to_devices(batches, keras.distribution.distribution())

    return SuperBatchEpochIterator


def _stack_groups(batches, k: int):
    group = []
    for batch in batches:
        group.append(batch)
        if len(group) == k:
            yield _stack(group)
            group = []
    if group:
        yield _stack(group)


def _stack(group):
    return keras.tree.map_structure(
        lambda *leaves: None if leaves[0] is None else np.stack(leaves), *group, none_is_leaf=True
    )


def prefetch_to_devices(batches, distribution, depth: int = PREFETCH_DEPTH):
    """Yields the numpy super-batches of `batches` as `SuperBatch`es of device arrays,
    `depth - 1` ahead.

    Each process passes its own rows (its share of every step's batch);
    `jax.make_array_from_process_local_data` assembles the global arrays."""
    shardings = None

    def put(leaf, sharding):
        if leaf is None:
            return None
        if sharding is None:
            return jax.device_put(leaf)
        return jax.make_array_from_process_local_data(sharding, leaf)

    queue = collections.deque()
    for batch in batches:
        if shardings is None:
            shardings = keras.tree.map_structure(
                lambda leaf: (
                    None
                    if leaf is None or distribution is None
                    else super_batch_sharding(distribution, leaf.shape)
                ),
                batch,
                none_is_leaf=True,
            )
        # device_put returns at once: the transfer runs while the current step computes.
        queue.append(SuperBatch(keras.tree.map_structure(put, batch, shardings, none_is_leaf=True)))
        if len(queue) >= depth:
            yield queue.popleft()
    while queue:
        yield queue.popleft()
