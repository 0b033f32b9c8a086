"""Choosing the positions to predict: dynamic (RoBERTa) masking and static slots, in JAX.

The one implementation of masking. The training step runs it on the device (the
pipeline sends unmasked tokens with one uint32 key per sequence, or the file's labels
per position); the input pipeline, `prepare --labels static`, synthetic files and
`predict` run the same functions on the host CPU (`host_function`). Each gives a
fixed number of prediction slots M, so the model's head always sees one static shape:

    token_ids  (B, L) int32   the tokens the model reads (with <mask> where chosen)
    positions  (B, M) int32   where to predict; unused slots hold 0
    labels     (B, M) int32   the original token there; -100 in unused slots

Dynamic masks are a pure function of (run seed, element index, position): the random
numbers come from a counter hash (`kroberta.counter_hash`) of each element's key
(`element_keys`), not from a stateful generator, so an example gets the same mask
whether it is masked alone, in a batch of 8 or of 64, in one process or in one of
several, on the host or on the device. JAX runs without 64-bit integers, so the
element indices are split into two uint32 words on the host before they are hashed.
"""

import functools
import typing

import jax
import jax.numpy as jnp
import numpy as np

from kroberta.counter_hash import MIX_B, keys_of_words, mix
from kroberta.tokens import IGNORE_LABEL

KEYS = "mask_keys"  # the x entry of a batch whose masks are drawn from element keys
TOKEN_LABELS = "token_labels"  # the x entry of a batch whose static slots come from labels
STEP_INPUTS = (KEYS, TOKEN_LABELS)  # `DataConfig.step_input`'s names

# Independent streams of hashed numbers per element: which positions, what to write, random ids.
SALT_SCORE, SALT_ACTION, SALT_RANDOM_ID = 1, 2, 3
SCORE_BITS = 24  # random scores are integers in [0, 2^24): exact in float32


def _random_ids(keys, slots: int, special_token_ids, vocabulary_size: int):
    """(B, M) int32 ids for the "random token" replacement: the i-th regular id (every id
    below `vocabulary_size` that is not special, ascending) for i = floor(u * count), u the
    keys' uniforms (B, M). Where the regular ids are one run (the specials all below them:
    5 ... V-1 after <s> <pad> </s> <unk> <mask> = 0 ... 4), that is lowest + i, computed
    without a table (a reused tokenizer may put <mask> last, at 50264)."""
    regular = np.setdiff1d(
        np.arange(vocabulary_size), np.asarray(list(special_token_ids), np.int64)
    ).astype(np.int32)
    if regular.size == 0:
        raise ValueError(
            f"every id below the vocabulary size {vocabulary_size} is a special "
            "token: no id to draw random replacements from"
        )
    count = len(regular)
    uniforms = hash_uniform(keys, SALT_RANDOM_ID, slots)
    index = jnp.minimum((uniforms * np.float32(count)).astype(jnp.int32), count - 1)
    if regular[-1] - regular[0] + 1 == count:
        return int(regular[0]) + index
    return jnp.asarray(regular)[index]


def _words(value):
    """int64 numpy (any shape) -> (low, high) uint32 words, split on the host."""
    value = np.asarray(value, np.int64)
    return ((value & 0xFFFFFFFF).astype(np.uint32), ((value >> 32) & 0xFFFFFFFF).astype(np.uint32))


_keys_of_words = jax.jit(keys_of_words)


def element_keys(seed, indices) -> np.ndarray:
    """One uint32 key per element (B,) from the run seed (an int) and the elements'
    indices in their stream ((B,) int64), hashed on the host CPU."""
    seed_low, seed_high = _words(seed)
    index_low, index_high = _words(indices)
    with jax.default_device(jax.devices("cpu")[0]):
        return np.asarray(_keys_of_words(seed_low, seed_high, index_low, index_high))


def hash_bits(keys, salt: int, count: int):
    """(B, count) int32 in [0, 2^24): element key x salt x counter, hashed (the top 24 bits)."""
    salted = mix(keys ^ jnp.uint32(salt * MIX_B & 0xFFFFFFFF))  # (B,)
    counter = jnp.arange(count, dtype=jnp.uint32)  # (count,)
    bits = mix(salted[:, None] + counter[None, :])  # (B, count), wrapping
    return (bits >> (32 - SCORE_BITS)).astype(jnp.int32)


def hash_uniform(keys, salt: int, count: int):
    """(B, count) float32 uniforms in [0, 1): `hash_bits` / 2^24 (exact: never rounds to 1)."""
    return hash_bits(keys, salt, count).astype(jnp.float32) * np.float32(1.0 / (1 << SCORE_BITS))


