"""Choosing the positions to predict: dynamic (RoBERTa) masking and static labels.

Pure TensorFlow functions of a batch, usable eagerly and inside
`tf.data.Dataset.map` after `batch`. Each returns a fixed number of prediction
slots M so the model's head always sees the same static shape:

    input_ids  (B, L) int32   the tokens the model reads (with <mask> where chosen)
    positions  (B, M) int32   where to predict; unused slots hold 0
    labels     (B, M) int32   the original token there; -100 in unused slots

Dynamic masks are a pure function of (run seed, element index, position): the
random numbers come from a counter-based hash in TF integer ops, not from a
stateful or per-tensor generator, so an example gets the same mask whether it is
masked alone, in a batch of 8 or of 64, in one process or in one of several.
The training step draws the same bits on the device from `element_keys`
(`kroberta.model.device_masking`); these functions are the pipeline's masks (whole
words, `masks_on_host=True`) and the reference the device's are tested against.
"""

import typing

import tensorflow as tf

from kroberta.data.records import IGNORE_LABEL
from kroberta.mask_hash import (GOLDEN, MIX_A, MIX_B, SALT_ACTION, SALT_RANDOM_ID, SALT_SCORE,
                                 SCORE_BITS, random_id_range)

# Choosing a row's highest scores sorts only the scores in one of 2^6 buckets...
_SELECTION_BUCKET_BITS = 6
# ... except where top_k of the row is cheaper: rows this short, or this few slots
# (top_k's cost grows with both; one thread, batch 64: docs/design.md, "The input pipeline").
_TOP_K_UP_TO_POSITIONS, _TOP_K_UP_TO_SLOTS = 128, 24


def _u32(value):
    return tf.constant(value, tf.uint32)


def _mix(x):
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u32(16)))
    x = x * _u32(MIX_A)
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u32(15)))
    x = x * _u32(MIX_B)
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u32(16)))


def _words(value):
    """int64 -> (low, high) uint32 words."""
    value = tf.cast(value, tf.int64)
    low = tf.cast(tf.bitwise.bitwise_and(value, 0xFFFFFFFF), tf.uint32)
    high = tf.cast(tf.bitwise.bitwise_and(tf.bitwise.right_shift(value, 32), 0xFFFFFFFF), tf.uint32)
    return low, high


def element_keys(seed, indices):
    """One uint32 key per element from the run seed (scalar) and element indices (B,)."""
    seed_low, seed_high = _words(seed)
    index_low, index_high = _words(indices)
    key = _mix(tf.bitwise.bitwise_xor(seed_low, _u32(GOLDEN)))
    key = _mix(tf.bitwise.bitwise_xor(key, seed_high))
    key = _mix(tf.bitwise.bitwise_xor(key, index_low))
    return _mix(tf.bitwise.bitwise_xor(key, index_high))  # (B,)


def hash_bits(keys, salt: int, count: int):
    """(B, count) int32 in [0, 2^24): element key x salt x counter, hashed (the top 24 bits)."""
    salted = _mix(tf.bitwise.bitwise_xor(keys, _u32(salt * MIX_B & 0xFFFFFFFF)))  # (B,)
    counter = tf.cast(tf.range(count), tf.uint32)  # (count,)
    bits = _mix(salted[:, None] + counter[None, :])  # (B, count)
    return tf.cast(tf.bitwise.right_shift(bits, _u32(32 - SCORE_BITS)), tf.int32)


def hash_uniform(keys, salt: int, count: int):
    """(B, count) float32 uniforms in [0, 1): `hash_bits` / 2^24.

    24 bits are exactly representable in float32, so a uniform never rounds up to 1.0.
    """
    return tf.cast(hash_bits(keys, salt, count), tf.float32) * (1.0 / (1 << SCORE_BITS))


