"""One frozen configuration: its sections and their checks, TOML files, shipped names, overrides.

A config has sections `model`, `data`, `train`, `distributed` and top-level keys. Every
field is documented where it is declared (the single source of docs/reference/config.md,
written by `tools/gen_config_reference.py`); the defaults are the embedded default job
(`python -m kroberta.train` with no arguments). Each section's `check` rejects its own
impossible values and `Config.check` the impossible combinations of sections; the checks
that need the device count are in `kroberta.parallel.distribute`.

The shipped configs live in `kroberta/configs/*.toml` (package data, so any install has
them): `--config seed`, `load_config("seed")`; any other value is the path of a TOML file.

Errors are `ConfigError`s whose message names the key and where its value came
from (a file, the command line, `overrides` or a manifest), so the CLI can print one line.
"""

import dataclasses
import difflib
import importlib.resources
import math
import numbers
import operator
import os
import re
import tomllib
import typing
from dataclasses import dataclass, field, replace

import tomli_w

from kroberta import tokens
from kroberta.errors import ConfigError

# The words some fields accept.
AUTO = "auto"  # train.steps_per_execution: from the FLOPs and peak; data.masking: from the files
FOLLOW_DROPOUT = -1.0  # model.attention_dropout: the same rate as model.dropout
MASKINGS = ("dynamic", "static", AUTO)  # AUTO: follows the files (DataConfig.masking)
SCHEDULES = ("linear", "cosine", "constant", "inverse_sqrt", "wsd")  # kroberta.model.schedules
REMATS = ("none", "full", "dots", "dots_no_batch")  # kroberta.model.remat
TRACKERS = ("tensorboard", "wandb", "mlflow")  # kroberta.training.trackers
STRATEGIES = ("data", "fsdp", "model")
DOWNSTREAM_KEYS = ("task", "data", "validation", "text_fields", "label_field", "kind")


# A bound as its message writes it: ">= 1", "> 0", "in (0, 1]", "in [0, 1) (a note)".
_BOUND = re.compile(r"(?:in )?([\[(]|>=?) ?(-?[\d.]+)(?:, (-?[\d.]+)([\])]))?")
_ABOVE = {">=": operator.ge, "[": operator.ge, ">": operator.gt, "(": operator.gt}
_BELOW = {"]": operator.le, ")": operator.lt}


def _check_values(section, fail, rules: dict):
    """The `check` of fields with a fixed range or set of words: {"key other_key": rule},
    the rule a tuple of the words allowed or a bound (`_BOUND`)."""
    for keys, rule in rules.items():
        for key in keys.split():
            value = getattr(section, key)
            if isinstance(rule, tuple):
                if value not in rule:
                    fail(key, f"must be one of {rule}, got {value!r}")
                continue
            lower, low, high, upper = _BOUND.match(rule).groups()
            if not (
                _ABOVE[lower](value, float(low))
                and (high is None or _BELOW[upper](value, float(high)))
            ):
                fail(key, f"must be {rule}, got {value}")


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
    layer_norm_epsilon: float = 1e-5
    """The epsilon of every layer norm (Hugging Face's `layer_norm_eps`): RoBERTa's and keras-hub's
    1e-5; `transformers`' `RobertaConfig()` default is 1e-12."""

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

    def check(self, fail):
        """Rejects an impossible shape or rate: `fail(key, problem)` raises."""
        _check_values(
            self,
            fail,
            {
                "vocabulary_size num_layers num_heads hidden_dim intermediate_dim "
                "max_sequence_length": ">= 1",
                "dropout": "in [0, 1)",
                "initializer_range": "in (0, 1]",
                "layer_norm_epsilon": "in (0, 1)",
            },
        )
        if self.hidden_dim % self.num_heads:
            fail("num_heads", f"{self.num_heads} heads do not divide hidden_dim={self.hidden_dim}")
        if self.attention_dropout != FOLLOW_DROPOUT and not 0.0 <= self.attention_dropout < 1.0:
            fail(
                "attention_dropout",
                f"must be in [0, 1) or -1 (follow model.dropout), got {self.attention_dropout}",
            )

    def check_model_axis(self, size: int, fail):
        """A "model" mesh axis of `size` must divide every dimension the layouts shard;
        `fail(problem)` raises."""
        for key in ("num_heads", "hidden_dim", "intermediate_dim"):
            if getattr(self, key) % size:
                fail(f"a model axis of {size} does not divide model.{key}={getattr(self, key)}")


