"""Batches finished inside the compiled step (kroberta.model.masked_lm, kroberta.masking):
dynamic masks and static slots bit for bit the numpy reference's and the host pipeline's, and
training or evaluating on the batches the step finishes is training on the host's finished ones."""

import dataclasses

import jax
import numpy as np
import pytest

from kroberta import masking
from kroberta.config import Config
from kroberta.data import pipeline
from kroberta.model import masked_lm
from tests import masking_reference
from tests.conftest import TINY_VOCAB, tiny_config


def _batch(rng, rows, length, vocabulary_size, pad_id=1):
    lengths = rng.integers(0, length + 1, rows)
    real = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int32)  # (B, L)
    ids = rng.integers(0, vocabulary_size, (rows, length)).astype(np.int32)
    return np.where(real == 1, ids, pad_id), real


@pytest.mark.stack
@pytest.mark.parametrize(
    "rows, length, slots, vocabulary_size, rate, specials",
    [
        (64, 512, 16, 10_000, 0.15, (0, 1, 2, 3, 4)),  # the seed's slots at 512 tokens
        (64, 512, 96, 50_000, 0.15, (0, 1, 2, 3, 4)),
        (16, 64, 12, 300, 0.3, (0, 1, 2, 3, 4)),
        (5, 10, 24, 50, 0.5, (0, 2, 7)),  # more slots than positions; specials not a range
        (3, 4, 8, 30, 1.0, ()),
        (4, 16, 4, 40, 0.0, (0, 1, 2, 3, 4)),  # nothing chosen
    ],
)
def test_device_masks_are_the_reference_masks_bit_for_bit(
    rows, length, slots, vocabulary_size, rate, specials
):
    rng = np.random.default_rng(rows * length + slots)
    ids, real = _batch(rng, rows, length, vocabulary_size)
    indices = rng.integers(0, 2**40, rows).astype(np.int64)  # beyond 32 bits: both key words
    settings = dict(
        mask_rate=rate,
        slots=slots,
        mask_token_id=4,
        special_token_ids=specials,
        vocabulary_size=vocabulary_size,
    )
    want = masking_reference.dynamic_mask(ids, real, 11, indices, **settings)
    keys = masking.element_keys(11, indices)
    device = jax.jit(lambda i, r, k: masking.dynamic_mask_batch(i, r, k, **settings))(
        ids, real, keys
    )
    for name, a, b in zip(("ids", "positions", "labels"), want, device):
        assert b.dtype == np.int32
        np.testing.assert_array_equal(np.asarray(b), a, err_msg=name)
    if rate > 0:
        assert (np.asarray(device[2]) != -100).any()


@pytest.mark.parametrize("score_bits", [2, 24])
def test_device_choice_breaks_ties_to_the_lower_position(score_bits):
    rng = np.random.default_rng(score_bits)
    rows, length, slots = 32, 200, 40
    scores = rng.integers(0, 2**score_bits, (rows, length)).astype(np.int32)  # 2 bits: ties
    candidates = rng.random((rows, length)) < 0.7
    count = np.minimum(rng.integers(0, slots + 1, rows), candidates.sum(1)).astype(np.int32)
    positions, valid = jax.jit(masking.chosen_slots, static_argnums=3)(
        scores, candidates, count, slots
    )
    for row in range(rows):  # a stable sort of the negated scores, then position order
        where = np.flatnonzero(candidates[row])
        chosen = np.sort(where[np.argsort(-scores[row][where], kind="stable")][: count[row]])
        np.testing.assert_array_equal(np.asarray(positions[row][: count[row]]), chosen)
        assert np.asarray(valid[row]).sum() == count[row]
        assert (np.asarray(positions[row][count[row] :]) == 0).all()


@pytest.mark.parametrize(
    "rows, length, slots, rate",
    [
        (64, 512, 16, 0.15),  # the seed's slots at 512 tokens: most rows have more labels
        (16, 64, 12, 0.1),  # some rows fewer labels than slots
        (5, 10, 24, 0.5),  # more slots than positions
        (4, 16, 4, 0.0),  # nothing labelled
        (3, 8, 8, 1.0),  # every position labelled
    ],
)
def test_device_static_slots_are_the_reference_slots(rows, length, slots, rate):
    rng = np.random.default_rng(rows * length + slots)
    labels = np.where(
        rng.random((rows, length)) < rate, rng.integers(0, 300, (rows, length)), -100
    ).astype(np.int32)
    host_positions, host_labels, _ = masking_reference.static_slots(labels, slots)
    positions, slot_labels = jax.jit(masking.first_labelled_slots, static_argnums=1)(labels, slots)
    for name, a, b in (
        ("positions", host_positions, positions),
        ("labels", host_labels, slot_labels),
    ):
        assert b.dtype == np.int32 and b.shape == (rows, slots)
        np.testing.assert_array_equal(np.asarray(b), a, err_msg=name)