def _is_special(ids, special_token_ids):
    specials = sorted(set(special_token_ids))
    if not specials:
        return tf.zeros_like(ids, tf.bool)
    if specials == list(range(specials[0], specials[-1] + 1)):
        # The usual case (<s> <pad> </s> <unk> <mask> = 0..4): two comparisons, not one per id.
        return (ids >= specials[0]) & (ids <= specials[-1])
    special = tf.constant(specials, ids.dtype)
    return tf.reduce_any(ids[..., None] == special, axis=-1)


def dynamic_mask_batch(
    input_ids,
    attention_mask,
    seed,
    indices,
    *,
    mask_rate,
    slots,
    mask_token_id,
    special_token_ids,
    vocabulary_size,
    mask_fraction=0.8,
    random_fraction=0.1,
    word_starts=None,
):
    """RoBERTa masking of a batch, each row reproducible from (seed, its index).

    Chooses round(mask_rate * n) of a row's n real, non-special tokens (at least
    one when n > 0, at most `slots`); of those, `mask_fraction` become <mask>,
    `random_fraction` a random non-special token, and the rest stay as they are.

    With `word_starts`, whole words are chosen: all the tokens of a word or none
    (the 80/10/10 split stays per token). Words are taken in a random order while
    they fit the budget: a word counts when at least half of it lies within
    round(mask_rate * n) tokens, and the first word always counts, so the rate is
    kept on average; a word that does not fit the `slots` is never split.

    Args:
        input_ids: int (B, L) original tokens.
        attention_mask: int (B, L) 1 for real tokens, 0 for padding.
        seed: int scalar, the run's seed.
        indices: int (B,) each row's element index in its stream.
        mask_rate: fraction of candidate tokens to predict.
        slots: M, the static number of prediction slots.
        mask_token_id: id written at masked positions.
        special_token_ids: ids that are never chosen (<s>, <pad>, </s>, ...).
        vocabulary_size: random replacements are drawn from the ids above the
            largest special id and below this.
        word_starts: None, or a bool (vocabulary_size,) table: True for the ids
            that begin a word (byte-level BPE: a leading space marker). A token
            also begins a word after a special token or padding.

    Returns:
        (masked_ids (B, L), positions (B, M), labels (B, M)), all int32. The
        chosen positions fill the first slots in position order (whole words: in
        the order the words were taken); unused slots hold position 0, label -100.
    """
    input_ids = tf.cast(input_ids, tf.int32)
    length = tf.shape(input_ids)[1]
    is_special = _is_special(input_ids, special_token_ids)  # (B, L)
    candidates = tf.cast(attention_mask, tf.bool) & ~is_special  # (B, L)
    num_candidates = tf.reduce_sum(tf.cast(candidates, tf.int32), axis=1)  # (B,)
    wanted = tf.cast(tf.round(mask_rate * tf.cast(num_candidates, tf.float32)), tf.int32)
    wanted = tf.where((num_candidates > 0) & (mask_rate > 0), tf.maximum(wanted, 1), 0)
    count = tf.minimum(tf.minimum(wanted, num_candidates), slots)  # (B,)

    keys = element_keys(seed, indices)
    if word_starts is None:
        # The `count` candidates of highest random score.
        positions, valid = _chosen_slots(hash_bits(keys, SALT_SCORE, length), candidates, count,
                                         slots)  # (B, M) each
    else:
        positions, valid = _whole_word_slots(input_ids, candidates, count, keys, word_starts, slots)
    originals = tf.gather(input_ids, positions, batch_dims=1)  # (B, M)
    labels = tf.where(valid, originals, IGNORE_LABEL)

    draw = hash_uniform(keys, SALT_ACTION, slots)  # (B, M)
    lowest_regular_id, span = random_id_range(special_token_ids, vocabulary_size)
    random_ids = lowest_regular_id + tf.minimum(
        tf.cast(hash_uniform(keys, SALT_RANDOM_ID, slots) * span, tf.int32), span - 1)
    replacement = tf.where(
        draw < mask_fraction,
        mask_token_id,
        tf.where(draw < mask_fraction + random_fraction, random_ids, originals),
    )
    rows = tf.broadcast_to(tf.range(tf.shape(input_ids)[0])[:, None], tf.shape(positions))
    where = tf.stack([rows, positions], axis=-1)  # (B, M, 2)
    masked_ids = tf.tensor_scatter_nd_update(
        input_ids, tf.boolean_mask(where, valid), tf.boolean_mask(replacement, valid))
    return masked_ids, tf.cast(positions, tf.int32), tf.cast(labels, tf.int32)


