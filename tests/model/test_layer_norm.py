import jax
import keras
import keras_hub
import numpy as np

from kroberta.config import ModelConfig
from kroberta.model.layer_norm import LayerNormalization, layer_norm, use_fused_layer_norm
from kroberta.model.metrics import MaskedLMLoss
from kroberta.model.mlm import build_model

TINY = ModelConfig(
    vocabulary_size=120,
    num_layers=2,
    num_heads=2,
    hidden_dim=16,
    intermediate_dim=32,
    max_sequence_length=12,
    dropout=0.0,
)


def test_values_and_gradients_equal_keras_layer_normalization():
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(3, 5, 16)) * 4 + 2).astype("float32")
    gamma = rng.normal(size=16).astype("float32")
    beta = rng.normal(size=16).astype("float32")
    probe = rng.normal(size=(3, 5, 16)).astype("float32")  # makes every output matter

    def ours(x, gamma, beta):
        return (layer_norm(x, gamma, beta, 1e-5) * probe).sum()

    def reference(x, gamma, beta):
        return (keras.ops.layer_normalization(x, gamma, beta, epsilon=1e-5) * probe).sum()

    np.testing.assert_allclose(
        layer_norm(x, gamma, beta, 1e-5),
        keras.ops.layer_normalization(x, gamma, beta, epsilon=1e-5),
        atol=1e-5,
    )
    got = jax.jit(jax.grad(ours, argnums=(0, 1, 2)))(x, gamma, beta)
    want = jax.grad(reference, argnums=(0, 1, 2))(x, gamma, beta)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=2e-5, rtol=1e-4)


def test_constant_rows_normalise_to_beta_with_finite_gradients():
    x = np.full((2, 8), 3.0, "float32")
    gamma, beta = np.ones(8, "float32"), np.arange(8, dtype="float32")
    np.testing.assert_array_equal(layer_norm(x, gamma, beta, 1e-5), np.stack([beta, beta]))
    grads = jax.grad(lambda x: layer_norm(x, gamma, beta, 1e-5).sum())(x)
    assert np.isfinite(grads).all()


def test_model_switches_every_norm_and_keeps_keras_hubs_config_and_weights():
    model = build_model(TINY, seed=0)
    norms = [
        l
        for l in model._flatten_layers(recursive=True)
        if isinstance(l, keras.layers.LayerNormalization)
    ]
    # The embeddings' norm, two per encoder layer and the MLM head's.
    assert len(norms) == 1 + 2 * TINY.num_layers + 1
    assert all(type(l) is LayerNormalization for l in norms)
    # The saved description is a plain keras-hub model: rebuilding it gives Keras' norms.
    stock = keras_hub.models.RobertaMaskedLM.from_config(model.get_config())
    assert [v.path for v in stock.weights] == [v.path for v in model.weights]
    assert not any(type(l) is LayerNormalization for l in stock._flatten_layers(recursive=True))


def test_weights_files_are_interchangeable_with_stock_keras_hub(tmp_path):
    model = build_model(TINY, seed=0)
    stock = keras_hub.models.RobertaMaskedLM.from_config(model.get_config())
    model.save_weights(tmp_path / "ours.weights.h5")
    stock.load_weights(tmp_path / "ours.weights.h5")
    for a, b in zip(model.get_weights(), stock.get_weights()):
        np.testing.assert_array_equal(a, b)
    again = build_model(TINY, seed=1)
    stock.save_weights(tmp_path / "stock.weights.h5")
    again.load_weights(tmp_path / "stock.weights.h5")
    for a, b in zip(model.get_weights(), again.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_model_loss_and_gradients_equal_the_stock_keras_hub_model():
    model = build_model(TINY, seed=0)
    stock = keras_hub.models.RobertaMaskedLM.from_config(model.get_config())
    stock.set_weights(model.get_weights())
    rng = np.random.default_rng(1)
    x = {
        "token_ids": rng.integers(5, 120, (4, 12)).astype("int32"),
        "padding_mask": np.ones((4, 12), "int32"),
        "mask_positions": rng.integers(1, 12, (4, 3)).astype("int32"),
    }
    x["padding_mask"][0, 8:] = 0
    labels = rng.integers(5, 120, (4, 3)).astype("int32")
    loss = MaskedLMLoss()

    def loss_and_grads(m):
        trainable = [v.value for v in m.trainable_variables]
        others = [v.value for v in m.non_trainable_variables]

        def f(trainable):
            logits, _ = m.stateless_call(trainable, others, x, training=True)
            return loss(labels, logits)

        return jax.value_and_grad(f)(trainable)

    (ours, our_grads), (theirs, their_grads) = loss_and_grads(model), loss_and_grads(stock)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)
    for g, w in zip(our_grads, their_grads):
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-4)


def test_bf16_policy_computes_in_float32_and_returns_bf16():
    layer = keras.layers.LayerNormalization(dtype="mixed_bfloat16")
    layer.build((2, 8))
    assert use_fused_layer_norm_on(layer) == 1
    out = layer(np.linspace(-3, 3, 16, dtype="float32").reshape(2, 8))
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    assert layer.gamma.dtype == "float32"


def test_other_axes_and_uncentred_norms_keep_keras_layers():
    inputs = keras.Input((4, 6))
    by_feature = keras.layers.LayerNormalization(axis=1)
    uncentred = keras.layers.LayerNormalization(center=False)
    model = keras.Model(inputs, [by_feature(inputs), uncentred(inputs)])
    assert use_fused_layer_norm(model, 1e-5) == 0
    assert type(by_feature) is keras.layers.LayerNormalization
    assert type(uncentred) is keras.layers.LayerNormalization


def use_fused_layer_norm_on(layer):
    """use_fused_layer_norm on a lone layer (wrapped in a model)."""
    holder = keras.Sequential([layer])
    return use_fused_layer_norm(holder, layer.epsilon)
