"""The static checks of a config: every impossible setting, named by key and source.

`kroberta.config.validate` runs them; the checks that need the device count are
in `kroberta.parallel.distribute` (it calls `check_model_parallel` with it).
"""

import re

from kroberta.config import (AUTO, MASKINGS, SCHEDULES, STRATEGIES, TRACKERS, Config,
                             ConfigError, ModelConfig, TrainConfig)


def validate(config: Config, source: str | dict = "config") -> Config:
    """`kroberta.config.validate`: returns `config`, or raises ConfigError naming the key."""
    m, d, t = config.model, config.data, config.train

    def fail(key, problem):
        where = source.get(key, "default") if isinstance(source, dict) else source
        raise ConfigError(f"{where}: {key}: {problem}")

    for key in ("vocabulary_size", "num_layers", "num_heads", "hidden_dim",
                "intermediate_dim", "max_sequence_length"):
        if getattr(m, key) < 1:
            fail(f"model.{key}", f"must be >= 1, got {getattr(m, key)}")
    if m.hidden_dim % m.num_heads:
        fail("model.num_heads", f"{m.num_heads} heads do not divide hidden_dim={m.hidden_dim}")
    if not 0.0 <= m.dropout < 1.0:
        fail("model.dropout", f"must be in [0, 1), got {m.dropout}")
    if not 0.0 < m.initializer_range <= 1.0:
        fail("model.initializer_range", f"must be in (0, 1], got {m.initializer_range}")
    if d.masking not in MASKINGS:
        fail("data.masking", f"must be one of {MASKINGS}, got {d.masking!r}")
    if d.whole_word_masking and d.masking != "dynamic":
        fail("data.whole_word_masking", "needs data.masking='dynamic' (static labels are the file's)")
    if not 0.0 < d.mask_rate <= 1.0:
        fail("data.mask_rate", f"must be in (0, 1], got {d.mask_rate}")
    if not 0 <= d.max_predictions <= m.max_sequence_length:
        fail("data.max_predictions",
             f"must be in [0, max_sequence_length={m.max_sequence_length}], got {d.max_predictions}")
    for key in ("pad_token_id", "mask_token_id"):
        if not 0 <= getattr(d, key) < m.vocabulary_size:
            fail(f"data.{key}", f"{getattr(d, key)} is outside the vocabulary [0, {m.vocabulary_size})")
    if d.shuffle_buffer < 1:
        fail("data.shuffle_buffer", f"must be >= 1, got {d.shuffle_buffer}")
    for key in ("batch_size_per_device", "gradient_accumulation_steps", "steps", "log_every",
                "keep_checkpoints"):
        if getattr(t, key) < 1:
            fail(f"train.{key}", f"must be >= 1, got {getattr(t, key)}")
    for key in ("warmup_steps", "eval_every", "eval_steps", "checkpoint_every"):
        if getattr(t, key) < 0:
            fail(f"train.{key}", f"must be >= 0, got {getattr(t, key)}")
    if t.learning_rate <= 0:
        fail("train.learning_rate", f"must be > 0, got {t.learning_rate}")
    _validate_profile(t, fail)
    if t.schedule not in SCHEDULES:
        fail("train.schedule", f"must be one of {SCHEDULES}, got {t.schedule!r}")
    if t.warmup_steps > t.steps:
        fail("train.warmup_steps", f"{t.warmup_steps} exceeds train.steps={t.steps}")
    if t.weight_decay < 0 or t.clip_norm < 0:
        fail("train.weight_decay" if t.weight_decay < 0 else "train.clip_norm", "must be >= 0")
    # Evaluations and checkpoints happen at log boundaries, where the metrics of the
    # interval are complete and the device state is already synced to the host.
    for key in ("eval_every", "checkpoint_every"):
        value = getattr(t, key)
        if value % t.log_every:
            fail(f"train.{key}", f"{value} is not a multiple of train.log_every={t.log_every}")
    if t.steps_per_execution != AUTO:
        if t.steps_per_execution < 1:
            fail("train.steps_per_execution", f"must be >= 1 or \"{AUTO}\", got {t.steps_per_execution}")
        check_steps_per_execution(t, t.steps_per_execution, fail)
    _validate_signals(config, fail)
    if config.distributed.strategy not in STRATEGIES:
        fail("distributed.strategy",
             f"must be one of {STRATEGIES}, got {config.distributed.strategy!r}")
    _validate_distributed(config, fail)
    if not config.run_dir:
        fail("run_dir", "must not be empty")
    if config.init_from_hf and config.init_from_keras_hub:
        fail("init_from_keras_hub", "set init_from_hf or init_from_keras_hub, not both")
    return config


