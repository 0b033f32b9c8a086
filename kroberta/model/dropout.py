"""Dropout for keras-hub's layers: cheap masks on CPU, masks stored once elsewhere.

Keras' dropout draws a Bernoulli mask from JAX's generator (threefry: on CPU a
rolled loop of integer rounds; Philox is cheaper but still costly) and selects
with it. Two changes, each measured on a seed training step (figures in docs/design.md, "The hot path"):

- **CPU: a counter hash.** Each element's keep bit is `mix(mix(index ^ a) + b) <
  keep_prob * 2**32`, where `index` is the element's flat position, `mix` is a
  low-bias 32-bit integer hash (two multiply/xor-shift rounds, a bijection) and
  `a`, `b` are mixed from the layer's Keras key (`kroberta.counter_hash`, the hash
  dynamic masks are drawn from too). Cheap enough to regenerate in
  the backward pass instead of storing the mask, which makes the training step
  faster than stored Philox masks. The bits are not JAX's
  generator's, so this is not bit-for-bit Keras' dropout; the masks pass
  frequency, serial-correlation and key-difference tests (`tests/model/test_dropout.py`).
  Being a function of the global index, a mask is the same however the batch is
  split over devices.
- **Elsewhere (TPU, GPU), or when the user picks JAX's generator**
  (`JAX_DEFAULT_PRNG_IMPL` set in the environment, or a non-default generator
  through `jax.config.update("jax_default_prng_impl", ...)`):
  Keras' own mask, bit for bit, passed through `sqrt` (exact on 0.0 and 1.0).
  XLA counts `sqrt` as expensive and does not duplicate it, so the generator
  fused into it runs once and the forward and backward selects read the stored
  float32 mask, instead of each regenerating it.

Either way the layer draws one key per call from its Keras seed generator, as
Keras does, so a resumed run continues the same sequence of masks.

`use_fast_dropout(model)` switches a built model's `keras.layers.Dropout` layers
in place; like `kroberta.model.layer_norm` it keeps the variables, config and Keras'
class name, so saved models and checkpoints are unchanged.
"""

import math
import os

import jax
import jax.numpy as jnp
import keras
from jax import lax

from kroberta.counter_hash import GOLDEN, mix
from kroberta.model.swap import swap_layers

JAX_DEFAULT_GENERATOR = "threefry2x32"
# The counter is a uint32 flat index; a larger tensor takes Keras' mask instead.
MAX_HASHED_ELEMENTS = 2**32


def hash_bits(key, shape):
    """uint32 bits of `shape`, a function of (key, flat index of the element).

    key: uint32[2] (a Keras/JAX raw key). Consecutive Keras keys differ by 1 in
    key[1]; mixing both words into `a` and `b` makes their masks unrelated."""
    key = jnp.asarray(key).astype(jnp.uint32)
    a = mix(key[0] ^ mix(key[1] ^ jnp.uint32(GOLDEN)))
    b = mix(key[1] + mix(a ^ jnp.uint32(0x85EBCA6B)))  # murmur3's constant: b's own stream
    # Flat index from one iota per axis: under a sharded jit each device builds
    # its own slice of it (a reshaped 1-D iota would need a resharding).
    index = jnp.zeros(shape, jnp.uint32)
    stride = 1
    for axis in reversed(range(len(shape))):
        index = index + lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride)
        stride *= shape[axis]
    return mix(mix(index ^ a) + b)


def hash_keep_mask(key, shape, keep_prob: float):
    """bool `shape`: True with probability keep_prob (to 2**-32)."""
    threshold = min(round(keep_prob * 2**32), 2**32 - 1)
    return hash_bits(key, shape) < jnp.uint32(threshold)


def uses_hash_masks(shape, platform: str | None = None) -> bool:
    """Whether a mask of `shape` is hashed (see the module docstring): on CPU, unless
    the user chose JAX's generator (JAX_DEFAULT_PRNG_IMPL in the environment, or a
    jax.config.update). Decided when the step is traced."""
    chose = (
        bool(os.environ.get("JAX_DEFAULT_PRNG_IMPL"))
        or jax.config.jax_default_prng_impl != JAX_DEFAULT_GENERATOR
    )
    return (
        (platform or jax.default_backend()) == "cpu"
        and not chose
        and math.prod(shape) < MAX_HASHED_ELEMENTS
    )


def dropout(inputs, rate: float, seed_generator):
    """Keras' `backend.random.dropout(inputs, rate, seed=seed_generator)` (no noise
    shape) with the mask of the module docstring."""
    keep_prob = 1.0 - rate
    key = seed_generator.next()  # what Keras draws for this layer and call
    if uses_hash_masks(inputs.shape):
        keep = hash_keep_mask(key, inputs.shape, keep_prob)  # regenerated in the backward pass
    else:
        keep = jax.random.bernoulli(key, p=keep_prob, shape=inputs.shape)
        keep = jnp.sqrt(keep.astype(jnp.float32)) > 0  # 0.0 or 1.0, stored once
    return lax.select(keep, inputs / keep_prob, jnp.zeros_like(inputs))


class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout` with the masks of the module docstring.

    Named as Keras' class on purpose: Keras' weights files address layers held in
    lists by class name, and the layer's seed-generator state must land where a
    stock keras-hub model expects it."""

    def call(self, inputs, training=False):
        if training and 0.0 < self.rate < 1.0 and self.noise_shape is None:
            return dropout(inputs, self.rate, self.seed_generator)
        return super().call(inputs, training=training)


def use_fast_dropout(model) -> int:
    """Switches every `keras.layers.Dropout` inside `model` to this module's
    `Dropout`, in place; returns how many."""

    def swap(layer):
        layer.__class__ = Dropout

    return swap_layers(model, lambda layer: type(layer) is keras.layers.Dropout, swap)
