"""G prediction batches per dispatch: the same results as one batch at a time, for any N,
with one compiled program per group size."""

import numpy as np
import pytest
import tensorflow as tf

import kroberta
from kroberta.config import Config, ModelConfig, TrainConfig
from kroberta.data.synthetic import make_sequences, mask_once
from kroberta.errors import InputError
from kroberta.inference import prediction
from tests.conftest import jit_traces, saved_tiny_model

V, L = 300, 16
TINY = ModelConfig(
    vocabulary_size=V,
    num_layers=1,
    num_heads=2,
    hidden_dim=16,
    intermediate_dim=32,
    max_sequence_length=L,
    dropout=0.0,
)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("dispatch_run")
    # 4 sequences per device: batches of 16 on the 4 simulated devices.
    config = Config(model=TINY, train=TrainConfig(batch_size_per_device=4), run_dir=str(run_dir))
    return saved_tiny_model(run_dir, config, seed=2)


def _arrays(n, seed=0):
    ids, mask = make_sequences(n, L, V, seed=seed, min_fill=0.5)
    masked, labels = mask_once(ids, mask, V, seed=seed, rate=0.2)
    return {"input_ids": masked, "attention_mask": mask, "labels": labels}


@pytest.mark.parametrize("output", ["top_k", "loss", "embeddings"])
def test_groups_of_batches_equal_one_batch_at_a_time(model, output):
    arrays = _arrays(70)  # 5 batches of 16, the last one 6 rows: no multiple of G x 16
    one = kroberta.predict(model, arrays, output=output, batches_per_dispatch=1)
    for group in (2, 3, 8, None):
        grouped = kroberta.predict(model, arrays, output=output, batches_per_dispatch=group)
        assert grouped.keys() == one.keys()
        for name in one:
            np.testing.assert_array_equal(grouped[name], one[name], err_msg=f"{group} {name}")
    assert len(one["valid" if output != "embeddings" else "embeddings"]) == 70


def test_a_dataset_source_gives_the_same_groups(model):
    arrays = _arrays(37, seed=4)
    dataset = tf.data.Dataset.from_tensor_slices(arrays)
    one = kroberta.predict(model, arrays, batches_per_dispatch=1)
    grouped = kroberta.predict(model, dataset, batches_per_dispatch=2)
    for name in one:
        np.testing.assert_array_equal(grouped[name], one[name])


def test_a_short_last_group_needs_no_new_program(model):
    kroberta.predict(model, _arrays(70), batches_per_dispatch=4)  # groups of 4 and 1
    with jit_traces() as traced:
        kroberta.predict(model, _arrays(40, seed=1), batches_per_dispatch=4)  # one group of 3
        kroberta.predict(model, _arrays(100, seed=2), batches_per_dispatch=4)  # 4 + 3
    assert "step" not in traced  # the predict program


def test_predict_batches_yields_one_chunk_per_dispatch(model):
    chunks = list(
        prediction.predict_batches(model, _arrays(70), output="loss", batches_per_dispatch=2)
    )
    assert [len(c["loss"]) for c in chunks] == [32, 32, 6]


def test_the_default_group_is_the_same_for_every_input_size(model):
    config = model.kroberta_config
    assert config.train.steps_per_execution == "auto"
    # A tiny model: 128 batches (the cap: half of 256) hold less than the 20 ms "auto"
    # wants; any N shares them.
    sizes = {
        prediction.prediction_plan(config, L).prediction_group(16, 3, n) for n in (3, 70, 10_000)
    }
    assert sizes == {128}
    # An explicit K is capped by what the inputs need (rounded up to a power of two).
    fixed = config.__class__(model=config.model, train=TrainConfig(steps_per_execution=6))
    plan = prediction.prediction_plan(fixed, L)
    assert plan.prediction_group(16, 3, 70) == 6
    assert plan.prediction_group(16, 3, 40) == 4
    assert plan.prediction_group(16, 3, 3) == 1


def test_full_logits_are_dispatched_in_bounded_groups(model, monkeypatch):
    slots = model.kroberta_config.data.prediction_slots(L)
    monkeypatch.setattr(prediction, "MAX_LOGITS_BYTES", 2 * 16 * slots * V * 4)  # two batches
    chunks = list(prediction.predict_batches(model, _arrays(70), output="logits"))
    assert [len(c["logits"]) for c in chunks] == [32, 32, 6]


def test_a_group_size_below_one_is_a_clear_error(model):
    with pytest.raises(InputError, match="batches_per_dispatch must be >= 1, got 0"):
        kroberta.predict(model, _arrays(4), batches_per_dispatch=0)
