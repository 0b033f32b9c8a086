"""One frozen configuration: TOML files, dotted command-line overrides, validation.

A config has sections `model`, `data`, `train`, `distributed` and a top-level
`run_dir`. Every field below is documented where it is declared; the defaults are
the embedded default job (`python -m kroberta.train` with no arguments).

Errors are `ConfigError`s whose message names the key and where its value came
from (a file, the command line or a manifest), so the CLI can print one line.
"""

import dataclasses
import math
import tomllib
import typing
from dataclasses import dataclass, field, replace

from kroberta import tokens
from kroberta.errors import KrobertaError


class ConfigError(KrobertaError, ValueError):
    """A configuration value is unknown, of the wrong type or impossible."""


@dataclass(frozen=True)
class ModelConfig:
    vocabulary_size: int = 2048  # token-embedding rows; must equal the tokenizer's size
    num_layers: int = 2  # transformer encoder blocks
    num_heads: int = 4  # attention heads; must divide hidden_dim
    hidden_dim: int = 128  # width of the residual stream
    intermediate_dim: int = 512  # width of each feed-forward block
    max_sequence_length: int = 16  # rows of the position table; the longest sequence
    dropout: float = 0.0  # dropout in embeddings, attention and feed-forward (RoBERTa: 0.1)
    # std of the truncated-normal start of every kernel and embedding (RoBERTa and
    # Hugging Face's `initializer_range`: 0.02). A small model leaves its bag-of-words
    # plateau much sooner from a wider start (README, "The default job").
    initializer_range: float = 0.05
    attention_dropout: float = -1.0
    """Dropout on the attention weights (Hugging Face's `attention_probs_dropout_prob`);
    `dropout` then covers only embeddings and the residual branches (`hidden_dropout_prob`).
    -1 = follow `dropout` (what one rate meant before). 0 lets attention run through
    `ops.dot_product_attention` (fused / flash kernels; kroberta.model.attention)."""

    @property
    def attention_dropout_rate(self) -> float:
        """The attention dropout in force: `attention_dropout`, or `dropout` when it is -1."""
        return self.dropout if self.attention_dropout == FOLLOW_DROPOUT else self.attention_dropout

    def trained_model(self) -> "ModelConfig":
        """What a checkpoint of this config must match: all but the start (initializer_range)."""
        return replace(self, initializer_range=ModelConfig.initializer_range)

    @property
    def head_dim(self) -> int:
        return self.hidden_dim // self.num_heads


@dataclass(frozen=True)
class DataConfig:
    dir: str = ""  # a directory made by `python -m kroberta.prepare` (reads its manifest.json)
    train: tuple[str, ...] = ()  # TFRecord file(s) or glob(s); empty with empty dir = embedded corpus
    validation: tuple[str, ...] = ()  # held-out TFRecords; empty = no evaluation
    masking: str = "dynamic"  # "dynamic": re-mask on every read; "static": use the file's labels
    mask_rate: float = 0.15  # fraction of real, non-special tokens chosen for prediction
    max_predictions: int = 0  # prediction slots per sequence (static shape); 0 = ceil(1.25 * rate * length)
    shuffle_buffer: int = 10_000  # records shuffled together (blocks of an epoch)
    pad_token_id: int = tokens.PAD_ID  # id written where attention_mask is 0 (1)
    mask_token_id: int = tokens.MASK_ID  # id of <mask> (4)
    special_token_ids: tuple[int, ...] = tokens.SPECIAL_IDS  # never chosen for masking (0-4)
    whole_word_masking: bool = False  # dynamic masking chooses whole words (needs the tokenizer)

    def masks_drawn_by_step(self) -> bool:
        """Whether the training step draws the masks on the device from per-sequence keys
        (`kroberta.model.device_masking`): dynamic masking, not of whole words (those need
        the tokenizer's word-start table and are drawn in the input pipeline)."""
        return self.masking == "dynamic" and not self.whole_word_masking

    def step_input(self) -> str | None:
        """The x entry from which the training step finishes each batch on the device
        (`kroberta.model.device_masking`): "mask_keys" when it draws dynamic masks from
        per-sequence keys, "token_labels" when it chooses the static slots from the file's
        labels, None for whole-word masks (finished in the input pipeline)."""
        if self.masking == "static":
            return "token_labels"
        return "mask_keys" if self.masks_drawn_by_step() else None

    def prediction_slots(self, sequence_length: int) -> int:
        """The fixed number of predicted positions per sequence (M)."""
        if self.max_predictions:
            return self.max_predictions
        return max(1, math.ceil(1.25 * self.mask_rate * sequence_length))


