"""Turning what a user passes to `predict` into batched, sharded-ready model inputs.

Accepted: TFRecord path(s)/glob(s) (checked record by record, like training),
a `tf.data.Dataset` of dicts (batched or not), or a dict of numpy arrays.
Examples keep their order; the last batch is completed with padding examples
flagged `is_real = False`, which the caller drops from the result.

Every path works on whole batches: arrays already in memory are sliced and
completed with numpy; files and datasets are batched first in tf.data and then
checked with batched ops (one `parse_example` per batch for files). Both give the
same batches: the tokens and the `marks` from which the predict program chooses the
slots on the devices (`kroberta.model.predict_program`).
"""

import dataclasses
import os

import numpy as np
import tensorflow as tf

from kroberta.data import pipeline, rules
from kroberta.data.manifest import check_prepared_with
from kroberta.data.records import FEATURES, REQUIRED_FEATURES
from kroberta.errors import InputError
from kroberta.model.model_inputs import HF_NAMES
from kroberta.tokens import IGNORE_LABEL


@dataclasses.dataclass(frozen=True)
class Source:
    # global batch -> (a dataset of raw batches, the function that checks one of them (its
    # elements as arguments), inside a map, into a dict input_ids, attention_mask[, labels]:
    # int32 (b, L), b = the batch except in the last one); None when the examples are `columns`
    batches: object
    sequence_length: int
    has_labels: bool
    examples: int | None  # None when unknown without reading everything
    files: tuple[str, ...] = ()  # the TFRecord files read, to name a bad one
    columns: dict | None = None  # the examples as numpy arrays (N, L) int32, when given so
    replay: object = None  # () -> InputError | None: finds a record that failed to parse


def as_examples(inputs, config, tokenizer=None) -> Source:
    """`inputs` as a `Source`; `tokenizer` (the model's, or None) is compared with the one
    a prepared directory's manifest names, when the files come from one."""
    vocabulary = config.model.vocabulary_size
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    if isinstance(inputs, (list, tuple)):
        if not inputs:
            raise InputError(
                "inputs: an empty list; give TFRecord path(s), a "
                "tf.data.Dataset of dicts or a dict of numpy arrays"
            )
        inputs = [os.fspath(p) if isinstance(p, os.PathLike) else p for p in inputs]
    if isinstance(inputs, np.ndarray):  # bare token ids, as model.predict takes them
        inputs = {
            "input_ids": inputs,
            "attention_mask": (inputs != config.data.pad_token_id).astype(np.int32),
        }
    if isinstance(inputs, list) and all(isinstance(p, str) for p in inputs):
        spec = pipeline.inspect_files(pipeline.resolve_files(inputs, "inputs"), "inputs")
        # Another tokenizer's ids would be predicted on as if they were the model's.
        check_prepared_with(
            sorted({os.path.dirname(f) for f in spec.files}),
            "inputs",
            vocabulary,
            tokenizer,
            named="this model",
            tokenizer_owner="run",
            tokenizer_source="RUN_DIR/tokenizer.json",
        )
        source = Source(
            lambda batch: pipeline.file_batches(spec, vocabulary, batch),
            spec.sequence_length,
            spec.has_labels,
            spec.records,
            spec.files,
            replay=pipeline.replay_file_errors(spec, vocabulary),
        )
    elif isinstance(inputs, dict):
        source = _from_arrays(inputs, vocabulary)
    elif isinstance(inputs, tf.data.Dataset):
        source = _from_dataset(inputs, vocabulary)
    else:
        raise InputError(
            "inputs must be TFRecord path(s), a tf.data.Dataset of dicts or a "
            f"dict of numpy arrays, got {type(inputs).__name__}"
        )
    if source.sequence_length > config.model.max_sequence_length:
        raise InputError(
            f"inputs: sequences of {source.sequence_length} tokens, the model "
            f"takes at most {config.model.max_sequence_length}"
        )
    return source


# keras-hub's names for the model inputs, accepted for Hugging Face's.
KERAS_HUB_NAMES = {ours: theirs for theirs, ours in HF_NAMES.items()}  # keras-hub -> HF


