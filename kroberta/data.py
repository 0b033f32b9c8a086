"""tf.data input pipelines: TFRecords in the seed's format -> masked, batched model inputs.

The record format (the seed's, and what `kroberta.prepare` writes): a
`tf.train.Example` with int64 features of one length L per dataset
    input_ids       (L,)  token ids
    attention_mask  (L,)  1 for real tokens, 0 for padding
    labels          (L,)  optional: -100 where there is no loss, else the original id

Training order: files -> interleave(records tagged with file and index) ->
shuffle(seeded) -> repeat -> enumerate -> skip(resume) -> map(parse, check,
mask) -> batch(drop_remainder) -> prefetch. Every element's masking is seeded by
(run seed, element index), so a resumed run sees exactly the examples and masks
an uninterrupted one would have.

TensorFlow here runs on the host CPU only; JAX owns the accelerators.
"""

import dataclasses
import os
import re
import struct

import numpy as np
import tensorflow as tf

from kroberta.config import ConfigError, DataConfig, ModelConfig
from kroberta.masking import IGNORE_LABEL, dynamic_mask, static_slots

FEATURES = ("input_ids", "attention_mask", "labels")
REQUIRED_FEATURES = ("input_ids", "attention_mask")
AUTOTUNE = tf.data.AUTOTUNE


class DataError(ValueError):
    """The data is malformed; the message names the file, record and feature."""


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """What the files hold, learnt from their first records."""

    files: tuple[str, ...]
    sequence_length: int
    has_labels: bool
    records: int | None = None  # total records, when every file is local (framing walked)


def resolve_files(patterns, key: str) -> tuple[str, ...]:
    """Expands files and globs in order; an unmatched pattern is an error naming `key`."""
    files = []
    for pattern in patterns:
        matched = sorted(tf.io.gfile.glob(pattern))
        if not matched:
            raise DataError(f"{key}: no file matches {pattern!r}")
        files.extend(m for m in matched if m not in files)
    return tuple(files)


def _read_first_record(path: str):
    try:
        for record in tf.data.TFRecordDataset(path).take(1):
            return record.numpy()
    except tf.errors.DataLossError:
        raise DataError(f"{path}: record 0: corrupt or truncated TFRecord") from None
    except tf.errors.OpError as e:
        raise DataError(f"{path}: cannot be read: {e.message}") from None
    raise DataError(f"{path}: the file holds no records")


def count_framed_records(path: str) -> int | None:
    """Walks a local TFRecord file's framing (headers only) and counts its records.

    TFRecord framing is: uint64 length, uint32 crc, data, uint32 crc. TensorFlow
    silently stops at a file cut inside a record header, so a truncated tail is
    found here, at start-up. Returns None for remote files (gs://...).
    """
    if "://" in path:
        return None
    size = os.path.getsize(path)
    offset = count = 0
    with open(path, "rb") as f:
        while offset < size:
            header = f.read(8)
            if len(header) < 8 or size - offset < 16:
                raise DataError(f"{path}: record {count}: truncated (the file ends inside a record "
                                f"header at byte {size})")
            (length,) = struct.unpack("<Q", header)
            end = offset + 8 + 4 + length + 4
            if end > size:
                raise DataError(f"{path}: record {count}: truncated (the record needs {length} "
                                f"bytes; the file ends at byte {size})")
            f.seek(end)
            offset, count = end, count + 1
    return count


def inspect_files(files, key: str) -> DataSpec:
    """Checks every file's framing and first record before any compute is spent.

    Catches empty, truncated and unreadable files, missing features, wrong dtypes
    and sequence lengths that differ between files or between features.
    """
    lengths = {}
    has_labels = set()
    counts = [count_framed_records(path) for path in files]
    for path in files:
        example = tf.train.Example.FromString(_read_first_record(path))
        feature_map = example.features.feature
        for name in REQUIRED_FEATURES:
            if name not in feature_map:
                raise DataError(f"{path}: record 0: feature {name!r} is missing")
        per_feature = {}
        for name in FEATURES:
            if name not in feature_map:
                continue
            kind = feature_map[name].WhichOneof("kind")
            if kind != "int64_list":
                raise DataError(f"{path}: record 0: feature {name!r} is {kind}, expected int64_list")
            per_feature[name] = len(feature_map[name].int64_list.value)
        if len(set(per_feature.values())) != 1:
            raise DataError(f"{path}: record 0: features have different lengths {per_feature}")
        lengths[path] = next(iter(per_feature.values()))
        has_labels.add("labels" in feature_map)
    distinct = sorted(set(lengths.values()))
    if len(distinct) > 1:
        by_length = {n: next(p for p, m in lengths.items() if m == n) for n in distinct}
        raise DataError(f"{key}: files hold different sequence lengths: {by_length}")
    if len(has_labels) > 1:
        raise DataError(f"{key}: some files have a 'labels' feature and some do not")
    records = None if None in counts else sum(counts)
    return DataSpec(tuple(files), distinct[0], has_labels.pop(), records)


