"""The final model of a run: saved into the run directory, loaded by `kroberta.load`,
exported by `export` (`python -m kroberta.export`).

A run directory holds `config.toml` (the resolved config), `model.weights.h5`
(Keras weights of the final model) and, when the data came with one,
`tokenizer.json`. `load` rebuilds the model from the config and loads the weights.
"""

import dataclasses
import logging
import os
import re

from kroberta.training import checkpoint
# `load`'s argument is named checkpoint: the module's names it uses, by name.
from kroberta.training.checkpoint import CHECKPOINT_DIR, list_checkpoints
from kroberta.config import to_toml
from kroberta import storage
from kroberta.errors import ArgumentKindError, InputError, NotFoundError
from kroberta.run_layout import (CLASSIFIER_FILE, CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE,
                                 load_run_config, load_tokenizer)

logger = logging.getLogger(__name__)


def save(model, run_dir: str):
    """Writes the model's weights (not the optimizer's) into `run_dir` atomically, and
    where `run_dir` holds no run yet, the model's config and tokenizer too, so that
    `kroberta.load(run_dir)` reads it back (a fine-tuned or imported model).

    In a multi-process run every process must call this (weights split across
    processes are gathered, a collective); only process 0 writes.

    Raises:
        ArgumentKindError: `model` is no kroberta model, or `run_dir` no path.
        InputError: `run_dir` holds a run of another shape (its config.toml would no
            longer describe the weights, and it would not load).
    """
    import jax

    from kroberta.interop.hf_weights import SHAPE_KEYS
    from kroberta.model.masked_lm import check_model
    from kroberta.model.mlm import stock_copy
    from kroberta.parallel.distribute import global_distribution

    check_model(model, "kroberta.save", run_dir, "kroberta.save(model, run_dir)")
    if not isinstance(run_dir, (str, os.PathLike)):
        raise ArgumentKindError(f"kroberta.save: run_dir: expected a directory's path, got "
                                f"{type(run_dir).__name__} (kroberta.save(model, run_dir))")
    run_dir = os.fspath(run_dir)
    if storage.isfile(storage.join(run_dir, CONFIG_FILE)):
        theirs = load_run_config(run_dir).model
        differ = [f"{key} {getattr(theirs, key)} there, {getattr(model.backbone, key)} here"
                  for key in SHAPE_KEYS if getattr(theirs, key) != getattr(model.backbone, key)]
        if differ:
            raise InputError(f"kroberta.save: {run_dir} holds a run of another model "
                             f"({'; '.join(differ)}); save into a new directory")

    # Keras would store the optimizer's state too (3x the size); the final model is for
    # inference and export, so a stock copy with the same weights is saved, made outside
    # any distribution: nothing in `save_weights` becomes a collective that the other
    # processes would never join.
    stock = stock_copy(model)
    if jax.process_index() != 0:
        return None
    storage.makedirs(run_dir)
    final = storage.join(run_dir, WEIGHTS_FILE)
    # `save_weights` builds a throwaway optimizer variable: under the run's distribution
    # that is a cross-process check which only this process would enter.
    with global_distribution(None), storage.staged_file(final) as tmp:  # a rename, or one upload
        stock.save_weights(tmp)
    config, tokenizer = model.kroberta_config, model.tokenizer
    if config is not None and not storage.isfile(storage.join(run_dir, CONFIG_FILE)):
        storage.write_text(storage.join(run_dir, CONFIG_FILE),
                           to_toml(dataclasses.replace(config, run_dir=str(run_dir))))
    if tokenizer is not None and not storage.isfile(storage.join(run_dir, TOKENIZER_FILE)):
        storage.write_text(storage.join(run_dir, TOKENIZER_FILE), tokenizer.to_str())
    return final