def _is_special(ids, special_token_ids):
    specials = sorted(set(special_token_ids))
    if not specials:
        return jnp.zeros(ids.shape, bool)
    if specials == list(range(specials[0], specials[-1] + 1)):
        # The usual case (<s> <pad> </s> <unk> <mask> = 0..4): two comparisons, not one per id.
        return (ids >= specials[0]) & (ids <= specials[-1])
    return jnp.any(ids[..., None] == jnp.asarray(specials, ids.dtype), axis=-1)


def _top(ranked, slots: int, below: float):
    """`lax.top_k` of float32 rows (B, L) for M slots; rows narrower than M are padded
    with `below` (top_k needs k <= width). Equal values come out in position order.

    float32: the 24-bit scores and the positions are exact in it, and XLA's CPU top_k of
    float32 is a library call ~12x faster than its sort of int32 (docs/design.md,
    "Device masking")."""
    length = ranked.shape[1]
    if slots > length:
        ranked = jnp.pad(ranked, ((0, 0), (0, slots - length)), constant_values=below)
    return jax.lax.top_k(ranked, slots)  # (B, M) values, positions


def chosen_slots(scores, candidates, count, slots: int):
    """(positions (B, M), valid (B, M)): each row's `count` candidates of highest score,
    ties to the lower position, in position order; unused slots hold position 0.

    scores: (B, L) int32 in [0, 2^24); candidates: (B, L) bool; count: (B,) int32 <= M.
    """
    length = scores.shape[1]
    _, chosen = _top(jnp.where(candidates, scores, -1).astype(jnp.float32), slots, -2.0)
    valid = jnp.arange(slots)[None, :] < count[:, None]  # (B, M): a prefix of each row
    # Position order: the chosen positions are distinct, the unused slots sort last.
    ordered = jnp.sort(jnp.where(valid, chosen, length + slots), axis=1)
    return jnp.where(valid, ordered, 0).astype(jnp.int32), valid


class _Words(typing.NamedTuple):
    index: jax.Array  # (B, L) int32 the word each position belongs to (0 before the first)
    offset: jax.Array  # (B, L) int32 the position's place within its word
    size: jax.Array  # (B, L) int32 its word's number of tokens (0 for non-candidates)


def _words_of(token_ids, candidates, word_starts) -> _Words:
    """Which word each candidate token belongs to: words are runs of candidates that
    start at a word-start id or after a non-candidate (special, padding)."""
    rows, length = token_ids.shape
    after_other = ~jnp.pad(candidates[:, :-1], ((0, 0), (1, 0)))  # (B, L)
    starts = candidates & (jnp.asarray(word_starts, bool)[token_ids] | after_other)
    index = jnp.maximum(jnp.cumsum(starts, axis=1, dtype=jnp.int32) - 1, 0)  # (B, L)
    segment = (jnp.arange(rows)[:, None] * length + index).reshape(-1)  # (B * L,) row's words
    position = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32)[None, :], (rows, length))
    # Only candidates count; a non-candidate's entries are never used.
    first = jax.ops.segment_min(
        jnp.where(candidates, position, length).reshape(-1), segment, rows * length
    )
    size = jax.ops.segment_sum(candidates.astype(jnp.int32).reshape(-1), segment, rows * length)
    per_position = lambda table: table[segment].reshape(rows, length)
    return _Words(
        index, position - per_position(first), jnp.where(candidates, per_position(size), 0)
    )


def _whole_word_slots(token_ids, candidates, count, scores, word_starts, slots: int):
    """(positions (B, M), valid (B, M)) for whole-word masking: words in random order,
    a word's tokens in consecutive slots, the words that fit the budget a prefix.

    scores: (B, L) random scores, the w-th for a row's w-th word. A word spans slots [before,
    after); it is kept when it fits the slots and its middle lies within `count` tokens, or
    when it is the first.
    """
    length = token_ids.shape[1]
    words = _words_of(token_ids, candidates, word_starts)
    # One random score per word (B, L); ties keep position order, so a word's tokens
    # come out together, in order.
    scores = jnp.take_along_axis(scores, words.index, axis=1)
    # (B, M) positions in descending word-score order (positions >= L are padding).
    _, chosen = _top(jnp.where(candidates, scores, -1).astype(jnp.float32), slots, -2.0)
    width = max(slots - length, 0)
    pad = lambda table: jnp.pad(table, ((0, 0), (0, width)))  # padding: offset 0, size 0
    slot = jnp.arange(slots)[None, :]  # (1, M)
    offset = jnp.take_along_axis(pad(words.offset), chosen, axis=1)  # (B, M)
    size = jnp.take_along_axis(pad(words.size), chosen, axis=1)  # (B, M); 0 = not a word
    before = slot - offset
    after = before + size
    fits = (size > 0) & (after <= slots) & ((before == 0) | (before + after <= 2 * count[:, None]))
    # What fits is a prefix (before and after only grow along the slots); cumprod keeps it one.
    valid = jnp.cumprod(fits.astype(jnp.int32), axis=1).astype(bool) & (count[:, None] > 0)
    return jnp.where(valid, chosen, 0).astype(jnp.int32), valid