@dataclass(frozen=True)
class DataConfig:
    dir: str = ""
    """A directory made by `python -m kroberta.prepare` (reads its manifest.json and checks the
    vocabulary)."""
    train: tuple[str, ...] = ()
    """TFRecord file(s) or glob(s); empty with an empty `dir` = the embedded corpus. With `dir`,
    leave it empty: the directory names its own files."""
    validation: tuple[str, ...] = ()
    """Held-out TFRecord file(s) or glob(s); empty = no evaluation."""
    masking: str = "dynamic"
    """"dynamic": re-mask on every read (the training step draws the masks on the device from a key
    per sequence, whole words included); "static": use the files'
    labels (the step chooses the slots from them); "auto": static when the files carry labels
    (the seed's format), dynamic when they do not (what `python -m kroberta.prepare` writes). A
    run records what "auto" became."""
    mask_rate: float = 0.3
    """Fraction of real, non-special tokens chosen for prediction (80% `<mask>`, 10% a random id,
    10% kept); RoBERTa's is 0.15, MosaicBERT's 0.3 (docs/benchmarks/downstream.md)."""
    max_predictions: int = 0
    """Prediction slots per sequence M (a static shape); 0 = follow the sequence length L: ceil(1.25 * mask_rate * L), and for static labels (a binomial count) at least ceil(mask_rate * L + 2 * sqrt(L * mask_rate * (1 - mask_rate))). A value below what `mask_rate` needs caps the masks; training names the rate it then masks."""
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

    def with_masking_for(self, has_labels: bool) -> "DataConfig":
        """This config with "auto" masking resolved for files that do (not) carry labels."""
        if self.masking != AUTO:
            return self
        return replace(self, masking="static" if has_labels else "dynamic")

    def step_input(self) -> str:
        """The x entry from which the training step finishes each batch on the device
        (`kroberta.masking`): "mask_keys" when it draws dynamic masks from per-sequence
        keys, "token_labels" when it chooses the static slots from the file's labels. Where no
        files decide "auto" (ahead-of-time compilation, the advisor), it is taken as
        dynamic: the two programs differ only in one int32 input."""
        return "token_labels" if self.masking == "static" else "mask_keys"

    def prediction_slots(self, sequence_length: int) -> int:
        """The fixed number of predicted positions per sequence (M)."""
        if self.max_predictions:
            return self.max_predictions
        slots = max(1, math.ceil(1.25 * self.mask_rate * sequence_length))
        if self.masking == "static":  # two standard deviations above the mean label count
            spread = math.sqrt(sequence_length * self.mask_rate * (1 - self.mask_rate))
            slots = max(slots, math.ceil(self.mask_rate * sequence_length + 2 * spread))
        return slots

    def capped_masking(self, sequence_length: int) -> str | None:
        """What a run masks when an explicit `max_predictions` is below what dynamic masking
        at `mask_rate` needs in a full sequence of `sequence_length` tokens (its `<s>` and
        `</s>` are never masked); None when nothing is capped (static labels are counted
        against the slots from the files instead)."""
        tokens = sequence_length - 2
        wanted = max(1, round(self.mask_rate * tokens))
        if self.masking == "static" or not self.max_predictions or self.max_predictions >= wanted:
            return None
        auto = replace(self, max_predictions=0).prediction_slots(sequence_length)
        return (
            f"data.max_predictions={self.max_predictions} caps the masks at {self.max_predictions} of "
            f"{tokens} tokens in a full sequence of {sequence_length}: {self.max_predictions / tokens:.1%} "
            f"masked, not data.mask_rate={self.mask_rate:g} ({wanted} tokens); set "
            f"data.max_predictions=0 (follows the sequence length: {auto} here) or at least {wanted}"
        )

    def check(self, fail):
        """Rejects an impossible masking setting: `fail(key, problem)` raises. The ids and
        `max_predictions` depend on the model (`Config.check`)."""
        _check_values(
            self,
            fail,
            {
                "masking": MASKINGS,
                "mask_rate": "in (0, 1]",
                "shuffle_buffer": ">= 1",
                "eval_mask_rate": "in [0, 1] (0 = data.mask_rate)",
            },
        )
        if self.whole_word_masking and self.masking != "dynamic":
            fail(
                "whole_word_masking", "needs data.masking='dynamic' (static labels are the file's)"
            )
        if self.eval_mask_rate and self.masking == "static":
            fail(
                "eval_mask_rate",
                "static masking evaluates the files' own labels; "
                'set data.masking = "dynamic" or leave data.eval_mask_rate at 0',
            )


