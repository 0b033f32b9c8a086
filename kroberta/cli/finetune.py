"""Fine-tune a pretrained model on a labelled task and print its score.

    python -m kroberta.finetune --run runs/default            # the embedded stdlib task
    python -m kroberta.finetune --run runs/x --task glue/rte --data glue_data
    python -m kroberta.finetune --run runs/x --suite glue --data glue_data
    python -m kroberta.finetune --run runs/x --data train.jsonl --validation dev.jsonl
    python -m kroberta.finetune --classifier out/ --predict test.jsonl --predictions p.jsonl

With no data, the embedded task (which package of the standard library a docstring
is from) runs, beside the same recipe from a random initialisation. The Python API
is `kroberta.finetune(...)` (kroberta/downstream/finetuning.py); the prediction mode
(--classifier) is kroberta/cli/finetune_predict.py.
"""

import argparse
import dataclasses
import os

import kroberta
from kroberta import cli, storage
from kroberta.cli import finetune_predict
from kroberta.cli.finetune_predict import per_class_table, write_json
from kroberta.downstream.settings import POOLINGS, FinetuneConfig, SettingError, parse_rates
from kroberta.downstream.tasks import glue_tasks_present, read_task
from kroberta.errors import InputError
from kroberta.run_layout import MASKED_LM, check_finetune_out, model_source

RANDOM_START_DIR = "random-start"  # --out's folder for the random start's classifier

# JAX, Keras and TensorFlow load in the functions that use them: --help answers at once.


def _parser():
    p = cli.ArgumentParser(
        prog="python -m kroberta.finetune", inputs="--data", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--run",
        help="the pretrained model: a run directory, a Hugging Face export or a keras-hub preset",
    )
    p.add_argument(
        "--task",
        help="glue/<task> (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, "
        "wnli), or a name for --data/--validation files (default: the embedded task)",
    )
    p.add_argument("--suite", choices=("glue",), help="every GLUE task found under --data")
    p.add_argument("--data", help="the GLUE directory, or the labelled training file")
    p.add_argument("--validation", help="the labelled validation file")
    p.add_argument(
        "--text-field",
        action="append",
        help="the field of the text; twice for a pair (default: text, else the "
        "fields besides the label, as run_glue; with --predict: the classifier's)",
    )
    p.add_argument("--label-field", default="label", help="the field of the label")
    p.add_argument(
        "--kind",
        default="classification",
        choices=("classification", "regression"),
        help="classes, or one number per text under a mean-squared error",
    )
    _grid_arguments(p)
    _recipe_arguments(p)
    # The settings' flags take `FinetuneConfig`'s defaults; --baseline's None: by the task.
    defaults = {f.name: f.default for f in dataclasses.fields(FinetuneConfig)}
    p.set_defaults(**(defaults | {"baseline": None}))
    p.add_argument(
        "--out",
        help="folder for result.json, the best classifier and the finished "
        "trials (the same command again resumes an interrupted fine-tune)",
    )
    p.add_argument("--classifier", help="a fine-tuned classifier's folder (--out), to predict")
    p.add_argument("--predict", help="a labelled-format file whose texts --classifier predicts")
    p.add_argument(
        "--predictions",
        help="the JSON-lines file predictions go to (and, for a "
        "file with labels, its metrics beside it: p.jsonl -> p.metrics.json)",
    )
    p.add_argument(
        "--per-class", action="store_true", help="also print precision, recall and F1 of each class"
    )
    return p


def _grid_arguments(p):
    """The flags of the learning-rate grid and its trials (`FinetuneConfig`'s fields)."""
    p.add_argument("--learning-rates", help="comma-separated grid (default: by model size)")
    p.add_argument(
        "--baseline-learning-rates",
        help="the random start's own grid (default: as --learning-rates)",
    )
    p.add_argument(
        "--widen",
        action=argparse.BooleanOptionalAction,
        help="while the best rate is at an edge of its grid, add the rate 3x beyond "
        "it (default: on)",
    )
    p.add_argument("--seeds", type=int, help="seeds per learning rate")
    p.add_argument(
        "--epochs",
        type=int,
        help="the most passes over the training data; each trial keeps its best epoch",
    )
    p.add_argument(
        "--early-stopping",
        type=int,
        metavar="PATIENCE",
        help="stop a trial after PATIENCE epochs without a better validation score (default: off)",
    )


def _recipe_arguments(p):
    """The flags of the recipe's head, optional steps, batch and baseline (`FinetuneConfig`'s
    fields)."""
    p.add_argument(
        "--pooling",
        choices=POOLINGS,
        help="what the classifier's head reads: the first token <s> (as Hugging "
        "Face's and keras-hub's heads; exportable) or the mean over the tokens "
        "that are not padding (not exportable); the random start's too",
    )
    p.add_argument(
        "--probe-epochs",
        type=int,
        metavar="N",
        help="LP-FT: first N epochs train the head alone, the body frozen, at the "
        "trial's learning rate (default 0: off)",
    )
    p.add_argument(
        "--layer-decay",
        type=float,
        metavar="D",
        help="layer-wise learning-rate decay in (0, 1]: each encoder layer below "
        "the top learns at D times the rate of the one above (default 1: off)",
    )
    p.add_argument(
        "--adapt-steps",
        type=int,
        metavar="N",
        help="task-adaptive pretraining: N masked-LM steps on the training texts "
        "before fine-tuning, the random start's too (default 0: off)",
    )
    p.add_argument(
        "--reinit-layers",
        type=int,
        metavar="K",
        help="draw the pretrained start's top K encoder layers afresh (default 0: off)",
    )
    p.add_argument("--batch-size", type=int, help="sequences per step, all devices")
    p.add_argument(
        "--max-length",
        type=int,
        help="tokens per sequence (default: the model's max_sequence_length)",
    )
    p.add_argument(
        "--baseline",
        action=argparse.BooleanOptionalAction,
        help="also fine-tune a random initialisation (default: on for the embedded task)",
    )


