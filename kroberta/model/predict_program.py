"""The compiled predict program of both heads: the slots, the MLM and its on-device
reduction, or a fine-tuned classifier's logits; sharded and jitted.

The host sends each batch's tokens and `marks` (B, L): the labels when the inputs carry
them, else the <mask> tokens (-100 elsewhere). The program chooses each row's M slots
from them with `kroberta.masking.first_labelled_slots`, the function training's
static slots use, so no masking runs on the host. A classifier
(keras-hub's `RobertaTextClassifier`) takes {token_ids, padding_mask} and gives its
(B, K) logits (`CLASSIFIER_OUTPUT`). `make_predict_step` is the program as a function
(also what `kroberta.aot` lowers for a TPU topology); `compiled_step` jits it once per
model, output, slots and devices; `weights_snapshot` is what each call passes it.
"""

import weakref

import jax
import jax.numpy as jnp
import keras
import keras_hub

from kroberta import masking
from kroberta.model.metrics import masked_correct, token_cross_entropy
from kroberta.model.top_k import exact_top_k
from kroberta.tokens import IGNORE_LABEL

# Kept beside the model rather than on it: its jitted steps by (output, k, slots,
# positions, group, devices). The steps hold the model's view (`_view`),
# never the model, so the table keeps no model alive.
_compiled = weakref.WeakKeyDictionary()
_classifier_views = weakref.WeakKeyDictionary()  # classifier -> its functional view
CLASSIFIER_OUTPUT = "logits"  # a classifier's one output: its logits (B, K), float32


def _view(model):
    """The Keras model the program calls, on `model`'s layers and weights but not `model`
    itself (a step that held it would keep it alive): a classifier's functional copy, a
    masked LM's view that also gives the last hidden states."""
    if not is_classifier(model):
        return model.with_hidden_states()
    if model not in _classifier_views:
        _classifier_views[model] = keras.Model(model.input, model.output)
    return _classifier_views[model]


def is_classifier(model) -> bool:
    """Whether `model` is a fine-tuned classifier (keras-hub's `RobertaTextClassifier`)."""
    return isinstance(model, keras_hub.models.RobertaTextClassifier)


def choose_slots(marks, padding_mask, slots: int, positions: str):
    """(positions (B, M), valid (B, M), labels (B, M), dropped (B,)) from marks (B, L).

    "masked": each row's first M marked positions (`masking.first_labelled_slots`),
    `dropped` counting the marked ones beyond M; "all": every position (M = L), valid
    where the padding mask is set, labelled with the marks."""
    if positions == "all":
        rows, length = marks.shape
        where = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (rows, length))
        return where, padding_mask > 0, marks, jnp.zeros((rows,), jnp.int32)
    where, labels = masking.first_labelled_slots(marks, slots)
    dropped = jnp.maximum((marks != IGNORE_LABEL).sum(1) - slots, 0).astype(jnp.int32)
    return where, labels != IGNORE_LABEL, labels, dropped


def _reduce(output, k, hidden, logits, padding_mask, labels):
    """The on-device reduction. hidden (B, L, H), logits (B, M, V), padding_mask (B, L),
    labels (B, M) (-100 where none)."""
    if output == "embeddings":
        weights = padding_mask.astype(jnp.float32)[..., None]  # (B, L, 1)
        pooled = (hidden.astype(jnp.float32) * weights).sum(1) / jnp.maximum(weights.sum(1), 1.0)
        return {"embeddings": pooled}  # (B, H)
    logits = logits.astype(jnp.float32)
    if output == "logits":
        return {"logits": logits}
    if output == "top_k":
        # log_softmax(x) = x - logsumexp(x) is never materialised at (B, M, V): the top-k
        # is taken from the logits and shifted by the (B*M,) log-normaliser, which saves
        # a full pass over V. Both read one (B*M, V) array: mixing (B, M, V) and
        # (B*M, V) views made XLA write the biased logits twice.
        batch_size, slots, vocabulary = logits.shape
        flat = logits.reshape(batch_size * slots, vocabulary)
        normaliser = jax.nn.logsumexp(flat, axis=-1)  # (B*M,)
        values, ids = exact_top_k(flat, k)  # (B*M, k), best first
        return {
            "token_ids": ids.reshape(batch_size, slots, k),
            "log_probs": (values - normaliser[:, None]).reshape(batch_size, slots, k),
        }
    # The loss and accuracy training and evaluation compute (`kroberta.model.metrics`),
    # per example: means over the slots whose label is not -100.
    token_loss, weights = token_cross_entropy(labels, logits)  # (B, M), zero where -100
    correct, _ = masked_correct(labels, logits)
    count = weights.sum(-1)
    return {
        "loss": token_loss.sum(-1) / jnp.maximum(count, 1.0),
        "masked_accuracy": (correct * weights).sum(-1) / jnp.maximum(count, 1.0),
        "num_predictions": count.astype(jnp.int32),
    }


