"""The sequence classifier: keras-hub's `RobertaTextClassifier` on a kroberta backbone.

Its head is Hugging Face's `RobertaClassificationHead`: dropout, dense + tanh on the
first token's (`<s>`) hidden state, dropout, then the output projection
(`pooled_dense`, `logits`). Regression is one output under a mean-squared error.
With `pooling="mean"` the head reads the mean of the last hidden states over the
tokens the padding mask keeps instead of `<s>` (the same layers and weights; it has
no Hugging Face or keras-hub equivalent, so such a classifier is not exported).

One classifier is built and compiled per task and reused for every learning rate,
seed and starting point: `reset` puts back the backbone's starting weights, draws a
new head from the seed and zeroes the optimizer, and the peak learning rate is an
optimizer variable, so the compiled steps (one per bucket length) are never rebuilt.
"""

import jax
import keras
import keras_hub
import numpy as np

from kroberta.config import Config
from kroberta.downstream.layer_decay import LayerDecayAdamW, layer_scales
from kroberta.downstream.settings import FIRST, MEAN, POOLINGS  # noqa: F401
from kroberta.downstream.tasks import REGRESSION
from kroberta.errors import InputError
from kroberta.model import mlm, schedules
from kroberta.model.masked_lm import call_keeping_variables
from kroberta.parallel import distribute

HEAD_LAYERS = ("pooled_dense", "logits")
CLASSIFIER_DROPOUT = 0.1  # Hugging Face's classifier dropout (hidden_dropout_prob)
WARMUP_FRACTION = 0.06  # RoBERTa's GLUE recipe: 6% of the steps
WEIGHT_DECAY = 0.01  # RoBERTa's GLUE recipe


def backbone_weights(model) -> list:
    """The backbone's weights of a kroberta model as host arrays (the starting point)."""
    return [np.asarray(w) for w in model.backbone.get_weights()]


def data_parallel():
    """Keras' DataParallel over this process's devices (None for one device): where a
    classifier's variables live and its batches are split, in fine-tuning and prediction."""
    devices = jax.local_devices()
    return distribute.make_distribution(Config(), devices) if len(devices) > 1 else None


@keras.saving.register_keras_serializable(package="kroberta")
class MaskedMean(keras.layers.Layer):
    """The mean of `hidden` (batch, length, hidden) over the positions whose
    `padding_mask` (batch, length) is 1: (batch, hidden). A row with no such position
    (a batch's filler row, of weight 0) gives 0, not 0 / 0."""

    def call(self, hidden, padding_mask):
        mask = keras.ops.cast(padding_mask, hidden.dtype)[:, :, None]  # (batch, length, 1)
        total = keras.ops.sum(hidden * mask, axis=1)  # (batch, hidden)
        count = keras.ops.maximum(keras.ops.sum(mask, axis=1), 1.0)  # (batch, 1)
        return total / count

    def compute_output_shape(self, hidden_shape, padding_mask_shape):
        return (hidden_shape[0], hidden_shape[2])


@keras.saving.register_keras_serializable(package="kroberta")
class Classifier(keras_hub.models.RobertaTextClassifier):
    """keras-hub's `RobertaTextClassifier` (its layers and config; saved as the stock
    class, `mlm.stock_copy`) whose Keras `fit` / `evaluate` / `predict` refuse texts,
    naming `kroberta.predict` (it has no keras-hub preprocessor: the tokenizer is a
    `tokenizers.Tokenizer`), and leave the model usable when they fail.

    `pooling` is what the head reads: FIRST, the `<s>` state (keras-hub's and Hugging
    Face's head), or MEAN, the mean over the tokens whose padding mask is 1."""

    def __init__(
        self,
        backbone,
        num_classes,
        preprocessor=None,
        activation=None,
        hidden_dim=None,
        dropout=0.0,
        pooling=FIRST,
        **kwargs,
    ):
        if pooling not in POOLINGS:
            raise InputError(f"pooling {pooling!r}: expected one of {', '.join(POOLINGS)}")
        self.pooling = pooling
        if pooling == FIRST:
            super().__init__(
                backbone=backbone,
                num_classes=num_classes,
                preprocessor=preprocessor,
                activation=activation,
                hidden_dim=hidden_dim,
                dropout=dropout,
                **kwargs,
            )
            return
        # keras-hub's RobertaTextClassifier.__init__ with the pooling changed: the same
        # layers (names, initializers, dtypes), so weights move between the two as they are.
        self.backbone, self.preprocessor = backbone, preprocessor
        policy = backbone.dtype_policy
        self.pooled_dropout = keras.layers.Dropout(dropout, dtype=policy, name="pooled_dropout")
        hidden_dim = hidden_dim or backbone.hidden_dim
        self.pooled_dense = keras.layers.Dense(
            hidden_dim, activation="tanh", dtype=policy, name="pooled_dense"
        )
        self.output_dropout = keras.layers.Dropout(dropout, dtype=policy, name="output_dropout")
        self.output_dense = keras.layers.Dense(  # keras-hub's roberta_kernel_initializer
            num_classes,
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=0.02),
            activation=activation,
            dtype=policy,
            name="logits",
        )
        inputs = backbone.input
        hidden = backbone(inputs)  # (batch, length, hidden)
        pooled = MaskedMean(dtype=policy, name="mean_pooling")(
            hidden, inputs["padding_mask"]
        )  # (batch, hidden)
        outputs = self.output_dense(
            self.output_dropout(self.pooled_dense(self.pooled_dropout(pooled)))
        )  # (batch, num_classes)
        keras_hub.models.TextClassifier.__init__(self, inputs=inputs, outputs=outputs, **kwargs)
        self.num_classes, self.hidden_dim, self.dropout = num_classes, hidden_dim, dropout
        self.activation = keras.activations.get(activation)

    def get_config(self):
        return {**super().get_config(), "pooling": self.pooling}

    def fit(self, x=None, y=None, *args, **kwargs):
        return call_keeping_variables(self, super().fit, _token_ids(x, "fit"), y, *args, **kwargs)

    def evaluate(self, x=None, y=None, *args, **kwargs):
        return call_keeping_variables(
            self, super().evaluate, _token_ids(x, "evaluate"), y, *args, **kwargs
        )

    def predict(self, x, *args, **kwargs):
        return call_keeping_variables(
            self, super().predict, _token_ids(x, "predict"), *args, **kwargs
        )