def _row(result, name=None) -> str:
    """One table row: task (or `name`), metric, median [min, max] over seeds per split, best
    rate, and how many of its trials diverged."""
    scores = ", ".join(
        f"{split} {100 * result.median[split]:.1f} "
        f"[{100 * result.low[split]:.1f}, {100 * result.high[split]:.1f}]"
        for split in result.median
    )
    trials = [t for t in result.trials if t.learning_rate == result.best_learning_rate]
    diverged = sum(t.diverged is not None for t in trials)
    note = f", {diverged} of {len(trials)} seeds diverged" if diverged else ""
    return (
        f"{name or result.task:<12} {result.metric:<9} {scores}  "
        f"(lr {result.best_learning_rate:g}{note})"
    )


def _kept(result, folder) -> str:
    """Which trial the saved classifier is, its own score beside its rate's median."""
    kept = result.kept
    return (
        f"{'':<12} classifier: lr {kept.learning_rate:g} seed {kept.seed} epoch "
        f"{kept.best_epoch}, {result.split} {result.metric} "
        f"{100 * kept.scores[result.split][result.metric]:.1f} (the best seed; the row's "
        f"median {100 * result.median[result.split]:.1f})" + (f" -> {folder}" if folder else "")
    )


def _comparison(comparison) -> str:
    return (
        f"{'':<12} pretrained - random: {100 * comparison['difference']:+.1f} points, "
        f"{100 * comparison['confidence']:.0f}% interval [{100 * comparison['low']:+.1f}, "
        f"{100 * comparison['high']:+.1f}] (bootstrap over the {comparison['examples']} "
        f"validation examples)"
    )


def _save_outputs(result, out: str, random_folder: str):
    """The classifiers, then result.json: a folder with result.json is complete. A full
    disk or a read-only folder is one StorageError; the finished trials stay for a re-run."""
    then = (
        f"the finished trials are kept in {out}; free some space and run the same command "
        "again to resume from them"
    )
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
        write_json(result_file, result.to_json())


def _checked(args) -> tuple[FinetuneConfig, list]:
    """(the fine-tune's settings, [its task read] or a suite's GLUE task names), or the
    error a fine-tune would stop with on a setting, a path, a file, a field of a labelled
    file or an output folder: the checks that need no model, before JAX, Keras and
    TensorFlow are imported, so a mistake is named at once."""
    config = finetune_config(args)
    model_source(args.run, "--run", head=MASKED_LM)
    names = glue_tasks_present(args.data) if args.suite else None
    if not args.suite:
        check_finetune_out(args.out)
    if args.out is not None:
        storage.check_writable(args.out, "--out")
    if args.suite:
        return config, names
    text_fields = tuple(args.text_field) if args.text_field else None
    return config, [
        read_task(
            args.task,
            args.data,
            args.validation,
            text_fields,
            args.label_field,
            args.kind,
            flags=True,
        )
    ]


def finetune_config(args) -> FinetuneConfig:
    """The command's settings: each of `FinetuneConfig`'s fields from the flag of its name
    (a refused one named as the flag)."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(FinetuneConfig)}
    values.update(
        learning_rates=parse_rates(args.learning_rates),
        baseline_learning_rates=parse_rates(
            args.baseline_learning_rates, "--baseline-learning-rates"
        ),
    )
    if args.baseline is None:  # on for the embedded task, where it says what pretraining is worth
        values["baseline"] = args.task is None and not args.data
    try:
        return FinetuneConfig(**values)
    except SettingError as error:
        raise InputError(error.flag_message) from None


def _run_tasks(args, config: FinetuneConfig, tasks: list) -> int:
    """Fine-tunes on each of `tasks` (`_checked`'s), printing its rows."""
    # start-up: `--help` and argument errors answer before JAX and Keras load
    from kroberta.downstream.finetuning import finetune
    from kroberta.downstream.model_files import load

    model = load(args.run)  # once for every task; --run was checked with the arguments
    averages = []
    for task in tasks:
        out = args.out
        if args.suite:  # a name: each of a suite's tasks is read when its turn comes
            out = os.path.join(args.out, task) if args.out else None
            task = read_task(f"glue/{task}", args.data)
        try:
            result = finetune(model, task, out=out, config=config)
        except SettingError as error:  # one the model refuses: named as its flag
            raise InputError(error.flag_message) from None
        averages.append(result.median[result.split])
        random_folder = os.path.join(out, RANDOM_START_DIR) if out else None
        if out:
            _save_outputs(result, out, random_folder)
        rows = [_row(result), _kept(result, out)]
        if result.baseline:
            rows += [
                _row(result.baseline, "random init"),
                _kept(result.baseline, random_folder),
                _comparison(result.comparison),
            ]
        if args.per_class and result.per_class:
            rows.append(per_class_table(result.per_class))
        print("\n".join(rows), flush=True)
    if args.suite:
        print(f"{'average':<12} {'':<9} {100 * sum(averages) / len(averages):.1f}")
    return 0


def _main(args) -> int:
    if args.classifier:
        finetune_predict.check(args)
        return finetune_predict.predict(args)
    return _run_tasks(args, *_checked(args))


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
    interrupted = (
        "interrupted"
        if not args.out or args.classifier
        # True also when no trial had finished yet (then --out may not exist).
        else f"interrupted; the same command again resumes, running only the trials not yet "
        f"finished in {args.out}"
    )
    return cli.run(
        lambda: _main(args),
        also=(FileNotFoundError,),
        interrupted=interrupted,
        when_out_of_memory="--batch-size (or --max-length)",
    )
