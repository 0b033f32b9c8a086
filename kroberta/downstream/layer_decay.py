"""Layer-wise learning-rate decay (ELECTRA, Clark et al. 2020): lower layers learn slower.

The classifier's head and its top encoder layer learn at the trial's rate; each encoder
layer below learns at D times the rate of the one above it, and the embeddings (token,
position, their layer norm) at D^L for L encoder layers:

    head, transformer_layer_{L-1}: 1;  transformer_layer_i: D^(L-1-i);  embeddings: D^L

Keras 3's optimizers take one learning rate for every variable. Scaling the gradients
instead is not the same for Adam (its update divides the scale out again), and one
optimizer per group would split the compiled step. So `LayerDecayAdamW` is Adam whose
`update_step` (the method every Keras optimizer implements, called per variable with
the schedule's rate) scales the rate by the variable's factor, with AdamW's decoupled
weight decay done there as well at the scaled rate, as ELECTRA's optimizer and PyTorch's
AdamW on per-layer parameter groups do (Keras' own AdamW decays every variable at the
unscaled rate, before `update_step`).
"""

import keras

from kroberta.model.mlm import NO_DECAY_NAMES

EMBEDDING_LAYERS = ("embeddings/", "embeddings_layer_norm/")
ENCODER_LAYER = "transformer_layer_{}/"


def layer_scales(variables, num_layers: int, decay: float) -> dict:
    """{variable path: its factor of the trial's learning rate} for a classifier's
    trainable `variables` (paths as keras-hub names them; see the module)."""
    scales = {}
    for variable in variables:
        path = variable.path
        depth = num_layers  # the head's: the top layer's
        if path.startswith(EMBEDDING_LAYERS):
            depth = 0
        for layer in range(num_layers):
            if path.startswith(ENCODER_LAYER.format(layer)):
                depth = layer + 1
        scales[path] = decay ** (num_layers - depth)
    return scales


class LayerDecayAdamW(keras.optimizers.Adam):
    """AdamW whose rate (and decoupled weight decay) is scaled per variable.

    Args:
        scales: {variable path: factor} (`layer_scales`); a variable not named gets 1.
        weight_decay: AdamW's decoupled decay, not applied to `NO_DECAY_NAMES` (biases,
            layer-norm scales and offsets), as `classifiers.compile_classifier`'s AdamW.
        **kwargs: `keras.optimizers.Adam`'s (learning_rate, beta_1, beta_2, epsilon, name).
    """

    def __init__(self, scales: dict, weight_decay: float, **kwargs):
        super().__init__(**kwargs)  # weight_decay None: Keras' unscaled decay stays off
        self.scales = dict(scales)
        self.decoupled_weight_decay = float(weight_decay)

    def update_step(self, gradient, variable, learning_rate):
        scale = self.scales.get(variable.path, 1.0)
        rate = keras.ops.cast(learning_rate, variable.dtype) * scale
        if self.decoupled_weight_decay and not any(n in variable.name for n in NO_DECAY_NAMES):
            # AdamW: w -= w * decay * rate, before the Adam step (Keras' order).
            variable.assign(variable - variable * self.decoupled_weight_decay * rate)
        super().update_step(gradient, variable, rate)
