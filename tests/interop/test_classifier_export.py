"""A fine-tuned classifier exported to Hugging Face (`RobertaForSequenceClassification`)
and keras-hub (`RobertaTextClassifier`) gives the classifier's logits, on the same token
ids and attention mask (padded rows too), and `kroberta.load` reads both exports back; a
classifier given where a masked LM goes, or the reverse, is one error (needs torch and
transformers; skipped without)."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing in these tests may download
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import json  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch", reason="HF parity tests need torch")
transformers = pytest.importorskip("transformers", reason="HF parity tests need transformers")

import kroberta  # noqa: E402
import kroberta.cli.export  # noqa: E402
from kroberta.downstream import classifiers, prediction  # noqa: E402
from kroberta.downstream.model_files import export_run  # noqa: E402
from kroberta.downstream.tasks import REGRESSION, TaskSpec  # noqa: E402
from kroberta.errors import InputError  # noqa: E402
from kroberta.interop import keras_hub_presets  # noqa: E402
from kroberta.run_layout import MASKED_LM, model_source  # noqa: E402
from tests.interop.test_hf import TINY, TOLERANCE, hf_logits, padded_batch  # noqa: E402

LABELS = ("negative", "neutral", "positive")
MAX_LENGTH = 24  # below the tiny model's 32 positions: the exports must keep it


def saved_classifier(model, directory, label_names=LABELS, seed=0):
    """A `kroberta.save` folder of a classifier on `model`'s shape with random weights
    (nonzero biases, so every head tensor matters)."""
    outputs = len(label_names) if label_names else 1
    classifier = classifiers.build_classifier(model.kroberta_config.model, outputs)
    rng = np.random.default_rng(seed)
    for v in classifier.weights:
        v.assign((np.asarray(v.value) + rng.normal(0, 0.05, v.shape)).astype("float32"))
    classifier.tokenizer, classifier.kroberta_config = model.tokenizer, model.kroberta_config
    classifier.task_spec = (
        TaskSpec("toy", kind=REGRESSION, metric="pearson")
        if outputs == 1
        else TaskSpec("toy pairs", ("premise", "hypothesis"), "gold")
    )
    classifier.label_names, classifier.max_length = label_names, MAX_LENGTH
    return kroberta.save(classifier, str(directory))


def keras_logits(classifier, ids, mask):
    # A direct call: keras-hub's predict would run a preset's preprocessor on the ids.
    return np.asarray(
        classifier({"token_ids": ids, "padding_mask": mask}, training=False)
    )  # (batch, K)


@pytest.fixture(scope="module")
def exported(downstream_model, tmp_path_factory):
    """{"saved", "hf", "keras-hub"}: a classifier's folder and its two exports."""
    root = tmp_path_factory.mktemp("classifier")
    paths = {"saved": saved_classifier(downstream_model, root / "saved")}
    for format in ("hf", "keras-hub"):
        paths[format] = export_run(paths["saved"], str(root / format), format=format)
    return paths


@pytest.fixture(scope="module")
def batch(downstream_model):
    return padded_batch(downstream_model.kroberta_config.model)  # 4 rows, 3 of them padded


def test_transformers_loads_the_export_with_the_classifiers_logits(exported, batch):
    model, info = transformers.RobertaForSequenceClassification.from_pretrained(
        exported["hf"], output_loading_info=True
    )
    assert not any(info.values()), info  # no missing, unexpected or mismatched keys
    assert (
        model.config.num_labels == 3 and model.config.problem_type == "single_label_classification"
    )
    assert model.config.id2label == dict(enumerate(LABELS))
    assert model.config.label2id == {name: i for i, name in enumerate(LABELS)}
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported["hf"])
    assert tokenizer.model_max_length == MAX_LENGTH
    ours = keras_logits(kroberta.load(exported["saved"]), *batch)
    theirs = hf_logits(model, *batch)
    assert theirs.shape == ours.shape == (4, 3)
    assert np.abs(theirs - ours).max() < TOLERANCE  # measured ~1e-7 on this tiny model


def test_keras_hub_loads_the_preset_with_the_classifiers_length_and_logits(exported, batch):
    import keras_hub

    stock = keras_hub.models.RobertaTextClassifier.from_preset(exported["keras-hub"])
    assert stock.num_classes == 3 and stock.preprocessor.sequence_length == MAX_LENGTH
    original = kroberta.load(exported["saved"])
    np.testing.assert_allclose(
        keras_logits(stock, *batch), keras_logits(original, *batch), atol=1e-6, rtol=0
    )
    # Its preprocessor gives kroberta's token ids for ordinary text.
    text = "The apple river stone"
    ids = np.asarray(stock.preprocessor([text])["token_ids"])[0]  # (MAX_LENGTH,)
    expected = [0] + original.tokenizer.encode(text, add_special_tokens=False).ids + [2]
    np.testing.assert_array_equal(ids[: len(expected)], expected)


