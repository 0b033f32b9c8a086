"""A model's folder: a run's final masked LM saved into the run directory, or a
fine-tuned classifier into a folder of its own (`kroberta.save`); a run's read back
(`load_run`, what `kroberta.load` calls for a run).

A run directory holds `config.toml` (the resolved config), `model.weights.h5`
(Keras weights of the final model) and, when the data came with one,
`tokenizer.json` (`kroberta.run_layout`). `load_run` rebuilds the model from the config
and loads the weights. A classifier's folder holds the pretrained model's config.toml
and tokenizer.json, the classifier's weights and classifier.json (the task, its label
names, the sequence length), which `kroberta.load` reads back.
"""

import dataclasses
import json
import logging
import os

from kroberta import storage
from kroberta.config import to_toml
from kroberta.errors import ArgumentKindError, InputError, NotFoundError
from kroberta.run_layout import (
    CLASSIFIER_FILE,
    CLASSIFIER_WEIGHTS_FILE,
    CONFIG_FILE,
    TOKENIZER_FILE,
    TRIALS_FILE,
    WEIGHTS_FILE,
    load_run_config,
    load_tokenizer,
)
from kroberta.training import checkpoint, signals

# `load_run`'s argument is named checkpoint: the module's names it uses, by name.
from kroberta.training.checkpoint import list_checkpoints

logger = logging.getLogger(__name__)


def save(model, run_dir: str):
    """Writes a masked LM or a fine-tuned classifier into directory `run_dir` (local or a
    URL), which `kroberta.load(run_dir)` reads back; weights only, not the optimizer's.

    A masked LM: its weights atomically, and where `run_dir` holds no run yet its config
    and tokenizer too (a fine-tuned or imported model). In a multi-process run every
    process must call this (weights split across processes are gathered, a collective);
    only process 0 writes.

    A fine-tuned classifier (`kroberta.finetune`'s or `kroberta.load`'s): the pretrained
    model's config and tokenizer, the classifier's description (classifier.json) and
    its weights, each written as given (what `run_dir` held of a classifier is replaced;
    a folder holding a pretraining run or other files is refused).

    Args:
        model: a `kroberta.MaskedLM` or a fine-tuned classifier.
        run_dir: the directory (created).

    Returns:
        A masked LM's weights file (None in the processes that do not write), or the
        classifier's directory.

    Raises:
        ArgumentKindError: `model` is no kroberta model, or `run_dir` no path.
        InputError: `run_dir` holds a run of another shape (its config.toml would no
            longer describe the weights, and it would not load); for a classifier, a run
            or other files.
    """
    # Start-up time: `python -m kroberta.train --help` imports this module, and answers
    # before JAX, Keras and TensorFlow load.
    from kroberta.interop.hf_weights import SHAPE_KEYS  # start-up time (above)
    from kroberta.model.masked_lm import check_model  # start-up time (above)

    # A classifier kroberta fine-tuned or loaded: it carries the task its folder records.
    classifier = getattr(model, "task_spec", None) is not None
    if not classifier:
        check_model(model, "kroberta.save", run_dir, "kroberta.save(model, run_dir)")
    if not isinstance(run_dir, (str, os.PathLike)):
        raise ArgumentKindError(
            f"kroberta.save: run_dir: expected a directory's path, got "
            f"{type(run_dir).__name__} (kroberta.save(model, run_dir))"
        )
    run_dir = os.fspath(run_dir)
    if classifier:
        return _save_classifier(model, run_dir)
    if storage.isfile(storage.join(run_dir, CONFIG_FILE)):
        theirs = load_run_config(run_dir).model
        differ = [
            f"{key} {getattr(theirs, key)} there, {getattr(model.backbone, key)} here"
            for key in SHAPE_KEYS
            if getattr(theirs, key) != getattr(model.backbone, key)
        ]
        if differ:
            raise InputError(
                f"kroberta.save: {run_dir} holds a run of another model "
                f"({'; '.join(differ)}); save into a new directory"
            )

    final = save_run_weights(model, run_dir)
    if final is None:
        return None
    config, tokenizer = model.kroberta_config, model.tokenizer
    if config is not None and not storage.isfile(storage.join(run_dir, CONFIG_FILE)):
        storage.write_text(
            storage.join(run_dir, CONFIG_FILE),
            to_toml(dataclasses.replace(config, run_dir=str(run_dir))),
        )
    if tokenizer is not None and not storage.isfile(storage.join(run_dir, TOKENIZER_FILE)):
        storage.write_text(storage.join(run_dir, TOKENIZER_FILE), tokenizer.to_str())
    return final


def save_run_weights(model, run_dir: str) -> str | None:
    """Writes the weights of masked LM `model` into `run_dir` (created), what `save`
    writes for a run that holds its config already (as `kroberta.train`'s does): nothing
    is checked or read back. Every process must call it (a collective); only process 0
    writes. Returns the weights file (None in the other processes)."""
    import jax  # start-up time: see `save`

    from kroberta.model.mlm import stock_copy  # start-up time: see `save`

    # Keras would store the optimizer's state too (3x the size); the final model is for
    # inference and export, so a stock copy with the same weights is saved, made outside
    # any distribution: nothing in `save_weights` becomes a collective that the other
    # processes would never join.
    stock = stock_copy(model)
    if jax.process_index() != 0:
        return None
    storage.makedirs(run_dir)
    final = storage.join(run_dir, WEIGHTS_FILE)
    _save_weights(stock, final)
    return final