def dynamic_mask_batch(
    token_ids,
    padding_mask,
    keys,
    *,
    mask_rate: float,
    slots: int,
    mask_token_id: int,
    special_token_ids,
    vocabulary_size: int,
    mask_fraction: float = 0.8,
    random_fraction: float = 0.1,
    word_starts=None,
):
    """RoBERTa masking of a batch, each row a function of its element key alone.

    Chooses round(mask_rate * n) of a row's n real, non-special tokens (at least one
    when n > 0 and mask_rate > 0, at most `slots`); of those, `mask_fraction` become
    <mask>, `random_fraction` a random non-special token, and the rest stay as they are.

    With `word_starts`, whole words are chosen: all the tokens of a word or none (the
    80/10/10 split stays per token). Words are taken in a random order while they fit
    the budget: a word counts when at least half of it lies within round(mask_rate *
    n) tokens, and the first word always counts, so the rate is kept on average; a
    word that does not fit the `slots` is never split.

    Args:
        token_ids: int (B, L) original tokens.
        padding_mask: int (B, L) 1 for real tokens, 0 for padding.
        keys: uint32 (B,) the rows' `element_keys`.
        mask_rate: fraction of candidate tokens to predict.
        slots: M, the static number of prediction slots.
        mask_token_id: id written at masked positions.
        special_token_ids: ids that are never chosen (<s>, <pad>, </s>, ...).
        vocabulary_size: random replacements are the non-special ids below this.
        mask_fraction: share of the chosen tokens that become <mask>.
        random_fraction: share of the chosen tokens that become a random id.
        word_starts: None, or a bool (vocabulary_size,) table: True for the ids that
            begin a word (byte-level BPE: a leading space marker). A token also begins
            a word after a special token or padding.

    Returns:
        (masked ids (B, L), positions (B, M), labels (B, M)), all int32. The chosen
        positions fill the first slots in position order (whole words: in the order
        the words were taken); unused slots hold position 0, label -100.
    """
    token_ids = jnp.asarray(token_ids).astype(jnp.int32)
    keys = jnp.asarray(keys).astype(jnp.uint32)
    rows, length = token_ids.shape
    candidates = jnp.asarray(padding_mask).astype(bool) & ~_is_special(token_ids, special_token_ids)
    num_candidates = jnp.sum(candidates, axis=1, dtype=jnp.int32)  # (B,)
    # A float32 product and round-half-to-even, as the masks have always been counted.
    wanted = jnp.round(np.float32(mask_rate) * num_candidates.astype(jnp.float32)).astype(jnp.int32)
    wanted = jnp.where((num_candidates > 0) & (mask_rate > 0), jnp.maximum(wanted, 1), 0)
    count = jnp.minimum(jnp.minimum(wanted, num_candidates), slots)  # (B,)

    scores = hash_bits(keys, SALT_SCORE, length)  # (B, L)
    if word_starts is None:  # the `count` candidates of highest random score
        positions, valid = chosen_slots(scores, candidates, count, slots)  # (B, M) each
    else:
        positions, valid = _whole_word_slots(
            token_ids, candidates, count, scores, word_starts, slots
        )
    originals = jnp.take_along_axis(token_ids, positions, axis=1)  # (B, M)
    labels = jnp.where(valid, originals, IGNORE_LABEL)

    draw = hash_uniform(keys, SALT_ACTION, slots)  # (B, M)
    random_ids = _random_ids(keys, slots, special_token_ids, vocabulary_size)  # (B, M)
    replacement = jnp.where(
        draw < np.float32(mask_fraction),
        mask_token_id,
        jnp.where(draw < np.float32(mask_fraction + random_fraction), random_ids, originals),
    )
    # Unused slots write out of bounds, and are dropped. Rows (B, 1) x slots (B, M).
    masked = token_ids.at[jnp.arange(rows)[:, None], jnp.where(valid, positions, length)].set(
        replacement.astype(jnp.int32), mode="drop"
    )
    return masked, positions, labels.astype(jnp.int32)


def first_labelled_slots(token_labels, slots: int):
    """(positions (B, M), labels (B, M)): each row's first M labelled positions (labels
    other than -100) in position order and their labels; unused slots hold position 0
    and label -100.

    token_labels: int (B, L), -100 = no loss.
    """
    labels = jnp.asarray(token_labels).astype(jnp.int32)
    length = labels.shape[1]
    # Earlier positions rank higher (exact in float32: L < 2^24); unlabelled ones rank 0.
    ranked = jnp.where(labels != IGNORE_LABEL, length - jnp.arange(length), 0)
    rank, chosen = _top(ranked.astype(jnp.float32), slots, -1.0)  # (B, M) earliest first
    valid = rank > 0
    positions = jnp.where(valid, chosen, 0).astype(jnp.int32)
    slot_labels = jnp.where(valid, jnp.take_along_axis(labels, positions, axis=1), IGNORE_LABEL)
    return positions, slot_labels.astype(jnp.int32)


