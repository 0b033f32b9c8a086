"""Gradient accumulation: one optimizer step over N micro-batches (`train.gradient_accumulation_steps`).

The training pipeline feeds batches N times larger than a device step holds
(global batch = batch_size_per_device x devices x N); the train step installed
here (`install`) splits each into N micro-batches and runs them one after another
in a `jax.lax.scan`, so only one micro-batch's activations are alive at a time.
The gradients are summed, each micro-batch's weighted by its share of the whole
batch's masked tokens, so the update is that of one batch N times larger up to
float rounding:

    loss = sum over all micro-batches of the per-token cross-entropy
           / masked tokens of the whole accumulated batch

not the mean of N micro-batch means (which over-weights the tokens of a
micro-batch with few masks). The optimizer, its step counter, the schedule, the
logs and MFU all count optimizer steps; K steps per dispatch
(`kroberta.fused_steps`) scan this step as they scan Keras' own.
"""

import jax
import jax.numpy as jnp
from keras.src import backend, tree
from keras.src.trainers import data_adapters

from kroberta.tokens import IGNORE_LABEL


def micro_batches(leaf, n: int):
    """(N * b, ...) -> (N, b, ...): micro-batch i is rows i, i + N, i + 2N, ...

    Strided rather than contiguous, so that under data parallelism every device's
    contiguous block of the batch holds its own share of every micro-batch, and
    no micro-batch needs rows of another device."""
    if leaf is None:
        return None
    rows = leaf.shape[0]
    if rows % n:
        raise ValueError(f"a batch of {rows} rows does not split into {n} micro-batches")
    stacked = jnp.reshape(leaf, (rows // n, n, *leaf.shape[1:]))  # (b, N, ...)
    return jnp.swapaxes(stacked, 0, 1)  # (N, b, ...)


def masked_tokens(labels):
    """The number of real masked slots in `labels` (..., slots), as float32."""
    return jnp.sum((labels != IGNORE_LABEL).astype("float32"))


def accumulated_train_step(model, n: int):
    """Keras' JAX `train_step(state, data) -> (logs, state)` with the gradient of a
    batch of N micro-batches, applied in one optimizer update."""
    grad_fn = jax.value_and_grad(model.compute_loss_and_updates, has_aux=True)

    def train_step(state, data):
        trainable, non_trainable, optimizer_vars, metrics_vars = state
        x, y, sample_weight = data_adapters.data_adapter_utils.unpack_x_y_sample_weight(data)
        micro = tree.map_structure(lambda a: micro_batches(a, n), (x, y, sample_weight),
                                   none_is_leaf=True)
        # The whole batch's masked tokens: each micro-batch's mean loss weighs by its share.
        total = jnp.maximum(masked_tokens(y), 1.0)

        def body(carry, batch):
            grads, loss, non_trainable, metrics_vars = carry
            bx, by, bw = batch
            share = masked_tokens(by) / total
            (_, (micro_loss, y_pred, non_trainable, metrics_vars)), micro_grads = grad_fn(
                trainable, non_trainable, metrics_vars, bx, by, bw, training=True,
                optimizer_variables=optimizer_vars)
            grads = jax.tree.map(lambda g, m: g + share * m, grads, micro_grads)
            # Token-weighted metrics (accuracy, perplexity) add up over micro-batches
            # exactly as over one batch; Keras' loss tracker is updated once, below.
            metrics_vars = _update_compiled_metrics(model, metrics_vars, by, y_pred, bw)
            return (grads, loss + share * micro_loss, non_trainable, metrics_vars), None

        zeros = jax.tree.map(jnp.zeros_like, trainable)
        carry = (zeros, jnp.zeros((), "float32"), non_trainable, metrics_vars)
        (grads, loss, non_trainable, metrics_vars), _ = jax.lax.scan(body, carry, micro)
        trainable, optimizer_vars = model.optimizer.stateless_apply(
            optimizer_vars, grads, trainable)
        rows = next(leaf for leaf in tree.flatten(x) if leaf is not None).shape[0]
        logs, metrics_vars = _update_loss_tracker(model, metrics_vars, loss, rows)
        return logs, (trainable, non_trainable, optimizer_vars, metrics_vars)

    return train_step


def _stateless(model, metrics_vars, update):
    """Runs `update()` on the metrics' values `metrics_vars`; returns (its result, new values)."""
    mapping = list(zip(model.metrics_variables, metrics_vars))
    with backend.StatelessScope(state_mapping=mapping) as scope:
        result = update()
    new = []
    for ref in model.metrics_variables:
        value = scope.get_current_value(ref)
        new.append(ref.value if value is None else value)
    return result, new


def _update_compiled_metrics(model, metrics_vars, y, y_pred, sample_weight):
    def update():
        if model._compile_metrics is not None:
            model._compile_metrics.update_state(y, y_pred, sample_weight=sample_weight)

    return _stateless(model, metrics_vars, update)[1]


def _update_loss_tracker(model, metrics_vars, loss, rows: int):
    def update():
        model._loss_tracker.update_state(loss, sample_weight=rows)
        return model.get_metrics_result()

    return _stateless(model, metrics_vars, update)


def install(model, n: int):
    """Makes this compiled `model` train with N micro-batches per optimizer step (N > 1).

    Call after `model.compile` and before the train function is made; the model's
    class, config and saved weights are untouched. Returns the model."""
    if n > 1:
        object.__setattr__(model, "train_step", accumulated_train_step(model, n))
    return model