@dataclass(frozen=True)
class TrainConfig:
    batch_size_per_device: int = 128
    """Sequences per device in one forward/backward pass (a micro-batch); the global batch = this x
    devices x `gradient_accumulation_steps`."""
    gradient_accumulation_steps: int = 1
    """Micro-batches per optimizer step: one update from a batch N times larger, the loss
    normalised by the masked tokens of the whole batch (`kroberta.model.masked_lm.micro_batches`)."""
    steps: int = 1800
    """Optimizer steps in the whole run; with `time_budget`, leave it out: the budget sets it."""
    time_budget: str = ""
    """The run's wall-clock length ("90s", "15m", "2h", "1h30m"; "" = off, `steps` counts): a few
    measured steps fix `steps` so that the schedule (warmup and decay) ends at the budget, from
    the start of training, start-up and compilation included (Cramming's budget-defined schedule;
    `kroberta.training.time_budget`). The run records the steps it fixed and a resumed run uses
    them."""
    learning_rate: float = 2e-3
    """Peak learning rate, reached after the warmup."""
    warmup_steps: int = 0
    """Steps of the linear warmup from 0 to `learning_rate`, then `schedule`; used when
    `warmup_fraction` is 0."""
    warmup_fraction: float = 0.5
    """The warmup as a fraction of `steps` (round(warmup_fraction * steps) steps), so it follows the
    run's length: 0.5 with "linear" is Cramming's one-cycle (the peak mid-run, `min_learning_rate`
    at `steps`); 0 = `warmup_steps`. Set one of the two, the other to 0."""
    schedule: str = "linear"
    """After warmup: "linear" (to `min_learning_rate` at `steps`), "cosine" (half a cosine to
    `min_learning_rate` at `steps`), "constant", "inverse_sqrt" (learning_rate *
    sqrt(warmup / step), fairseq's), "wsd" (warmup-stable-decay: constant, then a linear
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
    downstream: dict = field(default_factory=dict)
    """A linear probe at every checkpoint (and with the validation row a run logs at its start):
    ridge regression on the frozen model's pooled embeddings of a labelled task, logged as
    `downstream/<task>/<metric>` (`kroberta.pretraining.probe`). "stdlib" (the embedded task:
    `--train.downstream=stdlib`), or a table `[train.downstream]` with `data` and `validation`
    (labelled files, as `kroberta.finetune` reads them) and optionally `text_fields` (one field
    or a pair; ["text"]), `label_field` ("label"), `kind` ("classification" or "regression")
    and `task` (its name in the metrics; the training file's stem), or `task = "glue/<name>"`
    with `data` = the GLUE directory. {} = off. Needs the run's tokenizer and a single process."""

    def effective_warmup_steps(self) -> int:
        """The steps of the warmup: `warmup_steps`, or `warmup_fraction` of `steps` when set."""
        return (
            round(self.warmup_fraction * self.steps) if self.warmup_fraction else self.warmup_steps
        )

    def wsd_decay_steps(self) -> int:
        """The steps of the "wsd" schedule's final decay."""
        return self.decay_steps or round(self.decay_fraction * self.steps)

    def check(self, fail):
        """Rejects an impossible schedule, interval or signal: `fail(key, problem)` raises."""
        _check_values(
            self,
            fail,
            {
                "batch_size_per_device gradient_accumulation_steps steps log_every keep_checkpoints": ">= 1",
                "warmup_steps eval_every eval_steps checkpoint_every": ">= 0",
                "learning_rate": "> 0",
                "remat": REMATS,
                "schedule": SCHEDULES,
                "weight_decay clip_norm": ">= 0",
                "decay_fraction": "in (0, 1]",
                "warmup_fraction": "in [0, 1) (0 = train.warmup_steps)",
                "early_stop_patience target_eval_loss": ">= 0 (0 = never)",
            },
        )
        if self.time_budget:
            try:
                parse_duration(self.time_budget)
            except ValueError as error:
                fail("time_budget", str(error))
        try:
            window = parse_window(self.profile)
        except ValueError as error:
            fail("profile", str(error))
        if window and window[0] >= self.steps:
            fail(
                "profile",
                f"starts at step {window[0]}, but the run ends at train.steps={self.steps}",
            )
        if self.warmup_steps and self.warmup_fraction:
            fail(
                "warmup_fraction",
                f"train.warmup_steps={self.warmup_steps} and train.warmup_fraction="
                f"{self.warmup_fraction:g} both set the warmup: set one, the other to 0 "
                f"(--train.warmup_fraction=0 counts it in steps)",
            )
        warmup = self.effective_warmup_steps()
        if warmup > self.steps:  # a fraction below 1 never exceeds: only warmup_steps can
            fail(
                "warmup_steps",
                f"{warmup} exceeds train.steps={self.steps}; "
                "set a smaller train.warmup_steps or more train.steps",
            )
        self._check_intervals(fail)
        if not 0.0 <= self.min_learning_rate <= self.learning_rate:
            fail(
                "min_learning_rate",
                f"must be in [0, train.learning_rate={self.learning_rate}], got {self.min_learning_rate}",
            )
        if not 0 <= self.decay_steps <= self.steps - warmup:
            set_by = (
                "round(train.warmup_fraction * train.steps)"
                if self.warmup_fraction
                else "train.warmup_steps"
            )
            fail(
                "decay_steps",
                f"must be in [0, train.steps - {set_by} = "
                f"{self.steps - warmup}], got {self.decay_steps}",
            )
        for name in self.trackers:
            if name not in TRACKERS:
                fail("trackers", f"unknown tracker {name!r}; choose from {TRACKERS}")
        if len(set(self.trackers)) != len(self.trackers):
            fail("trackers", f"names a tracker twice: {list(self.trackers)}")
        if self.downstream:
            self._check_downstream(lambda problem: fail("downstream", problem))

    def _check_intervals(self, fail):
        """Logs, evaluations and checkpoints happen between dispatches of K fused steps;
        evaluations and checkpoints at log boundaries (the metrics complete, the state on the host)."""
        k = self.steps_per_execution
        if k != AUTO and k < 1:
            fail("steps_per_execution", f'must be >= 1 or "{AUTO}", got {k}')
        for key in ("log_every", "eval_every", "checkpoint_every"):
            every = getattr(self, key)
            if every % self.log_every:  # log_every itself always passes
                fail(key, f"{every} is not a multiple of train.log_every={self.log_every}")
            if k != AUTO and every % k:
                fail(
                    key,
                    f"{every} is not a multiple of train.steps_per_execution={k} (steps "
                    "fused per dispatch); change one of them",
                )

    def _check_downstream(self, fail):
        """`downstream`: "stdlib", a GLUE task and its directory, or a labelled file pair."""
        d = self.downstream
        if set(d) - set(DOWNSTREAM_KEYS):
            fail(
                f"unknown key(s) {', '.join(sorted(set(d) - set(DOWNSTREAM_KEYS)))}; "
                f"known: {', '.join(DOWNSTREAM_KEYS)}"
            )
        for key, value in d.items():
            texts = value if key == "text_fields" and isinstance(value, list) else [value]
            if not 1 <= len(texts) <= (2 if key == "text_fields" else 1) or not all(
                isinstance(t, str) and t for t in texts
            ):
                fail(
                    f"{key} = {value!r}: expected a non-empty string"
                    + (" or a list of two" if key == "text_fields" else "")
                )
        if d.get("kind", "classification") not in ("classification", "regression"):
            fail(f'kind = {d["kind"]!r}: expected "classification" or "regression"')
        glue = d.get("task", "").lower().startswith("glue/")
        if not ("data" in d and (glue or "validation" in d)) and (
            glue or d.get("task") != "stdlib"
        ):
            fail(
                f'expected "stdlib", a table with data and validation (labelled files), or '
                f'task = "glue/<name>" with data (the GLUE directory); got {d!r}'
            )


def parse_window(text: str) -> tuple[int, int] | None:
    """`train.profile`'s "START:STOP" -> (START, STOP); "" -> None. Raises ValueError
    saying what is wrong."""
    if not text:
        return None
    parts = text.split(":")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f'expected "START:STOP" (two step numbers, e.g. "100:120"), got {text!r}')
    start, stop = (int(p) for p in parts)
    if start >= stop:
        raise ValueError(f"START must be below STOP, got {text!r}")
    return start, stop


