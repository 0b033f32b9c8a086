"""Masking in numpy, for data made once: static labels (`prepare --labels static`,
synthetic files) and the prediction slots of arrays given to `predict`.

These are the numpy twins of `kroberta.data.masking` (tested against it where the
two do the same thing).

Static masking follows BERT's recipe in the Hugging Face label convention: each
real, non-special token is chosen with probability `mask_rate`; a chosen token's
label is its original id (-100 elsewhere) and its input becomes `<mask>` (80%), a
random non-special id (10%) or stays itself (10%). The core's dynamic masking does the same in tf.data;
static labels exist for pipelines that expect them on disk (the seed's format).
"""

import numpy as np

from kroberta.data.records import IGNORE_LABEL


def static_mask(input_ids, attention_mask, rng, mask_rate, mask_id, special_ids, vocabulary_size):
    """Choose and corrupt positions of a batch of packed sequences.

    Args:
        input_ids: (n, seq_len) int array of original ids.
        attention_mask: (n, seq_len) 0/1 array; padding is never chosen.
        rng: a `numpy.random.Generator` (the caller seeds it: determinism).
        mask_rate: probability that a real, non-special token is chosen.
        mask_id: id of `<mask>`.
        special_ids: ids never chosen and never drawn as random replacements.
        vocabulary_size: random replacements are drawn from [0, vocabulary_size).

    Returns:
        (corrupted_ids, labels): two (n, seq_len) int64 arrays.
    """
    ids = np.asarray(input_ids, dtype=np.int64)
    specials = np.asarray(sorted(special_ids), dtype=np.int64)
    candidates = (np.asarray(attention_mask) == 1) & ~np.isin(ids, specials)
    chosen = candidates & (rng.random(ids.shape) < mask_rate)  # (n, seq_len)
    labels = np.where(chosen, ids, IGNORE_LABEL)
    action = rng.random(ids.shape)  # < 0.8: <mask>; < 0.9: random id; else keep
    allowed = np.setdiff1d(np.arange(vocabulary_size, dtype=np.int64), specials)
    random_ids = allowed[rng.integers(0, len(allowed), size=ids.shape)]
    corrupted = np.where(chosen & (action < 0.8), mask_id, ids)
    corrupted = np.where(chosen & (action >= 0.8) & (action < 0.9), random_ids, corrupted)
    return corrupted, labels


def static_slots_numpy(marks: np.ndarray, slots: int):
    """`masking.static_slots` over a batch: marks (n, L), -100 = not predicted.

    Returns positions (n, M) int32 (the earliest marked positions, 0 in unused
    slots), slot_marks (n, M) int32 (-100 in unused slots) and dropped (n,) int32.
    """
    rows, length = marks.shape
    marked = marks != IGNORE_LABEL
    count = marked.sum(1)
    # Marked positions first, each group in position order.
    order = np.argsort(~marked, axis=1, kind="stable")  # (n, L)
    if slots > length:
        order = np.pad(order, ((0, 0), (0, slots - length)))
    valid = np.arange(slots) < np.minimum(count, slots)[:, None]  # (n, M)
    where = np.where(valid, order[:, :slots], 0).astype(np.int32)
    slot_marks = np.where(valid, np.take_along_axis(marks, where, axis=1), IGNORE_LABEL)
    return where, slot_marks.astype(np.int32), np.maximum(count - slots, 0).astype(np.int32)
