import math

import numpy as np
import pytest
import tensorflow as tf

from kroberta.data.masking import IGNORE_LABEL, dynamic_mask, dynamic_mask_batch, static_slots

SPECIAL = (0, 1, 2, 3, 4)
VOCAB = 100


def _sequence(length=20, real=16, seed=0):
    rng = np.random.default_rng(seed)
    ids = np.full(length, 1, np.int32)
    ids[0] = 0
    ids[1:real - 1] = rng.integers(5, VOCAB, real - 2)
    ids[real - 1] = 2
    mask = (np.arange(length) < real).astype(np.int32)
    return ids, mask


def _mask(ids, mask, seed=(7, 3), **kwargs):
    params = dict(mask_rate=0.15, slots=6, mask_token_id=4, special_token_ids=SPECIAL,
                  vocabulary_size=VOCAB)
    params.update(kwargs)
    out = dynamic_mask(tf.constant(ids), tf.constant(mask), tf.constant(seed, tf.int64), **params)
    return [t.numpy() for t in out]


def test_rate_one_with_all_mask_selects_every_candidate():
    ids, mask = _sequence()
    masked, positions, labels = _mask(ids, mask, mask_rate=1.0, slots=20, mask_fraction=1.0,
                                      random_fraction=0.0)
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
    masked, positions, labels = _mask(ids, mask, mask_rate=0.5, slots=10, mask_fraction=0.0,
                                      random_fraction=0.0)
    np.testing.assert_array_equal(masked, ids)
    assert (labels != IGNORE_LABEL).sum() == 7  # round(0.5 * 14 candidates)


def test_random_replacements_are_regular_tokens():
    ids, mask = _sequence(length=64, real=64)
    masked, positions, labels = _mask(ids, mask, mask_rate=1.0, slots=64, mask_fraction=0.0,
                                      random_fraction=1.0)
    valid = labels != IGNORE_LABEL
    assert (masked[positions[valid]] >= 5).all() and (masked < VOCAB).all()


def _highest_scoring_reference(scores, candidates, count):
    """What top_k chooses: per row, the `count` candidates of highest score, ties to the
    lower position (a stable sort of the negated scores)."""
    chosen = np.zeros_like(candidates)
    for row in range(len(scores)):
        where = np.flatnonzero(candidates[row])
        order = where[np.argsort(-scores[row][where], kind="stable")]
        chosen[row, order[:count[row]]] = True
    return chosen


@pytest.mark.parametrize("rows,length,score_bits", [
    (64, 512, 24),  # the 512-token batch the selection was made for
    (200, 40, 24),  # over 128 rows: the sort key needs its 64 bits
    (50, 64, 3),  # a handful of distinct scores: ties everywhere, all in one bucket
    (9, 1, 24),  # one position
])
def test_highest_scoring_chooses_what_top_k_chooses(rows, length, score_bits):
    from kroberta.data.masking import _highest_scoring

    rng = np.random.default_rng(rows * length)
    scores = (rng.integers(0, 1 << score_bits, (rows, length)) << (24 - score_bits)).astype(np.int32)
    candidates = rng.random((rows, length)) < 0.9
    candidates[1] = False  # a row without candidates
    available = candidates.sum(1)
    count = np.minimum(rng.integers(0, length + 1, rows), available).astype(np.int32)
    count[2] = available[2]  # a row that takes every candidate
    got = _highest_scoring(tf.constant(scores), tf.constant(candidates), tf.constant(count)).numpy()
    np.testing.assert_array_equal(got, _highest_scoring_reference(scores, candidates, count))


