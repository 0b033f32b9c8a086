"""A linear probe: how much of a task the frozen model's embeddings already hold.

Cheap enough to run during pretraining: one compiled prediction pass per split
(`kroberta.predict(..., output="embeddings")`, the mean of the last hidden states over
the real tokens), then ridge regression in closed form on the standardised embeddings
(one-hot targets for classification, argmax to predict). No gradient step touches
the model.
"""

import numpy as np

from kroberta.downstream import encoding, metrics
from kroberta.downstream.examples import REGRESSION

RIDGE = 1.0  # the L2 penalty on standardised features


def _embeddings(model, encoded: encoding.Encoded, max_length: int) -> np.ndarray:
    """(n, hidden) pooled embeddings of an encoded split."""
    import kroberta

    token_ids = np.full((len(encoded.ids), max_length), encoded.pad_id, np.int32)
    attention_mask = np.zeros_like(token_ids)
    for row, ids in enumerate(encoded.ids):
        token_ids[row, :len(ids)], attention_mask[row, :len(ids)] = ids, 1
    inputs = {"input_ids": token_ids, "attention_mask": attention_mask}
    return np.asarray(kroberta.predict(model, inputs, output="embeddings")["embeddings"])


def linear_probe(model, spec, train, validation, label_names, max_length: int | None = None):
    """Scores a ridge probe on the frozen model's pooled embeddings.

    Args:
        model: a kroberta model with a tokenizer.
        spec: the task (`TaskSpec`); train, validation: `LabelledSet`s.
        label_names: the class names (None for regression).
        max_length: tokens per sequence (default: the model's max_sequence_length).

    Returns:
        {metric: value} on the validation split.
    """
    max_length = max_length or model.kroberta_config.model.max_sequence_length
    features = [_embeddings(model, encoding.encode(model.tokenizer, s.texts, s.labels, max_length),
                            max_length) for s in (train, validation)]
    mean, scale = features[0].mean(0), features[0].std(0) + 1e-6
    x_train, x_valid = [(f - mean) / scale for f in features]  # (n, hidden) each
    x_train = np.c_[x_train, np.ones(len(x_train))]
    x_valid = np.c_[x_valid, np.ones(len(x_valid))]
    if spec.kind == REGRESSION:
        targets = train.labels[:, None].astype(np.float64)
    else:
        targets = np.eye(len(label_names))[train.labels]  # (n, K)
    gram = x_train.T @ x_train + RIDGE * np.eye(x_train.shape[1])
    weights = np.linalg.solve(gram, x_train.T @ targets)  # (hidden + 1, K)
    outputs = x_valid @ weights
    predictions = outputs[:, 0] if spec.kind == REGRESSION else outputs.argmax(-1)
    names = spec.metrics(len(label_names or ()))
    return metrics.score(names, validation.labels, predictions)
