"""Layer normalisation with a hand-written backward pass, for keras-hub's layers.

Keras' `LayerNormalization` leaves its gradient to JAX's autodiff, which
differentiates the mean, the variance and the rescaling one by one: several
passes over each (batch, length, hidden) activation. The backward pass here is
the closed form, two row reductions and one fused elementwise pass:

    x_hat = (x - mean) * inv,   inv = 1 / sqrt(var + eps),   y = x_hat * gamma + beta
    dx = inv * (g*gamma - mean(g*gamma) - x_hat * mean(g*gamma * x_hat))

(row means over the normalised axis). `use_fused_layer_norm(model)` switches a
built model's `keras.layers.LayerNormalization` layers to it in place (inside
`kroberta.model.mlm.build_model`, before the model is handed out): the same
variables, names, config and weights-file paths (a saved model stays a plain
keras-hub model), so checkpoints, Keras weights files and the Hugging Face
export are unchanged.
"""

import functools

import jax
import jax.numpy as jnp
import keras
from keras import ops

from kroberta.model.swap import inner_layers, swap_layers


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def layer_norm(x, gamma, beta, epsilon: float):
    """Normalises x (..., hidden) over its last axis: float32 in, float32 out."""
    return _forward(x, gamma, beta, epsilon)[0]


def _forward(x, gamma, beta, epsilon):
    mean = jnp.mean(x, axis=-1, keepdims=True)  # (..., 1)
    centred = x - mean
    inv = jax.lax.rsqrt(jnp.mean(centred * centred, axis=-1, keepdims=True) + epsilon)
    x_hat = centred * inv  # (..., hidden)
    return x_hat * gamma + beta, (x_hat, inv, gamma)


def _backward(epsilon, residuals, grad):
    x_hat, inv, gamma = residuals
    rows = tuple(range(grad.ndim - 1))
    d_beta = jnp.sum(grad, axis=rows)  # (hidden,)
    d_gamma = jnp.sum(grad * x_hat, axis=rows)
    g = grad * gamma
    d_x = inv * (
        g
        - jnp.mean(g, axis=-1, keepdims=True)
        - x_hat * jnp.mean(g * x_hat, axis=-1, keepdims=True)
    )
    return d_x, d_gamma, d_beta


layer_norm.defvjp(_forward, _backward)


class LayerNormalization(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` (last axis, centred and scaled) with the
    closed-form backward pass. Computes in float32 like Keras' own, whatever the
    policy, and returns the compute dtype.

    The class keeps Keras' name on purpose: Keras' weights files address layers
    held in lists by their class name (`.../layer_normalization/vars`), so a
    different name would make our weights files unreadable to a stock keras-hub
    model and theirs to ours."""

    def call(self, inputs):
        x = ops.cast(inputs, "float32")
        outputs = layer_norm(
            x, ops.cast(self.gamma, "float32"), ops.cast(self.beta, "float32"), float(self.epsilon)
        )
        return ops.cast(outputs, self.compute_dtype)


def _is_plain_last_axis_norm(layer) -> bool:
    if type(layer) is not keras.layers.LayerNormalization or not layer.built:
        return False
    # keras-hub builds its norms with axis=-1 (`[-1]` once built); any other axis
    # or variant keeps Keras' own layer.
    axis = layer.axis if isinstance(layer.axis, (list, tuple)) else [layer.axis]
    return (
        len(axis) == 1 and axis[0] == -1 and layer.center and layer.scale and not layer.rms_scaling
    )


def use_fused_layer_norm(model, epsilon: float) -> int:
    """Switches every built last-axis `keras.layers.LayerNormalization` inside
    `model` to this module's `LayerNormalization` with `epsilon` (keras-hub hard-codes
    1e-5; `ModelConfig.layer_norm_epsilon`), in place; returns how many."""

    def swap(layer):
        layer.__class__ = LayerNormalization
        layer.epsilon = float(epsilon)  # the public attribute `call` reads

    return swap_layers(model, _is_plain_last_axis_norm, swap)


def epsilon_of(model) -> float:
    """The layer-norm epsilon `model` was built with (`ModelConfig.layer_norm_epsilon`)."""
    norms = inner_layers(model, lambda layer: isinstance(layer, keras.layers.LayerNormalization))
    return float(norms[0].epsilon)
