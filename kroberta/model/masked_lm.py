"""`kroberta.MaskedLM`: the one model class, what every entry point returns.

`kroberta.load` of a masked LM (a run, a Hugging Face directory, a keras-hub preset), the
model `train` builds and the one it leaves behind are all this class, built once by
`kroberta.model.mlm.build_model`. It is
keras-hub's `RobertaMaskedLM` (the same layers, weights and config: saved files are stock
keras-hub) with:

- Keras `fit` / `evaluate` / `predict` that take kroberta's, keras-hub's and Hugging
  Face's input names, a bare (batch, length) array of ids and no `mask_positions`
  (`kroberta.model.model_inputs`), and that leave the model usable when they fail:
  Keras on JAX detaches the variables for the length of a call (`_purge_model_variables`)
  and re-attaches them only when it ends normally;
- `compile`'s "auto" loss and metrics over the real label slots (labels of -100 hold no
  masked token), the masked loss training, evaluation and prediction share;
- one training step, read top to bottom (`train_step`: finish the batch on the device,
  the whole batch's gradient in N micro-batches, its norm, the optimizer's update, the
  metrics), on the extension points of Keras' JAX trainer (`stateless_call` through
  `compute_loss_and_updates`, `optimizer.stateless_apply`, each metric's
  `stateless_update_state`).

Batches the steps finish (`finish_batch`): the pipelines send each sequence unmasked with
one uint32 key (`data.masking = "dynamic"`: `kroberta.masking.element_keys`), or masked as
in the file with its labels per position ("static"); the step draws the masks from the
keys, or chooses the slots from the labels:

    x = {token_ids (B, L), padding_mask (B, L), mask_keys (B,) uint32 | token_labels (B, L)}
      -> x = {token_ids (B, L) masked, padding_mask (B, L), mask_positions (B, M)},
         labels (B, M)

Either way with `kroberta.masking.masker`, the function the host pipeline runs for
`kroberta.dataset(..., masks_on_host=True)`, so the batches are the same bit for bit. On
an accelerator this takes microseconds per step, while on the host the hash, the choice
and the scatter were a fifth of the pipeline's CPU time at 512 tokens (docs/design.md,
"Device masking"). A finished batch passes through unchanged.

K steps per dispatch (`steps_per_execution`) scan this step: Keras >= 3.16 does it
itself, Keras 3.15 through `kroberta.model.fused_steps.StepsPerDispatch`.

Attributes beside keras-hub's: `kroberta_config` (the run's `Config`, or one with the
imported model's shape), `tokenizer` (a `tokenizers.Tokenizer`, or None) and
`kroberta_step` (the training step of a loaded checkpoint, else None).
"""

import os
import weakref

import jax
import jax.numpy as jnp
import keras
import keras_hub
import numpy as np

from kroberta.errors import ArgumentKindError, InputError
from kroberta.masking import KEYS, STEP_INPUTS, TOKEN_LABELS
from kroberta.model.fused_steps import StepsPerDispatch
from kroberta.model.metrics import MaskedAccuracy, MaskedLMLoss, Perplexity
from kroberta.model.model_inputs import check_arrays, model_inputs
from kroberta.parallel.distribute import global_distribution
from kroberta.tokens import IGNORE_LABEL

LOSS = "loss"  # Keras' loss tracker
GRAD_NORM = "grad_norm"
_traces = weakref.WeakKeyDictionary()  # model -> {"train"/"test": times the step was traced}
# model -> its `with_hidden_states` view: kept outside the model, where Keras would track
# the view as one more layer.
_hidden_views = weakref.WeakKeyDictionary()


