"""Masking inside the compiled step: the host sends tokens, the device finishes the batch.

With `data.masking = "dynamic"` (not whole words) the training and validation
pipelines send each sequence unmasked with one uint32 key (the element key of
`kroberta.data.masking.element_keys`: a hash of the run seed and the element's
index), and the step draws the masks from it before the model runs:

    x = {token_ids (B, L), padding_mask (B, L), mask_keys (B,) uint32}
      -> x = {token_ids (B, L) masked, padding_mask (B, L), mask_positions (B, M)},
         labels (B, M)

exactly the batch `kroberta.data.masking.dynamic_mask_batch` makes on the host,
bit for bit (the same counter hash in uint32 arithmetic, the same choice with ties
to the lower position, the same 80/10/10 draw per slot; tested against it). On an
accelerator this takes microseconds per step, while on the host the hash, the
choice and the scatter were a fifth of the pipeline's CPU time at 512 tokens
(docs/design.md, "Device masking"); and masks remain a pure function of (seed, element
index), so resume and multi-process runs see the masks they saw before.

With `data.masking = "static"` the pipelines send the file's labels per position
instead, and the step chooses the prediction slots from them:

    x = {token_ids (B, L) as masked in the file, padding_mask (B, L), token_labels (B, L)}
      -> x = {token_ids, padding_mask, mask_positions (B, M)}, labels (B, M)

the first M labelled positions of each row, exactly
`kroberta.data.masking.static_slots_batch` (a sixth of the static pipeline's host
CPU at 512 tokens).

The training model's steps (`kroberta.model.trainer.TrainingMaskedLM`) call
`finish_batch` / `finish_inputs` with the `masker` of the run's data config first; a
finished batch (without `mask_keys` or `token_labels`) passes through unchanged.
"""

import jax
import jax.numpy as jnp
import keras
import numpy as np

from kroberta.config import DataConfig
from kroberta.mask_hash import (MIX_A, MIX_B, SALT_ACTION, SALT_RANDOM_ID, SALT_SCORE, SCORE_BITS,
                                 random_id_range)
from kroberta.tokens import IGNORE_LABEL

KEYS = "mask_keys"  # the x entry of a batch whose masks the step draws
TOKEN_LABELS = "token_labels"  # the x entry of a batch whose static slots the step chooses
STEP_INPUTS = (KEYS, TOKEN_LABELS)  # `DataConfig.step_input`'s names


def _mix(x):
    """lowbias32 of uint32 `x` (the host hash's mixer, `kroberta.data.masking._mix`)."""
    x = x ^ (x >> 16)
    x = x * np.uint32(MIX_A)
    x = x ^ (x >> 15)
    x = x * np.uint32(MIX_B)
    return x ^ (x >> 16)


def hash_bits(keys, salt: int, count: int):
    """(B, count) int32 in [0, 2^24): `kroberta.data.masking.hash_bits` in JAX."""
    salted = _mix(keys ^ np.uint32(salt * MIX_B & 0xFFFFFFFF))  # (B,)
    counter = jnp.arange(count, dtype=jnp.uint32)  # (count,)
    bits = _mix(salted[:, None] + counter[None, :])  # (B, count), wrapping
    return (bits >> (32 - SCORE_BITS)).astype(jnp.int32)


def hash_uniform(keys, salt: int, count: int):
    """(B, count) float32 in [0, 1): `hash_bits` / 2^24 (exact in float32)."""
    return hash_bits(keys, salt, count).astype(jnp.float32) * np.float32(1.0 / (1 << SCORE_BITS))


def _is_special(ids, special_token_ids):
    specials = sorted(set(special_token_ids))
    if not specials:
        return jnp.zeros(ids.shape, bool)
    if specials == list(range(specials[0], specials[-1] + 1)):
        return (ids >= specials[0]) & (ids <= specials[-1])
    return jnp.any(ids[..., None] == jnp.asarray(specials, ids.dtype), axis=-1)


def chosen_slots(scores, candidates, count, slots: int):
    """(positions (B, M), valid (B, M)): each row's `count` candidates of highest score,
    ties to the lower position, in position order; unused slots hold position 0.

    `kroberta.data.masking._chosen_slots`; `lax.top_k` puts equal values in index order.
    scores: (B, L) int32 in [0, 2^24); candidates: (B, L) bool; count: (B,) int32 <= M.
    """
    length = scores.shape[1]
    # float32 ranks: the 24-bit scores are exact in it, and XLA's CPU top_k of float32 is
    # a library call ~12x faster than its sort of int32 (docs/design.md, "Device masking").
    ranked = jnp.where(candidates, scores, -1).astype(jnp.float32)  # (B, L)
    if slots > length:  # top_k needs k <= width; the padding ranks below every position
        ranked = jnp.pad(ranked, ((0, 0), (0, slots - length)), constant_values=-2.0)
    _, chosen = jax.lax.top_k(ranked, slots)  # (B, M) highest score first
    valid = jnp.arange(slots)[None, :] < count[:, None]  # (B, M): a prefix of each row
    # Position order: the chosen positions are distinct, the unused slots sort last.
    ordered = jnp.sort(jnp.where(valid, chosen, length + slots), axis=1)
    return jnp.where(valid, ordered, 0).astype(jnp.int32), valid