def load(path: str, mixed_precision: bool | None = None, checkpoint: str | int | None = None):
    """Loads the model a training run saved.

    Args:
        path: a run directory (with `config.toml` and `model.weights.h5`); a run
            that has not finished yet (interrupted, preempted) loads the model of its
            latest checkpoint instead, and says so (a warning).
        mixed_precision: override the run's setting (e.g. False for float32
            inference of a model trained in bf16); None keeps the run's.
        checkpoint: None for the final model; "best" for the kept checkpoint with the
            lowest validation loss (`train.keep_best` keeps it); "last" for the newest
            checkpoint; a step number for the checkpoint of that step.

    Returns:
        A `kroberta.MaskedLM` (keras-hub's `RobertaMaskedLM` whose Keras `fit` /
        `evaluate` / `predict` also take Hugging Face's input names), with
        `kroberta_config` (the run's `Config`), `tokenizer` (a `tokenizers.Tokenizer`,
        or None when the run had none) and `kroberta_step` (a checkpoint's step).
    """
    path = check_run_dir(path, finished=checkpoint is None)
    if checkpoint is not None:
        return _model(path, mixed_precision, *_chosen_checkpoint(path, checkpoint))
    if storage.isfile(storage.join(path, WEIGHTS_FILE)):
        return _model(path, mixed_precision)
    # An unfinished run (interrupted, preempted, --until-step) loads its last checkpoint.
    saved = list_checkpoints(path)
    if not saved:
        raise NotFoundError(f"{path}: not a finished kroberta run ({WEIGHTS_FILE} is missing)")
    step, checkpoint_path = saved[-1]
    logger.warning(f"{path}: no final model yet; loading the checkpoint at step {step}")
    return _model(path, mixed_precision, checkpoint_path, step)