@keras.saving.register_keras_serializable(package="kroberta")
class MaskedLM(StepsPerDispatch, keras_hub.models.RobertaMaskedLM):
    """keras-hub's `RobertaMaskedLM` whose Keras `fit` / `evaluate` / `predict` take the
    inputs users pass, whose default loss and metrics skip the -100 label slots, and whose
    steps finish batches on the device, accumulate gradients and log the gradient norm
    (see the module). Build it with `kroberta.model.mlm.build_model`.

    Args:
        backbone: a keras-hub `RobertaBackbone`.
        preprocessor: keras-hub's preprocessor, or None (kroberta's batches are ids).
        kroberta_config: the `kroberta.config.Config` the model belongs to, or None.
        tokenizer: the `tokenizers.Tokenizer` of its vocabulary, or None.
        kroberta_step: the training step its weights come from, when a checkpoint's.
    """

    def __init__(
        self,
        backbone,
        preprocessor=None,
        kroberta_config=None,
        tokenizer=None,
        kroberta_step=None,
        **kwargs,
    ):
        self.masker = self.evaluation_masker = None
        self.gradient_accumulation_steps = 1
        self.grad_norm_tracker = None
        super().__init__(backbone=backbone, preprocessor=preprocessor, **kwargs)
        self.kroberta_config = kroberta_config
        self.tokenizer = tokenizer
        self.kroberta_step = kroberta_step

    def compile(
        self,
        optimizer="auto",
        loss="auto",
        *,
        weighted_metrics="auto",
        masker=None,
        evaluation_masker=None,
        gradient_accumulation_steps: int = 1,
        **kwargs,
    ):
        """keras-hub's `compile`, with "auto" meaning the masked loss and metrics over the
        real label slots (`kroberta.dataset`'s batches hold -100 in the slots with no masked
        token; sample weights such as keras-hub's `mask_weights` still apply), plus:

        Args:
            masker: `kroberta.masking.masker(data_config, vocabulary, word_starts)`, for
                batches that carry `mask_keys` or `token_labels`; None: batches come masked.
            evaluation_masker: the same for `evaluate` (e.g. at `data.eval_mask_rate`);
                None: `masker`.
            gradient_accumulation_steps: N micro-batches per optimizer step.
        """
        if loss == "auto":
            loss = MaskedLMLoss()
        if weighted_metrics == "auto":
            weighted_metrics = [MaskedAccuracy(), Perplexity()]
        super().compile(optimizer=optimizer, loss=loss, weighted_metrics=weighted_metrics, **kwargs)
        self.masker = masker
        self.evaluation_masker = evaluation_masker or masker
        self.gradient_accumulation_steps = int(gradient_accumulation_steps)
        if self.grad_norm_tracker is None:
            self.grad_norm_tracker = keras.metrics.Mean(name=GRAD_NORM)
        self._build_loss_and_metrics()

    def compile_from_config(self, config):
        """What `keras.saving.load_model` calls: the "auto" compile (the masked loss and
        metrics); a training run's maskers and optimizer are not part of a saved model."""
        self.compile()

    def _build_loss_and_metrics(self):
        """Builds the compiled loss and metrics from a finished batch's structure now:
        Keras would build them from the first batch `fit` reads, whose x may still carry
        mask keys and no labels. Uses public API only: one eager loss and metrics update
        on zeros, then a reset."""
        labels = np.zeros((1, 1), "int32")  # (batch, slots)
        logits = np.zeros((1, 1, 2), "float32")  # (batch, slots, vocabulary): any width
        self.compute_loss(y=labels, y_pred=logits)
        self.compute_metrics(None, labels, logits)
        self.reset_metrics()

    # The state's arrays on the shardings the compiled steps return them on. On a mesh of
    # one device Keras leaves a new value (a fresh weight, a metric reset to zeros) on
    # the device's own sharding, which XLA treats as the same placement but JAX's
    # compilation cache does not: the step's first dispatch, its second (fed the first's
    # outputs) and each interval's first after `reset_metrics` would compile three
    # programs. Placed here, every dispatch finds the one program.
    def make_train_function(self, force=False):
        _on_their_layouts(self.variables + self.optimizer.variables + self.metrics_variables)
        return super().make_train_function(force)

    def make_test_function(self, force=False):
        # The optimizer's too: Keras checks the whole state's placement when it builds the
        # test step (an evaluation before the first training step, as a run from a
        # checkpoint makes, would warn of a mix of local and distributed variables).
        optimizer = self.optimizer.variables if self.optimizer is not None else []
        _on_their_layouts(self.variables + optimizer + self.metrics_variables)
        return super().make_test_function(force)

    def reset_metrics(self):
        super().reset_metrics()
        _on_their_layouts(self.metrics_variables)

    # ------------------------------------------------------------------ Keras' entry points
    def fit(self, x=None, y=None, *args, **kwargs):
        """Keras `fit`, taking the inputs `predict` takes; a failure leaves the model usable
        (its variables attached)."""
        k, steps = self.steps_per_execution, kwargs.get("steps_per_epoch")
        if steps and steps % k and kwargs.get("epochs", 1) > 1:
            # Every epoch but the first would start in the middle of a super-batch.
            raise ValueError(
                f"fit: steps_per_epoch={steps} is not a multiple of "
                f"steps_per_execution={k} (the steps fused into one dispatch)"
            )
        _check_labelled(self, x, y, "model.fit")
        x = self._in_memory_inputs(x, "model.fit")
        if self.optimizer is not None and not self.optimizer.built:
            # Built now (as fit would) so that its variables are kept too.
            self.optimizer.build(self.trainable_variables)
        return call_keeping_variables(self, super().fit, x, y, *args, **kwargs)

    def evaluate(self, x=None, y=None, *args, **kwargs):
        """Keras `evaluate`, taking the inputs `predict` takes; a failure leaves the model
        usable (its variables attached)."""
        _check_labelled(self, x, y, "model.evaluate")
        return call_keeping_variables(
            self, super().evaluate, self._in_memory_inputs(x, "model.evaluate"), y, *args, **kwargs
        )

    def predict(self, x, batch_size=None, verbose="auto", steps=None, callbacks=None):
        """Keras `predict`: logits (batch, slots, vocabulary) at `mask_positions`, or
        (batch, length, vocabulary) at every position when none are given.

        Raises:
            InputError: inputs the model cannot take (says what to pass).
        """
        x = self._in_memory_inputs(x, "model.predict")
        # A loaded model's weights live on one device; a distribution that training left set
        # in this process would demand batches divisible by its devices.
        with global_distribution(None):
            return call_keeping_variables(
                self,
                super().predict,
                x,
                batch_size=batch_size,
                verbose=verbose,
                steps=steps,
                callbacks=callbacks,
            )

    def _in_memory_inputs(self, x, where: str):
        """Arrays and dicts of arrays checked and completed to the three model inputs before
        Keras sees them (`fit` and `evaluate` build their metrics from them, before the
        steps rename anything); a dataset or generator is passed on, its elements renamed
        in the steps."""
        if isinstance(x, (list, tuple)) and x and not isinstance(x[0], (int, np.integer)):
            x = np.asarray(x)
        if not isinstance(x, (np.ndarray, dict)) or (
            isinstance(x, dict) and any(name in x for name in STEP_INPUTS)
        ):
            return x  # elements checked as traced, or finished by the step (mask keys)
        return check_arrays(
            x, self.backbone.max_sequence_length, self.backbone.vocabulary_size, where
        )

    # ------------------------------------------------------------------ the compiled steps
    def train_step(self, state, data):
        """One optimizer step: `(trainable, non_trainable, optimizer, metrics variables),
        batch -> (logs, new state)`, as Keras' JAX trainer calls it.

        The logs hold `loss`, the compiled metrics and `grad_norm`, each over all steps
        since the metrics were last reset (kroberta resets them every log interval):
        `grad_norm` is the mean, over those optimizer steps, of the global L2 norm of the
        gradient of the loss, taken over all trainable variables before clipping (under
        accumulation: of the accumulated gradient, i.e. of the whole batch's loss; under
        loss scaling: of the scaled loss).
        """
        _count_trace(self, "train")
        trainable, non_trainable, optimizer_vars, metrics_vars = state
        # 1. Masks drawn on the device (a finished batch passes through).
        x, y, sample_weight = self._finished(self.masker, data, "model.fit")
        # 2. The whole batch's gradient; the compiled metrics updated on the way.
        grads, loss, non_trainable, metrics_vars = self._batch_gradient(
            trainable, non_trainable, optimizer_vars, metrics_vars, x, y, sample_weight
        )
        # 3. Its norm before the optimizer clips it.
        grad_norm = jnp.sqrt(
            sum(jnp.sum(jnp.square(g.astype("float32"))) for g in jax.tree.leaves(grads))
        )
        # 4. The update (clipping, AdamW, the schedule's step).
        trainable, optimizer_vars = self.optimizer.stateless_apply(optimizer_vars, grads, trainable)
        # 5. The loss tracker (weighted by rows, as Keras') and the gradient norm; the
        # compiled MaskedAccuracy / Perplexity were updated per micro-batch (they are
        # token-weighted sums).
        metrics_vars = self._update_metrics(
            metrics_vars,
            {LOSS: ((loss,), {"sample_weight": _rows(x)}), GRAD_NORM: ((grad_norm,), {})},
        )
        logs = self._metrics_results(metrics_vars)
        return logs, (trainable, non_trainable, optimizer_vars, metrics_vars)

    def _finished(self, masker, data, where: str):
        """(x, y, sample_weight) of a batch: masked on the device when it carries mask keys
        or token labels, its inputs under keras-hub's names."""
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(
            finish_batch(masker, data) if masker else data
        )
        return model_inputs(x, where=where), y, sample_weight

    def _batch_gradient(
        self, trainable, non_trainable, optimizer_vars, metrics_vars, x, y, sample_weight
    ):
        """(gradient, loss, non_trainable, metrics) of the batch, in N =
        `gradient_accumulation_steps` micro-batches scanned one after another (only one
        micro-batch's activations alive at a time); the compiled metrics updated.

        Each micro-batch's gradient weighs by its share of the whole batch's masked
        tokens, so the update is that of one batch N times larger up to float rounding:
        loss = sum over all micro-batches of the per-token cross-entropy / masked tokens
        of the whole batch, not the mean of N micro-batch means (which over-weights the
        tokens of a micro-batch with few masks)."""
        grad_fn = jax.value_and_grad(self.compute_loss_and_updates, has_aux=True)

        def gradient(non_trainable, metrics_vars, x, y, sample_weight):
            (_, (loss, y_pred, non_trainable, metrics_vars)), grads = grad_fn(
                trainable,
                non_trainable,
                metrics_vars,
                x,
                y,
                sample_weight,
                training=True,
                optimizer_variables=optimizer_vars,
            )
            metrics_vars = self._update_metrics(
                metrics_vars, {"compile_metrics": ((y, y_pred), {"sample_weight": sample_weight})}
            )
            return grads, loss, non_trainable, metrics_vars

        n = self.gradient_accumulation_steps
        if n == 1:
            return gradient(non_trainable, metrics_vars, x, y, sample_weight)
        micro = keras.tree.map_structure(
            lambda a: micro_batches(a, n), (x, y, sample_weight), none_is_leaf=True
        )
        total = jnp.maximum(masked_tokens(y), 1.0)

        def body(carry, batch):
            grads, loss, non_trainable, metrics_vars = carry
            share = masked_tokens(batch[1]) / total
            micro_grads, micro_loss, non_trainable, metrics_vars = gradient(
                non_trainable, metrics_vars, *batch
            )
            grads = jax.tree.map(lambda g, m: g + share * m, grads, micro_grads)
            return (grads, loss + share * micro_loss, non_trainable, metrics_vars), None

        zeros = jax.tree.map(jnp.zeros_like, trainable)
        carry = (zeros, jnp.zeros((), "float32"), non_trainable, metrics_vars)
        (grads, loss, non_trainable, metrics_vars), _ = jax.lax.scan(body, carry, micro)
        return grads, loss, non_trainable, metrics_vars

    def test_step(self, state, data):
        """Keras' test step on the finished batch: the loss and compiled metrics."""
        _count_trace(self, "test")
        trainable, non_trainable, metrics_vars = state
        x, y, sample_weight = self._finished(self.evaluation_masker, data, "model.evaluate")
        _, (loss, y_pred, non_trainable, metrics_vars) = self.compute_loss_and_updates(
            trainable, non_trainable, metrics_vars, x, y, sample_weight, training=False
        )
        metrics_vars = self._update_metrics(
            metrics_vars,
            {
                LOSS: ((loss,), {"sample_weight": _rows(x)}),
                "compile_metrics": ((y, y_pred), {"sample_weight": sample_weight}),
            },
        )
        logs = self._metrics_results(metrics_vars, leave_out=(GRAD_NORM,))
        return logs, (trainable, non_trainable, metrics_vars)

    def predict_step(self, state, data):
        """Keras' predict step on the finished inputs: the logits at their slots."""
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        if self.masker and _step_input(x) is not None:
            x = self.masker(x)[0]
        return super().predict_step(state, (model_inputs(x),))

    def with_hidden_states(self) -> keras.Model:
        """A functional view of this model, on its layers and weights, whose outputs are
        {"hidden": (batch, length, hidden), "logits": (batch, slots, vocabulary)}: what
        `kroberta.predict` reduces on the device (embeddings need the last hidden layer)."""
        if self not in _hidden_views:
            x = self.input
            hidden = self.backbone({"token_ids": x["token_ids"], "padding_mask": x["padding_mask"]})
            logits = self.masked_lm_head(hidden, x["mask_positions"])
            _hidden_views[self] = keras.Model(x, {"hidden": hidden, "logits": logits})
        return _hidden_views[self]

    def _by_metric(self, metrics_vars):
        """(metric, its values) for each metric, from the values of `self.metrics_variables`."""
        at = 0
        for metric in self.metrics:
            yield metric, metrics_vars[at : at + len(metric.variables)]
            at += len(metric.variables)

    def _update_metrics(self, metrics_vars, updates):
        """`metrics_vars` after `metric.update_state(*args, **kwargs)` for each
        {metric name: (args, kwargs)}."""
        new = []
        for metric, values in self._by_metric(metrics_vars):
            if metric.name in updates:
                args, kwargs = updates[metric.name]
                values = metric.stateless_update_state(values, *args, **kwargs)
            new.extend(values)
        return new

    def _metrics_results(self, metrics_vars, leave_out=()):
        """{name: result} of every metric (a container's entries flattened), as Keras'
        `get_metrics_result` gives them, from the values `metrics_vars`."""
        logs = {}
        for metric, values in self._by_metric(metrics_vars):
            if metric.name not in leave_out:
                result = metric.stateless_result(values)
                logs.update(result if isinstance(result, dict) else {metric.name: result})
        return logs


