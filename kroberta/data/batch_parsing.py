"""Parsing and checking a whole batch of serialized records in one go.

One `tf.io.parse_example` per batch, then every value rule of the record format
(`kroberta.data.rules`) as a tensor reduction over the batch. Only when a batch breaks a rule is a message
built, inside a `tf.cond` branch that healthy batches never run: it names the
first bad record of the batch (stream order) by file, record index and feature.

Two ways to parse. The pipelines parse with `FixedLenFeature`s, which decode
straight into (B, L) tensors: the fast path, several times cheaper than ragged
parsing on long sequences. A record whose feature is missing or has the wrong length then fails
`parse_example` as a whole with a message that names no record, and the caller
replays the stream through the named path (`lengths_named=True`): `RaggedFeature`s,
where a wrong length stays visible, so the message can name record and feature.

The message is wrapped in `<<...>>` so `data.explain_pipeline_error` can lift it
out of TensorFlow's error text. A payload that is not a `tf.train.Example` at all
makes `parse_example` itself fail; that error names nothing, and the caller finds
the record by replaying the stream (`data.first_bad_record`).
"""

import tensorflow as tf

from kroberta.data import rules
from kroberta.data.records import FEATURES, REQUIRED_FEATURES


def parse_spec(with_labels: bool, length: int | None = None) -> dict:
    """The features to parse: fixed (L,) columns with a `length` (the fast path), else
    ragged ones. Ragged, not VarLen: row splits instead of an (n, 2) index per value, and
    a wrong length stays visible instead of failing inside TF as a FixedLenFeature would."""
    names = FEATURES if with_labels else REQUIRED_FEATURES
    if length is not None:
        return {name: tf.io.FixedLenFeature([length], tf.int64) for name in names}
    return {name: tf.io.RaggedFeature(tf.int64, row_splits_dtype=tf.int32) for name in names}


def parse_checked_batch(
    paths,
    record_indices,
    records,
    *,
    length: int,
    vocabulary_size: int,
    with_labels: bool,
    lengths_named: bool = True,
) -> dict:
    """Serialized records (B,) -> {input_ids, attention_mask[, labels]}: int32 (B, L).

    Args:
        paths: string (B,) the file each record came from (for messages only).
        record_indices: int64 (B,) each record's index in its file.
        records: string (B,) serialized `tf.train.Example`s.
        length: L, the sequence length every feature must have.
        vocabulary_size: ids must lie in [0, vocabulary_size).
        with_labels: parse and check the `labels` feature too.
        lengths_named: False for the fast path: a missing feature or a wrong
            length then fails without naming the record (see the module docstring).

    Raises (when run) InvalidArgumentError with a `<<FILE: record N: feature ...>>`
    message for the first record that breaks a rule.
    """
    if not lengths_named:
        dense = tf.io.parse_example(records, parse_spec(with_labels, length))
        return _checked_values(paths, record_indices, dense, vocabulary_size, with_labels)
    parsed = tf.io.parse_example(records, parse_spec(with_labels))
    names = [n for n in FEATURES if n in parsed]  # a record is judged in this order
    rows = tf.shape(records)[0]

    def ragged_rows(name, score):
        # Per-row maxima over the ragged values: the error path, any lengths.
        return tf.math.unsorted_segment_max(
            score(parsed[name].flat_values), parsed[name].value_rowids(), rows
        )

    # 1. Lengths (a missing feature has 0 values). When one is wrong, the message
    # names the first bad record of the batch, whatever its problem.
    sizes = {name: parsed[name].row_lengths() for name in names}  # (B,) each
    length_problems = [(sizes[n] != length, _length_message(n, sizes[n], length)) for n in names]
    checked = _fail_on_first(
        paths,
        record_indices,
        tf.reduce_any(tf.stack([b for b, _ in length_problems]), axis=0),
        lambda: length_problems + _value_problems(ragged_rows, vocabulary_size, with_labels),
    )
    # Only with every length right are the values a (B, L) matrix.
    with tf.control_dependencies([checked]):
        dense = {name: tf.reshape(parsed[name].flat_values, [rows, length]) for name in names}
    return _checked_values(paths, record_indices, dense, vocabulary_size, with_labels)


