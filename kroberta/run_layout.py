"""The files of a run directory, and reading its config and tokenizer.

A training run, a fine-tuned classifier's folder and the model `kroberta.save` writes
share these names; `training/` writes them and `downstream/` reads them, so they live
below both.

    config.toml             the resolved config (`kroberta.config.Config`)
    model.weights.h5        the final masked LM's Keras weights
    tokenizer.json          the tokenizer the data was prepared with (when it had one)
    classifier.json         marks a fine-tuned classifier's folder (`downstream.prediction`)
"""

from kroberta import storage
from kroberta.config import load_toml
from kroberta.errors import InputError

WEIGHTS_FILE = "model.weights.h5"
CONFIG_FILE = "config.toml"
TOKENIZER_FILE = "tokenizer.json"
CLASSIFIER_FILE = "classifier.json"


def load_run_config(run_dir: str):
    """The run's resolved config (its config.toml)."""
    path = storage.join(run_dir, CONFIG_FILE)
    with storage.local_copy(path) as local:
        return load_toml(local)


def load_tokenizer(run_dir: str):
    """The run's `tokenizers.Tokenizer`, or None when it has no tokenizer.json."""
    tokenizer_path = storage.join(run_dir, TOKENIZER_FILE)
    if not storage.isfile(tokenizer_path):
        return None
    from tokenizers import Tokenizer

    text = storage.read_text(tokenizer_path)
    try:
        return Tokenizer.from_str(text)
    except Exception as e:  # the library raises a bare Exception on malformed JSON
        raise InputError(f"{tokenizer_path}: cannot read this tokenizer: damaged or not a "
                         f"tokenizer's JSON ({e})") from None