def _from_arrays(arrays, vocabulary_size: int) -> Source:
    arrays = {KERAS_HUB_NAMES.get(name, name): value for name, value in arrays.items()}
    for name in REQUIRED_FEATURES:
        if name not in arrays:
            raise InputError(f"inputs: the dict has no {name!r} array (keys: {sorted(arrays)})")
    columns = {}
    for name in FEATURES:
        if name in arrays:
            try:
                value = np.asarray(arrays[name])
            except ValueError:  # rows of different lengths
                raise InputError(
                    f"inputs[{name!r}]: rows of different lengths; pad them "
                    "to one length (attention_mask 0 there)"
                ) from None
            if value.ndim != 2:
                raise InputError(f"inputs[{name!r}]: expected shape (N, L), got {value.shape}")
            if value.dtype.kind not in "iub":
                raise InputError(f"inputs[{name!r}]: expected integers, got {value.dtype} values")
            columns[name] = value.astype(np.int32)
    shapes = {n: v.shape for n, v in columns.items()}
    if len(set(shapes.values())) != 1:
        raise InputError(f"inputs: arrays have different shapes {shapes}")
    # JAX clamps out-of-range gathers: an id >= V would silently read another row.
    for name, (bad, text) in _value_rules(vocabulary_size).items():
        found = np.argwhere(bad(columns[name])) if name in columns else ()
        if len(found) and name == "attention_mask":
            raise InputError("inputs: attention_mask holds values other than 0 and 1")
        if len(found):
            row, col = found[0]
            raise InputError(f"inputs: {name}[{row}, {col}] = {columns[name][row, col]}{text}")
    n, length = columns["input_ids"].shape
    return Source(None, length, "labels" in columns, n, columns=columns)


def _value_rules(vocabulary_size: int) -> dict:
    """{feature: (its bad values, what makes one bad)}, for the arrays and datasets."""
    return {
        "input_ids": (
            lambda v: rules.bad_id(v, vocabulary_size),
            f" is outside the vocabulary [0, {vocabulary_size})",
        ),
        "attention_mask": (rules.bad_attention, " is neither 0 nor 1"),
        # A label outside the vocabulary: a NaN loss otherwise.
        "labels": (
            lambda v: rules.bad_label(v, vocabulary_size),
            f" is neither -100 (no loss) nor in the vocabulary [0, {vocabulary_size})",
        ),
    }


def _from_dataset(dataset, vocabulary_size: int) -> Source:
    spec = dataset.element_spec
    if isinstance(spec, dict) and set(KERAS_HUB_NAMES) & set(spec):  # keras-hub's names
        dataset = dataset.map(
            lambda example: {KERAS_HUB_NAMES.get(n, n): v for n, v in example.items()}
        )
        spec = dataset.element_spec
    if not isinstance(spec, dict) or "input_ids" not in spec or "attention_mask" not in spec:
        raise InputError(
            "inputs: a tf.data.Dataset must yield dicts with 'input_ids' and "
            f"'attention_mask', got {spec}"
        )
    batched_already = spec["input_ids"].shape.rank == 2
    length = spec["input_ids"].shape[-1]
    if length is None:
        raise InputError("inputs: the dataset's sequence length must be static")
    names = [n for n in FEATURES if n in spec]
    cardinality = int(dataset.cardinality())
    examples = cardinality if cardinality >= 0 and not batched_already else None
    if set(spec) != set(names):
        # Other keys may not batch (strings, ragged): keep only ours, whole batches at a time
        # when the dataset is batched already.
        dataset = dataset.map(lambda example: {n: example[n] for n in names})

    def batches(global_batch):
        # Cut into global batches first; every later op sees whole batches.
        ds = dataset.rebatch(global_batch) if batched_already else dataset.batch(global_batch)
        return ds.enumerate(), lambda k, columns: _checked_columns(
            {n: tf.cast(columns[n], tf.int32) for n in names}, k * global_batch, vocabulary_size
        )

    return Source(batches, length, "labels" in names, examples)


