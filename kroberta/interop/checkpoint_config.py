"""What a checkpoint to start from implies for a run: its model section and its tokenizer.

`--init_from_hf=DIR` (or `--init_from_keras_hub=DIR`) is enough to continue pretraining:
the model section comes from the checkpoint's config (Hugging Face's `config.json`
through `model_config_from_hf`, a keras-hub preset's through `preset_model_config`).
A config file or `--model.*` overrides may repeat those values; every key that
disagrees is named in one error, with where the config's value came from and the
checkpoint's value. The checkpoint's tokenizer (`tokenizer.json`, or `vocab.json` +
`merges.txt`; a preset's `assets/tokenizer/`) is what data must be prepared with.
"""

import dataclasses
import logging
import os

from kroberta import storage
from kroberta.config import Config, ModelConfig, config_path, shipped_names
from kroberta.errors import ConfigError, InputError
from kroberta.interop.hf_weights import HF_NAMES, POSITION_OFFSET, SHAPE_KEYS

logger = logging.getLogger(__name__)

HF_KEY = "init_from_hf"
KERAS_HUB_KEY = "init_from_keras_hub"
# Keys that fix the weights' shapes and numerics: a config must agree with the checkpoint.
WEIGHT_KEYS = (*SHAPE_KEYS, "layer_norm_epsilon")
MODEL_KEYS = tuple(f.name for f in dataclasses.fields(ModelConfig))


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A checkpoint a run starts from, as its config describes it."""

    key: str  # the config key that names it: init_from_hf or init_from_keras_hub
    directory: str
    config_file: str  # the file its model section is read from
    model: ModelConfig

    def shown(self, name: str) -> str:
        """The checkpoint's value of model key `name`, as its own config file spells it."""
        value = getattr(self.model, name)
        if self.key == KERAS_HUB_KEY:
            return f"config.{name}={value}"
        if name == "max_sequence_length":  # HF counts more rows (positions offset by pad + 1)
            return f"max_position_embeddings={value + POSITION_OFFSET} ({value} positions)"
        return f"{HF_NAMES.get(name, name)}={value}"


def checkpoint_of(config: Config) -> Checkpoint | None:
    """The checkpoint `config` starts from (None: a fresh start), its model section read.

    Raises:
        ConfigError: `init_from_*` names no directory.
        ConversionError: the checkpoint's config is missing,
            unreadable or describes a model kroberta cannot hold (names the file and key).
        InputError: the keras-hub preset holds a fine-tuned classifier.
    """
    named = checkpoint_directory(config)
    if named is None:
        return None
    key, directory = named
    # start-up: `train` reads this module before JAX and Keras load
    from kroberta.interop import hf, keras_hub_presets

    with storage.local_copy(directory) as local:  # gs://...: a temporary copy
        if key == HF_KEY:
            model = hf.model_config_from_hf(
                hf.read_hf_config(local), os.path.join(local, hf.CONFIG_FILE)
            )
        else:  # with what keras-hub's config cannot hold, from kroberta_config.toml
            model = keras_hub_presets.preset_config(local, masked_lm=True).model
    return Checkpoint(key, directory, os.path.join(directory, "config.json"), model)


def checkpoint_directory(config: Config) -> tuple[str, str] | None:
    """(key, directory) of the checkpoint `config` starts from (None: a fresh start), once
    the directory is there; reads nothing in it, so it is checked before any other work.

    Raises:
        ConfigError: `init_from_*` names no directory.
    """
    if config.init_from_hf:
        key, directory = HF_KEY, config.init_from_hf
    elif config.init_from_keras_hub:
        key, directory = KERAS_HUB_KEY, config.init_from_keras_hub
    else:
        return None
    if not storage.isdir(directory):
        what = "a Hugging Face model directory" if key == HF_KEY else "a keras-hub preset directory"
        raise ConfigError(f"{key}: {directory!r} is not a directory (it should be {what})")
    return key, directory


