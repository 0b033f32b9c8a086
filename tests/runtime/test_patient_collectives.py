"""kroberta.runtime.xla_cpu: simulated-device collectives that survive a late thread and a loaded machine."""

import os
import subprocess
import sys
import textwrap

import pytest

from kroberta.runtime import xla_cpu
from tests.conftest import REPO

# An all-reduce over 4 simulated devices in which device 3 arrives LATE seconds after
# the others (its input comes through a host callback that sleeps first).
LATE_DEVICE = textwrap.dedent("""
    import sys, time
    import kroberta
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P

    late = float(sys.argv[1])

    def slow_on_device_3(index, x):
        if int(index) == 3:
            time.sleep(late)
        return np.asarray(x)

    def body(x):
        x = jax.pure_callback(slow_on_device_3, jax.ShapeDtypeStruct(x.shape, x.dtype),
                              jax.lax.axis_index("i"), x)
        return jax.lax.psum(x, "i")  # the rendezvous waits for device 3

    mesh = Mesh(np.array(jax.devices()), ("i",))
    total = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P()))(jnp.ones(4))
    print("SUM", float(total[0]))
""")


def _late_device(late_seconds: float, extra_flags: str = ""):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=f"--xla_force_host_platform_device_count=4 {extra_flags}".strip(),
    )
    return subprocess.run(
        [sys.executable, "-c", LATE_DEVICE, str(late_seconds)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_this_process_runs_with_the_long_timeouts():
    # conftest imported kroberta before JAX started: its values are in XLA_FLAGS.
    flags = os.environ["XLA_FLAGS"].split()
    for name in (xla_cpu.TERMINATE_FLAG, xla_cpu.COLLECTIVE_FLAG):
        assert f"{name}={xla_cpu.TERMINATE_SECONDS}" in flags


def test_the_users_own_timeouts_win_and_other_flags_stay(monkeypatch):
    monkeypatch.setattr(xla_cpu, "backend_started", lambda: False)
    monkeypatch.setenv(
        "XLA_FLAGS", f"--xla_force_host_platform_device_count=2 {xla_cpu.TERMINATE_FLAG}=7"
    )
    assert xla_cpu.use_patient_collectives()
    assert xla_cpu.use_patient_collectives()  # twice: one copy of each flag
    assert os.environ["XLA_FLAGS"].split() == [
        "--xla_force_host_platform_device_count=2",
        f"{xla_cpu.TERMINATE_FLAG}=7",
        f"{xla_cpu.COLLECTIVE_FLAG}={xla_cpu.TERMINATE_SECONDS}",
    ]


def test_nothing_changes_once_the_backend_started(monkeypatch):
    monkeypatch.setattr(xla_cpu, "backend_started", lambda: True)
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    assert not xla_cpu.use_patient_collectives()
    assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2"


@pytest.mark.slow
def test_a_short_terminate_timeout_aborts_the_process_as_under_load():
    # What killed the loaded seed run, in miniature: XLA warns after 1 s, aborts 3 s
    # later; device 3 is 8 s late.
    result = _late_device(
        8, f"--xla_cpu_collective_call_warn_stuck_timeout_seconds=1 {xla_cpu.TERMINATE_FLAG}=3"
    )
    assert result.returncode == -6, result.stderr[-3000:]  # SIGABRT
    assert "Expected 4 threads to join the rendezvous" in result.stderr
    assert "SUM" not in result.stdout


@pytest.mark.slow
def test_xlas_default_timeouts_abort_a_thread_70_seconds_late():
    result = _late_device(70, f"{xla_cpu.TERMINATE_FLAG}=40")  # XLA's default value
    assert result.returncode == -6, result.stderr[-3000:]
    assert "SUM" not in result.stdout


@pytest.mark.slow
def test_a_thread_later_than_xlas_default_60_seconds_no_longer_aborts():
    # XLA's defaults abort after 20 + 40 s; the thread sleeps (the cores stay free).
    result = _late_device(70)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "SUM 4.0" in result.stdout
