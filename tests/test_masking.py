"""Masking (kroberta.masking): properties of the masks, and the one implementation equal to the
numpy reference (tests/masking_reference.py) bit for bit."""

import functools
import math

import jax
import numpy as np
import pytest
import tensorflow as tf

from kroberta import masking
from kroberta.errors import ConfigError
from kroberta.tokens import IGNORE_LABEL
from tests import masking_reference

# The fast tier (docs/contributing.md): builds no model and starts no process.
pytestmark = pytest.mark.fast

SPECIAL = (0, 1, 2, 3, 4)
VOCAB = 100


def _sequence(length=20, real=16, seed=0):
    rng = np.random.default_rng(seed)
    ids = np.full(length, 1, np.int32)
    ids[0] = 0
    ids[1 : real - 1] = rng.integers(5, VOCAB, real - 2)
    ids[real - 1] = 2
    mask = (np.arange(length) < real).astype(np.int32)
    return ids, mask


@functools.cache
def _masker(settings):
    """The jitted `dynamic_mask_batch` of ((name, value), ...) settings (numpy out)."""
    settings = dict(settings)
    return masking.host_function(
        lambda ids, mask, keys: masking.dynamic_mask_batch(ids, mask, keys, **settings)
    )


def dynamic_mask_batch(ids, mask, seed, indices, word_starts=None, **settings):
    """The masks of rows `indices` under `seed`, as numpy arrays."""
    keys = masking.element_keys(seed, np.asarray(indices, np.int64))
    if word_starts is not None:
        settings["word_starts"] = tuple(np.asarray(word_starts, bool))
    run = _masker(tuple(sorted(settings.items())))
    return list(run(np.asarray(ids, np.int32), np.asarray(mask, np.int32), keys))


def _mask(ids, mask, seed=(7, 3), **kwargs):
    """The masks of one sequence (L,) at element seed[1] under seed[0]."""
    params = dict(
        mask_rate=0.15, slots=6, mask_token_id=4, special_token_ids=SPECIAL, vocabulary_size=VOCAB
    )
    params.update(kwargs)
    out = dynamic_mask_batch(
        np.asarray(ids)[None], np.asarray(mask)[None], seed[0], [seed[1]], **params
    )
    return [t[0] for t in out]


def test_rate_one_with_all_mask_selects_every_candidate():
    ids, mask = _sequence()
    masked, positions, labels = _mask(
        ids, mask, mask_rate=1.0, slots=20, mask_fraction=1.0, random_fraction=0.0
    )
    candidates = set(np.flatnonzero((mask == 1) & (ids >= 5)))
    valid = labels != IGNORE_LABEL
    assert set(positions[valid]) == candidates
    np.testing.assert_array_equal(labels[valid], ids[positions[valid]])
    np.testing.assert_array_equal(masked[sorted(candidates)], 4)
    others = [i for i in range(len(ids)) if i not in candidates]
    np.testing.assert_array_equal(masked[others], ids[others])


def test_rate_zero_changes_nothing():
    ids, mask = _sequence()
    masked, positions, labels = _mask(ids, mask, mask_rate=0.0)
    np.testing.assert_array_equal(masked, ids)
    assert (labels == IGNORE_LABEL).all() and (positions == 0).all()


def test_keep_fraction_one_leaves_tokens_but_labels_them():
    ids, mask = _sequence()
    masked, positions, labels = _mask(
        ids, mask, mask_rate=0.5, slots=10, mask_fraction=0.0, random_fraction=0.0
    )
    np.testing.assert_array_equal(masked, ids)
    assert (labels != IGNORE_LABEL).sum() == 7  # round(0.5 * 14 candidates)


def test_random_replacements_are_regular_tokens():
    ids, mask = _sequence(length=64, real=64)
    masked, positions, labels = _mask(
        ids, mask, mask_rate=1.0, slots=64, mask_fraction=0.0, random_fraction=1.0
    )
    valid = labels != IGNORE_LABEL
    assert (masked[positions[valid]] >= 5).all() and (masked < VOCAB).all()


