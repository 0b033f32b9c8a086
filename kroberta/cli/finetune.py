"""Fine-tune a pretrained model on a labelled task and print its score.

    python -m kroberta.finetune --run runs/default            # the embedded stdlib task
    python -m kroberta.finetune --run runs/x --task glue/rte --data glue_data
    python -m kroberta.finetune --run runs/x --suite glue --data glue_data
    python -m kroberta.finetune --run runs/x --data train.jsonl --validation dev.jsonl
    python -m kroberta.finetune --classifier out/ --predict test.jsonl --predictions p.jsonl

With no data, the embedded task (which package of the standard library a docstring
is from) runs, beside the same recipe from a random initialisation. The Python API
is `kroberta.finetune(...)` (kroberta/downstream/finetuning.py).
"""

import argparse
import dataclasses
import json
import os
import sys

import kroberta
from kroberta import cli, storage
from kroberta.downstream.arguments import check_finetune_arguments
from kroberta.downstream.settings import POOLINGS, FinetuneConfig, SettingError
from kroberta.errors import InputError
from kroberta.run_layout import CLASSIFIER, model_source

RANDOM_START_DIR = "random-start"  # --out's folder for the random start's classifier

# JAX, Keras and TensorFlow load in the functions that use them: --help answers at once.


def _parser():
    p = cli.ArgumentParser(prog="python -m kroberta.finetune", inputs="--data",
                           description=__doc__.split("\n")[0])
    p.add_argument("--run", help="the pretrained model: a run directory, a Hugging Face "
                   "export or a keras-hub preset")
    p.add_argument("--task", help="glue/<task> (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, "
                   "wnli), or a name for --data/--validation files (default: the embedded task)")
    p.add_argument("--suite", choices=("glue",), help="every GLUE task found under --data")
    p.add_argument("--data", help="the GLUE directory, or the labelled training file")
    p.add_argument("--validation", help="the labelled validation file")
    p.add_argument("--text-field", action="append", default=None,
                   help="the field of the text; twice for a pair (default: text, else the "
                   "fields besides the label, as run_glue; with --predict: the classifier's)")
    p.add_argument("--label-field", default="label", help="the field of the label")
    p.add_argument("--kind", default="classification", choices=("classification", "regression"))
    p.add_argument("--learning-rates", help="comma-separated grid (default: by model size)")
    p.add_argument("--baseline-learning-rates", help="the random start's own grid (default: "
                   "as --learning-rates)")
    p.add_argument("--widen", action=argparse.BooleanOptionalAction, default=FinetuneConfig.widen,
                   help="while the best rate is at an edge of its grid, add the rate 3x beyond "
                   "it (default: on)")
    p.add_argument("--seeds", type=int, default=FinetuneConfig.seeds,
                   help="seeds per learning rate")
    p.add_argument("--epochs", type=int, default=FinetuneConfig.epochs, help="the most passes over "
                   "the training data; each trial keeps its best epoch")
    p.add_argument("--early-stopping", type=int, default=FinetuneConfig.early_stopping,
                   metavar="PATIENCE",
                   help="stop a trial after PATIENCE epochs without a better validation score")
    p.add_argument("--pooling", default=FinetuneConfig.pooling, choices=POOLINGS,
                   help="what the classifier's head reads: the first token <s> (as Hugging "
                   "Face's and keras-hub's heads; exportable) or the mean over the tokens "
                   "that are not padding (not exportable); the random start's too")
    p.add_argument("--probe-epochs", type=int, default=FinetuneConfig.probe_epochs, metavar="N",
                   help="LP-FT: first N epochs train the head alone, the body frozen, at the "
                   "trial's learning rate (default 0: off)")
    p.add_argument("--layer-decay", type=float, default=FinetuneConfig.layer_decay, metavar="D",
                   help="layer-wise learning-rate decay in (0, 1]: each encoder layer below "
                   "the top learns at D times the rate of the one above (default 1: off)")
    p.add_argument("--adapt-steps", type=int, default=FinetuneConfig.adapt_steps, metavar="N",
                   help="task-adaptive pretraining: N masked-LM steps on the training texts "
                   "before fine-tuning, the random start's too (default 0: off)")
    p.add_argument("--reinit-layers", type=int, default=FinetuneConfig.reinit_layers, metavar="K",
                   help="draw the pretrained start's top K encoder layers afresh (default 0: off)")
    p.add_argument("--batch-size", type=int, default=FinetuneConfig.batch_size,
                   help="sequences per step, all devices")
    p.add_argument("--max-length", type=int, default=FinetuneConfig.max_length,
                   help="tokens per sequence")
    p.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=None,
                   help="also fine-tune a random initialisation (default: on for the "
                   "embedded task)")
    p.add_argument("--out", help="folder for result.json, the best classifier and the finished "
                   "trials (the same command again resumes an interrupted fine-tune)")
    p.add_argument("--classifier", help="a fine-tuned classifier's folder (--out), to predict")
    p.add_argument("--predict", help="a labelled-format file whose texts --classifier predicts")
    p.add_argument("--predictions", help="the JSON-lines file predictions go to (and, for a "
                   "file with labels, its metrics to PREDICTIONS.metrics.json)")
    p.add_argument("--per-class", action="store_true",
                   help="also print precision, recall and F1 of each class")
    return p


