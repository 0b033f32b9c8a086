"""The masked-language model: keras-hub's RoBERTa backbone and a tied, sparse MLM head.

`keras_hub.models.RobertaMaskedLM` is exactly the architecture we want: the
backbone, then a head that first gathers the hidden states at `mask_positions`
(batch, slots) and only then projects them onto the vocabulary through the
transposed token embedding, so logits exist only at the predicted slots:
(batch, slots, vocabulary) instead of (batch, length, vocabulary). We keep its
layers and weights as they are (so keras-hub and Hugging Face checkpoints map onto
them) and supply our own loss and metrics, which average over real masked tokens.
`build_model` builds it as `kroberta.MaskedLM` (`kroberta.model.masked_lm`), the one
class every entry point returns. Three layers compute the same function more cheaply on CPU: layer norms with a
hand-written gradient (`kroberta.model.layer_norm`), dropout with cheaper masks
(`kroberta.model.dropout`) and GELU through erf (`kroberta.model.gelu`); the model's config
and weights stay keras-hub's.

Model inputs (all int32):
    token_ids       (batch, length)
    padding_mask    (batch, length)   1 for real tokens, 0 for padding
    mask_positions  (batch, slots)    positions to predict; padded slots point at 0
Targets: labels     (batch, slots)    original token ids, -100 in padded slots
"""

import dataclasses

import keras
import keras_hub

from kroberta import masking
from kroberta.config import AUTO, Config, ModelConfig, TrainConfig
from kroberta.errors import ConfigError
from kroberta.model import schedules
from kroberta.model.attention import use_attention_dropout
from kroberta.model.dropout import use_fast_dropout
from kroberta.model.gelu import use_erf_gelu
from kroberta.model.layer_norm import use_fused_layer_norm
from kroberta.model.masked_lm import MaskedLM
from kroberta.model.metrics import MaskedAccuracy, MaskedLMLoss, Perplexity
from kroberta.model.remat import use_remat
from kroberta.parallel.distribute import global_distribution, to_host

# Names the optimizer's variables are saved under; an unnamed optimizer gets a
# process-dependent name and restored state could silently fail to match.
OPTIMIZER_NAME = "adamw"
# AdamW decays every weight except biases and LayerNorm scales/offsets (as RoBERTa).
NO_DECAY_NAMES = ["bias", "gamma", "beta"]
# keras-hub starts every kernel and embedding from TruncatedNormal(stddev=0.02).
KERAS_HUB_INITIALIZER_RANGE = 0.02


def build_backbone(model_config: ModelConfig, mixed_precision: bool = False):
    """A freshly initialised keras-hub `RobertaBackbone` with the config's shape."""
    return keras_hub.models.RobertaBackbone(
        vocabulary_size=model_config.vocabulary_size,
        num_layers=model_config.num_layers,
        num_heads=model_config.num_heads,
        hidden_dim=model_config.hidden_dim,
        intermediate_dim=model_config.intermediate_dim,
        dropout=model_config.dropout,
        max_sequence_length=model_config.max_sequence_length,
        # bf16 compute with float32 master weights: what TPUs are built for.
        dtype="mixed_bfloat16" if mixed_precision else "float32",
    )


def build_model(
    model_config: ModelConfig,
    mixed_precision: bool = False,
    seed: int | None = None,
    remat: str = "none",
    config: Config | None = None,
    tokenizer=None,
    step: int | None = None,
) -> MaskedLM:
    """The one place a `kroberta.MaskedLM` is built (uncompiled for training).

    Args:
        model_config: the shape, dropouts, initialisation and layer-norm epsilon.
        mixed_precision: bf16 compute with float32 weights.
        seed: makes the initial weights reproducible.
        remat: `TrainConfig.remat`, checkpoints each encoder block in the backward pass
            (`kroberta.model.remat`).
        config, tokenizer, step: the model's `kroberta_config`, `tokenizer` and
            `kroberta_step` attributes.

    Returns:
        The model, with its faster layers, attention dropout and remat policy in place: the
        layers are replaced here, before anyone holds the model, and never afterwards.
    """
    if seed is not None:
        keras.utils.set_random_seed(seed)
    if config is not None and config.train.mixed_precision != mixed_precision:
        # kroberta.load(run, mixed_precision=...) overrides the run's setting: the model's
        # config says how it computes, for what is built from it (evaluation, a classifier).
        config = config.with_section("train", mixed_precision=mixed_precision)
    backbone = build_backbone(model_config, mixed_precision)
    model = MaskedLM(
        backbone=backbone,
        preprocessor=None,
        kroberta_config=config,
        tokenizer=tokenizer,
        kroberta_step=step,
    )
    _set_initializer_range(model, model_config.initializer_range)
    # Same weights and config, a cheaper gradient; RobertaConfig()'s 1e-12 held too.
    use_fused_layer_norm(model, model_config.layer_norm_epsilon)
    use_fast_dropout(model)  # hashed masks on CPU, masks stored once elsewhere
    use_erf_gelu(model)  # the same GELU through erf, not erfc
    # keras-hub has one dropout; the attention weights get their own rate (HF's split).
    use_attention_dropout(model, model_config.attention_dropout_rate)
    use_remat(model, remat)  # jax.checkpoint per encoder block, inside any compiled step
    return model