def masker(data, vocabulary_size: int, word_starts=None):
    """`x -> (x, labels)` for a batch of step inputs: the masks drawn from `mask_keys`, or
    the static slots chosen from `token_labels`.

    Args:
        data: the run's `kroberta.config.DataConfig` (rates, slots, token ids).
        vocabulary_size: V, for the random replacements.
        word_starts: bool (V,), the tokenizer's word starts; needed to mask whole
            words (a constant of the compiled step; without it, masking them raises).

    Returns:
        A jittable function of x = {token_ids (B, L), padding_mask (B, L), and
        mask_keys (B,) uint32 or token_labels (B, L)} returning ({token_ids (B, L),
        padding_mask (B, L), mask_positions (B, M)}, labels (B, M)).
    """
    word_starts = (
        np.asarray(word_starts, bool)
        if data.whole_word_masking and word_starts is not None
        else None
    )

    def mask(x):
        slots = data.prediction_slots(x["token_ids"].shape[1])
        if data.whole_word_masking and word_starts is None and TOKEN_LABELS not in x:
            raise ValueError(
                "data.whole_word_masking: the masks need the tokenizer's "
                "word-start table (word_starts)"
            )
        if TOKEN_LABELS in x:
            positions, labels = first_labelled_slots(x[TOKEN_LABELS], slots)
            ids = x["token_ids"]
        else:
            ids, positions, labels = dynamic_mask_batch(
                x["token_ids"],
                x["padding_mask"],
                x[KEYS],
                mask_rate=data.mask_rate,
                slots=slots,
                mask_token_id=data.mask_token_id,
                special_token_ids=data.special_token_ids,
                vocabulary_size=vocabulary_size,
                word_starts=word_starts,
            )
        return {
            "token_ids": ids,
            "padding_mask": x["padding_mask"],
            "mask_positions": positions,
        }, labels

    return mask


def host_function(function):
    """`function` jitted for the host CPU (whatever the default device is): called with
    numpy arrays (or pytrees of them), it returns numpy arrays. Compiled once per shape."""
    jitted = jax.jit(function)

    @functools.wraps(function)
    def call(*args):
        with jax.default_device(jax.devices("cpu")[0]):
            return jax.tree.map(np.asarray, jitted(*args))

    return call


def static_labels(
    token_ids,
    padding_mask,
    seed: int,
    indices,
    *,
    mask_rate: float,
    mask_token_id: int,
    special_token_ids,
    vocabulary_size: int,
):
    """Labels made once for files (`prepare --labels static`, synthetic data): the dynamic
    masks of (seed, each row's index), written per position. Every chosen token fits:
    the slots are the whole row.

    Args:
        token_ids, padding_mask: int (N, L) numpy arrays, the original tokens.
        seed: the masks' seed.
        indices: int (N,) each row's index among the records.
        mask_rate, mask_token_id, special_token_ids, vocabulary_size: as in
            `dynamic_mask_batch`.

    Returns:
        (masked ids (N, L) int64, labels (N, L) int64: the original id where chosen,
        -100 elsewhere), numpy.
    """
    label = _static_labels(
        float(mask_rate), int(mask_token_id), tuple(sorted(special_token_ids)), int(vocabulary_size)
    )
    masked, labels = label(
        np.asarray(token_ids, np.int32),
        np.asarray(padding_mask, np.int32),
        element_keys(seed, indices),
    )
    return masked.astype(np.int64), labels.astype(np.int64)


@functools.cache
def _static_labels(mask_rate, mask_token_id, special_token_ids, vocabulary_size):
    """The host function of `static_labels` for one run's settings."""

    def label(token_ids, padding_mask, keys):
        rows, length = token_ids.shape
        masked, positions, labels = dynamic_mask_batch(
            token_ids,
            padding_mask,
            keys,
            mask_rate=mask_rate,
            slots=length,
            mask_token_id=mask_token_id,
            special_token_ids=special_token_ids,
            vocabulary_size=vocabulary_size,
        )
        row = jnp.arange(rows)[:, None]
        # Unused slots (label -100) write out of bounds, and are dropped. (N, L)
        written = (
            jnp.full((rows, length), IGNORE_LABEL, jnp.int32)
            .at[row, jnp.where(labels != IGNORE_LABEL, positions, length)]
            .set(labels, mode="drop")
        )
        return masked, written

    return host_function(label)
