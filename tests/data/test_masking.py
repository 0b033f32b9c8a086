import numpy as np
import pytest
import tensorflow as tf

from kroberta.data.masking import IGNORE_LABEL, dynamic_mask, static_slots

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
