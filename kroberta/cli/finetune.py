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

from kroberta.errors import InputError
from kroberta import cli
from kroberta.downstream.arguments import check_finetune_arguments

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
                   help="the field of the text; twice for a pair (default: text; with "
                   "--predict: the classifier's)")
    p.add_argument("--label-field", default="label", help="the field of the label")
    p.add_argument("--kind", default="classification", choices=("classification", "regression"))
    p.add_argument("--learning-rates", help="comma-separated grid (default: by model size)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per learning rate")
    p.add_argument("--epochs", type=int, default=3, help="passes over the training data (1-5)")
    p.add_argument("--batch-size", type=int, default=32, help="sequences per step, all devices")
    p.add_argument("--max-length", type=int, default=None, help="tokens per sequence")
    p.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=None,
                   help="also fine-tune a random initialisation (default: on for the "
                   "embedded task)")
    p.add_argument("--out", help="folder for result.json, the best classifier and the finished "
                   "trials (the same command again resumes an interrupted fine-tune)")
    p.add_argument("--classifier", help="a fine-tuned classifier's folder (--out), to predict")
    p.add_argument("--predict", help="a labelled-format file whose texts --classifier predicts")
    p.add_argument("--predictions", help="the JSON-lines file predictions go to")
    return p


def _rates(text):
    try:
        return tuple(float(r) for r in text.split(",")) if text else None
    except ValueError:
        raise InputError(f"--learning-rates {text!r}: expected numbers separated by "
                         "commas, e.g. 1e-5,3e-5") from None


def _row(result, name=None) -> str:
    """One table row: task (or `name`), metric, median [min, max] over seeds per split, best rate."""
    scores = ", ".join(f"{split} {100 * result.median[split]:.1f} "
                       f"[{100 * result.low[split]:.1f}, {100 * result.high[split]:.1f}]"
                       for split in result.median)
    return f"{name or result.task:<12} {result.metric:<9} {scores}  (lr {result.best_learning_rate:g})"


def _run_tasks(args) -> int:
    from kroberta.downstream import glue
    from kroberta.downstream.finetuning import finetune
    from kroberta.downstream.prediction import save_classifier

    tasks = [f"glue/{t}" for t in glue.tasks_present(args.data)] if args.suite else [args.task]
    baseline = args.baseline if args.baseline is not None else (args.task is None and not args.data)
    averages = []
    for task in tasks:
        out = os.path.join(args.out, task.split("/")[-1]) if args.suite and args.out else args.out
        result = finetune(args.run, task, args.data, args.validation,
                          text_fields=tuple(args.text_field or ("text",)),
                          label_field=args.label_field, kind=args.kind,
                          learning_rates=_rates(args.learning_rates), seeds=args.seeds,
                          epochs=args.epochs, batch_size=args.batch_size,
                          max_length=args.max_length, baseline=baseline, out=out)
        averages.append(result.median[result.split])
        if out:
            save_classifier(result.classifier, out)  # creates the folder
            with open(os.path.join(out, "result.json"), "w", encoding="utf-8") as f:
                json.dump(result.to_json(), f, indent=1)
        rows = [_row(result)] + ([_row(result.baseline, "random init")] if result.baseline else [])
        print("\n".join(rows), flush=True)
    if args.suite:
        print(f"{'average':<12} {'':<9} {100 * sum(averages) / len(averages):.1f}")
    return 0


def _predict(args) -> int:
    from kroberta.downstream import examples, prediction

    folder = os.path.dirname(os.path.abspath(args.predictions))
    if not os.path.isdir(folder):  # before the seconds of loading and predicting
        raise InputError(f"--predictions {args.predictions}: no folder {folder}")
    classifier = prediction.load_classifier(args.classifier)
    spec = classifier.task_spec
    if args.text_field:  # the file's own names for the fields the classifier was trained on
        if len(args.text_field) != len(spec.text_fields):
            raise InputError(f"--text-field: the classifier reads {len(spec.text_fields)} "
                             f"text field(s) ({', '.join(spec.text_fields)}), got "
                             f"{len(args.text_field)}")
        spec = dataclasses.replace(spec, text_fields=tuple(args.text_field))
    labelled = examples.read_labelled(args.predict, spec, classifier.label_names,
                                      require_labels=False)[0]
    predicted = prediction.predict_texts(classifier, labelled.texts)
    with open(args.predictions, "w", encoding="utf-8") as f:
        for i in range(len(labelled)):
            if "values" in predicted:
                record = {"value": float(predicted["values"][i])}
            else:
                # Each probability under its class's name: the order needs no explaining.
                record = {"label": predicted["labels"][i],
                          "probabilities": {str(name): round(float(p), 6) for name, p in zip(
                              classifier.label_names, predicted["probabilities"][i])}}
            f.write(json.dumps(record) + "\n")
    print(f"wrote {args.predictions}: {len(labelled)} prediction(s)")
    return 0


def _main(args) -> int:
    # The checks that need no model, before JAX, Keras and TensorFlow are imported.
    check_finetune_arguments(args)
    _rates(args.learning_rates)
    return _predict(args) if args.classifier else _run_tasks(args)


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

