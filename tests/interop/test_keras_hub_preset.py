"""keras-hub presets: export, keras-hub's own from_preset (logits, tokens), and back as an init."""

import dataclasses
import json
import os
import uuid
import warnings

import keras_hub
import numpy as np
import pytest

import kroberta
import kroberta.cli.export
from kroberta import train
from kroberta.errors import ConfigError, ConversionError
from kroberta.interop import keras_hub_presets
from kroberta.text.tokenizer import train_tokenizer
from tests.conftest import TINY_LENGTH, TINY_VOCAB, tiny_config
from tests.interop.test_hf_no_torch import TINY, assert_same_weights, make_run, randomized_model
from tests.text.test_prepare import make_docs

TEXTS = [
    "the cat sat on a mat while dogs ran far away",
    "über naïve café 日本 résumé",
    "two  spaces\nand a new line",
    "The cat, the mat; dogs!",
]
PRESET_FILES = {
    "config.json",
    "model.weights.h5",
    "metadata.json",
    "task.json",
    "task.weights.h5",
    "preprocessor.json",
    "tokenizer.json",
    "assets/tokenizer/vocabulary.json",
    "assets/tokenizer/merges.txt",
}


@pytest.fixture(scope="module")
def tokenizer():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return train_tokenizer(iter(make_docs(200, seed=2)), TINY.vocabulary_size)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tokenizer):
    model = randomized_model()
    out = str(tmp_path_factory.mktemp("preset"))
    assert kroberta.export_keras_hub(model, out, tokenizer=tokenizer) == out
    return model, out


def _files(directory):
    return {
        os.path.relpath(os.path.join(d, f), directory)
        for d, _, fs in os.walk(directory)
        for f in fs
    }


def _batch(model, seed=0):
    rng = np.random.default_rng(seed)
    L, V = model.backbone.max_sequence_length, model.backbone.vocabulary_size
    mask = (np.arange(L)[None, :] < rng.integers(4, L + 1, (3, 1))).astype("int32")
    ids = np.where(mask, rng.integers(5, V, (3, L)), 1).astype("int32")
    return {
        "token_ids": ids,
        "padding_mask": mask,
        "mask_positions": rng.integers(0, 4, (3, 5)).astype("int32"),
    }


def test_preset_files_are_keras_hubs(exported):
    _, out = exported
    assert PRESET_FILES <= _files(out)
    config = json.load(open(os.path.join(out, "config.json")))
    assert config["registered_name"] == "keras_hub>RobertaBackbone"
    assert config["config"]["vocabulary_size"] == TINY.vocabulary_size
    assert (
        json.load(open(os.path.join(out, "task.json")))["registered_name"]
        == "keras_hub>RobertaMaskedLM"
    )
    assert (
        "kroberta" not in open(os.path.join(out, "task.json")).read()
    )  # a stock model, no kroberta layers


@pytest.mark.stack
def test_keras_hub_from_preset_gives_equal_logits_and_token_ids(exported, tokenizer):
    model, out = exported
    batch = _batch(model)
    task = keras_hub.models.RobertaMaskedLM.from_preset(out)
    np.testing.assert_allclose(np.asarray(task(batch)), np.asarray(model(batch)), atol=1e-5, rtol=0)
    assert isinstance(task.preprocessor, keras_hub.models.RobertaMaskedLMPreprocessor)
    assert task.preprocessor.sequence_length == TINY.max_sequence_length
    backbone = keras_hub.models.RobertaBackbone.from_preset(out)
    inputs = {k: batch[k] for k in ("token_ids", "padding_mask")}
    np.testing.assert_allclose(
        np.asarray(backbone(inputs)), np.asarray(model.backbone(inputs)), atol=1e-5, rtol=0
    )
    theirs = keras_hub.models.RobertaTokenizer.from_preset(out)
    for text in TEXTS:
        assert (
            np.asarray(theirs(text)).tolist()
            == tokenizer.encode(text, add_special_tokens=False).ids
        ), text


def test_load_of_a_preset_round_trip(exported, tokenizer):
    model, out = exported
    loaded = kroberta.load(out)
    assert_same_weights(model, loaded)
    assert loaded.kroberta_config.model == TINY
    for text in TEXTS + ["The <mask> sat."]:
        assert loaded.tokenizer.encode(text).ids == tokenizer.encode(text).ids, text
    assert loaded.tokenizer.get_vocab() == tokenizer.get_vocab()


def test_load_and_init_from_keras_hub_read_a_url(exported):
    from kroberta import storage
    from kroberta.interop.keras_hub_presets import init_from_keras_hub

    model, out = exported
    url = f"memory://kroberta-{uuid.uuid4().hex[:8]}/preset"
    storage.put_tree(out, url)
    assert_same_weights(model, kroberta.load(url))
    other = randomized_model(seed=5)
    assert init_from_keras_hub(other, url) is True
    assert_same_weights(model, other)