def test_random_replacements_skip_special_ids_above_the_regular_ones():
    # A reused tokenizer may put <mask> last (roberta-base: 50264 of 50265): random
    # replacements come from every other non-special id, as the reference draws them.
    vocabulary, specials = 40, (0, 1, 2, 3, 39)
    rng = np.random.default_rng(0)
    ids = rng.integers(4, 39, (8, 64))  # no special among them: every position is a candidate
    mask = np.ones_like(ids)
    settings = dict(
        mask_rate=1.0,
        slots=64,
        mask_token_id=39,
        special_token_ids=specials,
        vocabulary_size=vocabulary,
    )
    got = dynamic_mask_batch(ids, mask, 5, np.arange(8), **settings)
    want = masking_reference.dynamic_mask(ids, mask, 5, np.arange(8), **settings)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    masked = got[0]
    # 80% <mask>, 10% random, 10% kept, of 512 positions: <mask> only where drawn as such.
    assert 0.72 < (masked == 39).mean() < 0.88
    replaced = masked[(masked != ids) & (masked != 39)]
    assert len(replaced) > 20 and not np.isin(replaced, specials).any()


def test_chosen_positions_fill_the_slots_in_position_order():
    ids, mask = _sequence(length=64, real=60)
    _, positions, labels = _mask(ids, mask, mask_rate=0.3, slots=20)
    valid = labels != IGNORE_LABEL
    assert valid.sum() == round(0.3 * 58) and valid[: valid.sum()].all()
    assert (np.diff(positions[valid]) > 0).all() and (positions[~valid] == 0).all()


@pytest.mark.parametrize("seed", range(20))
def test_specials_and_padding_are_never_chosen(seed):
    ids, mask = _sequence(seed=seed)
    _, positions, labels = _mask(ids, mask, seed=(seed, 1), mask_rate=0.6, slots=12)
    chosen = positions[labels != IGNORE_LABEL]
    assert (mask[chosen] == 1).all()
    assert not np.isin(ids[chosen], SPECIAL).any()
    assert len(set(chosen)) == len(chosen), "a position is chosen at most once"


def test_count_is_round_rate_times_candidates_capped_by_slots():
    ids, mask = _sequence(length=64, real=64)  # 62 candidates
    for rate, slots, expected in [(0.15, 12, 9), (0.15, 5, 5), (0.01, 12, 1)]:
        _, _, labels = _mask(ids, mask, mask_rate=rate, slots=slots)
        assert (labels != IGNORE_LABEL).sum() == expected


def test_same_seed_same_mask_other_seed_other_mask():
    ids, mask = _sequence(length=64, real=64)
    a = _mask(ids, mask, seed=(1, 5))
    b = _mask(ids, mask, seed=(1, 5))
    c = _mask(ids, mask, seed=(1, 6))
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[1], c[1])


def test_jitted_equals_eager_and_the_host_ops_inside_a_dataset_map():
    ids, mask = _sequence(length=32, real=28)
    jitted = _mask(ids, mask, seed=(3, 4), mask_rate=0.3, slots=9)
    keys = masking.element_keys(3, np.array([4]))
    eager = masking.dynamic_mask_batch(
        ids[None],
        mask[None],
        keys,
        mask_rate=0.3,
        slots=9,
        mask_token_id=4,
        special_token_ids=SPECIAL,
        vocabulary_size=VOCAB,
    )
    for x, y in zip(jitted, eager):
        np.testing.assert_array_equal(x, np.asarray(y)[0])
    from kroberta.config import DataConfig
    from kroberta.data import host_masking

    data = DataConfig(mask_rate=0.3, max_predictions=9, special_token_ids=SPECIAL)
    ds = tf.data.Dataset.from_tensors((ids[None], mask[None])).map(
        lambda i, m: host_masking.finished(
            {
                "token_ids": i,
                "padding_mask": m,
                "mask_keys": host_masking.element_keys(3, tf.constant([4], tf.int64)),
            },
            data,
            VOCAB,
        )
    )
    x, labels = next(iter(ds))
    assert x["mask_positions"].shape == labels.shape == (1, 9)
    for got, want in zip((x["token_ids"], x["mask_positions"], labels), jitted):
        np.testing.assert_array_equal(got.numpy()[0], want)


def test_more_slots_than_positions():
    ids, mask = _sequence(length=8, real=8)
    _, positions, labels = _mask(ids, mask, mask_rate=1.0, slots=12)
    assert positions.shape == (12,) and (labels != IGNORE_LABEL).sum() == 6