def _row(result, name=None) -> str:
    """One table row: task (or `name`), metric, median [min, max] over seeds per split, best
    rate, and how many of its trials diverged."""
    scores = ", ".join(f"{split} {100 * result.median[split]:.1f} "
                       f"[{100 * result.low[split]:.1f}, {100 * result.high[split]:.1f}]"
                       for split in result.median)
    trials = [t for t in result.trials if t.learning_rate == result.best_learning_rate]
    diverged = sum(t.diverged is not None for t in trials)
    note = f", {diverged} of {len(trials)} seeds diverged" if diverged else ""
    return (f"{name or result.task:<12} {result.metric:<9} {scores}  "
            f"(lr {result.best_learning_rate:g}{note})")


def _kept(result, folder) -> str:
    """Which trial the saved classifier is, its own score beside its rate's median."""
    kept = result.kept
    return (f"{'':<12} classifier: lr {kept.learning_rate:g} seed {kept.seed} epoch "
            f"{kept.best_epoch}, {result.split} {result.metric} "
            f"{100 * kept.scores[result.split][result.metric]:.1f} (the best seed; the row's "
            f"median {100 * result.median[result.split]:.1f})" + (f" -> {folder}" if folder else ""))


def _comparison(comparison) -> str:
    return (f"{'':<12} pretrained - random: {100 * comparison['difference']:+.1f} points, "
            f"{100 * comparison['confidence']:.0f}% interval [{100 * comparison['low']:+.1f}, "
            f"{100 * comparison['high']:+.1f}] (bootstrap over the {comparison['examples']} "
            f"validation examples)")


def _per_class_table(per_class: dict) -> str:
    lines = []
    for split, classes in per_class.items():
        width = max(12, *(len(str(name)) for name in classes))
        lines.append(f"{split:<{width}} {'precision':>9} {'recall':>7} {'f1':>7} {'support':>8}")
        lines += [f"{str(name):<{width}} {100 * c['precision']:9.1f} {100 * c['recall']:7.1f} "
                  f"{100 * c['f1']:7.1f} {c['support']:8d}" for name, c in classes.items()]
    return "\n".join(lines)


def _write_json(path: str, value):
    """Strict JSON (no bare NaN, which JSON readers refuse), whole or not at all."""
    storage.write_text(path, json.dumps(value, indent=1, allow_nan=False))


def _save_outputs(result, out: str, random_folder: str):
    """The classifiers, then result.json: a folder with result.json is complete. A full
    disk or a read-only folder is one StorageError; the finished trials stay for a re-run."""
    then = (f"the finished trials are kept in {out}; free some space and run the same command "
            "again to resume from them")
    result_file = os.path.join(out, "result.json")
    # A result.json of an earlier run must not vouch for classifiers half replaced.
    with storage.writing(result_file, "result", then):
        if os.path.isfile(result_file):
            os.remove(result_file)
    with storage.writing(out, "fine-tuned classifier", then):
        kroberta.save(result.classifier, out)  # creates the folder
    if result.baseline:
        with storage.writing(random_folder, "random start's classifier", then):
            kroberta.save(result.baseline.classifier, random_folder)
    with storage.writing(result_file, "result", then):
        _write_json(result_file, result.to_json())


def _run_tasks(args, config: FinetuneConfig) -> int:
    # start-up: `--help` and argument errors answer before JAX and Keras load
    from kroberta.downstream import glue
    from kroberta.downstream.finetuning import finetune
    from kroberta.downstream.loading import load

    tasks = [f"glue/{t}" for t in glue.tasks_present(args.data)] if args.suite else [args.task]
    model = load(args.run)  # once for every task; --run was checked with the arguments
    averages = []
    for task in tasks:
        out = os.path.join(args.out, task.split("/")[-1]) if args.suite and args.out else args.out
        try:
            result = finetune(model, task, args.data, args.validation,
                              text_fields=tuple(args.text_field) if args.text_field else None,
                              label_field=args.label_field, kind=args.kind, out=out,
                              config=config)
        except SettingError as error:  # one the model refuses: named as its flag
            raise InputError(error.flag_message) from None
        averages.append(result.median[result.split])
        random_folder = os.path.join(out, RANDOM_START_DIR) if out else None
        if out:
            _save_outputs(result, out, random_folder)
        rows = [_row(result), _kept(result, out)]
        if result.baseline:
            rows += [_row(result.baseline, "random init"), _kept(result.baseline, random_folder),
                     _comparison(result.comparison)]
        if args.per_class and result.per_class:
            rows.append(_per_class_table(result.per_class))
        print("\n".join(rows), flush=True)
    if args.suite:
        print(f"{'average':<12} {'':<9} {100 * sum(averages) / len(averages):.1f}")
    return 0


