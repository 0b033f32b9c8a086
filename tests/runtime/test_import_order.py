"""A notebook's usual first lines (tensorflow, keras or keras_hub imported before
kroberta) still give Keras on JAX, and a tiny training runs in that process."""

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

# A tiny fit: kroberta's training model (1 layer, width 16) for 2 steps on 1 CPU device.
_FIT = """
import numpy as np
from kroberta.model.mlm import build_compiled_model
from kroberta.perf.plan import for_local_devices
config = kroberta.load_config("tiny", {"model.num_layers": 1, "model.hidden_dim": 16,
                                       "model.intermediate_dim": 32, "model.vocabulary_size": 64,
                                       "model.max_sequence_length": 8})
model = build_compiled_model(for_local_devices(config))
rng = np.random.default_rng(0)
x = {"token_ids": rng.integers(5, 64, (8, 8)).astype("int32"),
     "padding_mask": np.ones((8, 8), "int32"),
     "mask_positions": np.tile(np.arange(2, dtype="int32"), (8, 1))}
y = rng.integers(5, 64, (8, 2)).astype("int32")
history = model.fit(x, y, batch_size=4, epochs=1, verbose=0)
print("FIT", int(model.optimizer.iterations.numpy()), np.isfinite(history.history["loss"][0]))
"""


def _run(code, timeout=300):
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "XLA_FLAGS")}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    "first",
    [
        pytest.param("import tensorflow as tf", marks=pytest.mark.slow),
        "import keras",  # the same switch for the other two: ~20 s each, in the slow suite
        pytest.param("import keras_hub", marks=pytest.mark.slow),
    ],
)
def test_importing_keras_first_switches_it_to_jax_and_trains(first):
    result = _run(
        f"{first}\n"
        "import sys\n"
        "backend_before = sys.modules['keras'].backend.backend()\n"
        "import kroberta\n"
        "import keras as reloaded\n"
        "print('BEFORE', backend_before)\n"
        "print('AFTER', reloaded.backend.backend(), type(reloaded.ops.ones(2)).__module__)\n"
        # The name the first line bound is the reloaded module, not the stale one.
        "for name in ('keras', 'keras_hub'):\n"
        "    if name in globals():\n"
        "        assert globals()[name] is sys.modules[name], name\n"
        "if 'keras' in globals():\n"
        "    assert keras.backend.backend() == 'jax'\n" + _FIT
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    # TensorFlow imports Keras itself, on Keras' default backend, before kroberta runs.
    assert "BEFORE tensorflow" in lines
    assert "AFTER jax jaxlib._jax" in lines
    assert "FIT 2 True" in lines


def test_names_bound_from_keras_before_the_switch_are_renewed():
    result = _run(
        "import keras\n"
        "from keras import layers, ops\n"
        "from keras.layers import Dense\n"
        "import tensorflow as tf\n"
        "tf_keras_layers = tf.keras.layers  # resolves TensorFlow's lazy tf.keras\n"
        "import kroberta, sys\n"
        "new = sys.modules['keras']\n"
        "assert keras is new and layers is new.layers and ops is new.ops\n"
        "assert Dense is new.layers.Dense\n"
        "assert tf.keras.layers.Dense is new.layers.Dense\n"
        "assert type(Dense(2)(ops.ones((1, 3)))).__module__.startswith('jax')\n"
        "print('ok')\n"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == "ok"


def test_keras_objects_built_on_another_backend_are_a_clear_error():
    result = _run("import keras\nlayer = keras.layers.Dense(3)\nimport kroberta\n")
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "kroberta.errors.BackendError: keras was imported before kroberta with the "
        "'tensorflow' backend and already holds 1 Keras object(s) built on it (Dense); they "
        "cannot move to JAX. Restart Python (in a notebook: restart the kernel)"
    )
