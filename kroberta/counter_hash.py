"""The counter hash behind kroberta's own random bits: dynamic masks and CPU dropout masks.

Both draw uint32 bits as a hash of (key, counter) instead of from a stateful generator,
so a mask is a pure function of where it is used (an element's index, a position).
"""

import jax.numpy as jnp

# lowbias32 (C. Wellons' hash-prospector): its two multipliers.
MIX_A, MIX_B = 0x7FEB352D, 0x846CA68B
GOLDEN = 0x9E3779B9  # 2^32 / golden ratio: keeps a zero key from hashing to zero


def mix(x):
    """lowbias32 of uint32 `x` (any shape): a bijection of uint32 with near-ideal
    avalanche (each input bit flips each output bit with p ~ 0.5); products wrap."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(MIX_A)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(MIX_B)
    return x ^ (x >> 16)
