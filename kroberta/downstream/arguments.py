"""The checks of `python -m kroberta.finetune`'s arguments that need no model: the
settings (`FinetuneConfig`, built from the flags), the paths, the files and their header,
the output folder. They run before JAX, Keras and TensorFlow
are imported (this module imports none of them), so a mistake is named at once instead
of after the seconds those take to start.
"""

import dataclasses
import os

from kroberta import storage
from kroberta.downstream import glue, rate_grid
from kroberta.downstream.examples import check_labelled_file
from kroberta.downstream.settings import FinetuneConfig, SettingError
from kroberta.downstream.trials import TRIALS_FILE
from kroberta.errors import InputError, NotFoundError
from kroberta.run_layout import CLASSIFIER_FILE, CONFIG_FILE, MASKED_LM, model_source
from kroberta.text.columns import TEXT_FIELD_OPTION

STDLIB = "stdlib"  # the embedded task's name (`kroberta.downstream.stdlib_task`)


def check_finetune_arguments(args) -> FinetuneConfig | None:
    """Raises the error a fine-tune (or a prediction with --classifier) would stop with
    on a setting, a path, a file, a field of a CSV/TSV header or an output folder.

    Args:
        args: the command's parsed arguments (`kroberta.cli.finetune`).

    Returns:
        The fine-tune's settings (None for a prediction).
    """
    if args.classifier:
        _check_prediction(args)
        return None
    config = finetune_config(args)
    model_source(args.run, "--run", head=MASKED_LM)
    if args.suite:
        glue.tasks_present(args.data)
    else:
        check_task(args.task, args.data, args.validation)
        if args.task is not None and args.task.lower().startswith("glue/"):
            if args.data is not None:
                glue.task_files(args.task, args.data)
        elif args.data is not None:
            # The header's fields where a CSV/TSV names them: the label, and the text fields
            # given (without --text-field the fields are chosen from the training file).
            fields = dict.fromkeys(args.text_field or (), TEXT_FIELD_OPTION)
            fields[args.label_field] = "--label-field"
            for option, path in (("--data", args.data), ("--validation", args.validation)):
                check_labelled_file(path, option, fields)
    if args.out is not None and not args.suite:
        check_out(args.out)
    if args.out is not None:
        storage.check_writable(args.out, "--out")
    return config


def finetune_config(args) -> FinetuneConfig:
    """The command's settings: each of `FinetuneConfig`'s fields from the flag of its name
    (a refused one named as the flag)."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(FinetuneConfig)}
    values.update(learning_rates=rate_grid.parse(args.learning_rates),
                  baseline_learning_rates=rate_grid.parse(args.baseline_learning_rates,
                                                          "--baseline-learning-rates"))
    if args.baseline is None:  # on for the embedded task, where it says what pretraining is worth
        values["baseline"] = args.task is None and not args.data
    try:
        return FinetuneConfig(**values)
    except SettingError as error:
        raise InputError(error.flag_message) from None


def check_task(task: str | None, data, validation):
    """Refuses a task without the files it needs (`kroberta.finetune`'s `task`, `data`
    and `validation`; the command's --task, --data and --validation)."""
    if validation is not None and data is None:
        raise InputError("validation (--validation) without data (--data, the training "
                         "file): a labelled task needs both")
    if task is not None and task.lower().startswith("glue/"):
        glue.task_name(task)
        if data is None:
            raise InputError(f"--task {task}: needs --data, the GLUE directory (or the "
                             "task's folder) holding train.tsv and dev.tsv")
    elif (task not in (None, STDLIB) or data is not None) and validation is None:
        raise InputError("a labelled task needs both data (the training file, "
                         "--data) and validation (--validation)")


def _check_prediction(args):
    if not os.path.isdir(args.classifier):
        raise NotFoundError(f"--classifier {args.classifier}: no such directory")
    check_labelled_file(args.predict, "--predict")
    folder = os.path.dirname(os.path.abspath(args.predictions))
    if not os.path.isdir(folder):
        raise InputError(f"--predictions {args.predictions}: no folder {folder}")
    storage.check_writable(args.predictions, "--predictions")


def check_out(out: str):
    """Refuses an --out that is a file, or a folder holding other files than a fine-tune's
    (a pretraining run's: its config.toml and tokenizer.json would be overwritten)."""
    out = os.fspath(out)
    if os.path.exists(out) and not os.path.isdir(out):
        raise InputError(f"--out {out}: a file, not a folder; name a folder (it is created)")
    names = set(os.listdir(out)) if os.path.isdir(out) else set()
    if names and not names & {TRIALS_FILE, CLASSIFIER_FILE}:
        kind = "a pretraining run" if CONFIG_FILE in names else "other files"
        raise InputError(f"--out {out}: holds {kind}, not a fine-tune's trials; give a new or "
                         "empty folder (or one an earlier fine-tune wrote, to resume it)")
