"""Fine-tuning a tiny model: it learns a task its text decides, not one it cannot; the
result, predictions and the saved classifier agree."""

import dataclasses

import numpy as np
import pytest

import kroberta
from kroberta.downstream import finetuning, prediction
from kroberta.errors import ArgumentKindError, InputError
from tests.downstream.tasks import MARKER, marker_task, sentences

RECIPE = dict(learning_rates=[3e-3], seeds=1, epochs=3, batch_size=32, max_length=16)


def test_a_task_decided_by_a_token_is_learned_and_predicted(downstream_model, tmp_path):
    train, validation = marker_task(tmp_path)
    result = finetuning.finetune(downstream_model, data=train, validation=validation, **RECIPE)
    assert [(t.learning_rate, t.seed) for t in result.trials] == [(3e-3, 0)]
    assert result.metric == "accuracy" and result.label_names == ("0", "1")
    assert result.median["validation"] >= 0.95
    assert set(result.trials[0].scores["validation"]) == {"accuracy", "f1", "matthews", "macro_f1"}
    texts = [f"The apple {MARKER} river stone cloud", "The apple river stone cloud green"]
    predicted = prediction.predict_texts(result.classifier, texts)
    assert predicted["labels"] == ["1", "0"]
    np.testing.assert_allclose(predicted["probabilities"].sum(-1), 1.0, rtol=1e-5)
    # Saved and loaded back, the classifier gives the same probabilities.
    kroberta.save(result.classifier, str(tmp_path / "out"))
    loaded = kroberta.load(str(tmp_path / "out"))
    assert loaded.label_names == ("0", "1") and loaded.max_length == 16
    np.testing.assert_allclose(
        prediction.predict_texts(loaded, texts)["probabilities"],
        predicted["probabilities"],
        atol=1e-5,
    )


def test_random_labels_stay_near_chance(downstream_model, tmp_path):
    train, validation = marker_task(tmp_path, random_labels=True)
    result = finetuning.finetune(downstream_model, data=train, validation=validation, **RECIPE)
    assert 0.3 <= result.median["validation"] <= 0.7


def test_the_models_weights_are_left_as_they_were(downstream_model, tmp_path):
    before = [np.array(w) for w in downstream_model.backbone.get_weights()]
    train, validation = marker_task(tmp_path, train=64, validation=32)
    finetuning.finetune(
        downstream_model, data=train, validation=validation, **{**RECIPE, "epochs": 1}
    )
    for old, new in zip(before, downstream_model.backbone.get_weights()):
        np.testing.assert_array_equal(old, new)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(data="x.jsonl"), "needs both data"),
        (dict(validation="dev.jsonl"), r"validation \(--validation\) without data \(--data"),
        (dict(task="stdlib", validation="dev.jsonl"), "without data"),
        (dict(seeds=0), "seeds=0: expected at least one seed"),
        (dict(seeds=[]), r"seeds=\[\]: expected at least one seed"),
        (dict(batch_size=0), "batch_size=0: must be a positive multiple of the devices"),
        (dict(max_length=4), "max_length=4: expected at least 8"),
        (dict(task="glue/rte"), "needs --data"),
        (dict(task="glue/squad", data="."), "not a GLUE task"),
        (dict(data="a", validation="b", kind="ranking"), "expected classification or regression"),
        (dict(data="a", validation="b", text_fields=("a", "b", "c")), "one text or a pair"),
    ],
)
def test_bad_task_arguments_are_refused_before_any_work(downstream_model, arguments, message):
    with pytest.raises(InputError, match=message):
        finetuning.finetune(downstream_model, **arguments)


def test_a_model_kroberta_did_not_load_is_refused(downstream_model):
    import keras_hub

    bare = keras_hub.models.RobertaTextClassifier(
        backbone=downstream_model.backbone, num_classes=2, preprocessor=None
    )
    with pytest.raises(ArgumentKindError, match="kroberta.finetune: expected a model"):
        finetuning.finetune(bare)