# "1h30m", "15m", "90s": hours, minutes and seconds in that order, each at most once.
_DURATION = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


def parse_duration(text: str) -> int:
    """`train.time_budget`'s "1h30m" -> 5400 (seconds). Raises ValueError saying what is wrong."""
    match = _DURATION.fullmatch(text.strip())
    if not text.strip() or match is None:
        raise ValueError(f"{text!r} is not a duration; write 90s, 15m, 2h or 1h30m")
    hours, minutes, seconds = (int(part or 0) for part in match.groups())
    total = 3600 * hours + 60 * minutes + seconds
    if total <= 0:
        raise ValueError(f"{text!r} is no time at all; write 90s, 15m, 2h or 1h30m")
    return total


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

    def check(self, fail):
        """Rejects an impossible strategy or process setting: `fail(key, problem)` raises."""
        _check_values(
            self,
            fail,
            {
                "strategy": STRATEGIES,
                "initialization_timeout": ">= 1",
                "devices model_parallel num_processes": ">= 0",
            },
        )
        if self.process_id < -1 or (self.num_processes and self.process_id >= self.num_processes):
            fail(
                "process_id",
                f"must be -1 (auto) or in [0, num_processes="
                f"{self.num_processes or 'auto'}), got {self.process_id}",
            )
        if self.coordinator and not re.fullmatch(r"\[?[\w.:-]+\]?:\d+", self.coordinator):
            fail("coordinator", f"expected HOST:PORT, got {self.coordinator!r}")


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

    def with_section(self, name: str, **changes) -> "Config":
        """This config with `changes` made in its section `name` ("model", "data", "train"
        or "distributed"); not validated."""
        return replace(self, **{name: replace(getattr(self, name), **changes)})

    def check(self, fail):
        """Each section's check, then the combinations of sections: `fail(dotted key,
        problem)` raises."""
        for name in SECTIONS:
            getattr(self, name).check(
                lambda key, problem, name=name: fail(f"{name}.{key}", problem)
            )
        m, d, dist = self.model, self.data, self.distributed
        if not 0 <= d.max_predictions <= m.max_sequence_length:
            fail(
                "data.max_predictions",
                f"must be in [0, max_sequence_length={m.max_sequence_length}], got {d.max_predictions}",
            )
        for key in ("pad_token_id", "mask_token_id"):
            if not 0 <= getattr(d, key) < m.vocabulary_size:
                fail(
                    f"data.{key}",
                    f"{getattr(d, key)} is outside the vocabulary [0, {m.vocabulary_size})",
                )
        if dist.model_parallel > 1 and dist.strategy == "data":
            fail(
                "distributed.model_parallel",
                f"{dist.model_parallel} has no effect with distributed.strategy='data' (every "
                "device holds the whole model); set distributed.strategy to 'fsdp' or 'model', "
                "or leave model_parallel at 0",
            )
        if dist.model_parallel and dist.strategy in ("fsdp", "model"):
            m.check_model_axis(
                dist.model_parallel, lambda problem: fail("distributed.model_parallel", problem)
            )
        if not self.run_dir:
            fail("run_dir", "must not be empty")
        if self.init_from_hf and self.init_from_keras_hub:
            fail("init_from_keras_hub", "set init_from_hf or init_from_keras_hub, not both")


