"""tf.data input pipelines: TFRecords in the seed's format -> masked, batched model inputs.

The record format (the seed's, and what `kroberta.prepare` writes): a
`tf.train.Example` with int64 features of one length L per dataset
    input_ids       (L,)  token ids
    attention_mask  (L,)  1 for real tokens, 0 for padding
    labels          (L,)  optional: -100 where there is no loss, else the original id

Training order: epochs of records tagged with file and index (`epochs`: every
record once per epoch, shuffled within it) -> enumerate -> skip(resume) ->
batch the raw strings -> parse, check and mask the whole batch -> prefetch.
Parsing a batch at a time (one `parse_example`, checks as reductions, masking as
batched ops) is what lets one host feed an accelerator. Every element's mask is a
function of (run seed, element index), so a resumed run sees exactly the examples
and masks an uninterrupted one would have.

TensorFlow here runs on the host CPU only; JAX owns the accelerators.
"""

import dataclasses
import os
import struct

import numpy as np
import tensorflow as tf
from google.protobuf.message import DecodeError

from kroberta import epochs
from kroberta.bad_records import DataError, explain_pipeline_error, first_bad_record
from kroberta.batch_parsing import REQUIRED_FEATURES, parse_checked_batch
from kroberta.config import ConfigError, DataConfig, ModelConfig
from kroberta.masking import IGNORE_LABEL, dynamic_mask_batch, static_slots_batch
from kroberta.records import FEATURES

AUTOTUNE = tf.data.AUTOTUNE
__all__ = ["DataError", "DataSpec", "explain_pipeline_error", "first_bad_record", "FEATURES",
           "resolve_files", "inspect_files", "check_against_model", "train_dataset",
           "eval_dataset", "read_batches"]


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """What the files hold, learnt from their first records."""

    files: tuple[str, ...]
    sequence_length: int
    has_labels: bool
    records: int | None = None  # total records, when every file is local (framing walked)
    file_records: tuple[int, ...] | None = None  # records per file, likewise


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
        first = _read_first_record(path)
        try:
            example = tf.train.Example.FromString(first)
        except DecodeError:
            raise DataError(f"{path}: record 0: the payload is not a tf.train.Example "
                            "(its bytes do not parse)") from None
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
    known = None not in counts
    return DataSpec(tuple(files), distinct[0], has_labels.pop(), sum(counts) if known else None,
                    tuple(counts) if known else None)


def check_against_model(spec: DataSpec, data: DataConfig, model: ModelConfig, key: str):
    if spec.sequence_length > model.max_sequence_length:
        raise ConfigError(
            f"{key}: sequences have length {spec.sequence_length} but "
            f"model.max_sequence_length={model.max_sequence_length}"
        )
    if data.masking == "static" and not spec.has_labels:
        raise ConfigError(f"{key}: data.masking='static' needs a 'labels' feature in the files")




def _to_model_inputs(parsed, indices, seed, data: DataConfig, slots: int, vocabulary_size: int,
                     word_starts=None):
    """(x, y) of a batch: the model's input dict and the labels at the prediction slots.

    parsed: int32 (B, L) features; indices: int64 (B,) element indices (mask seeds);
    word_starts: bool (V,) for whole-word masking, else None.
    """
    if data.masking == "static":
        ids = parsed["input_ids"]
        positions, labels, _ = static_slots_batch(parsed["labels"], slots)
    else:
        originals = parsed["input_ids"]
        if "labels" in parsed:
            # Files masked once (the seed's format): recover the unmasked text.
            originals = tf.where(parsed["labels"] != IGNORE_LABEL, parsed["labels"], originals)
        ids, positions, labels = dynamic_mask_batch(
            originals, parsed["attention_mask"], seed, indices,
            mask_rate=data.mask_rate, slots=slots, mask_token_id=data.mask_token_id,
            special_token_ids=data.special_token_ids, vocabulary_size=vocabulary_size,
            word_starts=word_starts,
        )
    x = {"token_ids": ids, "padding_mask": parsed["attention_mask"], "mask_positions": positions}
    return x, labels


