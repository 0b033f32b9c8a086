"""`python -m kroberta.finetune --classifier DIR --predict FILE --predictions OUT`: a
fine-tuned classifier's predictions of a labelled-format file, written as JSON lines
(each probability under its class's name, or the value for regression); a file with
labels is scored too, its metrics written to OUT.metrics.json.
"""

import dataclasses
import json
import os
import sys

import numpy as np

from kroberta import storage
from kroberta.downstream.tasks import check_labelled_file, read_labelled
from kroberta.errors import InputError, NotFoundError
from kroberta.run_layout import CLASSIFIER, model_source

# JAX and Keras load in `predict`, after the checks: argument errors answer at once.


def check(args):
    """Refuses a --classifier, --predict or --predictions a prediction cannot use."""
    if not os.path.isdir(args.classifier):
        raise NotFoundError(f"--classifier {args.classifier}: no such directory")
    check_labelled_file(args.predict, "--predict")
    folder = os.path.dirname(os.path.abspath(args.predictions))
    if not os.path.isdir(folder):
        raise InputError(f"--predictions {args.predictions}: no folder {folder}")
    storage.check_writable(args.predictions, "--predictions")
    _check_overwrites_nothing(args)
    model_source(args.classifier, "--classifier", head=CLASSIFIER)


def _check_overwrites_nothing(args):
    """Refuses --predictions (or its metrics file) that would replace the --predict file
    or a file of the classifier's folder (its result.json, weights, tokenizer)."""
    classifier = os.path.realpath(args.classifier)
    for path in (args.predictions, metrics_path(args.predictions)):
        target = os.path.realpath(path)
        if target == os.path.realpath(args.predict):
            raise InputError(
                f"--predictions {args.predictions}: would replace the --predict file "
                f"{args.predict}; give another file"
            )
        inside = os.path.commonpath([classifier, target]) == classifier
        if inside and os.path.exists(target):
            raise InputError(
                f"--predictions {args.predictions}: would replace {path}, a file of the "
                f"classifier's folder {args.classifier}; write the predictions elsewhere"
            )


def metrics_path(predictions: str) -> str:
    """Where a labelled file's metrics go: beside the predictions, `p.jsonl` -> `p.metrics.json`."""
    return os.path.splitext(predictions)[0] + ".metrics.json"


def predict(args) -> int:
    """Predicts --predict with --classifier into --predictions (and scores a labelled file)."""
    from kroberta.downstream import prediction  # start-up time: after the checks
    from kroberta.downstream.model_files import load  # start-up time: after the checks

    classifier = load(args.classifier)
    spec = classifier.task_spec
    if args.text_field:  # the file's own names for the fields the classifier was trained on
        if len(args.text_field) != len(spec.text_fields):
            raise InputError(
                f"--text-field: the classifier reads {len(spec.text_fields)} "
                f"text field(s) ({', '.join(spec.text_fields)}), got "
                f"{len(args.text_field)}"
            )
        spec = dataclasses.replace(spec, text_fields=tuple(args.text_field))
    # A file with labels (its first record has the label field) is scored too.
    labelled = read_labelled(args.predict, spec, classifier.label_names, require_labels=None)[0]
    predicted = prediction.predict_texts(classifier, labelled.texts)
    _write_predictions(args, classifier, predicted, len(labelled))
    if labelled.has_labels:
        _write_metrics(args, classifier, spec, predicted, labelled)
    return 0


def _write_predictions(args, classifier, predicted: dict, count: int):
    outputs = predicted["values"] if "values" in predicted else predicted["probabilities"]
    finite = np.isfinite(outputs)
    broken = int(np.sum(~(finite.all(-1) if finite.ndim > 1 else finite)))
    if broken:  # never a bare NaN in the file: null, and a word why
        print(
            f"warning: {broken} of {count} prediction(s) are not finite numbers (written "
            f"as null): the classifier's weights in {args.classifier} are damaged",
            file=sys.stderr,
        )
    then = "nothing was written; free some space or choose another --predictions"
    # Under a temporary name until whole: a kill or a full disk leaves no partial file.
    with (
        storage.writing(args.predictions, "predictions", then),
        storage.staged_file(args.predictions) as local,
        open(local, "w", encoding="utf-8") as f,
    ):
        for i in range(count):
            if "values" in predicted:
                value = float(predicted["values"][i])
                record = {"value": value if np.isfinite(value) else None}
            else:
                # Each probability under its class's name: the order needs no explaining.
                row = predicted["probabilities"][i]
                record = {
                    "label": predicted["labels"][i] if np.isfinite(row).all() else None,
                    "probabilities": {
                        str(name): round(float(p), 6) if np.isfinite(p) else None
                        for name, p in zip(classifier.label_names, row)
                    },
                }
            f.write(json.dumps(record, allow_nan=False) + "\n")
    print(f"wrote {args.predictions}: {count} prediction(s)")


def _write_metrics(args, classifier, spec, predicted: dict, labelled):
    """Prints the file's scores and writes them (per class too) beside the predictions."""
    from kroberta.downstream import metrics  # start-up time: as in `predict`

    # (n,) values, or class ids
    chosen = predicted["values"] if "values" in predicted else predicted["probabilities"].argmax(-1)
    names = spec.metrics(len(classifier.label_names or ()))
    scores = metrics.score(names, labelled.labels, chosen)
    result = {"file": args.predict, "examples": len(labelled), "metrics": scores}
    print(f"{args.predict}: " + ", ".join(f"{k} {100 * v:.1f}" for k, v in scores.items()))
    if classifier.label_names:
        per_class = metrics.per_class(labelled.labels, chosen, len(classifier.label_names))
        result["per_class"] = dict(zip(classifier.label_names, per_class))
        if args.per_class:
            print(per_class_table({os.path.basename(args.predict): result["per_class"]}))
    path = metrics_path(args.predictions)
    with storage.writing(path, "metrics", f"the predictions are in {args.predictions}"):
        write_json(path, result)
    print(f"wrote {path}")


def per_class_table(per_class: dict) -> str:
    """{split: {class: precision, recall, f1, support}} as a table (a fine-tune's too)."""
    lines = []
    for split, classes in per_class.items():
        width = max(12, *(len(str(name)) for name in classes))
        lines.append(f"{split:<{width}} {'precision':>9} {'recall':>7} {'f1':>7} {'support':>8}")
        lines += [
            f"{str(name):<{width}} {100 * c['precision']:9.1f} {100 * c['recall']:7.1f} "
            f"{100 * c['f1']:7.1f} {c['support']:8d}"
            for name, c in classes.items()
        ]
    return "\n".join(lines)


def write_json(path: str, value):
    """Strict JSON (no bare NaN, which JSON readers refuse), whole or not at all."""
    storage.write_text(path, json.dumps(value, indent=1, allow_nan=False))