def stock_copy(model, preprocessor=None):
    """A plain keras-hub `RobertaMaskedLM` (for a fine-tuned classifier, a
    `RobertaTextClassifier`) with `model`'s weights, on this host: what is saved
    (`kroberta.save`'s weights file, `export_keras_hub`'s preset), so saved files load
    without kroberta and hold no optimizer state.

    In a multi-process run every process must call it (weights split across processes
    are gathered, a collective)."""
    weights = [to_host(v.value) for v in model.weights]
    with global_distribution(None):  # the copy's arrays live on this host only
        backbone = keras_hub.models.RobertaBackbone.from_config(model.backbone.get_config())
        if isinstance(model, keras_hub.models.RobertaTextClassifier):
            stock = keras_hub.models.RobertaTextClassifier(
                backbone=backbone,
                num_classes=model.num_classes,
                preprocessor=preprocessor,
                activation=model.activation,
                hidden_dim=model.hidden_dim,
                dropout=model.dropout,
            )
        else:
            stock = keras_hub.models.RobertaMaskedLM(backbone=backbone, preprocessor=preprocessor)
        stock.set_weights(weights)
    return stock


def _set_initializer_range(model, initializer_range: float):
    """Starts every kernel and embedding from TruncatedNormal(stddev=initializer_range).

    keras-hub takes no argument for it and draws them from TruncatedNormal(0.02),
    truncated at two standard deviations; that draw scaled by r / 0.02 is exactly a
    draw of TruncatedNormal(r), so scaling the built weights is that initialisation
    (biases stay 0, LayerNorm scales 1).
    """
    if initializer_range == KERAS_HUB_INITIALIZER_RANGE:
        return
    scale = initializer_range / KERAS_HUB_INITIALIZER_RANGE
    for variable in model.weights:
        if variable.path.endswith(("/kernel", "/embeddings")):
            variable.assign(variable * scale)


def build_optimizer(t: TrainConfig) -> keras.optimizers.AdamW:
    """AdamW with `t`'s (the `train` section's) schedule, betas, decay and clipping."""
    optimizer = keras.optimizers.AdamW(
        learning_rate=schedules.from_train_config(t),
        weight_decay=t.weight_decay,
        beta_1=t.adam_beta_1,
        beta_2=t.adam_beta_2,
        epsilon=t.adam_epsilon,
        global_clipnorm=t.clip_norm or None,
        name=OPTIMIZER_NAME,
    )
    optimizer.exclude_from_weight_decay(var_names=NO_DECAY_NAMES)
    return optimizer


def compile_model(model, config: Config, word_starts=None):
    """Compiles `model` (a `MaskedLM` from `build_model`) for training.

    The model gets AdamW, the masked loss and metrics, XLA-compiled steps
    that finish batches carrying mask keys or file labels on the device
    (`kroberta.masking`; `word_starts`: the tokenizer's (V,) table, for whole-word
    masking), train.gradient_accumulation_steps micro-batches per optimizer step and
    train.steps_per_execution steps per dispatch: a count, "auto" resolved by the
    caller's plan (`kroberta.perf.plan.Plan.config`, or `kroberta.perf.plan.for_local_devices`).
    Returns it."""
    if config.train.steps_per_execution == AUTO:
        raise ConfigError(
            'train.steps_per_execution="auto" must be resolved before the model '
            "is compiled: compile with a plan's config (kroberta.perf.plan.make_plan("
            "config).config, or kroberta.perf.plan.for_local_devices(config))"
        )
    model.compile(
        optimizer=build_optimizer(config.train),
        loss=MaskedLMLoss(),
        metrics=[MaskedAccuracy(), Perplexity()],
        weighted_metrics=None,
        steps_per_execution=config.train.steps_per_execution,
        jit_compile=True,
        masker=masking.masker(config.data, config.model.vocabulary_size, word_starts),
        # Validation masks at data.eval_mask_rate, from the same per-example keys.
        evaluation_masker=masking.masker(
            dataclasses.replace(config.data, mask_rate=config.data.evaluation_mask_rate()),
            config.model.vocabulary_size,
            word_starts,
        ),
        gradient_accumulation_steps=config.train.gradient_accumulation_steps,
    )
    return model


def build_compiled_model(config: Config, word_starts=None):
    """The training model for `config` (its `kroberta_config`; its steps per dispatch
    resolved, as `compile_model` needs): built with its seed, compiled (`word_starts` as
    in `compile_model`), optimizer built."""
    model = build_model(
        config.model,
        config.train.mixed_precision,
        seed=config.train.seed,
        remat=config.train.remat,
        config=config,
    )
    compile_model(model, config, word_starts)
    model.optimizer.build(model.trainable_variables)
    return model


def count_parameters(model) -> int:
    return int(sum(v.numpy().size for v in model.trainable_variables))