def test_epochs_and_batch_size_are_checked(downstream_model, tmp_path):
    train, validation = marker_task(tmp_path, train=8, validation=8)
    with pytest.raises(InputError, match="epochs=0: expected a whole number of at least 1"):
        finetuning.finetune(downstream_model, data=train, validation=validation, epochs=0)
    with pytest.raises(InputError, match="early_stopping=0: expected a patience of at least 1"):
        finetuning.finetune(downstream_model, data=train, validation=validation, early_stopping=0)
    with pytest.raises(
        InputError,
        match=r"learning_rates 30000: outside 1e-08 to 1 .*"
        r"did you mean 0.0003\?",
    ):
        finetuning.finetune(
            downstream_model, data=train, validation=validation, learning_rates=[3e4]
        )
    with pytest.raises(InputError, match="batch_size=6: must be a positive multiple of the 4"):
        finetuning.finetune(downstream_model, data=train, validation=validation, batch_size=6)


def test_sentences_hold_the_marker_exactly_when_marked():
    marked = sentences(20, 3, marked=lambda i: i % 2)
    assert [MARKER in s.split() for s in marked] == [bool(i % 2) for i in range(20)]


def test_a_regression_task_is_learned(downstream_model, tmp_path):
    """The label is the number of MARKERs (0-2): one output under a squared error."""
    from tests.downstream.tasks import write_jsonl

    paths = []
    for name, count, seed in (("train", 384, 1), ("validation", 96, 2)):
        texts = sentences(count, seed)
        records = []
        for i, text in enumerate(texts):
            words, markers = text.split(), i % 3
            words[1 : 1 + markers] = [MARKER] * markers
            records.append({"text": " ".join(words), "score": float(markers)})
        paths.append(write_jsonl(tmp_path / f"{name}.jsonl", records))
    result = finetuning.finetune(
        downstream_model,
        data=paths[0],
        validation=paths[1],
        kind="regression",
        label_field="score",
        **{**RECIPE, "epochs": 5},
    )
    assert result.metric == "pearson" and result.label_names is None
    assert result.median["validation"] >= 0.9
    values = prediction.predict_texts(result.classifier, [f"The {MARKER} {MARKER} apple river"])
    assert values["values"].shape == (1,)


def test_batches_are_counted_without_building_them(downstream_model):
    from kroberta.downstream import encoding

    texts = (sentences(50, 3), sentences(50, 4))
    for pair in (False, True):
        for max_length in (8, 16, 32):  # pairs of 9-14 tokens each: up to three buckets
            encoded = encoding.encode(
                downstream_model.tokenizer,
                texts if pair else texts[:1],
                np.zeros(50, np.int32),
                max_length,
            )
            for batch_size in (4, 32):
                assert encoding.batch_count(encoded, batch_size, max_length) == len(
                    encoding.batches(encoded, batch_size, max_length)
                )


def test_a_grid_builds_the_validation_batches_once(downstream_model, tmp_path, monkeypatch):
    """Every trial is scored on the same validation batches, built once; each training
    pass is built from its own seed; the schedule is as long as one trial's passes."""
    from kroberta.downstream import classifiers, encoding

    built, schedules = [], []
    build, compile_classifier = encoding.dataset, classifiers.compile_classifier

    def counted_build(encoded, batch_size, max_length, seed=None):
        data, rows = build(encoded, batch_size, max_length, seed)
        built.append((seed, int(data.cardinality())))
        return data, rows

    def counted_compile(classifier, kind, total_steps, *args, **kwargs):
        schedules.append(total_steps)
        return compile_classifier(classifier, kind, total_steps, *args, **kwargs)

    monkeypatch.setattr(encoding, "dataset", counted_build)
    monkeypatch.setattr(classifiers, "compile_classifier", counted_compile)
    train, validation = marker_task(tmp_path, train=100, validation=40)
    result = finetuning.finetune(
        downstream_model,
        data=train,
        validation=validation,
        **{**RECIPE, "learning_rates": [3e-3, 1e-3], "seeds": 2, "epochs": 2},
        widen=False,
    )
    assert len(result.trials) == 4
    assert [seed for seed, _ in built if seed is None] == [None]  # the validation batches
    passes = [(seed, count) for seed, count in built if seed is not None]
    assert len(passes) == 4 * 2 and len({seed for seed, _ in passes}) == 2 * 2
    assert schedules == [sum(count for _, count in passes[:2])] == [2 * 4]  # ceil(100 / 32) = 4


