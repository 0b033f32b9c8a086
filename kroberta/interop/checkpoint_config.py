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

from kroberta.errors import ConfigError, InputError
from kroberta import storage
from kroberta.interop.hf_weights import POSITION_OFFSET
from kroberta.config import Config, ModelConfig

logger = logging.getLogger(__name__)

HF_KEY = "init_from_hf"
KERAS_HUB_KEY = "init_from_keras_hub"
# Keys that fix the weights' shapes and numerics: a config must agree with the checkpoint.
WEIGHT_KEYS = ("vocabulary_size", "num_layers", "num_heads", "hidden_dim", "intermediate_dim",
               "max_sequence_length", "layer_norm_epsilon")
# How Hugging Face's config.json names each model key (keras-hub's names are kroberta's).
HF_NAMES = {"vocabulary_size": "vocab_size", "num_layers": "num_hidden_layers",
            "num_heads": "num_attention_heads", "hidden_dim": "hidden_size",
            "intermediate_dim": "intermediate_size",
            "max_sequence_length": "max_position_embeddings", "dropout": "hidden_dropout_prob",
            "attention_dropout": "attention_probs_dropout_prob",
            "initializer_range": "initializer_range", "layer_norm_epsilon": "layer_norm_eps"}


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
        ConversionError: the checkpoint's config is missing,
            unreadable or describes a model kroberta cannot hold (names the file and key).
    """
    if config.init_from_hf:
        key, directory = HF_KEY, config.init_from_hf
    elif config.init_from_keras_hub:
        key, directory = KERAS_HUB_KEY, config.init_from_keras_hub
    else:
        return None
    with storage.local_copy(directory) as local:  # gs://...: a temporary copy
        model = _read_model_config(key, local)
    return Checkpoint(key, directory, os.path.join(directory, "config.json"), model)


def _read_model_config(key: str, directory: str) -> ModelConfig:
    from kroberta.interop import hf, keras_hub_presets

    if key == HF_KEY:
        return hf.model_config_from_hf(hf.read_hf_config(directory),
                                       os.path.join(directory, hf.CONFIG_FILE))
    model = keras_hub_presets.preset_model_config(directory)
    saved = os.path.join(directory, keras_hub_presets.KROBERTA_CONFIG_FILE)
    if os.path.isfile(saved):  # the attention rate keras-hub's one dropout cannot hold
        from kroberta.config import load_toml

        rate = load_toml(saved).model.attention_dropout_rate
        if rate != model.dropout:
            model = dataclasses.replace(model, attention_dropout=rate)
    return model


def with_checkpoint_model(config: Config, sources: dict | None = None,
                          checkpoint: Checkpoint | None = None) -> tuple[Config, dict]:
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
    conflicts = [name for name in WEIGHT_KEYS if name in set_by_config
                 and getattr(config.model, name) != getattr(checkpoint.model, name)]
    if conflicts:
        raise ConfigError(_conflict_message(config, checkpoint, conflicts, sources))
    taken = {name: getattr(checkpoint.model, name) for name in _model_keys()
             if name not in set_by_config}
    kept = sorted(set_by_config - set(WEIGHT_KEYS))
    for name in kept:
        if getattr(config.model, name) != getattr(checkpoint.model, name):
            logger.info("model.%s=%s (%s) replaces the checkpoint's %s", name,
                        getattr(config.model, name), _source(sources, name),
                        checkpoint.shown(name))
    if sources is not None:
        sources.update({f"model.{name}": checkpoint.config_file for name in taken})
    return dataclasses.replace(config, model=dataclasses.replace(config.model, **taken)), sources


def _model_keys() -> list[str]:
    return [f.name for f in dataclasses.fields(ModelConfig)]


def _set_by_config(config: Config, sources: dict | None) -> set[str]:
    """The model keys the config sets: those `sources` names, or without sources those
    that differ from `ModelConfig`'s defaults."""
    if sources is not None:
        return {name for name in _model_keys() if f"model.{name}" in sources}
    default = ModelConfig()
    return {name for name in _model_keys()
            if getattr(config.model, name) != getattr(default, name)}


def _source(sources: dict | None, name: str) -> str:
    return "config" if sources is None else sources.get(f"model.{name}", "default")


def _conflict_message(config: Config, checkpoint: Checkpoint, conflicts: list[str],
                      sources: dict | None) -> str:
    listed = "; ".join(f"model.{name}={getattr(config.model, name)} ({_source(sources, name)}) "
                       f"but the checkpoint has {checkpoint.shown(name)}" for name in conflicts)
    return (f"{checkpoint.key}: the config disagrees with the checkpoint {checkpoint.config_file} "
            f"on {len(conflicts)} key(s): {listed}. The model section follows the checkpoint: "
            "remove these keys from the config file and the command line")


# ---------------------------------------------------------------- tokenizer


def checkpoint_tokenizer(checkpoint: Checkpoint):
    """(the checkpoint's `tokenizers.Tokenizer` or None, the tokenizer.json file to keep
    with the run or None): HF's `tokenizer.json`, else its `vocab.json` + `merges.txt`;
    a keras-hub preset's `assets/tokenizer/` vocabulary and merges
    (`kroberta.text.tokenizer.load_tokenizer` reads them all)."""
    from kroberta.text.tokenizer import load_tokenizer, tokenizer_json_of

    if checkpoint.key == KERAS_HUB_KEY:  # its tokenizer.json is keras-hub's, not a `tokenizers` file
        from kroberta.interop.keras_hub_presets import preset_tokenizer

        with storage.local_copy(checkpoint.directory) as local:
            return preset_tokenizer(local), None
    try:
        tokenizer = load_tokenizer(checkpoint.directory)
    except InputError:
        if _has_tokenizer_files(checkpoint.directory):
            raise  # there, but unreadable or lacking a special token: say so
        return None, None
    return tokenizer, tokenizer_json_of(checkpoint.directory)


def _has_tokenizer_files(directory: str) -> bool:
    names = ("tokenizer.json", "vocab.json", os.path.join("assets", "tokenizer", "vocabulary.json"))
    return any(storage.isfile(storage.join(directory, name)) for name in names)
