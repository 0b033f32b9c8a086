"""The record rules (`kroberta.data.rules`): one definition that every reader applies."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from kroberta.data import bad_records, batch_parsing, rules
from kroberta.data.check import check_records
from kroberta.data.records import FEATURES
from tests.conftest import serialize_example, write_records

# The fast tier (docs/contributing.md): builds no model and starts no process.
pytestmark = pytest.mark.fast

L, V = 8, 50


def _record(input_ids):
    return serialize_example(
        {"input_ids": input_ids, "attention_mask": [1] * 5 + [0] * 3, "labels": [-100] * L}
    )


def test_the_pipelines_fast_check_is_the_value_rules():
    # Edge values of int64 around every bound: the fast path's uint64 maxima must accept
    # exactly the batches that no value rule flags.
    edges = np.array(
        [
            np.iinfo(np.int64).min,
            -101,
            -100,
            -99,
            -1,
            0,
            1,
            2,
            V - 1,
            V,
            V + 1,
            np.iinfo(np.int64).max,
        ],
        np.int64,
    )
    rng = np.random.default_rng(0)
    for _ in range(200):
        dense = {name: np.zeros((2, L), np.int64) for name in FEATURES}
        dense["attention_mask"][:] = 1
        name = rng.choice(FEATURES)
        dense[name][rng.integers(2), rng.integers(L)] = rng.choice(edges)
        expected = not any(rule.bad(dense[rule.feature], V).any() for rule in rules.VALUE_RULES)
        tensors = {n: tf.constant(v) for n, v in dense.items()}
        assert bool(batch_parsing._values_in_range(tensors, V, with_labels=True)) == expected, dense


def test_a_rule_changed_in_rules_changes_every_reader(tmp_path, monkeypatch):
    # Ids below 10 only: a record with id 20 (in the vocabulary of 50) now breaks a rule.
    narrow = dataclasses.replace(rules.INPUT_IDS, upper=10)
    monkeypatch.setattr(rules, "RECORD_RULES", (narrow,) + rules.RECORD_RULES[1:])
    monkeypatch.setattr(rules, "VALUE_RULES", (narrow,) + rules.VALUE_RULES[1:])
    payloads = [_record([0, 7, 8, 9, 2, 1, 1, 1])] * 3 + [_record([0, 7, 20, 9, 2, 1, 1, 1])]
    path = write_records(tmp_path / "narrow.tfrecord", payloads)

    # prepare --check
    report = check_records([path], vocabulary_size=V, sequence_length=L)
    assert str(report.defects[0]) == (
        f"{path}: record 3: feature 'input_ids' value 20: id outside [0, 10) at position 2"
    )
    # The pipeline's in-graph check (both parses) ...
    tagged = ([path] * 4, np.arange(4, dtype=np.int64), payloads)
    for lengths_named in (True, False):
        with pytest.raises(tf.errors.InvalidArgumentError, match="record 3: feature 'input_ids'"):
            batch_parsing.parse_checked_batch(
                *map(tf.constant, tagged),
                length=L,
                vocabulary_size=V,
                with_labels=True,
                lengths_named=lengths_named,
            )
    # ... and the replay that names the record.
    error = bad_records.first_bad_record(
        tf.data.Dataset.from_tensor_slices(tagged), length=L, vocabulary_size=V, with_labels=True
    )
    assert (
        str(error)
        == f"{path}: record 3: feature 'input_ids' holds id 20 outside the vocabulary [0, 10)"
    )