def _save_classifier(classifier, directory: str) -> str:
    """`save` of a fine-tuned classifier; every process that calls it writes (the same
    files)."""
    from kroberta.model.mlm import stock_copy  # start-up time: see `save`

    # Only a new or empty folder, or a classifier's (a saved one, a fine-tune's --out): its
    # config.toml and tokenizer.json would replace a pretraining run's, or mix with others.
    names = storage.listdir(directory)
    if names and not {CLASSIFIER_FILE, TRIALS_FILE} & set(names):
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        held = "a pretraining run" if CONFIG_FILE in names else f"other files ({shown})"
        raise InputError(
            f"kroberta.save: {directory} holds {held}, not a classifier; give a new or empty "
            "directory, or one a classifier was saved to"
        )
    storage.makedirs(directory)
    config = dataclasses.replace(classifier.kroberta_config, run_dir=str(directory))
    storage.write_text(storage.join(directory, CONFIG_FILE), to_toml(config))
    storage.write_text(storage.join(directory, TOKENIZER_FILE), classifier.tokenizer.to_str())
    description = {
        "task": dataclasses.asdict(classifier.task_spec),
        "label_names": list(classifier.label_names or []) or None,
        "max_length": classifier.max_length,
        "pooling": classifier.pooling,
    }
    storage.write_text(storage.join(directory, CLASSIFIER_FILE), json.dumps(description, indent=1))
    # Weights only, as a masked LM's: a stock copy on this host (no optimizer state).
    _save_weights(stock_copy(classifier), storage.join(directory, CLASSIFIER_WEIGHTS_FILE))
    return directory


def _save_weights(stock, path: str):
    """`stock.save_weights` into `path` (local or a URL), staged once the disk has room."""
    from kroberta.parallel.distribute import global_distribution  # start-up time: see `save`

    # `save_weights` builds a throwaway optimizer variable: under the run's distribution
    # that is a cross-process check which only the writing process would enter.
    with global_distribution(None), storage.staged_file(path) as local:  # h5: a local file
        storage.check_room_for_hdf5(local, stock.weights)
        stock.save_weights(local)


def load_run(path: str, mixed_precision: bool | None = None, checkpoint: str | int | None = None):
    """The masked LM of the run directory `path` (`kroberta.load`'s for a run): its final
    model, else (an unfinished run: interrupted, preempted) its latest checkpoint's, said
    in a warning; `mixed_precision` None keeps the run's setting; `checkpoint` as for
    `kroberta.load`."""
    if checkpoint is not None:
        return _model(path, mixed_precision, *_chosen_checkpoint(path, checkpoint))
    if storage.isfile(storage.join(path, WEIGHTS_FILE)):
        return _model(path, mixed_precision)
    saved = list_checkpoints(path)
    if not saved:
        raise NotFoundError(f"{path}: not a finished kroberta run ({WEIGHTS_FILE} is missing)")
    step, checkpoint_path = saved[-1]
    logger.warning(f"{path}: no final model yet; loading the checkpoint at step {step}")
    return _model(path, mixed_precision, checkpoint_path, step)


def _model(
    path: str,
    mixed_precision: bool | None,
    checkpoint_path: str | None = None,
    step: int | None = None,
):
    """The run's model (`load`'s return value) with the final weights, or a checkpoint's."""
    from kroberta.model.mlm import build_model  # start-up time: see `save`

    config = load_run_config(path)
    if mixed_precision is None:
        mixed_precision = config.train.mixed_precision
    model = build_model(
        config.model, mixed_precision, config=config, tokenizer=load_tokenizer(path), step=step
    )
    if checkpoint_path:
        checkpoint.restore(model, checkpoint_path, optimizer=False)
    else:
        weights = storage.join(path, WEIGHTS_FILE)
        with storage.local_copy(weights) as local, storage.reading(weights, "weights file"):
            model.load_weights(local)  # h5: a local file
    return model


def _chosen_checkpoint(path: str, which: str | int) -> tuple[str, int]:
    """`load(path, checkpoint=which)`'s checkpoint: (its path, its step)."""
    saved = list_checkpoints(path)
    if which == "best":
        best = signals.best_checkpoint(path)
        if best is None:
            raise NotFoundError(
                f"{path}: no kept checkpoint was evaluated; train with "
                "validation data and train.keep_best = true"
            )
        return best[1], best[0]
    if which == "last":
        if not saved:
            raise NotFoundError(f"{path}: holds no checkpoint")
        return saved[-1][1], saved[-1][0]
    if isinstance(which, int) and not isinstance(which, bool):
        found = dict(saved)
        if which not in found:
            raise NotFoundError(
                f"{path}: no checkpoint at step {which} (kept: "
                f"{', '.join(str(s) for s, _ in saved) or 'none'})"
            )
        return found[which], which
    raise InputError(f'checkpoint: expected None, "best", "last" or a step number, got {which!r}')
