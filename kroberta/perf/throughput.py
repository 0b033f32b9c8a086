"""Peak FLOP/s of the devices in use, and MFU (model FLOPs utilisation).

MFU = model FLOPs per second (kroberta.perf.flops, matmuls only) / peak FLOP/s of the
devices the run uses.

- TPU / GPU: the vendor's dense bf16 peak per device (kroberta.perf.hardware) times the
  number of devices. (A float32 run is still measured against the bf16 peak, the
  usual convention: it shows what mixed precision leaves on the table.)
- CPU: the whole machine's measured float32 matmul rate (a jitted 2048^3 matmul,
  best of a few, compiled both with the process's settings and with XLA's default
  YNNPACK matmuls, so the peak is never lowered by `kroberta.runtime.xla_cpu`'s choice of
  Eigen for the training step), measured once and cached in ~/.cache/kroberta/cpu_peak.json,
  keyed by CPU model, core count and JAX device count. N simulated CPU devices
  (--xla_force_host_platform_device_count=N) share the same cores, so the peak
  is NOT multiplied by N: a run's model FLOP/s over all its devices is divided by
  the one machine-wide figure.
"""

import contextlib
import json
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from kroberta.atomic import atomic_write
from kroberta.perf import hardware
from kroberta.runtime import xla_cpu

MATMUL_SIZE = 2048
CACHE_FILE = "cpu_peak.json"


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _best_time(jitted, a, b, repeats, expected: float) -> float:
    """Best wall time of `repeats` calls of `jitted`, over its two compilations:
    with the process's XLA settings and with YNNPACK matmuls. Each compilation's
    first output element must equal `expected`."""
    compiled = [jitted.lower(a, b).compile()]
    # An XLA without that option: the default alone.
    with contextlib.suppress(jax.errors.JaxRuntimeError):
        compiled.append(jitted.lower(a, b).compile(xla_cpu.YNN_DOTS_COMPILER_OPTIONS))
    best = float("inf")
    for fn in compiled:
        first = float(fn(a, b).block_until_ready()[(0,) * a.ndim])
        if first != expected:
            raise RuntimeError(f"matmul peak measurement: wrong result {first}")
        for _ in range(repeats):
            start = time.perf_counter()
            fn(a, b).block_until_ready()
            best = min(best, time.perf_counter() - start)
    return best


def measure_matmul_flops(devices, size: int = MATMUL_SIZE, repeats: int = 5) -> float:
    """Best-of-`repeats` FLOP/s of one jitted (size x size) @ (size x size) matmul per
    device, all devices at once (with whichever of the process's and YNNPACK's matmuls
    is faster).

    Simulated CPU devices share the machine's cores: one device alone reaches only
    its share (about a third with 4 devices on a 2-core machine), so the machine's
    peak is what all of them do together."""
    n = len(devices)
    mesh = jax.sharding.Mesh(np.array(devices), ("d",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
    a = jax.device_put(jnp.ones((n, size, size), jnp.float32), sharding)  # (devices, size, size)
    b = jax.device_put(jnp.ones((n, size, size), jnp.float32) * 0.5, sharding)
    best = _best_time(
        jax.jit(jnp.matmul, out_shardings=sharding), a, b, repeats, expected=0.5 * size
    )
    return n * 2 * size**3 / best


def _plausible_cpu_peak(flops: float) -> bool:
    # No CPU core does more than ~0.5 TFLOP/s f32 (AVX-512, 2 FMA units, 5 GHz is
    # 0.32); a higher figure is a broken clock (a test's fake timer, say), not a CPU.
    return 0 < flops <= 0.5e12 * (os.cpu_count() or 1)


def cpu_peak_flops(refresh: bool = False, at_least: float = 0.0) -> float | None:
    """The machine's f32 matmul FLOP/s (cached per CPU model, core and device count).

    `at_least`: a rate of matmul FLOPs this machine was seen to do (a run's, which can
    exceed a peak measured while other jobs were busy); the peak kept is never below it.
    """
    # v2: measured over all simulated devices at once (v1 keys measured one device).
    key = f"v2 | {_cpu_model()} | {os.cpu_count()} cores | {jax.device_count('cpu')} jax devices"
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(root, "kroberta", CACHE_FILE)
    try:
        with open(path) as f:
            cache = json.load(f)
    except (OSError, ValueError):
        cache = {}
    known = cache.get(key) if isinstance(cache.get(key), (int, float)) else None
    if known and not _plausible_cpu_peak(known):
        known = None
    if known and not refresh:
        return float(known)
    measured = measure_matmul_flops(jax.devices("cpu"))
    if not _plausible_cpu_peak(measured):
        return known  # None when nothing trustworthy is known: no MFU rather than a wrong one
    # A shared machine only ever measures low: keep the best figure seen.
    peak = max(measured, known or 0.0, at_least if _plausible_cpu_peak(at_least) else 0.0)
    cache[key] = peak
    with contextlib.suppress(OSError):  # a read-only home: measure again next time
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with atomic_write(path) as f:
            json.dump(cache, f, indent=1)
    return peak


def peak_flops(devices) -> float | None:
    """Peak FLOP/s of `devices` together (see the module docstring); None if unknown."""
    devices = list(devices)
    if not devices:
        return None
    if devices[0].platform == "cpu":
        return cpu_peak_flops()
    chip = hardware.chip_for_device_kind(devices[0].device_kind)
    return chip.bf16_flops * len(devices) if chip else None


def mfu(model_flops_per_second: float, peak: float | None) -> float | None:
    if not peak or model_flops_per_second is None:
        return None
    return model_flops_per_second / peak