def test_static_slots_take_labels_in_position_order_and_count_overflow():
    labels = np.full(16, IGNORE_LABEL, np.int32)
    labels[[3, 5, 9, 12]] = [30, 50, 90, 120]
    from kroberta.model.predict_program import choose_slots

    positions, valid, slot_labels, dropped = [
        np.asarray(a)[0]
        for a in choose_slots(labels[None], np.ones((1, 16), np.int32), 3, "masked")
    ]
    np.testing.assert_array_equal(positions, [3, 5, 9])
    np.testing.assert_array_equal(slot_labels, [30, 50, 90])
    assert valid.all() and dropped == 1
    positions, slot_labels = masking.host_function(lambda t: masking.first_labelled_slots(t, 6))(
        labels[None]
    )
    np.testing.assert_array_equal(positions[0], [3, 5, 9, 12, 0, 0])
    np.testing.assert_array_equal(slot_labels[0], [30, 50, 90, 120, IGNORE_LABEL, IGNORE_LABEL])


# Whole-word masking: words are runs of candidates that start at a word-start id or
# after a special token / padding.
WORD_VOCAB = 300


def _words_reference(ids, mask, starts):
    """(candidates (L,), word number per position (L,)), the definition spelt out in numpy."""
    candidates = (mask == 1) & ~np.isin(ids, SPECIAL)
    begins = candidates & (starts[ids] | ~np.r_[False, candidates[:-1]])
    return candidates, np.cumsum(begins) - 1


