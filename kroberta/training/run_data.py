"""The data a training run reads, resolved and checked: `kroberta.dataset(config, split)`.

`kroberta.train` and the public `dataset` build their pipelines here with the same
arguments, so what a user inspects is exactly the stream the model is fed.
"""

import dataclasses

import jax

from kroberta.data import pipeline
from kroberta.training import datasource
from kroberta.config import AUTO, Config, ConfigError, validate

SPLITS = ("train", "validation")


@dataclasses.dataclass(frozen=True)
class RunData:
    """A run's config with its data resolved, and what its files hold."""

    config: Config
    train: pipeline.DataSpec
    validation: pipeline.DataSpec | None
    tokenizer_path: str | None
    # (V,) bool from the tokenizer, read once, for data.whole_word_masking; else None.
    word_starts: object = dataclasses.field(default=None, compare=False, repr=False)


def run_data_for(config: Config, log=print) -> RunData:
    """Finds the run's files (prepares the embedded corpus if none are given), checks them."""
    config, tokenizer_path = datasource.resolve(config, log=log)
    if config.data.whole_word_masking and tokenizer_path is None:
        raise ConfigError("data.whole_word_masking: needs the run's tokenizer; give data.dir "
                          "(a directory made by `python -m kroberta.prepare`) instead of data.train")
    train = pipeline.inspect_files(pipeline.resolve_files(config.data.train, "data.train"),
                                   "data.train")
    if config.data.masking == AUTO:
        data = config.data.with_masking_for(train.has_labels)
        log(f"data.masking: auto -> {data.masking} (the training files "
            f"{'carry' if train.has_labels else 'have no'} labels)")
        config = dataclasses.replace(config, data=data)
    pipeline.check_against_model(train, config.data, config.model, "data.train")
    validation = None
    if config.data.validation:
        validation = pipeline.inspect_files(
            pipeline.resolve_files(config.data.validation, "data.validation"), "data.validation")
        pipeline.check_against_model(validation, config.data, config.model, "data.validation")
        if validation.sequence_length != train.sequence_length:
            raise pipeline.DataError(
                f"data.validation: sequences of {validation.sequence_length} tokens, but "
                f"data.train has {train.sequence_length}")
    return RunData(config, train, validation, tokenizer_path, _word_starts(config, tokenizer_path))


def _word_starts(config: Config, tokenizer_path: str | None):
    """The tokenizer's word-start table when the run masks whole words, else None."""
    if not config.data.whole_word_masking:
        return None
    from kroberta.text.tokenizer import load_tokenizer, word_start_table

    return word_start_table(load_tokenizer(tokenizer_path), config.model.vocabulary_size)


def train_batches(run: RunData, process_batch: int, start_step: int = 0, shard=None,
                  device_masks: bool = True):
    """The training pipeline of `run` (`device_masks`: the step draws the dynamic masks
    or chooses the static slots)."""
    t = run.config.train
    return pipeline.train_dataset(run.train, run.config.data, run.config.model.vocabulary_size,
                                  process_batch, t.seed, start_step, shard=shard,
                                  word_starts=run.word_starts, device_masks=device_masks)


def validation_batches(run: RunData, global_batch: int, shard=None, device_masks: bool = True):
    """The validation pipeline of `run` (`device_masks` as in `train_batches`).

    Masked at `data.eval_mask_rate`: when it differs from the training rate, the
    pipeline draws the masks (the training step draws them at the training rate), each
    example's from the run seed and its place in the files, as the step would.
    """
    t, data = run.config.train, run.config.data
    if data.evaluation_mask_rate() != data.mask_rate:
        data = dataclasses.replace(data, mask_rate=data.evaluation_mask_rate())
        device_masks = False
    return pipeline.eval_dataset(run.validation, data, run.config.model.vocabulary_size,
                                 global_batch, t.seed, t.eval_steps, shard=shard,
                                 word_starts=run.word_starts, device_masks=device_masks)


def dataset(config: Config, split: str = "train", start_step: int = 0, log=print,
            masks_on_host: bool = False):
    """The exact `tf.data.Dataset` of batches that training feeds the model.

    Args:
        config: a run's config (e.g. `kroberta.load_config(...)` or `config.load_toml`).
        split: "train" (endless, in epochs that hold every record once, masked as
            training masks them; starting after `start_step` batches) or "validation"
            (every example once, the last batch padded with weightless rows).
        start_step: for "train", the batches already consumed (as on resume).
        log: where to report preparing the embedded corpus, when the config names no data.
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
    config = validate(config)
    run = run_data_for(config, log=log)
    devices = config.distributed.devices or jax.device_count()
    processes, index = jax.process_count(), jax.process_index()
    shard = (processes, index) if processes > 1 else None
    per_device = config.train.batch_size_per_device
    if split == "train":
        accumulated = per_device * config.train.gradient_accumulation_steps
        return train_batches(run, accumulated * devices // processes, start_step, shard,
                             device_masks=not masks_on_host)
    if run.validation is None:
        raise ConfigError("data.validation: the config has no validation files")
    return validation_batches(run, per_device * devices, shard, device_masks=not masks_on_host)
