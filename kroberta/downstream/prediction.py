"""A fine-tuned classifier's predictions.

`predict_texts` (what `kroberta.predict` calls for a classifier) encodes texts and
buckets them as in training; `outputs` runs the compiled, sharded predict program both
heads share (`kroberta.model.predict_program`) over such batches. `kroberta.save` writes
a classifier's folder, which `kroberta.load` reads back.
"""

import jax
import numpy as np

from kroberta.downstream import encoding
from kroberta.downstream.tasks import REGRESSION
from kroberta.errors import InputError
from kroberta.model import predict_program


def outputs(classifier, data, rows: np.ndarray, count: int) -> np.ndarray:
    """The classifier's (count, K) logits (K = 1: regression values) of a split, in the
    split's order, from the predict program over `encoding.dataset`'s (data, rows), each
    batch split over this process's devices."""
    mesh = jax.sharding.Mesh(np.array(jax.local_devices()), ("batch",))
    jitted, replicated, by_batch = predict_program.compiled_step(
        classifier, predict_program.CLASSIFIER_OUTPUT, 0, mesh, 0
    )
    weights = predict_program.weights_snapshot(classifier, replicated)
    # Every batch dispatched before the first is read back: the devices never wait on the host.
    dispatched = [
        jitted(*weights, jax.device_put(x, by_batch))[predict_program.CLASSIFIER_OUTPUT]
        for x, *_ in data.as_numpy_iterator()
    ]
    values = np.concatenate([np.asarray(v) for v in dispatched])  # (rows, K)
    ordered = np.empty((count, values.shape[1]), np.float32)
    ordered[rows[rows >= 0]] = values[rows >= 0]  # padding rows (-1) dropped
    return ordered


def _what_texts_are(texts) -> str | None:
    """None for a non-empty list of strings, or one or two such lists (of one length);
    else what `texts` is, for the message: the item that is not a string, say."""
    if isinstance(texts, str):
        return "one string (a list of one: [text])"
    if not isinstance(texts, (list, tuple)):
        return type(texts).__name__
    if not texts:
        return "an empty list"
    if all(isinstance(t, str) for t in texts):
        return None
    if all(isinstance(group, (list, tuple)) for group in texts):
        pair = len(texts) in (1, 2) and len(set(map(len, texts))) == 1
        if pair and all(group and all(isinstance(t, str) for t in group) for group in texts):
            return None
        return f"{len(texts)} lists of {', '.join(str(len(group)) for group in texts)} texts"
    i, item = next((i, t) for i, t in enumerate(texts) if not isinstance(t, str))
    return f"a list whose item {i} is {type(item).__name__} {str(item)[:40]!r}"


def predict_texts(classifier, texts, batch_size: int = 32) -> dict:
    """Predicts texts (a list of strings, or a pair of lists for a pair task) with a
    fine-tuned classifier: `kroberta.predict(classifier, texts)`.

    Args:
        classifier: a fine-tuned classifier (`kroberta.finetune`'s, `kroberta.load`'s).
        texts: the texts; for a pair task two lists, the first and second texts. A
            numpy array or a pandas Series of strings is taken as its `tolist()`.
        batch_size: sequences per step (rounded up to a multiple of the devices).

    Returns:
        For classification {"probabilities": (n, K) float32, "labels": n class names};
        for regression {"values": (n,) float32}.
    """
    if hasattr(texts, "tolist") and not isinstance(texts, (str, list, tuple)):
        texts = texts.tolist()  # a numpy array (one or two rows of texts), a pandas column
    refused = _what_texts_are(texts)
    if refused:
        raise InputError(
            "texts: expected a list of strings, or two lists (a pair task's first "
            f"and second texts), got {refused}"
        )
    if isinstance(texts[0], str):
        texts = (list(texts),)
    labels = np.zeros((len(texts[0]),), np.int32)
    encoded = encoding.encode(classifier.tokenizer, tuple(texts), labels, classifier.max_length)
    devices = jax.local_device_count()
    data, rows = encoding.dataset(
        encoded, -(-batch_size // devices) * devices, classifier.max_length
    )
    ordered = outputs(classifier, data, rows, len(labels))  # (n, K)
    if classifier.task_spec.kind == REGRESSION:
        return {"values": ordered[:, 0]}
    shifted = np.exp(ordered - ordered.max(-1, keepdims=True))
    probabilities = shifted / shifted.sum(-1, keepdims=True)
    return {
        "probabilities": probabilities,
        "labels": [classifier.label_names[i] for i in probabilities.argmax(-1)],
    }