@dataclass(frozen=True)
class TrainConfig:
    batch_size_per_device: int = 128  # sequences per device per micro-batch; global = this x devices x accumulation
    # Micro-batches per optimizer step: one update from a batch N times larger, the loss
    # normalised by the masked tokens of the whole batch (kroberta.model.accumulation).
    gradient_accumulation_steps: int = 1
    steps: int = 1800  # optimizer steps in the whole run
    learning_rate: float = 2e-3  # peak learning rate, reached after warmup
    warmup_steps: int = 100  # linear warmup from 0 to learning_rate, then `schedule`
    # After warmup: "linear" (to 0 at `steps`), "cosine" (to 0 at `steps`), "constant",
    # "inverse_sqrt" (learning_rate * sqrt(warmup_steps / step)); kroberta.model.schedules.
    schedule: str = "linear"
    weight_decay: float = 0.01  # AdamW decay; never applied to biases or LayerNorm
    clip_norm: float = 1.0  # global gradient-norm clip; 0 disables
    adam_beta_1: float = 0.9
    adam_beta_2: float = 0.98  # RoBERTa's value
    adam_epsilon: float = 1e-6  # RoBERTa's value
    mixed_precision: bool = False  # bf16 compute with float32 weights
    # Optimizer steps fused into one compiled program per dispatch (also evaluation and
    # prediction batches); "auto" = enough FLOPs per dispatch to hide the host (logged).
    steps_per_execution: int | str = "auto"
    log_every: int = 50  # steps between log lines / metrics.jsonl rows
    # "START:STOP": a jax.profiler trace of steps START+1..STOP in run_dir/profile/,
    # widened to steps_per_execution boundaries (kroberta.training.profiling); "" = none.
    profile: str = ""
    eval_every: int = 250  # steps between evaluations; a multiple of log_every; 0 = only at the end
    eval_steps: int = 0  # batches per evaluation; 0 = the whole validation set
    checkpoint_every: int = 250  # steps between checkpoints; a multiple of log_every
    keep_checkpoints: int = 2  # most recent checkpoints kept on disk
    async_checkpoints: bool = True  # write checkpoints in the background while training goes on
    seed: int = 0  # initialisation, shuffling and masking
    remat: str = "none"
    """Rematerialisation per encoder block (kroberta.model.remat): "none" keeps every
    activation; "full" recomputes each block in the backward pass (~+33% FLOPs, least
    memory); "dots" keeps matmul outputs and recomputes the elementwise work;
    "dots_no_batch" keeps the weight matmuls' outputs and recomputes attention too."""


@dataclass(frozen=True)
class DistributedConfig:
    # "data": weights replicated, batch split over every device (Keras DataParallel).
    # "fsdp": batch split over every device, weights and optimizer state sharded over
    #   the "model" axis and gathered when used (same math as "data", 1/model_parallel memory).
    # "model": tensor parallelism: heads, MLP and embedding width split over "model";
    #   the devices of one "model" group work on the same examples.
    strategy: str = "data"  # "data", "fsdp" or "model" (above)
    devices: int = 0  # devices to use (one process only); 0 = all that JAX sees
    model_parallel: int = 0  # size of the "model" mesh axis for fsdp/model; 0 = devices per host
    coordinator: str = ""  # HOST:PORT of process 0 for multi-host; "" = env vars / Cloud TPU / none
    num_processes: int = 0  # processes in the job; 0 = from the environment, 1 = never initialize
    process_id: int = -1  # this process's index in [0, num_processes); -1 = from the environment
    initialization_timeout: int = 300  # seconds to wait for every process to reach the coordinator


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    run_dir: str = "runs/default"  # checkpoints, logs, the final model and config.toml go here
    init_from_hf: str = ""  # a Hugging Face RoBERTa directory to start from (continued pretraining)
    init_from_keras_hub: str = ""  # a keras-hub RoBERTa preset directory to start from


SECTIONS = {
    "model": ModelConfig,
    "data": DataConfig,
    "train": TrainConfig,
    "distributed": DistributedConfig,
}
TOP_LEVEL_KEYS = ("run_dir", "init_from_hf", "init_from_keras_hub")
STRATEGIES = ("data", "fsdp", "model")
AUTO = "auto"  # train.steps_per_execution chosen from the model's FLOPs and the devices' peak
MASKINGS = ("dynamic", "static")
SCHEDULES = ("linear", "cosine", "constant", "inverse_sqrt")  # kroberta.model.schedules
REMATS = ("none", "full", "dots", "dots_no_batch")  # kroberta.model.remat
FOLLOW_DROPOUT = -1.0  # model.attention_dropout: the same rate as model.dropout


def _field_types(cls) -> dict[str, object]:
    return typing.get_type_hints(cls)


