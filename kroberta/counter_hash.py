"""The counter hash behind kroberta's own random bits: dynamic masks and CPU dropout masks.

Both draw uint32 bits as a hash of (key, counter) instead of from a stateful generator,
so a mask is a pure function of where it is used (an element's index, a position).

The hash is written once, in array operators, and runs on JAX and numpy arrays as they
are; TensorFlow spells xor and the shift as functions (its `^` is a logical xor), so the
input pipeline passes those (`kroberta.data.host_masking`): the element keys it sends
the training step are these bits without a second copy of the hash.
"""

import operator

import numpy as np

# lowbias32 (C. Wellons' hash-prospector): its two multipliers.
MIX_A, MIX_B = 0x7FEB352D, 0x846CA68B
GOLDEN = 0x9E3779B9  # 2^32 / golden ratio: keeps a zero key from hashing to zero


def mix(x, xor=operator.xor, shift_right=operator.rshift, uint32=np.uint32):
    """lowbias32 of uint32 `x` (any shape): a bijection of uint32 with near-ideal
    avalanche (each input bit flips each output bit with p ~ 0.5); products wrap.

    `xor`, `shift_right` and `uint32` (a constant of that type) are the array library's;
    the defaults serve JAX and numpy.
    """
    x = xor(x, shift_right(x, uint32(16)))
    x = x * uint32(MIX_A)
    x = xor(x, shift_right(x, uint32(15)))
    x = x * uint32(MIX_B)
    return xor(x, shift_right(x, uint32(16)))


def keys_of_words(
    seed_low,
    seed_high,
    index_low,
    index_high,
    xor=operator.xor,
    shift_right=operator.rshift,
    uint32=np.uint32,
):
    """One uint32 key per element from the run seed's and the element indices' 32-bit
    words (the seed's: scalars; the indices': (B,)): the key dynamic masks are drawn
    from (`kroberta.masking`). Array operations as in `mix`."""
    ops = dict(xor=xor, shift_right=shift_right, uint32=uint32)
    key = mix(xor(seed_low, uint32(GOLDEN)), **ops)  # ()
    key = mix(xor(key, seed_high), **ops)
    key = mix(xor(key, index_low), **ops)  # (B,)
    return mix(xor(key, index_high), **ops)