def _predict(args) -> int:
    # start-up: as in `_run_tasks`
    import numpy as np

    model_source(args.classifier, "--classifier", head=CLASSIFIER)
    # start-up time: JAX and Keras load only after the checks
    from kroberta.downstream import examples, metrics, prediction
    from kroberta.downstream.loading import load

    classifier = load(args.classifier)
    spec = classifier.task_spec
    if args.text_field:  # the file's own names for the fields the classifier was trained on
        if len(args.text_field) != len(spec.text_fields):
            raise InputError(f"--text-field: the classifier reads {len(spec.text_fields)} "
                             f"text field(s) ({', '.join(spec.text_fields)}), got "
                             f"{len(args.text_field)}")
        spec = dataclasses.replace(spec, text_fields=tuple(args.text_field))
    # A file with labels (its first record has the label field) is scored too.
    labelled = examples.read_labelled(args.predict, spec, classifier.label_names,
                                      require_labels=None)[0]
    predicted = prediction.predict_texts(classifier, labelled.texts)
    outputs = predicted["values"] if "values" in predicted else predicted["probabilities"]
    finite = np.isfinite(outputs)
    broken = int(np.sum(~(finite.all(-1) if finite.ndim > 1 else finite)))
    if broken:  # never a bare NaN in the file: null, and a word why
        print(f"warning: {broken} of {len(labelled)} prediction(s) are not finite numbers (written "
              f"as null): the classifier's weights in {args.classifier} are damaged", file=sys.stderr)
    then = "nothing was written; free some space or choose another --predictions"
    # Under a temporary name until whole: a kill or a full disk leaves no partial file.
    with (storage.writing(args.predictions, "predictions", then),
          storage.staged_file(args.predictions) as local, open(local, "w", encoding="utf-8") as f):
        for i in range(len(labelled)):
            if "values" in predicted:
                value = float(predicted["values"][i])
                record = {"value": value if np.isfinite(value) else None}
            else:
                # Each probability under its class's name: the order needs no explaining.
                row = predicted["probabilities"][i]
                record = {"label": predicted["labels"][i] if np.isfinite(row).all() else None,
                          "probabilities": {str(name): round(float(p), 6) if np.isfinite(p)
                                            else None
                                            for name, p in zip(classifier.label_names, row)}}
            f.write(json.dumps(record, allow_nan=False) + "\n")
    print(f"wrote {args.predictions}: {len(labelled)} prediction(s)")
    if labelled.has_labels:
        if "values" in predicted:
            chosen = predicted["values"]
        else:
            chosen = predicted["probabilities"].argmax(-1)
        names = spec.metrics(len(classifier.label_names or ()))
        scores = metrics.score(names, labelled.labels, chosen)
        result = {"file": args.predict, "examples": len(labelled), "metrics": scores}
        print(f"{args.predict}: " + ", ".join(f"{k} {100 * v:.1f}" for k, v in scores.items()))
        if classifier.label_names:
            per_class = metrics.per_class(labelled.labels, chosen, len(classifier.label_names))
            result["per_class"] = dict(zip(classifier.label_names, per_class))
            if args.per_class:
                print(_per_class_table({os.path.basename(args.predict): result["per_class"]}))
        path = os.path.splitext(args.predictions)[0] + ".metrics.json"
        with storage.writing(path, "metrics", f"the predictions are in {args.predictions}"):
            _write_json(path, result)
        print(f"wrote {path}")
    return 0


def _main(args) -> int:
    # The checks that need no model, before JAX, Keras and TensorFlow are imported.
    config = check_finetune_arguments(args)
    return _predict(args) if args.classifier else _run_tasks(args, config)


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.classifier or args.predict:
        if not (args.classifier and args.predict and args.predictions):
            parser.error("prediction needs --classifier, --predict and --predictions")
    elif not args.run:
        parser.error("--run is required (the pretrained model)")
    elif args.suite and not args.data:
        parser.error("--suite glue needs --data, the GLUE directory")
    interrupted = ("interrupted" if not args.out or args.classifier else
                   f"interrupted; the same command again resumes from the trials that finished "
                   f"(kept in {args.out})")
    return cli.run(lambda: _main(args), also=(FileNotFoundError,), interrupted=interrupted,
                   when_out_of_memory="--batch-size (or --max-length)")

