"""Turning what a user passes to `predict` into batched, sharded-ready model inputs.

Accepted: TFRecord path(s)/glob(s) (checked record by record, like training),
a `tf.data.Dataset` of dicts (batched or not), or a dict of numpy arrays.
Examples keep their order; the last batch is completed with padding examples
flagged `is_real = False`, which the caller drops from the result.
"""

import dataclasses

import numpy as np
import tensorflow as tf

from kroberta import data as data_lib
from kroberta.masking import IGNORE_LABEL, static_slots

AUTOTUNE = tf.data.AUTOTUNE


class InputError(ValueError):
    """The inputs cannot be predicted on; the message says why."""


@dataclasses.dataclass(frozen=True)
class Source:
    dataset: tf.data.Dataset  # unbatched dicts: input_ids, attention_mask[, labels] (L,) int32
    sequence_length: int
    has_labels: bool
    examples: int | None  # None when unknown without reading everything
    files: tuple[str, ...] = ()  # the TFRecord files read, to name a bad one


def as_examples(inputs, config) -> Source:
    vocabulary = config.model.vocabulary_size
    if isinstance(inputs, (str, list, tuple)) and all(isinstance(p, str) for p in
                                                       ([inputs] if isinstance(inputs, str) else inputs)):
        patterns = [inputs] if isinstance(inputs, str) else list(inputs)
        spec = data_lib.inspect_files(data_lib.resolve_files(patterns, "inputs"), "inputs")
        if spec.sequence_length > config.model.max_sequence_length:
            raise InputError(f"inputs: sequences of {spec.sequence_length} tokens, the model "
                             f"takes at most {config.model.max_sequence_length}")
        return Source(data_lib.read_examples(spec, vocabulary), spec.sequence_length,
                      spec.has_labels, spec.records, spec.files)
    if isinstance(inputs, dict):
        return _from_arrays(inputs, config)
    if isinstance(inputs, tf.data.Dataset):
        return _from_dataset(inputs, config)
    raise InputError(
        "inputs must be TFRecord path(s), a tf.data.Dataset of dicts or a dict of numpy arrays, "
        f"got {type(inputs).__name__}")


def _from_arrays(arrays, config) -> Source:
    for name in ("input_ids", "attention_mask"):
        if name not in arrays:
            raise InputError(f"inputs: the dict has no {name!r} array (keys: {sorted(arrays)})")
    columns = {}
    for name in ("input_ids", "attention_mask", "labels"):
        if name in arrays:
            value = np.asarray(arrays[name])
            if value.ndim != 2:
                raise InputError(f"inputs[{name!r}]: expected shape (N, L), got {value.shape}")
            columns[name] = value.astype(np.int32)
    shapes = {n: v.shape for n, v in columns.items()}
    if len(set(shapes.values())) != 1:
        raise InputError(f"inputs: arrays have different shapes {shapes}")
    n, length = columns["input_ids"].shape
    _check_values(columns, config, "inputs")
    if length > config.model.max_sequence_length:
        raise InputError(f"inputs: sequences of {length} tokens, the model takes at most "
                         f"{config.model.max_sequence_length}")
    return Source(tf.data.Dataset.from_tensor_slices(columns), length, "labels" in columns, n)


def _check_values(columns, config, where):
    # JAX clamps out-of-range gathers: an id >= V would silently read another row.
    ids = columns["input_ids"]
    bad = np.argwhere((ids < 0) | (ids >= config.model.vocabulary_size))
    if len(bad):
        row, col = bad[0]
        raise InputError(f"{where}: input_ids[{row}, {col}] = {ids[row, col]} is outside the "
                         f"vocabulary [0, {config.model.vocabulary_size})")
    mask = columns["attention_mask"]
    if not np.isin(mask, (0, 1)).all():
        raise InputError(f"{where}: attention_mask holds values other than 0 and 1")


def _from_dataset(dataset, config) -> Source:
    spec = dataset.element_spec
    if not isinstance(spec, dict) or "input_ids" not in spec or "attention_mask" not in spec:
        raise InputError("inputs: a tf.data.Dataset must yield dicts with 'input_ids' and "
                         f"'attention_mask', got {spec}")
    if spec["input_ids"].shape.rank == 2:
        dataset = dataset.unbatch()
        spec = dataset.element_spec
    length = spec["input_ids"].shape[0]
    if length is None:
        raise InputError("inputs: the dataset's sequence length must be static")
    names = [n for n in ("input_ids", "attention_mask", "labels") if n in spec]
    vocabulary = config.model.vocabulary_size

    def select(example):
        out = {n: tf.cast(example[n], tf.int32) for n in names}
        checks = [tf.debugging.assert_less(out["input_ids"], vocabulary,
                                           message="inputs: input_ids outside the vocabulary"),
                  tf.debugging.assert_non_negative(out["input_ids"],
                                                   message="inputs: negative input_ids")]
        with tf.control_dependencies(checks):
            return {n: tf.identity(v) for n, v in out.items()}

    cardinality = int(dataset.cardinality())
    examples = cardinality if cardinality >= 0 else None
    return Source(dataset.map(select, num_parallel_calls=AUTOTUNE, deterministic=True), length,
                  "labels" in names, examples)


def batched(source: Source, config, slots: int, positions: str, global_batch: int):
    """Batches of model inputs plus `valid`, `labels` (at the slots), `is_real`, `dropped`."""
    length = source.sequence_length
    mask_id = config.data.mask_token_id
    has_labels = source.has_labels

    def to_inputs(example):
        ids, attention = example["input_ids"], example["attention_mask"]
        if positions == "all":
            where = tf.range(length, dtype=tf.int32)
            valid = attention > 0
            labels = example["labels"] if has_labels else tf.fill([length], IGNORE_LABEL)
            dropped = tf.constant(0, tf.int32)
        else:
            # Labelled positions when labels are given, else the <mask> tokens.
            marks = example["labels"] if has_labels else tf.where(
                (ids == mask_id) & (attention > 0), ids, IGNORE_LABEL)
            where, slot_marks, dropped = static_slots(marks, slots)
            valid = slot_marks != IGNORE_LABEL
            labels = slot_marks if has_labels else tf.fill([slots], IGNORE_LABEL)
        return {"token_ids": ids, "padding_mask": attention, "mask_positions": where,
                "valid": valid, "labels": tf.cast(labels, tf.int32), "is_real": True,
                "dropped": tf.cast(dropped, tf.int32)}

    width = length if positions == "all" else slots
    filler = {
        "token_ids": tf.fill([length], tf.constant(config.data.pad_token_id, tf.int32)),
        "padding_mask": tf.zeros([length], tf.int32),
        "mask_positions": tf.zeros([width], tf.int32),
        "valid": tf.zeros([width], tf.bool),
        "labels": tf.fill([width], tf.constant(IGNORE_LABEL, tf.int32)),
        "is_real": tf.constant(False),
        "dropped": tf.constant(0, tf.int32),
    }
    ds = source.dataset.map(to_inputs, num_parallel_calls=AUTOTUNE, deterministic=True)
    ds = ds.concatenate(tf.data.Dataset.from_tensors(filler).repeat(global_batch - 1))
    return ds.batch(global_batch, drop_remainder=True).prefetch(AUTOTUNE)
