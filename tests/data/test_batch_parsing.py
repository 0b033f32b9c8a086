"""Batch-first parsing, checking and masking: the right record named, masks per element."""

import dataclasses
import math
import random

import numpy as np
import pytest
import tensorflow as tf

from kroberta.config import Config
from kroberta.data import pipeline
from kroberta.data.check import check_records
from kroberta.data.synthetic import make_sequences
from kroberta.inference import inputs
from kroberta.tokens import IGNORE_LABEL
from tests.conftest import serialize_example, write_records
from tests.test_masking import dynamic_mask_batch

L, V = 32, 512


def _example(ids, mask, labels=None, kinds=None):
    floats = [name for name, kind in (kinds or {}).items() if kind == "float"]
    return serialize_example({"input_ids": ids, "attention_mask": mask, "labels": labels}, floats)


_write = write_records


def _records(count, seed=1):
    ids, mask = make_sequences(count, L, V, seed=seed)
    return ids, mask, np.full_like(ids, -100)


def _plant(kind, ids, mask, labels, row):
    """The payload of record `row` with one defect, and the words its error must hold."""
    ids, mask, labels = ids[row].copy(), mask[row].copy(), labels[row].copy()
    if kind == "id":
        ids[3] = V + 11
        return _example(ids, mask, labels), f"feature 'input_ids' holds id {V + 11} outside"
    if kind == "length":
        return _example(ids[:-2], mask[:-2], labels[:-2]), f"feature 'input_ids' has {L - 2} values"
    if kind == "mask":
        mask[1] = 7
        return _example(
            ids, mask, labels
        ), "feature 'attention_mask' holds values other than 0 and 1"
    if kind == "label":
        labels[2] = V + 1
        return _example(ids, mask, labels), "feature 'labels' holds a value that is neither -100"
    if kind == "missing":
        return _example(ids, None, labels), "feature 'attention_mask' has 0 values"
    if kind == "payload":
        return _example(ids, mask, labels)[
            :-9
        ] + b"\xff\xfe", "the payload is not a tf.train.Example"
    if kind == "dtype":
        return _example(
            ids, mask, labels, {"labels": "float"}
        ), "feature 'labels' has the wrong dtype: float_list"
    raise ValueError(kind)


def _first_error(spec, data=None, batch=64):
    data = data or dataclasses.replace(Config().data, shuffle_buffer=1)
    ds = pipeline.train_dataset(spec, data, V, batch, seed=0)
    with pytest.raises((tf.errors.OpError, UnicodeDecodeError)) as info:
        for _ in ds.take(4):
            pass
    replay = pipeline.replay_train_errors(spec, data, V, 0, 0, 4, batch)
    return str(pipeline.explain_pipeline_error(info.value, spec.files, replay=replay))


@pytest.mark.parametrize("kind", ["id", "length", "mask", "label", "missing", "payload", "dtype"])
@pytest.mark.parametrize("row", [64, 64 + 31, 64 + 63])  # first, middle, last of batch 1
def test_a_planted_defect_names_its_file_record_and_feature(tmp_path, kind, row):
    ids, mask, labels = _records(192)
    payloads = [_example(ids[i], mask[i], labels[i]) for i in range(192)]
    payloads[row], words = _plant(kind, ids, mask, labels, row)
    path = _write(tmp_path / "planted.tfrecord", payloads)
    message = _first_error(pipeline.inspect_files([path], "data.train"))
    assert message.startswith(f"{path}: record {row}: "), message
    assert words in message
    assert "{{" not in message and "node" not in message


@pytest.mark.parametrize(
    "kinds",
    [("mask", "id"), ("length", "mask"), ("id", "length"), ("payload", "id"), ("id", "payload")],
)
def test_two_bad_records_in_one_batch_name_the_first(tmp_path, kinds):
    ids, mask, labels = _records(128)
    payloads = [_example(ids[i], mask[i], labels[i]) for i in range(128)]
    payloads[70], words = _plant(kinds[0], ids, mask, labels, 70)
    payloads[90], _ = _plant(kinds[1], ids, mask, labels, 90)
    path = _write(tmp_path / "two.tfrecord", payloads)
    message = _first_error(pipeline.inspect_files([path], "data.train"))
    assert message.startswith(f"{path}: record 70: ") and words in message, message