def test_keyed_batches_masked_by_the_step_are_the_host_pipelines_batches(tiny_data):
    config = Config()
    spec = pipeline.inspect_files((str(tiny_data / "train-0.tfrecord"),), "t")
    V = TINY_VOCAB
    keyed = pipeline.train_dataset(spec, config.data, V, 8, seed=3, start_step=2, device_masks=True)
    host = pipeline.train_dataset(spec, config.data, V, 8, seed=3, start_step=2)
    mask = jax.jit(masking.masker(config.data, V))
    for x, (host_x, host_y) in zip(
        keyed.take(4).as_numpy_iterator(), host.take(4).as_numpy_iterator()
    ):
        assert x["mask_keys"].dtype == np.uint32 and x["mask_keys"].shape == (8,)
        masked, labels = mask(x)
        assert masked.keys() == host_x.keys()
        for name in host_x:
            np.testing.assert_array_equal(np.asarray(masked[name]), host_x[name], err_msg=name)
        np.testing.assert_array_equal(np.asarray(labels), host_y)
    # Validation: every example once, the padding rows of the last batch draw no masks.
    val = pipeline.inspect_files((str(tiny_data / "validation.tfrecord"),), "v")
    keyed = list(
        pipeline.eval_dataset(val, config.data, V, 16, 0, device_masks=True).as_numpy_iterator()
    )
    host = list(pipeline.eval_dataset(val, config.data, V, 16, 0).as_numpy_iterator())
    assert len(keyed) == len(host) and val.records % 16  # a padded last batch
    for x, (host_x, host_y) in zip(keyed, host):
        masked, labels = mask(x)
        np.testing.assert_array_equal(np.asarray(masked["token_ids"]), host_x["token_ids"])
        np.testing.assert_array_equal(np.asarray(labels), host_y)


@pytest.mark.parametrize("shuffle_buffer", [64, 5])  # blocks of several batches; smaller than one
@pytest.mark.parametrize("shard", [None, (2, 1)])
def test_mask_keys_hashed_per_block_are_each_elements_key(tiny_data, shuffle_buffer, shard):
    # The keys of a block's batches are hashed together; each row must still get the key
    # of its own element index: batch k of process p holds elements (start + k) B + i,
    # standing for element ((start + k) B + i) * count + p of the unsharded stream.
    spec = pipeline.inspect_files((str(tiny_data / "train-0.tfrecord"),), "t")
    data = dataclasses.replace(Config().data, shuffle_buffer=shuffle_buffer)
    count, index = shard or (1, 0)
    start, B = 3, 8
    keyed = pipeline.train_dataset(
        spec, data, TINY_VOCAB, B, seed=7, start_step=start, shard=shard, device_masks=True
    )
    for k, x in enumerate(keyed.take(40).as_numpy_iterator()):  # past a block and an epoch
        elements = ((start + k) * B + np.arange(B)) * count + index
        np.testing.assert_array_equal(x["mask_keys"], masking_reference.element_keys(7, elements))


def test_static_batches_finished_by_the_step_are_the_host_pipelines_batches(tiny_data):
    spec = pipeline.inspect_files((str(tiny_data / "train-0.tfrecord"),), "t")
    static = dataclasses.replace(Config().data, masking="static", max_predictions=5)
    V = TINY_VOCAB
    mask = jax.jit(masking.masker(static, V))
    val = pipeline.inspect_files((str(tiny_data / "validation.tfrecord"),), "v")
    pairs = [
        (
            pipeline.train_dataset(spec, static, V, 8, 3, start_step=2, device_masks=True).take(4),
            pipeline.train_dataset(spec, static, V, 8, 3, start_step=2).take(4),
        ),
        (
            pipeline.eval_dataset(val, static, V, 16, 0, device_masks=True),
            pipeline.eval_dataset(val, static, V, 16, 0),
        ),
    ]
    for finished_by_step, host in pairs:
        finished, host = list(finished_by_step.as_numpy_iterator()), list(host.as_numpy_iterator())
        assert len(finished) == len(host)
        for x, (host_x, host_y) in zip(finished, host):
            assert sorted(x) == ["padding_mask", "token_ids", "token_labels"]
            assert x["token_labels"].shape == x["token_ids"].shape
            masked, labels = mask(x)
            assert masked.keys() == host_x.keys()
            for name in host_x:
                np.testing.assert_array_equal(np.asarray(masked[name]), host_x[name], err_msg=name)
            np.testing.assert_array_equal(np.asarray(labels), host_y)
    assert (host_y == -100).all(axis=1).any()  # the validation's padding rows: no slots


