"""Which JAX random generator draws the dropout masks during training.

Keras draws every dropout mask from JAX's default generator, seeded with raw
uint32[2] keys. On CPU, JAX lowers threefry as a rolled loop: ~15 ms per
(64, 64, 300) mask, 11% of a seed training step. Philox 4x32 (the generator of
TF's stateless ops and of cuRAND) takes the same uint32[2] key and needs ~2.5 ms.
Philox's `mulhi` cannot be lowered once the step is partitioned over several
devices (XLA: "Unable to convert MHLO to StableHLO", jax 0.10.2, on simulated
CPU devices and for TPU), so only a CPU run on one device switches: the laptop
case, where it matters most. Everything else keeps JAX's threefry.
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


def generator_for(platform: str, devices: int) -> str:
    """The generator training uses on `devices` devices of `platform` ("cpu", "tpu", ...)."""
    if platform == "cpu" and devices == 1 and not user_chose_a_generator():
        return CPU_GENERATOR
    return jax.config.jax_default_prng_impl


def training_scope(devices: int, platform: str | None = None):
    """Context in which Keras traces (and runs) a train step over `devices` devices
    (all processes together): Philox on a single CPU device.

    The choice is made when the step is traced, so every `fit` of a run must
    enter it (a resumed run traces again, under the same choice).
    """
    generator = generator_for(platform or jax.default_backend(), devices)
    if generator == jax.config.jax_default_prng_impl:
        return contextlib.nullcontext()
    return jax.default_prng_impl(generator)
