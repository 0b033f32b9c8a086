"""Prediction: the compiled engine, its inputs, fill-mask, top-k."""

# What `kroberta.predict(output=...)` and `python -m kroberta.predict --output` can return.
OUTPUTS = ("top_k", "logits", "loss", "embeddings")