@pytest.mark.parametrize("format", ["hf", "keras-hub"])
def test_load_reads_a_classifier_export_back(exported, batch, format):
    original = kroberta.load(exported["saved"])
    loaded = kroberta.load(exported[format])
    assert loaded.label_names == LABELS and loaded.max_length == MAX_LENGTH
    assert loaded.task_spec == original.task_spec  # a pair task's fields travel with the export
    tolerance = TOLERANCE if format == "hf" else 1e-6
    np.testing.assert_allclose(
        keras_logits(loaded, *batch), keras_logits(original, *batch), atol=tolerance, rtol=0
    )
    texts = ["The apple zebra river", "The stone cloud"]
    expected = prediction.predict_texts(original, texts)
    got = prediction.predict_texts(loaded, texts)
    assert got["labels"] == expected["labels"]
    np.testing.assert_allclose(got["probabilities"], expected["probabilities"], atol=1e-5)


def test_a_regression_exports_with_problem_type_regression(downstream_model, tmp_path, batch):
    saved = saved_classifier(downstream_model, tmp_path / "saved", label_names=None, seed=1)
    out = export_run(saved, str(tmp_path / "hf"))
    with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
        assert json.load(f)["problem_type"] == "regression"
    model = transformers.RobertaForSequenceClassification.from_pretrained(out)
    assert model.config.num_labels == 1 and model.config.problem_type == "regression"
    original = kroberta.load(saved)
    assert np.abs(hf_logits(model, *batch) - keras_logits(original, *batch)).max() < TOLERANCE
    loaded = kroberta.load(out)
    assert loaded.label_names is None and loaded.task_spec.kind == REGRESSION
    texts = ["The apple river", "The stone"]
    np.testing.assert_allclose(
        prediction.predict_texts(loaded, texts)["values"],
        prediction.predict_texts(original, texts)["values"],
        atol=1e-5,
    )


def test_a_classifier_transformers_saved_loads_with_its_logits(tmp_path):
    """The import direction on weights kroberta never held: transformers' own classifier,
    with its default token-type table (two rows, row 0 folded into the positions)."""
    torch.manual_seed(0)
    config = transformers.RobertaConfig(
        vocab_size=TINY.vocabulary_size,
        hidden_size=TINY.hidden_dim,
        num_hidden_layers=TINY.num_layers,
        num_attention_heads=TINY.num_heads,
        intermediate_size=TINY.intermediate_dim,
        max_position_embeddings=TINY.max_sequence_length + 2,
        layer_norm_eps=1e-5,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        id2label={0: "a", 1: "b", 2: "c"},
    )
    model = transformers.RobertaForSequenceClassification(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    model.save_pretrained(str(tmp_path))
    loaded = kroberta.load(str(tmp_path))
    assert loaded.label_names == ("a", "b", "c") and loaded.max_length == TINY.max_sequence_length
    ids, mask = padded_batch(TINY)
    assert np.abs(keras_logits(loaded, ids, mask) - hf_logits(model, ids, mask)).max() < TOLERANCE


def test_the_export_command_writes_a_classifier(exported, tmp_path, capsys):
    out = str(tmp_path / "preset")
    assert (
        kroberta.cli.export.main(
            ["--run", exported["saved"], "--out", out, "--format", "keras-hub"]
        )
        == 0
    )
    assert "exported" in capsys.readouterr().out
    with open(os.path.join(out, keras_hub_presets.TASK_CONFIG_FILE), encoding="utf-8") as f:
        assert json.load(f)["registered_name"].endswith("RobertaTextClassifier")
    with open(os.path.join(out, keras_hub_presets.CLASSIFIER_FILE), encoding="utf-8") as f:
        assert json.load(f)["label_names"] == list(LABELS)


def test_a_classifier_where_a_masked_lm_goes_is_one_error(exported):
    for where in ("saved", "hf", "keras-hub"):
        with pytest.raises(
            InputError,
            match=r"^--model: .* holds a fine-tuned classifier, not a "
            r"masked LM",
        ):
            model_source(exported[where], "--model", head=MASKED_LM)
        with pytest.raises(
            InputError,
            match=r"checkpoint: .*: only a run's masked LM has "
            r"checkpoints",
        ):
            kroberta.load(exported[where], checkpoint="last")


def test_a_masked_lm_where_a_classifier_goes_is_one_error(downstream_model, tmp_path, capsys):
    import kroberta.cli.finetune

    run = tmp_path / "run"
    kroberta.save(downstream_model, str(run))
    (tmp_path / "texts.jsonl").write_text('{"text": "a"}\n')
    assert (
        kroberta.cli.finetune.main(
            [
                "--classifier",
                str(run),
                "--predict",
                str(tmp_path / "texts.jsonl"),
                "--predictions",
                str(tmp_path / "out.jsonl"),
            ]
        )
        == 2
    )
    assert (
        "holds a masked LM, not a fine-tuned classifier; fine-tune it with --run"
        in capsys.readouterr().err
    )
