"""`kroberta.evaluate(model, data)`: a model's masked-LM loss on prepared data, measured
exactly as a training run's validation measures it.

The data go through the run's own validation pipeline (`kroberta.training.run_data`:
every example once, masked at `data.eval_mask_rate` from the run seed and each
example's place in the files, or by the files' labels), and the numbers come from the
training model's own `evaluate` (its loss, metrics and evaluation masker), built with the
model's config over the same devices. So on a run's model, at the step of one of its
validation rows and on the same files, it gives that row; on a checkpoint about to be
trained further (`kroberta.load` of a Hugging Face directory or keras-hub preset) it gives
the baseline to beat.
"""

import dataclasses
import logging
import math
import os
import warnings

from kroberta import storage
from kroberta.config import Config, validate
from kroberta.data import pipeline
from kroberta.data.manifest import check_prepared_with
from kroberta.errors import InputError
from kroberta.interop.keras_hub_presets import preset_model_config_of
from kroberta.model.masked_lm import check_model
from kroberta.model.mlm import build_model, compile_model
from kroberta.parallel.distribute import global_distribution, make_distribution, to_host
from kroberta.perf.plan import make_plan
from kroberta.runtime import logs
from kroberta.training.run_data import run_data_for, validation_batches

logger = logging.getLogger(__name__)


def evaluate(model, data, batch_size: int | None = None) -> dict:
    """The model's validation loss, masked accuracy and perplexity on `data`.

    Args:
        model: a masked LM from `kroberta.load` (a run, a Hugging Face directory, a preset);
            its `kroberta_config` gives the masking (data.masking, data.mask_rate,
            data.eval_mask_rate), the seed of the masks (train.seed), train.eval_steps and
            the batch size.
        data: a prepared directory (`python -m kroberta.prepare`'s --out: its validation
            split, or its training files when it has none), or TFRecord file(s) / glob(s).
        batch_size: sequences per step over all devices (a multiple of the device
            count); None: the config's train.batch_size_per_device x devices, as its
            training evaluated. Only with train.eval_steps > 0 does it change the result
            (eval_steps batches of it are evaluated).

    Returns:
        {"loss": mean cross-entropy per masked token (token-weighted over the whole set),
        "masked_accuracy", "perplexity": exp(loss), "sequences": the sequences read}.

    Raises:
        InputError / ConfigError: data prepared with another tokenizer,
            longer than the model's positions, or malformed (named); a bad batch size.
    """
    check_model(model, "kroberta.evaluate", data, "kroberta.evaluate(model, data)")
    logs.show_messages()  # where the data are read from, as training says it
    config = _config_for(model, data)
    devices = make_plan(config).topology.devices
    config = _with_batch_size(config, batch_size, len(devices))
    # Files `prepare` wrote for another model: their ids would be scored as other tokens.
    check_prepared_with(
        _directories(config),
        "data",
        int(model.backbone.vocabulary_size),
        getattr(model, "tokenizer", None),
        positions=int(model.backbone.max_sequence_length),
    )
    run = run_data_for(config)
    if run.validation is None:
        logger.info("%s has no validation split: evaluating its training files", data)
        run = dataclasses.replace(run, validation=run.train)
    plan = make_plan(run.config, devices)
    config = plan.config
    weights = [to_host(v.value) for v in model.weights]
    with global_distribution(make_distribution(config, plan.topology.devices)):
        # The training model of this config: its loss, metrics and evaluation masks.
        twin = build_model(config.model, config.train.mixed_precision, config=config)
        compile_model(twin, config, run.word_starts)
        twin.set_weights(weights)
        batches = validation_batches(run, plan.micro_batch)
        with warnings.catch_warnings():
            # The unbuilt optimizer's step counter is a local variable; evaluation never
            # uses it (building it would allocate the moments too).
            warnings.filterwarnings("ignore", message="Detected a mix of local")
            measured = twin.evaluate(batches, verbose=0, return_dict=True)
    return {**validation_row(measured), "sequences": int(run.validation.records)}


def validation_row(measured: dict) -> dict:
    """A validation row from the logs of a masked LM's Keras `evaluate`:
    {"loss", "masked_accuracy", "perplexity"}, the loss token-weighted over the whole set
    (the padding examples weigh nothing) as the perplexity metric sums it."""
    return {
        "loss": math.log(measured["perplexity"]),
        "masked_accuracy": float(measured["masked_accuracy"]),
        "perplexity": float(measured["perplexity"]),
    }


def _config_for(model, data) -> Config:
    """The model's config reading `data` for validation (and starting from nothing)."""
    config = getattr(model, "kroberta_config", None) or Config(
        model=preset_model_config_of(model.backbone)
    )
    patterns = _patterns(data)
    if len(patterns) == 1 and storage.isdir(patterns[0]):
        files = {"dir": patterns[0], "train": (), "validation": ()}
    else:
        files = {"dir": "", "train": tuple(patterns), "validation": tuple(patterns)}
    return validate(
        dataclasses.replace(
            config,
            data=dataclasses.replace(config.data, **files),
            init_from_hf="",
            init_from_keras_hub="",
        ),
        "the model's config",
    )


def _patterns(data) -> list[str]:
    items = (
        [data]
        if isinstance(data, (str, os.PathLike))
        else (list(data) if isinstance(data, (list, tuple)) else [])
    )
    if not items or not all(isinstance(p, (str, os.PathLike)) for p in items):
        raise InputError(
            "data: give a prepared directory (python -m kroberta.prepare's "
            "--out) or TFRecord file(s) / glob(s), got "
            + (repr(data) if isinstance(data, (list, tuple)) else type(data).__name__)
        )
    return [os.fspath(p) for p in items]


def _with_batch_size(config: Config, batch_size: int | None, devices: int) -> Config:
    if batch_size is None:
        return config
    if (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, int)
        or batch_size < 1
        or batch_size % devices
    ):
        raise InputError(
            f"batch_size: expected a positive multiple of the {devices} devices, got {batch_size!r}"
        )
    return config.with_section("train", batch_size_per_device=batch_size // devices)


def _directories(config: Config) -> list[str]:
    """The directories holding the files `config` reads (a prepared directory: itself)."""
    if config.data.dir:
        return [config.data.dir]
    return sorted({os.path.dirname(f) for f in pipeline.resolve_files(config.data.train, "data")})