def _on_their_layouts(variables):
    """Puts each variable's value on the sharding of its layout under the current
    distribution (a no-op for values already there, e.g. on every multi-device mesh)."""
    distribution = keras.distribution.distribution()
    if distribution is None:
        return
    for v in {id(v): v for v in variables}.values():
        layout = distribution.get_variable_layout(v)  # a TensorLayout, or a jax Sharding
        sharding = (
            layout.backend_layout if isinstance(layout, keras.distribution.TensorLayout) else layout
        )
        if isinstance(sharding, jax.sharding.Sharding) and v.value.sharding != sharding:
            v.assign(jax.device_put(v.value, sharding))


def _step_input(x) -> str | None:
    """The entry from which the step finishes this batch (`STEP_INPUTS`), or None."""
    if isinstance(x, dict):
        found = [name for name in STEP_INPUTS if name in x]
        if len(found) > 1:
            raise ValueError(
                f"a batch carries both '{KEYS}' and '{TOKEN_LABELS}'; "
                "it can be finished from one only"
            )
        return found[0] if found else None
    return None


def call_keeping_variables(model, call, *args, **kwargs):
    """`call(*args, **kwargs)` (the model's Keras `fit`, `evaluate` or `predict`), leaving
    the model usable when it fails: Keras on JAX detaches the variables for the length of
    a call (`_purge_model_variables`) and re-attaches them only when it ends normally.
    Keras has no public way to re-attach them: the one private access is here."""
    optimizer = getattr(model, "optimizer", None)
    # Model, metric and optimizer variables, each once; their values are references.
    variables = list(
        {
            id(v): v
            for v in [
                *model.variables,
                *model.metrics_variables,
                *(optimizer.variables if optimizer is not None else []),
            ]
        }.values()
    )
    values = [variable.value for variable in variables]
    try:
        return call(*args, **kwargs)
    except BaseException:
        # What the last completed step left (its state may have been donated), else the
        # values from before.
        model.jax_state_sync()
        model._jax_state = None  # noqa: SLF001
        for variable, value in zip(variables, values):
            if variable._value is None:  # noqa: SLF001  (detached by Keras' fit, predict, ...)
                variable._value = value
        raise