def _word_batch(rows, length, seed=0):
    rng = np.random.default_rng(seed)
    starts = rng.random(WORD_VOCAB) < 0.5
    starts[list(SPECIAL)] = False
    ids = rng.integers(5, WORD_VOCAB, (rows, length))
    ids[:, 0], ids[:, -1] = 0, 2
    mask = np.ones_like(ids)
    mask[::4, length // 2 :] = 0  # some padded rows
    ids[::4, length // 2 :] = 1
    ids[1::5, length // 3] = 2  # a separator inside some rows: it ends a word
    return ids, mask, starts


def _whole_word_mask(ids, mask, starts, indices, **kwargs):
    params = dict(
        mask_rate=0.15,
        slots=12,
        mask_token_id=4,
        special_token_ids=SPECIAL,
        vocabulary_size=WORD_VOCAB,
        word_starts=starts,
    )
    params.update(kwargs)
    return dynamic_mask_batch(ids, mask, 11, indices, **params)


def test_whole_word_masks_never_split_a_word_and_keep_the_rate():
    rows, length, rate = 1700, 64, 0.15
    ids, mask, starts = _word_batch(rows, length)
    masked, positions, labels = _whole_word_mask(ids, mask, starts, np.arange(rows), slots=16)
    chosen_tokens = candidate_tokens = 0
    for row in range(rows):
        candidates, word = _words_reference(ids[row], mask[row], starts)
        valid = labels[row] != IGNORE_LABEL
        chosen = np.zeros(length, bool)
        chosen[positions[row][valid]] = True
        assert chosen[candidates].any() or not candidates.any()  # the first word always counts
        assert not chosen[~candidates].any()
        for w in np.unique(word[candidates]):
            tokens = chosen[candidates & (word == w)]
            assert tokens.all() or not tokens.any(), (row, w)
        np.testing.assert_array_equal(labels[row][valid], ids[row][positions[row][valid]])
        chosen_tokens += chosen.sum()
        candidate_tokens += candidates.sum()
    assert candidate_tokens > 8 * 10**4
    assert abs(chosen_tokens / candidate_tokens - rate) < 0.01
    written = np.take_along_axis(masked, positions, 1)[labels != IGNORE_LABEL]
    originals = labels[labels != IGNORE_LABEL]
    as_mask = (written == 4).mean()
    n = written.size
    assert abs(as_mask - 0.8) < 5 * math.sqrt(0.8 * 0.2 / n)
    # Positions not chosen keep their tokens.
    chosen_anywhere = np.zeros_like(ids, bool)
    row_of = np.broadcast_to(np.arange(rows)[:, None], positions.shape)
    valid = labels != IGNORE_LABEL
    chosen_anywhere[row_of[valid], positions[valid]] = True
    np.testing.assert_array_equal(masked[~chosen_anywhere], ids[~chosen_anywhere])
    assert (written[written != 4] >= 5).all() and (originals >= 5).all()


def test_whole_word_masks_depend_only_on_seed_and_index():
    ids, mask, starts = _word_batch(24, 40, seed=3)
    indices = np.arange(500, 524)
    whole = _whole_word_mask(ids, mask, starts, indices)
    for size in (8, 1):
        parts = [
            _whole_word_mask(ids[s : s + size], mask[s : s + size], starts, indices[s : s + size])
            for s in range(0, 24, size)
        ]
        for k in range(3):
            np.testing.assert_array_equal(np.concatenate([p[k] for p in parts]), whole[k])
    eager = masking.dynamic_mask_batch(
        ids,
        mask,
        masking.element_keys(11, indices),
        mask_rate=0.15,
        slots=12,
        mask_token_id=4,
        special_token_ids=SPECIAL,
        vocabulary_size=WORD_VOCAB,
        word_starts=starts,
    )
    for k in range(3):
        np.testing.assert_array_equal(np.asarray(eager[k]), whole[k])


def test_whole_words_longer_than_the_slots_are_never_split():
    # One long word of 10 tokens and slots for 4: nothing fits, nothing is split.
    starts = np.zeros(WORD_VOCAB, bool)
    starts[50] = True
    ids = np.array([[0, 50] + [60] * 9 + [2]])
    mask = np.ones_like(ids)
    _, positions, labels = _whole_word_mask(ids, mask, starts, np.arange(1), mask_rate=1.0, slots=4)
    assert (labels == IGNORE_LABEL).all()
    # With every token its own word, rate 1 chooses every candidate.
    _, positions, labels = _whole_word_mask(
        ids, mask, np.ones(WORD_VOCAB, bool), np.arange(1), mask_rate=1.0, slots=10
    )
    assert sorted(positions[0][labels[0] != IGNORE_LABEL]) == list(range(1, 11))


def _prepared_words(root):
    from tests.conftest import prepare_word_corpus

    # 300 tokens: few merges, so most of these words are several tokens long.
    words = ["alphabetical", "betatron", "gammaray", "deltawing", "omegapoint", "riverstone"]
    return prepare_word_corpus(root, words, documents=200)


def _split_words(batches, starts):
    """How many chosen words in these batches were chosen only in part."""
    split = 0
    for x, labels in batches:
        ids = x["token_ids"].copy()
        rows = np.broadcast_to(np.arange(len(ids))[:, None], labels.shape)
        valid = labels != IGNORE_LABEL
        ids[rows[valid], x["mask_positions"][valid]] = labels[valid]  # the original text
        for row in range(len(ids)):
            candidates, word = _words_reference(ids[row], x["padding_mask"][row], starts)
            chosen = np.zeros(ids.shape[1], bool)
            chosen[x["mask_positions"][row][valid[row]]] = True
            for w in np.unique(word[candidates & chosen]):
                split += not chosen[candidates & (word == w)].all()
    return split


def test_the_training_pipeline_masks_whole_words_of_the_tokenizer(tmp_path):
    import dataclasses

    import kroberta
    from kroberta.config import Config
    from kroberta.text.tokenizer import load_tokenizer, word_start_table

    directory = _prepared_words(tmp_path)
    tokenizer = load_tokenizer(directory / "tokenizer.json")
    starts = word_start_table(tokenizer, 300)
    assert starts[tokenizer.token_to_id("\u0120")] and not starts[tokenizer.token_to_id("e")]
    assert not starts[:5].any()

    def batches(whole_words):
        config = dataclasses.replace(
            Config(),
            run_dir=str(tmp_path / "run"),
            model=dataclasses.replace(Config().model, vocabulary_size=300, max_sequence_length=32),
            data=dataclasses.replace(
                Config().data, dir=str(directory), mask_rate=0.3, whole_word_masking=whole_words
            ),
            train=dataclasses.replace(Config().train, batch_size_per_device=4),
        )
        masked = kroberta.dataset(config, masks_on_host=True)
        return list(masked.take(8).as_numpy_iterator())

    assert _split_words(batches(True), starts) == 0
    assert _split_words(batches(False), starts) > 0  # token masking does split these words


def test_whole_word_masking_needs_dynamic_masking_and_a_tokenizer(tmp_path):
    import dataclasses

    from kroberta.config import Config, validate
    from kroberta.training import run_data

    config = Config()
    static = dataclasses.replace(config.data, masking="static", whole_word_masking=True)
    with pytest.raises(ConfigError, match="data.whole_word_masking: needs data.masking='dynamic'"):
        validate(dataclasses.replace(config, data=static))
    from kroberta.data.synthetic import write_seed_format

    path = str(tmp_path / "t.tfrecord")
    write_seed_format(path, 8, 16, 100, seed=1)
    files = dataclasses.replace(config.data, train=(path,), whole_word_masking=True)
    with pytest.raises(ConfigError, match="whole_word_masking: needs the run's tokenizer"):
        run_data.run_data_for(dataclasses.replace(config, data=files))


def test_element_keys_are_the_references():
    rng = np.random.default_rng(0)
    for seed in (0, 7, 2**33 + 5, -3):
        indices = np.concatenate([np.arange(5), rng.integers(0, 2**40, 60)])
        got = masking.element_keys(seed, indices)
        assert got.dtype == np.uint32
        np.testing.assert_array_equal(got, masking_reference.element_keys(seed, indices))


@pytest.mark.parametrize(
    "length,slots,rate,whole_words",
    [
        (1, 1, 0.15, False),
        (9, 24, 1.0, False),
        (64, 10, 0.15, False),
        (130, 40, 0.4, False),
        (64, 80, 0.15, False),
        (9, 12, 1.0, True),
        (48, 12, 0.15, True),
        (40, 3, 0.5, True),
        (130, 40, 0.3, True),
        (64, 6, 0.0, True),
    ],
)
def test_dynamic_masks_are_the_references(length, slots, rate, whole_words):
    rng = np.random.default_rng(length * slots)
    rows = 12
    ids = rng.integers(0, WORD_VOCAB, (rows, length))
    mask = (np.arange(length)[None, :] < rng.integers(0, length + 1, (rows, 1))).astype(np.int32)
    starts = rng.random(WORD_VOCAB) < 0.4 if whole_words else None
    indices = rng.integers(0, 2**36, rows)
    settings = dict(
        mask_rate=rate,
        slots=slots,
        mask_token_id=4,
        special_token_ids=SPECIAL,
        vocabulary_size=WORD_VOCAB,
        word_starts=starts,
    )
    got = dynamic_mask_batch(ids, mask, 99, indices, **settings)
    want = masking_reference.dynamic_mask(ids, mask, 99, indices, **settings)
    for name, g, w in zip(("ids", "positions", "labels"), got, want):
        np.testing.assert_array_equal(g, w, err_msg=name)


@pytest.mark.parametrize(
    "length,slots,share", [(1, 1, 0.5), (16, 4, 0.15), (40, 60, 0.6), (64, 10, 0.0), (64, 10, 1.0)]
)
def test_static_slots_are_the_references(length, slots, share):
    """Training's static slots and prediction's (chosen in the predict program from the
    labels or <mask> marks) against the numpy reference, with the overflow counts."""
    from kroberta.model.predict_program import choose_slots

    rng = np.random.default_rng(length + slots)
    labels = np.where(
        rng.random((9, length)) < share, rng.integers(5, VOCAB, (9, length)), IGNORE_LABEL
    ).astype(np.int32)
    want = masking_reference.static_slots(labels, slots)
    got = masking.host_function(lambda t: masking.first_labelled_slots(t, slots))(labels)
    where, valid, in_predict, dropped = jax.jit(choose_slots, static_argnums=(2, 3))(
        labels, np.ones_like(labels), slots, "masked"
    )
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(where, want[0])
    np.testing.assert_array_equal(in_predict, want[1])
    np.testing.assert_array_equal(valid, want[1] != IGNORE_LABEL)
    np.testing.assert_array_equal(dropped, want[2])


def test_static_labels_are_the_dynamic_masks_written_per_position():
    rng = np.random.default_rng(5)
    ids = rng.integers(5, VOCAB, (6, 20))
    mask = np.ones_like(ids)
    masked, labels = masking.static_labels(
        ids,
        mask,
        4,
        np.arange(10, 16),
        mask_rate=0.3,
        mask_token_id=4,
        special_token_ids=SPECIAL,
        vocabulary_size=VOCAB,
    )
    want_ids, positions, slot_labels = masking_reference.dynamic_mask(
        ids,
        mask,
        4,
        np.arange(10, 16),
        mask_rate=0.3,
        slots=20,
        mask_token_id=4,
        special_token_ids=SPECIAL,
        vocabulary_size=VOCAB,
    )
    np.testing.assert_array_equal(masked, want_ids)
    want = np.full_like(ids, IGNORE_LABEL)
    for row in range(6):
        valid = slot_labels[row] != IGNORE_LABEL
        want[row, positions[row][valid]] = slot_labels[row][valid]
    np.testing.assert_array_equal(labels, want)
    assert ((labels != IGNORE_LABEL).sum(1) == 6).all()  # round(0.3 * 20), exactly
