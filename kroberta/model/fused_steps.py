"""K training or evaluation steps as one compiled program, inside Keras `fit` and `evaluate`.

Keras 3.15 on JAX runs `steps_per_execution = K` as a Python loop over a one-step
jitted program (keras/src/backend/jax/trainer.py, `_make_function`): K dispatches,
K host-to-device transfers, each made only when its step needs it. Keras after
3.15 fuses the K steps (PR #23527: `jax.lax.scan` over a super-batch); this module
does the same for the installed Keras, on one model instance (`install`):

- the data iterator yields super-batches, every leaf (K, batch, ...): a tf.data
  dataset of (x, y) batches is batched by K inside tf.data (one Python-level
  `next` per dispatch), any other input is stacked on the host;
- `train_function` / `test_function` run `jax.lax.scan` of Keras' own
  `train_step` / `test_step` over the K leading slices: one program, one
  dispatch, the state (weights, optimizer, metrics) carried on the devices;
  the metrics accumulate over all K steps, exactly as K separate steps would;
- super-batches go to the devices ahead of use (`PREFETCH_DEPTH`): while one
  computes, the next is already transferred, sharded as the step expects
  (batch axis second) under any Keras distribution and across processes.

A last group with fewer than K batches (a finite dataset, `fit(...)` whose last
epoch is cut short) is scanned at its own length: one more compilation, once.
Callbacks see what Keras shows them for steps_per_execution = K: one
`on_train_batch_begin/end` per dispatch, with step numbers counting single steps.
"""

import collections
import contextlib
import types

import jax
import numpy as np
import tensorflow as tf
from keras.src import tree
from keras.src.backend.jax import trainer as jax_trainer
from keras.src.distribution import distribution_lib

PREFETCH_DEPTH = 2  # super-batches on the devices: the one computing and the next


def install(model):
    """Makes `model.fit` and `model.evaluate` run `model.steps_per_execution` steps per dispatch.

    The model's class, config and weights are untouched (it saves and loads as
    before); only this instance's trainer methods change. Returns the model.
    """
    if model.__dict__.get("_kroberta_fused"):
        return model
    originals = {"fit": model.fit, "evaluate": model.evaluate,
                 "_symbolic_build": model._symbolic_build}
    methods = {
        "make_train_function": _make_train_function,
        "make_test_function": _make_test_function,
        "fit": _fused_call(originals["fit"], "fit"),
        "evaluate": _fused_call(originals["evaluate"], "evaluate"),
        "_symbolic_build": _symbolic_build(originals["_symbolic_build"]),
    }
    for name, function in methods.items():
        object.__setattr__(model, name, types.MethodType(function, model))
    model.__dict__["_kroberta_fused"] = True
    return model


def trace_count(model, kind: str) -> int:
    """How often the fused `kind` ("train" or "test") program of `model` was traced."""
    return model.__dict__.get("_kroberta_fused_traces", {}).get(kind, 0)


def scan_steps(model, step, kind: str):
    """`step(state, batch) -> (logs, state)` made into `(state, super_batch) -> (logs, state)`:
    a `lax.scan` over the super-batch's leading axis (K). The logs are the last step's
    (Keras' metrics results, which cover all K steps)."""
    def run(state, super_batch):
        traces = model.__dict__.setdefault("_kroberta_fused_traces", {})
        traces[kind] = traces.get(kind, 0) + 1  # runs once per trace, not per call

        def body(carry, batch):
            logs, carry = step(carry, batch)
            return carry, logs

        state, logs = jax.lax.scan(body, state, super_batch)
        return jax.tree.map(lambda v: v[-1], logs), state

    return run


def train_program(model):
    """The jitted K-step training program `(state, super_batch) -> (logs, state)`,
    donating its state, with the state's shardings as `make_train_function` has them."""
    out_shardings = None
    if distribution_lib.distribution() is not None:
        out_shardings = (None, model._get_state_sharding_spec())
    return jax.jit(scan_steps(model, model.train_step, "train"), donate_argnums=0,
                   out_shardings=out_shardings)


class SuperBatch:
    """What the super-batch iterator yields: `data`, every leaf (K, batch, ...), on the
    devices. Anything else reaching a train/test function (`train_on_batch`'s single
    batch) runs as one step."""

    __slots__ = ("data",)

    def __init__(self, data):
        self.data = data


def _dispatcher(fused, single):
    def function(state, iterator):
        data = next(iterator)
        if isinstance(data, SuperBatch):
            return fused(state, data.data)  # K steps, one dispatch
        return single(state, data)

    return function


def _make_train_function(self, force=False):
    if self.train_function is not None and not force:
        return
    out_shardings = None
    if distribution_lib.distribution() is not None:
        out_shardings = (None, self._get_state_sharding_spec())
    single = jax.jit(self.train_step, donate_argnums=0, out_shardings=out_shardings)
    self.train_function = _dispatcher(train_program(self), single)


def _make_test_function(self, force=False):
    if self.test_function is not None and not force:
        return
    out_shardings = None
    if distribution_lib.distribution() is not None:
        trainable, non_trainable, _, metrics = self._get_state_sharding_spec()
        out_shardings = (None, (trainable, non_trainable, metrics))
    fused = jax.jit(scan_steps(self, self.test_step, "test"), donate_argnums=0,
                    out_shardings=out_shardings)
    single = jax.jit(self.test_step, donate_argnums=0, out_shardings=out_shardings)
    self.test_function = _dispatcher(fused, single)


