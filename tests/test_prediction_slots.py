"""data.max_predictions: the prediction slots follow the sequence length, and a value that
caps the masks below data.mask_rate is named at the start of a run."""

import dataclasses
import math

import numpy as np
import pytest

from kroberta.config import DataConfig, load_config
from kroberta.masking import dynamic_mask_batch, element_keys
from kroberta.tokens import BOS_ID, EOS_ID, MASK_ID, SPECIAL_IDS


def test_dynamic_auto_slots_are_unchanged():
    data = DataConfig(mask_rate=0.15, masking="dynamic")
    assert [data.prediction_slots(L) for L in (16, 32, 64, 128, 512)] == [3, 6, 12, 24, 96]


def test_static_auto_slots_cover_the_binomial_spread():
    data = DataConfig(mask_rate=0.15, masking="static")
    # ceil(0.15 L + 2 sqrt(L 0.15 0.85)); from ~363 tokens on 1.25 * 0.15 L is larger.
    assert [data.prediction_slots(L) for L in (64, 128, 512)] == [16, 28, 96]


def test_the_seed_config_keeps_its_16_slots_on_its_own_files_and_follows_a_longer_sequence():
    seed = load_config("seed")
    assert seed.data.with_masking_for(has_labels=True).prediction_slots(64) == 16  # as before
    longer = load_config("seed", {"model.max_sequence_length": 128})
    dynamic = longer.data.with_masking_for(has_labels=False)
    assert dynamic.prediction_slots(128) >= round(0.15 * 126) == 19
    assert dynamic.capped_masking(128) is None


@pytest.mark.parametrize("name", ["seed", "tiny", "base"])
@pytest.mark.parametrize("has_labels", [False, True])
def test_no_shipped_config_caps_the_masks(name, has_labels):
    config = load_config(name)
    data = config.data.with_masking_for(has_labels)
    L = config.model.max_sequence_length
    assert data.capped_masking(L) is None
    assert data.prediction_slots(L) >= round(data.mask_rate * (L - 2))


def test_an_explicit_cap_is_named_with_the_rate_it_masks():
    data = DataConfig(mask_rate=0.15, masking="dynamic", max_predictions=16)
    assert data.capped_masking(64) is None
    message = data.capped_masking(128)
    assert message == (
        "data.max_predictions=16 caps the masks at 16 of 126 tokens in a full sequence of 128: "
        "12.7% masked, not data.mask_rate=0.15 (19 tokens); set data.max_predictions=0 "
        "(follows the sequence length: 24 here) or at least 19"
    )
    assert dataclasses.replace(data, max_predictions=19).capped_masking(128) is None
    assert dataclasses.replace(data, masking="static").capped_masking(128) is None  # files' labels


@pytest.mark.parametrize("max_predictions, expected", [(0, 19), (16, 16)])
def test_the_masked_share_of_a_full_sequence(max_predictions, expected):
    L, rows = 128, 8
    data = DataConfig(mask_rate=0.15, masking="dynamic", max_predictions=max_predictions)
    ids = np.random.default_rng(0).integers(len(SPECIAL_IDS), 1000, (rows, L)).astype(np.int32)
    ids[:, 0], ids[:, -1] = BOS_ID, EOS_ID
    keys = element_keys(0, np.arange(rows, dtype=np.int64))
    _, _, labels = dynamic_mask_batch(
        ids,
        np.ones((rows, L), np.int32),
        keys,
        mask_rate=data.mask_rate,
        slots=data.prediction_slots(L),
        mask_token_id=MASK_ID,
        special_token_ids=SPECIAL_IDS,
        vocabulary_size=1000,
    )
    counts = (np.asarray(labels) != -100).sum(axis=1)
    assert counts.tolist() == [expected] * rows
    assert math.isclose(expected / (L - 2), 0.15, abs_tol=0.002) == (max_predictions == 0)


@pytest.mark.slow  # a whole (one-step) run: ~70 s here
def test_a_run_names_the_rate_it_really_masks_at_its_start(tiny_data, tmp_path, caplog):
    from kroberta.pretraining.train import train
    from tests.conftest import tiny_config

    config = tiny_config(
        tiny_data,
        tmp_path / "run",
        steps=1,
        warmup_steps=0,
        eval_every=1,
        log_every=1,
        checkpoint_every=1,
        eval_steps=1,
    )
    config = dataclasses.replace(config, data=dataclasses.replace(config.data, max_predictions=2))
    with caplog.at_level("INFO"):
        train(config)
    assert (
        "data.max_predictions=2 caps the masks at 2 of 30 tokens in a full sequence of 32: 6.7% masked, "
        "not data.mask_rate=0.15 (4 tokens)"
    ) in caplog.text