def make_predict_step(
    model,
    output: str,
    k: int,
    mesh: jax.sharding.Mesh,
    slots: int,
    group: int = 1,
    positions: str = "masked",
):
    """The predict program over `mesh`, not yet jitted: (step, in_shardings, out_shardings).

    `step(trainable, non_trainable, batch)` takes batch = {token_ids, padding_mask,
    marks}, each int32 (B, L) and sharded along the mesh's "batch" axis, with
    replicated weights; it chooses M = `slots` slots per row (`choose_slots`), runs the
    MLM and reduces on the devices. Besides the reduction's arrays it returns, except
    for "embeddings", `positions` int32 (B, M), `valid` bool (B, M) and `dropped`
    int32 (B,). With `group` > 1 every array has a leading axis of `group` batches,
    (group, batch, ...), mapped over inside the program (the outputs too).
    `compiled_step` jits it for the local devices; `kroberta.aot` lowers the same
    function for a TPU topology. A classifier's step takes batch = {token_ids,
    padding_mask} and returns {"logits": (B, K) float32} (`output`, `k`, `slots` and
    `positions` unused).
    """
    view = _view(model)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    spec = (
        jax.sharding.PartitionSpec("batch")
        if group == 1
        else jax.sharding.PartitionSpec(None, "batch")
    )
    by_batch = jax.sharding.NamedSharding(mesh, spec)

    def classify(trainable, non_trainable, batch):
        x = {"token_ids": batch["token_ids"], "padding_mask": batch["padding_mask"]}
        logits, _ = view.stateless_call(trainable, non_trainable, x, training=False)
        return {CLASSIFIER_OUTPUT: logits.astype(jnp.float32)}  # (B, K)

    def masked_lm(trainable, non_trainable, batch):
        where, valid, labels, dropped = choose_slots(
            batch["marks"], batch["padding_mask"], slots, positions
        )
        x = {
            "token_ids": batch["token_ids"],
            "padding_mask": batch["padding_mask"],
            "mask_positions": where,
        }
        outputs, _ = view.stateless_call(trainable, non_trainable, x, training=False)
        result = _reduce(
            output, k, outputs["hidden"], outputs["logits"], batch["padding_mask"], labels
        )
        if output != "embeddings":
            result.update(positions=where, valid=valid, dropped=dropped)
        return result

    one_batch = classify if is_classifier(model) else masked_lm

    def step(trainable, non_trainable, batch):
        if group == 1:
            return one_batch(trainable, non_trainable, batch)
        return jax.lax.map(lambda b: one_batch(trainable, non_trainable, b), batch)

    return step, (replicated, replicated, by_batch), by_batch


def compiled_step(
    model,
    output: str,
    k: int,
    mesh: jax.sharding.Mesh,
    slots: int,
    group: int = 1,
    positions: str = "masked",
):
    """`make_predict_step` jitted: (jitted, replicated, by_batch shardings); cached, so a
    second call compiles nothing (the weights are arguments, not constants)."""
    cache = _compiled.setdefault(model, {})
    key = (output, k, slots, positions, group, tuple(d.id for d in mesh.devices.flat))
    if key in cache:
        return cache[key]
    step, in_shardings, out_shardings = make_predict_step(
        model, output, k, mesh, slots, group, positions
    )
    jitted = jax.jit(step, in_shardings=in_shardings, out_shardings=out_shardings)
    cache[key] = (jitted, in_shardings[0], in_shardings[2])
    return cache[key]


def weights_snapshot(model, replicated):
    """A private, replicated copy of the current weights (taken on every call, so a
    model trained further since the last call is predicted with its new weights).

    A copy, never an alias: Keras' own fit/predict may donate or purge the
    variables' buffers, which must not pull arrays from under a cached step."""
    view = _view(model)
    return (
        [jax.device_put(v.value, replicated, may_alias=False) for v in view.trainable_variables],
        [
            jax.device_put(v.value, replicated, may_alias=False)
            for v in view.non_trainable_variables
        ],
    )