def check_run_dir(path, finished: bool = True) -> str:
    """`path` as a str when it is a kroberta run directory (config.toml), else the error
    `load` raises, naming what `path` is instead; imports nothing heavy, so a command
    names the mistake before JAX, Keras and TensorFlow start.

    Args:
        path: the directory given.
        finished: a final model is asked for (not a checkpoint), for the message.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentKindError(f"kroberta.load: expected a run directory's path, got "
                                f"{type(path).__name__}" + (" (a model already: use it as it is)"
                                                            if hasattr(path, "predict") else ""))
    path = os.fspath(path)
    if storage.isfile(path):
        raise NotFoundError(f"{path}: a file, not a kroberta run directory; give the directory "
                            f"that holds it ({os.path.dirname(path) or '.'})")
    if not storage.isdir(path):
        raise NotFoundError(f"{path}: not a kroberta run directory (no such directory)")
    if storage.isfile(storage.join(path, CLASSIFIER_FILE)):
        raise InputError(f"{path}: a fine-tuned classifier, not a masked LM; load it with "
                         f"kroberta.load_classifier({path!r})")
    if not storage.isfile(storage.join(path, CONFIG_FILE)):
        finished = "finished " if finished else ""
        parent, name = os.path.split(os.path.normpath(path))
        if storage.isfile(storage.join(path, "config.json")):
            other = ("; it holds a config.json: read a Hugging Face directory with "
                     "kroberta.from_hf, a keras-hub preset with kroberta.from_keras_hub")
        elif storage.isfile(storage.join(path, "manifest.json")):
            other = "; it is prepared data (manifest.json), not a model"
        elif os.path.basename(parent) == CHECKPOINT_DIR and re.fullmatch(r"step_\d+", name):
            run = os.path.dirname(parent)
            other = (f"; it is a checkpoint of the run {run}: give the run (kroberta.load("
                     f"{run!r}, checkpoint={int(name[5:])}); the commands take its latest)")
        else:
            other = ""
        raise NotFoundError(f"{path}: not a {finished}kroberta run ({CONFIG_FILE} is missing)"
                            + other)
    return path


MODEL_KINDS = "a training run, a Hugging Face RoBERTa directory or a keras-hub preset directory"


def load_model_at(path, key: str = "model"):
    """The masked LM in directory `path`, whichever of the three kinds it is.

    Args:
        path: a training run (config.toml: `load`), a keras-hub preset (metadata.json, or a
            config.json naming its class: `from_keras_hub`) or a Hugging Face RoBERTa
            directory (a config.json with a model_type: `from_hf`).
        key: what named `path` (`--model`), to start an error message.

    Returns:
        A `kroberta.MaskedLM`, as `load` returns it.

    Raises:
        NotFoundError: no such directory, or it holds none of the three.
    """
    path = os.fspath(path)
    kind = model_kind_at(path, key)
    if kind == "run":
        return load(path)
    if kind == "keras-hub":
        from kroberta.interop.keras_hub_presets import from_keras_hub

        return from_keras_hub(path)
    from kroberta.interop.hf import from_hf

    return from_hf(path)


def model_kind_at(path, key: str = "model") -> str:
    """Which of `load_model_at`'s three kinds directory `path` holds: "run", "keras-hub" or
    "hf"; from its files alone (nothing heavy is imported), so a command names a wrong
    path at once.

    Raises:
        NotFoundError: no such directory, or it holds none of the three.
    """
    import json

    path = os.fspath(path)
    if not storage.isdir(path):
        what = "a file, not a directory" if storage.isfile(path) else "no such directory"
        raise NotFoundError(f"{key}: {path!r}: {what}; give {MODEL_KINDS}")
    if storage.isfile(storage.join(path, CONFIG_FILE)):
        return "run"
    if storage.isfile(storage.join(path, "manifest.json")):
        raise NotFoundError(f"{key}: {path} is prepared data (python -m kroberta.prepare's "
                            f"output), not a model; give {MODEL_KINDS}")
    try:
        described = json.loads(storage.read_text(storage.join(path, "config.json")))
    except (OSError, ValueError):
        described = None
    described = described if isinstance(described, dict) else {}
    if storage.isfile(storage.join(path, "metadata.json")) or "registered_name" in described:
        return "keras-hub"
    if "model_type" in described:
        return "hf"
    raise NotFoundError(f"{key}: {path} holds neither config.toml (a training run) nor a "
                        "config.json of a Hugging Face model or keras-hub preset (config.toml "
                        f"is missing, config.json names no model); give {MODEL_KINDS}")


def _model(path: str, mixed_precision: bool | None, checkpoint_path: str | None = None,
           step: int | None = None):
    """The run's model (`load`'s return value) with the final weights, or a checkpoint's."""
    from kroberta.model.mlm import build_model

    config = load_run_config(path)
    if mixed_precision is None:
        mixed_precision = config.train.mixed_precision
    model = build_model(config.model, mixed_precision, config=config,
                        tokenizer=load_tokenizer(path), step=step)
    if checkpoint_path:
        checkpoint.restore(model, checkpoint_path, optimizer=False)
    else:
        weights = storage.join(path, WEIGHTS_FILE)
        with storage.local_copy(weights) as local, storage.reading(weights, "weights file"):
            model.load_weights(local)  # h5: a local file
    return model


def _chosen_checkpoint(path: str, which: str | int) -> tuple[str, int]:
    """`load(path, checkpoint=which)`'s checkpoint: (its path, its step)."""
    from kroberta.training import signals

    saved = list_checkpoints(path)
    if which == "best":
        best = signals.best_checkpoint(path)
        if best is None:
            raise NotFoundError(f"{path}: no kept checkpoint was evaluated; train with "
                                "validation data and train.keep_best = true")
        return best[1], best[0]
    if which == "last":
        if not saved:
            raise NotFoundError(f"{path}: holds no checkpoint")
        return saved[-1][1], saved[-1][0]
    if isinstance(which, int) and not isinstance(which, bool):
        found = dict(saved)
        if which not in found:
            raise NotFoundError(f"{path}: no checkpoint at step {which} (kept: "
                                f"{', '.join(str(s) for s, _ in saved) or 'none'})")
        return found[which], which
    raise InputError(f"checkpoint: expected None, \"best\", \"last\" or a step number, "
                     f"got {which!r}")
