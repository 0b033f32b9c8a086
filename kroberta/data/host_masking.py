"""`kroberta.masking` inside tf.data: the JAX masking run on the host CPU from a map.

The training step finishes most batches on the device; these ops finish them in the
input pipeline instead, with the same functions (`tf.numpy_function` into a jitted
CPU program): `kroberta.dataset(..., masks_on_host=True)`, evaluation at its own mask
rate, the element keys the step's masks are drawn from, and prediction's slots.
"""

import tensorflow as tf

from kroberta import masking
from kroberta.data.records import IGNORE_LABEL


def element_keys(seed: int, indices):
    """(B,) uint32 keys of the elements at `indices` (B,) int64 (`masking.element_keys`)."""
    keys = tf.numpy_function(lambda i: masking.element_keys(seed, i), [indices], tf.uint32,
                             stateful=False)
    keys.set_shape(indices.shape)
    return keys


def finished(x, mask, slots: int):
    """(x, labels) of a batch of step inputs `x` (a dict of (B, ...) tensors) finished by
    `mask` (`masking.masker(...)`, M = `slots`) on the host: {token_ids (B, L),
    padding_mask (B, L), mask_positions (B, M)} and labels (B, M), int32."""
    names = sorted(x)
    run = masking.host_function(lambda *values: mask(dict(zip(names, values))))

    def finish(*values):
        out, labels = run(*values)
        return out["token_ids"], out["padding_mask"], out["mask_positions"], labels

    ids, padding, positions, labels = tf.numpy_function(
        finish, [x[n] for n in names], [tf.int32, x["padding_mask"].dtype, tf.int32, tf.int32],
        stateful=False)
    rows = x["token_ids"].shape[0]
    ids.set_shape(x["token_ids"].shape)
    padding.set_shape(x["padding_mask"].shape)
    positions.set_shape([rows, slots])
    labels.set_shape([rows, slots])
    return {"token_ids": ids, "padding_mask": padding, "mask_positions": positions}, labels


def static_slots(marks, slots: int):
    """(positions (B, M), slot_marks (B, M), dropped (B,)) int32 from marks (B, L) (-100 =
    not predicted): `masking.first_labelled_slots`, and how many marked positions did not
    fit the M slots (they are not predicted)."""
    run = masking.host_function(lambda labels: masking.first_labelled_slots(labels, slots))
    positions, slot_marks = tf.numpy_function(run, [tf.cast(marks, tf.int32)],
                                              [tf.int32, tf.int32], stateful=False)
    positions.set_shape([marks.shape[0], slots])
    slot_marks.set_shape([marks.shape[0], slots])
    count = tf.reduce_sum(tf.cast(marks != IGNORE_LABEL, tf.int32), axis=1)  # (B,)
    return positions, slot_marks, tf.maximum(count - slots, 0)