def _reference_problem(payload):
    """Is this payload a valid kroberta record (labels included)? The test's own rules."""
    try:
        example = tf.train.Example.FromString(payload)
    except Exception:
        return True
    for name in ("input_ids", "attention_mask", "labels"):
        feature = example.features.feature
        if name not in feature or feature[name].WhichOneof("kind") != "int64_list":
            return True
        values = np.asarray(feature[name].int64_list.value)
        if len(values) != L:
            return True
        if name == "input_ids" and ((values < 0) | (values >= V)).any():
            return True
        if name == "attention_mask" and not np.isin(values, (0, 1)).all():
            return True
        if name == "labels" and (((values < 0) | (values >= V)) & (values != -100)).any():
            return True
    return False


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_fuzzed_payloads_name_the_first_damaged_record(tmp_path, seed):
    rng = random.Random(seed)
    ids, mask, labels = _records(400, seed=seed + 3)
    payloads = [_example(ids[i], mask[i], labels[i]) for i in range(400)]
    for row in rng.sample(range(5, 400), 40):  # valid framing and CRCs, damaged bytes
        raw = bytearray(payloads[row])
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        if rng.random() < 0.3:
            raw = raw[: rng.randrange(1, len(raw))]
        payloads[row] = bytes(raw)
    first = next(i for i, p in enumerate(payloads) if _reference_problem(p))
    path = _write(tmp_path / "fuzzed.tfrecord", payloads)
    spec = pipeline.inspect_files([path], "data.train")
    expected = f"{path}: record {first}: "
    # Training (one file, no shuffle: the stream is the file's order).
    assert _first_error(spec).startswith(expected)
    # Evaluation.
    ds = pipeline.eval_dataset(spec, Config().data, V, 64, 0)
    with pytest.raises((tf.errors.OpError, UnicodeDecodeError)) as info:
        list(ds)
    explained = pipeline.explain_pipeline_error(
        info.value, spec.files, replay=pipeline.replay_file_errors(spec, V)
    )
    assert str(explained).startswith(expected), explained
    # Prediction's input path.
    config = dataclasses.replace(
        Config(),
        model=dataclasses.replace(Config().model, vocabulary_size=V, max_sequence_length=L),
    )
    source = inputs.as_examples(path, config)
    with pytest.raises((tf.errors.OpError, UnicodeDecodeError)) as info:
        list(inputs.batched(source, config, "masked", 64))
    assert str(
        pipeline.explain_pipeline_error(info.value, source.files, replay=source.replay)
    ).startswith(expected)
    # --check names the same record first.
    report = check_records([path], vocabulary_size=V, sequence_length=L)
    assert report.defects[0].index == first


def test_dynamic_masks_do_not_depend_on_the_batch(tmp_path):
    ids, mask = make_sequences(64, L, V, seed=5)
    params = dict(
        mask_rate=0.3,
        slots=10,
        mask_token_id=4,
        special_token_ids=(0, 1, 2, 3, 4),
        vocabulary_size=V,
    )
    indices = np.arange(1000, 1064)
    whole = dynamic_mask_batch(ids, mask, 7, indices, **params)
    for size in (8, 1):
        parts = [
            dynamic_mask_batch(
                ids[s : s + size], mask[s : s + size], 7, indices[s : s + size], **params
            )
            for s in range(0, 64, size)
        ]
        for k in range(3):
            np.testing.assert_array_equal(np.concatenate([p[k] for p in parts]), whole[k])
    # And the training pipeline gives element i the same mask whatever its batch size.
    path = str(tmp_path / "m.tfrecord")
    from kroberta.data.synthetic import write_tfrecord

    write_tfrecord(path, ids, mask)
    spec = pipeline.inspect_files([path], "t")
    data = dataclasses.replace(Config().data, shuffle_buffer=1)
    by_batch = {
        b: next(iter(pipeline.train_dataset(spec, data, V, b, seed=7).unbatch().batch(64)))
        for b in (8, 64)
    }
    np.testing.assert_array_equal(by_batch[8][1], by_batch[64][1])
    np.testing.assert_array_equal(by_batch[8][0]["token_ids"], by_batch[64][0]["token_ids"])


