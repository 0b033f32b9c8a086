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
    vocabulary_size: int = 2048
    """Token-embedding rows; must equal the tokenizer's size."""
    num_layers: int = 2
    """Transformer encoder blocks."""
    num_heads: int = 4
    """Attention heads; must divide `hidden_dim`."""
    hidden_dim: int = 128
    """Width of the residual stream."""
    intermediate_dim: int = 512
    """Width of each feed-forward block."""
    max_sequence_length: int = 16
    """Rows of the position table: the longest sequence (Hugging Face's `max_position_embeddings` =
    this + 2)."""
    dropout: float = 0.0
    """Dropout in embeddings and the residual branches (RoBERTa: 0.1), and on the attention
    weights unless `attention_dropout` is set."""
    initializer_range: float = 0.05
    """Std of the truncated-normal start of every kernel and embedding (Hugging Face's
    `initializer_range`; RoBERTa's and the shipped configs' 0.02). A small model leaves its
    bag-of-words plateau much sooner from a wider start (docs/design.md, "The default job").
    Only the start: changing it on resume changes nothing."""
    attention_dropout: float = -1.0
    """Dropout on the attention weights (Hugging Face's `attention_probs_dropout_prob`);
    `dropout` then covers only embeddings and the residual branches (`hidden_dropout_prob`).
    -1 = follow `dropout` (what one rate meant before). 0 lets attention run through
    `ops.dot_product_attention` (fused / flash kernels; `kroberta.model.attention`)."""

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
    dir: str = ""
    """A directory made by `python -m kroberta.prepare` (reads its manifest.json and checks the
    vocabulary)."""
    train: tuple[str, ...] = ()
    """TFRecord file(s) or glob(s); empty with an empty `dir` = the embedded corpus."""
    validation: tuple[str, ...] = ()
    """Held-out TFRecord file(s) or glob(s); empty = no evaluation."""
    masking: str = "dynamic"
    """"dynamic": re-mask on every read (the training step draws the masks on the device from a key
    per sequence, whole words included); "static": use the files'
    labels (the step chooses the slots from them); "auto": static when the files carry labels
    (the seed's format), dynamic when they do not (what `python -m kroberta.prepare` writes). A
    run records what "auto" became."""
    mask_rate: float = 0.15
    """Fraction of real, non-special tokens chosen for prediction (80% `<mask>`, 10% a random id,
    10% kept)."""
    max_predictions: int = 0
    """Prediction slots per sequence M (a static shape); 0 = ceil(1.25 * mask_rate * length)."""
    shuffle_buffer: int = 10_000
    """Records shuffled together (each block of an epoch in a stateless permutation)."""
    pad_token_id: int = tokens.PAD_ID
    """Id written where attention_mask is 0."""
    mask_token_id: int = tokens.MASK_ID
    """Id of `<mask>`."""
    special_token_ids: tuple[int, ...] = tokens.SPECIAL_IDS
    """Ids never chosen for masking."""
    whole_word_masking: bool = False
    """Dynamic masking chooses whole words: all tokens of a word or none (a word starts at a
    space-marked byte-level BPE token or after a special token); needs the run's tokenizer
    (`data.dir` or the embedded corpus)."""
    eval_mask_rate: float = 0.0
    """Fraction of tokens masked in evaluation (e.g. 0.15 for a run that trains at 0.3, so runs with different training rates compare on one number); 0 = `mask_rate`. Each validation example's mask is fixed by the run's seed and the example's place in the files: the same at every evaluation and on any number of processes. Dynamic masking only."""

    def evaluation_mask_rate(self) -> float:
        """The mask rate of evaluations: `eval_mask_rate`, or `mask_rate` when it is 0."""
        return self.eval_mask_rate or self.mask_rate

    def masks_drawn_by_step(self) -> bool:
        """Whether the training step draws the masks on the device from per-sequence keys
        (`kroberta.masking`): dynamic masking, whole words included (the step holds the
        tokenizer's word-start table)."""
        return self.masking in ("dynamic", AUTO)

    def with_masking_for(self, has_labels: bool) -> "DataConfig":
        """This config with "auto" masking resolved for files that do (not) carry labels."""
        if self.masking != AUTO:
            return self
        return replace(self, masking="static" if has_labels else "dynamic")

    def step_input(self) -> str | None:
        """The x entry from which the training step finishes each batch on the device
        (`kroberta.masking`): "mask_keys" when it draws dynamic masks from per-sequence
        keys, "token_labels" when it chooses the static slots from the file's labels. Where no
        files decide "auto" (ahead-of-time compilation, the advisor), it is taken as
        dynamic: the two programs differ only in one int32 input."""
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
    batch_size_per_device: int = 128
    """Sequences per device in one forward/backward pass (a micro-batch); the global batch = this x
    devices x `gradient_accumulation_steps`."""
    gradient_accumulation_steps: int = 1
    """Micro-batches per optimizer step: one update from a batch N times larger, the loss
    normalised by the masked tokens of the whole batch (`kroberta.model.accumulation`)."""
    steps: int = 1800
    """Optimizer steps in the whole run."""
    learning_rate: float = 2e-3
    """Peak learning rate, reached after the warmup."""
    warmup_steps: int = 100
    """Linear warmup from 0 to `learning_rate`, then `schedule`."""
    schedule: str = "linear"
    """After warmup: "linear" (to `min_learning_rate` at `steps`), "cosine" (half a cosine to
    `min_learning_rate` at `steps`), "constant", "inverse_sqrt" (learning_rate *
    sqrt(warmup_steps / step), fairseq's), "wsd" (warmup-stable-decay: constant, then a linear
    decay over the last `decay_steps`); `kroberta.model.schedules`."""
    weight_decay: float = 0.01
    """AdamW weight decay; never applied to biases or LayerNorm."""
    clip_norm: float = 1.0
    """Global gradient-norm clip; 0 disables."""
    adam_beta_1: float = 0.9
    """AdamW's first-moment decay (RoBERTa's value)."""
    adam_beta_2: float = 0.98
    """AdamW's second-moment decay (RoBERTa's value)."""
    adam_epsilon: float = 1e-6
    """AdamW's epsilon (RoBERTa's value)."""
    mixed_precision: bool = False
    """bf16 compute with float32 weights (use on a TPU or GPU)."""
    steps_per_execution: int | str = "auto"
    """Optimizer steps fused into one compiled program per dispatch (also evaluation and default
    prediction batches per dispatch); "auto" = enough FLOPs per dispatch to hide the host (>= 20
    ms at the devices' peak, a divisor of `log_every`, logged at start-up)."""
    log_every: int = 50
    """Steps between log lines / metrics.jsonl rows; a multiple of an integer
    `steps_per_execution`."""
    profile: str = ""
    """"START:STOP": a `jax.profiler` trace of steps START+1..STOP in run_dir/profile/, widened to
    `steps_per_execution` boundaries (`kroberta.training.profiling`); "" = none."""
    eval_every: int = 250
    """Steps between evaluations; a multiple of `log_every`; 0 = only at the end."""
    eval_steps: int = 0
    """Batches per evaluation; 0 = the whole validation set."""
    checkpoint_every: int = 250
    """Steps between checkpoints; a multiple of `log_every`."""
    keep_checkpoints: int = 2
    """Most recent checkpoints kept on disk."""
    async_checkpoints: bool = True
    """Write checkpoints in the background while training goes on; false = the step loop waits for
    every write."""
    seed: int = 0
    """Seed of the initialisation, the shuffling and the masking."""
    min_learning_rate: float = 0.0
    """The floor every decaying schedule ends at ("linear", "cosine" and "wsd" reach it at `steps`; "inverse_sqrt" never goes below it)."""
    decay_steps: int = 0
    """For `schedule = "wsd"`: the steps of the final linear decay to `min_learning_rate`; 0 = `decay_fraction` of `steps`."""
    decay_fraction: float = 0.2
    """For `schedule = "wsd"` with `decay_steps = 0`: the fraction of `steps` the final decay takes."""
    keep_best: bool = False
    """Also keep the checkpoint with the lowest validation loss beside the newest `keep_checkpoints` (needs validation data); `kroberta.load(run_dir, checkpoint="best")` loads it."""
    early_stop_patience: int = 0
    """End the run (exit 0, final model saved) after this many evaluations in a row without a new lowest validation loss; 0 = never."""
    target_eval_loss: float = 0.0
    """End the run (exit 0, final model saved) at the first evaluation whose validation loss is at or below this; 0 = never."""
    trackers: tuple[str, ...] = ("tensorboard",)
    """Where process 0 logs every metrics.jsonl row besides that file: any of "tensorboard" (run_dir/tensorboard), "wandb" (`pip install "kroberta[wandb]"`) and "mlflow" (`pip install "kroberta[mlflow]"`); kroberta.training.trackers."""
    remat: str = "none"
    """Rematerialisation per encoder block (`kroberta.model.remat`): "none" keeps every
    activation; "full" recomputes each block in the backward pass (~+25-33% FLOPs, least
    memory); "dots" keeps matmul outputs and recomputes the elementwise work;
    "dots_no_batch" keeps the weight matmuls' outputs and recomputes attention too."""

    def wsd_decay_steps(self) -> int:
        """The steps of the "wsd" schedule's final decay."""
        return self.decay_steps or round(self.decay_fraction * self.steps)


