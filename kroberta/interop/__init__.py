"""Other formats: Hugging Face transformers and keras-hub presets."""

EXPORT_FORMATS = ("hf", "keras-hub")  # `kroberta.training.final_model.export`'s formats