def _chosen_slots(scores, candidates, count, slots, by_top_k=None):
    """(positions (B, M), valid (B, M)): each row's `count` candidates of highest
    score, ties to the lower position, in position order; unused slots hold position 0.

    Two ways to the same result: `top_k` of the rows when they or the slots are few,
    else `_highest_scoring` (by_top_k: None picks by the static length and M).
    scores: (B, L) int32 in [0, 2^24); candidates: (B, L) bool; count: (B,) int32 <= M,
    at most each row's number of candidates.
    """
    if by_top_k is None:
        by_top_k = slots <= _TOP_K_UP_TO_SLOTS or (
            scores.shape[1] is not None and scores.shape[1] <= _TOP_K_UP_TO_POSITIONS)
    if not by_top_k:
        return _first_slots(_highest_scoring(scores, candidates, count), count, slots)
    chosen, _ = _top_candidates(scores, candidates, slots)  # (B, M) highest score first
    valid = tf.range(slots)[None, :] < count[:, None]  # (B, M)
    # Into position order, unused slots last: a top_k of the M slots, not of the L positions.
    unused = tf.shape(scores)[1] + slots  # after every position
    _, order = tf.math.top_k(-tf.where(valid, chosen, unused), k=slots)
    return tf.where(valid, tf.gather(chosen, order, batch_dims=1), 0), valid


def _top_candidates(scores, candidates, slots):
    """(chosen (B, M), padding): `top_k` positions of the candidates' scores (B, L),
    the other positions after them, ties in position order; `padding` widens the rows
    to M when M > L (top_k needs k <= width)."""
    ranked = tf.where(candidates, scores, tf.cast(-1, scores.dtype))  # (B, L)
    padding = [[0, 0], [0, tf.maximum(slots - tf.shape(scores)[1], 0)]]
    ranked = tf.pad(ranked, padding, constant_values=tf.cast(-2, scores.dtype))
    _, chosen = tf.math.top_k(ranked, k=slots)
    return chosen, padding


