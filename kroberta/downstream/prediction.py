"""A fine-tuned classifier's predictions, and the folder it is saved in.

`predict_texts` runs the classifier's compiled predict step over texts (bucketed as
in training) and returns probabilities and labels. `save_classifier` writes what
`load_classifier` needs into a run-dir-like folder: the pretrained model's
config.toml and tokenizer.json, the classifier's weights, and classifier.json (the
task, its label names, the sequence length).
"""

import dataclasses
import json
import os

import numpy as np

from kroberta.errors import InputError
from kroberta.config import to_toml
from kroberta.downstream import classifiers
from kroberta.downstream import encoding
from kroberta.downstream.examples import REGRESSION, TaskSpec
from kroberta.training.final_model import CONFIG_FILE, TOKENIZER_FILE, load_run_config, load_tokenizer

WEIGHTS_FILE = "classifier.weights.h5"
CLASSIFIER_FILE = "classifier.json"


def save_classifier(classifier, directory: str) -> str:
    """Writes a fine-tuned classifier (`FinetuneResult.classifier`) into `directory`."""
    os.makedirs(directory, exist_ok=True)
    config = dataclasses.replace(classifier.kroberta_config, run_dir=str(directory))
    with open(os.path.join(directory, CONFIG_FILE), "w", encoding="utf-8") as f:
        f.write(to_toml(config))
    with open(os.path.join(directory, TOKENIZER_FILE), "w", encoding="utf-8") as f:
        f.write(classifier.tokenizer.to_str())
    description = {"task": dataclasses.asdict(classifier.task_spec),
                   "label_names": list(classifier.label_names or []) or None,
                   "max_length": classifier.max_length}
    with open(os.path.join(directory, CLASSIFIER_FILE), "w", encoding="utf-8") as f:
        json.dump(description, f, indent=1)
    # Weights only, as kroberta.save: an uncompiled twin on this host (no optimizer state).
    from kroberta.parallel.distribute import global_distribution

    with global_distribution(None):
        twin = classifiers.build_classifier(config.model, classifier.num_classes)
        twin.set_weights([np.asarray(w) for w in classifier.get_weights()])
        twin.save_weights(os.path.join(directory, WEIGHTS_FILE))
    return directory


def load_classifier(directory: str):
    """The classifier `save_classifier` wrote, with tokenizer, label_names, max_length."""
    paths = {name: os.path.join(directory, name)
             for name in (CONFIG_FILE, TOKENIZER_FILE, CLASSIFIER_FILE, WEIGHTS_FILE)}
    missing = [name for name, path in paths.items() if not os.path.isfile(path)]
    if missing:
        raise InputError(f"{directory}: not a fine-tuned classifier ({', '.join(missing)} "
                                "missing); write one with python -m kroberta.finetune --out")
    with open(paths[CLASSIFIER_FILE], encoding="utf-8") as f:
        description = json.load(f)
    spec = TaskSpec(**{k: tuple(v) if isinstance(v, list) else v
                       for k, v in description["task"].items()})
    names = description["label_names"]
    config = load_run_config(directory)
    classifier = classifiers.build_classifier(config.model, len(names) if names else 1)
    classifier.load_weights(paths[WEIGHTS_FILE])
    classifier.tokenizer = load_tokenizer(directory)
    classifier.kroberta_config, classifier.task_spec = config, spec
    classifier.label_names = tuple(names) if names else None
    classifier.max_length = description["max_length"]
    return classifier


def outputs(classifier, encoded: encoding.Encoded, batch_size: int, max_length: int):
    """The classifier's (n, K) logits (K = 1: regression values) of an encoded split, in
    the split's order, from its compiled predict step over the bucketed batches."""
    data, rows = encoding.dataset(encoded, batch_size, max_length)
    values = np.asarray(classifier.predict(data, verbose=0), np.float32)  # (rows, K)
    ordered = np.empty((len(encoded.labels), values.shape[1]), np.float32)
    ordered[rows[rows >= 0]] = values[rows >= 0]
    return ordered


def predict_texts(classifier, texts, batch_size: int = 32) -> dict:
    """Predicts texts (a list of strings, or a pair of lists for a pair task).

    Returns:
        For classification {"probabilities": (n, K) float32, "labels": n class names};
        for regression {"values": (n,) float32}.
    """
    if isinstance(texts[0], str):
        texts = (list(texts),)
    labels = np.zeros((len(texts[0]),), np.int32)
    encoded = encoding.encode(classifier.tokenizer, tuple(texts), labels, classifier.max_length)
    ordered = outputs(classifier, encoded, batch_size, classifier.max_length)
    if classifier.task_spec.kind == REGRESSION:
        return {"values": ordered[:, 0]}
    shifted = np.exp(ordered - ordered.max(-1, keepdims=True))
    probabilities = shifted / shifted.sum(-1, keepdims=True)
    return {"probabilities": probabilities,
            "labels": [classifier.label_names[i] for i in probabilities.argmax(-1)]}
