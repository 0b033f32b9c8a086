import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from kroberta.config import Config
from kroberta.data import pipeline
from kroberta.data.synthetic import make_sequences, write_seed_format, write_tfrecord
from kroberta.errors import ConfigError, InputError

L, V = 32, 512


def _spec(paths):
    return pipeline.inspect_files(pipeline.resolve_files(paths, "data.train"), "data.train")


def _data_config(**kw):
    return dataclasses.replace(Config().data, shuffle_buffer=64, **kw)


def test_train_batches_have_static_shapes(tiny_data):
    spec = _spec([str(tiny_data / "train-*.tfrecord")])
    assert spec.sequence_length == L and spec.has_labels and len(spec.files) == 2
    ds = pipeline.train_dataset(spec, _data_config(), V, global_batch=8, seed=0)
    x, y = next(iter(ds))
    slots = Config().data.prediction_slots(L)
    assert x["token_ids"].shape == (8, L) and x["padding_mask"].shape == (8, L)
    assert x["mask_positions"].shape == (8, slots) and y.shape == (8, slots)
    assert all(t.dtype == tf.int32 for t in (*x.values(), y))


def test_dynamic_masking_recovers_originals_from_seed_labels(tmp_path):
    arrays = write_seed_format(str(tmp_path / "a.tfrecord"), 16, L, V, seed=3)
    spec = _spec([str(tmp_path / "a.tfrecord")])
    ds = pipeline.eval_dataset(spec, _data_config(mask_rate=0.3), V, global_batch=16, seed=0)
    x, y = next(iter(ds))
    y, positions = y.numpy(), x["mask_positions"].numpy()
    for row in range(16):
        valid = y[row] != -100
        # Labels are the unmasked originals, not the <mask> ids in the file.
        np.testing.assert_array_equal(
            y[row][valid], arrays["original_ids"][row][positions[row][valid]]
        )


def test_static_masking_uses_the_files_labels(tmp_path):
    arrays = write_seed_format(str(tmp_path / "a.tfrecord"), 8, L, V, seed=4)
    spec = _spec([str(tmp_path / "a.tfrecord")])
    ds = pipeline.eval_dataset(spec, _data_config(masking="static", max_predictions=L), V, 8, 0)
    x, y = next(iter(ds))
    np.testing.assert_array_equal(x["token_ids"].numpy(), arrays["input_ids"])
    for row in range(8):
        expected = np.flatnonzero(arrays["labels"][row] != -100)
        got = x["mask_positions"].numpy()[row][: len(expected)]
        np.testing.assert_array_equal(got, expected)


def test_eval_dataset_keeps_every_example_and_pads_with_weightless_rows(tiny_data):
    spec = _spec([str(tiny_data / "validation.tfrecord")])  # 70 examples
    batches = list(pipeline.eval_dataset(spec, _data_config(), V, global_batch=16, seed=0))
    assert len(batches) == 5  # ceil(70 / 16)
    padding = batches[-1][0]["padding_mask"].numpy().sum(axis=1) == 0
    assert padding.sum() == 5 * 16 - 70
    assert (batches[-1][1].numpy()[padding] == -100).all()
    # Same masks on every pass: evaluation is comparable across steps.
    again = list(pipeline.eval_dataset(spec, _data_config(), V, global_batch=16, seed=0))
    np.testing.assert_array_equal(batches[0][1].numpy(), again[0][1].numpy())


def test_resume_skips_exactly_the_consumed_batches(tiny_data):
    spec = _spec([str(tiny_data / "train-*.tfrecord")])
    full = pipeline.train_dataset(spec, _data_config(), V, 8, seed=5)
    resumed = pipeline.train_dataset(spec, _data_config(), V, 8, seed=5, start_step=3)
    expected = list(full.take(5))[3:]
    got = list(resumed.take(2))
    for (xa, ya), (xb, yb) in zip(expected, got):
        np.testing.assert_array_equal(ya.numpy(), yb.numpy())
        np.testing.assert_array_equal(xa["token_ids"].numpy(), xb["token_ids"].numpy())


def _first_error(tmp_path, paths, vocabulary_size=V, batches=40):
    spec = _spec(paths)
    ds = pipeline.train_dataset(spec, _data_config(), vocabulary_size, 8, seed=0)
    with pytest.raises(Exception) as info:
        for _ in ds.take(batches):
            pass
    # As training does: a failure that names no record is found by replaying the stream.
    replay = pipeline.replay_train_errors(spec, _data_config(), vocabulary_size, 0, 0, batches, 8)
    explained = pipeline.explain_pipeline_error(info.value, spec.files, replay=replay)
    assert explained is not None, info.value
    return str(explained)


def test_id_outside_vocabulary_names_file_record_and_feature(tmp_path):
    ids, mask = make_sequences(20, L, V, seed=1)
    ids[13, 5] = V + 7
    path = str(tmp_path / "big_id.tfrecord")
    write_tfrecord(path, ids, mask)
    message = _first_error(tmp_path, [path])
    assert (
        f"{path}: record 13: feature 'input_ids' holds id {V + 7} outside the vocabulary" in message
    )


