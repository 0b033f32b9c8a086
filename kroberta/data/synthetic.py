"""Synthetic TFRecords in the seed's exact format, for tests and benchmarks.

Each sequence is `<s>` + a run of a few random "motifs" (short fixed token
patterns drawn from a motif table) + `</s>` + padding, so a masked token is
predictable from its neighbours: a model that learns the context beats the
unigram baseline. Labels are masked once like the seed's data (15% of real
tokens, 80% <mask> / 10% random / 10% kept, -100 elsewhere; `kroberta.masking`).
"""

import numpy as np

from kroberta.data.records import encode_examples
from kroberta.data.tfrecord_files import RecordFileWriter
from kroberta.masking import static_labels
from kroberta.tokens import BOS_ID, EOS_ID, FIRST_REGULAR_ID, MASK_ID, PAD_ID, SPECIAL_IDS


def make_sequences(
    count,
    length,
    vocabulary_size,
    seed=0,
    min_fill=0.7,
    motif_length=4,
    num_motifs=64,
    motif_seed=1234,
):
    """(input_ids, attention_mask) int64 arrays of shape (count, length), unmasked.

    The motif table depends only on `motif_seed` (and the sizes), so files made
    with different `seed`s share it and a validation file tests what training learnt.
    """
    rng = np.random.default_rng(seed)
    motifs = np.random.default_rng(motif_seed).integers(
        FIRST_REGULAR_ID, vocabulary_size, size=(num_motifs, motif_length)
    )
    ids = np.full((count, length), PAD_ID, np.int64)
    mask = np.zeros((count, length), np.int64)
    for row in range(count):
        real = int(rng.integers(int(min_fill * length), length + 1))
        body = motifs[rng.integers(0, num_motifs, size=length)].reshape(-1)[: real - 2]
        ids[row, :real] = np.concatenate([[BOS_ID], body, [EOS_ID]])
        mask[row, :real] = 1
    return ids, mask


def mask_once(ids, mask, vocabulary_size, seed=0, rate=0.15):
    """The seed's static masking: (masked input_ids, labels with -100 where unlabelled),
    each row's mask a function of (seed + 1, its index)."""
    return static_labels(
        ids,
        mask,
        seed + 1,
        np.arange(len(ids)),
        mask_rate=rate,
        mask_token_id=MASK_ID,
        special_token_ids=SPECIAL_IDS,
        vocabulary_size=vocabulary_size,
    )


def write_tfrecord(path, input_ids, attention_mask, labels=None):
    """Writes one record per row in the record format: input_ids, attention_mask[, labels]."""
    with RecordFileWriter(path) as writer:
        writer.write_many(encode_examples(input_ids, attention_mask, labels))


def write_seed_format(path, count, length=64, vocabulary_size=10000, seed=0, **kwargs):
    """A synthetic file in the seed's format (static labels); returns the arrays written."""
    ids, mask = make_sequences(count, length, vocabulary_size, seed, **kwargs)
    masked, labels = mask_once(ids, mask, vocabulary_size, seed)
    write_tfrecord(path, masked, mask, labels)
    return {"input_ids": masked, "attention_mask": mask, "labels": labels, "original_ids": ids}
