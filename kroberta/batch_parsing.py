"""Parsing and checking a whole batch of serialized records in one go.

One `tf.io.parse_example` per batch with `VarLenFeature`s (a wrong length stays
visible instead of failing inside TF), then every rule of the record format as a
tensor reduction over the batch. Only when a batch breaks a rule is a message
built, inside a `tf.cond` branch that healthy batches never run: it names the
first bad record of the batch (stream order) by file, record index and feature.

The message is wrapped in `<<...>>` so `data.explain_pipeline_error` can lift it
out of TensorFlow's error text. A payload that is not a `tf.train.Example` at all
makes `parse_example` itself fail; that error names nothing, and the caller finds
the record by replaying the stream (`data.first_bad_record`).
"""

import tensorflow as tf

from kroberta.records import FEATURES, IGNORE_LABEL

REQUIRED_FEATURES = ("input_ids", "attention_mask")


def parse_spec(with_labels: bool) -> dict:
    names = FEATURES if with_labels else REQUIRED_FEATURES
    return {name: tf.io.VarLenFeature(tf.int64) for name in names}


def parse_checked_batch(paths, record_indices, records, *, length: int, vocabulary_size: int,
                        with_labels: bool) -> dict:
    """Serialized records (B,) -> {input_ids, attention_mask[, labels]}: int32 (B, L).

    Args:
        paths: string (B,) the file each record came from (for messages only).
        record_indices: int64 (B,) each record's index in its file.
        records: string (B,) serialized `tf.train.Example`s.
        length: L, the sequence length every feature must have.
        vocabulary_size: ids must lie in [0, vocabulary_size).
        with_labels: parse and check the `labels` feature too.

    Raises (when run) InvalidArgumentError with a `<<FILE: record N: feature ...>>`
    message for the first record that breaks a rule.
    """
    parsed = tf.io.parse_example(records, parse_spec(with_labels))
    rows = tf.shape(records)[0]
    problems = []  # (bad (B,) bool, message for row r) in the order a record is judged

    def count_per_row(sparse, flags):
        # Segment sums over the sparse rows; a missing feature has 0 values.
        return tf.math.unsorted_segment_sum(tf.cast(flags, tf.int32), sparse.indices[:, 0], rows)

    sizes = {}
    for name in (n for n in FEATURES if n in parsed):  # a record is judged in this order
        sparse = parsed[name]
        sizes[name] = count_per_row(sparse, tf.ones_like(sparse.values, tf.bool))  # (B,)
        problems.append((sizes[name] != length, _length_message(name, sizes[name], length)))

    ids = parsed["input_ids"]
    outside = (ids.values < 0) | (ids.values >= vocabulary_size)
    # The largest offending |id| of each row, for the message.
    worst = tf.math.unsorted_segment_max(tf.where(outside, tf.abs(ids.values), -1),
                                         ids.indices[:, 0], rows)
    problems.append((count_per_row(ids, outside) > 0, lambda r: tf.strings.join([
        "feature 'input_ids' holds id ", tf.strings.as_string(worst[r]),
        f" outside the vocabulary [0, {vocabulary_size})"])))
    mask = parsed["attention_mask"]
    problems.append((count_per_row(mask, (mask.values != 0) & (mask.values != 1)) > 0,
                     lambda r: tf.constant("feature 'attention_mask' holds values other than 0 and 1")))
    if with_labels:
        labels = parsed["labels"]
        bad = (labels.values != IGNORE_LABEL) & ((labels.values < 0) | (labels.values >= vocabulary_size))
        problems.append((count_per_row(labels, bad) > 0, lambda r: tf.constant(
            f"feature 'labels' holds a value that is neither {IGNORE_LABEL} nor a vocabulary id")))

    flags = tf.stack([bad for bad, _ in problems], axis=1)  # (B, problems)
    row_is_bad = tf.reduce_any(flags, axis=1)  # (B,)

    def fail():
        row = tf.argmax(tf.cast(row_is_bad, tf.int32), output_type=tf.int32)
        which = tf.argmax(tf.cast(flags[row], tf.int32), output_type=tf.int32)
        what = tf.switch_case(which, [lambda m=m: m(row) for _, m in problems])
        # tf.strings.format would quote the path; join keeps it as written.
        message = tf.strings.join(["<<", paths[row], ": record ",
                                   tf.strings.as_string(record_indices[row]), ": ", what, ">>"])
        with tf.control_dependencies([tf.debugging.Assert(False, [message], summarize=1)]):
            return tf.constant(False)

    checked = tf.cond(tf.reduce_any(row_is_bad), fail, lambda: tf.constant(True))
    with tf.control_dependencies([checked]):
        # Every row has exactly L values now, so the values are the (B, L) matrix.
        return {name: tf.reshape(tf.cast(sparse.values, tf.int32), [rows, length])
                for name, sparse in parsed.items()}


def _length_message(name, sizes, length):
    return lambda r: tf.strings.join([f"feature '{name}' has ", tf.strings.as_string(sizes[r]),
                                      f" values, expected {length}"])
