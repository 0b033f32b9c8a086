"""`model.attention_dropout` apart from `model.dropout` (kroberta.model.attention): the
fused `ops.dot_product_attention` path at rate 0 computes what the explicit softmax
does, a rate > 0 drops attention weights, and the config, Hugging Face and keras-hub
round trips carry both rates."""

import dataclasses

import keras
import keras_hub
import numpy as np
import pytest
from keras.src import ops as keras_src_ops  # the module MultiHeadAttention calls through

import kroberta
from kroberta.config import Config, ModelConfig, apply_dict, apply_overrides, to_dict, validate
from kroberta.errors import ConfigError
from kroberta.interop import hf
from kroberta.model import attention
from kroberta.model.mlm import build_model

MODEL = ModelConfig(
    vocabulary_size=64,
    num_layers=2,
    num_heads=2,
    hidden_dim=16,
    intermediate_dim=32,
    max_sequence_length=16,
    dropout=0.1,
)


def _inputs(batch=3, length=16, slots=3):
    rng = np.random.default_rng(0)
    return {
        "token_ids": rng.integers(5, 64, (batch, length)).astype("int32"),
        "padding_mask": np.array([[1] * length] * (batch - 1) + [[1] * 9 + [0] * 7], "int32"),
        "mask_positions": rng.integers(0, 9, (batch, slots)).astype("int32"),
    }


def test_the_rate_follows_dropout_unless_set():
    assert MODEL.attention_dropout == -1.0 and MODEL.attention_dropout_rate == 0.1
    assert dataclasses.replace(MODEL, attention_dropout=0.0).attention_dropout_rate == 0.0
    model = build_model(dataclasses.replace(MODEL, attention_dropout=0.3), seed=0)
    layers = attention.attention_layers(model)
    assert len(layers) == 2 and {layer.dropout for layer in layers} == {0.3}
    assert model.backbone.dropout == 0.1  # keras-hub's config keeps the hidden rate


def test_dot_product_attention_equals_the_explicit_softmax(monkeypatch):
    """Same weights: rate 0 takes ops.dot_product_attention, rate 0.1 (in inference, so
    nothing is dropped) the explicit softmax path; outputs agree within 1e-5."""
    calls = []
    fused = keras_src_ops.dot_product_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return fused(*args, **kwargs)

    monkeypatch.setattr(keras_src_ops, "dot_product_attention", counted)
    explicit = build_model(dataclasses.replace(MODEL, attention_dropout=0.1), seed=3)
    explicit_logits = np.asarray(explicit(_inputs(), training=False))
    assert not calls
    model = build_model(dataclasses.replace(MODEL, attention_dropout=0.0), seed=3)
    logits = np.asarray(model(_inputs(), training=False))
    assert len(calls) == MODEL.num_layers
    np.testing.assert_allclose(logits, explicit_logits, rtol=1e-5, atol=1e-5)


def test_attention_dropout_drops_attention_weights_and_hidden_dropout_stays():
    model = build_model(dataclasses.replace(MODEL, attention_dropout=0.4), seed=0)
    layer = attention.attention_layers(model)[0]
    batch, length, heads = 64, 16, 2
    # Equal queries and keys: every weight is 1/length. One-hot values per key make the
    # output the (dropped, rescaled) weights themselves: (batch, length, heads, length).
    qk = np.zeros((batch, length, heads, 4), "float32")
    values = np.broadcast_to(
        np.eye(length, dtype="float32")[None, :, None, :], (batch, length, heads, length)
    )
    weights, _ = layer._compute_attention(qk, qk, values, training=True)
    weights = np.asarray(weights)
    dropped = np.mean(weights == 0)
    assert abs(dropped - 0.4) < 0.02  # 32768 draws: std ~0.003
    np.testing.assert_allclose(weights[weights != 0], 1 / length / 0.6, rtol=1e-6)
    again, _ = layer._compute_attention(qk, qk, values, training=True)
    assert not np.array_equal(np.asarray(again) == 0, weights == 0)  # a new mask per call
    # The hidden (residual branch, embedding) dropouts keep model.dropout.
    of_attention = {id(a._dropout_layer) for a in attention.attention_layers(model)}
    rates = {
        sub.rate
        for sub in model._flatten_layers(include_self=False)
        if isinstance(sub, keras.layers.Dropout) and id(sub) not in of_attention
    }
    assert rates == {0.1}
    hidden = model.backbone.get_layer("transformer_layer_0")._feedforward_dropout
    kept = np.asarray(hidden(np.ones((64, 16, 16), "float32"), training=True)) != 0
    assert abs(1 - kept.mean() - 0.1) < 0.02


def test_config_round_trip_and_check(tmp_path):
    config = Config(model=dataclasses.replace(MODEL, attention_dropout=0.0))
    again = apply_dict(Config(), to_dict(config), "round trip")
    assert again.model == config.model and again.model.attention_dropout_rate == 0.0
    bad = apply_overrides(Config(), ["model.attention_dropout=1.5"])
    with pytest.raises(ConfigError, match=r"model.attention_dropout: must be in \[0, 1\) or -1"):
        validate(bad)


def test_hugging_face_export_carries_both_rates(tmp_path):
    model = build_model(dataclasses.replace(MODEL, dropout=0.1, attention_dropout=0.0), seed=0)
    config = hf.hf_config(model)
    assert config["hidden_dropout_prob"] == 0.1 and config["attention_probs_dropout_prob"] == 0.0
    back = hf.model_config_from_hf(config, "config.json")
    assert (back.dropout, back.attention_dropout_rate) == (0.1, 0.0)
    out = hf.export_hf(model, str(tmp_path))
    loaded = kroberta.load(out)
    assert attention.attention_layers(loaded)[0].dropout == 0.0 and loaded.backbone.dropout == 0.1


def test_keras_hub_preset_carries_both_rates(tmp_path):
    model = build_model(dataclasses.replace(MODEL, dropout=0.1, attention_dropout=0.0), seed=0)
    out = kroberta.export_keras_hub(model, str(tmp_path))
    # A stock keras-hub load reads its one dropout: the hidden rate.
    stock = keras_hub.models.RobertaBackbone.from_preset(out)
    assert stock.dropout == 0.1
    loaded = kroberta.load(out)
    assert loaded.kroberta_config.model.dropout == 0.1
    assert loaded.kroberta_config.model.attention_dropout_rate == 0.0
    assert attention.attention_layers(loaded)[0].dropout == 0.0


def test_attention_path_is_named():
    base = ModelConfig(num_heads=12, hidden_dim=768, attention_dropout=0.0)
    dropped = dataclasses.replace(base, attention_dropout=0.1)
    assert "explicit softmax" in attention.attention_path(dropped, 512, True, "tpu")
    assert "XLA's fused attention" in attention.attention_path(base, 512, True, "tpu")
    small = ModelConfig(num_heads=2, hidden_dim=16, attention_dropout=0.0)
    assert "dot_product_attention" in attention.attention_path(small, 16, False, "cpu")
