"""The model `kroberta.load` returns: keras-hub's `RobertaMaskedLM`, whose Keras `predict`
takes the inputs people pass and never leaves the model unusable.

A Keras or Hugging Face user's first call is `model.predict({"input_ids": ...,
"attention_mask": ...})`. keras-hub's functional model knows only `token_ids`,
`padding_mask` and `mask_positions`, and Keras on JAX detaches the model's variables
for the duration of `predict` (`_purge_model_variables`) and re-attaches them only when
it ends normally: an error while the step is traced leaves every variable empty, and
each later call fails with `'NoneType' object is not callable`.

Here `predict`:
- checks array and dict inputs before Keras sees them and names what to pass;
- accepts Hugging Face's names (`input_ids`, `attention_mask`) as well as keras-hub's,
  a bare (batch, length) array of token ids, and no `mask_positions` (then every
  position is predicted: logits (batch, length, vocabulary), as Hugging Face's
  `RobertaForMaskedLM` returns; `kroberta.predict` reduces on the device instead);
- puts the variables back if Keras fails half way, so the model stays usable.

`fit` and `evaluate` take the same names and also keep the variables on a failure, and
`compile`'s defaults ("auto") count only the label slots that are not -100 (the slots of
`kroberta.dataset`'s batches that hold no masked token).

The class, config and weights are keras-hub's: a run directory holds weights only, and
`kroberta.export_keras_hub` writes the stock class.
"""

import keras
import keras_hub
import numpy as np

from kroberta.errors import KrobertaError
from kroberta.model.metrics import MaskedAccuracy, Perplexity
from kroberta.parallel.distribute import global_distribution
from kroberta.tokens import IGNORE_LABEL, PAD_ID

# Hugging Face's input names -> keras-hub's.
HF_NAMES = {"input_ids": "token_ids", "attention_mask": "padding_mask"}
MODEL_INPUTS = ("token_ids", "padding_mask", "mask_positions")
WHAT_TO_PASS = (
    "pass a (batch, length) array of token ids, or a dict with 'token_ids' (or "
    "'input_ids'), optionally 'padding_mask' (or 'attention_mask') and 'mask_positions' "
    "(batch, slots); or use kroberta.predict(model, ...) for top-k, loss or embeddings "
    "reduced on the device")


class PredictInputError(KrobertaError, ValueError):
    """Inputs that cannot be predicted on (by `model.predict` or `kroberta.predict`); the
    message says why and what to pass."""


def model_inputs(x, pad_token_id: int = PAD_ID, where: str = "model.predict") -> dict:
    """The three model inputs from what a user passed (tensors or tf.data elements too).

    Args:
        x: token ids (batch, length), or a dict with keras-hub's or Hugging Face's names.
        pad_token_id: the id whose positions are padding when no mask is given.
        where: the call that errors name.

    Returns:
        {"token_ids" (B, L), "padding_mask" (B, L), "mask_positions" (B, M)}, int32;
        mask_positions defaults to every position (M = L).
    """
    if not isinstance(x, dict):
        x = {"token_ids": x}
    unknown = sorted(set(x) - set(MODEL_INPUTS) - set(HF_NAMES))
    if unknown:
        raise PredictInputError(f"{where}: unknown input(s) {unknown}; {WHAT_TO_PASS}")
    renamed = {}
    for name, value in x.items():
        key = HF_NAMES.get(name, name)
        if key in renamed:
            raise PredictInputError(f"{where}: {key!r} given twice (as {name!r} too)")
        renamed[key] = value
    if "token_ids" not in renamed:
        raise PredictInputError(f"{where}: no token ids; {WHAT_TO_PASS}")
    token_ids = keras.ops.cast(renamed["token_ids"], "int32")
    if len(token_ids.shape) != 2:
        raise PredictInputError(
            f"{where}: token ids must be (batch, length), got shape {tuple(token_ids.shape)}")
    padding_mask = renamed.get("padding_mask")
    padding_mask = (keras.ops.not_equal(token_ids, pad_token_id) if padding_mask is None
                    else padding_mask)
    positions = renamed.get("mask_positions")
    if positions is None:
        length = token_ids.shape[1]
        positions = keras.ops.broadcast_to(
            keras.ops.arange(length, dtype="int32")[None, :], keras.ops.shape(token_ids))
    return {"token_ids": token_ids, "padding_mask": keras.ops.cast(padding_mask, "int32"),
            "mask_positions": keras.ops.cast(positions, "int32")}


def _check_arrays(x, sequence_length: int, vocabulary_size: int, where: str = "model.predict"):
    """Eager checks of in-memory inputs (numpy or lists), before Keras starts."""
    if isinstance(x, (list, tuple, np.ndarray)):
        x = {"token_ids": x}
    if not isinstance(x, dict):
        return  # a tf.data.Dataset or a generator: checked as its batches are traced
    x = {k: np.asarray(v) if isinstance(v, (list, tuple)) else v for k, v in x.items()}
    for name, value in x.items():
        if isinstance(value, np.ndarray) and value.dtype.kind in "USO":
            raise PredictInputError(
                f"{where}: {name!r} holds strings, not token ids; "
                "kroberta.fill_mask(model, texts) fills <mask> in text, and "
                "model.tokenizer.encode(text).ids gives a text's ids")
    model_inputs(x, where=where)
    length = np.shape(x.get("token_ids", x.get("input_ids")))[-1]
    # Out of range, an id or a position would be clamped by a gather: a wrong answer.
    limits = {"token_ids": (vocabulary_size, "the vocabulary"),
              "mask_positions": (length, "the sequence's positions")}
    for name, value in x.items():
        shape = np.shape(value)
        if len(shape) != 2:
            raise PredictInputError(f"{where}: {name!r} must be 2-D (batch, ...), "
                                    f"got shape {shape}")
        key = HF_NAMES.get(name, name)
        if key != "mask_positions" and shape[1] > sequence_length:
            raise PredictInputError(
                f"{where}: {name!r} holds {shape[1]} positions but the model reads at "
                f"most {sequence_length} (model.max_sequence_length)")
        limit = limits.get(key)
        if limit is not None and isinstance(value, np.ndarray) and value.size:
            bad = np.argwhere((value < 0) | (value >= limit[0]))
            if len(bad):
                at = ", ".join(str(int(i)) for i in bad[0])
                raise PredictInputError(
                    f"{where}: {name}[{at}] = {int(value[tuple(bad[0])])} is outside "
                    f"{limit[1]} [0, {limit[0]})")