def _batch_parser(spec: DataSpec, data: DataConfig, vocabulary_size: int, seed: int,
                  word_starts=None):
    """(element indices (B,), (files, record indices, records) (B,)) -> (x, y)."""
    length, slots = spec.sequence_length, data.prediction_slots(spec.sequence_length)
    if data.whole_word_masking and word_starts is None:
        raise ConfigError("data.whole_word_masking: needs the tokenizer's word starts; give "
                          "data.dir (a directory made by prepare, with its tokenizer)")
    word_starts = word_starts if data.whole_word_masking else None

    def parse(indices, tagged):
        paths, record_indices, records = tagged
        # The fast parse: a missing feature or wrong length fails unnamed, and the
        # caller's replay (`replay_train_errors`, `replay_file_errors`) names it.
        parsed = parse_checked_batch(paths, record_indices, records, length=length,
                                     vocabulary_size=vocabulary_size, with_labels=spec.has_labels,
                                     lengths_named=False)
        return _to_model_inputs(parsed, indices, seed, data, slots, vocabulary_size, word_starts)

    return parse


def epoch_plan(spec: DataSpec, data: DataConfig, seed: int,
               shard: tuple[int, int] | None = None) -> epochs.EpochPlan:
    """How a process reads the training epochs (see `kroberta.epochs`)."""
    count, index = shard or (1, 0)
    if spec.records is not None and count > 1 and len(spec.files) < count and spec.records < count:
        raise DataError(f"{spec.files[0]}: {spec.records} record(s) cannot be shared by "
                        f"{count} processes")
    return epochs.EpochPlan(spec.files, spec.file_records, seed, data.shuffle_buffer, shard)


def train_dataset(spec: DataSpec, data: DataConfig, vocabulary_size: int, global_batch: int,
                  seed: int, start_step: int = 0, shard: tuple[int, int] | None = None,
                  word_starts=None):
    """Endless training batches of `global_batch`, starting after `start_step` batches.

    Returns a dataset of (x, y) with x = {token_ids (B, L), padding_mask (B, L),
    mask_positions (B, M)} and y = labels (B, M), all int32. The records come in
    epochs, each record once per epoch (see `kroberta.epochs`); a batch may span
    two epochs.

    With `shard=(count, index)` (one of `count` processes), `global_batch` is this
    process's share of a step and the process reads only its share of each epoch
    (by file when there are at least `count` files, else by record). Element i of
    process p stands for element i*count+p of the unsharded stream (its masking
    seed). With shuffle_buffer = 1, count dividing 4 and files of equal length
    (record sharding: any files), the processes' batches k together hold exactly
    the records and masks of the single-process batch k. `word_starts`: the
    tokenizer's (V,) word-start table, for `data.whole_word_masking`.
    """
    count, index = shard or (1, 0)
    ds = epoch_plan(spec, data, seed, shard).stream(start_step * global_batch)
    if count > 1:
        ds = ds.map(lambda i, tagged: (i * count + index, tagged))
    ds = ds.batch(global_batch, drop_remainder=True)
    parse = _batch_parser(spec, data, vocabulary_size, seed, word_starts)
    return ds.map(parse, num_parallel_calls=AUTOTUNE, deterministic=True).prefetch(AUTOTUNE)


def replay_train_errors(spec: DataSpec, data: DataConfig, vocabulary_size: int, seed: int,
                        start_step: int, steps: int, global_batch: int,
                        shard: tuple[int, int] | None = None):
    """A function naming the first bad record among the next `steps` training batches."""
    def replay():
        tagged = epoch_plan(spec, data, seed, shard).stream(start_step * global_batch)
        return first_bad_record(tagged.map(lambda i, t: t), length=spec.sequence_length,
                                vocabulary_size=vocabulary_size, with_labels=spec.has_labels,
                                max_records=steps * global_batch)

    return replay


def _file_order(spec: DataSpec):
    return epochs.read_tagged(tf.data.Dataset.from_tensor_slices(list(spec.files)))


