import os
import subprocess
import sys

import jax
import keras
import numpy as np

from kroberta import dropout_rng

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _keras_dropout_mask():
    layer = keras.layers.Dropout(0.1, seed=3)
    step = jax.jit(lambda x: layer(x, training=True))
    return np.asarray(step(np.ones((64, 64, 300), "float32"))) != 0


def test_cpu_training_draws_dropout_from_philox_and_tpu_keeps_threefry():
    assert dropout_rng.generator_for("cpu") == "philox4x32"
    assert dropout_rng.generator_for("tpu") == "threefry2x32"
    outside = _keras_dropout_mask()
    with dropout_rng.training_scope("cpu"):
        assert jax.config.jax_default_prng_impl == "philox4x32"
        inside = _keras_dropout_mask()
    assert jax.config.jax_default_prng_impl == "threefry2x32"  # restored
    # Both are proper masks with a 0.9 keep rate, from different generators.
    for mask in (inside, outside):
        assert abs(mask.mean() - 0.9) < 0.005
    assert (inside != outside).mean() > 0.1


def test_a_generator_chosen_by_the_user_is_kept():
    code = ("import jax, kroberta\n"
            "from kroberta import dropout_rng\n"
            "print(dropout_rng.generator_for('cpu'))\n")
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env["JAX_DEFAULT_PRNG_IMPL"] = "rbg"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["rbg"]
