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


def test_one_cpu_device_draws_dropout_from_philox_everything_else_keeps_threefry():
    assert dropout_rng.generator_for("cpu", 1) == "philox4x32"
    assert dropout_rng.generator_for("cpu", 4) == "threefry2x32"
    assert dropout_rng.generator_for("tpu", 1) == "threefry2x32"
    outside = _keras_dropout_mask()
    with dropout_rng.training_scope(1, "cpu"):
        assert jax.config.jax_default_prng_impl == "philox4x32"
        inside = _keras_dropout_mask()
    assert jax.config.jax_default_prng_impl == "threefry2x32"  # restored
    # Both are proper masks with a 0.9 keep rate, from different generators.
    for mask in (inside, outside):
        assert abs(mask.mean() - 0.9) < 0.005
    assert (inside != outside).mean() > 0.1


def test_a_step_partitioned_over_the_four_devices_still_compiles():
    # Philox's mulhi cannot be lowered once partitioned: the scope must keep threefry.
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("batch",))
    sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("batch"))
    x = jax.device_put(np.ones((8, 16, 32), "float32"), sharded)
    layer = keras.layers.Dropout(0.1, seed=3)
    with dropout_rng.training_scope(len(jax.devices()), "cpu"):
        y = jax.jit(lambda x: layer(x, training=True))(x)
    assert y.shape == x.shape and 0 < float((y == 0).mean()) < 0.3


def test_a_generator_chosen_by_the_user_is_kept():
    code = ("import jax, kroberta\n"
            "from kroberta import dropout_rng\n"
            "print(dropout_rng.generator_for('cpu', 1))\n")
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env["JAX_DEFAULT_PRNG_IMPL"] = "rbg"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["rbg"]