SECTIONS = {
    "model": ModelConfig,
    "data": DataConfig,
    "train": TrainConfig,
    "distributed": DistributedConfig,
}
TOP_LEVEL_KEYS = ("run_dir", "init_from_hf", "init_from_keras_hub")


def validate(config: Config, source: str | dict = "config") -> Config:
    """Returns `config`, or raises ConfigError naming an impossible setting's key and source.

    `source` is one name for every key, or a dict {dotted key: where it was set}
    (`from_command_line` returns one); keys missing from it were left at their defaults.
    """

    def source_of(key):
        return source.get(key, "default") if isinstance(source, dict) else source

    def fail(key, problem):
        # A combination that fails may have been made by another key set elsewhere
        # (train.steps on the command line against a file's train.warmup_steps): the
        # keys the problem names are named with their sources too.
        # A key left at its default is named by the source of the key that was set.
        where = source_of(key)
        named = dict.fromkeys(re.findall(rf"\b(?:{'|'.join(SECTIONS)})\.\w+", problem))
        others = [other for other in named if other != key and source_of(other) != "default"]
        if where == "default" and others:
            where, key = source_of(others[0]), f"{key} (at its default)"
        also = "".join(
            f" ({other} from {source_of(other)})" for other in others if source_of(other) != where
        )
        raise ConfigError(f"{where}: {key}: {problem}{also}")

    if not isinstance(config, Config):
        raise ConfigError(
            f"expected a kroberta Config (kroberta.load_config(name, overrides)), "
            f"got {type(config).__name__}"
        )
    config = _typed(config, source_of)
    config.check(fail)
    if (
        isinstance(source, dict)
        and config.train.time_budget
        and "train.steps" in source
        and _precedence(source["train.steps"]) >= _precedence(source.get("train.time_budget"))
    ):
        # A budget on the command line overrides a file's steps (tiny.toml's, a run's
        # config.toml's), and steps there turn a file's budget off (`_closer_setting_wins`):
        # both given in one place conflict.
        fail(
            "train.steps",
            f"{config.train.steps} and train.time_budget="
            f"{config.train.time_budget!r} both set the run's length: set one (leave "
            "train.steps out and the budget fixes it; --train.time_budget='' counts the run "
            "in steps)",
        )
    return config


