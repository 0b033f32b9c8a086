import jax
import keras
import keras_hub
import numpy as np
import pytest

from kroberta import dropout as dropout_lib
from kroberta.config import ModelConfig
from kroberta.model import build_model

TINY = ModelConfig(vocabulary_size=120, num_layers=2, num_heads=2, hidden_dim=16,
                   intermediate_dim=32, max_sequence_length=12, dropout=0.1)


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_output_is_bit_for_bit_keras_dropout(rate):
    x = np.random.default_rng(0).normal(size=(4, 6, 10)).astype("float32")
    ours, theirs = dropout_lib.Dropout(rate, seed=7), keras.layers.Dropout(rate, seed=7)
    for _ in range(2):  # the seed generators advance alike
        a = np.asarray(ours(x, training=True))
        b = np.asarray(theirs(x, training=True))
        np.testing.assert_array_equal(a, b)
    dropped = (a == 0).mean()
    assert 0.5 * rate < dropped < 1.5 * rate


def test_gradient_is_the_mask_over_keep_prob():
    layer = dropout_lib.Dropout(0.25, seed=3)
    x = np.ones((8, 32), "float32")
    seed_state = layer.seed_generator.state.value

    def f(x):
        return dropout_lib.dropout(x, 0.25, _FixedSeed(seed_state)).sum()

    grad = np.asarray(jax.jit(jax.grad(f))(x))
    out = np.asarray(dropout_lib.dropout(x, 0.25, _FixedSeed(seed_state)))
    np.testing.assert_array_equal(grad, out)  # x = 1: output = mask / keep_prob
    assert set(np.unique(grad)) == {0.0, np.float32(1 / 0.75)}


def test_inference_and_zero_rate_are_the_identity():
    x = np.arange(12, dtype="float32").reshape(3, 4)
    np.testing.assert_array_equal(dropout_lib.Dropout(0.5)(x, training=False), x)
    np.testing.assert_array_equal(dropout_lib.Dropout(0.0)(x, training=True), x)


def test_model_switches_every_dropout_and_keeps_keras_hubs_weights():
    model = build_model(TINY, seed=0)
    dropouts = [l for l in model._flatten_layers(recursive=True)
                if isinstance(l, keras.layers.Dropout)]
    # The embeddings', and per encoder layer: attention probabilities, attention
    # output, feed-forward output.
    assert len(dropouts) == 1 + 3 * TINY.num_layers
    assert all(type(l) is dropout_lib.Dropout for l in dropouts)
    stock = keras_hub.models.RobertaMaskedLM.from_config(model.get_config())
    assert [v.path for v in stock.weights] == [v.path for v in model.weights]


class _FixedSeed:
    """A seed generator that always hands out the same key."""

    def __init__(self, key):
        self.key = key

    def next(self):
        return self.key