def test_wrong_length_in_a_later_record(tmp_path):
    ids, mask = make_sequences(10, L, V, seed=1)
    path = str(tmp_path / "short.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for i in range(10):
            n = L - 3 if i == 6 else L
            feature = {
                "input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=ids[i][:n])),
                "attention_mask": tf.train.Feature(
                    int64_list=tf.train.Int64List(value=mask[i][:n])
                ),
            }
            w.write(
                tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
            )
    message = _first_error(tmp_path, [path])
    assert f"{path}: record 6: feature 'input_ids' has {L - 3} values, expected {L}" in message


def test_bad_attention_mask_and_bad_label(tmp_path):
    ids, mask = make_sequences(10, L, V, seed=1)
    mask[4, 2] = 3
    path = str(tmp_path / "mask.tfrecord")
    write_tfrecord(path, ids, mask)
    assert "record 4: feature 'attention_mask' holds values other than 0 and 1" in _first_error(
        tmp_path, [path]
    )
    ids, mask = make_sequences(10, L, V, seed=1)
    labels = np.full_like(ids, -100)
    labels[8, 3] = -5
    path = str(tmp_path / "label.tfrecord")
    write_tfrecord(path, ids, mask, labels)
    assert "record 8: feature 'labels' holds a value that is neither -100" in _first_error(
        tmp_path, [path]
    )


@pytest.mark.parametrize("cut", [3, 5, 40])
def test_truncated_file_is_found_at_startup(tmp_path, cut):
    good = str(tmp_path / "good.tfrecord")
    write_seed_format(good, 20, L, V, seed=1)
    raw = open(good, "rb").read()
    offset = 0
    for _ in range(10):  # the end of record 9: walk the framing (length, crc, data, crc)
        offset += 16 + int.from_bytes(raw[offset : offset + 8], "little")
    bad = str(tmp_path / "cut.tfrecord")
    open(bad, "wb").write(raw[: offset + cut])  # 10 whole records, then a piece
    with pytest.raises(InputError, match=r"cut.tfrecord: record 10: truncated"):
        _spec([good, bad])


def test_corrupt_record_in_the_stream_is_named(tmp_path):
    good = str(tmp_path / "good.tfrecord")
    write_seed_format(good, 20, L, V, seed=1)
    raw = bytearray(open(good, "rb").read())
    raw[len(raw) // 2] ^= 0xFF  # flips a data byte: framing intact, checksum wrong
    bad = str(tmp_path / "flipped.tfrecord")
    open(bad, "wb").write(bytes(raw))
    message = _first_error(tmp_path, [good, bad])
    assert f"{bad}: record" in message and "corrupt or truncated" in message


def test_startup_checks(tmp_path):
    with pytest.raises(InputError, match=r"data.train: no file matches '.*nothing-\*'"):
        pipeline.resolve_files([str(tmp_path / "nothing-*")], "data.train")
    with pytest.raises(
        InputError,
        match=r"inputs: no file matches 'The cat sat.'; it "
        r"reads as text, not a path: kroberta.fill_mask",
    ):
        pipeline.resolve_files(["The cat sat."], "inputs")
    # A directory (a likely slip for its files) is named with what to give instead.
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    with pytest.raises(
        InputError,
        match=r"--data: .*corpus is a directory; name its TFRecord files, e.g. "
        r"'.*corpus/\*.tfrecord'",
    ):
        pipeline.resolve_files([str(corpus)], "--data")
    (corpus / "manifest.json").write_text("{}")
    with pytest.raises(
        InputError,
        match=r"data.train: .*corpus is a directory made by "
        r"prepare: training takes it as --data.dir=",
    ):
        pipeline.resolve_files([str(tmp_path / "corp*")], "data.train")
    text = tmp_path / "notes.txt"
    text.write_text("Plain text, not records: the first eight bytes read as a huge length.\n")
    with pytest.raises(
        InputError,
        match=r"notes.txt: record 0: truncated .*is it a "
        r"TFRecord file\? Text goes through",
    ):
        _spec([str(text)])
    empty = tmp_path / "empty.tfrecord"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match=r"empty.tfrecord: the file holds no records"):
        _spec([str(empty)])
    write_seed_format(str(tmp_path / "a.tfrecord"), 4, 32, V)
    write_seed_format(str(tmp_path / "b.tfrecord"), 4, 16, V)
    with pytest.raises(InputError, match=r"files hold different sequence lengths"):
        _spec([str(tmp_path / "a.tfrecord"), str(tmp_path / "b.tfrecord")])
    ids, mask = make_sequences(2, L, V)
    path = tmp_path / "no_mask.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as w:
        feature = {"input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=ids[0]))}
        w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    with pytest.raises(
        InputError, match=r"no_mask.tfrecord: record 0: feature 'attention_mask' is missing"
    ):
        _spec([str(path)])


def test_sequences_longer_than_the_model_are_refused(tiny_data):
    spec = _spec([str(tiny_data / "train-*.tfrecord")])
    model = dataclasses.replace(Config().model, max_sequence_length=16)
    with pytest.raises(
        ConfigError, match=r"sequences have length 32 but model.max_sequence_length=16"
    ):
        pipeline.check_against_model(spec, Config().data, model, "data.train")
