"""Synthetic TFRecords in the seed's exact format, for tests and benchmarks.

Each sequence is `<s>` + a run of a few random "motifs" (short fixed token
patterns drawn from a motif table) + `</s>` + padding, so a masked token is
predictable from its neighbours: a model that learns the context beats the
unigram baseline. Labels are masked once like the seed's data (15% of real
tokens, 80% <mask> / 10% random / 10% kept, -100 elsewhere).
"""

import numpy as np
import tensorflow as tf

BOS, PAD, EOS, MASK = 0, 1, 2, 4
FIRST_REGULAR_ID = 5


def _int64_feature(values):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))


def make_sequences(count, length, vocabulary_size, seed=0, min_fill=0.7, motif_length=4,
                   num_motifs=64, motif_seed=1234):
    """(input_ids, attention_mask) int64 arrays of shape (count, length), unmasked.

    The motif table depends only on `motif_seed` (and the sizes), so files made
    with different `seed`s share it and a validation file tests what training learnt.
    """
    rng = np.random.default_rng(seed)
    motifs = np.random.default_rng(motif_seed).integers(FIRST_REGULAR_ID, vocabulary_size, size=(num_motifs, motif_length))
    ids = np.full((count, length), PAD, np.int64)
    mask = np.zeros((count, length), np.int64)
    for row in range(count):
        real = int(rng.integers(int(min_fill * length), length + 1))
        body = motifs[rng.integers(0, num_motifs, size=length)].reshape(-1)[: real - 2]
        ids[row, :real] = np.concatenate([[BOS], body, [EOS]])
        mask[row, :real] = 1
    return ids, mask


def mask_once(ids, mask, vocabulary_size, seed=0, rate=0.15):
    """The seed's static masking: (masked input_ids, labels with -100 where unlabelled)."""
    rng = np.random.default_rng(seed + 1)
    candidates = (mask == 1) & (ids >= FIRST_REGULAR_ID)
    chosen = candidates & (rng.random(ids.shape) < rate)
    labels = np.where(chosen, ids, -100)
    draw = rng.random(ids.shape)
    random_ids = rng.integers(FIRST_REGULAR_ID, vocabulary_size, size=ids.shape)
    masked = np.where(chosen & (draw < 0.8), MASK, ids)
    masked = np.where(chosen & (draw >= 0.8) & (draw < 0.9), random_ids, masked)
    return masked, labels


def write_tfrecord(path, input_ids, attention_mask, labels=None):
    """Writes one tf.train.Example per row: int64 input_ids, attention_mask[, labels]."""
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(len(input_ids)):
            feature = {
                "input_ids": _int64_feature(input_ids[i]),
                "attention_mask": _int64_feature(attention_mask[i]),
            }
            if labels is not None:
                feature["labels"] = _int64_feature(labels[i])
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            writer.write(example.SerializeToString())


def write_seed_format(path, count, length=64, vocabulary_size=10000, seed=0, **kwargs):
    """A synthetic file in the seed's format (static labels); returns the arrays written."""
    ids, mask = make_sequences(count, length, vocabulary_size, seed, **kwargs)
    masked, labels = mask_once(ids, mask, vocabulary_size, seed)
    write_tfrecord(path, masked, mask, labels)
    return {"input_ids": masked, "attention_mask": mask, "labels": labels, "original_ids": ids}
