"""Prediction: the compiled engine, its inputs, fill-mask, top-k."""
