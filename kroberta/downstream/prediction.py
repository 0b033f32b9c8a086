"""A fine-tuned classifier's predictions, and the folder it is saved in.

`predict_texts` runs the classifier's compiled predict step over texts (bucketed as
in training) and returns probabilities and labels. `save_classifier` writes what
`load_classifier` needs into a run-dir-like folder: the pretrained model's
config.toml and tokenizer.json, the classifier's weights, and classifier.json (the
task, its label names, the sequence length). `load_classifier` also reads the
classifier's exports (`python -m kroberta.export`): a Hugging Face
`RobertaForSequenceClassification` directory or a keras-hub `RobertaTextClassifier` preset.
"""

import dataclasses
import json
import os

import numpy as np

from kroberta.errors import ConversionError, InputError, NotFoundError
from kroberta.config import to_toml
from kroberta.downstream import classifiers
from kroberta.downstream import encoding
from kroberta import storage
from kroberta.downstream.examples import CLASSIFICATION, REGRESSION, TaskSpec
from kroberta.run_layout import (CLASSIFIER_FILE, CONFIG_FILE, TOKENIZER_FILE,
                                 load_run_config, load_tokenizer)

WEIGHTS_FILE = "classifier.weights.h5"


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
    # Weights only, as kroberta.save: a stock copy on this host (no optimizer state).
    from kroberta.model.mlm import stock_copy
    from kroberta.parallel.distribute import global_distribution

    stock = stock_copy(classifier)
    with global_distribution(None):
        stock.save_weights(os.path.join(directory, WEIGHTS_FILE))
    return directory


def load_classifier(directory: str):
    """Loads a fine-tuned classifier.

    Args:
        directory: a folder `save_classifier` wrote (`python -m kroberta.finetune --out`),
            a Hugging Face `RobertaForSequenceClassification` directory or a keras-hub
            `RobertaTextClassifier` preset (`python -m kroberta.export` of such a folder).

    Returns:
        keras-hub's `RobertaTextClassifier` with `tokenizer`, `label_names` (None for
        regression), `max_length`, `task_spec` and `kroberta_config`, as
        `kroberta.finetune` returns it.

    Raises:
        NotFoundError: no such directory.
        InputError: it holds a masked LM or a pretraining run (the message names the
            call that loads it), or no classifier.
    """
    from kroberta.parallel.distribute import global_distribution

    if not os.path.isdir(directory):
        raise NotFoundError(f"{directory}: no such directory")
    with global_distribution(classifiers.data_parallel()):  # as fine-tuning lays it out
        return _load(directory)


def _load(directory: str):
    from kroberta.interop import hf

    if not os.path.isfile(os.path.join(directory, CLASSIFIER_FILE)):
        if os.path.isfile(os.path.join(directory, "metadata.json")):  # a keras-hub preset
            return _from_keras_hub(directory)
        if os.path.isfile(os.path.join(directory, hf.CONFIG_FILE)):
            return _from_hf(directory)
        if os.path.isfile(os.path.join(directory, CONFIG_FILE)):
            raise InputError(f"{directory}: a pretraining run, not a fine-tuned classifier; load "
                             f"it with kroberta.load({directory!r}), fine-tune it with kroberta.finetune")
    paths = {name: os.path.join(directory, name)
             for name in (CONFIG_FILE, TOKENIZER_FILE, CLASSIFIER_FILE, WEIGHTS_FILE)}
    missing = [name for name, path in paths.items() if not os.path.isfile(path)]
    if missing:
        raise InputError(f"{directory}: not a fine-tuned classifier ({', '.join(missing)} "
                         "missing); write one with python -m kroberta.finetune --out")
    with open(paths[CLASSIFIER_FILE], encoding="utf-8") as f:
        description = json.load(f)
    spec = _task_spec(directory, None, description["task"])
    names = description["label_names"]
    config = load_run_config(directory)
    classifier = classifiers.build_classifier(config.model, len(names) if names else 1)
    with storage.reading(paths[WEIGHTS_FILE], "weights file"):
        classifier.load_weights(paths[WEIGHTS_FILE])
    return describe(classifier, config, load_tokenizer(directory), spec, names,
                    description["max_length"])


def describe(classifier, config, tokenizer, spec, names, max_length: int):
    """`classifier` with what prediction and `save_classifier` read from it."""
    classifier.tokenizer, classifier.kroberta_config, classifier.task_spec = tokenizer, config, spec
    classifier.label_names = tuple(names) if names else None
    classifier.max_length = int(max_length)
    return classifier


def _task_spec(directory: str, regression: bool, task: dict | None) -> TaskSpec:
    """The task as saved (a dict of `TaskSpec`'s fields), else one text field "text" of
    the kind `regression` says (an export made elsewhere names no task)."""
    if task:
        return TaskSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in task.items()})
    return TaskSpec(os.path.basename(os.path.normpath(directory)),
                    kind=REGRESSION if regression else CLASSIFICATION,
                    metric="pearson" if regression else "accuracy")


