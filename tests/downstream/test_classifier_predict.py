"""kroberta.predict on a fine-tuned classifier: texts in, probabilities and labels out, the
batch split over the devices, the same from the result and from its saved folder."""

import jax
import numpy as np
import pytest

import kroberta
from kroberta.downstream import finetuning, prediction
from kroberta.errors import ArgumentKindError, InputError
from tests.downstream.tasks import MARKER, marker_task

TEXTS = [
    f"The apple {MARKER} river stone cloud",
    "The apple river stone cloud green",
    "stone cloud",
    f"{MARKER} green",
]


@pytest.fixture(scope="module")
def classifier(downstream_model, tmp_path_factory):
    train, validation = marker_task(tmp_path_factory.mktemp("task"), train=96, validation=32)
    return finetuning.finetune(
        downstream_model,
        data=train,
        validation=validation,
        learning_rates=[3e-3],
        seeds=1,
        epochs=1,
        batch_size=32,
        max_length=16,
    ).classifier


def test_predict_takes_texts_and_gives_probabilities_and_labels(classifier, tmp_path):
    assert jax.local_device_count() == 4
    predicted = kroberta.predict(classifier, TEXTS, batch_size=6)  # rounded up to 8
    assert predicted["probabilities"].shape == (4, 2)
    np.testing.assert_allclose(predicted["probabilities"].sum(-1), 1.0, rtol=1e-5)
    assert predicted["labels"] == [
        classifier.label_names[i] for i in predicted["probabilities"].argmax(-1)
    ]
    np.testing.assert_array_equal(
        predicted["probabilities"], prediction.predict_texts(classifier, TEXTS)["probabilities"]
    )
    # A numpy array of texts (a column read with numpy or pandas) is its list.
    as_array = kroberta.predict(classifier, np.array(TEXTS), batch_size=6)
    np.testing.assert_array_equal(as_array["probabilities"], predicted["probabilities"])
    # Loaded from its folder (built over the same devices), it predicts the same.
    loaded = kroberta.load(kroberta.save(classifier, str(tmp_path / "c")))
    np.testing.assert_allclose(
        kroberta.predict(loaded, TEXTS)["probabilities"], predicted["probabilities"], atol=1e-6
    )


def test_save_takes_a_classifier_and_checks_its_path(classifier, tmp_path):
    """kroberta.save writes either head: a classifier's folder holds its own files, and the
    path is checked as a masked LM's is."""
    from kroberta.run_layout import CLASSIFIER, model_source

    folder = str(tmp_path / "c")
    assert kroberta.save(classifier, folder) == folder
    assert model_source(folder, "--run")[1] == CLASSIFIER
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [
        "classifier.json",
        "classifier.weights.h5",
        "config.toml",
        "tokenizer.json",
    ]
    with pytest.raises(
        ArgumentKindError,
        match=r"kroberta.save: run_dir: expected a "
        r"directory's path, got int",
    ):
        kroberta.save(classifier, 3)
    assert kroberta.save(classifier, folder) == folder  # a classifier's folder: replaced
    # A pretraining run's folder or one of other files is never written into.
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("run_dir = 'run'\n")
    (run / "tokenizer.json").write_text("{}")
    data = tmp_path / "data"
    data.mkdir()
    for name in ("a.jsonl", "b.jsonl", "c.jsonl", "d.jsonl"):
        (data / name).write_text("{}\n")
    for directory, held in (
        (run, "a pretraining run"),
        (data, "other files (a.jsonl, b.jsonl, c.jsonl, ...)"),
    ):
        with pytest.raises(InputError) as refused:
            kroberta.save(classifier, str(directory))
        assert str(refused.value) == (
            f"kroberta.save: {directory} holds {held}, not a classifier; give a new or empty "
            "directory, or one a classifier was saved to"
        )
    assert (run / "config.toml").read_text() == "run_dir = 'run'\n"
    assert sorted(p.name for p in data.iterdir()) == ["a.jsonl", "b.jsonl", "c.jsonl", "d.jsonl"]


def test_bad_texts_and_mlm_functions_on_a_classifier_are_clear_errors(classifier):
    with pytest.raises(InputError, match="texts: expected a list of strings"):
        kroberta.predict(classifier, "one text")
    with pytest.raises(InputError, match="texts: expected a list of strings"):
        kroberta.predict(classifier, [1, 2])
    # The masked LM's arguments are refused, never ignored (probabilities for embeddings).
    for given in (dict(output="embeddings"), dict(k=3), dict(positions="all")):
        ((name, value),) = given.items()
        with pytest.raises(InputError) as refused:
            kroberta.predict(classifier, TEXTS, **given)
        assert str(refused.value) == (
            f"kroberta.predict: {name}={value!r} is for a masked LM; a fine-tuned classifier "
            "predicts its probabilities (or values) from texts and takes only batch_size (for "
            "embeddings, predict with the pretrained model)"
        )
    with pytest.raises(
        ArgumentKindError,
        match=r"a fine-tuned classifier: kroberta.predict\("
        r"classifier, texts\)",
    ):
        kroberta.fill_mask(classifier, "a <mask> text")


def test_keras_predict_on_texts_is_refused_and_a_failed_call_leaves_the_classifier_usable(
    classifier,
):
    before = kroberta.predict(classifier, TEXTS)["probabilities"]
    for texts in (TEXTS, np.array(TEXTS), "one text"):
        with pytest.raises(
            InputError,
            match=r"classifier.predict: texts, but Keras' predict "
            r"takes token ids .* kroberta.predict\(classifier",
        ):
            classifier.predict(texts)
    with pytest.raises(InputError, match=r"classifier.evaluate: texts"):
        classifier.evaluate(TEXTS, np.zeros(4))
    # A call Keras itself fails (ids of the wrong rank) re-attaches the variables.
    with pytest.raises(Exception):  # noqa: B017 (whichever error Keras raises)
        classifier.predict(
            {"token_ids": np.zeros((4,), "int32"), "padding_mask": np.ones((4,), "int32")}
        )
    np.testing.assert_array_equal(kroberta.predict(classifier, TEXTS)["probabilities"], before)
