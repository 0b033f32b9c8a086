"""Dropout whose mask is generated once per step, for keras-hub's layers.

Keras' dropout draws a Bernoulli mask (a counter-based generator: a dozen
integer multiply/xor rounds per element) and selects with it. XLA sees only
cheap elementwise ops, so it fuses the whole generator into every consumer of
the mask: the forward select and, again, the backward one. Each of the seed
model's 10 masks per step was generated twice.

Here the mask passes through `sqrt` (exact on 0.0 and 1.0). XLA counts `sqrt`
as expensive and does not duplicate it, and the generator fused into it, into
several consumers: the mask is generated once, stored as float32, and read by
the forward and the backward pass. The mask and the output are bit-for-bit
Keras' own (same generator, same key, same `x / keep_prob`), which a test
asserts.

`use_stored_dropout_masks(model)` switches a built model's `keras.layers.Dropout`
layers in place; like `kroberta.layer_norm` it keeps the variables, config and
Keras' class name, so saved models and checkpoints are unchanged.
"""

import jax
import jax.numpy as jnp
import keras


def dropout(inputs, rate: float, seed_generator):
    """Keras' `backend.random.dropout(inputs, rate, seed=seed_generator)` (no noise
    shape), with the mask stored once instead of regenerated per consumer."""
    keep_prob = 1.0 - rate
    key = seed_generator.next()  # what Keras draws for this layer and call
    keep = jax.random.bernoulli(key, p=keep_prob, shape=inputs.shape)
    stored = jnp.sqrt(keep.astype(jnp.float32))  # 0.0 or 1.0; see the module docstring
    return jax.lax.select(stored > 0, inputs / keep_prob, jnp.zeros_like(inputs))


class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout` with the mask stored once (see the module docstring).

    Named as Keras' class on purpose: Keras' weights files address layers held in
    lists by class name, and the layer's seed-generator state must land where a
    stock keras-hub model expects it."""

    def call(self, inputs, training=False):
        if training and 0.0 < self.rate < 1.0 and self.noise_shape is None:
            return dropout(inputs, self.rate, self.seed_generator)
        return super().call(inputs, training=training)


def use_stored_dropout_masks(model) -> int:
    """Switches every `keras.layers.Dropout` inside `model` to this module's
    `Dropout`, in place; returns how many."""
    switched = 0
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if type(layer) is keras.layers.Dropout:
            layer.__class__ = Dropout
            switched += 1
    return switched