def mask_batch(token_ids, padding_mask, keys, *, mask_rate: float, slots: int, mask_token_id: int,
               special_token_ids, vocabulary_size: int, mask_fraction: float = 0.8,
               random_fraction: float = 0.1):
    """`kroberta.data.masking.dynamic_mask_batch` (without whole words) from element keys.

    token_ids, padding_mask: int (B, L); keys: uint32 (B,), `element_keys(seed, indices)`.
    Returns (masked ids (B, L), positions (B, M), labels (B, M)), all int32.
    """
    token_ids = jnp.asarray(token_ids).astype(jnp.int32)
    keys = jnp.asarray(keys).astype(jnp.uint32)
    rows, length = token_ids.shape
    candidates = padding_mask.astype(bool) & ~_is_special(token_ids, special_token_ids)  # (B, L)
    num_candidates = jnp.sum(candidates, axis=1, dtype=jnp.int32)  # (B,)
    # float32 products and round-half-to-even, as TF computes them on the host.
    wanted = jnp.round(np.float32(mask_rate) * num_candidates.astype(jnp.float32)).astype(jnp.int32)
    wanted = jnp.where((num_candidates > 0) & (mask_rate > 0), jnp.maximum(wanted, 1), 0)
    count = jnp.minimum(jnp.minimum(wanted, num_candidates), slots)  # (B,)

    positions, valid = chosen_slots(hash_bits(keys, SALT_SCORE, length), candidates, count, slots)
    originals = jnp.take_along_axis(token_ids, positions, axis=1)  # (B, M)
    labels = jnp.where(valid, originals, IGNORE_LABEL)

    draw = hash_uniform(keys, SALT_ACTION, slots)  # (B, M)
    lowest_regular_id, span = random_id_range(special_token_ids, vocabulary_size)
    random_ids = lowest_regular_id + jnp.minimum(
        (hash_uniform(keys, SALT_RANDOM_ID, slots) * np.float32(span)).astype(jnp.int32), span - 1)
    replacement = jnp.where(
        draw < np.float32(mask_fraction), mask_token_id,
        jnp.where(draw < np.float32(mask_fraction + random_fraction), random_ids, originals))
    # Unused slots write out of bounds, and are dropped.
    row = jnp.broadcast_to(jnp.arange(rows)[:, None], positions.shape)
    masked = token_ids.at[row, jnp.where(valid, positions, length)].set(
        replacement.astype(jnp.int32), mode="drop")
    return masked, positions, labels.astype(jnp.int32)


def first_labelled_slots(token_labels, slots: int):
    """(positions (B, M), labels (B, M)): each row's first M labelled positions (labels
    other than -100) in position order and their labels; unused slots hold position 0
    and label -100. `kroberta.data.masking.static_slots_batch` in JAX.

    token_labels: int (B, L), -100 = no loss.
    """
    labels = jnp.asarray(token_labels).astype(jnp.int32)
    length = labels.shape[1]
    # Earlier positions rank higher (exact in float32: L < 2^24; XLA's CPU top_k of
    # float32 is a library call, of int32 a sort); unlabelled positions rank 0.
    ranked = jnp.where(labels != IGNORE_LABEL, length - jnp.arange(length), 0).astype(jnp.float32)
    if slots > length:  # top_k needs k <= width; the padding ranks below every position
        ranked = jnp.pad(ranked, ((0, 0), (0, slots - length)), constant_values=-1.0)
    rank, chosen = jax.lax.top_k(ranked, slots)  # (B, M) earliest labelled first
    valid = rank > 0
    positions = jnp.where(valid, chosen, 0).astype(jnp.int32)
    slot_labels = jnp.where(valid, jnp.take_along_axis(labels, positions, axis=1), IGNORE_LABEL)
    return positions, slot_labels.astype(jnp.int32)


def masker(data: DataConfig, vocabulary_size: int):
    """`x -> (x, labels)` for a batch the step finishes: the masks drawn from `mask_keys`,
    or the static slots chosen from `token_labels`."""
    def mask(x):
        length = x["token_ids"].shape[1]
        slots = data.prediction_slots(length)
        if TOKEN_LABELS in x:
            positions, labels = first_labelled_slots(x[TOKEN_LABELS], slots)
            ids = x["token_ids"]
        else:
            ids, positions, labels = mask_batch(
                x["token_ids"], x["padding_mask"], x[KEYS], mask_rate=data.mask_rate,
                slots=slots, mask_token_id=data.mask_token_id,
                special_token_ids=data.special_token_ids, vocabulary_size=vocabulary_size)
        return {"token_ids": ids, "padding_mask": x["padding_mask"],
                "mask_positions": positions}, labels

    return mask


def _step_input(x) -> str | None:
    """The entry from which the step finishes this batch (`STEP_INPUTS`), or None."""
    if isinstance(x, dict):
        found = [name for name in STEP_INPUTS if name in x]
        if len(found) > 1:
            raise ValueError(f"a batch carries both '{KEYS}' and '{TOKEN_LABELS}'; "
                             "it can be finished from one only")
        return found[0] if found else None
    return None


def finish_batch(mask, data):
    """`data` = (x, [y, [sample_weight]]) as the step receives it, finished: when x
    carries `mask_keys` or `token_labels`, (masked x, labels[, sample_weight]);
    otherwise `data` itself."""
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    entry = _step_input(x)
    if entry is None:
        return data
    if y is not None:
        raise ValueError(f"a batch with '{entry}' gets its labels from it in the step; "
                         "it also had labels")
    x, y = mask(x)
    return (x, y) if sample_weight is None else (x, y, sample_weight)


def finish_inputs(mask, x):
    """The model inputs of a prediction batch `x`: masked from its step input, if any."""
    return mask(x)[0] if _step_input(x) is not None else x
