"""The data a training run reads, found and checked: `kroberta.dataset(config, split)`.

A run's data comes from explicit files, a prepared directory, or the embedded corpus.

`kroberta.train` and the public `dataset` build their pipelines here with the same
arguments, so what a user inspects is exactly the stream the model is fed.
"""

import dataclasses
import hashlib
import logging
import os
import tempfile

from kroberta import storage
from kroberta.config import AUTO, Config, validate
from kroberta.data import pipeline
from kroberta.data.file_patterns import DataSources, find_sources, prepared_sources
from kroberta.data.manifest import check_prepared_with
from kroberta.errors import ConfigError, InputError
from kroberta.interop.checkpoint_config import checkpoint_of, checkpoint_tokenizer
from kroberta.perf.plan import make_plan
from kroberta.run_layout import MANIFEST_NAME
from kroberta.runtime import logs
from kroberta.text import corpus
from kroberta.text.build import prepare
from kroberta.text.tokenizer import load_tokenizer, word_start_table

SPLITS = ("train", "validation")

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RunData:
    """A run's config with its data resolved, and what its files hold."""

    config: Config
    train: pipeline.DataSpec
    validation: pipeline.DataSpec | None
    tokenizer_path: str | None
    # (V,) bool from the tokenizer, read once, for data.whole_word_masking; else None.
    word_starts: object = dataclasses.field(default=None, compare=False, repr=False)


def run_data_for(config: Config, sources: DataSources | None = None) -> RunData:
    """Finds the run's files (prepares the embedded corpus if none are given), checks them.

    `sources`: `find_sources(config.data)`, where the caller found them already (None:
    found here)."""
    if sources is None:
        sources = find_sources(config.data)
    start = _starting_point(config)
    if start is not None:
        # A config built in Python (kroberta.train): its model keys at their defaults
        # follow the checkpoint (the command line resolved them already: a no-op then).
        from kroberta.interop.checkpoint_config import with_checkpoint_model

        config = validate(with_checkpoint_model(config, checkpoint=start.checkpoint)[0])
    if start is not None and config.data.dir:  # before the manifest's own size checks
        _check_prepared_for(start, [config.data.dir], "data.dir", required=True)
    if sources.manifest is None and not sources.train:
        sources = _embedded_sources(config)
    tokenizer_path = None
    if sources.manifest is not None:
        config, tokenizer_path = _with_manifest(config, sources)
    if start is not None and start.tokenizer_path:
        tokenizer_path = start.tokenizer_path  # the checkpoint's tokenizer is the run's
    if config.data.whole_word_masking and tokenizer_path is None:
        raise ConfigError(
            "data.whole_word_masking: needs the run's tokenizer; give data.dir "
            "(a directory made by `python -m kroberta.prepare`) instead of data.train"
        )
    train = pipeline.inspect_files(sources.train, "data.train")
    if config.data.masking == AUTO:
        data = config.data.with_masking_for(train.has_labels)
        logger.info(
            f"data.masking: auto -> {data.masking} (the training files "
            f"{'carry' if train.has_labels else 'have no'} labels)"
        )
        config = validate(
            dataclasses.replace(config, data=data),  # static: no eval_mask_rate
            f'data.masking="auto" ({data.masking}: the training files\' labels)',
        )
    if start is not None:
        _check_prepared_for(start, _other_directories(train.files, config.data.dir), "data.train")
    pipeline.check_against_model(train, config.data, config.model, "data.train")
    validation = None
    if sources.validation:
        validation = pipeline.inspect_files(sources.validation, "data.validation")
        if start is not None:
            _check_prepared_for(
                start, _other_directories(validation.files, config.data.dir), "data.validation"
            )
        pipeline.check_against_model(validation, config.data, config.model, "data.validation")
        if validation.sequence_length != train.sequence_length:
            raise InputError(
                f"data.validation: sequences of {validation.sequence_length} tokens, but "
                f"data.train has {train.sequence_length}"
            )
    return RunData(config, train, validation, tokenizer_path, _word_starts(config, tokenizer_path))


@dataclasses.dataclass(frozen=True)
class StartingPoint:
    """The checkpoint a run starts from (init_from_hf / init_from_keras_hub) and its tokenizer."""

    checkpoint: object  # kroberta.interop.checkpoint_config.Checkpoint
    tokenizer: object  # a `tokenizers.Tokenizer`, or None when the checkpoint has none
    tokenizer_path: str | None  # its tokenizer.json, kept in the run directory


