"""Prediction: its inputs, the engine that feeds the compiled program
(`kroberta.model.predict_program`), fill-mask."""

# What `kroberta.predict(output=...)` and `python -m kroberta.predict --output` can return.
OUTPUTS = ("top_k", "logits", "loss", "embeddings")
# The most host memory one call may return (output="logits" beyond it is refused).
DEFAULT_MAX_OUTPUT_BYTES = 4 * 2**30
