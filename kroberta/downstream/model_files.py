"""A model's files: `kroberta.load` reads the model a directory holds, whichever of the
three sources it is and whichever head; `export_run` (`python -m kroberta.export`) writes a
kroberta folder as either of the other two (`kroberta.save` writes a kroberta folder:
`training.final_model`).

    source \\ head         masked LM                        fine-tuned classifier
    kroberta directory    a run, `kroberta.save`'s folder  `finetune --out`'s folder
    Hugging Face          RobertaForMaskedLM               RobertaForSequenceClassification
    keras-hub preset      RobertaMaskedLM / backbone       RobertaTextClassifier

The source and head are told from the files (`kroberta.run_layout.model_source`), every
file is read through `kroberta.storage` (a URL as a local path). It sits above `training`
(a run's reader, `final_model.load_run`) and `interop` (the other formats' readers)
because it builds the classifier too (`classifiers.build_classifier`).
"""

import os

import keras_hub

from kroberta import storage
from kroberta.downstream import classifiers
from kroberta.downstream.classifiers import describe
from kroberta.downstream.tasks import CLASSIFICATION, REGRESSION, TaskSpec
from kroberta.errors import ConversionError, InputError
from kroberta.interop import hf, hf_weights, keras_hub_presets
from kroberta.model.mlm import build_model
from kroberta.parallel.distribute import global_distribution
from kroberta.run_layout import (
    CLASSIFIER,
    CLASSIFIER_FILE,
    CLASSIFIER_WEIGHTS_FILE,
    HF,
    MASKED_LM,
    RUN,
    TOKENIZER_FILE,
    load_run_config,
    load_tokenizer,
    model_source,
    read_json,
)
from kroberta.training.final_model import load_run


def load(path, mixed_precision: bool | None = None, checkpoint: str | int | None = None):
    """Loads the masked LM or the fine-tuned classifier in directory `path`.

    Args:
        path: a training run (with `config.toml` and `model.weights.h5`: a run that has
            not finished yet loads its latest checkpoint, with a warning), a folder
            `kroberta.save` or `kroberta.finetune(out=...)` wrote, a Hugging Face RoBERTa
            directory (`RobertaForMaskedLM` or `RobertaForSequenceClassification`:
            config.json and model.safetensors or pytorch_model.bin, read with torch) or a
            keras-hub RoBERTa preset (a masked LM, a backbone or a `RobertaTextClassifier`);
            local or a URL.
        mixed_precision: a masked LM's compute policy: True bf16 (weights stay float32);
            None keeps a run's setting, and float32 for the other sources.
        checkpoint: a run's masked LM only: None for the final model; "best" for the kept
            checkpoint with the lowest validation loss (`train.keep_best`); "last" for the
            newest checkpoint; a step number for the checkpoint of that step.

    Returns:
        A masked LM: a `kroberta.MaskedLM` (keras-hub's `RobertaMaskedLM` whose Keras
        `fit` / `evaluate` / `predict` also take Hugging Face's input names) with
        `kroberta_config` (the run's `Config`, or a default one with the imported model
        section), `tokenizer` (a `tokenizers.Tokenizer`, or None) and `kroberta_step` (a
        checkpoint's step). A classifier: keras-hub's `RobertaTextClassifier` with
        `tokenizer`, `label_names` (None for regression), `max_length`, `task_spec` and
        `kroberta_config`, as `kroberta.finetune` returns it.

    Raises:
        NotFoundError: no such directory, or it holds none of the three sources.
        InputError: `checkpoint` given for anything but a run's masked LM.
        ConversionError: an imported config or tensor kroberta cannot hold (names the key).
    """
    source, head = model_source(path, "kroberta.load")
    path = os.fspath(path)
    if checkpoint is not None and (source, head) != (RUN, MASKED_LM):
        what = {HF: "a Hugging Face directory", RUN: "a fine-tuned classifier"}.get(
            source, "a keras-hub preset"
        )
        raise InputError(
            f"checkpoint: {path} is {what}, not a training run: only a run's "
            "masked LM has checkpoints"
        )
    if source == RUN and head == MASKED_LM:
        return load_run(path, mixed_precision, checkpoint)
    if head == CLASSIFIER:
        with global_distribution(classifiers.data_parallel()):  # as fine-tuning lays it out
            if source == RUN:
                return _run_classifier(path)
            with storage.local_copy(path) as local:  # a URL: a temporary copy
                return (_hf_classifier if source == HF else _keras_hub_classifier)(local)
    with storage.local_copy(path) as local:
        reader = _hf_masked_lm if source == HF else _keras_hub_masked_lm
        return reader(local, bool(mixed_precision))


def _hf_masked_lm(directory: str, mixed_precision: bool):
    found, config, tokenizer, tensors, source = hf.read_hf_model(directory)
    model = build_model(config.model, mixed_precision, config=config, tokenizer=tokenizer)
    hf_weights.load_hf_tensors(model, tensors, source, tied=found.get("tie_word_embeddings", True))
    return model


def _keras_hub_masked_lm(directory: str, mixed_precision: bool):
    config = keras_hub_presets.preset_config(directory)
    model = build_model(
        config.model,
        mixed_precision,
        seed=0,
        config=config,
        tokenizer=keras_hub_presets.preset_tokenizer(directory),
    )
    keras_hub_presets.load_weights_into(model, directory)
    return model