def _precedence(source: str | None) -> int:
    """Which of two sources wins: the command line and `overrides` over a file."""
    return 1 if source in ("command line", OVERRIDES) else 0


def _typed(config: Config, source_of) -> Config:
    """`config` with every value of its field's type: a `dataclasses.replace` can put in
    anything (a Path, one string for a list, a numpy integer), which `_coerce` converts
    where that is safe and refuses, naming the key, where it is not."""
    sections = {}
    for name, section_type in SECTIONS.items():
        section = getattr(config, name)
        if not isinstance(section, section_type):
            raise ConfigError(
                f"{source_of(name)}: {name}: expected a {section_type.__name__} "
                f"(the config's own .{name}, changed with dataclasses.replace), "
                f"got {type(section).__name__}"
            )
        types = typing.get_type_hints(section_type)
        sections[name] = replace(
            section,
            **{
                key: _coerce(
                    getattr(section, key), types[key], f"{name}.{key}", source_of(f"{name}.{key}")
                )
                for key in types
            },
        )
    top = {key: _coerce(getattr(config, key), str, key, source_of(key)) for key in TOP_LEVEL_KEYS}
    return replace(config, **sections, **top)


def _coerce(value, expected, key: str, source: str):
    """`value` as the annotation `expected` takes it, with the few safe coercions."""
    if typing.get_origin(expected) is tuple:
        (item_type,) = {a for a in typing.get_args(expected) if a is not Ellipsis}
        if isinstance(value, (str, os.PathLike, numbers.Integral)) and not isinstance(value, bool):
            value = [value]  # one file or one id needs no brackets
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{source}: {key}: expected a list, got {value!r}")
        return tuple(_coerce(v, item_type, key, source) for v in value)
    # numbers.Real: numpy's scalars too (np.int64(50) is not an int).
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    integer = number and (isinstance(value, numbers.Integral) or float(value).is_integer())
    if (expected is bool and isinstance(value, bool)) or (
        expected is str and isinstance(value, str)
    ):
        return value
    if expected is str and isinstance(value, os.PathLike):
        return os.fspath(value)
    if expected is int and integer:
        return int(value)  # 1e4 written for 10000
    if expected is float and number:
        return float(value)
    if expected == (int | str) and (
        value == AUTO or (number and isinstance(value, numbers.Integral))
    ):
        return value if isinstance(value, str) else int(value)  # a count, or the word "auto"
    if expected is dict and isinstance(value, (str, dict)):  # a table; a word is its "task"
        return dict(value) if isinstance(value, dict) else ({"task": value} if value else {})
    wanted = {
        bool: "true or false",
        int: "an integer",
        float: "a number",
        str: "a string",
        int | str: f'an integer or "{AUTO}"',
        dict: "a table or a task's name",
    }[expected]
    raise ConfigError(f"{source}: {key}: expected {wanted}, got {value!r}")


def apply_dict(config: Config, updates: dict, source: str) -> Config:
    """`config` with `updates` applied, checking every key and type; errors name the key
    and `source`.

    Keys are a section with a dict ({"train": {"steps": 100}}, as a TOML file reads),
    a dotted "section.key" ({"train.steps": 100}, as overrides are given) or a top-level key.
    """
    top, sections = {}, {}
    for name, value in updates.items():
        if not isinstance(name, str):
            raise ConfigError(f"{source}: keys are 'section.key' strings, got {name!r}")
        if "." in name:
            section, key = name.split(".", 1)
            if "." in key:
                raise ConfigError(f"{source}: {name!r}: expected 'section.key' or a top-level key")
            name, value = section, {key: value}
        if name in TOP_LEVEL_KEYS:
            top[name] = _coerce(value, str, name, source)
        elif name in SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: {name}: expected a [{name}] section")
            types = typing.get_type_hints(SECTIONS[name])
            changes = {}
            for key, item in value.items():
                if key not in types:
                    where = (
                        f" (a top-level key: {key}, above any [section] in a file)"
                        if key in TOP_LEVEL_KEYS
                        else f"{_did_you_mean(key, types, name + '.')} (known: {', '.join(types)})"
                    )
                    raise ConfigError(f"{source}: unknown key {f'{name}.{key}'!r}{where}")
                changes[key] = _coerce(item, types[key], f"{name}.{key}", source)
            sections[name] = replace(sections.get(name, getattr(config, name)), **changes)
        else:
            known = [*SECTIONS, *TOP_LEVEL_KEYS]
            raise ConfigError(
                f"{source}: unknown key {name!r}{_did_you_mean(name, known)} "
                f"(known: {', '.join(known)})"
            )
    return replace(config, **sections, **top)


