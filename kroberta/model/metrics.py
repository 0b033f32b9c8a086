"""MLM loss and metrics over real masked positions only.

Labels arrive gathered at the prediction slots, shape (batch, slots), with -100 in
the slots that hold no masked token (Hugging Face's convention). Everything here is
a mean over the real slots: sum(w * x) / sum(w). Keras' default
"sum_over_batch_size" reduction would divide by every slot and under-report the
loss (6.9 instead of ln(10000) = 9.2 at initialisation for the seed model).

The cross-entropy has its own gradient (`sparse_cross_entropy`): Keras' sparse
cross-entropy multiplies a one-hot (batch, slots, V) array into the log-softmax
and differentiates through both, three full passes over the logits; here the
backward pass is one fused `softmax - one_hot` (docs/design.md, "The hot path"). Accuracy compares the label's logit with the row maximum
(a plain reduction XLA shares with the loss) instead of an arg-max.
"""

import jax
import jax.numpy as jnp
import keras
from keras import ops

from kroberta.tokens import IGNORE_LABEL


def _flat(logits):
    """(batch, slots, V) logits as one float32 (batch * slots, V) view.

    The loss and the metrics all read this view: the head's matmul makes a 2-D
    (batch * slots, V) array, and where the loss read a 3-D view of it XLA wrote
    the biased logits and their gradient once per view."""
    return ops.reshape(ops.cast(logits, "float32"), (-1, logits.shape[-1]))


def _weights_and_targets(labels):
    labels = ops.cast(labels, "int32")
    weights = ops.cast(ops.not_equal(labels, IGNORE_LABEL), "float32")  # (batch, slots)
    targets = ops.where(labels == IGNORE_LABEL, 0, labels)  # any valid id; weight 0
    return weights, targets


@jax.custom_vjp
def sparse_cross_entropy(logits, targets):
    """-log softmax(logits)[target]: logits (..., V) float32, targets (...) int32 -> (...)."""
    return _cross_entropy_forward(logits, targets)[0]


def _label_logit(logits, targets):
    return jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]


def _cross_entropy_forward(logits, targets):
    normaliser = jax.nn.logsumexp(logits, axis=-1)  # (...)
    return normaliser - _label_logit(logits, targets), (logits, normaliser, targets)


def _cross_entropy_backward(residuals, grad):
    logits, normaliser, targets = residuals
    vocabulary = jnp.arange(logits.shape[-1], dtype=targets.dtype)
    one_hot = (vocabulary == targets[..., None]).astype(logits.dtype)  # fused, never stored
    d_logits = (jnp.exp(logits - normaliser[..., None]) - one_hot) * grad[..., None]
    return d_logits, None  # integer targets have no gradient


sparse_cross_entropy.defvjp(_cross_entropy_forward, _cross_entropy_backward)


def token_cross_entropy(labels, logits):
    """Per-slot cross-entropy (batch, slots) in float32, and the slot weights."""
    weights, targets = _weights_and_targets(labels)
    ce = sparse_cross_entropy(_flat(logits), ops.reshape(targets, (-1,)))
    ce = ops.reshape(ce, targets.shape)
    return ce * weights, weights


def masked_correct(labels, logits):
    """Per-slot 1.0 where the label's logit is the row's highest (a tie counts), (batch,
    slots) float32, and the slot weights."""
    weights, targets = _weights_and_targets(labels)
    flat = _flat(logits)  # (batch * slots, V), the loss's view
    best = jnp.max(flat, axis=-1)
    correct = _label_logit(flat, ops.reshape(targets, (-1,))) >= best
    return ops.reshape(ops.cast(correct, "float32"), targets.shape), weights


@keras.saving.register_keras_serializable(package="kroberta")
class MaskedLMLoss(keras.losses.Loss):
    """Mean cross-entropy over the slots whose label is not -100."""

    def __init__(self, name="masked_lm_loss", **kwargs):
        kwargs.setdefault("reduction", "sum")
        super().__init__(name=name, **kwargs)

    def call(self, y_true, y_pred):
        ce, weights = token_cross_entropy(y_true, y_pred)
        # A scalar; max(.., 1) keeps a batch of pure padding at 0 instead of NaN.
        return ops.sum(ce) / ops.maximum(ops.sum(weights), 1.0)

    def __call__(self, y_true, y_pred, sample_weight=None):
        """The mean over real slots; with `sample_weight` (batch, slots), such as
        keras-hub's `mask_weights`, the weighted mean sum(w * ce) / sum(w) over them
        (Keras' reduction would multiply the scalar mean by every weight)."""
        if sample_weight is None:
            return super().__call__(y_true, y_pred)
        ce, weights = token_cross_entropy(y_true, y_pred)
        weights = weights * ops.cast(sample_weight, "float32")
        return ops.sum(ce * weights) / ops.maximum(ops.sum(weights), 1.0)


class _MaskedMean(keras.metrics.Metric):
    """Running sum(w * value) / sum(w) over all batches since the last reset."""

    def __init__(self, name, **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable(shape=(), initializer="zeros", dtype="float32", name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", dtype="float32", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        values, weights = self.values(y_true, y_pred)  # the subclass's (value, weight) per slot
        if sample_weight is not None:  # (batch, slots): keras-hub's mask_weights, say
            weights = weights * ops.cast(sample_weight, "float32")
        self.total.assign_add(ops.sum(values * weights))
        self.count.assign_add(ops.sum(weights))

    def result(self):
        return self.total / ops.maximum(self.count, 1.0)


@keras.saving.register_keras_serializable(package="kroberta")
class MaskedAccuracy(_MaskedMean):
    """Fraction of masked slots where the original token has the highest logit.

    A tie for the highest logit counts as correct (an arg-max would break it by
    token id, which says nothing about the model)."""

    def __init__(self, name="masked_accuracy", **kwargs):
        super().__init__(name=name, **kwargs)

    def values(self, y_true, y_pred):
        return masked_correct(y_true, y_pred)


@keras.saving.register_keras_serializable(package="kroberta")
class Perplexity(_MaskedMean):
    """exp of the token-mean cross-entropy over all masked slots seen (corpus perplexity)."""

    def __init__(self, name="perplexity", **kwargs):
        super().__init__(name=name, **kwargs)

    def values(self, y_true, y_pred):
        return token_cross_entropy(y_true, y_pred)

    def result(self):
        return ops.exp(super().result())
