"""Rematerialisation per encoder block (kroberta.model.remat, `train.remat`): the same
loss, gradients, dropout draws and trained weights as without it; only the compiled
step's recompute (FLOPs) and memory change."""

import dataclasses

import jax
import numpy as np
import pytest

from kroberta import train
from kroberta.config import ModelConfig, validate
from kroberta.errors import ConfigError
from kroberta.model.mlm import build_model
from tests.conftest import tiny_config
from tests.pretraining.test_train import _rows, _weights

MODEL = ModelConfig(
    vocabulary_size=64,
    num_layers=2,
    num_heads=2,
    hidden_dim=16,
    intermediate_dim=32,
    max_sequence_length=8,
    dropout=0.1,
)
REMATS = ("none", "dots", "dots_no_batch", "full")


def _inputs(batch=4, length=8, slots=2):
    rng = np.random.default_rng(0)
    return {
        "token_ids": rng.integers(5, 64, (batch, length)).astype("int32"),
        "padding_mask": np.array([[1] * length] * (batch - 1) + [[1] * 5 + [0] * 3], "int32"),
        "mask_positions": rng.integers(0, 5, (batch, slots)).astype("int32"),
    }


def _loss_and_gradients(remat, model_config=MODEL):
    """A training-mode forward (dropout on) and its gradients, as the train step takes them."""
    model = build_model(model_config, seed=1, remat=remat)
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    x = _inputs()

    def loss(trainable, non_trainable):
        logits, non_trainable = model.stateless_call(trainable, non_trainable, x, training=True)
        return (logits**2).mean(), non_trainable  # logits (batch, slots, vocabulary)

    step = jax.jit(jax.value_and_grad(loss, has_aux=True))
    (value, seed_states), gradients = step(trainable, non_trainable)
    return step, (trainable, non_trainable), float(value), gradients, seed_states


@pytest.fixture(scope="module")
def without_remat():
    return _loss_and_gradients("none")


@pytest.mark.parametrize("remat", REMATS[1:])
def test_remat_gives_the_same_loss_gradients_and_dropout_draws(without_remat, remat):
    _, _, value, gradients, seed_states = _loss_and_gradients(remat)
    _, _, want, want_gradients, want_states = without_remat
    assert value == pytest.approx(want, rel=1e-6)
    scale = max(float(np.max(np.abs(g))) for g in want_gradients)
    for got, expected in zip(gradients, want_gradients):
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6 * scale)
    # The dropout layers' seed states advance as without remat (assigned outside the checkpoint).
    for got, expected in zip(seed_states, want_states):
        np.testing.assert_array_equal(got, expected)


def test_remat_recomputes_in_the_compiled_step():
    """XLA's FLOPs of the compiled gradient grow with the recompute: most with "full",
    least with "dots" (matmul outputs kept)."""
    flops = {}
    for remat in ("none", "dots", "full"):
        step, args, *_ = _loss_and_gradients(remat)
        cost = step.lower(*args).compile().cost_analysis()
        flops[remat] = (cost[0] if isinstance(cost, list) else cost)["flops"]
    assert flops["none"] < flops["dots"] < flops["full"]


def test_remat_is_checked_by_the_config(tiny_data, tmp_path):
    config = tiny_config(tiny_data, tmp_path, remat="everything")
    with pytest.raises(ConfigError, match=r"train.remat: must be one of .*'everything'"):
        validate(config)


RUN = dict(
    steps=4, warmup_steps=1, log_every=2, eval_every=4, checkpoint_every=4, steps_per_execution=2
)


@pytest.mark.slow  # 6 short training runs (their twins above: loss, gradients, dropout draws)
@pytest.mark.parametrize("strategy", ["data", "fsdp"])
def test_remat_trains_to_the_same_weights(tiny_data, tmp_path, strategy):
    """4 steps (2 per dispatch) with hidden and attention dropout on, 4 devices."""
    weights, losses = {}, {}
    for remat in REMATS if strategy == "data" else ("none", "full"):
        config = tiny_config(tiny_data, tmp_path / remat, remat=remat, **RUN)
        config = dataclasses.replace(
            config,
            model=dataclasses.replace(config.model, dropout=0.1, attention_dropout=0.2),
            data=dataclasses.replace(config.data, shuffle_buffer=1),
            distributed=dataclasses.replace(
                config.distributed, strategy=strategy, model_parallel=2 if strategy == "fsdp" else 0
            ),
        )
        train(config)
        weights[remat] = _weights(tmp_path / remat)
        losses[remat] = [row["loss"] for row in _rows(tmp_path / remat)]
    for remat in weights:
        assert losses[remat] == pytest.approx(losses["none"], rel=1e-6)
        for name, value in weights["none"].items():
            np.testing.assert_allclose(
                weights[remat][name], value, rtol=1e-6, atol=1e-7, err_msg=f"{remat}: {name}"
            )
