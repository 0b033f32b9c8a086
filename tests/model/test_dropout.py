import os
import subprocess
import sys

import jax
import keras
import keras_hub
import numpy as np
import pytest

from kroberta.config import ModelConfig
from kroberta.model import dropout
from kroberta.model.mlm import build_model

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ModelConfig(
    vocabulary_size=120,
    num_layers=2,
    num_heads=2,
    hidden_dim=16,
    intermediate_dim=32,
    max_sequence_length=12,
    dropout=0.1,
)


def _keep(key, shape, keep_prob=0.9):
    return np.asarray(dropout.hash_keep_mask(np.array(key, "uint32"), shape, keep_prob))


@pytest.mark.parametrize("keep_prob", [0.9, 0.5])
def test_hash_masks_keep_at_the_rate_with_no_serial_correlation(keep_prob):
    shape = (256, 1024)
    keep = _keep((12345, 7), shape, keep_prob)
    n = keep.size
    sigma = np.sqrt(keep_prob * (1 - keep_prob) / n)
    assert abs(keep.mean() - keep_prob) < 5 * sigma
    bits = keep.astype("float64").ravel()
    for lag in (1, 2, shape[1]):  # neighbours, and the same column in the next row
        assert abs(np.corrcoef(bits[:-lag], bits[lag:])[0, 1]) < 5 / np.sqrt(n)


def test_every_bit_of_the_hash_is_fair():
    raw = np.asarray(dropout.hash_bits(np.array([3, 9], "uint32"), (1 << 18,)))
    n = raw.size
    for bit in range(32):
        assert abs(((raw >> bit) & 1).mean() - 0.5) < 5 * 0.5 / np.sqrt(n), bit
    assert len(np.unique(raw)) == n  # a bijection of the index: no repeats


@pytest.mark.parametrize("other", [(5, 8), (6, 7), (5 | 1 << 31, 7)])
def test_masks_of_neighbouring_keys_are_unrelated(other):
    # Keras' seed generator hands out keys that differ by 1 in the second word per
    # call; layers differ in the first.
    shape, p = (128, 1024), 0.9
    a, b = _keep((5, 7), shape, p), _keep(other, shape, p)
    both = (a & b).mean()
    assert abs(both - p * p) < 5 * np.sqrt(p * p * (1 - p * p) / a.size)


def test_cpu_layer_drops_with_the_hash_of_the_key_keras_would_draw():
    assert dropout.uses_hash_masks((4, 6, 10))  # tests run on CPU, default generator
    x = np.random.default_rng(0).normal(size=(4, 6, 10)).astype("float32") + 10.0  # no zeros
    ours, theirs = dropout.Dropout(0.25, seed=7), keras.layers.Dropout(0.25, seed=7)
    for _ in range(2):  # the seed generators advance alike
        key = np.asarray(ours.seed_generator.state.value)
        np.testing.assert_array_equal(key, np.asarray(theirs.seed_generator.state.value))
        y = np.asarray(ours(x, training=True))
        theirs(x, training=True)
        keep = _keep(key, x.shape, 0.75)
        np.testing.assert_array_equal(y != 0, keep)
        np.testing.assert_allclose(y[keep], (x / 0.75)[keep], rtol=1e-6)  # XLA: x * (1/0.75)


def test_keras_bits_off_cpu_bit_for_bit_keras_dropout(monkeypatch):
    # TPU/GPU (or a user-chosen JAX generator): Keras' own mask, stored once.
    monkeypatch.setattr(dropout, "uses_hash_masks", lambda shape: False)
    x = np.random.default_rng(0).normal(size=(4, 6, 10)).astype("float32")
    for rate in (0.1, 0.5):
        ours, theirs = dropout.Dropout(rate, seed=7), keras.layers.Dropout(rate, seed=7)
        for _ in range(2):
            np.testing.assert_array_equal(
                np.asarray(ours(x, training=True)), np.asarray(theirs(x, training=True))
            )


def test_hash_masks_only_on_cpu_and_never_for_a_chosen_generator():
    assert not dropout.uses_hash_masks((4, 4), platform="tpu")
    assert not dropout.uses_hash_masks((4, 4), platform="gpu")
    with jax.default_prng_impl("rbg"):
        assert not dropout.uses_hash_masks((4, 4))
    code = "import kroberta\nfrom kroberta.model import dropout\nprint(dropout.uses_hash_masks((4, 4)))\n"
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env["JAX_DEFAULT_PRNG_IMPL"] = "rbg"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False"]


def test_mask_is_the_same_however_the_batch_is_split_over_devices():
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("batch",))
    assert mesh.size == 4
    sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("batch"))
    x = np.ones((8, 16, 32), "float32")
    key = np.array([11, 3], "uint32")
    layer_call = jax.jit(lambda x, key: dropout.dropout(x, 0.1, _FixedSeed(key)))
    whole = np.asarray(layer_call(x, key))
    split = layer_call(jax.device_put(x, sharded), key)
    assert len(split.sharding.device_set) == 4
    np.testing.assert_array_equal(np.asarray(split), whole)
    np.testing.assert_array_equal(whole != 0, _keep(key, x.shape))


def test_gradient_is_the_mask_over_keep_prob():
    key = np.array([3, 1], "uint32")
    x = np.ones((8, 32), "float32")

    def f(x):
        return dropout.dropout(x, 0.25, _FixedSeed(key)).sum()

    grad = np.asarray(jax.jit(jax.grad(f))(x))
    out = np.asarray(dropout.dropout(x, 0.25, _FixedSeed(key)))
    np.testing.assert_array_equal(grad, out)  # x = 1: output = mask / keep_prob
    assert set(np.unique(grad)) == {0.0, np.float32(1 / 0.75)}


def test_inference_and_zero_rate_are_the_identity():
    x = np.arange(12, dtype="float32").reshape(3, 4)
    np.testing.assert_array_equal(dropout.Dropout(0.5)(x, training=False), x)
    np.testing.assert_array_equal(dropout.Dropout(0.0)(x, training=True), x)


def test_model_switches_every_dropout_and_keeps_keras_hubs_weights():
    model = build_model(TINY, seed=0)
    dropouts = [
        l for l in model._flatten_layers(recursive=True) if isinstance(l, keras.layers.Dropout)
    ]
    # The embeddings', and per encoder layer: attention probabilities, attention
    # output, feed-forward output.
    assert len(dropouts) == 1 + 3 * TINY.num_layers
    assert all(type(l) is dropout.Dropout for l in dropouts)
    stock = keras_hub.models.RobertaMaskedLM.from_config(model.get_config())
    assert [v.path for v in stock.weights] == [v.path for v in model.weights]


class _FixedSeed:
    """A seed generator that always hands out the same key."""

    def __init__(self, key):
        self.key = key

    def next(self):
        return self.key
