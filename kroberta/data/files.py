"""Inspecting the TFRecord files of a run or a predict call (`kroberta.data.file_patterns`
finds them).

`inspect_files` learns the sequence length and whether there are labels from the first
records, and counts the records of local files by walking their framing (no parsing),
so the pipelines know their sizes before reading.
"""

import dataclasses

import tensorflow as tf
from google.protobuf.message import DecodeError

from kroberta.config import DataConfig, ModelConfig
from kroberta.data.records import FEATURES, REQUIRED_FEATURES
from kroberta.data.tfrecord_files import frames
from kroberta.errors import ConfigError, InputError
from kroberta.storage import is_url


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """What the files hold, learnt from their first records."""

    files: tuple[str, ...]
    sequence_length: int
    has_labels: bool
    records: int | None = None  # total records, when every file is local (framing walked)
    file_records: tuple[int, ...] | None = None  # records per file, likewise


def _read_first_record(path: str):
    try:
        for record in tf.data.TFRecordDataset(path).take(1):
            return record.numpy()
    except tf.errors.DataLossError:
        raise InputError(f"{path}: record 0: corrupt or truncated TFRecord") from None
    except tf.errors.OpError as e:
        raise InputError(f"{path}: cannot be read: {e.message}") from None
    raise InputError(f"{path}: the file holds no records")


def inspect_files(files, key: str) -> DataSpec:
    """Checks every file's framing and first record before any compute is spent.

    Catches empty, truncated and unreadable files, missing features, wrong dtypes
    and sequence lengths that differ between files or between features.
    """
    lengths = {}
    has_labels = set()
    # Local files' records counted by walking their framing (a truncated tail is found
    # here, at start-up); None for remote files (gs://...).
    counts = [None if is_url(path) else sum(1 for _ in frames(path)) for path in files]
    for path in files:
        first = _read_first_record(path)
        try:
            example = tf.train.Example.FromString(first)
        except DecodeError:
            raise InputError(
                f"{path}: record 0: the payload is not a tf.train.Example (its bytes do not parse)"
            ) from None
        feature_map = example.features.feature
        for name in REQUIRED_FEATURES:
            if name not in feature_map:
                raise InputError(f"{path}: record 0: feature {name!r} is missing")
        per_feature = {}
        for name in FEATURES:
            if name not in feature_map:
                continue
            kind = feature_map[name].WhichOneof("kind")
            if kind != "int64_list":
                raise InputError(
                    f"{path}: record 0: feature {name!r} is {kind}, expected int64_list"
                )
            per_feature[name] = len(feature_map[name].int64_list.value)
        if len(set(per_feature.values())) != 1:
            raise InputError(f"{path}: record 0: features have different lengths {per_feature}")
        lengths[path] = next(iter(per_feature.values()))
        has_labels.add("labels" in feature_map)
    distinct = sorted(set(lengths.values()))
    if len(distinct) > 1:
        by_length = {n: next(p for p, m in lengths.items() if m == n) for n in distinct}
        raise InputError(f"{key}: files hold different sequence lengths: {by_length}")
    if len(has_labels) > 1:
        raise InputError(f"{key}: some files have a 'labels' feature and some do not")
    known = None not in counts
    return DataSpec(
        tuple(files),
        distinct[0],
        has_labels.pop(),
        sum(counts) if known else None,
        tuple(counts) if known else None,
    )


def check_against_model(spec: DataSpec, data: DataConfig, model: ModelConfig, key: str):
    if spec.sequence_length > model.max_sequence_length:
        raise ConfigError(
            f"{key}: sequences have length {spec.sequence_length} but "
            f"model.max_sequence_length={model.max_sequence_length}"
        )
    if data.masking == "static" and not spec.has_labels:
        raise ConfigError(
            f"{key}: data.masking='static' needs a 'labels' feature in the files, and these "
            "have none (`python -m kroberta.prepare` writes unmasked sequences); use "
            "--data.masking=dynamic (masks drawn as the data is read) or --data.masking=auto "
            "(static where the files carry labels)"
        )


def spec_records(spec: DataSpec) -> int:
    """The files' records, read once to count them when their framing was not walked."""
    if spec.records is not None:
        return spec.records
    return int(
        tf.data.TFRecordDataset(list(spec.files)).reduce(
            tf.constant(0, tf.int64), lambda n, _: n + 1
        )
    )
