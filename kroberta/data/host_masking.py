"""`kroberta.masking` inside tf.data: the JAX masking run on the host CPU from a map.

The training step finishes most batches on the device; these ops finish them in the
input pipeline instead, with the same functions (`tf.numpy_function` into a jitted
CPU program): `kroberta.dataset(..., masks_on_host=True)` and the training and
evaluation pipelines built without device masks. (Prediction chooses its slots in its
own program, `kroberta.model.predict_program`.) The element keys the step's masks are drawn from are
hashed here with TF's own integer ops (`element_keys`: the same hash function).

The jitted programs are kept for the process (a new dataset reuses them), and rows are
padded to a power of two, so a pipeline compiles a handful of shapes, once.
"""

import atexit
import functools

import numpy as np
import tensorflow as tf

from kroberta import counter_hash, masking

# Not empty once the interpreter exits, before JAX shuts its backends down (atexit runs
# in reverse order, and this module registers after JAX's): a map still running then
# must not call JAX, or the thread that tears the pipeline down waits for it forever.
_exiting = []
atexit.register(_exiting.append, True)


def _words(value):
    """int64 -> (low, high) uint32 words."""
    value = tf.cast(value, tf.int64)
    low = tf.cast(tf.bitwise.bitwise_and(value, 0xFFFFFFFF), tf.uint32)
    high = tf.cast(tf.bitwise.bitwise_and(tf.bitwise.right_shift(value, 32), 0xFFFFFFFF), tf.uint32)
    return low, high


def element_keys(seed: int, indices):
    """(B,) uint32 keys of the elements at `indices` (B,) int64: `masking.element_keys`,
    the same hash (`counter_hash.keys_of_words`) in TF's integer ops, so the training
    pipeline runs no JAX in its threads."""
    return counter_hash.keys_of_words(
        *_words(seed),
        *_words(indices),
        xor=tf.bitwise.bitwise_xor,
        shift_right=tf.bitwise.right_shift,
        uint32=lambda value: tf.constant(value, tf.uint32),
    )


@functools.cache
def _finisher(data, vocabulary_size: int, word_starts, names: tuple):
    """The host function of `finished` for one run's settings (word_starts: bytes or None)."""
    if word_starts is not None:
        word_starts = np.frombuffer(word_starts, bool)
    mask = masking.masker(data, vocabulary_size, word_starts)

    def finish(*values):
        out, labels = mask(dict(zip(names, values)))
        return out["token_ids"], out["padding_mask"], out["mask_positions"], labels

    run = masking.host_function(finish)

    def on_padded_rows(*values):
        # Rows padded with zeros to a power of two (a zero row is an element without
        # real tokens or labels), the outputs cut back to the n rows.
        if _exiting:
            raise RuntimeError("the interpreter is exiting")
        n = len(values[0])
        rows = max(8, 1 << (n - 1).bit_length())
        out = run(*(np.pad(v, [(0, rows - n)] + [(0, 0)] * (v.ndim - 1)) for v in values))
        return tuple(o[:n] for o in out)

    return on_padded_rows


def finished(x, data, vocabulary_size: int, word_starts=None):
    """(x, labels) of a batch of step inputs `x` (a dict of (B, ...) tensors) finished on
    the host by `masking.masker(data, vocabulary_size, word_starts)`: {token_ids (B, L),
    padding_mask (B, L), mask_positions (B, M)} and labels (B, M), int32."""
    names = tuple(sorted(x))
    table = None if word_starts is None else np.asarray(word_starts, bool).tobytes()
    run = _finisher(data, int(vocabulary_size), table, names)
    ids, padding, positions, labels = tf.numpy_function(
        run,
        [x[n] for n in names],
        [tf.int32, x["padding_mask"].dtype, tf.int32, tf.int32],
        stateful=False,
    )
    rows, length = x["token_ids"].shape
    slots = None if length is None else data.prediction_slots(length)
    ids.set_shape(x["token_ids"].shape)
    padding.set_shape(x["padding_mask"].shape)
    positions.set_shape([rows, slots])
    labels.set_shape([rows, slots])
    return {"token_ids": ids, "padding_mask": padding, "mask_positions": positions}, labels
