"""Which library XLA's CPU backend runs matmuls with.

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
"""

import os
import sys

YNN_FUSION_FLAG = "--xla_cpu_experimental_ynn_fusion_type"
# The flag's empty value: no YNNPACK fusions, every dot emitted with Eigen.
EIGEN_DOTS_FLAG = f"{YNN_FUSION_FLAG}="
# Per-compile options that restore XLA's default (YNNPACK dots) for one program.
YNN_DOTS_COMPILER_OPTIONS = {YNN_FUSION_FLAG.lstrip("-"): "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}


def _backend_started() -> bool:
    """True once JAX has created its backends: XLA has read XLA_FLAGS for good."""
    if "jax" not in sys.modules:
        return False
    try:
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
    if _backend_started():
        return False
    os.environ["XLA_FLAGS"] = f"{flags} {EIGEN_DOTS_FLAG}".strip()
    return True