def _highest_scoring(scores, candidates, count):
    """(B, L) bool: each row's `count` candidates of highest score, ties to the lower position.

    Exactly what `top_k` of the scores would choose, without sorting every row (top_k's
    CPU cost grows with the row and the slots: docs/design.md, "The input pipeline"). A
    histogram of the scores' top bits finds the bucket where a row's count runs out;
    the candidates above it are all chosen, and only those inside it (~L/64) are sorted.

    scores: (B, L) int32 in [0, 2^24); candidates: (B, L) bool; count: (B,) int32, at
    most each row's number of candidates.
    """
    rows, buckets = tf.shape(scores)[0], 1 << _SELECTION_BUCKET_BITS
    # A candidate's bucket: its score's top bits, in [0, K); K for the other positions.
    bucket = tf.where(candidates, tf.bitwise.right_shift(scores, SCORE_BITS - _SELECTION_BUCKET_BITS),
                      buckets)  # (B, L)
    # One bincount for the batch: row b counts into b * (K + 1) ... b * (K + 1) + K.
    cells = rows * (buckets + 1)
    histogram = tf.math.bincount(tf.reshape(bucket + (buckets + 1) * tf.range(rows)[:, None], [-1]),
                                 minlength=cells, maxlength=cells)
    histogram = tf.reshape(histogram, [rows, buckets + 1])[:, :buckets]  # (B, K)
    at_or_above = tf.cumsum(histogram, axis=1, reverse=True)  # (B, K) candidates in buckets >= k
    # The highest bucket that, with those above it, holds `count`; K - 1 when count = 0.
    boundary = tf.reduce_sum(tf.cast(at_or_above >= count[:, None], tf.int32), axis=1) - 1  # (B,)
    need = count - tf.gather(at_or_above - histogram, boundary, batch_dims=1)  # (B,) from inside it
    sure = candidates & (bucket > boundary[:, None])  # (B, L)
    # The boundary buckets' candidates (N, 2), row-major, sorted row by row, highest
    # score first; the sort is stable, so ties keep position order.
    inside = tf.cast(tf.where(candidates & (bucket == boundary[:, None])), tf.int32)  # (N, 2)
    row = inside[:, 0]
    descending = tf.cast((1 << SCORE_BITS) - 1 - tf.gather_nd(scores, inside), tf.int64)
    order = tf.argsort(tf.cast(row, tf.int64) * (1 << SCORE_BITS) + descending, stable=True)
    sorted_row = tf.gather(row, order)  # (N,)
    row_start = tf.cumsum(tf.math.bincount(row, minlength=rows, maxlength=rows), exclusive=True)
    rank = tf.range(tf.size(row)) - tf.gather(row_start, sorted_row)  # (N,) place within its row
    taken = tf.boolean_mask(tf.gather(inside, order), rank < tf.gather(need, sorted_row))
    return sure | tf.scatter_nd(taken, tf.ones(tf.shape(taken)[:1], tf.bool), tf.shape(scores))


def _first_slots(marked, count, slots):
    """(positions (B, M), valid (B, M)): each row's first min(count, M) marked positions.

    marked: (B, L) bool; count: (B,) int32, each row's number of marked positions.
    Unused slots hold position 0. All the batch's marked positions, row after row
    and in position order within a row, hold row b's at start[b] ... start[b] +
    count[b] - 1, so the slots are one gather, not a rank by cumsum over (B, L)
    (TF's CPU cumsum is slow).
    """
    flat_positions = tf.cast(tf.where(marked)[:, 1], tf.int32)  # (N,)
    flat_positions = tf.pad(flat_positions, [[0, 1]])  # entry N: 0, for the unused slots
    start = tf.cumsum(count, exclusive=True)  # (B,)
    slot = tf.range(slots)[None, :]  # (1, M)
    valid = slot < tf.minimum(count, slots)[:, None]  # (B, M)
    positions = tf.gather(flat_positions,
                          tf.where(valid, start[:, None] + slot, tf.size(flat_positions) - 1))
    return positions, valid


def _whole_word_slots(input_ids, candidates, count, keys, word_starts, slots):
    """(positions (B, M), valid (B, M)) for whole-word masking: words in random order."""
    length = tf.shape(input_ids)[1]
    words = _words_of(input_ids, candidates, word_starts)
    # One random score per word (B, L).
    uniforms = tf.gather(hash_uniform(keys, SALT_SCORE, length), words.index, batch_dims=1)
    # Ties keep position order, so a word's tokens come out together, in order.
    chosen, padding = _top_candidates(uniforms, candidates, slots)  # (B, M)
    valid = _whole_words_within(chosen, words, padding, count, slots)
    return tf.where(valid, chosen, 0), valid


class _Words(typing.NamedTuple):
    index: tf.Tensor  # (B, L) int32 the word each position belongs to (0 for non-candidates)
    offset: tf.Tensor  # (B, L) int32 the position's place within its word
    size: tf.Tensor  # (B, L) int32 its word's number of tokens (0 for non-candidates)