def _did_you_mean(key: str, known, prefix: str = "") -> str:
    """`: did you mean 'train.steps'?` for the known key closest to a misspelt one, or ""."""
    close = difflib.get_close_matches(key, list(known), n=1)
    return f": did you mean {prefix + close[0]!r}?" if close else ""


def _read_toml(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None


def load_toml(path: str) -> Config:
    """The defaults with a TOML file's values (not validated)."""
    return apply_dict(Config(), _read_toml(path), path)


def _parse_overrides(items: list[str]) -> dict:
    """`section.key=value` strings (the `--` stripped) -> {"section.key": value}."""
    values = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"command line: expected --section.key=value, got --{item}")
        dotted, text = item.split("=", 1)
        # TOML syntax gives numbers, booleans and lists; anything else is a plain
        # string, so `--data.train=data/*.tfrecords` needs no quotes.
        try:
            values[dotted] = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            values[dotted] = text
    return values


def apply_overrides(config: Config, overrides: list[str]) -> Config:
    """Applies `section.key=value` strings (the `--` already stripped)."""
    return apply_dict(config, _parse_overrides(overrides), "command line")


_NAME = re.compile(r"^[A-Za-z0-9_-]+$")  # no "/" and no ".": cannot be meant as a path
OVERRIDES = "overrides"  # how errors name the values given to load_config


def _shipped_dir():
    return importlib.resources.files("kroberta") / "configs"


def shipped_names() -> list[str]:
    """The shipped configs' names, sorted: ["base", "seed", "tiny"]."""
    return sorted(
        entry.name[: -len(".toml")]
        for entry in _shipped_dir().iterdir()
        if entry.name.endswith(".toml")
    )


def config_path(name_or_path: str | os.PathLike) -> str:
    """The TOML file a `--config` value means: a shipped config's name, else a path (a
    run directory: its config.toml, the config it ran with).

    Raises ConfigError naming the value and listing the shipped names when neither
    a shipped config nor a file of that name exists.
    """
    if isinstance(name_or_path, os.PathLike):
        name_or_path = os.fspath(name_or_path)
    if not isinstance(name_or_path, str):
        raise ConfigError(
            f"config: expected a shipped config's name or a TOML file's path, got "
            f"{type(name_or_path).__name__}"
        )
    if _NAME.match(name_or_path):
        shipped = _shipped_dir() / f"{name_or_path}.toml"
        if shipped.is_file():
            return str(shipped)
    if os.path.isfile(name_or_path):
        return name_or_path
    if os.path.isfile(os.path.join(name_or_path, "config.toml")):
        return os.path.join(name_or_path, "config.toml")
    raise ConfigError(
        f"config {name_or_path!r}: neither a shipped config ({', '.join(shipped_names())}) nor "
        "a file; give one of those names, the path of a TOML file or a run directory"
    )


def _load(name_or_path: str | None, values: dict, source: str) -> tuple[Config, dict]:
    """The config of a shipped name or TOML file (None: the defaults) with `values` from
    `source` applied, and {dotted key: where its value came from} for error messages."""
    path = config_path(name_or_path) if name_or_path else None
    data = _read_toml(path) if path else {}
    found = {}
    for name, value in data.items():
        found.update(
            dict.fromkeys(
                [f"{name}.{k}" for k in value] if isinstance(value, dict) else [name], path
            )
        )
    if path and _recorded_budget_run(path, data):
        del found["train.steps"]  # the steps its budget fixed: derived, not given beside it
    found.update(dict.fromkeys(values, source))
    config = apply_dict(apply_dict(Config(), data, path), values, source)
    return _closer_setting_wins(config, found), found


