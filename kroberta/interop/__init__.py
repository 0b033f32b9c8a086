"""Other formats: Hugging Face transformers and keras-hub presets."""