def _fused_call(original, name):
    """`fit` or `evaluate` with Keras' epoch iterator replaced by the super-batch one."""
    def call(self, *args, **kwargs):
        k = self.steps_per_execution
        steps = kwargs.get("steps_per_epoch")
        if name == "fit" and steps and steps % k and kwargs.get("epochs", 1) > 1:
            # Every epoch but the first would start in the middle of a super-batch.
            raise ValueError(f"fit: steps_per_epoch={steps} is not a multiple of "
                             f"steps_per_execution={k} (the steps fused into one dispatch)")
        with _super_batch_epoch_iterator():
            return original(*args, **kwargs)

    call.__name__ = name
    return call


def _symbolic_build(original):
    """Keras builds metrics and losses from one peeked batch: give it a single step's
    batch, not a super-batch (whose leading axis is K)."""
    def build(self, iterator=None, data_batch=None):
        if data_batch is None and isinstance(iterator, SuperBatchEpochIterator):
            return original(data_batch=iterator.single_batch())
        return original(iterator=iterator, data_batch=data_batch)

    return build


@contextlib.contextmanager
def _super_batch_epoch_iterator():
    # Keras' fit/evaluate construct `JAXEpochIterator` by its module-level name.
    saved = jax_trainer.JAXEpochIterator
    jax_trainer.JAXEpochIterator = SuperBatchEpochIterator
    try:
        yield
    finally:
        jax_trainer.JAXEpochIterator = saved


def super_batched(dataset: tf.data.Dataset, k: int) -> tf.data.Dataset:
    """(x, y) batches -> super-batches of K (a shorter last one), cardinality hidden.

    Keras counts steps in single batches (steps_per_epoch, or the flat dataset's
    size passed as steps); a known cardinality of super-batches would be read as a
    count of single batches, so it is hidden."""
    grouped = dataset.batch(k, drop_remainder=False)
    return grouped.filter(lambda *_: True).prefetch(tf.data.AUTOTUNE)


def _flat_size(dataset: tf.data.Dataset) -> int | None:
    size = int(dataset.cardinality())
    return size if size >= 0 else None


class SuperBatchEpochIterator(jax_trainer.JAXEpochIterator):
    """Keras' JAX epoch iterator, yielding device super-batches (K, batch, ...) ahead of use."""

    def __init__(self, x, y=None, sample_weight=None, batch_size=None, steps_per_epoch=None,
                 shuffle=False, class_weight=None, steps_per_execution=1):
        self._single = None
        self._flat_batches = None
        self._grouped_in_tf = isinstance(x, tf.data.Dataset) and class_weight is None
        if self._grouped_in_tf:
            self._single = x.element_spec
            self._flat_batches = _flat_size(x)
            x = super_batched(x, steps_per_execution)
        super().__init__(x, y=y, sample_weight=sample_weight, batch_size=batch_size,
                         steps_per_epoch=steps_per_epoch, shuffle=shuffle,
                         class_weight=class_weight, steps_per_execution=steps_per_execution)
        self._count_single_batches()

    def _count_single_batches(self):
        # Keras counts an epoch in single batches; the adapter sees super-batches
        # (and their hidden cardinality), so the count comes from the flat dataset.
        if self._grouped_in_tf:
            self._num_batches = self._flat_batches

    def reset(self):
        super().reset()
        self._count_single_batches()

    def single_batch(self):
        """One step's batch (zeros of the right shapes and dtypes, or the first batch)."""
        if self._grouped_in_tf:
            return tree.map_structure(
                lambda s: np.zeros([d or 1 for d in s.shape], s.dtype.as_numpy_dtype),
                self._single)
        return next(iter(self.data_adapter.get_numpy_iterator()))

    def _get_iterator(self):
        batches = self.data_adapter.get_numpy_iterator()
        if not self._grouped_in_tf:
            batches = _stack_groups(batches, self.steps_per_execution)
        return prefetch_to_devices(batches, distribution_lib.distribution())


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
    return tree.map_structure(lambda *leaves: None if leaves[0] is None else np.stack(leaves),
                              *group, none_is_leaf=True)


def super_batch_sharding(distribution, shape):
    """Where a (K, batch, ...) leaf goes: the distribution's layout of one step's
    (batch, ...) array, with the K axis unsplit in front."""
    layout = distribution.get_data_layout(tuple(shape[1:])).backend_layout
    spec = jax.sharding.PartitionSpec(None, *layout.spec)
    return jax.sharding.NamedSharding(layout.mesh, spec)


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
            shardings = tree.map_structure(
                lambda leaf: None if leaf is None or distribution is None
                else super_batch_sharding(distribution, leaf.shape), batch, none_is_leaf=True)
        # device_put returns at once: the transfer runs while the current step computes.
        queue.append(SuperBatch(tree.map_structure(put, batch, shardings, none_is_leaf=True)))
        if len(queue) >= depth:
            yield queue.popleft()
    while queue:
        yield queue.popleft()
