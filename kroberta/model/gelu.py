"""Exact GELU through `erf`, for keras-hub's feed-forward layers.

RoBERTa's activation is the exact GELU, x * Phi(x). Keras' "gelu" (JAX's
`jax.nn.gelu(approximate=False)`) writes it as x/2 * erfc(-x/sqrt(2)), and XLA's
CPU `erfc` is a two-branch rational approximation with an `exp`, several times
the cost of x/2 * (1 + erf(x/sqrt(2))), the same function (the form torch and
Hugging Face use; docs/design.md, "The hot path", gives the figures). The two differ by float rounding only: where x < -4 both are ~0 and
1 + erf(x/sqrt(2)) loses digits, up to ~7e-7 absolute (as torch's GELU);
elsewhere they agree to 1e-6 relative (tested).

`use_erf_gelu(model)` points a built model's Dense layers that use Keras'
"gelu" at `erf_gelu`, in place. The layers' weights are untouched and keras-hub
rebuilds them from its own config ("gelu"), so nothing saved changes.
"""

import jax
import keras
import numpy as np

from kroberta.model.swap import swap_layers

_SQRT_HALF = np.float32(np.sqrt(0.5))


@keras.saving.register_keras_serializable(package="kroberta")
def erf_gelu(x):
    """x * Phi(x) = x/2 * (1 + erf(x / sqrt(2))), in x's dtype."""
    return 0.5 * x * (1.0 + jax.lax.erf(x * _SQRT_HALF.astype(x.dtype)))


def use_erf_gelu(model) -> int:
    """Switches every Dense layer in `model` whose activation is Keras' exact
    "gelu" to `erf_gelu`; returns how many."""
    return swap_layers(
        model,
        lambda layer: (
            isinstance(layer, keras.layers.Dense) and layer.activation is keras.activations.gelu
        ),
        lambda layer: setattr(layer, "activation", erf_gelu),
    )