def check_against_model(spec: DataSpec, data: DataConfig, model: ModelConfig, key: str):
    if spec.sequence_length > model.max_sequence_length:
        raise ConfigError(
            f"{key}: sequences have length {spec.sequence_length} but "
            f"model.max_sequence_length={model.max_sequence_length}"
        )
    if data.masking == "static" and not spec.has_labels:
        raise ConfigError(f"{key}: data.masking='static' needs a 'labels' feature in the files")


def _tagged_records(files_ds, cycle_length=4):
    # (file, index within file, serialized record): the tags let a bad record be
    # reported by name, whichever parallel map step meets it. cycle_length=1 reads
    # the files one after the other (input order, for prediction).
    def read(path):
        return tf.data.TFRecordDataset(path).enumerate().map(lambda i, r: (path, i, r))

    return files_ds.interleave(read, cycle_length=cycle_length, block_length=1,
                               num_parallel_calls=AUTOTUNE, deterministic=True)


def _parse_and_check(path, index, record, length: int, vocabulary_size: int, with_labels: bool):
    spec = {name: tf.io.VarLenFeature(tf.int64) for name in FEATURES}
    parsed = tf.io.parse_single_example(record, spec)
    out = {}
    checks = []
    for name in FEATURES:
        if name == "labels" and not with_labels:
            continue
        values = tf.sparse.to_dense(parsed[name])
        size = tf.shape(values)[0]
        checks.append((size == length, name, tf.strings.format(
            "has {} values, expected {}", (size, length))))
        out[name] = values
    # Each check must run only on well-shaped data, so shapes are asserted first.
    asserts = [_assert(ok, path, index, name, what) for ok, name, what in checks]
    with tf.control_dependencies(asserts):
        ids = tf.ensure_shape(tf.identity(out["input_ids"]), [length])
        mask = tf.ensure_shape(tf.identity(out["attention_mask"]), [length])
    bad_id = tf.reduce_any((ids < 0) | (ids >= vocabulary_size))
    bad_mask = tf.reduce_any((mask != 0) & (mask != 1))
    value_checks = [
        _assert(~bad_id, path, index, "input_ids", tf.strings.format(
            "holds id {} outside the vocabulary [0, {})",
            (tf.reduce_max(tf.where((ids < 0) | (ids >= vocabulary_size), tf.abs(ids), 0)),
             vocabulary_size))),
        _assert(~bad_mask, path, index, "attention_mask", "holds values other than 0 and 1"),
    ]
    result = {"input_ids": ids, "attention_mask": mask}
    if with_labels:
        labels = tf.ensure_shape(out["labels"], [length])
        bad_label = tf.reduce_any((labels != IGNORE_LABEL) & ((labels < 0) | (labels >= vocabulary_size)))
        value_checks.append(_assert(~bad_label, path, index, "labels",
                                    "holds a value that is neither -100 nor a vocabulary id"))
        result["labels"] = labels
    with tf.control_dependencies(value_checks):
        return {k: tf.cast(tf.identity(v), tf.int32) for k, v in result.items()}


def _assert(ok, path, index, feature, what):
    # tf.strings.format would quote string tensors; join keeps the path as written.
    message = tf.strings.join(["<<", path, ": record ", tf.strings.as_string(index),
                               ": feature '", feature, "' ", what, ">>"])
    return tf.debugging.Assert(ok, [message], summarize=1)