# Pairs of keys that set one quantity two ways, and the value that turns each off.
RIVALS = (("train.warmup_steps", "train.warmup_fraction"), ("train.steps", "train.time_budget"))
OFF = {"train.warmup_steps": 0, "train.warmup_fraction": 0.0, "train.time_budget": ""}


def _closer_setting_wins(config: Config, found: dict) -> Config:
    """Where two keys set one quantity (the warmup in steps or as a fraction; the run's
    length in steps or in time), the one given closer to the run wins, as Hugging Face's
    `warmup_steps` overrides `warmup_ratio`: the command line or `overrides` over a file,
    a file over the defaults. The other is turned off, and `found` says which decided
    (the run's config.toml then holds only the winner). Both given in the same place stay
    both set, for `validate` to refuse naming both. (A budget that beats a file's steps
    keeps them: the budget replaces them when the run starts.)"""
    for pair in RIVALS:
        ranks = [_precedence(found[key]) + 1 if key in found else 0 for key in pair]
        if ranks[0] == ranks[1]:
            continue
        winner, loser = pair if ranks[0] > ranks[1] else pair[::-1]
        if loser not in OFF:
            continue
        section, name = loser.split(".")
        if getattr(getattr(config, section), name) != OFF[loser]:
            config = config.with_section(section, **{name: OFF[loser]})
            found[loser] = f"{found[winner]} (by {winner})"
    return config


def _recorded_budget_run(path: str, data: dict) -> bool:
    """Whether `path` is the config.toml a run with `train.time_budget` recorded (with the
    steps the budget fixed) in its run directory (beside its metrics or checkpoints)."""
    train = data.get("train")
    folder = os.path.dirname(path)
    return (
        isinstance(train, dict)
        and bool(train.get("time_budget"))
        and "steps" in train
        and os.path.basename(path) == "config.toml"
        and any(
            os.path.exists(os.path.join(folder, name)) for name in ("metrics.jsonl", "checkpoints")
        )
    )


def load_config(name_or_path: str | None = None, overrides: dict | None = None) -> Config:
    """The config of a shipped name or TOML file, with overrides, validated.

    Args:
        name_or_path: "seed", "tiny", "base" (the shipped configs), the path of a TOML
            file or of a run directory (its config.toml), or None for the defaults (the
            embedded default job).
        overrides: {"section.key": value} with Python values, e.g.
            {"train.steps": 100, "data.dir": "data/x"}; a list field takes a list or
            one string.

    Returns:
        A validated `kroberta.config.Config`, ready for `kroberta.train.main(config)`.

    Raises:
        ConfigError: an unknown name, key, type or impossible value; the message
            names the key and where it was set, as on the command line.
    """
    if overrides is not None and not isinstance(overrides, dict):
        raise ConfigError(
            f"{OVERRIDES}: expected a dict like {{'train.steps': 100}}, "
            f"got {type(overrides).__name__}"
        )
    return validate(*_load(name_or_path, overrides or {}, OVERRIDES))


def from_command_line(name_or_path: str | None, rest: list[str]) -> tuple[Config, dict]:
    """The config a tool's command line describes: `--config NAME_OR_FILE` (a shipped
    config's name or a TOML file) plus the leftover `--section.key=value` arguments;
    returns (config, sources for error messages), not validated."""
    for previous, item in zip([""] + rest, rest):
        if not item.startswith("--"):
            # `--train.steps 20`, `--run_dir runs/x`: a key's value written after a space.
            key = previous[2:] if previous.startswith("--") and "=" not in previous else ""
            hint = ""
            if "." in key or key in TOP_LEVEL_KEYS:
                hint = f"; a value goes after '=': --{key}={item}"
            elif key:
                hint = (
                    f" after {previous!r}, which is no option of this command (see --help) and "
                    "no config key"
                )
            raise ConfigError(f"command line: unexpected argument {item!r}{hint}")
    return _load(name_or_path, _parse_overrides([item[2:] for item in rest]), "command line")


def to_dict(config: Config) -> dict:
    """The config as plain TOML-able data (tuples become lists)."""
    out = {key: getattr(config, key) for key in TOP_LEVEL_KEYS}
    for name in SECTIONS:
        out[name] = {
            key: list(value) if isinstance(value, tuple) else value
            for key, value in dataclasses.asdict(getattr(config, name)).items()
        }
    return out


def to_toml(config: Config) -> str:
    return tomli_w.dumps(to_dict(config))