def _words_of(input_ids, candidates, word_starts) -> _Words:
    """Which word each candidate token belongs to: words are runs of candidates
    that start at a word-start id or after a non-candidate (special, padding)."""
    rows, length = tf.shape(input_ids)[0], tf.shape(input_ids)[1]
    after_other = ~tf.pad(candidates[:, :-1], [[0, 0], [1, 0]])  # (B, L)
    starts = candidates & (tf.gather(tf.constant(word_starts, tf.bool), input_ids) | after_other)
    index = tf.maximum(tf.cumsum(tf.cast(starts, tf.int32), axis=1) - 1, 0)  # (B, L)
    segment = tf.reshape(tf.range(rows)[:, None] * length + index, [-1])  # (B * L,)
    position = tf.broadcast_to(tf.range(length)[None, :], [rows, length])
    # Only candidates count; a non-candidate's entries are never used.
    first = tf.math.unsorted_segment_min(
        tf.reshape(tf.where(candidates, position, length), [-1]), segment, rows * length)
    size = tf.math.unsorted_segment_sum(
        tf.reshape(tf.cast(candidates, tf.int32), [-1]), segment, rows * length)
    per_position = lambda table: tf.reshape(tf.gather(table, segment), [rows, length])
    return _Words(index, position - per_position(first),
                  tf.where(candidates, per_position(size), 0))


def _whole_words_within(chosen, words: _Words, padding, count, slots):
    """(B, M) bool: the slots of the whole words that fit, a prefix of the slots.

    chosen: (B, M) positions in descending word-score order, a word's tokens
    consecutive. A word spans slots [before, after); it is kept when it fits the
    slots and its middle lies within `count` tokens, or when it is the first.
    """
    slot = tf.range(slots)[None, :]  # (1, M)
    offset = tf.gather(tf.pad(words.offset, padding), chosen, batch_dims=1)  # (B, M)
    size = tf.gather(tf.pad(words.size, padding), chosen, batch_dims=1)  # (B, M); 0 = padding
    before = slot - offset
    after = before + size
    fits = (size > 0) & (after <= slots) & ((before == 0) | (before + after <= 2 * count[:, None]))
    # What fits is a prefix (before and after only grow along the slots); cumprod keeps it one.
    return tf.cast(tf.math.cumprod(tf.cast(fits, tf.int32), axis=1), tf.bool) & (count[:, None] > 0)


def dynamic_mask(input_ids, attention_mask, seed, **kwargs):
    """`dynamic_mask_batch` of one sequence (L,); `seed` is (run seed, element index).

    Gives exactly the row that sequence gets inside any batch at that index.
    """
    seed = tf.cast(seed, tf.int64)
    masked, positions, labels = dynamic_mask_batch(
        tf.expand_dims(input_ids, 0), tf.expand_dims(attention_mask, 0), seed[0], seed[1:2], **kwargs)
    return masked[0], positions[0], labels[0]


def static_slots_batch(labels, slots):
    """Prediction slots from a file's labels (-100 = no loss), earliest positions first.

    Args:
        labels: int (B, L) the file's labels.
        slots: M.

    Returns:
        (positions (B, M), slot_labels (B, M), dropped (B,)) where `dropped` counts
        the labelled positions beyond the first M (they are not predicted).
    """
    labels = tf.cast(labels, tf.int32)
    labelled = labels != IGNORE_LABEL  # (B, L)
    count = tf.reduce_sum(tf.cast(labelled, tf.int32), axis=1)  # (B,)
    positions, valid = _first_slots(labelled, count, slots)
    slot_labels = tf.where(valid, tf.gather(labels, positions, batch_dims=1), IGNORE_LABEL)
    return positions, slot_labels, tf.maximum(count - slots, 0)


def static_slots(labels, slots):
    """`static_slots_batch` of one sequence: labels (L,) -> (M,), (M,), ()."""
    positions, slot_labels, dropped = static_slots_batch(tf.expand_dims(labels, 0), slots)
    return positions[0], slot_labels[0], dropped[0]
