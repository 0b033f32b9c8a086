"""Which JAX random generator draws the dropout masks during training.

Keras draws every dropout mask from JAX's default generator, seeded with raw
uint32[2] keys. On CPU, JAX lowers threefry as a rolled loop: ~15 ms per
(64, 64, 300) mask, 11% of a seed training step. Philox 4x32 (the generator of
TF's stateless ops and of cuRAND) takes the same uint32[2] key and needs ~2.5 ms.
TPU compilers cannot lower Philox's `mulhi` (measured with libtpu 0.0.42) and
run threefry unrolled, so only CPU training switches.
"""

import contextlib
import os

import jax

CPU_GENERATOR = "philox4x32"
JAX_DEFAULT_GENERATOR = "threefry2x32"


def user_chose_a_generator() -> bool:
    """JAX_DEFAULT_PRNG_IMPL in the environment or a jax.config.update made by the caller."""
    return bool(os.environ.get("JAX_DEFAULT_PRNG_IMPL")) or \
        jax.config.jax_default_prng_impl != JAX_DEFAULT_GENERATOR


def generator_for(platform: str) -> str:
    """The generator training uses on `platform` ("cpu", "gpu", "tpu")."""
    if platform == "cpu" and not user_chose_a_generator():
        return CPU_GENERATOR
    return jax.config.jax_default_prng_impl


def training_scope(platform: str | None = None):
    """Context in which Keras traces (and runs) the train step: Philox on CPU.

    The choice is made when the step is traced, so every `fit` of a run must
    enter it (a resumed run traces again, under the same choice).
    """
    generator = generator_for(platform or jax.default_backend())
    if generator == jax.config.jax_default_prng_impl:
        return contextlib.nullcontext()
    return jax.default_prng_impl(generator)