def _checked_columns(columns, first_example, vocabulary_size):
    """A batch (b, L) checked as a whole by `_value_rules`, in the dataset's map."""

    def ok(name, bad, text):
        values = columns[name]
        bad = bad(values)  # (b, L)

        def fail():
            where = tf.argmax(tf.reshape(tf.cast(bad, tf.int32), [-1]), output_type=tf.int32)
            row, col = where // tf.shape(values)[1], where % tf.shape(values)[1]
            message = tf.strings.format(
                f"<<inputs: example {{}}: {name}[{{}}] = {{}}{text}>>",
                (tf.cast(first_example, tf.int32) + row, col, values[row, col]),
            )
            with tf.control_dependencies([tf.debugging.Assert(False, [message], summarize=1)]):
                return tf.constant(False)

        return tf.cond(tf.reduce_any(bad), fail, lambda: tf.constant(True))

    checks = [
        ok(name, *rule) for name, rule in _value_rules(vocabulary_size).items() if name in columns
    ]
    with tf.control_dependencies(checks):
        return {n: tf.identity(v) for n, v in columns.items()}


def batched(source: Source, config, positions: str, global_batch: int):
    """Yields batches of numpy model inputs, each with `global_batch` rows: token_ids,
    padding_mask and marks, int32 (B, L), and the host's `is_real` bool (B,).

    `marks` are the positions to predict: the labels when the inputs carry them (-100 =
    none), else the <mask> tokens for positions="masked" and nothing for "all" (whose
    slots are every position)."""
    if source.columns is not None:
        return _array_batches(source.columns, config, positions, global_batch)
    return _dataset_batches(source, config, positions, global_batch).as_numpy_iterator()


def _array_batches(columns, config, positions: str, global_batch: int):
    for start in range(0, len(columns["input_ids"]), global_batch):
        part = {name: value[start : start + global_batch] for name, value in columns.items()}
        ids, attention = part["input_ids"], part["attention_mask"]  # (b, L)
        if "labels" in part:
            marks = part["labels"]
        elif positions == "all":
            marks = np.full(ids.shape, IGNORE_LABEL, np.int32)
        else:
            marks = np.where(
                (ids == config.data.mask_token_id) & (attention > 0), ids, IGNORE_LABEL
            )
        rows = len(ids)
        batch = {
            "token_ids": ids,
            "padding_mask": attention,
            "marks": marks,
            "is_real": np.ones((rows,), bool),
        }
        if rows < global_batch:  # completed with padding examples (dropped from every result)
            batch = {
                name: np.pad(
                    value,
                    [(0, global_batch - rows)] + [(0, 0)] * (value.ndim - 1),
                    constant_values=pipeline.padding_value(name, config.data.pad_token_id),
                )
                for name, value in batch.items()
            }
        yield batch


def _dataset_batches(source: Source, config, positions: str, global_batch: int):
    mask_id = config.data.mask_token_id
    has_labels = source.has_labels

    def to_inputs(columns):
        ids, attention = columns["input_ids"], columns["attention_mask"]  # (b, L)
        if has_labels:
            marks = tf.cast(columns["labels"], tf.int32)
        elif positions == "all":
            marks = tf.fill(tf.shape(ids), IGNORE_LABEL)
        else:
            marks = tf.where((ids == mask_id) & (attention > 0), ids, IGNORE_LABEL)
        batch = {
            "token_ids": ids,
            "padding_mask": attention,
            "marks": marks,
            "is_real": tf.ones([tf.shape(ids)[0]], tf.bool),
        }
        # The last batch is completed with padding examples (dropped from every result).
        missing = -tf.shape(ids)[0] % global_batch
        return {
            name: tf.pad(
                value,
                [[0, missing]] + [[0, 0]] * (value.shape.rank - 1),
                constant_values=tf.cast(
                    pipeline.padding_value(name, config.data.pad_token_id), value.dtype
                ),
            )
            for name, value in batch.items()
        }

    # One map call for several batches, the source's check and these inputs together, then
    # cut into batches (as training: each op's fixed cost paid once for them all; every
    # part is a whole padded batch, so the cut drops nothing and gives the static shape).
    ds, check = source.batches(pipeline.batches_per_call(global_batch) * global_batch)
    ds = ds.map(
        lambda *element: to_inputs(check(*element)),
        num_parallel_calls=pipeline.parallel_batches(),
        deterministic=True,
    )
    return ds.rebatch(global_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
