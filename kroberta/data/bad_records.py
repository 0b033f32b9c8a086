"""Naming the record behind a failed input pipeline: file, record index, feature.

The batched pipeline reports rule violations itself (`batch_parsing`). What it
cannot name is a payload that TensorFlow fails to parse at all (broken bytes, a
different proto, a feature of the wrong type): `parse_example` fails for the whole
batch with a message that names no record. Then the same stream is replayed, in
the same order and without the model, batch by batch, and the first batch that
fails is examined record by record.
"""

import functools
import re

import tensorflow as tf
from google.protobuf.message import DecodeError

from kroberta.data.batch_parsing import parse_checked_batch, parse_spec
from kroberta.data.records import FEATURES, REQUIRED_FEATURES
from kroberta.data.rules import FEATURE_KIND
from kroberta.errors import InputError

_ASSERT_MESSAGE = re.compile(r"<<(.*?)>>", re.S)
_OUT_OF_MEMORY = re.compile(r"OOM when allocating tensor with shape\[[\d,]*\]")
# TF quotes an unparseable payload's bytes in its error message and then fails to
# decode them: the pipeline raises UnicodeDecodeError instead of its own error.
PARSE_FAILURES = (tf.errors.InvalidArgumentError, UnicodeDecodeError)
_REPLAY_BATCH = 1024


def payload_problem(serialized: bytes, with_labels: bool) -> str | None:
    """Why a record's bytes are not a kroberta `tf.train.Example`, or None if they parse."""
    try:
        example = tf.train.Example.FromString(serialized)
    except DecodeError:
        return "the payload is not a tf.train.Example (its bytes do not parse)"
    for name in FEATURES if with_labels else REQUIRED_FEATURES:
        if name not in example.features.feature:
            continue  # missing features are reported by the length checks
        kind = example.features.feature[name].WhichOneof("kind")
        if kind != FEATURE_KIND:
            return (
                f"feature '{name}' has the wrong dtype: {kind or 'empty'}, expected {FEATURE_KIND}"
            )
    try:
        tf.io.parse_example(tf.constant([serialized]), parse_spec(with_labels))
    except PARSE_FAILURES as error:
        return f"the payload does not parse as a tf.train.Example ({_first_line(error)})"
    return None


def first_bad_record(
    tagged, *, length: int, vocabulary_size: int, with_labels: bool, max_records: int | None = None
) -> InputError | None:
    """Replays a stream of (file, record index, record) and names its first bad record.

    `max_records` bounds the replay (the part of the stream that was consumed).
    """
    if max_records is not None:
        tagged = tagged.take(max_records)

    check = tf.function(
        functools.partial(
            parse_checked_batch,
            length=length,
            vocabulary_size=vocabulary_size,
            with_labels=with_labels,
        )
    )
    for paths, indices, records in tagged.batch(_REPLAY_BATCH).as_numpy_iterator():
        try:
            check(paths, indices, records)
            continue
        except PARSE_FAILURES as error:
            named = _asserted(error)
            if named is not None:
                return named
        for path, index, record in zip(paths, indices, records):
            problem = payload_problem(record, with_labels)
            if problem is not None:
                return InputError(f"{path.decode()}: record {index}: {problem}")
            try:
                check(tf.constant([path]), tf.constant([index], tf.int64), tf.constant([record]))
            except PARSE_FAILURES as error:
                return _asserted(error) or InputError(
                    f"{path.decode()}: record {index}: {_first_line(error)}"
                )
    return None


def explain_pipeline_error(error: Exception, files, replay=None) -> InputError | None:
    """Turns a tf.data failure into a InputError naming file, record and feature.

    Args:
        error: what iterating the pipeline raised.
        files: the files the pipeline read (to find a corrupt TFRecord).
        replay: a function returning the pipeline's stream's `InputError` or None
            (e.g. `first_bad_record` bound to it), used when the error names no record.
    """
    if isinstance(error, PARSE_FAILURES):
        named = _asserted(error)
        if named is not None:
            return named
        found = replay() if replay is not None else None
        return found or InputError(f"malformed record: {_first_line(error)}")
    if isinstance(error, tf.errors.DataLossError):
        # TF's message has a byte offset but no file name: find the file.
        for path in files:
            count = 0
            try:
                for _ in tf.data.TFRecordDataset(path):
                    count += 1
            except tf.errors.DataLossError:
                return InputError(f"{path}: record {count}: corrupt or truncated TFRecord")
        return InputError(f"corrupt or truncated TFRecord: {_first_line(error)}")
    if isinstance(error, tf.errors.ResourceExhaustedError):
        # A batch too large for the host; TF's text names its ops, the shape is enough.
        found = _OUT_OF_MEMORY.search(error.message)
        return InputError(
            "the host ran out of memory building a batch"
            + (f" ({found.group()})" if found else "")
            + "; lower the batch size (batch_size, --batch-size)"
        )
    return None


def _asserted(error) -> InputError | None:
    if not isinstance(error, tf.errors.OpError):
        return None
    found = _ASSERT_MESSAGE.search(error.message)
    if found is None:
        return None
    # The assertion op escapes quotes when it prints its data.
    return InputError(found.group(1).replace("\\'", "'").replace('\\"', '"'))


def _first_line(error) -> str:
    # TF's internal op names ({{function_node ...}}, [Op:...], node names) mean nothing to a user.
    message = getattr(error, "message", None) or type(error).__name__
    text = message.splitlines()[0]
    text = re.sub(r"\{\{[^}]*\}\}\s*", "", text)
    text = re.sub(r"\s*\[Op:[^\]]*\]", "", text)
    return re.sub(r"\s*name:\s*\S*$", "", text).strip()


def describe_read_error(error) -> str:
    """What a TFRecord read failure means, in words: a corrupt record's byte offset when
    TensorFlow gives one, never its op names."""
    text = _first_line(error)
    offset = re.search(r"corrupted record at (\d+)", text)
    if offset:
        return f"bad checksum or length at byte {offset.group(1)}"
    return text