def test_missing_or_unread_labelled_files_are_refused_by_finetune(downstream_model, tmp_path):
    """`kroberta.finetune` checks its files where they come in (the readers trust them)."""
    from kroberta.errors import NotFoundError

    train, _ = marker_task(tmp_path, train=8, validation=8)
    (tmp_path / "folder").mkdir()
    (tmp_path / "notes.txt").write_text("a")
    for validation, error, message in (
        (tmp_path / "nope.jsonl", NotFoundError, "nope.jsonl: no such file$"),
        (tmp_path / "folder", NotFoundError, "folder: a folder, not a file$"),
        (tmp_path / "notes.txt", InputError, "notes.txt: not a labelled file kroberta reads"),
    ):
        with pytest.raises(error, match=message):
            finetuning.finetune(downstream_model, data=train, validation=validation)
    with pytest.raises(NotFoundError, match="nope.jsonl: no such file$"):  # before choosing fields
        finetuning.finetune(downstream_model, data=tmp_path / "nope.jsonl", validation=train)


def test_an_out_folder_of_other_files_is_refused(downstream_model, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("")
    with pytest.raises(
        InputError,
        match=r"--out .*run: holds a pretraining run, not a "
        r"fine-tune's trials; give a new or empty folder",
    ):
        finetuning.finetune(downstream_model, out=str(run))
    (run / "config.toml").unlink()
    (run / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match=r"--out .*run: holds other files"):
        finetuning.finetune(downstream_model, out=str(run))
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]


def test_a_max_length_over_the_models_positions_is_said(downstream_model, caplog):
    longest = downstream_model.backbone.max_sequence_length
    caplog.set_level("WARNING", logger="kroberta")
    with pytest.raises(InputError, match="needs both data"):  # after the lengths are settled
        finetuning.finetune(downstream_model, data="x.jsonl", max_length=longest + 8)
    assert (
        f"--max-length {longest + 8}: the model has {longest} positions; sequences of "
        f"{longest} tokens"
    ) in caplog.text


def test_per_class_figures_equal_predicting_again(downstream_model, tmp_path, monkeypatch):
    """The per-class figures reuse the kept trial's first-split predictions: the same
    figures as predicting the split again with the kept weights, for both starts, with
    no prediction after the grids (one split)."""
    from kroberta.downstream import trial

    seen, calls = [], []
    per_class, predictions_of = finetuning._per_class, trial.predictions_of

    def kept(result, setup):
        before = len(calls)
        figures = per_class(result, setup)
        seen.append((result, setup, len(calls) - before))
        return figures

    def counted(classifier, setup, split):
        calls.append(split)
        return predictions_of(classifier, setup, split)

    monkeypatch.setattr(finetuning, "_per_class", kept)
    monkeypatch.setattr(trial, "predictions_of", counted)
    train, validation = marker_task(tmp_path, train=96, validation=40)
    # Two seeds: whichever is kept, the classifier's weights were put back from it after
    # the other ran.
    result = finetuning.finetune(
        downstream_model,
        data=train,
        validation=validation,
        **{**RECIPE, "seeds": 2, "epochs": 2},
        baseline=True,
        baseline_learning_rates=[3e-3],
        widen=False,
    )
    assert [(r, predicted) for r, _, predicted in seen] == [(result, 0), (result.baseline, 0)]
    for each, setup, _ in seen:
        again = {
            split: dict(
                zip(
                    setup.label_names,
                    finetuning.metrics.per_class(
                        encoded.labels,
                        predictions_of(each.classifier, setup, split),
                        len(setup.label_names),
                    ),
                )
            )
            for split, encoded in setup.evaluation.items()
        }
        assert each.per_class == again
        assert sum(row["support"] for row in each.per_class["validation"].values()) == 40
    # A trial kept without its predictions (a log written before they were kept) is predicted.
    before = len(calls)
    result.kept = dataclasses.replace(result.kept, predictions=None)
    assert per_class(result, seen[0][1]) == result.per_class
    assert calls[before:] == ["validation"]