def _starting_point(config: Config) -> StartingPoint | None:
    """The checkpoint `config` starts from, or None (a fresh start); named before the
    data are read when its directory is not there (`checkpoint_of`)."""
    checkpoint = checkpoint_of(config)
    if checkpoint is None:
        return None
    tokenizer, path = checkpoint_tokenizer(checkpoint)
    if tokenizer is None:
        logger.warning(
            f"{checkpoint.key}: {checkpoint.directory} has no tokenizer, so nothing checks "
            "that the data were prepared with the checkpoint's"
        )
    return StartingPoint(checkpoint, tokenizer, path)


def _check_prepared_for(start: StartingPoint, directories, key: str, required: bool = False):
    """Refuses prepared directories whose tokenizer or sequence length is not the
    checkpoint's, naming the `prepare` command that makes the right one."""
    checkpoint = start.checkpoint
    check_prepared_with(
        directories,
        key,
        checkpoint.model.vocabulary_size,
        start.tokenizer,
        positions=checkpoint.model.max_sequence_length,
        holder="checkpoint",
        named=f"the checkpoint ({checkpoint.key}={checkpoint.directory})",
        tokenizer_owner="checkpoint",
        tokenizer_source=checkpoint.directory,
        required=required,
    )


def _other_directories(files, checked_dir: str) -> list[str]:
    """The directories holding `files`, other than `checked_dir` (data.dir, checked already)."""
    return sorted({os.path.dirname(f) for f in files} - {checked_dir.rstrip("/")})


# The embedded default job's corpus: the standard library's docstrings, which every
# Python installation has, prepared once per run directory.
EMBEDDED_DIR = "embedded-data"


def _embedded_sources(config: Config) -> DataSources:
    """The embedded corpus, prepared once per run directory."""
    home = _local_home(config.run_dir)
    prepared = os.path.join(home, EMBEDDED_DIR)
    if not os.path.isfile(os.path.join(prepared, MANIFEST_NAME)):
        os.makedirs(home, exist_ok=True)
        text_path = os.path.join(home, "embedded-corpus.txt")
        logger.info(
            "no data given: building the embedded corpus from the Python standard library's "
            "docstrings"
        )
        stats = corpus.write_stdlib_corpus(text_path)
        logger.info(f"  {stats}")
        prepare(
            [text_path],
            prepared,
            vocab_size=config.model.vocabulary_size,
            seq_len=config.model.max_sequence_length,
            validation_fraction=0.02,
            seed=config.train.seed,
            progress=False,
            workers=1,  # a few MB, prepared in this process: no worker processes started from a training one
        )
    return prepared_sources(prepared, "embedded corpus", config.data.validation)


def _local_home(run_dir: str) -> str:
    """Where the embedded corpus is prepared: the run directory, or for a URL one (whose
    files tf.data may not read) a local directory of its own, rebuilt when missing (it is
    the same corpus every time)."""
    if not storage.is_url(run_dir):
        return run_dir
    digest = hashlib.sha256(run_dir.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"kroberta-embedded-{digest}")


def _with_manifest(config: Config, sources: DataSources) -> tuple[Config, str]:
    """The config with `data.train` / `data.validation` and the special tokens filled in
    from a prepared directory, and the tokenizer file to keep with the run."""
    manifest, directory, key = sources.manifest, sources.directory, sources.key
    if manifest.vocabulary_size != config.model.vocabulary_size:
        raise ConfigError(
            f"{key}: {directory} was prepared with a vocabulary of {manifest.vocabulary_size} "
            f"tokens but model.vocabulary_size={config.model.vocabulary_size}; set "
            f"model.vocabulary_size to {manifest.vocabulary_size} "
            f"(--model.vocabulary_size={manifest.vocabulary_size})"
        )
    if manifest.sequence_length > config.model.max_sequence_length:
        raise ConfigError(
            f"{key}: {directory} holds sequences of {manifest.sequence_length} tokens but "
            f"model.max_sequence_length={config.model.max_sequence_length}; set "
            f"model.max_sequence_length to {manifest.sequence_length} "
            f"(--model.max_sequence_length={manifest.sequence_length})"
        )
    # Files named beside a prepared directory would be silently replaced by its own
    # (a recorded config.toml names the directory's files: those agree).
    for split, given, own in (
        ("train", config.data.train, manifest.train_files),
        ("validation", config.data.validation, manifest.validation_files),
    ):
        if given and own and sorted(given) != sorted(own):
            raise ConfigError(
                f"data.{split}: {key} {directory} has its own {split} files ({len(own)}), so "
                f"data.{split}={list(given)} would be ignored; give one of data.dir and "
                f"data.{split}"
            )
    special = manifest.special_tokens
    config = config.with_section(
        "data",
        train=tuple(manifest.train_files),
        validation=tuple(manifest.validation_files) or config.data.validation,
        pad_token_id=special.get("pad", config.data.pad_token_id),
        mask_token_id=special.get("mask", config.data.mask_token_id),
        special_token_ids=tuple(sorted(set(special.values()))) or config.data.special_token_ids,
    )
    return config, manifest.tokenizer_path