def _coerce(value, expected, key: str, source: str):
    """Checks `value` against the annotation `expected`, with the few safe coercions."""
    where = f"{source}: {key}"
    if expected is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if expected is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)  # 1e4 written for 10000
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if expected is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if expected == (int | str):  # a count, or the one word "auto"
        if isinstance(value, str) and value == AUTO:
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected an integer or \"{AUTO}\", got {value!r}")
    if expected is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    if typing.get_origin(expected) is tuple:
        (item_type,) = {a for a in typing.get_args(expected) if a is not Ellipsis}
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            value = [value]  # one file or one id needs no brackets
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return tuple(_coerce(v, item_type, key, source) for v in value)
    raise AssertionError(f"unsupported annotation {expected} for {key}")


def _apply(config: Config, updates: dict, source: str) -> Config:
    """Returns `config` with a nested dict of updates applied, checking every key."""
    top = {}
    sections = {}
    for name, value in updates.items():
        if name in TOP_LEVEL_KEYS:
            top[name] = _coerce(value, str, name, source)
        elif name in SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: {name}: expected a [{name}] section")
            cls = SECTIONS[name]
            types = _field_types(cls)
            changes = {}
            for key, item in value.items():
                dotted = f"{name}.{key}"
                if key not in types:
                    known = ", ".join(types)
                    raise ConfigError(f"{source}: unknown key {dotted!r} (known: {known})")
                changes[key] = _coerce(item, types[key], dotted, source)
            sections[name] = dataclasses.replace(getattr(config, name), **changes)
        else:
            known = ", ".join([*SECTIONS, *TOP_LEVEL_KEYS])
            raise ConfigError(f"{source}: unknown key {name!r} (known: {known})")
    return dataclasses.replace(config, **sections, **top)


def apply_dict(config: Config, updates: dict, source: str) -> Config:
    """Applies nested updates ({"train": {"steps": 100}}), checking every key; errors
    name the key and `source`."""
    return _apply(config, updates, source)


def load_toml(path: str, base: Config | None = None) -> Config:
    """Reads a TOML file over `base` (the defaults when None)."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    return _apply(base or Config(), data, path)


def _parse_override_value(text: str):
    # TOML syntax gives numbers, booleans and lists; anything else is a plain
    # string, so `--data.train=data/*.tfrecords` needs no quotes.
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(config: Config, overrides: list[str]) -> Config:
    """Applies `section.key=value` strings (the `--` already stripped)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"command line: expected --section.key=value, got --{item}")
        dotted, text = item.split("=", 1)
        parts = dotted.split(".")
        value = _parse_override_value(text)
        if len(parts) == 1:
            update = {parts[0]: value}
        elif len(parts) == 2:
            update = {parts[0]: {parts[1]: value}}
        else:
            raise ConfigError(f"command line: {dotted!r}: expected section.key")
        config = _apply(config, update, "command line")
    return config


def validate(config: Config, source: str | dict = "config") -> Config:
    """Rejects impossible settings with a message naming the key and its source.

    `source` is one name for every key, or a dict {dotted key: where it was set}
    (see `sources`); keys missing from the dict were left at their defaults. The
    rules are in `kroberta.config_checks`.
    """
    from kroberta.config_checks import validate as check

    return check(config, source)


def from_command_line(config_path: str | None, rest: list[str]) -> tuple["Config", dict]:
    """The config a tool's command line describes: `--config NAME_OR_FILE` (a shipped
    config's name or a TOML file) plus the leftover `--section.key=value` arguments;
    returns (config, sources for error messages)."""
    from kroberta.named_configs import resolve

    config_path = resolve(config_path) if config_path else None
    overrides = []
    for item in rest:
        if not item.startswith("--"):
            raise ConfigError(f"command line: unexpected argument {item!r}")
        overrides.append(item[2:])
    config = load_toml(config_path) if config_path else Config()
    return apply_overrides(config, overrides), sources(config_path, overrides)


def sources(config_path: str | None, overrides: list[str]) -> dict:
    """{dotted key: where its value came from}, for error messages."""
    found = {}
    if config_path:
        with open(config_path, "rb") as f:
            data = tomllib.load(f)
        for name, value in data.items():
            if isinstance(value, dict):
                found.update({f"{name}.{k}": config_path for k in value})
            else:
                found[name] = config_path
    for item in overrides:
        found[item.split("=", 1)[0]] = "command line"
    return found


def to_dict(config: Config) -> dict:
    """The config as plain TOML-able data (tuples become lists)."""
    def plain(v):
        return list(v) if isinstance(v, tuple) else v

    out = {key: getattr(config, key) for key in TOP_LEVEL_KEYS}
    for name in SECTIONS:
        section = getattr(config, name)
        out[name] = {f.name: plain(getattr(section, f.name)) for f in dataclasses.fields(section)}
    return out


def to_toml(config: Config) -> str:
    import tomli_w

    return tomli_w.dumps(to_dict(config))


def from_dict(data: dict, source: str) -> Config:
    return _apply(Config(), data, source)
