"""`kroberta.load` of each (source, head) pair: a kroberta folder, a Hugging Face directory
and a keras-hub preset, each holding a masked LM or a fine-tuned classifier, gives the
class that was written with its weights and outputs; `kroberta.predict` runs both heads
through the one compiled program, whose classifier logits are Keras' own predict's."""

import uuid

import numpy as np
import pytest

import kroberta
from kroberta import storage
from kroberta.downstream import classifiers, encoding, prediction
from kroberta.downstream.tasks import TaskSpec
from kroberta.model import predict_program
from kroberta.parallel.distribute import global_distribution
from kroberta.run_layout import CLASSIFIER, HF, KERAS_HUB, MASKED_LM, RUN, model_source
from kroberta.tokens import BOS_ID, EOS_ID, MASK_ID

LABELS = ("no", "yes")
LENGTH = 16  # the classifier's max_length, below the model's 32 positions
TEXTS = ["The apple river stone cloud", "stone cloud", "green", "The apple river"]


@pytest.fixture(scope="module")
def written(downstream_model, tmp_path_factory):
    """({(source, head): directory}, {head: the model written there})."""
    root = tmp_path_factory.mktemp("load")
    config = downstream_model.kroberta_config
    classifier = classifiers.build_classifier(config.model, len(LABELS))
    rng = np.random.default_rng(0)  # nonzero biases: every head tensor matters
    classifier.set_weights(
        [(w + rng.normal(0, 0.05, w.shape)).astype("float32") for w in classifier.get_weights()]
    )
    classifiers.describe(
        classifier, config, downstream_model.tokenizer, TaskSpec("toy"), LABELS, LENGTH
    )
    models = {MASKED_LM: downstream_model, CLASSIFIER: classifier}
    paths = {}
    for head, model in models.items():
        name = head.replace(" ", "-")
        if head == MASKED_LM:
            kroberta.save(model, str(root / f"{name}-run"))
            paths[RUN, head] = str(root / f"{name}-run")
        else:
            paths[RUN, head] = kroberta.save(model, str(root / f"{name}-run"))
        paths[HF, head] = kroberta.export_hf(model, str(root / f"{name}-hf"))
        paths[KERAS_HUB, head] = kroberta.export_keras_hub(model, str(root / f"{name}-preset"))
    return paths, models


def _ids(length: int = LENGTH):
    """(4, length) token ids with a <mask> in each row and padding after row i's 8 + 2i."""
    rng = np.random.default_rng(1)
    ids = rng.integers(5, 300, (4, length)).astype("int32")
    mask = np.zeros((4, length), "int32")
    for i in range(4):
        mask[i, : 8 + 2 * i] = 1
    ids[:, 0], ids[np.arange(4), 7 + 2 * np.arange(4)], ids[:, 3] = BOS_ID, EOS_ID, MASK_ID
    return np.where(mask > 0, ids, 1).astype("int32"), mask


@pytest.mark.parametrize("head", [MASKED_LM, CLASSIFIER])
@pytest.mark.parametrize("source", [RUN, HF, KERAS_HUB])
def test_load_gives_each_head_from_each_source(written, source, head):
    paths, models = written
    assert model_source(paths[source, head]) == (source, head)
    original, loaded = models[head], kroberta.load(paths[source, head])
    assert type(loaded) is type(original)
    assert len(loaded.weights) == len(original.weights)
    for theirs, ours in zip(original.weights, loaded.weights):
        np.testing.assert_array_equal(np.asarray(ours.value), np.asarray(theirs.value), ours.path)
    # The same ids (a keras-hub preset's is rebuilt from its vocabulary and merges).
    assert loaded.tokenizer.get_vocab() == original.tokenizer.get_vocab()
    assert loaded.tokenizer.encode(TEXTS[0]).ids == original.tokenizer.encode(TEXTS[0]).ids
    ids, mask = _ids()
    x = {"token_ids": ids, "padding_mask": mask}
    if head == MASKED_LM:
        x["mask_positions"] = np.full((4, 1), 3, "int32")
        assert loaded.kroberta_config.model.hidden_dim == original.backbone.hidden_dim
    else:
        assert (loaded.label_names, loaded.max_length) == (LABELS, LENGTH)
        assert loaded.task_spec.kind == original.task_spec.kind
    np.testing.assert_array_equal(
        np.asarray(loaded(x, training=False)), np.asarray(original(x, training=False))
    )


def test_a_classifier_saves_to_and_loads_from_a_url_from_every_source(written):
    paths, models = written
    urls = {
        RUN: kroberta.save(models[CLASSIFIER], f"memory://kroberta-{uuid.uuid4().hex[:8]}/saved")
    }
    for source in (HF, KERAS_HUB):
        urls[source] = f"memory://kroberta-{uuid.uuid4().hex[:8]}/{source}"
        storage.put_tree(paths[source, CLASSIFIER], urls[source])
    for source, url in urls.items():
        loaded = kroberta.load(url)
        assert (loaded.label_names, loaded.max_length) == (LABELS, LENGTH), source
        for theirs, ours in zip(models[CLASSIFIER].weights, loaded.weights):
            np.testing.assert_array_equal(np.asarray(ours.value), np.asarray(theirs.value))


def test_predict_runs_both_heads_through_the_one_program(written, monkeypatch):
    paths, _ = written
    built = []
    make = predict_program.make_predict_step

    def counted(model, *args, **kwargs):
        built.append(type(model).__name__)
        return make(model, *args, **kwargs)

    monkeypatch.setattr(predict_program, "make_predict_step", counted)
    classifier = kroberta.load(paths[RUN, CLASSIFIER])  # fresh: nothing compiled for it yet
    masked_lm = kroberta.load(paths[RUN, MASKED_LM])
    predicted = kroberta.predict(classifier, TEXTS)
    top = kroberta.predict(masked_lm, _ids(32)[0], k=3)
    assert built == ["Classifier", "MaskedLM"]
    assert predicted["probabilities"].shape == (4, 2) and top["token_ids"].shape[::2] == (4, 3)
    # The program's logits are those of Keras' predict step, bit for bit.
    labels = np.zeros((len(TEXTS),), np.int32)
    encoded = encoding.encode(classifier.tokenizer, (TEXTS,), labels, LENGTH)
    data, rows = encoding.dataset(encoded, 8, LENGTH)
    with global_distribution(classifiers.data_parallel()):
        keras = np.asarray(classifier.predict(data, verbose=0), np.float32)
    expected = np.empty((len(TEXTS), 2), np.float32)
    expected[rows[rows >= 0]] = keras[rows >= 0]  # padding rows (-1) dropped
    np.testing.assert_array_equal(prediction.outputs(classifier, data, rows, len(TEXTS)), expected)