def test_whole_word_batches_are_finished_by_the_step_and_each_mode_names_its_step_input(tiny_data):
    assert {
        mode: dataclasses.replace(Config().data, masking=mode).step_input()
        for mode in ("dynamic", "static")
    } == dict(zip(("dynamic", "static"), masking.STEP_INPUTS))
    whole_words = dataclasses.replace(Config().data, whole_word_masking=True)
    assert whole_words.step_input() == "mask_keys"
    spec = pipeline.inspect_files((str(tiny_data / "train-0.tfrecord"),), "t")
    word_starts = np.random.default_rng(0).random(TINY_VOCAB) < 0.3
    keyed = pipeline.train_dataset(spec, whole_words, TINY_VOCAB, 8, 0, device_masks=True)
    host = pipeline.train_dataset(spec, whole_words, TINY_VOCAB, 8, 0, word_starts=word_starts)
    mask = jax.jit(masking.masker(whole_words, TINY_VOCAB, word_starts))
    for x, (host_x, host_y) in zip(
        keyed.take(3).as_numpy_iterator(), host.take(3).as_numpy_iterator()
    ):
        assert sorted(x) == ["mask_keys", "padding_mask", "token_ids"]
        masked, labels = mask(x)
        for name in host_x:
            np.testing.assert_array_equal(np.asarray(masked[name]), host_x[name], err_msg=name)
        np.testing.assert_array_equal(np.asarray(labels), host_y)
    with pytest.raises(ValueError, match="word-start table"):
        masking.masker(whole_words, TINY_VOCAB)(x)


# Keras' own step masked in the step is also in the AOT test and every dynamic-masking run.
@pytest.mark.parametrize(
    "masking, accumulation",
    [
        pytest.param("dynamic", 1, marks=pytest.mark.slow),
        pytest.param("dynamic", 2, marks=pytest.mark.stack),
        ("static", 2),
    ],
)
def test_training_on_keyed_batches_is_training_on_host_masked_batches(
    tiny_data, tmp_path, masking, accumulation
):
    from kroberta.model.mlm import build_compiled_model

    config = tiny_config(
        tiny_data,
        tmp_path,
        steps_per_execution=3,
        log_every=6,
        eval_every=0,
        checkpoint_every=0,
        gradient_accumulation_steps=accumulation,
    )
    config = dataclasses.replace(config, data=dataclasses.replace(config.data, masking=masking))
    spec = pipeline.inspect_files((str(tiny_data / "train-0.tfrecord"),), "t")
    val = pipeline.inspect_files((str(tiny_data / "validation.tfrecord"),), "v")
    V, seed = config.model.vocabulary_size, config.train.seed
    results = {}
    for device_masks in (True, False):
        model = build_compiled_model(config)
        stream = pipeline.train_dataset(spec, config.data, V, 16, seed, device_masks=device_masks)
        history = model.fit(stream.take(6), steps_per_epoch=6, epochs=1, verbose=0, shuffle=False)
        validation = pipeline.eval_dataset(val, config.data, V, 16, seed, device_masks=device_masks)
        evaluation = model.evaluate(validation, verbose=0, return_dict=True)
        # predict on keyed batches: the logits at the slots the step draws.
        logits = model.predict(
            validation.take(1).map(
                lambda *batch, device_masks=device_masks: batch[0] if device_masks else (batch[0],)
            ),
            verbose=0,
        )
        results[device_masks] = (
            history.history,
            evaluation,
            [np.asarray(w) for w in model.trainable_weights],
            logits,
        )
    (
        (history, evaluation, weights, logits),
        (host_history, host_evaluation, host_weights, host_logits),
    ) = results[True], results[False]
    np.testing.assert_allclose(logits, host_logits, rtol=1e-4, atol=1e-5)
    assert history["loss"] == pytest.approx(host_history["loss"], rel=1e-6)
    for key in ("masked_accuracy", "perplexity"):
        assert evaluation[key] == pytest.approx(host_evaluation[key], rel=1e-6)
    for a, b in zip(weights, host_weights):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_a_keyed_batch_with_labels_is_refused():
    mask = masking.masker(Config().data, 300)
    x = {
        "token_ids": np.zeros((2, 8), np.int32),
        "padding_mask": np.ones((2, 8), np.int32),
        "mask_keys": np.zeros((2,), np.uint32),
    }
    with pytest.raises(ValueError, match="with 'mask_keys' gets its labels from it"):
        masked_lm.finish_batch(mask, (x, np.zeros((2, 4), np.int32)))
    both = {**x, "token_labels": np.full((2, 8), -100, np.int32)}
    with pytest.raises(ValueError, match="both 'mask_keys' and 'token_labels'"):
        masked_lm.finish_batch(mask, (both,))
    plain = ({"token_ids": x["token_ids"]}, np.zeros((2, 4), np.int32))
    assert masked_lm.finish_batch(mask, plain) is plain