@dataclass(frozen=True)
class DistributedConfig:
    strategy: str = "data"
    """"data": weights replicated, the batch split over every device (Keras `DataParallel`).
    "fsdp": the batch split over every device, weights and optimizer state sharded over the
    "model" axis and gathered when used (the same math as "data", 1/model_parallel of the
    memory). "model": tensor parallelism: heads, MLP and embedding width split over "model"; the
    devices of one "model" group work on the same examples."""
    devices: int = 0
    """Devices to use (one process only); 0 = all that JAX sees."""
    model_parallel: int = 0
    """Size of the "model" mesh axis for fsdp/model; 0 = the devices of one host. Must divide
    num_heads, hidden_dim, intermediate_dim and the devices per host."""
    coordinator: str = ""
    """HOST:PORT of process 0 for multi-host; "" = from the environment / Cloud TPU / none."""
    num_processes: int = 0
    """Processes in the job; 0 = from the environment, 1 = a single process, never initialised."""
    process_id: int = -1
    """This process's index in [0, num_processes) (0 writes the logs); -1 = from the environment."""
    initialization_timeout: int = 300
    """Seconds to wait for every process to reach the coordinator; then an error naming the
    problem."""


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The encoder's shape and start (`[model]`)."""
    data: DataConfig = field(default_factory=DataConfig)
    """The training and validation data and their masking (`[data]`)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Optimizer, schedule, intervals and checkpoints (`[train]`)."""
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    """Devices, sharding strategy and multi-host settings (`[distributed]`)."""
    run_dir: str = "runs/default"
    """Where checkpoints, metrics.jsonl, TensorBoard events, config.toml and the final model go."""
    init_from_hf: str = ""
    """A Hugging Face RoBERTa directory to start from (continued pretraining); "" = a fresh
    start."""
    init_from_keras_hub: str = ""
    """A keras-hub RoBERTa preset directory to start from (`export --format keras-hub`, or
    keras-hub's `save_to_preset`); a backbone-only preset leaves the MLM head at its
    initialisation. At most one of the two inits."""


SECTIONS = {
    "model": ModelConfig,
    "data": DataConfig,
    "train": TrainConfig,
    "distributed": DistributedConfig,
}
TOP_LEVEL_KEYS = ("run_dir", "init_from_hf", "init_from_keras_hub")
STRATEGIES = ("data", "fsdp", "model")
AUTO = "auto"  # train.steps_per_execution: from the FLOPs and peak; data.masking: from the files
MASKINGS = ("dynamic", "static", AUTO)  # AUTO: follows the files (DataConfig.masking)
SCHEDULES = ("linear", "cosine", "constant", "inverse_sqrt", "wsd")  # kroberta.model.schedules
REMATS = ("none", "full", "dots", "dots_no_batch")  # kroberta.model.remat
FOLLOW_DROPOUT = -1.0  # model.attention_dropout: the same rate as model.dropout
TRACKERS = ("tensorboard", "wandb", "mlflow")  # kroberta.training.trackers


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