def _token_ids(x, where: str):
    """`x`, unless it holds texts (a string, or a list or array of them)."""
    first = x
    while (isinstance(first, (list, tuple)) and first) or (
        isinstance(first, np.ndarray) and first.ndim and first.size
    ):
        first = first[0]
    if isinstance(first, (str, bytes)):
        raise InputError(
            f"classifier.{where}: texts, but Keras' {where} takes token ids ({{'token_ids': "
            f"(batch, length), 'padding_mask': (batch, length)}}); for texts use "
            f"kroberta.predict(classifier, texts)"
        )
    return x


def describe(classifier, config, tokenizer, spec, names, max_length: int):
    """`classifier` with what prediction and `kroberta.save` read from it: the tokenizer,
    the pretrained model's config, the task (`TaskSpec`), the class names, the length."""
    classifier.tokenizer, classifier.kroberta_config, classifier.task_spec = tokenizer, config, spec
    classifier.label_names = tuple(names) if names else None
    classifier.max_length = int(max_length)
    return classifier


def build_classifier(model_config, num_outputs: int, pooling: str = FIRST):
    """A `Classifier` with `num_outputs` logits on a fresh backbone of `model_config`'s
    shape, built by `kroberta.model.mlm.build_model` (kroberta's cheaper layer norm,
    dropout and GELU), its head reading `pooling` (FIRST: `<s>`, MEAN: the tokens'
    mean); weights are set by `reset`."""
    backbone = mlm.build_model(model_config).backbone
    return Classifier(
        backbone=backbone,
        num_classes=num_outputs,
        dropout=CLASSIFIER_DROPOUT,
        pooling=pooling,
    )


def compile_classifier(
    classifier, kind: str, total_steps: int, steps_per_execution: int = 1, layer_decay: float = 1.0
):
    """AdamW as RoBERTa fine-tunes (betas 0.9/0.98, eps 1e-6, no decay on biases and
    LayerNorm), linear decay after 6% warmup, its peak the schedule's `scale` (set by
    `reset`); XLA-compiled steps. `layer_decay` below 1: each layer's rate scaled
    (`kroberta.downstream.layer_decay`). Only the trainable variables are optimized
    (a frozen backbone: the head alone)."""
    schedule = schedules.WarmupSchedule(
        1.0, max(1, round(WARMUP_FRACTION * total_steps)), total_steps
    )
    adam = dict(
        learning_rate=schedule, beta_1=0.9, beta_2=0.98, epsilon=1e-6, name=mlm.OPTIMIZER_NAME
    )
    if layer_decay != 1.0:
        scales = layer_scales(
            classifier.trainable_variables, classifier.backbone.num_layers, layer_decay
        )
        optimizer = LayerDecayAdamW(scales, WEIGHT_DECAY, **adam)
    else:
        optimizer = keras.optimizers.AdamW(weight_decay=WEIGHT_DECAY, **adam)
        optimizer.exclude_from_weight_decay(var_names=mlm.NO_DECAY_NAMES)
    optimizer.build(classifier.trainable_variables)
    schedule.scale = optimizer.add_variable((), name="peak_learning_rate")
    loss = (
        keras.losses.MeanSquaredError()
        if kind == REGRESSION
        else keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    classifier.compile(
        optimizer=optimizer, loss=loss, jit_compile=True, steps_per_execution=steps_per_execution
    )
    classifier.kroberta_schedule = schedule  # a plain object: Keras does not track it
    return classifier


def reset(classifier, start: list, seed: int, learning_rate: float):
    """Starts a run: the backbone's weights `start`, a head drawn from `seed` (its
    layers' own initializers), the optimizer's state zeroed and its peak set."""
    classifier.backbone.set_weights(start)
    keras.utils.set_random_seed(seed)  # unseeded initializers draw from it
    # Dropout's seed generators restart too (each its own stream): a run draws the same
    # masks whatever ran before it, so an interrupted grid resumes with the result of an
    # uninterrupted one.
    states = [v for v in classifier.variables if v.path.endswith("seed_generator_state")]
    for index, state in enumerate(states):
        state.assign(np.array([seed * len(states) + index, 0], state.dtype))
    for index, name in enumerate(HEAD_LAYERS):
        layer = classifier.get_layer(name)
        # The layer's initializer with a seed of this run's (its own seed was drawn when the
        # classifier was built, so the head would depend on what the process did before).
        config = {**layer.kernel_initializer.get_config(), "seed": seed * len(HEAD_LAYERS) + index}
        initializer = type(layer.kernel_initializer).from_config(config)
        layer.kernel.assign(initializer(layer.kernel.shape, layer.kernel.dtype))
        layer.bias.assign(np.zeros(layer.bias.shape, layer.bias.dtype))
    optimizer = classifier.optimizer
    for variable in optimizer.variables:
        variable.assign(np.zeros(variable.shape, variable.dtype))
    classifier.kroberta_schedule.scale.assign(learning_rate)