def _checked_values(paths, record_indices, dense, vocabulary_size: int, with_labels: bool):
    """2. Values, as reductions over the dense (B, L) batch; int32 features out."""

    def dense_rows(name, score):
        return tf.reduce_max(score(dense[name]), axis=1)

    # Healthy batches pay for a few whole-batch min/max reductions; the per-row
    # problems are worked out only inside the failing branch.
    checked = _fail_on_first(
        paths,
        record_indices,
        ~_values_in_range(dense, vocabulary_size, with_labels),
        lambda: _value_problems(dense_rows, vocabulary_size, with_labels),
    )
    with tf.control_dependencies([checked]):
        return {name: tf.cast(value, tf.int32) for name, value in dense.items()}


def _rules(with_labels: bool):
    """The value rules (`rules.VALUE_RULES`) for the features parsed, in order."""
    return [rule for rule in rules.VALUE_RULES if with_labels or rule.feature != "labels"]


def _values_in_range(dense, vocabulary_size: int, with_labels: bool):
    """() bool: every value of the (B, L) int64 batch obeys the value rules."""

    def at_most(values, high):
        # 0 <= values <= high in one pass: as uint64 (a free bitcast) a negative int64
        # is above 2^63, so one maximum checks both ends.
        return tf.reduce_max(tf.bitcast(values, tf.uint64)) <= high

    ok = None
    for rule in _rules(with_labels):
        values = dense[rule.feature]
        if rule.exempt is not None:  # the exempt value counts as 0, which is in range
            values = tf.where(values == rule.exempt, tf.zeros_like(values), values)
        in_range = at_most(values, rule.upper_bound(vocabulary_size) - 1)
        ok = in_range if ok is None else ok & in_range
    return ok


def _value_problems(row_max, vocabulary_size: int, with_labels: bool):
    """[(bad (B,), row -> message)] for the value rules.

    row_max(name, score) -> (B,): the row maxima of score(values) for a feature.
    """
    problems = []
    for rule in _rules(with_labels):

        def bad(v, rule=rule):
            return rule.bad(v, vocabulary_size)

        words = f"feature '{rule.feature}' " + rule.holds(rule.upper_bound(vocabulary_size))
        if "{}" in words:  # the message names the largest offending |value| of the row
            worst = row_max(rule.feature, lambda v, bad=bad: tf.where(bad(v), tf.abs(v), -1))
            before, after = words.split("{}")
            problems.append(
                (
                    worst >= 0,
                    lambda r, worst=worst, before=before, after=after: tf.strings.join(
                        [before, tf.strings.as_string(worst[r]), after]
                    ),
                )
            )
        else:
            flagged = row_max(rule.feature, lambda v, bad=bad: tf.cast(bad(v), tf.int64)) > 0
            problems.append((flagged, lambda r, words=words: tf.constant(words)))
    return problems


def _fail_on_first(paths, record_indices, any_bad, problems):
    """A bool op that raises naming the first bad row and its first problem.

    any_bad: (B,) bool, the rows that break a rule, or () bool, whether any does.
    problems: () -> [(bad (B,) bool, row -> message string)] in the order a record
    is judged, built only on failure.
    """

    def fail():
        problems_now = problems()
        flags = tf.stack([bad for bad, _ in problems_now], axis=1)  # (B, problems)
        row_is_bad = tf.reduce_any(flags, axis=1)  # (B,)
        row = tf.argmax(tf.cast(row_is_bad, tf.int32), output_type=tf.int32)
        which = tf.argmax(tf.cast(flags[row], tf.int32), output_type=tf.int32)
        what = tf.switch_case(which, [lambda m=m: m(row) for _, m in problems_now])
        # tf.strings.format would quote the path; join keeps it as written.
        message = tf.strings.join(
            [
                "<<",
                paths[row],
                ": record ",
                tf.strings.as_string(record_indices[row]),
                ": ",
                what,
                ">>",
            ]
        )
        with tf.control_dependencies([tf.debugging.Assert(False, [message], summarize=1)]):
            return tf.constant(False)

    return tf.cond(tf.reduce_any(any_bad), fail, lambda: tf.constant(True))


def _length_message(name, sizes, length):
    def words(r):
        parts = rules.wrong_length(tf.strings.as_string(sizes[r]), length)
        return tf.strings.join([f"feature '{name}' " + parts[0], *parts[1:]])

    return words