def _json_in(directory: str, name: str, default):
    """`directory/name` parsed, or `default` when there is no such file."""
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
        return default
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _from_hf(directory: str):
    """The classifier of a `RobertaForSequenceClassification` directory: its labels from
    id2label, its length from tokenizer_config.json's model_max_length (within the positions)."""
    from kroberta.interop import hf, hf_weights

    found, config, tokenizer, tensors, source = hf.read_hf_model(directory, classifier=True)
    labels = found.get("id2label") or {str(i): f"LABEL_{i}" for i in range(found.get("num_labels", 2))}
    if found.get("problem_type") == "multi_label_classification":
        raise ConversionError(f"{directory}: problem_type multi_label_classification: kroberta's "
                              "classifiers choose one label (softmax)")
    classifier = classifiers.build_classifier(config.model, len(labels))
    hf_weights.load_hf_tensors(classifier, tensors, source)
    length = min(config.model.max_sequence_length, _json_in(directory, "tokenizer_config.json", {})
                 .get("model_max_length", config.model.max_sequence_length))
    regression = len(labels) == 1 or found.get("problem_type") == "regression"
    names = None if regression else [labels[str(i)] for i in range(len(labels))]
    return describe(classifier, config, tokenizer,
                    _task_spec(directory, regression, found.get("kroberta_task")), names, length)


def _from_keras_hub(directory: str):
    """The classifier of a `RobertaTextClassifier` preset: its length from preprocessor.json,
    its class names and task from kroberta_classifier.json (else "0", "1", ...)."""
    import keras_hub

    from kroberta.interop import keras_hub_presets

    config = keras_hub_presets.preset_config(directory, classifier=True)
    stock = keras_hub.models.RobertaTextClassifier.from_preset(directory, preprocessor=None,
                                                               dtype="float32")
    classifier = classifiers.build_classifier(config.model, stock.num_classes)
    classifier.set_weights(stock.get_weights())
    length = _json_in(directory, "preprocessor.json", {}).get("config", {}).get(
        "sequence_length", config.model.max_sequence_length)
    regression = stock.num_classes == 1
    described = _json_in(directory, keras_hub_presets.CLASSIFIER_FILE, {})
    names = described.get("label_names") or [str(i) for i in range(stock.num_classes)]
    return describe(classifier, config, keras_hub_presets.preset_tokenizer(directory),
                    _task_spec(directory, regression, described.get("task")),
                    None if regression else names, length)


def outputs(classifier, data, rows: np.ndarray, count: int) -> np.ndarray:
    """The classifier's (count, K) logits (K = 1: regression values) of a split, in the
    split's order, from its compiled predict step over `encoding.dataset`'s (data, rows)."""
    values = np.asarray(classifier.predict(data, verbose=0), np.float32)  # (rows, K)
    ordered = np.empty((count, values.shape[1]), np.float32)
    ordered[rows[rows >= 0]] = values[rows >= 0]  # padding rows (-1) dropped
    return ordered


def _texts_ok(texts) -> bool:
    """A non-empty list of strings, or one or two such lists (of one length)."""
    def strings(group):
        return isinstance(group, (list, tuple)) and len(group) and all(isinstance(t, str) for t in group)

    return bool(strings(texts) or (isinstance(texts, (list, tuple)) and len(texts) in (1, 2)
                                   and all(map(strings, texts)) and len(set(map(len, texts))) == 1))


def predict_texts(classifier, texts, batch_size: int = 32) -> dict:
    """Predicts texts (a list of strings, or a pair of lists for a pair task), with the
    classifier's compiled predict step, the batch split over this process's devices.

    Args:
        classifier: a fine-tuned classifier (`kroberta.finetune`'s, `load_classifier`'s).
        texts: the texts; for a pair task two lists, the first and second texts.
        batch_size: sequences per step (rounded up to a multiple of the devices).

    Returns:
        For classification {"probabilities": (n, K) float32, "labels": n class names};
        for regression {"values": (n,) float32}.
    """
    import jax

    from kroberta.parallel.distribute import global_distribution

    if not _texts_ok(texts):
        got = "an empty list" if isinstance(texts, (list, tuple)) and not texts else \
            type(texts).__name__
        raise InputError("texts: expected a list of strings, or two lists (a pair task's first "
                         f"and second texts), got {got}")
    if isinstance(texts[0], str):
        texts = (list(texts),)
    labels = np.zeros((len(texts[0]),), np.int32)
    encoded = encoding.encode(classifier.tokenizer, tuple(texts), labels, classifier.max_length)
    devices = jax.local_device_count()
    data, rows = encoding.dataset(encoded, -(-batch_size // devices) * devices, classifier.max_length)
    with global_distribution(classifiers.data_parallel()):
        ordered = outputs(classifier, data, rows, len(labels))  # (n, K)
    if classifier.task_spec.kind == REGRESSION:
        return {"values": ordered[:, 0]}
    shifted = np.exp(ordered - ordered.max(-1, keepdims=True))
    probabilities = shifted / shifted.sum(-1, keepdims=True)
    return {"probabilities": probabilities,
            "labels": [classifier.label_names[i] for i in probabilities.argmax(-1)]}