def _word_starts(config: Config, tokenizer_path: str | None):
    """The tokenizer's word-start table when the run masks whole words, else None."""
    if not config.data.whole_word_masking:
        return None

    return word_start_table(load_tokenizer(tokenizer_path), config.model.vocabulary_size)


def train_batches(
    run: RunData, process_batch: int, start_step: int = 0, shard=None, device_masks: bool = True
):
    """The training pipeline of `run` (`device_masks`: the step draws the dynamic masks
    or chooses the static slots)."""
    t = run.config.train
    return pipeline.train_dataset(
        run.train,
        run.config.data,
        run.config.model.vocabulary_size,
        process_batch,
        t.seed,
        start_step,
        shard=shard,
        word_starts=run.word_starts,
        device_masks=device_masks,
    )


def validation_batches(run: RunData, global_batch: int, shard=None, device_masks: bool = True):
    """The validation pipeline of `run` (`device_masks` as in `train_batches`).

    Masked at `data.eval_mask_rate`: the evaluation step draws each example's masks at
    that rate from the run seed and its place in the files (`device_masks`), or, with
    `device_masks=False`, the pipeline draws the same ones.
    """
    t, data = run.config.train, run.config.data
    if not device_masks and data.evaluation_mask_rate() != data.mask_rate:
        data = dataclasses.replace(data, mask_rate=data.evaluation_mask_rate())
    return pipeline.eval_dataset(
        run.validation,
        data,
        run.config.model.vocabulary_size,
        global_batch,
        t.seed,
        t.eval_steps,
        shard=shard,
        word_starts=run.word_starts,
        device_masks=device_masks,
    )


def dataset(config: Config, split: str = "train", start_step: int = 0, masks_on_host: bool = False):
    """The exact `tf.data.Dataset` of batches that training feeds the model.

    Args:
        config: a run's config (e.g. `kroberta.load_config(...)` or `config.load_toml`).
        split: "train" (endless, in epochs that hold every record once, masked as
            training masks them; starting after `start_step` batches) or "validation"
            (every example once, the last batch padded with weightless rows).
        start_step: for "train", the batches already consumed (as on resume).
        masks_on_host: draw dynamic masks and choose static slots in the pipeline
            (the training step's JAX masking, run on the host CPU) instead of leaving
            them to the training step: the (x, labels) batches the model itself sees,
            bit for bit.

    Returns:
        Batches of this process's share, int32, with B = batch_size_per_device x this
        process's devices (x gradient_accumulation_steps for "train": one optimizer
        step's micro-batches together): (x, labels) with x = {token_ids (B, L),
        padding_mask (B, L), mask_positions (B, M)} and labels (B, M); or, with
        data.masking = "dynamic" and not `masks_on_host`, x alone:
        {token_ids (B, L) unmasked, padding_mask (B, L), mask_keys (B,) uint32}, each
        row's key a hash of the run seed and the row's element index, from which the
        training step draws exactly the masks `masks_on_host=True` shows; with
        data.masking = "static" and not `masks_on_host`, x alone: {token_ids (B, L),
        padding_mask (B, L), token_labels (B, L)} as in the files, from which the step
        chooses the slots `masks_on_host=True` shows (`kroberta.masking`).
    """
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
    logs.show_messages()  # preparing the embedded corpus, when the config names no data
    config = validate(config)
    run = run_data_for(config)
    # The rows of each batch do not depend on the mesh: one batch axis over the devices.
    plan = make_plan(run.config, strategy="data")
    if split == "train":
        return train_batches(
            run, plan.process_batch, start_step, plan.data_shard, device_masks=not masks_on_host
        )
    if run.validation is None:
        raise ConfigError("data.validation: the config has no validation files")
    return validation_batches(
        run, plan.micro_batch, plan.data_shard, device_masks=not masks_on_host
    )