def _validate_signals(config: Config, fail):
    """The evaluation mask rate, the schedule's floor and decay, keep_best, early stop, trackers."""
    d, t = config.data, config.train
    if not 0.0 <= d.eval_mask_rate <= 1.0:
        fail("data.eval_mask_rate", f"must be in [0, 1] (0 = data.mask_rate), got {d.eval_mask_rate}")
    if d.eval_mask_rate and d.masking == "static":
        fail("data.eval_mask_rate", "static masking evaluates the files' own labels; "
             "set data.masking = \"dynamic\" or leave data.eval_mask_rate at 0")
    if not 0.0 <= t.min_learning_rate <= t.learning_rate:
        fail("train.min_learning_rate",
             f"must be in [0, train.learning_rate={t.learning_rate}], got {t.min_learning_rate}")
    if not 0 <= t.decay_steps <= t.steps - t.warmup_steps:
        fail("train.decay_steps", f"must be in [0, train.steps - train.warmup_steps = "
             f"{t.steps - t.warmup_steps}], got {t.decay_steps}")
    if not 0.0 < t.decay_fraction <= 1.0:
        fail("train.decay_fraction", f"must be in (0, 1], got {t.decay_fraction}")
    if t.early_stop_patience < 0:
        fail("train.early_stop_patience", f"must be >= 0 (0 = never), got {t.early_stop_patience}")
    if t.target_eval_loss < 0:
        fail("train.target_eval_loss", f"must be >= 0 (0 = never), got {t.target_eval_loss}")
    for name in t.trackers:
        if name not in TRACKERS:
            fail("train.trackers", f"unknown tracker {name!r}; choose from {TRACKERS}")
    if len(set(t.trackers)) != len(t.trackers):
        fail("train.trackers", f"names a tracker twice: {list(t.trackers)}")


def parse_window(text: str) -> tuple[int, int] | None:
    """"START:STOP" -> (START, STOP); "" -> None. Raises ValueError saying what is wrong."""
    if not text:
        return None
    parts = text.split(":")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"expected \"START:STOP\" (two step numbers, e.g. \"100:120\"), got {text!r}")
    start, stop = (int(p) for p in parts)
    if start >= stop:
        raise ValueError(f"START must be below STOP, got {text!r}")
    return start, stop


def _validate_profile(t: TrainConfig, fail):
    try:
        window = parse_window(t.profile)
    except ValueError as error:
        fail("train.profile", str(error))
    if window and window[0] >= t.steps:
        fail("train.profile", f"starts at step {window[0]}, but the run ends at train.steps={t.steps}")


def check_steps_per_execution(t: TrainConfig, k: int, fail):
    """Logs, evaluations and checkpoints happen between dispatches of K fused steps."""
    for key in ("log_every", "eval_every", "checkpoint_every"):
        value = getattr(t, key)
        if value % k:
            fail(f"train.{key}", f"{value} is not a multiple of train.steps_per_execution={k} "
                 "(steps fused per dispatch); change one of them")


def _validate_distributed(config: Config, fail):
    """The static checks; those that need the device count are in kroberta.parallel.distribute."""
    dist, m = config.distributed, config.model
    for key in ("devices", "model_parallel", "num_processes"):
        if getattr(dist, key) < 0:
            fail(f"distributed.{key}", f"must be >= 0, got {getattr(dist, key)}")
    if dist.process_id < -1 or (dist.num_processes and dist.process_id >= dist.num_processes):
        fail("distributed.process_id", f"must be -1 (auto) or in [0, num_processes="
             f"{dist.num_processes or 'auto'}), got {dist.process_id}")
    if dist.initialization_timeout < 1:
        fail("distributed.initialization_timeout", f"must be >= 1, got {dist.initialization_timeout}")
    if dist.coordinator and not re.fullmatch(r"\[?[\w.:-]+\]?:\d+", dist.coordinator):
        fail("distributed.coordinator", f"expected HOST:PORT, got {dist.coordinator!r}")
    if dist.model_parallel and dist.strategy in ("fsdp", "model"):
        check_model_parallel(dist.model_parallel, m, lambda problem: fail(
            "distributed.model_parallel", problem))


def check_model_parallel(size: int, m: ModelConfig, fail):
    """The "model" axis must divide every dimension the layouts shard."""
    for key in ("num_heads", "hidden_dim", "intermediate_dim"):
        if getattr(m, key) % size:
            fail(f"a model axis of {size} does not divide model.{key}={getattr(m, key)}")