def eval_dataset(spec: DataSpec, data: DataConfig, vocabulary_size: int, global_batch: int,
                 seed: int, max_batches: int = 0, shard: tuple[int, int] | None = None,
                 word_starts=None):
    """Every validation example once, in file order, with the same masks on every call.

    The last batch is completed with padding examples whose labels are all -100,
    so no example is dropped and every batch has the shape the devices expect; the
    masked loss and metrics give the padding no weight. With `shard=(count, index)`
    each process yields its 1/count slice of every global batch (it reads all the
    files: validation sets are small).
    """
    count, index = shard or (1, 0)
    parse = _batch_parser(spec, data, vocabulary_size, seed, word_starts)
    share = global_batch // count

    def parse_and_pad(indices, tagged):
        x, y = parse(indices, tagged)
        missing = global_batch - tf.shape(y)[0]
        x = {
            "token_ids": _pad_rows(x["token_ids"], missing, data.pad_token_id),
            "padding_mask": _pad_rows(x["padding_mask"], missing, 0),
            "mask_positions": _pad_rows(x["mask_positions"], missing, 0),
        }
        y = _pad_rows(y, missing, IGNORE_LABEL)
        # Global batch k: process p takes rows p*share ... (p+1)*share - 1.
        take = lambda t: tf.ensure_shape(t[index * share:(index + 1) * share], [share, None])
        return {k: take(v) for k, v in x.items()}, take(y)

    ds = _file_order(spec).enumerate().batch(global_batch)
    ds = ds.map(parse_and_pad, num_parallel_calls=AUTOTUNE, deterministic=True)
    batches = -(-spec_records(spec) // global_batch)
    if max_batches:
        batches = min(batches, max_batches)
        ds = ds.take(max_batches)
    # A known length lets Keras end the evaluation without an "ran out of data" warning.
    return ds.apply(tf.data.experimental.assert_cardinality(batches)).prefetch(AUTOTUNE)


def replay_file_errors(spec: DataSpec, vocabulary_size: int):
    """A function naming the first bad record of the files, in file order."""
    return lambda: first_bad_record(_file_order(spec), length=spec.sequence_length,
                                    vocabulary_size=vocabulary_size, with_labels=spec.has_labels)


def _pad_rows(tensor, rows, value):
    """Appends `rows` rows of `value` to a (B, W) tensor."""
    return tf.pad(tensor, [[0, rows], [0, 0]], constant_values=value)


def read_batches(spec: DataSpec, vocabulary_size: int, batch_size: int):
    """Every record of the files once, in order, checked: batches of int32 (b, L) dicts.

    The last batch may be shorter.
    """
    def parse(paths, record_indices, records):
        return parse_checked_batch(paths, record_indices, records, length=spec.sequence_length,
                                   vocabulary_size=vocabulary_size, with_labels=spec.has_labels,
                                   lengths_named=False)  # named by `replay_file_errors`

    ds = _file_order(spec).batch(batch_size)
    return ds.map(parse, num_parallel_calls=AUTOTUNE, deterministic=True)


def spec_records(spec: DataSpec) -> int:
    return spec.records if spec.records is not None else count_records(spec.files)


def count_records(files) -> int:
    """Reads the files once to count their records (for finite, evaluated data)."""
    return int(tf.data.TFRecordDataset(list(files)).reduce(tf.constant(0, tf.int64),
                                                           lambda n, _: n + 1))


def count_labels_beyond_slots(spec: DataSpec, slots: int, sample: int = 2000) -> tuple[int, int]:
    """(sequences, labelled positions) among the first `sample` that exceed `slots`."""
    ds = tf.data.TFRecordDataset(list(spec.files)).take(sample).batch(256)
    ds = ds.map(lambda r: tf.io.parse_example(
        r, {"labels": tf.io.FixedLenFeature([spec.sequence_length], tf.int64)})["labels"])
    over_sequences = over_labels = 0
    for labels in ds.as_numpy_iterator():
        counts = (labels != IGNORE_LABEL).sum(axis=1)
        over_sequences += int((counts > slots).sum())
        over_labels += int(np.maximum(counts - slots, 0).sum())
    return over_sequences, over_labels
