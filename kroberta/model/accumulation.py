"""Gradient accumulation's batch arithmetic (`train.gradient_accumulation_steps` = N).

The training pipeline feeds batches N times larger than a device step holds
(global batch = batch_size_per_device x devices x N); the training step
(`kroberta.model.masked_lm.MaskedLM.train_step`) splits each into N
micro-batches (`micro_batches`) and runs them one after another in a
`jax.lax.scan`, so only one micro-batch's activations are alive at a time. The
gradients are summed, each micro-batch's weighted by its share of the whole batch's
masked tokens (`masked_tokens`), so the update is that of one batch N times larger
up to float rounding:

    loss = sum over all micro-batches of the per-token cross-entropy
           / masked tokens of the whole accumulated batch

not the mean of N micro-batch means (which over-weights the tokens of a
micro-batch with few masks). The optimizer, its step counter, the schedule, the
logs and MFU all count optimizer steps.
"""

import jax.numpy as jnp

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