def with_checkpoint_model(
    config: Config, sources: dict | None = None, checkpoint: Checkpoint | None = None
) -> tuple[Config, dict]:
    """`config` with its model section from the checkpoint it starts from, if any.

    Keys the config leaves at their defaults take the checkpoint's values. The keys that
    fix the weights (`WEIGHT_KEYS`) must agree where the config sets them; dropout,
    attention_dropout and initializer_range set by the config are kept (how training
    goes on, not what the weights are).

    Args:
        config: the config a command line or file describes (not validated).
        sources: {dotted key: where its value came from}, as `from_command_line` returns
            (keys not in it were left at their defaults); None (a config built in Python):
            the keys at `ModelConfig`'s defaults count as not set.
        checkpoint: `checkpoint_of(config)` when the caller has it (None: read here).

    Returns:
        (config, sources) with the model keys taken from the checkpoint recorded as
        coming from its config file.

    Raises:
        ConfigError: one message naming every disagreeing key, its value and source,
            and the checkpoint's value.
    """
    checkpoint = checkpoint if checkpoint is not None else checkpoint_of(config)
    sources = dict(sources) if sources is not None else None
    if checkpoint is None:
        return config, sources
    set_by_config = _set_by_config(config, sources)
    conflicts = [
        name
        for name in WEIGHT_KEYS
        if name in set_by_config and getattr(config.model, name) != getattr(checkpoint.model, name)
    ]
    if conflicts:
        listed = "; ".join(
            f"model.{name}={getattr(config.model, name)} ({_source(sources, name)}) "
            f"but the checkpoint has {checkpoint.shown(name)}"
            for name in conflicts
        )
        shipped = {config_path(name) for name in shipped_names()}
        fix = (
            "leave out --config (a shipped config sets them) or give the checkpoint's values"
            if any(_source(sources, name) in shipped for name in conflicts)
            else "remove these keys from the config file and the command line"
        )
        raise ConfigError(
            f"{checkpoint.key}: the config disagrees with the checkpoint {checkpoint.config_file} "
            f"on {len(conflicts)} key(s): {listed}. The model section follows the checkpoint: {fix}"
        )
    taken = {
        name: getattr(checkpoint.model, name) for name in MODEL_KEYS if name not in set_by_config
    }
    for name in sorted(set_by_config - set(WEIGHT_KEYS)):
        if getattr(config.model, name) != getattr(checkpoint.model, name):
            logger.info(
                "model.%s=%s (%s) replaces the checkpoint's %s",
                name,
                getattr(config.model, name),
                _source(sources, name),
                checkpoint.shown(name),
            )
    if sources is not None:
        sources.update({f"model.{name}": checkpoint.config_file for name in taken})
    return config.with_section("model", **taken), sources


def _set_by_config(config: Config, sources: dict | None) -> set[str]:
    """The model keys the config sets: those `sources` names, or without sources those
    that differ from `ModelConfig`'s defaults."""
    if sources is not None:
        return {name for name in MODEL_KEYS if f"model.{name}" in sources}
    default = ModelConfig()
    return {name for name in MODEL_KEYS if getattr(config.model, name) != getattr(default, name)}


def _source(sources: dict | None, name: str) -> str:
    return "config" if sources is None else sources.get(f"model.{name}", "default")


# ---------------------------------------------------------------- tokenizer


def checkpoint_tokenizer(checkpoint: Checkpoint):
    """(the checkpoint's `tokenizers.Tokenizer` or None, the tokenizer.json file to keep
    with the run or None): HF's `tokenizer.json`, else its `vocab.json` + `merges.txt`;
    a keras-hub preset's `assets/tokenizer/` vocabulary and merges
    (`kroberta.text.tokenizer.load_tokenizer` reads them all)."""
    # start-up: tokenizers loads only when a checkpoint's tokenizer is read
    from kroberta.text.tokenizer import load_tokenizer, tokenizer_json_of

    if (
        checkpoint.key == KERAS_HUB_KEY
    ):  # its tokenizer.json is keras-hub's, not a `tokenizers` file
        # start-up: `train` reads this module before keras-hub loads
        from kroberta.interop.keras_hub_presets import preset_tokenizer

        with storage.local_copy(checkpoint.directory) as local:
            return preset_tokenizer(local), None
    try:
        tokenizer = load_tokenizer(checkpoint.directory)
    except InputError:
        names = (
            "tokenizer.json",
            "vocab.json",
            os.path.join("assets", "tokenizer", "vocabulary.json"),
        )
        if any(storage.isfile(storage.join(checkpoint.directory, name)) for name in names):
            raise  # there, but unreadable or lacking a special token: say so
        return None, None
    return tokenizer, tokenizer_json_of(checkpoint.directory)
