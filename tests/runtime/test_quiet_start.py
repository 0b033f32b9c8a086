"""A quiet start: no TensorFlow, CUDA or libtpu noise on a CPU machine, real errors kept."""

import os
import subprocess
import sys

import pytest

from kroberta.config import load_config
from kroberta.perf import advisor
from kroberta.runtime import quiet_start
from tests.conftest import REPO

NOISE_MARKERS = ("cuInit", "TPU_", "E0000")
ON_CPU_ONLY = pytest.mark.skipif(
    quiet_start._accelerator_present(),
    reason="the quiet start without an accelerator is what is tested",
)


def _newcomer_env():
    """The environment of a newcomer's shell: none of the test set-up's JAX/TF/XLA settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("JAX_PLATFORMS", "TF_CPP_MIN_LOG_LEVEL", "XLA_FLAGS", "KERAS_BACKEND")
    }
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _noisy_lines(stderr):
    return [line for line in stderr.splitlines() if any(m in line for m in NOISE_MARKERS)]


@ON_CPU_ONLY
def test_train_help_starts_quietly():
    run = subprocess.run(
        [sys.executable, "-m", "kroberta.train", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=_newcomer_env(),
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "usage: python -m kroberta.train" in run.stdout
    assert _noisy_lines(run.stderr) == []
    assert run.stderr == ""


@ON_CPU_ONLY
def test_tiny_training_on_cpu_starts_quietly(tiny_data, tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "kroberta.train",
            "--config",
            "tiny",
            f"--data.train={tiny_data / 'train-0.tfrecord'}",
            "--train.steps=2",
            "--train.warmup_steps=0",
            "--train.log_every=2",
            "--train.eval_every=0",
            "--train.checkpoint_every=2",
            f"--run_dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=_newcomer_env(),
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "model saved in" in run.stderr  # the command's messages: stderr
    assert _noisy_lines(run.stderr) == [], run.stderr[-2000:]
    assert "not a multiple of" not in run.stderr  # TPU-shape advice only on a TPU
    assert "cpu device(s)" in run.stderr
    assert "schedule: warmup over 0 of 2 steps to learning rate 0.003, then linear" in run.stderr


@ON_CPU_ONLY
def test_tensorflow_imported_after_a_probe_for_it_starts_quietly():
    """Libraries (datasets, transformers) ask importlib.util.find_spec("tensorflow") before
    they import it: the import that follows is still filtered and still hidden from GPUs."""
    code = (
        "import importlib.util, sys\n"
        "import kroberta\n"
        "assert importlib.util.find_spec('tensorflow') is not None\n"
        "import tensorflow as tf\n"
        "assert tf.config.get_visible_devices('GPU') == []\n"
        "print('imported')\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=_newcomer_env(),
        timeout=300,
    )
    assert run.returncode == 0 and run.stdout == "imported\n", run.stderr[-2000:]
    assert run.stderr == ""


def test_noise_filter_drops_startup_noise_and_keeps_real_errors():
    level = 2
    assert quiet_start.is_noise(
        b"I0000 00:00:1796110476.534584    4858 cudart_stub.cc:31] Could not "
        b"find cuda drivers on your machine, GPU will not be used.\n",
        level,
    )
    assert quiet_start.is_noise(
        b"E0000 00:00:1796110481.822510    4858 cuda_platform.cc:52] failed call "
        b"to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR "
        b"(303)\n",
        level,
    )
    assert quiet_start.is_noise(
        b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
        level,
    )
    assert quiet_start.is_noise(b"W0000 00:00:1.5    12 some_op.cc:7] a warning\n", level)
    # Errors and anything that is not an absl line pass; a lower level lets warnings through.
    assert not quiet_start.is_noise(b"E0000 00:00:1.5    12 some_op.cc:7] a real error\n", level)
    assert not quiet_start.is_noise(b"W0000 00:00:1.5    12 some_op.cc:7] a warning\n", 1)
    assert not quiet_start.is_noise(b"Traceback (most recent call last):\n", level)


def test_filtered_stderr_passes_everything_but_the_noise():
    code = (
        "import os, sys, warnings\n"
        "from kroberta.runtime.quiet_start import filtered_native_stderr\n"
        "with filtered_native_stderr():\n"
        "    os.write(2, b'I0000 00:00:1.5    12 cudart_stub.cc:31] Could not find cuda drivers\\n')\n"
        "    os.write(2, b'E0000 00:00:1.5    12 loader.cc:9] a real error\\n')\n"
        "    print('python stderr line', file=sys.stderr)\n"
        "    warnings.warn('a python warning')\n"
        "os.write(2, b'after the block\\n')\n"
    )
    env = {**_newcomer_env(), "TF_CPP_MIN_LOG_LEVEL": "2"}
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=300
    )
    assert run.returncode == 0, run.stderr
    lines = run.stderr.splitlines()
    assert "E0000 00:00:1.5    12 loader.cc:9] a real error" in lines
    assert "python stderr line" in lines
    assert any("a python warning" in line for line in lines)
    assert lines[-1] == "after the block"
    assert not any("cudart_stub" in line for line in lines)


@ON_CPU_ONLY
def test_jax_is_kept_off_absent_accelerators_unless_the_user_chose():
    code = "import os, kroberta, jax; print(repr(os.environ.get('JAX_PLATFORMS')), jax.devices()[0].platform)"
    chosen = {**_newcomer_env(), "JAX_PLATFORMS": ""}
    for env, expected in ((_newcomer_env(), "'cpu' cpu"), (chosen, "'' cpu")):
        run = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=env,
            timeout=300,
        )
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.split("\n")[-2] == expected


def test_skip_absent_accelerators_respects_the_users_choice(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "")
    assert quiet_start.skip_absent_accelerators() is False
    assert os.environ["JAX_PLATFORMS"] == ""
    monkeypatch.delenv("JAX_PLATFORMS")
    monkeypatch.setenv("JAX_FORCE_TPU_INIT", "1")
    assert quiet_start.skip_absent_accelerators() is False
    assert "JAX_PLATFORMS" not in os.environ


def test_tpu_shape_warnings_only_when_asked():
    seed = load_config("seed")
    assert advisor.warnings_for(seed, "cpu", shapes=False) == []
    on_tpu = advisor.warnings_for(seed, "tpu", shapes=True)
    assert any("not a multiple of 128" in line for line in on_tpu)
    assert any(
        "mixed_precision" in line for line in advisor.warnings_for(seed, "tpu", shapes=False)
    )


def test_libtpu_probe_lines_are_recognised_and_real_errors_are_not():
    probe = [
        b"Failed to find host bounds for accelerator type: WARNING: could not determine TPU accelerator type, "
        b"please set env var `TPU_ACCELERATOR_TYPE` manually, otherwise libtpu.so may not properly initialize.\n",
        b"WARNING: Logging before InitGoogle() is written to STDERR\n",
        b"E0000 00:00:1796113652.950134   14603 common_lib.cc:554] INVALID_ARGUMENT: Error: unexpected worker "
        b"hostname 'WARNING: could not determine TPU worker hostnames or IP addresses' from env var "
        b"TPU_WORKER_HOSTNAMES.\n",
        b"=== Source Location Trace: === \n",
        b"learning/45eac/tfrc/runtime/libtpu_init_utils.cc:327\n",
    ]
    assert all(quiet_start.is_libtpu_probe_noise(line) for line in probe)
    assert not quiet_start.is_libtpu_probe_noise(
        b"E0000 00:00:1.5    12 tpu_compiler.cc:9] out of memory\n"
    )
    assert not quiet_start.is_libtpu_probe_noise(b"error: unknown TPU topology 'v9:2x2'\n")