def _check_labelled(model, x, y, where: str):
    """In-memory inputs that carry nothing to score: no `y`, neither mask keys nor token
    labels for the step to draw labels from, and no preprocessor to mask them."""
    if (
        y is None
        and model.preprocessor is None
        and isinstance(x, (np.ndarray, dict))
        and _step_input(x) is None
    ):
        raise InputError(
            f"{where}: no labels: give y (the labels at mask_positions, -100 = "
            "none), or batches that carry them (kroberta.dataset)"
        )


def finish_batch(mask, data):
    """`data` = (x, [y, [sample_weight]]) as the step receives it, finished by `mask`
    (a `kroberta.masking.masker`): when x carries `mask_keys` or `token_labels`,
    (masked x, labels[, sample_weight]); otherwise `data` itself (see the module)."""
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    entry = _step_input(x)
    if entry is None:
        return data
    if y is not None:
        raise ValueError(
            f"a batch with '{entry}' gets its labels from it in the step; it also had labels"
        )
    x, y = mask(x)
    return (x, y) if sample_weight is None else (x, y, sample_weight)


def micro_batches(leaf, n: int):
    """(N * b, ...) -> (N, b, ...): micro-batch i is rows i, i + N, i + 2N, ...

    Strided rather than contiguous, so that under data parallelism every device's
    contiguous block of the batch holds its own share of every micro-batch, and
    no micro-batch needs rows of another device."""
    if leaf is None:
        return None
    rows = leaf.shape[0]
    if rows % n:
        raise ValueError(f"a batch of {rows} rows does not split into {n} micro-batches")
    stacked = jnp.reshape(leaf, (rows // n, n, *leaf.shape[1:]))  # (b, N, ...)
    return jnp.swapaxes(stacked, 0, 1)  # (N, b, ...)


def masked_tokens(labels):
    """The number of real masked slots in `labels` (..., slots), as float32."""
    return jnp.sum((labels != IGNORE_LABEL).astype("float32"))


def _rows(x) -> int:
    return next(leaf for leaf in keras.tree.flatten(x) if leaf is not None).shape[0]


def _count_trace(model, kind: str):
    counts = _traces.setdefault(model, {})
    counts[kind] = counts.get(kind, 0) + 1  # runs when the step is traced, not per call


def trace_count(model, kind: str) -> int:
    """How often `model`'s `kind` ("train" or "test") step was traced (compiled)."""
    return _traces.get(model, {}).get(kind, 0)


def check_model(model, where: str, after=None, order: str | None = None):
    """Raises ArgumentKindError unless `model` is a `kroberta.MaskedLM` (as `kroberta.load`,
    of every source returns); a path given instead gets the call to load it,
    a keras-hub model the call that makes it kroberta's. `after`, `order`: the call's next
    argument and its signature ("kroberta.save(model, run_dir)"): a model there and a path
    here are named as swapped arguments."""
    if isinstance(model, MaskedLM):
        return
    if order and isinstance(model, (str, os.PathLike)) and hasattr(after, "predict"):
        raise ArgumentKindError(f"{where}: the model first, then the path: {order}")
    if isinstance(model, (str, os.PathLike)):
        hint = f"; load it first: model = kroberta.load({os.fspath(model)!r})"
    elif getattr(model, "task_spec", None) is not None:
        hint = (
            "; this is a fine-tuned classifier: kroberta.predict(classifier, texts) predicts "
            "with it, python -m kroberta.export --run ITS_FOLDER exports it"
        )
    elif isinstance(model, keras.Model):
        hint = (
            "; a keras-hub model becomes kroberta's with kroberta.load(PRESET_DIR) "
            "(save it with model.save_to_preset(PRESET_DIR) first)"
        )
    else:
        hint = ""
    raise ArgumentKindError(
        f"{where}: expected a model (kroberta.load(path) of a run, a Hugging "
        f"Face directory or a keras-hub preset), got {type(model).__name__}{hint}"
    )
