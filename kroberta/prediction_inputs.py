"""Turning what a user passes to `predict` into batched, sharded-ready model inputs.

Accepted: TFRecord path(s)/glob(s) (checked record by record, like training),
a `tf.data.Dataset` of dicts (batched or not), or a dict of numpy arrays.
Examples keep their order; the last batch is completed with padding examples
flagged `is_real = False`, which the caller drops from the result.

Arrays already in memory are batched with numpy, vectorised over the batch: a
tf.data pipeline mapping one example at a time cost ~10 ms of the two cores per
batch of 64 (plus its set-up on every call), about 8% of a seed predict step.
Files and datasets go through tf.data; both paths give the same batches.
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
    dataset: tf.data.Dataset | None  # unbatched dicts: input_ids, attention_mask[, labels] (L,)
    # int32; None when the examples are `columns`
    sequence_length: int
    has_labels: bool
    examples: int | None  # None when unknown without reading everything
    files: tuple[str, ...] = ()  # the TFRecord files read, to name a bad one
    columns: dict | None = None  # the examples as numpy arrays (N, L) int32, when given so


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
    return Source(None, length, "labels" in columns, n, columns=columns)


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
    """Yields batches of numpy model inputs plus `valid`, `labels` (at the slots),
    `is_real` and `dropped`, each with `global_batch` rows."""
    if source.columns is not None:
        return _array_batches(source.columns, config, slots, positions, global_batch)
    return _dataset_batches(source, config, slots, positions, global_batch).as_numpy_iterator()


def _filler(config, length: int, width: int, rows: int) -> dict:
    """`rows` padding examples: no real tokens, no slots; dropped from every result."""
    return {
        "token_ids": np.full((rows, length), config.data.pad_token_id, np.int32),
        "padding_mask": np.zeros((rows, length), np.int32),
        "mask_positions": np.zeros((rows, width), np.int32),
        "valid": np.zeros((rows, width), bool),
        "labels": np.full((rows, width), IGNORE_LABEL, np.int32),
        "is_real": np.zeros((rows,), bool),
        "dropped": np.zeros((rows,), np.int32),
    }


def static_slots_numpy(marks: np.ndarray, slots: int):
    """`masking.static_slots` over a batch: marks (n, L), -100 = not predicted.

    Returns positions (n, M) int32 (the earliest marked positions, 0 in unused
    slots), slot_marks (n, M) int32 (-100 in unused slots) and dropped (n,) int32.
    """
    rows, length = marks.shape
    marked = marks != IGNORE_LABEL
    count = marked.sum(1)
    # Marked positions first, each group in position order.
    order = np.argsort(~marked, axis=1, kind="stable")  # (n, L)
    if slots > length:
        order = np.pad(order, ((0, 0), (0, slots - length)))
    valid = np.arange(slots) < np.minimum(count, slots)[:, None]  # (n, M)
    where = np.where(valid, order[:, :slots], 0).astype(np.int32)
    slot_marks = np.where(valid, np.take_along_axis(marks, where, axis=1), IGNORE_LABEL)
    return where, slot_marks.astype(np.int32), np.maximum(count - slots, 0).astype(np.int32)


def _array_batches(columns, config, slots: int, positions: str, global_batch: int):
    ids_all, attention_all = columns["input_ids"], columns["attention_mask"]
    labels_all = columns.get("labels")
    total, length = ids_all.shape
    width = length if positions == "all" else slots
    for start in range(0, total, global_batch):
        ids = ids_all[start:start + global_batch]
        attention = attention_all[start:start + global_batch]
        labels = None if labels_all is None else labels_all[start:start + global_batch]
        rows = len(ids)
        if positions == "all":
            where = np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length))
            valid = attention > 0
            slot_labels = labels if labels is not None else np.full((rows, length), IGNORE_LABEL)
            dropped = np.zeros((rows,), np.int32)
        else:
            # Labelled positions when labels are given, else the <mask> tokens.
            marks = labels if labels is not None else np.where(
                (ids == config.data.mask_token_id) & (attention > 0), ids, IGNORE_LABEL)
            where, slot_marks, dropped = static_slots_numpy(marks, slots)
            valid = slot_marks != IGNORE_LABEL
            slot_labels = slot_marks if labels is not None else np.full((rows, slots), IGNORE_LABEL)
        batch = {"token_ids": ids, "padding_mask": attention, "mask_positions": where,
                 "valid": valid, "labels": slot_labels, "is_real": np.ones((rows,), bool),
                 "dropped": dropped}
        batch = {name: np.asarray(value, dtype=_DTYPES[name]) for name, value in batch.items()}
        if rows < global_batch:
            filler = _filler(config, length, width, global_batch - rows)
            batch = {name: np.concatenate([batch[name], filler[name]]) for name in batch}
        yield batch


_DTYPES = {"token_ids": np.int32, "padding_mask": np.int32, "mask_positions": np.int32,
           "valid": bool, "labels": np.int32, "is_real": bool, "dropped": np.int32}


def _dataset_batches(source: Source, config, slots: int, positions: str, global_batch: int):
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