def test_masking_statistics_on_a_hundred_thousand_tokens():
    rows, length, rate = 1700, 64, 0.15
    rng = np.random.default_rng(1)
    ids = rng.integers(5, V, (rows, length))
    ids[:, 0], ids[:, -1] = 0, 2  # <s> ... </s>
    mask = np.ones_like(ids)
    masked, positions, labels = dynamic_mask_batch(
        ids,
        mask,
        3,
        np.arange(rows),
        mask_rate=rate,
        slots=length,
        mask_token_id=4,
        special_token_ids=(0, 1, 2, 3, 4),
        vocabulary_size=V,
    )
    valid = labels != IGNORE_LABEL
    chosen = int(valid.sum())
    candidates = rows * (length - 2)
    # The count per row is round(rate * 62) = 9 exactly.
    assert (valid.sum(1) == round(rate * (length - 2))).all()
    assert not np.isin(np.take_along_axis(ids, positions, 1)[valid], (0, 2)).any()
    # Every candidate position is equally likely: no position is favoured.
    hits = np.bincount(positions[valid], minlength=length)[1:-1]
    expected = chosen / (length - 2)
    assert np.abs(hits - expected).max() < 5 * math.sqrt(expected)
    written = np.take_along_axis(masked, positions, 1)[valid]
    originals = labels[valid]
    as_mask = written == 4
    unchanged = written == originals
    for observed, p in (
        (as_mask.mean(), 0.8),
        ((~as_mask & ~unchanged).mean(), 0.1 * (1 - 1 / (V - 5))),
    ):
        assert abs(observed - p) < 5 * math.sqrt(p * (1 - p) / chosen), (observed, p)
    assert candidates > 10**5
    replaced = written[~as_mask & ~unchanged]
    assert (replaced >= 5).all() and (replaced < V).all()


@pytest.mark.parametrize("batched", [False, True])
def test_a_bad_value_in_a_dataset_input_names_the_example(batched):
    config = dataclasses.replace(
        Config(),
        model=dataclasses.replace(Config().model, vocabulary_size=V, max_sequence_length=L),
    )
    ids, mask = make_sequences(30, L, V, seed=2)
    ids[21, 6] = V + 9
    dataset = tf.data.Dataset.from_tensor_slices({"input_ids": ids, "attention_mask": mask})
    source = inputs.as_examples(dataset.batch(7) if batched else dataset, config)
    with pytest.raises(tf.errors.OpError) as info:
        list(inputs.batched(source, config, "masked", 8))
    message = str(pipeline.explain_pipeline_error(info.value, ()))
    assert (
        message == f"inputs: example 21: input_ids[6] = {V + 9} is outside the vocabulary [0, {V})"
    )


def test_a_batch_too_large_for_the_host_names_the_shape_and_the_batch_size():
    # What tf.data raised for kroberta.predict(..., batch_size=2**30): op names, no advice.
    error = tf.errors.ResourceExhaustedError(
        None,
        None,
        (
            "{{function_node __wrapped__IteratorGetNext}} Error in user-defined function passed to "
            "ParallelMapDatasetV2: OOM when allocating tensor with shape[1073741824,64] and type "
            "int32 on /job:localhost/replica:0/task:0/device:CPU:0 [[{{node PadV2_1}}]]"
        ),
    )
    assert str(pipeline.explain_pipeline_error(error, ())) == (
        "the host ran out of memory building a batch (OOM when allocating tensor with "
        "shape[1073741824,64]); lower the batch size (batch_size, --batch-size)"
    )


def test_a_label_outside_the_vocabulary_in_a_dataset_input_names_the_example():
    """It gave a NaN loss."""
    config = dataclasses.replace(
        Config(),
        model=dataclasses.replace(Config().model, vocabulary_size=V, max_sequence_length=L),
    )
    ids, mask = make_sequences(30, L, V, seed=2)
    labels = np.full_like(ids, -100)
    labels[13, 4] = V
    dataset = tf.data.Dataset.from_tensor_slices(
        {"input_ids": ids, "attention_mask": mask, "labels": labels}
    )
    source = inputs.as_examples(dataset, config)
    with pytest.raises(tf.errors.OpError) as info:
        list(inputs.batched(source, config, "masked", 8))
    message = str(pipeline.explain_pipeline_error(info.value, ()))
    assert message == (
        f"inputs: example 13: labels[4] = {V} is neither -100 (no loss) nor in "
        f"the vocabulary [0, {V})"
    )
