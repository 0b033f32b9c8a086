"""The training model's step (kroberta.model.masked_lm): every composition of masking x gradient
accumulation x K steps per dispatch trains exactly as host masks, one batch and one step per
dispatch do; `grad_norm` is the norm of the gradient before clipping; saving stays stock."""

import dataclasses

import jax
import jax.numpy as jnp
import keras
import keras_hub
import numpy as np
import pytest

from kroberta import masking
from kroberta.config import Config, DataConfig, ModelConfig, TrainConfig
from kroberta.model.masked_lm import MaskedLM
from kroberta.model.metrics import MaskedLMLoss
from kroberta.model.mlm import build_compiled_model

MODEL = ModelConfig(
    vocabulary_size=64,
    num_layers=1,
    num_heads=2,
    hidden_dim=8,
    intermediate_dim=16,
    max_sequence_length=8,
    dropout=0.0,
)
ROWS, STEPS, SEED = 8, 4, 3  # rows per optimizer step; optimizer steps per fit
DATA = DataConfig(mask_rate=0.3)
SLOTS = DATA.prediction_slots(MODEL.max_sequence_length)


def _config(accumulation=1, k=1, clip_norm=0.0):
    # The micro-batch is the batch divided by N: the optimizer step always sees ROWS rows.
    train = TrainConfig(
        batch_size_per_device=ROWS // accumulation,
        steps=STEPS,
        warmup_steps=0,
        warmup_fraction=0.0,
        steps_per_execution=k,
        log_every=STEPS,
        eval_every=0,
        checkpoint_every=0,
        learning_rate=1e-2,
        seed=SEED,
        gradient_accumulation_steps=accumulation,
        clip_norm=clip_norm,
    )
    return Config(
        model=MODEL,
        data=DATA,
        train=train,
        distributed=dataclasses.replace(Config().distributed, devices=1),
    )


def _batches():
    """The same STEPS batches of ROWS rows three ways: {"keys": x with mask_keys,
    "labels": x with the file's per-position labels, "host": (x, y) masked on the host}."""
    rng = np.random.default_rng(0)
    n, length = ROWS * STEPS, MODEL.max_sequence_length
    lengths = rng.integers(3, length + 1, n)
    real = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int32)  # (n, L)
    ids = np.where(real == 1, rng.integers(5, MODEL.vocabulary_size, (n, length)), 1)
    ids[:, 0] = 0
    ids = ids.astype(np.int32)
    indices = np.arange(n, dtype=np.int64)
    keys = masking.element_keys(SEED, indices)
    masked, positions, labels = (
        np.asarray(a)
        for a in masking.dynamic_mask_batch(
            ids,
            real,
            keys,
            mask_rate=DATA.mask_rate,
            slots=SLOTS,
            mask_token_id=DATA.mask_token_id,
            special_token_ids=DATA.special_token_ids,
            vocabulary_size=MODEL.vocabulary_size,
        )
    )
    token_labels = np.full_like(ids, -100)  # a static file: labels where the host masked
    rows = np.broadcast_to(np.arange(n)[:, None], positions.shape)
    valid = labels != -100
    token_labels[rows[valid], positions[valid]] = labels[valid]
    return {
        "keys": ({"token_ids": ids, "padding_mask": real, "mask_keys": keys},),
        "labels": ({"token_ids": masked, "padding_mask": real, "token_labels": token_labels},),
        "host": ({"token_ids": masked, "padding_mask": real, "mask_positions": positions}, labels),
    }


def _train(config, data):
    model = build_compiled_model(config)
    history = model.fit(*data, batch_size=ROWS, epochs=1, verbose=0, shuffle=False)
    assert int(model.optimizer.iterations.numpy()) == STEPS
    return [np.asarray(w) for w in model.trainable_weights], history.history


@pytest.fixture(scope="module")
def reference():
    """Host masks, one batch per optimizer step, one step per dispatch."""
    return _batches(), _train(_config(), _batches()["host"])


@pytest.mark.stack
@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("accumulation", [1, 2])
@pytest.mark.parametrize("masking_mode", ["keys", "labels", "host"])
def test_every_composition_trains_as_host_masks_one_batch_one_step(
    reference, masking_mode, accumulation, k
):
    batches, (want_weights, want_history) = reference
    if (masking_mode, accumulation, k) == ("host", 1, 1):
        pytest.skip("the reference itself")
    weights, history = _train(_config(accumulation, k), batches[masking_mode])
    for got, want in zip(weights, want_weights):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for key in ("loss", "masked_accuracy", "perplexity", "grad_norm"):
        assert history[key] == pytest.approx(want_history[key], rel=1e-5), key


@pytest.mark.stack
@pytest.mark.parametrize("accumulation", [1, 2])
def test_grad_norm_is_the_norm_of_the_gradient_before_clipping(accumulation):
    """One optimizer step, clipped at a norm far below the gradient's: the logged
    grad_norm is that of jax.grad of the whole batch's masked loss (also under
    accumulation: the accumulated gradient is the whole batch's)."""
    config = _config(accumulation, clip_norm=1e-3)
    model = build_compiled_model(config)
    x, y = _batches()["host"]
    x, y = {name: v[:ROWS] for name, v in x.items()}, y[:ROWS]
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    def loss(weights):
        logits, _ = model.stateless_call(weights, non_trainable, x, training=True)
        return MaskedLMLoss()(y, logits)

    grads = jax.grad(loss)(trainable)
    expected = float(jnp.sqrt(sum(jnp.sum(g.astype("float32") ** 2) for g in grads)))
    history = model.fit(x, y, batch_size=ROWS, epochs=1, verbose=0, shuffle=False).history
    assert expected > 10 * 1e-3  # the clipping bites: a norm after it would be 1e-3
    assert history["grad_norm"][0] == pytest.approx(expected, rel=1e-5)


def test_the_training_model_is_the_stock_model_with_steps():
    model = build_compiled_model(_config())
    assert isinstance(model, MaskedLM)
    assert isinstance(model, keras_hub.models.RobertaMaskedLM)
    stock = keras_hub.models.RobertaMaskedLM.from_config(model.get_config())
    assert [w.path for w in stock.weights] == [w.path for w in model.weights]
    assert "grad_norm" in [m.name for m in model.metrics]
    assert not any(isinstance(v, keras.Variable) and "grad_norm" in v.path for v in model.weights)