def _run_classifier(directory: str):
    """The classifier of a folder `kroberta.save` wrote."""
    missing = [
        name
        for name in (TOKENIZER_FILE, CLASSIFIER_WEIGHTS_FILE)
        if not storage.isfile(storage.join(directory, name))
    ]
    description = read_json(storage.join(directory, CLASSIFIER_FILE))
    if missing or not isinstance(description, dict):
        raise InputError(
            f"{directory}: not a fine-tuned classifier ("
            f"{', '.join(missing) or CLASSIFIER_FILE + ' unreadable'} missing); "
            "write one with python -m kroberta.finetune --out"
        )
    names = description["label_names"]
    config = load_run_config(directory)
    pooling = description.get("pooling", classifiers.FIRST)
    if pooling not in classifiers.POOLINGS:
        raise InputError(
            f"{storage.join(directory, CLASSIFIER_FILE)}: pooling {pooling!r}: "
            f"expected one of {', '.join(classifiers.POOLINGS)}"
        )
    classifier = classifiers.build_classifier(config.model, len(names) if names else 1, pooling)
    weights = storage.join(directory, CLASSIFIER_WEIGHTS_FILE)
    with storage.local_copy(weights) as local, storage.reading(weights, "weights file"):
        classifier.load_weights(local)  # h5: a local file
    return describe(
        classifier,
        config,
        load_tokenizer(directory),
        _task_spec(directory, None, description["task"]),
        names,
        description["max_length"],
    )


def _hf_classifier(directory: str):
    """The classifier of a `RobertaForSequenceClassification` directory: its labels from
    id2label, its length from tokenizer_config.json's model_max_length (within the positions)."""
    found, config, tokenizer, tensors, source = hf.read_hf_model(directory)
    labels = found.get("id2label") or {
        str(i): f"LABEL_{i}" for i in range(found.get("num_labels", 2))
    }
    if found.get("problem_type") == "multi_label_classification":
        raise ConversionError(
            f"{directory}: problem_type multi_label_classification: kroberta's "
            "classifiers choose one label (softmax)"
        )
    classifier = classifiers.build_classifier(config.model, len(labels))
    hf_weights.load_hf_tensors(classifier, tensors, source)
    positions = config.model.max_sequence_length
    length = min(
        positions,
        read_json(os.path.join(directory, "tokenizer_config.json"), {}).get(
            "model_max_length", positions
        ),
    )
    regression = len(labels) == 1 or found.get("problem_type") == "regression"
    names = None if regression else [labels[str(i)] for i in range(len(labels))]
    return describe(
        classifier,
        config,
        tokenizer,
        _task_spec(directory, regression, found.get("kroberta_task")),
        names,
        length,
    )


def _keras_hub_classifier(directory: str):
    """The classifier of a `RobertaTextClassifier` preset: its length from preprocessor.json,
    its class names and task from kroberta_classifier.json (else "0", "1", ...)."""
    config = keras_hub_presets.preset_config(directory)
    stock = keras_hub.models.RobertaTextClassifier.from_preset(
        directory, preprocessor=None, dtype="float32"
    )
    classifier = classifiers.build_classifier(config.model, stock.num_classes)
    classifier.set_weights(stock.get_weights())
    length = (
        read_json(os.path.join(directory, "preprocessor.json"), {})
        .get("config", {})
        .get("sequence_length", config.model.max_sequence_length)
    )
    regression = stock.num_classes == 1
    described = read_json(os.path.join(directory, keras_hub_presets.CLASSIFIER_FILE), {})
    names = described.get("label_names") or [str(i) for i in range(stock.num_classes)]
    return describe(
        classifier,
        config,
        keras_hub_presets.preset_tokenizer(directory),
        _task_spec(directory, regression, described.get("task")),
        None if regression else names,
        length,
    )


def _task_spec(directory: str, regression: bool, task: dict | None) -> TaskSpec:
    """The task as saved (a dict of `TaskSpec`'s fields), else one text field "text" of
    the kind `regression` says (an export made elsewhere names no task)."""
    if task:
        return TaskSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in task.items()})
    return TaskSpec(
        os.path.basename(os.path.normpath(directory)),
        kind=REGRESSION if regression else CLASSIFICATION,
        metric="pearson" if regression else "accuracy",
    )


def export_run(run: str, out: str, overwrite: bool = False, format: str = "hf") -> str:
    """Exports the run at `run` (with its tokenizer, if any) into `out` in `format`
    ("hf" or "keras-hub"); returns `out`. A fine-tuned classifier's folder
    (`kroberta.finetune`'s `--out`) becomes a `RobertaForSequenceClassification`
    directory or a `RobertaTextClassifier` preset. The command checked its arguments
    (`kroberta.cli.export`)."""
    model = load(run, mixed_precision=False)  # float32 weights either way
    # Staged beside `out` and renamed when whole (`interop.staged_export`): a full disk
    # leaves `out` as it was.
    with storage.writing(
        out,
        f"{format} export",
        "nothing was written there (an earlier "
        "export is kept); free some space and run the same command again",
    ):
        if format == "hf":
            hf.export_hf(model, out, tokenizer=model.tokenizer, overwrite=overwrite)
        else:
            keras_hub_presets.export_keras_hub(
                model, out, tokenizer=model.tokenizer, overwrite=overwrite
            )
    return out
