"""Rematerialisation (gradient checkpointing) per encoder block: `train.remat`.

Without it, the backward pass reads every activation the forward pass kept: per
block about a dozen (batch, length, hidden)-sized tensors plus, with attention
dropout, the (batch, heads, length, length) weights and mask. With it each
keras-hub `TransformerEncoder` call runs under `jax.checkpoint`, so the backward
pass recomputes the block from its input and keeps only what the policy saves:

    "none"           keep everything (no recompute; the default)
    "full"           keep only each block's input; recompute the whole block
                     (about one more forward pass: ~+33% FLOPs per step)
    "dots"           keep every matmul output (`jax.checkpoint_policies.dots_saveable`),
                     recompute the cheap elementwise work (softmax, GELU, norms, dropout)
    "dots_no_batch"  keep the weight matmuls' outputs (projections, feed-forward;
                     `dots_with_no_batch_dims_saveable`), recompute attention's batched
                     matmuls and everything elementwise: drops the (batch, heads,
                     length, length) tensors, MaxText's "minimal"

Why a layer class of our own, not `keras.RematScope`: the scope must be open when the
layers are created (keras-hub creates them inside `RobertaBackbone`), offers no JAX
policy, and checkpoints a call that updates the dropout layers' seed state, which
would leak the checkpoint's tracers. Here the block's call becomes a pure function of
(variable values, inputs): it runs in its own `keras.StatelessScope` and returns the
new seed states, which are assigned outside the checkpoint. The model, its config
and weights stay keras-hub's; only the compiled step changes, so it composes with any
training step (K steps per dispatch, accumulation, masking) and distribution.
"""

import jax
import keras
import keras_hub

# Keras exports StatelessScope but no getter for the current one (3.15, 3.16).
from keras.src.backend.common.stateless_scope import get_stateless_scope, in_stateless_scope

from kroberta.config import REMATS
from kroberta.model.swap import swap_layers

REMAT_POLICIES = {
    "full": None,  # jax.checkpoint's default: save nothing but the inputs
    "dots": jax.checkpoint_policies.dots_saveable,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
assert set(REMATS) == {"none", *REMAT_POLICIES}


def _outer_value(variable):
    """The variable's value in the enclosing stateless scope, not autocast (the block
    casts as it would without remat). Keras 3.15 has no public getter for it."""
    value = get_stateless_scope().get_current_value(variable)
    return variable._value if value is None else value


class TransformerEncoder(keras_hub.layers.TransformerEncoder):
    """keras-hub's `TransformerEncoder` whose call, inside a stateless (traced) call such
    as the training step, runs under `jax.checkpoint` with the policy named by its
    `remat` attribute (set by `use_remat`); unchanged otherwise.

    The class keeps keras-hub's name on purpose: Keras' weights files address layers
    held in lists by their class name (`.../transformer_encoder/...`), so saved models
    and checkpoints stay stock keras-hub."""

    remat = "none"

    def call(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        training=None,
        return_attention_scores=False,
    ):
        if self.remat == "none" or return_attention_scores or not in_stateless_scope():
            return super().call(
                inputs,
                padding_mask=padding_mask,
                attention_mask=attention_mask,
                training=training,
                return_attention_scores=return_attention_scores,
            )
        variables = list(self.variables)
        changing = [v for v in variables if not v.trainable]  # seed states (dropout)
        plain_call = super().call

        def block(values, x, padding, attention):
            mapping = list(zip(variables, values))
            with keras.StatelessScope(state_mapping=mapping) as scope:
                y = plain_call(x, padding_mask=padding, attention_mask=attention, training=training)
                # (batch, length, hidden), then the seed states after this call
                return y, [scope.get_current_value(v) for v in changing]

        values = [_outer_value(v) for v in variables]
        outputs, new_states = jax.checkpoint(block, policy=REMAT_POLICIES[self.remat])(
            values, inputs, padding_mask, attention_mask
        )
        for variable, value in zip(changing, new_states):
            variable.assign(value)
        return outputs


def use_remat(model, remat: str) -> int:
    """Runs every encoder block of `model` under `jax.checkpoint` with the policy
    named `remat` (module docstring): in place, inside `kroberta.model.mlm.build_model`
    only; "none" changes nothing. Returns how many blocks."""
    if remat == "none":
        return 0

    def checkpointed(block):
        block.__class__ = TransformerEncoder
        block.remat = remat

    return swap_layers(
        model, lambda layer: type(layer) is keras_hub.layers.TransformerEncoder, checkpointed
    )
