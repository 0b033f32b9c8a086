"""The training stream is a sequence of epochs, each holding every record exactly once."""

import collections
import dataclasses
import random

import numpy as np
import pytest

import kroberta
from kroberta.config import Config
from kroberta.data import pipeline
from kroberta.data.synthetic import write_tfrecord
from kroberta.errors import ConfigError, InputError
from tests.conftest import prepare_word_corpus

L, V = 16, 512


def _write_files(root, lengths):
    """Files of the given record counts; record r of file f holds (f, r) at positions 1-2."""
    paths = []
    for f, count in enumerate(lengths):
        ids = np.full((count, L), 7, np.int64)
        ids[:, 0], ids[:, -1] = 0, 2
        ids[:, 1], ids[:, 2] = 100 + f, 5 + np.arange(count)
        path = str(root / f"part-{f:03d}.tfrecord")
        write_tfrecord(path, ids, np.ones_like(ids), np.full_like(ids, -100))
        paths.append(path)
    return paths


def _data(shuffle_buffer):
    # Static masking: the token ids stay the files' own, so records compare by content.
    return dataclasses.replace(Config().data, shuffle_buffer=shuffle_buffer, masking="static")


def _records(ds, count):
    """The (file, record) pairs of the first `count` examples of a batched stream."""
    out = []
    for x, _ in ds.as_numpy_iterator():
        out.extend(zip(x["token_ids"][:, 1].tolist(), x["token_ids"][:, 2].tolist()))
        if len(out) >= count:
            return out[:count]
    return out


def _spec(paths):
    return pipeline.inspect_files(paths, "data.train")


def _batches(plan, consumed, batch):
    """`plan`'s batch plans with their rows gathered, as training gathers them."""
    from kroberta.data import epochs

    return plan.batch_plans(consumed, batch).map(
        lambda indices, rows: (indices, epochs.planned_rows(rows, batch))
    )


@pytest.mark.parametrize("files", [1, 2, 3, 4, 7, 64])
@pytest.mark.parametrize("shuffle_buffer", [1, 10, 1000])
def test_each_epoch_holds_every_record_once(tmp_path, files, shuffle_buffer):
    rng = random.Random(files)
    lengths = [rng.randint(2, 5) if files == 64 else rng.randint(20, 60) for _ in range(files)]
    spec = _spec(_write_files(tmp_path, lengths))
    every = collections.Counter((100 + f, 5 + r) for f, n in enumerate(lengths) for r in range(n))
    total = sum(lengths)
    stream = _records(pipeline.train_dataset(spec, _data(shuffle_buffer), V, 8, seed=3), 2 * total)
    first, second = stream[:total], stream[total:]
    assert collections.Counter(first) == every
    assert collections.Counter(second) == every
    if shuffle_buffer > 1 and total > 20:
        assert first != second  # each epoch has its own order


def test_one_file_is_no_longer_read_four_times_side_by_side(tmp_path):
    spec = _spec(_write_files(tmp_path, [300]))
    stream = _records(pipeline.train_dataset(spec, _data(1), V, 32, seed=0), 300)
    assert stream == [(100, 5 + r) for r in range(300)]  # r0 r1 r2 ..., not r0 r0 r0 r0 r1


def test_a_bad_record_late_in_a_single_file_is_reached(tmp_path):
    ids = np.full((800, L), 7, np.int64)
    ids[777, 4] = V + 3
    path = str(tmp_path / "one.tfrecord")
    write_tfrecord(path, ids, np.ones_like(ids))
    spec = _spec([path])
    data = dataclasses.replace(Config().data, shuffle_buffer=1)  # dynamic masking
    ds = pipeline.train_dataset(spec, data, V, 64, seed=0)
    with pytest.raises(Exception) as info:
        for _ in ds.take(13):  # 832 examples: one epoch and a bit
            pass
    assert f"{path}: record 777: feature 'input_ids' holds id {V + 3}" in str(
        pipeline.explain_pipeline_error(info.value, spec.files)
    )