def test_export_cli_and_overwrite(tmp_path, tokenizer, capsys):
    model = make_run(tmp_path / "run", tokenizer=tokenizer)
    out = str(tmp_path / "preset")
    assert (
        kroberta.cli.export.main(
            ["--run", str(tmp_path / "run"), "--format", "keras-hub", "--out", out]
        )
        == 0
    )
    assert f"exported {tmp_path / 'run'} -> {out}" in capsys.readouterr().out
    assert PRESET_FILES | {"kroberta_config.toml"} <= _files(out)
    assert_same_weights(model, kroberta.load(out))
    assert (
        kroberta.cli.export.main(
            ["--run", str(tmp_path / "run"), "--format", "keras-hub", "--out", out]
        )
        == 2
    )
    assert "not empty" in capsys.readouterr().err
    # A run without a tokenizer overwrites without leaving the old tokenizer behind.
    make_run(tmp_path / "run2")
    assert (
        kroberta.cli.export.main(
            ["--run", str(tmp_path / "run2"), "--format", "keras-hub", "--out", out, "--overwrite"]
        )
        == 0
    )
    assert not {"tokenizer.json", "preprocessor.json", "assets/tokenizer/vocabulary.json"} & _files(
        out
    )
    assert keras_hub.models.RobertaMaskedLM.from_preset(out).preprocessor is None


def test_not_a_roberta_preset_is_named(exported, tmp_path):
    _, out = exported
    config = json.load(open(os.path.join(out, "config.json")))
    config["registered_name"] = "keras_hub>BertBackbone"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ConversionError,
        match=r"config.json: registered_name: kroberta reads RobertaBackbone "
        r"presets, got 'keras_hub>BertBackbone'",
    ):
        kroberta.load(str(tmp_path))
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        FileNotFoundError,
        match=r"empty: not a finished kroberta run \(config.toml is missing\), "
        r"and no config.json of a Hugging Face model or keras-hub preset",
    ):
        kroberta.load(str(tmp_path / "empty"))


def test_training_can_start_from_a_preset(tiny_data, tmp_path):
    from kroberta.model.mlm import build_model

    config = tiny_config(
        tiny_data,
        tmp_path / "run",
        steps=4,
        warmup_steps=0,
        log_every=2,
        eval_every=0,
        checkpoint_every=2,
        learning_rate=1e-12,
    )
    assert (config.model.vocabulary_size, config.model.max_sequence_length) == (
        TINY_VOCAB,
        TINY_LENGTH,
    )
    start = build_model(config.model, seed=42)
    kroberta.export_keras_hub(start, str(tmp_path / "preset"))
    train(dataclasses.replace(config, init_from_keras_hub=str(tmp_path / "preset")), until_step=2)
    trained = kroberta.load(str(tmp_path / "run"))
    for a, b in zip(start.weights, trained.weights):
        np.testing.assert_allclose(np.asarray(a.value), np.asarray(b.value), atol=1e-6)
    # Another shape is refused by key; both inits at once are a config error.
    other = build_model(dataclasses.replace(config.model, hidden_dim=16, num_heads=2), seed=0)
    with pytest.raises(
        ConversionError, match=r"config.hidden_dim=32, but the model has model.hidden_dim=16"
    ):
        keras_hub_presets.init_from_keras_hub(other, str(tmp_path / "preset"))
    both = dataclasses.replace(
        config,
        init_from_keras_hub=str(tmp_path / "preset"),
        init_from_hf="x",
        run_dir=str(tmp_path / "run2"),
    )
    with pytest.raises(
        ConfigError, match="init_from_keras_hub: set init_from_hf or init_from_keras_hub, not both"
    ):
        train(both)


def test_the_export_becomes_a_keras_hub_classifier_as_it_is(exported):
    import keras
    import keras_hub

    _, out = exported
    classifier = keras_hub.models.RobertaTextClassifier.from_preset(out, num_classes=2)
    assert classifier.preprocessor.sequence_length == TINY.max_sequence_length
    texts = np.array(TEXTS * 2)  # longer than the model's 16 positions: cut, not padded past them
    labels = np.array([0, 1] * len(TEXTS))
    classifier.compile(optimizer=keras.optimizers.Adam(1e-3))
    history = classifier.fit(texts, labels, batch_size=4, epochs=1, verbose=0).history
    assert np.isfinite(history["loss"][0])
    assert classifier.predict(texts, batch_size=4, verbose=0).shape == (len(texts), 2)
    # The masked LM still reads its own preprocessor (from task.json), not the classifier's.
    masked_lm = keras_hub.models.RobertaMaskedLM.from_preset(out)
    assert isinstance(masked_lm.preprocessor, keras_hub.models.RobertaMaskedLMPreprocessor)
    assert masked_lm.preprocessor.sequence_length == TINY.max_sequence_length
