"""The classifier's mean pooling (`pooling="mean"`): its head reads the mean of the last
hidden states over the tokens the padding mask keeps (padding changes nothing, a
batch's filler row gives no NaN), a saved classifier is loaded back with it, and the
Hugging Face and keras-hub exports, whose heads read `<s>`, refuse it."""

import json

import numpy as np
import pytest

import kroberta
from kroberta.downstream import classifiers
from kroberta.downstream.tasks import TaskSpec
from kroberta.errors import ConversionError, InputError
from kroberta.run_layout import CLASSIFIER_FILE
from kroberta.tokens import BOS_ID, EOS_ID, PAD_ID
from tests.downstream.tasks import marker_task

LABELS = ("no", "yes", "maybe")
TOKENS = [BOS_ID, 7, 8, 9, 10, EOS_ID]  # one text's ids


def mean_classifier(model, seed=0):
    """A mean-pooled classifier on `model`'s shape with random weights (nonzero biases)."""
    classifier = classifiers.build_classifier(
        model.kroberta_config.model, len(LABELS), classifiers.MEAN
    )
    rng = np.random.default_rng(seed)
    classifier.set_weights(
        [(w + rng.normal(0, 0.05, w.shape)).astype("float32") for w in classifier.get_weights()]
    )
    return classifiers.describe(
        classifier, model.kroberta_config, model.tokenizer, TaskSpec("toy"), LABELS, 16
    )


def padded(tokens, length, rows=1):
    """({token_ids, padding_mask} each (rows, length)): `tokens` then padding, per row."""
    ids = np.full((rows, length), PAD_ID, np.int32)
    ids[:, : len(tokens)] = tokens
    mask = np.zeros((rows, length), np.int32)
    mask[:, : len(tokens)] = 1
    return {"token_ids": ids, "padding_mask": mask}


def logits(classifier, x):
    return np.asarray(classifier(x, training=False))  # (batch, K)


@pytest.fixture(scope="module")
def classifier(downstream_model):
    return mean_classifier(downstream_model)


@pytest.mark.fast
def test_an_unknown_pooling_is_refused_by_name():
    with pytest.raises(InputError, match="pooling 'max': expected one of first, mean"):
        classifiers.Classifier(backbone=None, num_classes=2, pooling="max")


def test_the_head_reads_the_masked_mean_of_the_last_hidden_states(classifier):
    x = padded(TOKENS, 12)
    hidden = np.asarray(classifier.backbone(x, training=False))[0]  # (length, hidden)
    mean = hidden[: len(TOKENS)].mean(axis=0)  # (hidden,): the padding left out
    dense, dense_bias, out, out_bias = (
        np.asarray(v)
        for v in (
            classifier.pooled_dense.kernel,
            classifier.pooled_dense.bias,
            classifier.output_dense.kernel,
            classifier.output_dense.bias,
        )
    )
    expected = np.tanh(mean @ dense + dense_bias) @ out + out_bias  # (K,)
    np.testing.assert_allclose(logits(classifier, x)[0], expected, rtol=1e-5, atol=1e-6)
    # and not the first token's state, which `pooling="first"` reads
    first = np.tanh(hidden[0] @ dense + dense_bias) @ out + out_bias
    assert np.abs(first - expected).max() > 1e-3


def test_padding_changes_nothing_and_an_all_padding_row_is_no_nan(classifier):
    short, long = logits(classifier, padded(TOKENS, 8)), logits(classifier, padded(TOKENS, 24))
    np.testing.assert_allclose(short, long, rtol=1e-5, atol=1e-6)
    filler = padded([], 8)  # a batch's filler row: no token kept
    assert np.isfinite(logits(classifier, filler)).all()


def test_a_saved_mean_pooled_classifier_loads_back_with_its_pooling(classifier, tmp_path):
    directory = kroberta.save(classifier, str(tmp_path / "saved"))
    assert json.load(open(tmp_path / "saved" / CLASSIFIER_FILE))["pooling"] == "mean"
    loaded = kroberta.load(directory)
    assert loaded.pooling == classifiers.MEAN
    x = padded(TOKENS, 16, rows=2)
    np.testing.assert_array_equal(logits(loaded, x), logits(classifier, x))


def test_a_saved_unknown_pooling_is_named_with_its_file(classifier, tmp_path):
    directory = kroberta.save(classifier, str(tmp_path / "saved"))
    path = tmp_path / "saved" / CLASSIFIER_FILE
    path.write_text(json.dumps({**json.load(open(path)), "pooling": "max"}))
    with pytest.raises(InputError, match=f"{CLASSIFIER_FILE}: pooling 'max'"):
        kroberta.load(directory)


@pytest.mark.parametrize(
    "export, head",
    [
        (kroberta.export_hf, "Hugging Face's RobertaForSequenceClassification"),
        (kroberta.export_keras_hub, "keras-hub's RobertaTextClassifier"),
    ],
)
def test_the_exports_refuse_a_mean_pooled_head(classifier, tmp_path, export, head):
    with pytest.raises(ConversionError) as raised:
        export(classifier, str(tmp_path / "export"))
    message = str(raised.value)
    assert "pooling='mean'" in message and f"{head} reads the first token (<s>)" in message
    assert "--pooling first" in message
    assert not (tmp_path / "export").exists() or not any((tmp_path / "export").iterdir())


def test_finetune_gives_both_starts_the_head_asked_for(downstream_model, tmp_path):
    train, validation = marker_task(tmp_path, train=32, validation=16)
    result = kroberta.finetune(
        downstream_model,
        "marker",
        train,
        validation,
        seeds=1,
        epochs=1,
        learning_rates=[1e-3],
        widen=False,
        pooling="mean",
        baseline=True,
    )
    assert result.classifier.pooling == result.baseline.classifier.pooling == classifiers.MEAN
    assert result.classifier.get_layer("mean_pooling") is not None


def test_finetune_refuses_an_unknown_pooling_before_any_work(downstream_model):
    with pytest.raises(InputError, match="pooling='max': expected one of first, mean"):
        kroberta.finetune(downstream_model, pooling="max")