@pytest.mark.parametrize("files", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("shuffle_buffer", [1, 1000])
def test_process_shares_of_an_epoch_are_disjoint_and_complete(tmp_path, files, shuffle_buffer):
    rng = random.Random(10 + files)
    lengths = [rng.randint(15, 40) for _ in range(files)]
    spec = _spec(_write_files(tmp_path, lengths))
    every = collections.Counter((100 + f, 5 + r) for f, n in enumerate(lengths) for r in range(n))
    streams, sizes = [], []
    for p in range(2):
        plan = pipeline.epoch_plan(spec, _data(shuffle_buffer), 3, shard=(2, p))
        sizes.append([plan.epoch_size(0), plan.epoch_size(1)])
        ds = pipeline.train_dataset(spec, _data(shuffle_buffer), V, 8, seed=3, shard=(2, p))
        streams.append(_records(ds, sum(sizes[p])))
    for epoch in range(2):
        shares = [streams[p][sum(sizes[p][:epoch]) : sum(sizes[p][: epoch + 1])] for p in range(2)]
        assert not set(shares[0]) & set(shares[1])
        assert collections.Counter(shares[0] + shares[1]) == every


@pytest.mark.parametrize("files,shard", [(1, None), (3, None), (2, (2, 1)), (1, (2, 0))])
def test_resume_starts_in_the_right_epoch_and_skips_exactly_the_consumed(tmp_path, files, shard):
    spec = _spec(_write_files(tmp_path, [37, 23, 51][:files]))
    data = _data(16)
    whole = _records(pipeline.train_dataset(spec, data, V, 5, seed=1, shard=shard), 5 * 40)
    for step in (0, 7, 21, 39):
        resumed = _records(
            pipeline.train_dataset(spec, data, V, 5, seed=1, shard=shard, start_step=step), 5
        )
        assert resumed == whole[5 * step : 5 * step + 5]


def test_too_few_records_for_the_processes_is_a_clear_error(tmp_path):
    spec = _spec(_write_files(tmp_path, [1]))
    with pytest.raises(InputError, match=r"1 record\(s\) cannot be shared by 2 processes"):
        pipeline.train_dataset(spec, _data(1), V, 1, seed=0, shard=(2, 0))


def _prepared(root):
    words = ["alpha", "beta", "gamma", "delta", "omega", "river", "stone", "cloud"]
    return prepare_word_corpus(root, words, documents=300)


def test_public_dataset_is_the_training_stream_and_one_shard_epochs_are_whole(tmp_path):
    # Prepared data as the default job has it: one training shard.
    directory = _prepared(tmp_path)
    config = dataclasses.replace(
        Config(),
        run_dir=str(tmp_path / "run"),
        model=dataclasses.replace(Config().model, vocabulary_size=300, max_sequence_length=32),
        data=dataclasses.replace(Config().data, dir=str(directory), masking="dynamic"),
        train=dataclasses.replace(Config().train, batch_size_per_device=2),
    )
    ds = kroberta.dataset(config)
    run = kroberta.training.run_data.run_data_for(config)
    assert len(run.train.files) == 1
    x = next(iter(ds))  # dynamic masks: x alone, the step draws them from the keys
    assert sorted(x) == ["mask_keys", "padding_mask", "token_ids"]
    assert x["token_ids"].shape[0] == x["mask_keys"].shape[0] == 2 * 4  # 4 simulated devices
    assert x["mask_keys"].numpy().dtype == np.uint32
    # The same batches as the pipeline training builds from the same arguments.
    direct = pipeline.train_dataset(
        run.train, run.config.data, 300, 8, config.train.seed, device_masks=True
    )
    for a, b in zip(ds.take(3).as_numpy_iterator(), direct.take(3).as_numpy_iterator()):
        assert a.keys() == b.keys()
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
    # masks_on_host: the host pipeline's (x, labels), the batches the step's masks make.
    shown = kroberta.dataset(config, masks_on_host=True)
    host = pipeline.train_dataset(run.train, run.config.data, 300, 8, config.train.seed)
    for (xa, ya), (xb, yb) in zip(
        shown.take(3).as_numpy_iterator(), host.take(3).as_numpy_iterator()
    ):
        np.testing.assert_array_equal(xa["token_ids"], xb["token_ids"])
        np.testing.assert_array_equal(ya, yb)
    # Every record once per epoch, compared by content (mask rate 0: tokens unchanged).
    records, rows, originals = run.train.records, [], []
    unmasked = dataclasses.replace(run.config.data, mask_rate=0.0)
    for x, _ in pipeline.train_dataset(run.train, unmasked, 300, 8, seed=0).as_numpy_iterator():
        rows.extend(tuple(r) for r in x["token_ids"])
        if len(rows) >= 2 * records:
            break
    blocks, parse = pipeline.file_batches(run.train, 300, 64)
    for x in blocks.map(parse).as_numpy_iterator():
        originals.extend(tuple(r) for r in x["input_ids"])
    assert collections.Counter(rows[:records]) == collections.Counter(originals)
    assert collections.Counter(rows[records : 2 * records]) == collections.Counter(originals)
    validation = list(kroberta.dataset(config, "validation", masks_on_host=True))
    assert (
        sum(int((y.numpy() != -100).any(axis=1).sum()) for _, y in validation)
        == run.validation.records
    )
    keyed = list(kroberta.dataset(config, "validation"))
    assert len(keyed) == len(validation)
    assert (
        sum(int(x["padding_mask"].numpy().any(axis=1).sum()) for x in keyed)
        == run.validation.records
    )
    with pytest.raises(ConfigError, match="split must be one of"):
        kroberta.dataset(config, "test")


@pytest.mark.parametrize("shard", [None, (2, 1), (3, 0)])
@pytest.mark.parametrize("shuffle_buffer", [1, 7, 50])
@pytest.mark.parametrize("consumed", [0, 5, 93, 250])
def test_batches_cut_from_the_blocks_are_the_stream_batched(
    tmp_path, shard, shuffle_buffer, consumed
):
    # Training reads `EpochPlan.batch_plans`; it must hold exactly the elements, element
    # indices and order of the record stream, batched (resume offsets inside a block,
    # across epochs, with both kinds of sharding: 3 files for 2 or 3 processes).
    from kroberta.data import epochs

    spec = _spec(_write_files(tmp_path, [23, 41, 17]))
    plan = epochs.EpochPlan(spec.files, spec.file_records, 5, shuffle_buffer, shard)
    batch = 6
    cut = list(_batches(plan, consumed, batch).take(40).as_numpy_iterator())
    whole = list(
        plan.stream(consumed).batch(batch, drop_remainder=True).take(40).as_numpy_iterator()
    )
    assert len(cut) == len(whole) == 40
    for (indices, tagged), (indices_ref, tagged_ref) in zip(cut, whole):
        np.testing.assert_array_equal(indices, indices_ref)
        for column, column_ref in zip(tagged, tagged_ref):
            np.testing.assert_array_equal(column, column_ref)


@pytest.mark.parametrize("consumed", [0, 37])
@pytest.mark.parametrize("shuffle_buffer", [5, 16])
def test_batches_as_large_as_the_blocks_carry_rows_across_blocks(
    tmp_path, consumed, shuffle_buffer
):
    # Blocks of 5 never fill a batch of 16 (the blocks are put in order and cut); blocks
    # of 16 do, and an epoch's last block (81 = 5 x 16 + 1) fills none, its row carried
    # into the next epoch's first batch.
    from kroberta.data import epochs

    spec = _spec(_write_files(tmp_path, [23, 41, 17]))
    plan = epochs.EpochPlan(spec.files, spec.file_records, 5, shuffle_buffer)
    cut = list(_batches(plan, consumed, 16).take(12).as_numpy_iterator())
    whole = list(plan.stream(consumed).batch(16, drop_remainder=True).take(12).as_numpy_iterator())
    assert len(cut) == len(whole) == 12
    for (indices, tagged), (indices_ref, tagged_ref) in zip(cut, whole):
        np.testing.assert_array_equal(indices, indices_ref)
        for column, column_ref in zip(tagged, tagged_ref):
            np.testing.assert_array_equal(column, column_ref)


def test_batches_skip_by_rows_when_record_counts_are_unknown(tmp_path):
    from kroberta.data import epochs

    spec = _spec(_write_files(tmp_path, [23, 41]))
    known = epochs.EpochPlan(spec.files, spec.file_records, 5, 10)
    unknown = epochs.EpochPlan(spec.files, None, 5, 10)  # remote files: counts not known
    for consumed in (0, 9, 64, 130):
        a = list(_batches(known, consumed, 8).take(12).as_numpy_iterator())
        b = list(_batches(unknown, consumed, 8).take(12).as_numpy_iterator())
        for (ia, ta), (ib, tb) in zip(a, b):
            np.testing.assert_array_equal(ia, ib)
            np.testing.assert_array_equal(ta[2], tb[2])


@pytest.mark.parametrize("block", [1, 5, 23, 1000])
def test_files_read_in_blocks_are_the_records_batched(tmp_path, block):
    # Reading a block of each file at a time must give the records, their tags and
    # their order of record-by-record reading, blocks spanning files (one empty).
    import tensorflow as tf

    from kroberta.data import epochs
    from kroberta.data.epochs import FileOrder

    paths = _write_files(tmp_path, [23, 41, 0, 17])
    files = tf.data.Dataset.from_tensor_slices(paths)
    blocks = list(epochs.read_tagged_blocks(files, block).as_numpy_iterator())
    reference = list(epochs.read_tagged(files).batch(block).as_numpy_iterator())
    # Evaluation's and prediction's order: tags computed from the block number when the
    # counts are known, tagged as read when not (remote files).
    orders = [FileOrder(paths, counts, block) for counts in ([23, 41, 0, 17], None)]
    computed = [list(order.blocks().map(order.tagged).as_numpy_iterator()) for order in orders]
    assert len(blocks) == len(reference) == -(-81 // block)
    for blocks_read in (blocks, *computed):
        assert len(blocks_read) == len(reference)
        for tagged, tagged_ref in zip(blocks_read, reference):
            for column, column_ref in zip(tagged, tagged_ref):
                np.testing.assert_array_equal(column, column_ref)
