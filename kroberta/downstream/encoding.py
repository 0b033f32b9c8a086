"""Texts -> token ids as RoBERTa reads them, padded into a few fixed-length buckets.

One text is `<s> a </s>`, a pair `<s> a </s></s> b </s>` (the tokenizer's
`RobertaProcessing`), truncated longest-first to the model's max_sequence_length.
Each batch is padded to the shortest bucket that holds its longest row and to the
full batch size (rows of weight 0), so the compiled steps see at most a handful of
shapes: XLA compiles once per bucket, never per batch.
"""

import dataclasses

import numpy as np
from tokenizers import Tokenizer, processors

from kroberta.errors import InputError

BUCKET_FRACTIONS = (1, 2, 4, 8)  # buckets at L, L/2, L/4, L/8 (rounded up to 8)
MIN_LENGTH = 8  # the shortest bucket; a pair's four special tokens leave room for text


@dataclasses.dataclass(frozen=True)
class Encoded:
    """A split tokenised: `ids[i]` the (length_i,) int32 ids of example i, `labels` (n,)."""

    ids: list
    labels: np.ndarray
    pad_id: int


def bucket_lengths(max_length: int) -> tuple:
    """The few padded lengths, shortest first: e.g. 512 -> (64, 128, 256, 512)."""
    lengths = {
        min(max_length, max(MIN_LENGTH, -(-max_length // f // 8) * 8)) for f in BUCKET_FRACTIONS
    }
    return tuple(sorted(lengths))


def _pair_tokenizer(tokenizer: Tokenizer, max_length: int) -> Tokenizer:
    """A copy of `tokenizer` that adds RoBERTa's specials and truncates to max_length."""
    copy = Tokenizer.from_str(tokenizer.to_str())
    ids = {name: copy.token_to_id(name) for name in ("<s>", "</s>", "<pad>")}
    missing = [name for name, i in ids.items() if i is None]
    if missing:
        raise InputError(f"the model's tokenizer has no {', '.join(missing)} token(s)")
    copy.post_processor = processors.RobertaProcessing(("</s>", ids["</s>"]), ("<s>", ids["<s>"]))
    copy.enable_truncation(max_length, strategy="longest_first")
    copy.no_padding()
    return copy


def encode(tokenizer, texts: tuple, labels: np.ndarray, max_length: int) -> Encoded:
    """Tokenises one split: `texts` holds one list of n strings per text field (1 or 2)."""
    if tokenizer is None:
        raise InputError(
            "the model has no tokenizer (model.tokenizer is None); load a run "
            "that was trained on prepared data, or an export with tokenizer.json"
        )
    pairs = _pair_tokenizer(tokenizer, max_length)
    inputs = list(zip(*texts)) if len(texts) == 2 else list(texts[0])
    encodings = pairs.encode_batch(inputs)
    ids = [np.asarray(e.ids, np.int32) for e in encodings]
    return Encoded(ids, labels, pairs.token_to_id("<pad>"))


def batches(encoded: Encoded, batch_size: int, max_length: int, seed: int | None = None):
    """The split as padded batches: a list of (x, labels (B,), weights (B,), rows (B,)).

    x is {"token_ids", "padding_mask"}, each (B, bucket) int32. Rows are grouped by
    bucket (the shortest that holds them), in order, or shuffled by `seed` (both
    within buckets and the batches' order). Padding rows have weight 0 and row -1.
    """
    buckets = bucket_lengths(max_length)
    which = _bucket_of(encoded, buckets)
    rng = np.random.default_rng(seed)
    result = []
    for b, length in enumerate(buckets):
        rows = np.flatnonzero(which == b)
        if seed is not None:
            rows = rng.permutation(rows)
        for start in range(0, len(rows), batch_size):
            result.append(pad(encoded, rows[start : start + batch_size], batch_size, length))
    if seed is not None:
        result = [result[i] for i in rng.permutation(len(result))]
    return result


def batch_count(encoded: Encoded, batch_size: int, max_length: int) -> int:
    """How many batches `batches` makes of the split, without building them."""
    buckets = bucket_lengths(max_length)
    rows = np.bincount(_bucket_of(encoded, buckets), minlength=len(buckets))  # (buckets,)
    return int(sum(-(-n // batch_size) for n in rows))


def _bucket_of(encoded: Encoded, buckets: tuple) -> np.ndarray:
    """(n,) the index of each example's bucket: the shortest that holds it."""
    return np.searchsorted(buckets, np.array([len(i) for i in encoded.ids], np.int64))


def pad(encoded: Encoded, rows: np.ndarray, batch_size: int, length: int):
    """The examples `rows` as one batch of `batches`, padded to (batch_size, length)."""
    token_ids = np.full((batch_size, length), encoded.pad_id, np.int32)
    padding_mask = np.zeros((batch_size, length), np.int32)
    for slot, row in enumerate(rows):
        ids = encoded.ids[row]
        token_ids[slot, : len(ids)] = ids
        padding_mask[slot, : len(ids)] = 1
    labels = np.zeros((batch_size,), encoded.labels.dtype)
    labels[: len(rows)] = encoded.labels[rows]
    weights = np.zeros((batch_size,), np.float32)
    weights[: len(rows)] = 1.0
    where = np.full((batch_size,), -1, np.int64)
    where[: len(rows)] = rows
    return {"token_ids": token_ids, "padding_mask": padding_mask}, labels, weights, where


def dataset(encoded: Encoded, batch_size: int, max_length: int, seed: int | None = None):
    """(tf.data.Dataset of (x, labels, weights) batches, rows) of one pass over a split,
    for Keras' fit and predict: `rows` (batches * B,) is the example of each output row
    (-1 for padding rows). Each bucket's batches are one tensor (no Python generator
    runs beside the compiled steps); the batches come in `batches`' order."""
    # start-up: TensorFlow loads when batches are built, not for a command's --help
    import tensorflow as tf

    items = batches(encoded, batch_size, max_length, seed)
    lengths = sorted({item[0]["token_ids"].shape[1] for item in items})
    which = [lengths.index(item[0]["token_ids"].shape[1]) for item in items]
    per_bucket = []
    for b in range(len(lengths)):
        chosen = [item[:3] for item, w in zip(items, which) if w == b]  # (x, labels, weights)
        per_bucket.append(
            tf.data.Dataset.from_tensor_slices(
                tf.nest.map_structure(lambda *parts: np.stack(parts), *chosen)
            )
        )
    order = tf.data.Dataset.from_tensor_slices(np.asarray(which, np.int64))
    data = tf.data.Dataset.choose_from_datasets(per_bucket, order)
    # The count known up front: Keras then ends each pass without running dry.
    rows = np.concatenate([item[3] for item in items])
    return data.apply(tf.data.experimental.assert_cardinality(len(items))), rows
