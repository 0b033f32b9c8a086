"""Gradient accumulation (kroberta.model.masked_lm): N micro-batches per optimizer step give
the update of one batch N times larger, the loss normalised by the whole batch's masked
tokens; K steps per dispatch scan the accumulating step."""

import dataclasses

import numpy as np
import pytest

from kroberta import train
from kroberta.config import validate
from kroberta.data import pipeline
from kroberta.errors import ConfigError
from kroberta.model import masked_lm
from tests.conftest import tiny_config
from tests.pretraining.test_train import _rows, _weights

RUN = dict(steps=20, warmup_steps=4, log_every=10, eval_every=20, checkpoint_every=20)


def _one_device(config, batch, accumulate, k):
    train_ = dataclasses.replace(
        config.train,
        batch_size_per_device=batch,
        gradient_accumulation_steps=accumulate,
        steps_per_execution=k,
    )
    # Static masks: both runs predict exactly the same tokens of the same records.
    data = dataclasses.replace(config.data, masking="static")
    return dataclasses.replace(
        config,
        train=train_,
        data=data,
        distributed=dataclasses.replace(config.distributed, devices=1),
    )


@pytest.fixture(scope="module")
def runs(tiny_data, tmp_path_factory):
    """One device: batches of 8; 2 micro-batches of 4 (K = 1); the same with K = 5."""
    root = tmp_path_factory.mktemp("accumulation")
    base = tiny_config(tiny_data, root, **RUN)
    configs = {
        "b8": _one_device(base, 8, 1, 1),
        "a2x4": _one_device(base, 4, 2, 1),
        "a2x4-k5": _one_device(base, 4, 2, 5),
    }
    summaries = {}
    for name, config in configs.items():
        summaries[name] = train(dataclasses.replace(config, run_dir=str(root / name)))
    return root, summaries, configs


def _assert_same_weights(a, b):
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys() and len(wa) > 20
    for name in wa:
        np.testing.assert_allclose(wb[name], wa[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_two_micro_batches_of_4_equal_one_batch_of_8(runs):
    root, summaries, _ = runs
    for name in ("a2x4", "a2x4-k5"):
        assert summaries[name]["final_step"] == summaries["b8"]["final_step"] == 20
        assert summaries[name]["global_batch"] == 8
        _assert_same_weights(root / "b8", root / name)
        rows, expected = _rows(root / name), _rows(root / "b8")
        assert [r["step"] for r in rows] == [r["step"] for r in expected] == [10, 20]
        for row, want in zip(rows, expected):
            for key in ("loss", "masked_accuracy", "learning_rate"):
                assert row[key] == pytest.approx(want[key], rel=1e-5), (name, key)
            if "step_time" in row:  # counted in optimizer steps of 8 sequences
                assert row["step_time"] == pytest.approx(8 / row["samples_per_second"])


def test_micro_batches_hold_unequal_masked_counts(runs, tiny_data):
    """What makes the normalisation matter: a mean of the two micro-batch means would
    weigh these tokens unequally and give another update."""
    _, _, configs = runs
    config = configs["a2x4"]
    spec = pipeline.inspect_files(pipeline.resolve_files(config.data.train, "t"), "t")
    batches = (
        pipeline.train_dataset(
            spec, config.data, config.model.vocabulary_size, 8, config.train.seed, 0
        )
        .take(20)
        .as_numpy_iterator()
    )
    unequal = 0
    for _, y in batches:
        counts = [int((part != -100).sum()) for part in np.asarray(masked_lm.micro_batches(y, 2))]
        unequal += counts[0] != counts[1]
    assert unequal >= 10


def test_micro_batches_are_strided_so_each_device_keeps_its_rows():
    # Rows 0-3 on one device, 4-7 on another: each micro-batch takes two rows from each.
    parts = np.asarray(masked_lm.micro_batches(np.arange(8), 2))
    np.testing.assert_array_equal(parts, [[0, 2, 4, 6], [1, 3, 5, 7]])
    assert float(masked_lm.masked_tokens(np.array([[5, -100], [-100, -100]]))) == 1.0
    with pytest.raises(ValueError, match="does not split into 3"):
        masked_lm.micro_batches(np.arange(8), 3)


@pytest.mark.parametrize("value", [0, -2])
def test_bad_accumulation_is_a_config_error(tiny_data, tmp_path, value):
    config = tiny_config(tiny_data, tmp_path, gradient_accumulation_steps=value)
    with pytest.raises(ConfigError, match="train.gradient_accumulation_steps: must be >= 1"):
        validate(config)
