"""kroberta.runtime.xla_cpu: Eigen matmuls on CPU unless the user chose, and a YNNPACK-measured peak."""

import os
import subprocess
import sys
import textwrap

from conftest import REPO

from kroberta.runtime import xla_cpu

# Compiles one matmul and says which library XLA gave it.
PROBE = textwrap.dedent("""
    import os, sys
    {before}
    import kroberta
    import jax, jax.numpy as jnp
    x = jnp.ones((128, 128))
    hlo = jax.jit(jnp.matmul).lower(x, x).compile().as_text()
    print("FLAGS", repr(os.environ.get("XLA_FLAGS")))
    print("YNN", "__ynn_fusion" in hlo)
""")


def run_probe(xla_flags=None, before=""):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    if xla_flags is not None:
        env["XLA_FLAGS"] = xla_flags
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(before=before)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(
        line.split(" ", 1)
        for line in out.stdout.splitlines()
        if line.startswith(("FLAGS ", "YNN "))
    )
    return lines["FLAGS"], lines["YNN"] == "True"


def test_importing_kroberta_gives_cpu_matmuls_to_eigen():
    flags, ynn = run_probe()
    assert xla_cpu.EIGEN_DOTS_FLAG in flags
    assert not ynn


def test_the_users_own_choice_wins():
    flags, ynn = run_probe(f"{xla_cpu.YNN_FUSION_FLAG}=individual_dot")
    # The user's value stays the only one (kroberta.runtime.xla_cpu adds its own flags).
    ynn_flags = [f for f in eval(flags).split() if f.startswith(xla_cpu.YNN_FUSION_FLAG)]
    assert ynn_flags == [f"{xla_cpu.YNN_FUSION_FLAG}=individual_dot"]
    assert ynn


def test_a_backend_started_before_kroberta_keeps_xla_defaults():
    # XLA has read its flags already: changing XLA_FLAGS now would only mislead.
    flags, ynn = run_probe(before="import jax; jax.devices()")
    assert flags == "None"
    assert ynn


def test_use_eigen_dots_keeps_other_flags(monkeypatch):
    monkeypatch.setattr(xla_cpu, "backend_started", lambda: False)
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    assert xla_cpu.use_eigen_dots()
    assert os.environ["XLA_FLAGS"].split() == [
        "--xla_force_host_platform_device_count=2",
        xla_cpu.EIGEN_DOTS_FLAG,
    ]
    assert xla_cpu.use_eigen_dots()  # twice: still one copy of the flag
    assert os.environ["XLA_FLAGS"].count(xla_cpu.YNN_FUSION_FLAG) == 1


def test_this_process_runs_eigen_and_the_peak_option_restores_ynnpack():
    import jax
    import jax.numpy as jnp

    x = jnp.ones((128, 128))
    lowered = jax.jit(jnp.matmul).lower(x, x)
    assert "__ynn_fusion" not in lowered.compile().as_text()
    # What kroberta.perf.throughput compiles its peak matmul with, as well as the default.
    assert "__ynn_fusion" in lowered.compile(xla_cpu.YNN_DOTS_COMPILER_OPTIONS).as_text()
