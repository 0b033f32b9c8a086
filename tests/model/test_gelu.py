import jax
import jax.numpy as jnp
import keras
import numpy as np

from kroberta.config import ModelConfig
from kroberta.model.gelu import erf_gelu
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


def test_values_and_gradients_equal_keras_exact_gelu():
    # Where x << 0 both are ~0 and 1 + erf(x/sqrt 2) loses digits: ~7e-7 absolute at most
    # (torch's GELU, the same formula, does the same).
    x = np.linspace(-12, 12, 24001, dtype="float32")
    np.testing.assert_allclose(
        erf_gelu(x), keras.activations.gelu(x, approximate=False), atol=1e-6, rtol=1e-6
    )
    ours = jax.jit(jax.vmap(jax.grad(erf_gelu)))(x)
    theirs = jax.vmap(jax.grad(lambda v: keras.activations.gelu(v, approximate=False)))(x)
    np.testing.assert_allclose(ours, theirs, atol=1e-6, rtol=1e-5)


def test_known_values_and_dtype():
    np.testing.assert_array_equal(erf_gelu(np.float32(0.0)), 0.0)
    np.testing.assert_allclose(erf_gelu(np.float32(1.0)), 0.8413447, rtol=1e-6)  # Phi(1)
    assert erf_gelu(jnp.ones(3, jnp.bfloat16)).dtype == jnp.bfloat16


def test_model_feed_forward_and_head_use_it():
    model = build_model(TINY, seed=0)
    dense = [
        l
        for l in model._flatten_layers(recursive=True)
        if isinstance(l, keras.layers.Dense) and l.activation is erf_gelu
    ]
    # One feed-forward layer per encoder block, and the MLM head's transform.
    assert len(dense) == TINY.num_layers + 1
    assert not any(
        isinstance(l, keras.layers.Dense) and l.activation is keras.activations.gelu
        for l in model._flatten_layers(recursive=True)
    )