@keras.saving.register_keras_serializable(package="kroberta")
class PredictingMaskedLM(keras_hub.models.RobertaMaskedLM):
    """keras-hub's `RobertaMaskedLM` whose `predict`, `evaluate` and `fit` take the inputs
    users pass, and whose default loss and metrics skip the -100 label slots."""

    def compile(self, optimizer="auto", loss="auto", *, weighted_metrics="auto", **kwargs):
        """keras-hub's `compile`, with "auto" meaning a loss and metrics over the real label
        slots: kroberta's batches (`kroberta.dataset`) hold -100 in the slots that have no
        masked token, which keras-hub's defaults would count in their means. Sample
        weights (keras-hub's preprocessors' `mask_weights`) still apply."""
        if loss == "auto":
            loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                              ignore_class=IGNORE_LABEL)
        if weighted_metrics == "auto":
            weighted_metrics = [MaskedAccuracy(), Perplexity()]
        super().compile(optimizer=optimizer, loss=loss, weighted_metrics=weighted_metrics,
                        **kwargs)

    # Keras' JAX trainer: *_step(state, data); the model inputs renamed and completed first.
    def predict_step(self, state, data):
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        return super().predict_step(state, (model_inputs(x),))

    def train_step(self, state, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        return super().train_step(state, keras.utils.pack_x_y_sample_weight(
            model_inputs(x, where="model.fit"), y, sample_weight))

    def test_step(self, state, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        return super().test_step(state, keras.utils.pack_x_y_sample_weight(
            model_inputs(x, where="model.evaluate"), y, sample_weight))

    def fit(self, x=None, y=None, *args, **kwargs):
        """Keras `fit`, taking the inputs `predict` takes; a failure leaves the model usable
        (its variables attached)."""
        x = self._in_memory_inputs(x, "model.fit")
        if self.optimizer is not None and not self.optimizer.built:
            # Built now (as fit would) so that its variables are kept too.
            self.optimizer.build(self.trainable_variables)
        return self._keeping_variables(super().fit, x, y, *args, **kwargs)

    def evaluate(self, x=None, y=None, *args, **kwargs):
        """Keras `evaluate`, taking the inputs `predict` takes; a failure leaves the model
        usable (its variables attached)."""
        return self._keeping_variables(super().evaluate,
                                       self._in_memory_inputs(x, "model.evaluate"), y, *args,
                                       **kwargs)

    def _in_memory_inputs(self, x, where: str):
        """Arrays and dicts of arrays checked and completed to the three model inputs before
        Keras sees them (`fit` and `evaluate` build their metrics from them, before the
        steps rename anything); a dataset or generator is passed on, its elements renamed
        in the steps."""
        if isinstance(x, (list, tuple)) and x and not isinstance(x[0], (int, np.integer)):
            x = np.asarray(x)
        if not isinstance(x, (np.ndarray, dict)):
            return x
        _check_arrays(x, self.backbone.max_sequence_length, self.backbone.vocabulary_size, where)
        return {name: np.asarray(value) for name, value in model_inputs(x, where=where).items()}

    def predict(self, x, batch_size=None, verbose="auto", steps=None, callbacks=None):
        """Keras `predict`: logits (batch, slots, vocabulary) at `mask_positions`, or
        (batch, length, vocabulary) at every position when none are given.

        Raises:
            PredictInputError: inputs the model cannot take (says what to pass).
        """
        x = self._in_memory_inputs(x, "model.predict")
        # A loaded model's weights live on one device; a distribution that training left set
        # in this process would demand batches divisible by its devices.
        with global_distribution(None):
            return self._keeping_variables(super().predict, x, batch_size=batch_size,
                                           verbose=verbose, steps=steps, callbacks=callbacks)

    def _keeping_variables(self, call, *args, **kwargs):
        optimizer = getattr(self, "optimizer", None)
        # Model, metric and optimizer variables, each once; their values are references.
        variables = list({id(v): v for v in [*self.variables, *self.metrics_variables, *(
            optimizer.variables if optimizer is not None else [])]}.values())
        values = [variable.value for variable in variables]
        try:
            return call(*args, **kwargs)
        except BaseException:
            self._reattach(variables, values)
            raise

    def _reattach(self, variables, values):
        # Keras re-attaches the variables only when a call ends normally: what the last
        # completed step left (its state may have been donated), else the values from before.
        self.jax_state_sync()
        self._jax_state = None
        for variable, value in zip(variables, values):
            if variable._value is None:  # noqa: SLF001  (detached by Keras' fit, predict, ...)
                variable._value = value
