"""Choosing the positions to predict: dynamic (RoBERTa) masking and static labels.

Both are pure TensorFlow functions of one sequence, usable eagerly and inside
`tf.data.Dataset.map`. Each returns a fixed number of prediction slots M so the
model's head always sees the same static shape:

    input_ids  (L,) int32   the tokens the model reads (with <mask> where chosen)
    positions  (M,) int32   where to predict; unused slots hold 0
    labels     (M,) int32   the original token there; -100 in unused slots
"""

import tensorflow as tf

IGNORE_LABEL = -100


def _sub_seed(seed, salt):
    # Independent random streams from one (2,) seed, so every draw below is a
    # pure function of (seed, salt).
    return tf.random.experimental.stateless_fold_in(seed, salt)


def dynamic_mask(
    input_ids,
    attention_mask,
    seed,
    *,
    mask_rate,
    slots,
    mask_token_id,
    special_token_ids,
    vocabulary_size,
    mask_fraction=0.8,
    random_fraction=0.1,
):
    """RoBERTa masking of one sequence, reproducible from `seed`.

    Chooses round(mask_rate * n) of the n real, non-special tokens (at least one
    when n > 0, at most `slots`); of those, `mask_fraction` become <mask>,
    `random_fraction` a random non-special token, and the rest stay as they are.

    Args:
        input_ids: int (L,) original tokens.
        attention_mask: int (L,) 1 for real tokens, 0 for padding.
        seed: int (2,) stateless random seed, e.g. (run seed, example index).
        mask_rate: fraction of candidate tokens to predict.
        slots: M, the static number of prediction slots.
        mask_token_id: id written at masked positions.
        special_token_ids: ids that are never chosen (<s>, <pad>, </s>, ...).
        vocabulary_size: random replacements are drawn from the ids above the
            largest special id and below this.

    Returns:
        (masked_ids (L,), positions (M,), labels (M,)), all int32.
    """
    input_ids = tf.cast(input_ids, tf.int32)
    length = tf.shape(input_ids)[0]
    special = tf.constant(list(special_token_ids), tf.int32)
    is_special = tf.reduce_any(input_ids[:, None] == special[None, :], axis=1)
    candidates = tf.logical_and(tf.cast(attention_mask, tf.bool), tf.logical_not(is_special))
    num_candidates = tf.reduce_sum(tf.cast(candidates, tf.int32))
    wanted = tf.cast(tf.round(mask_rate * tf.cast(num_candidates, tf.float32)), tf.int32)
    wanted = tf.where(tf.logical_and(num_candidates > 0, mask_rate > 0), tf.maximum(wanted, 1), 0)
    count = tf.minimum(tf.minimum(wanted, num_candidates), slots)

    # A random score per position; non-candidates score -1 so top_k takes them last.
    scores = tf.random.stateless_uniform([length], _sub_seed(seed, 0))
    scores = tf.where(candidates, scores, -1.0)
    # Pad so top_k works when slots > length.
    scores = tf.pad(scores, [[0, tf.maximum(slots - length, 0)]], constant_values=-2.0)
    _, chosen = tf.math.top_k(scores, k=slots)  # (M,)
    valid = tf.range(slots) < count  # (M,)
    positions = tf.where(valid, chosen, 0)
    originals = tf.gather(input_ids, positions)
    labels = tf.where(valid, originals, IGNORE_LABEL)

    draw = tf.random.stateless_uniform([slots], _sub_seed(seed, 1))
    lowest_regular_id = max(special_token_ids) + 1 if special_token_ids else 0
    random_ids = tf.random.stateless_uniform(
        [slots], _sub_seed(seed, 2), minval=lowest_regular_id, maxval=vocabulary_size, dtype=tf.int32
    )
    replacement = tf.where(
        draw < mask_fraction,
        mask_token_id,
        tf.where(draw < mask_fraction + random_fraction, random_ids, originals),
    )
    masked_ids = tf.tensor_scatter_nd_update(
        input_ids,
        tf.boolean_mask(positions, valid)[:, None],
        tf.boolean_mask(replacement, valid),
    )
    return masked_ids, tf.cast(positions, tf.int32), tf.cast(labels, tf.int32)


def static_slots(labels, slots):
    """Prediction slots from a file's labels (-100 = no loss), earliest positions first.

    Args:
        labels: int (L,) the file's labels.
        slots: M.

    Returns:
        (positions (M,), slot_labels (M,), dropped ()) where `dropped` counts the
        labelled positions beyond the first M (they are not predicted).
    """
    labels = tf.cast(labels, tf.int32)
    length = tf.shape(labels)[0]
    labelled = labels != IGNORE_LABEL
    count = tf.reduce_sum(tf.cast(labelled, tf.int32))
    # Earlier positions score higher; unlabelled ones lowest.
    order = tf.cast(length - tf.range(length), tf.float32)
    scores = tf.where(labelled, order, -1.0)
    scores = tf.pad(scores, [[0, tf.maximum(slots - length, 0)]], constant_values=-2.0)
    _, chosen = tf.math.top_k(scores, k=slots)
    valid = tf.range(slots) < tf.minimum(count, slots)
    positions = tf.where(valid, chosen, 0)
    padded_labels = tf.pad(labels, [[0, tf.maximum(slots - length, 0)]], constant_values=IGNORE_LABEL)
    slot_labels = tf.where(valid, tf.gather(padded_labels, positions), IGNORE_LABEL)
    return tf.cast(positions, tf.int32), slot_labels, tf.maximum(count - slots, 0)
