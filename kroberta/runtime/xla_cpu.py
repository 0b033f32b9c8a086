"""XLA's CPU backend flags kroberta sets before JAX starts: Eigen matmuls, patient collectives.

## Which library XLA's CPU backend runs matmuls with

jaxlib 0.10 hands every CPU `dot` to YNNPACK by default (`__ynn_fusion` in the
optimized HLO). YNNPACK wins on one large matmul, but in a RoBERTa training step,
where dozens of (4096, 300)-sized matmuls and the batched attention products run
next to each other on the same cores, Eigen's matmuls made both the seed training
step and prediction faster (docs/design.md, "The hot path", gives the A/B figures). So kroberta asks
XLA for Eigen matmuls on CPU, unless the user has chosen a value for the flag
(`XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=individual_dot` restores
XLA's default). The flag only concerns XLA's CPU backend: GPU and TPU programs, and
the CPU programs of an already started backend, are untouched.

MFU stays honest: the CPU peak it divides by is measured with YNNPACK matmuls,
the faster library for that one large matmul (`kroberta.perf.throughput`).

## Collective timeouts long enough for a loaded machine

Simulated CPU devices (`--xla_force_host_platform_device_count=N`) run each
device's share of a step on its own thread; an all-reduce is a rendezvous of the N
threads. A thread waiting there warns after
`--xla_cpu_collective_call_warn_stuck_timeout_seconds` (default 20 s), then waits
`--xla_cpu_collective_call_terminate_timeout_seconds` more (default 40 s) and aborts
the whole process (SIGABRT, nothing saved), and a machine loaded by other jobs leaves
one thread unscheduled that long. A slow thread is not a deadlock, so kroberta gives
the rendezvous, and the CPU collectives' own timeout
(`--xla_cpu_collective_timeout_seconds`), an hour (`TERMINATE_SECONDS`): no load seen
on a shared machine comes near it, while a true deadlock still ends with XLA's own
message. XLA's warning after 20 s is kept: it names the waiting threads in the log.

A value the user put in XLA_FLAGS wins. The flags concern only XLA's CPU backend.
"""

import os
import sys

YNN_FUSION_FLAG = "--xla_cpu_experimental_ynn_fusion_type"
# The flag's empty value: no YNNPACK fusions, every dot emitted with Eigen.
EIGEN_DOTS_FLAG = f"{YNN_FUSION_FLAG}="
# Per-compile options that restore XLA's default (YNNPACK dots) for one program.
YNN_DOTS_COMPILER_OPTIONS = {YNN_FUSION_FLAG.lstrip("-"): "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}


TERMINATE_SECONDS = 3600
TERMINATE_FLAG = "--xla_cpu_collective_call_terminate_timeout_seconds"
COLLECTIVE_FLAG = "--xla_cpu_collective_timeout_seconds"


def backend_started() -> bool:
    """True once JAX has created its backends: XLA has read XLA_FLAGS for good."""
    if "jax" not in sys.modules:
        return False
    try:
        # start-up: only when JAX is loaded (a private module, no public API)
        from jax._src import xla_bridge

        return xla_bridge.backends_are_initialized()
    except (ImportError, AttributeError):
        return True  # cannot tell: assume too late rather than pretend it applies


def use_eigen_dots() -> bool:
    """Add EIGEN_DOTS_FLAG to XLA_FLAGS; must run before JAX starts its backends.

    Returns whether the flag is in effect for this process's future backends: False
    when the user set the flag themselves (their value wins) or JAX already started.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if YNN_FUSION_FLAG in flags:
        return EIGEN_DOTS_FLAG in flags.split()
    if backend_started():
        return False
    os.environ["XLA_FLAGS"] = f"{flags} {EIGEN_DOTS_FLAG}".strip()
    return True


def use_patient_collectives() -> bool:
    """Add both timeouts to XLA_FLAGS; must run before JAX starts its backends.

    Returns whether both timeouts (kroberta's, or the user's own) are set for this
    process's future backends: False when JAX already started (XLA has read its flags).
    """
    if backend_started():
        return False
    flags = os.environ.get("XLA_FLAGS", "").split()
    for name in (TERMINATE_FLAG, COLLECTIVE_FLAG):
        if not any(f.startswith(name + "=") for f in flags):
            flags.append(f"{name}={TERMINATE_SECONDS}")
    os.environ["XLA_FLAGS"] = " ".join(flags)
    return True
