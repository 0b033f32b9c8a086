"""The training model: keras-hub's `RobertaMaskedLM` with kroberta's train, test and predict steps.

One step, read top to bottom (`TrainingMaskedLM.train_step`), on the extension points
of Keras' JAX trainer ("Customizing what happens in fit() with JAX": `stateless_call`
through `compute_loss_and_updates`, `optimizer.stateless_apply`, each metric's
`stateless_update_state`):

    1. finish the batch on the device: masks drawn from `mask_keys`, or static slots
       chosen from `token_labels` (`kroberta.model.step_inputs`); a batch masked on
       the host passes through;
    2. the gradient of the whole batch: in N micro-batches scanned one after another
       and weighted by their masked tokens (`kroberta.model.accumulation`), or at
       once for N = 1;
    3. `grad_norm`: the global L2 norm of that gradient, before clipping;
    4. the optimizer's update (AdamW, with its global-norm clipping);
    5. the metrics: Keras' loss tracker, the compiled MaskedAccuracy / Perplexity
       (per micro-batch: they are token-weighted sums) and the grad-norm mean.

K steps per dispatch (`steps_per_execution`) scan this step: Keras >= 3.16 does it
itself, Keras 3.15 through `kroberta.model.fused_steps.StepsPerDispatch`.

The class adds no layer, weight or config entry: `compile_model` makes a built
`RobertaMaskedLM` one in place, and everything kroberta saves (run weights, keras-hub
presets, Hugging Face checkpoints) is written from a stock keras-hub twin, so saved
models load as stock keras-hub `RobertaMaskedLM`s without kroberta.
"""

import weakref

import jax
import jax.numpy as jnp
import keras
import keras_hub
import numpy as np

from kroberta.model.accumulation import masked_tokens, micro_batches
from kroberta.model.step_inputs import finish_batch, finish_inputs
from kroberta.model.fused_steps import StepsPerDispatch

LOSS = "loss"  # Keras' loss tracker
GRAD_NORM = "grad_norm"
_traces = weakref.WeakKeyDictionary()  # model -> {"train"/"test": times the step was traced}


