"""`kroberta.finetune`: a pretrained model fine-tuned on a labelled task and scored.

The task is a labelled file pair (train and validation), a GLUE task read from its
standard directory, or, with no data, the embedded standard-library task
(`kroberta.downstream.tasks`). The learning-rate search (`search`) runs its trials
(`trial`) from each start (`starts`) and returns a `results.FinetuneResult`. With `baseline=True` the same recipe also runs
from a random initialisation of the same shape, which shows what pretraining is worth.
"""

import dataclasses
import difflib
import functools
import inspect
import logging
import os

import jax
import numpy as np

from kroberta.downstream import classifiers, encoding, metrics, search, starts, trial
from kroberta.downstream.model_files import load
from kroberta.downstream.results import FinetuneResult, compare
from kroberta.downstream.settings import FinetuneConfig, SettingError
from kroberta.downstream.tasks import CLASSIFICATION, REGRESSION, Task, read_task
from kroberta.downstream.trial import Setup, TrialLog, fingerprint
from kroberta.errors import InputError
from kroberta.model.masked_lm import check_model
from kroberta.parallel.distribute import global_distribution
from kroberta.run_layout import CLASSIFIER, MASKED_LM, check_finetune_out, model_source

logger = logging.getLogger(__name__)


def _config(config: FinetuneConfig | None, settings: dict) -> FinetuneConfig:
    """`config`, or the one `settings` (keyword arguments: its fields) make."""
    known = [f.name for f in dataclasses.fields(FinetuneConfig)]
    unknown = sorted(set(settings) - set(known))
    if unknown:
        # `epoch=1` or `learning_rate=1e-3`: the setting meant, named (Python names none).
        keywords = known + list(inspect.signature(finetune).parameters)[1:-1]
        close = difflib.get_close_matches(unknown[0], keywords, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f" (settings: {', '.join(known)})"
        raise TypeError(f"finetune() got an unexpected keyword argument {unknown[0]!r}{hint}")
    if config is not None and settings:
        raise InputError(
            f"kroberta.finetune: config= and {', '.join(f'{k}=' for k in settings)} "
            "given together; give the settings in the config (dataclasses.replace("
            "config, ...)) or as keyword arguments, not both"
        )
    return config if config is not None else FinetuneConfig(**settings)


def _check_devices(config: FinetuneConfig):
    """Refuses a batch the devices cannot share evenly (the one check needing JAX)."""
    if config.batch_size % jax.local_device_count():
        raise SettingError(
            "batch_size",
            config.batch_size,
            f"must be a positive multiple of the {jax.local_device_count()} devices",
        )


def _check_against_model(model, options: FinetuneConfig):
    """Refuses the recipe options the model given cannot take (before it is loaded when
    it is a path)."""
    path = isinstance(model, (str, os.PathLike))

    def classifier():
        if path:
            return model_source(model, "kroberta.finetune")[1] == CLASSIFIER
        return getattr(model, "task_spec", None) is not None

    if options.adapt_steps and classifier():
        raise SettingError(
            "adapt_steps",
            options.adapt_steps,
            "the model is a fine-tuned "
            "classifier, which has no masked-LM head to adapt; give the pretrained "
            "masked LM (--run: a run, a Hugging Face or keras-hub masked LM)",
        )
    layers = None if path else getattr(getattr(model, "backbone", None), "num_layers", None)
    if layers is not None and options.reinit_layers > layers:
        raise SettingError(
            "reinit_layers",
            options.reinit_layers,
            f"the model has {layers} encoder layer(s); give 0 to {layers}",
        )


def _loaded(model, options: FinetuneConfig):
    """The masked LM `model` is or names (a run directory, a Hugging Face export, a
    preset), checked against the recipe's options."""
    if isinstance(model, (str, os.PathLike)):
        model_source(model, "kroberta.finetune", head=MASKED_LM)
        model = load(model)
    else:
        check_model(model, "kroberta.finetune")
    _check_against_model(model, options)
    return model


def _settings(setup: Setup) -> dict:
    """What besides its rate and seed decides a trial's result (`TrialLog`'s settings)."""
    splits = [setup.train, *setup.evaluation.values()]
    data = fingerprint([a for s in splits for a in (*map(np.asarray, s.ids), s.labels)])
    return {
        "task": setup.spec.name,
        "data": data,
        "epochs": setup.epochs,
        "patience": setup.config.early_stopping,
        "batch_size": setup.batch_size,
        "max_length": setup.max_length,
        **({"pooling": setup.config.pooling} if setup.config.pooling != classifiers.FIRST else {}),
        **setup.config.recipe_switched_on(),
    }


def finetune(
    model,
    task: str | Task | None = None,
    data=None,
    validation=None,
    *,
    text_fields=None,
    label_field: str = "label",
    kind: str = CLASSIFICATION,
    out: str | None = None,
    config: FinetuneConfig | None = None,
    **settings,
) -> FinetuneResult:
    """Fine-tunes a pretrained model on a task and scores it on the validation split(s).

    Args:
        model: a masked LM (`kroberta.load`) or a path of one.
        task: "glue/<task>" (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli), a name
            for a labelled file pair, or None / "stdlib" with no data: the embedded task;
            or a `Task` read already (`kroberta.downstream.tasks.read_task`).
        data: the GLUE directory for a GLUE task, else the training file.
        validation: the validation file of a labelled file pair.
        text_fields: the field holding the text, or two fields holding a pair (default:
            "text"; without one, the training file's fields besides the label, as
            Hugging Face's run_glue chooses them).
        label_field: the field holding the label.
        kind: "classification" (string or integer labels) or "regression" (floats).
        out: a folder to keep each finished trial in (`kroberta.downstream.trial`): run
            again with the same arguments, an interrupted fine-tune resumes there and ends
            with the result an uninterrupted one gives.
        config: the settings (`FinetuneConfig`: learning rates, seeds, epochs, batch size,
            the recipe's options...); None: its defaults, or those `settings` give.
        **settings: `FinetuneConfig`'s fields as keywords (`epochs=5`), instead of `config`.

    Returns:
        A `FinetuneResult`: every run's scores, the best learning rate, the median and
        range over its seeds, the fine-tuned classifier, and `config` (the settings).

    Raises:
        DivergedError: every trial's loss became NaN or inf.
        InputError: an argument no fine-tune can run with (names it).
    """
    config = _config(config, settings)
    check_finetune_out(out)
    _check_devices(config)
    _check_against_model(model, config)
    model = _loaded(model, config)
    max_length = _max_length(model, config.max_length)
    if not isinstance(task, Task):
        task = read_task(task, data, validation, text_fields, label_field, kind)
    return _run_grids(model, _setup(model, task, config, max_length), out, task.train.texts)


def _max_length(model, asked: int | None) -> int:
    """The tokens per sequence: `asked` (None: the model's positions), at most the model's."""
    longest = model.kroberta_config.model.max_sequence_length
    if asked and asked > longest:
        logger.warning(
            "--max-length %d: the model has %d positions; sequences of %d tokens",
            asked,
            longest,
            longest,
        )
    return min(asked or longest, longest)


def _setup(model, task: Task, config: FinetuneConfig, max_length: int) -> Setup:
    """The task's splits encoded for `model` at `max_length`, with the schedule `config` sets."""

    def encoded(labelled):
        return encoding.encode(model.tokenizer, labelled.texts, labelled.labels, max_length)

    return Setup(
        task.spec,
        task.label_names,
        encoded(task.train),
        {split: encoded(s) for split, s in task.evaluation.items()},
        max_length,
        config.batch_size,
        config.epochs,
        config=config,
    )


def _run_grids(model, setup: Setup, out, texts) -> FinetuneResult:
    """The pretrained start's grid, and the random start's first with `baseline`; the
    result holds both and their comparison. `texts`: the training texts (one list per
    field), for `adapt_steps`."""
    config, spec, names = model.kroberta_config, setup.spec, setup.label_names
    options = setup.config
    seeds = list(range(options.seeds)) if isinstance(options.seeds, int) else list(options.seeds)
    rates = options.learning_rates or search.learning_rates(config.model)
    with global_distribution(classifiers.data_parallel()):
        classifier = classifiers.build_classifier(
            config.model, len(names) if names else 1, options.pooling
        )
        classifiers.compile_classifier(
            classifier, spec.kind, setup.steps, setup.steps_per_execution, options.layer_decay
        )
        # Hashing the data and the starting weights is only needed to resume from `out`.
        settings = _settings(setup) if out else {}
        adapted = starts.Adaptation(model, texts, setup) if options.adapt_steps else None
        if adapted:  # now, so that the result has its losses even when every trial resumes
            adapted.pretrained(model)
        scratch = None
        if options.baseline:  # first, and kept in a classifier of its own
            random_start = functools.cache(functools.partial(starts.random_start, model, adapted))
            scratch = search.run_grid(
                classifier,
                setup,
                random_start,
                options.baseline_learning_rates or rates,
                seeds,
                TrialLog(out, "random", dict(settings, start="random")),
                options.widen,
            )
            scratch.classifier = _copy(classifier, config, model.tokenizer, setup)
            scratch.adaptation = adapted.losses(random=True) if adapted else None
        start = classifiers.backbone_weights(model)
        pretrained = dict(settings, start=fingerprint(start) if out else None)
        # Not cached: with `reinit_layers` each seed's start is one more copy of the body.
        pretrained_start = functools.partial(
            starts.pretrained_start, model, start, options, adapted
        )
        result = search.run_grid(
            classifier,
            setup,
            pretrained_start,
            rates,
            seeds,
            TrialLog(out, "pretrained", pretrained),
            options.widen,
        )
        result.adaptation = adapted.losses(random=False) if adapted else None
        classifiers.describe(classifier, config, model.tokenizer, spec, names, setup.max_length)
        result.per_class = _per_class(result, setup)
        if scratch is not None:
            scratch.per_class = _per_class(scratch, setup)
    if scratch is not None:
        result.baseline = scratch
        result.comparison = compare(result, scratch, setup.evaluation[result.split].labels)
    return result


def _copy(classifier, config, tokenizer, setup: Setup):
    """A classifier of its own holding `classifier`'s weights (which go on training)."""
    copy = classifiers.build_classifier(
        config.model, len(setup.label_names or ()) or 1, setup.config.pooling
    )
    copy.set_weights(classifier.get_weights())
    return classifiers.describe(
        copy, config, tokenizer, setup.spec, setup.label_names, setup.max_length
    )


def _per_class(result: FinetuneResult, setup: Setup) -> dict | None:
    """{split: {class name: precision, recall, f1, support}} of `result.classifier` (None
    for regression). The first split's predictions are the kept trial's, made with the
    weights the classifier holds; only the other splits are predicted again."""
    if setup.spec.kind == REGRESSION:
        return None
    names, kept = setup.label_names, result.kept

    def predicted(split):
        if split == result.split and kept is not None and kept.predictions is not None:
            return np.asarray(kept.predictions)
        return trial.predictions_of(result.classifier, setup, split)  # (n,)

    return {
        split: dict(zip(names, metrics.per_class(encoded.labels, predicted(split), len(names))))
        for split, encoded in setup.evaluation.items()
    }