@pytest.mark.parametrize("length", [1, 16, 64, 200])
def test_top_k_and_bucketed_slots_are_the_same(length):
    from kroberta.data.masking import _chosen_slots

    rng = np.random.default_rng(length)
    rows, slots = 40, max(1, length // 4)
    scores = tf.constant(rng.integers(0, 1 << 24, (rows, length)), tf.int32)
    candidates = rng.random((rows, length)) < 0.8
    count = np.minimum(rng.integers(0, slots + 1, rows), candidates.sum(1)).astype(np.int32)
    for extra_slots in (0, length + 3):  # also more slots than positions
        args = (scores, tf.constant(candidates), tf.constant(count), slots + extra_slots)
        by_top_k = [t.numpy() for t in _chosen_slots(*args, by_top_k=True)]
        by_buckets = [t.numpy() for t in _chosen_slots(*args, by_top_k=False)]
        for a, b in zip(by_top_k, by_buckets):
            np.testing.assert_array_equal(a, b)


def test_chosen_positions_fill_the_slots_in_position_order():
    ids, mask = _sequence(length=64, real=60)
    _, positions, labels = _mask(ids, mask, mask_rate=0.3, slots=20)
    valid = labels != IGNORE_LABEL
    assert valid.sum() == round(0.3 * 58) and valid[:valid.sum()].all()
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


def test_eager_equals_inside_dataset_map():
    ids, mask = _sequence(length=32, real=28)
    eager = _mask(ids, mask, seed=(3, 4), mask_rate=0.3, slots=9)
    ds = tf.data.Dataset.from_tensors((ids, mask)).map(
        lambda i, m: dynamic_mask(i, m, tf.constant((3, 4), tf.int64), mask_rate=0.3, slots=9,
                                  mask_token_id=4, special_token_ids=SPECIAL, vocabulary_size=VOCAB))
    mapped = [t.numpy() for t in next(iter(ds))]
    for x, y in zip(eager, mapped):
        np.testing.assert_array_equal(x, y)


def test_more_slots_than_positions():
    ids, mask = _sequence(length=8, real=8)
    _, positions, labels = _mask(ids, mask, mask_rate=1.0, slots=12)
    assert positions.shape == (12,) and (labels != IGNORE_LABEL).sum() == 6


def test_static_slots_take_labels_in_position_order_and_count_overflow():
    labels = np.full(16, IGNORE_LABEL, np.int32)
    labels[[3, 5, 9, 12]] = [30, 50, 90, 120]
    positions, slot_labels, dropped = [t.numpy() for t in static_slots(tf.constant(labels), 3)]
    np.testing.assert_array_equal(positions, [3, 5, 9])
    np.testing.assert_array_equal(slot_labels, [30, 50, 90])
    assert dropped == 1
    positions, slot_labels, dropped = [t.numpy() for t in static_slots(tf.constant(labels), 6)]
    np.testing.assert_array_equal(positions, [3, 5, 9, 12, 0, 0])
    np.testing.assert_array_equal(slot_labels, [30, 50, 90, 120, IGNORE_LABEL, IGNORE_LABEL])
    assert dropped == 0


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
    mask[::4, length // 2:] = 0  # some padded rows
    ids[::4, length // 2:] = 1
    ids[1::5, length // 3] = 2  # a separator inside some rows: it ends a word
    return ids, mask, starts


def _whole_word_mask(ids, mask, starts, indices, **kwargs):
    params = dict(mask_rate=0.15, slots=12, mask_token_id=4, special_token_ids=SPECIAL,
                  vocabulary_size=WORD_VOCAB, word_starts=starts)
    params.update(kwargs)
    return [t.numpy() for t in dynamic_mask_batch(ids, mask, 11, indices, **params)]


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
        parts = [_whole_word_mask(ids[s:s + size], mask[s:s + size], starts, indices[s:s + size])
                 for s in range(0, 24, size)]
        for k in range(3):
            np.testing.assert_array_equal(np.concatenate([p[k] for p in parts]), whole[k])
    in_graph = tf.function(lambda a, b, i: dynamic_mask_batch(
        a, b, 11, i, mask_rate=0.15, slots=12, mask_token_id=4, special_token_ids=SPECIAL,
        vocabulary_size=WORD_VOCAB, word_starts=starts))(ids, mask, indices)
    for k in range(3):
        np.testing.assert_array_equal(in_graph[k].numpy(), whole[k])


def test_whole_words_longer_than_the_slots_are_never_split():
    # One long word of 10 tokens and slots for 4: nothing fits, nothing is split.
    starts = np.zeros(WORD_VOCAB, bool)
    starts[50] = True
    ids = np.array([[0, 50] + [60] * 9 + [2]])
    mask = np.ones_like(ids)
    _, positions, labels = _whole_word_mask(ids, mask, starts, np.arange(1), mask_rate=1.0, slots=4)
    assert (labels == IGNORE_LABEL).all()
    # With every token its own word, rate 1 chooses every candidate.
    _, positions, labels = _whole_word_mask(ids, mask, np.ones(WORD_VOCAB, bool), np.arange(1),
                                            mask_rate=1.0, slots=10)
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
            Config(), run_dir=str(tmp_path / "run"),
            model=dataclasses.replace(Config().model, vocabulary_size=300, max_sequence_length=32),
            data=dataclasses.replace(Config().data, dir=str(directory), mask_rate=0.3,
                                     whole_word_masking=whole_words),
            train=dataclasses.replace(Config().train, batch_size_per_device=4))
        masked = kroberta.dataset(config, log=lambda *_: None, masks_on_host=True)
        return list(masked.take(8).as_numpy_iterator())

    assert _split_words(batches(True), starts) == 0
    assert _split_words(batches(False), starts) > 0  # token masking does split these words


def test_whole_word_masking_needs_dynamic_masking_and_a_tokenizer(tmp_path):
    import dataclasses

    from kroberta.training import run_data
    from kroberta.config import Config, ConfigError, validate

    config = Config()
    static = dataclasses.replace(config.data, masking="static", whole_word_masking=True)
    with pytest.raises(ConfigError, match="data.whole_word_masking: needs data.masking='dynamic'"):
        validate(dataclasses.replace(config, data=static))
    from kroberta.data.synthetic import write_seed_format

    path = str(tmp_path / "t.tfrecord")
    write_seed_format(path, 8, 16, 100, seed=1)
    files = dataclasses.replace(config.data, train=(path,), whole_word_masking=True)
    with pytest.raises(ConfigError, match="whole_word_masking: needs the run's tokenizer"):
        run_data.resolve(dataclasses.replace(config, data=files), log=lambda *_: None)
