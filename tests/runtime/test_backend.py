import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(code, **env):
    full_env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full_env, cwd=REPO
    )


def test_keras_runs_on_jax():
    import keras

    assert keras.backend.backend() == "jax"


def test_tensorflow_sees_no_accelerator_and_torch_is_never_imported():
    result = _run(
        "import sys, kroberta, tensorflow as tf\n"
        "import kroberta.pretraining.train, kroberta.data.pipeline, kroberta.model.mlm\n"
        "assert tf.config.get_visible_devices('GPU') == [], tf.config.get_visible_devices()\n"
        "assert tf.config.get_visible_devices('TPU') == []\n"
        "assert all(d.device_type == 'CPU' for d in tf.config.get_visible_devices())\n"
        "assert 'torch' not in sys.modules\n"
        "print('ok')\n"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok")


def test_forced_other_backend_is_a_clear_error():
    result = _run("import kroberta", KERAS_BACKEND="torch")
    assert result.returncode != 0
    assert "kroberta runs Keras on JAX, but KERAS_BACKEND='torch' is set" in result.stderr


def test_cli_reports_forced_backend_in_one_line():
    result = subprocess.run(
        [sys.executable, "-m", "kroberta.train"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "KERAS_BACKEND": "tensorflow"},
    )
    assert result.returncode != 0
    assert "KERAS_BACKEND='tensorflow'" in result.stderr


def test_runs_without_tensorflow_text():
    # keras-hub imports tensorflow-text when it is installed, but kroberta's masking,
    # pipeline and model must not need it: make it unimportable and build them.
    result = _run(
        "import sys\n"
        "sys.modules['tensorflow_text'] = None\n"
        "import kroberta, numpy as np, tensorflow as tf\n"
        "from kroberta.masking import dynamic_mask_batch, element_keys\n"
        "from kroberta.config import ModelConfig\n"
        "from kroberta.model.mlm import build_model\n"
        "out = dynamic_mask_batch(np.array([[0, 9, 9, 2]]), np.ones((1, 4)), element_keys(1, [2]),\n"
        "    mask_rate=0.5, slots=2, mask_token_id=4, special_token_ids=(0, 1, 2, 3, 4), vocabulary_size=16)\n"
        "m = build_model(ModelConfig(vocabulary_size=16, num_layers=1, num_heads=1, hidden_dim=8,\n"
        "    intermediate_dim=8, max_sequence_length=4))\n"
        "x = {'token_ids': np.ones((1, 4), 'int32'), 'padding_mask': np.ones((1, 4), 'int32'),\n"
        "     'mask_positions': np.zeros((1, 2), 'int32')}\n"
        "assert m(x).shape == (1, 2, 16)\n"
        "print('ok')\n"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok")