class TrainingMaskedLM(StepsPerDispatch, keras_hub.models.RobertaMaskedLM):
    """`RobertaMaskedLM` whose steps finish batches on the device, accumulate gradients
    and log the gradient norm (see the module). Compile it with `compile`'s two extra
    arguments; `kroberta.model.mlm.compile_model` does."""

    def compile(self, *args, masker=None, evaluation_masker=None,
                gradient_accumulation_steps: int = 1, **kwargs):
        """Keras' `compile`, plus:

        Args:
            masker: `kroberta.masking.masker(data_config, vocabulary, word_starts)`, for
                batches that carry `mask_keys` or `token_labels`; None: batches come
                masked from the host.
            evaluation_masker: the same for `evaluate` (e.g. at `data.eval_mask_rate`);
                None: `masker`.
            gradient_accumulation_steps: N micro-batches per optimizer step.
        """
        super().compile(*args, **kwargs)
        self.masker = masker
        self.evaluation_masker = evaluation_masker or masker
        self.gradient_accumulation_steps = int(gradient_accumulation_steps)
        if getattr(self, "grad_norm_tracker", None) is None:
            self.grad_norm_tracker = keras.metrics.Mean(name=GRAD_NORM)
        self._build_loss_and_metrics()

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
        _on_their_layouts(self.variables + self.metrics_variables)
        return super().make_test_function(force)

    def reset_metrics(self):
        super().reset_metrics()
        _on_their_layouts(self.metrics_variables)

    def fit(self, *args, **kwargs):
        k, steps = self.steps_per_execution, kwargs.get("steps_per_epoch")
        if steps and steps % k and kwargs.get("epochs", 1) > 1:
            # Every epoch but the first would start in the middle of a super-batch.
            raise ValueError(f"fit: steps_per_epoch={steps} is not a multiple of "
                             f"steps_per_execution={k} (the steps fused into one dispatch)")
        return super().fit(*args, **kwargs)

    def train_step(self, state, data):
        """One optimizer step: `(trainable, non_trainable, optimizer, metrics variables),
        batch -> (logs, new state)`, as Keras' JAX trainer calls it.

        The logs hold `loss`, `masked_accuracy`, `perplexity` and `grad_norm`, each over
        all steps since the metrics were last reset (kroberta resets them every log
        interval): `grad_norm` is the mean, over those optimizer steps, of the global L2
        norm of the gradient of the loss, taken over all trainable variables before
        clipping (under accumulation: of the accumulated gradient, i.e. of the whole
        batch's loss; under loss scaling: of the scaled loss).
        """
        _count_trace(self, "train")
        trainable, non_trainable, optimizer_vars, metrics_vars = state
        # 1. Masks drawn on the device (a host-masked batch passes through).
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(
            finish_batch(self.masker, data) if self.masker else data)
        # 2. The whole batch's gradient; the compiled metrics updated on the way.
        grads, loss, non_trainable, metrics_vars = self._batch_gradient(
            trainable, non_trainable, optimizer_vars, metrics_vars, x, y, sample_weight)
        # 3. Its norm before the optimizer clips it.
        grad_norm = jnp.sqrt(sum(jnp.sum(jnp.square(g.astype("float32")))
                                 for g in jax.tree.leaves(grads)))
        # 4. The update (clipping, AdamW, the schedule's step).
        trainable, optimizer_vars = self.optimizer.stateless_apply(optimizer_vars, grads,
                                                                   trainable)
        # 5. The loss tracker (weighted by rows, as Keras') and the gradient norm.
        metrics_vars = self._update_metrics(metrics_vars, {
            LOSS: ((loss,), {"sample_weight": _rows(x)}),
            GRAD_NORM: ((grad_norm,), {})})
        logs = self._metrics_results(metrics_vars)
        return logs, (trainable, non_trainable, optimizer_vars, metrics_vars)

    def _batch_gradient(self, trainable, non_trainable, optimizer_vars, metrics_vars, x, y,
                        sample_weight):
        """(gradient, loss, non_trainable, metrics) of the batch, in
        `gradient_accumulation_steps` micro-batches; the compiled metrics updated."""
        grad_fn = jax.value_and_grad(self.compute_loss_and_updates, has_aux=True)

        def gradient(non_trainable, metrics_vars, x, y, sample_weight):
            (_, (loss, y_pred, non_trainable, metrics_vars)), grads = grad_fn(
                trainable, non_trainable, metrics_vars, x, y, sample_weight, training=True,
                optimizer_variables=optimizer_vars)
            metrics_vars = self._update_metrics(metrics_vars, {
                "compile_metrics": ((y, y_pred), {"sample_weight": sample_weight})})
            return grads, loss, non_trainable, metrics_vars

        n = self.gradient_accumulation_steps
        if n == 1:
            return gradient(non_trainable, metrics_vars, x, y, sample_weight)
        # (N * b, ...) -> (N, b, ...); each micro-batch weighs by its share of the
        # whole batch's masked tokens.
        micro = keras.tree.map_structure(lambda a: micro_batches(a, n), (x, y, sample_weight),
                                         none_is_leaf=True)
        total = jnp.maximum(masked_tokens(y), 1.0)

        def body(carry, batch):
            grads, loss, non_trainable, metrics_vars = carry
            share = masked_tokens(batch[1]) / total
            micro_grads, micro_loss, non_trainable, metrics_vars = gradient(
                non_trainable, metrics_vars, *batch)
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
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(
            finish_batch(self.evaluation_masker, data) if self.evaluation_masker else data)
        _, (loss, y_pred, non_trainable, metrics_vars) = self.compute_loss_and_updates(
            trainable, non_trainable, metrics_vars, x, y, sample_weight, training=False)
        metrics_vars = self._update_metrics(metrics_vars, {
            LOSS: ((loss,), {"sample_weight": _rows(x)}),
            "compile_metrics": ((y, y_pred), {"sample_weight": sample_weight})})
        logs = self._metrics_results(metrics_vars, leave_out=(GRAD_NORM,))
        return logs, (trainable, non_trainable, metrics_vars)

    def predict_step(self, state, data):
        """Keras' predict step on the finished inputs: the logits at their slots."""
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        if self.masker:
            x = finish_inputs(self.masker, x)
        return super().predict_step(state, (x,))

    def _update_metrics(self, metrics_vars, updates):
        """`metrics_vars` (the values of `self.metrics_variables`) after
        `metric.update_state(*args, **kwargs)` for each {metric name: (args, kwargs)}."""
        new, at = [], 0
        for metric in self.metrics:
            values = metrics_vars[at:at + len(metric.variables)]
            at += len(metric.variables)
            if metric.name in updates:
                args, kwargs = updates[metric.name]
                values = metric.stateless_update_state(values, *args, **kwargs)
            new.extend(values)
        return new

    def _metrics_results(self, metrics_vars, leave_out=()):
        """{name: result} of every metric (a container's entries flattened), as Keras'
        `get_metrics_result` gives them, from the values `metrics_vars`."""
        logs, at = {}, 0
        for metric in self.metrics:
            values = metrics_vars[at:at + len(metric.variables)]
            at += len(metric.variables)
            if metric.name in leave_out:
                continue
            result = metric.stateless_result(values)
            logs.update(result if isinstance(result, dict) else {metric.name: result})
        return logs


