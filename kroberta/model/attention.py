"""Attention dropout apart from hidden dropout, and which attention kernel runs.

keras-hub's `TransformerEncoder` passes its one `dropout` to its attention layer
(dropout on the softmax weights, Hugging Face's `attention_probs_dropout_prob`) and
to the two residual branches (`hidden_dropout_prob`). Keras' `MultiHeadAttention`
calls `ops.dot_product_attention` (fused and flash kernels where the platform has
them) only when its own dropout is 0; otherwise it materialises the (batch, heads,
length, length) weights, draws a dropout mask of that size and keeps both for the
backward pass. `use_attention_dropout(model, rate)` sets the attention layers' rate
on a built model, in place: the variables, weights paths and keras-hub config stay
as they are (the config still records the hidden rate; kroberta's own config and
exports carry the attention rate).

Which kernel runs with rate 0 is Keras' choice (`keras.ops.dot_product_attention`):
- GPU (Ampere or newer, cuDNN): cuDNN's flash attention when it accepts the shapes,
  else XLA's attention (`jax.nn.dot_product_attention`, implementation "xla");
- TPU: Keras' Splash (Pallas flash) kernel needs a mask known when the program is
  compiled; kroberta's padding masks are data, so Keras falls back to XLA's
  attention, which XLA fuses on TPU without a dropout mask to keep;
- CPU: XLA's attention.
`attention_path` names the one taken; `python -m kroberta.train` logs it once.
"""

import jax
import keras

from kroberta.model.swap import inner_layers


def attention_layers(model) -> list:
    """Every `keras.layers.MultiHeadAttention` inside `model`."""
    return inner_layers(model, lambda layer: isinstance(layer, keras.layers.MultiHeadAttention))


def use_attention_dropout(model, rate: float) -> int:
    """Sets the dropout on the attention weights of every attention layer in `model`
    to `rate`, in place; returns how many layers.

    Keras keeps the rate in `MultiHeadAttention._dropout` (read when the layer is
    called, to choose between `ops.dot_product_attention` and the explicit softmax)
    and in its `_dropout_layer`; Keras 3.15 has no public setter for either.
    """
    layers = attention_layers(model)
    for layer in layers:
        layer._dropout = float(rate)
        layer._dropout_layer.rate = float(rate)
    return len(layers)


def _cudnn_attention_available(batch: int, length: int, heads: int, head_dim: int, dtype) -> bool:
    """Whether `jax.nn.dot_product_attention(implementation="cudnn")` traces for these
    shapes with a padding mask (it checks the cuDNN version, the GPU and the layout
    while tracing)."""
    spec = jax.ShapeDtypeStruct((batch, length, heads, head_dim), dtype)
    mask = jax.ShapeDtypeStruct((batch, 1, length, length), "bool")
    try:
        jax.eval_shape(
            lambda q, k, v, m: jax.nn.dot_product_attention(
                q, k, v, mask=m, implementation="cudnn"
            ),
            spec,
            spec,
            spec,
            mask,
        )
        return True
    except Exception:  # cuDNN missing, an older GPU or unsupported shapes
        return False


def attention_path(m, length: int, mixed_precision: bool, platform: str | None = None) -> str:
    """One line saying how attention runs in training for these settings.

    Args:
        m: the `ModelConfig` (its attention dropout rate, heads and head size).
        length: tokens per sequence.
        mixed_precision: bf16 compute (cuDNN's flash kernel needs bf16 or float16).
        platform: "cpu", "gpu" or "tpu"; the default backend's when None.
    Returns:
        The sentence `build_model` logs.
    """
    platform = platform or jax.default_backend()
    rate, heads, head_dim = m.attention_dropout_rate, m.num_heads, m.head_dim
    if rate > 0:
        return (
            f"attention: explicit softmax with dropout {rate:g} on the weights (materialises "
            f"(batch, {heads}, {length}, {length}) weights and their dropout mask); "
            "model.attention_dropout=0 runs ops.dot_product_attention (fused kernels)"
        )
    if platform == "gpu":
        dtype = "bfloat16" if mixed_precision else "float32"
        if _cudnn_attention_available(8, length, heads, head_dim, dtype):
            return "attention: ops.dot_product_attention -> cuDNN flash attention"
        return (
            "attention: ops.dot_product_attention -> XLA's attention (cuDNN's flash kernel "
            f"refuses these settings: {dtype}, {heads} heads of {head_dim}, {length} tokens)"
        )
    if platform == "tpu":
        return (
            "attention: ops.dot_product_attention -> XLA's fused attention (Keras' Splash "
            "kernel needs a compile-time mask; padding masks are data)"
        )
    return f"attention: ops.dot_product_attention -> XLA's attention ({platform}: no flash kernel)"


def describe(m, mixed_precision: bool, remat: str) -> str:
    """The log line of a training run of the model `m` (a `ModelConfig`): the attention
    path and `train.remat`."""
    return attention_path(m, m.max_sequence_length, mixed_precision) + f"; train.remat={remat}"