def _to_model_inputs(parsed, seed, data: DataConfig, slots: int, vocabulary_size: int):
    """(x, y): the model's input dict and the labels at the prediction slots."""
    if data.masking == "static":
        ids = parsed["input_ids"]
        positions, labels, _ = static_slots(parsed["labels"], slots)
    else:
        originals = parsed["input_ids"]
        if "labels" in parsed:
            # Files masked once (the seed's format): recover the unmasked text.
            originals = tf.where(parsed["labels"] != IGNORE_LABEL, parsed["labels"], originals)
        ids, positions, labels = dynamic_mask(
            originals, parsed["attention_mask"], seed,
            mask_rate=data.mask_rate, slots=slots, mask_token_id=data.mask_token_id,
            special_token_ids=data.special_token_ids, vocabulary_size=vocabulary_size,
        )
    x = {"token_ids": ids, "padding_mask": parsed["attention_mask"], "mask_positions": positions}
    return x, labels


def train_dataset(spec: DataSpec, data: DataConfig, vocabulary_size: int, global_batch: int,
                  seed: int, start_step: int = 0, shard: tuple[int, int] | None = None):
    """Infinite training batches of `global_batch`, starting after `start_step` batches.

    Returns a dataset of (x, y) with x = {token_ids (B, L), padding_mask (B, L),
    mask_positions (B, M)} and y = labels (B, M), all int32.

    With `shard=(count, index)` (one of `count` processes), `global_batch` is this
    process's share of a step and the process reads only its part of the data:
    every count-th file of each epoch's shuffled file list (all processes draw the
    same list), or every count-th record when there are fewer files than processes.
    Element i of process p stands for element i*count+p of the unsharded stream (its
    masking seed). With shuffle_buffer = 1, count dividing 4 and files of equal
    length (record sharding: any files), the processes' batches k together hold
    exactly the records and masks of the single-process batch k.
    """
    count, index = shard or (1, 0)
    by_file = count > 1 and len(spec.files) >= count
    # Epoch e reads the files in a stateless permutation of (seed, e), and the record
    # shuffle is not reseeded per iteration: the stream is a pure function of the seed,
    # however many times Keras iterates this dataset object (fit peeks at a batch to
    # build the model, then starts a new iterator).
    names = tf.constant(list(spec.files))
    files = tf.data.Dataset.range(2**62).flat_map(
        lambda epoch: tf.data.Dataset.from_tensor_slices(tf.random.experimental.stateless_shuffle(
            names, seed=tf.stack([tf.cast(seed, tf.int64), epoch]))))
    if by_file:
        files = files.shard(count, index)
    # The single-process interleave reads 4 files at a time; a file shard reads 4/count.
    ds = _tagged_records(files, cycle_length=max(1, 4 // count) if by_file else 4)
    if count > 1 and not by_file:
        ds = ds.shard(count, index)
    ds = ds.shuffle(data.shuffle_buffer, seed=seed, reshuffle_each_iteration=False)
    ds = ds.enumerate()
    # Skipping raw records is cheap: nothing is parsed or masked.
    ds = ds.skip(start_step * global_batch)
    if count > 1:
        ds = ds.map(lambda i, tagged: (i * count + index, tagged))

    parse = _parser(spec, data, vocabulary_size, seed)
    ds = ds.map(parse, num_parallel_calls=AUTOTUNE, deterministic=True)
    return ds.batch(global_batch, drop_remainder=True).prefetch(AUTOTUNE)


def eval_dataset(spec: DataSpec, data: DataConfig, vocabulary_size: int, global_batch: int,
                 seed: int, max_batches: int = 0, shard: tuple[int, int] | None = None):
    """Every validation example once, in file order, with the same masks on every call.

    The last batch is completed with padding examples whose labels are all -100,
    so no example is dropped and every batch has the shape the devices expect; the
    masked loss and metrics give the padding no weight. With `shard=(count, index)`
    each process yields its 1/count slice of every global batch (it reads all the
    files: validation sets are small).
    """
    count, index = shard or (1, 0)
    length, slots = spec.sequence_length, data.prediction_slots(spec.sequence_length)
    ds = _tagged_records(tf.data.Dataset.from_tensor_slices(list(spec.files))).enumerate()

    ds = ds.map(_parser(spec, data, vocabulary_size, seed), num_parallel_calls=AUTOTUNE,
                deterministic=True)
    filler = padding_example(length, slots, data.pad_token_id)
    ds = ds.concatenate(tf.data.Dataset.from_tensors(filler).repeat(global_batch - 1))
    # Global batch k is the slices k*count ... k*count+count-1; process p takes slice p.
    records = spec_records(spec)
    batches = -(-records // global_batch)
    ds = ds.batch(global_batch // count, drop_remainder=True)
    ds = ds.take(batches * count).shard(count, index)
    if max_batches:
        batches = min(batches, max_batches)
        ds = ds.take(max_batches)
    # A known length lets Keras end the evaluation without an "ran out of data" warning.
    return ds.apply(tf.data.experimental.assert_cardinality(batches)).prefetch(AUTOTUNE)


def spec_records(spec: DataSpec) -> int:
    return spec.records if spec.records is not None else count_records(spec.files)


def count_records(files) -> int:
    """Reads the files once to count their records (for finite, evaluated data)."""
    return int(tf.data.TFRecordDataset(list(files)).reduce(tf.constant(0, tf.int64),
                                                           lambda n, _: n + 1))


def _parser(spec: DataSpec, data: DataConfig, vocabulary_size: int, seed: int):
    """(element index, (file, record index, record)) -> (x, y), checked and masked."""
    length, slots = spec.sequence_length, data.prediction_slots(spec.sequence_length)

    def parse(index, tagged):
        path, record_index, record = tagged
        parsed = _parse_and_check(path, record_index, record, length, vocabulary_size,
                                  spec.has_labels)
        element_seed = tf.stack([tf.cast(seed, tf.int64), index])
        return _to_model_inputs(parsed, element_seed, data, slots, vocabulary_size)

    return parse


def read_examples(spec: DataSpec, vocabulary_size: int):
    """Every record of the files once, in order, checked: dicts of int32 (L,) arrays."""
    ds = _tagged_records(tf.data.Dataset.from_tensor_slices(list(spec.files)), cycle_length=1)

    def parse(path, record_index, record):
        return _parse_and_check(path, record_index, record, spec.sequence_length,
                                vocabulary_size, spec.has_labels)

    return ds.map(parse, num_parallel_calls=AUTOTUNE, deterministic=True)


def padding_example(length: int, slots: int, pad_token_id: int):
    """An all-padding example that carries no loss (labels -100 everywhere)."""
    x = {
        "token_ids": tf.fill([length], tf.constant(pad_token_id, tf.int32)),
        "padding_mask": tf.zeros([length], tf.int32),
        "mask_positions": tf.zeros([slots], tf.int32),
    }
    return x, tf.fill([slots], tf.constant(IGNORE_LABEL, tf.int32))


_ASSERT_MESSAGE = re.compile(r"<<(.*?)>>", re.S)


def explain_pipeline_error(error: Exception, files) -> DataError | None:
    """Turns a tf.data failure into a DataError naming file, record and feature."""
    if isinstance(error, tf.errors.InvalidArgumentError):
        found = _ASSERT_MESSAGE.search(error.message)
        if found:
            # The assertion op escapes quotes when it prints its data.
            return DataError(found.group(1).replace("\\'", "'").replace('\\"', '"'))
        return DataError(f"malformed record: {error.message.splitlines()[0]}")
    if isinstance(error, tf.errors.DataLossError):
        # TF's message has a byte offset but no file name: find the file.
        for path in files:
            count = 0
            try:
                for _ in tf.data.TFRecordDataset(path):
                    count += 1
            except tf.errors.DataLossError:
                return DataError(f"{path}: record {count}: corrupt or truncated TFRecord")
        return DataError(f"corrupt or truncated TFRecord: {error.message.splitlines()[0]}")
    return None


def count_labels_beyond_slots(spec: DataSpec, slots: int, sample: int = 2000) -> tuple[int, int]:
    """(sequences, labelled positions) among the first `sample` that exceed `slots`."""
    ds = tf.data.TFRecordDataset(list(spec.files)).take(sample)
    ds = ds.map(lambda r: tf.io.parse_single_example(
        r, {"labels": tf.io.FixedLenFeature([spec.sequence_length], tf.int64)})["labels"])
    over_sequences = over_labels = 0
    for labels in ds.batch(256).as_numpy_iterator():
        counts = (labels != IGNORE_LABEL).sum(axis=1)
        over_sequences += int((counts > slots).sum())
        over_labels += int(np.maximum(counts - slots, 0).sum())
    return over_sequences, over_labels