def _on_their_layouts(variables):
    """Puts each variable's value on the sharding of its layout under the current
    distribution (a no-op for values already there, e.g. on every multi-device mesh)."""
    distribution = keras.distribution.distribution()
    if distribution is None:
        return
    seen = set()
    for v in variables:
        if id(v) in seen:
            continue
        seen.add(id(v))
        layout = distribution.get_variable_layout(v)  # a TensorLayout, or a jax Sharding
        sharding = layout.backend_layout if isinstance(layout, keras.distribution.TensorLayout) \
            else layout
        if isinstance(sharding, jax.sharding.Sharding) and v.value.sharding != sharding:
            v.assign(jax.device_put(v.value, sharding))


def _rows(x) -> int:
    return next(leaf for leaf in keras.tree.flatten(x) if leaf is not None).shape[0]


def _count_trace(model, kind: str):
    counts = _traces.setdefault(model, {})
    counts[kind] = counts.get(kind, 0) + 1  # runs when the step is traced, not per call


def trace_count(model, kind: str) -> int:
    """How often `model`'s `kind` ("train" or "test") step was traced (compiled)."""
    return _traces.get(model, {}).get(kind, 0)


def training_state(model) -> tuple:
    """The state `train_step` takes: the values of (trainable, non-trainable,
    optimizer, metrics) variables, as Keras' JAX trainer gathers them for `fit`."""
    return tuple([v.value for v in variables] for variables in (
        model.trainable_variables, model.non_trainable_variables, model.optimizer.variables,
        model.metrics_variables))


def as_training_model(model) -> TrainingMaskedLM:
    """`model` (a built keras-hub `RobertaMaskedLM`) as a `TrainingMaskedLM`, in place.

    The same object with the same layers, weights and config (the class adds steps,
    nothing else); what `kroberta.model.swap` does for the faster layers. Returns it."""
    from kroberta.model.predicting_mlm import PredictingMaskedLM

    if not isinstance(model, TrainingMaskedLM):
        # kroberta.load's class differs from keras-hub's only in the inputs its steps take
        # and compile's defaults, which compile_model's arguments replace.
        if type(model) not in (keras_hub.models.RobertaMaskedLM, PredictingMaskedLM):
            raise TypeError(f"expected a keras-hub RobertaMaskedLM, got {type(model).__name__}")
        model.__class__ = TrainingMaskedLM
    return model
