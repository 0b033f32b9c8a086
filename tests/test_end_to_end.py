"""Raw text -> prepare -> train -> load -> fill_mask, and training from a Hugging Face checkpoint."""

import dataclasses
import random

import numpy as np
import pytest

import kroberta
from kroberta import prepare, train
from kroberta.config import config_path, load_toml
from kroberta.errors import ConfigError, InputError

WORDS = ["alpha", "beta", "gamma", "delta", "omega", "river", "stone", "cloud", "light", "north"]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    rng = random.Random(0)
    lines = []
    for _ in range(400):
        words = [rng.choice(WORDS) for _ in range(rng.randint(5, 15))]
        lines.append("The " + " ".join(words) + " ends here.\n\n")
    (root / "corpus.txt").write_text("".join(lines))
    prepare(
        [str(root / "corpus.txt")],
        str(root / "data"),
        vocab_size=320,
        seq_len=32,
        validation_fraction=0.05,
        progress=False,
    )
    return root


def _config(prepared, run_dir, **model):
    config = load_toml(config_path("tiny"))
    config = dataclasses.replace(
        config,
        run_dir=str(run_dir),
        data=dataclasses.replace(config.data, dir=str(prepared / "data")),
        model=dataclasses.replace(config.model, **model),
        train=dataclasses.replace(config.train, steps=60, eval_every=30, checkpoint_every=30),
    )
    return config


def test_prepare_train_fill_mask(prepared, tmp_path):
    from kroberta.data.manifest import load_manifest

    vocabulary = load_manifest(str(prepared / "data")).vocabulary_size
    run_dir = tmp_path / "run"
    train(_config(prepared, run_dir, vocabulary_size=vocabulary))
    assert (run_dir / "tokenizer.json").exists(), "the run keeps the data's tokenizer"
    model = kroberta.load(str(run_dir))
    results = kroberta.fill_mask(
        model, ["The alpha <mask> gamma ends here.", "The <mask> beta <mask> ends here."], top_k=3
    )
    single, double = results
    assert len(single) == 3 and len(double) == 2 and all(len(c) == 3 for c in double)
    for candidate in single + double[0] + double[1]:
        assert set(candidate) == {"token", "token_id", "token_str", "score", "sequence"}
        assert candidate["token"] == candidate["token_id"]  # Hugging Face's name, and ours
        assert 0.0 <= candidate["score"] <= 1.0
        assert 0 <= candidate["token_id"] < vocabulary
        assert isinstance(candidate["token_str"], str) and "ends here." in candidate["sequence"]
    scores = [c["score"] for c in single]
    assert scores == sorted(scores, reverse=True)
    assert single[0]["sequence"] == "The alpha" + single[0]["token_str"] + " gamma ends here."
    with pytest.raises(ValueError, match="text 0 has no <mask>"):
        kroberta.fill_mask(model, ["no mask here"])


def test_vocabulary_mismatch_with_the_prepared_data_is_refused(prepared, tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"was prepared with a vocabulary of \d+ tokens but "
        r"model.vocabulary_size=999; set model.vocabulary_size to "
        r"(\d+) \(--model.vocabulary_size=\1\)$",
    ):
        train(_config(prepared, tmp_path / "run", vocabulary_size=999))
    assert not (tmp_path / "run").exists()  # a run that never started leaves no directory
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError):
        train(_config(prepared, tmp_path / "kept", vocabulary_size=999))
    assert (tmp_path / "kept" / "notes.txt").read_text() == "mine"  # not created here: kept


def test_a_data_dir_that_does_not_match_or_exist_names_the_key_and_the_fix(prepared, tmp_path):
    from kroberta.data.manifest import load_manifest

    manifest = load_manifest(str(prepared / "data"))
    short = _config(
        prepared,
        tmp_path / "run",
        vocabulary_size=manifest.vocabulary_size,
        max_sequence_length=manifest.sequence_length - 1,
    )
    with pytest.raises(
        ConfigError,
        match=rf"data.dir: .* holds sequences of "
        rf"{manifest.sequence_length} tokens but .*; set "
        rf"model.max_sequence_length to {manifest.sequence_length} "
        rf"\(--model.max_sequence_length="
        rf"{manifest.sequence_length}\)$",
    ):
        train(short)
    missing = dataclasses.replace(
        short, data=dataclasses.replace(short.data, dir=str(tmp_path / "nothere"))
    )
    with pytest.raises(
        ConfigError,
        match=r"data.dir: .*nothere is not a directory; give the "
        r"--out of python -m kroberta.prepare",
    ):
        train(missing)
    # Files beside a prepared directory would be replaced by its own: refused, unless they
    # are its own (as a run's recorded config.toml names them).
    fits = _config(prepared, tmp_path / "run", vocabulary_size=manifest.vocabulary_size)
    both = dataclasses.replace(
        fits, data=dataclasses.replace(fits.data, train=(str(tmp_path / "other-*.tfrecord"),))
    )
    with pytest.raises(
        ConfigError,
        match=r"data.train: data.dir .* has its own train files "
        r"\(1\), so data.train=\[.*other-\*.tfrecord'\] would be "
        r"ignored; give one of data.dir and data.train",
    ):
        train(both)
    assert not (tmp_path / "run").exists()
    from kroberta.training.run_data import run_data_for

    own = dataclasses.replace(
        fits,
        data=dataclasses.replace(
            fits.data,
            train=tuple(manifest.train_files),
            validation=tuple(manifest.validation_files),
        ),
    )
    assert list(run_data_for(own).train.files) == list(manifest.train_files)


def test_training_can_start_from_a_hugging_face_checkpoint(prepared, tmp_path):
    from kroberta.data.manifest import load_manifest
    from kroberta.model.mlm import build_model

    vocabulary = load_manifest(str(prepared / "data")).vocabulary_size
    config = _config(prepared, tmp_path / "run", vocabulary_size=vocabulary)
    start = build_model(config.model, seed=42)
    kroberta.export_hf(start, str(tmp_path / "hf"))
    config = dataclasses.replace(
        config,
        init_from_hf=str(tmp_path / "hf"),
        train=dataclasses.replace(config.train, learning_rate=1e-12),
    )
    train(config, until_step=10)
    trained = kroberta.load(str(tmp_path / "run"))
    for a, b in zip(start.weights, trained.weights):
        np.testing.assert_allclose(np.asarray(a.value), np.asarray(b.value), atol=1e-6)


def test_the_seed_config_trains_on_prepared_data(prepared, tmp_path):
    """The seed config's masking follows the data: static on the seed's labelled files,
    dynamic on what `kroberta.prepare` writes (no labels); the run records which."""
    from kroberta.data.manifest import load_manifest

    vocabulary = load_manifest(str(prepared / "data")).vocabulary_size
    config = kroberta.load_config(
        "seed",
        {
            "data.dir": str(prepared / "data"),
            "run_dir": str(tmp_path / "run"),
            "model.vocabulary_size": vocabulary,
            "model.max_sequence_length": 32,
            "model.num_layers": 1,
            "model.hidden_dim": 32,
            "model.num_heads": 2,
            "model.intermediate_dim": 64,
            "data.max_predictions": 8,
            "train.steps": 4,
            "train.log_every": 2,
            "train.eval_every": 4,
            "train.checkpoint_every": 4,
            "train.eval_steps": 1,
        },
    )
    assert config.data.masking == "auto"
    summary = train(config)
    assert summary["final_step"] == 4
    recorded = load_toml(str(tmp_path / "run" / "config.toml"))
    assert recorded.data.masking == "dynamic"


def test_static_masking_on_unlabelled_data_names_the_flag(prepared, tmp_path):
    from kroberta.data.manifest import load_manifest

    vocabulary = load_manifest(str(prepared / "data")).vocabulary_size
    config = _config(prepared, tmp_path / "run", vocabulary_size=vocabulary)
    config = dataclasses.replace(config, data=dataclasses.replace(config.data, masking="static"))
    with pytest.raises(
        ConfigError,
        match=r"data.masking='static' needs a 'labels' feature .* "
        r"use --data.masking=dynamic",
    ):
        train(config)


def test_predicting_on_data_prepared_with_another_tokenizer_is_refused(prepared):
    """The manifest beside the files names the tokenizer that wrote their ids."""
    from tokenizers import Tokenizer

    from kroberta.data.manifest import load_manifest
    from kroberta.inference import inputs

    manifest = load_manifest(str(prepared / "data"))
    files = list(manifest.validation_files)
    config = _config(prepared, "unused", vocabulary_size=manifest.vocabulary_size)
    own = Tokenizer.from_file(manifest.tokenizer_path)
    assert inputs.as_examples(files, config, own).examples == manifest.validation_sequences
    larger = _config(prepared, "unused", vocabulary_size=manifest.vocabulary_size + 8)
    with pytest.raises(
        InputError,
        match=rf"inputs: .*data was prepared with a vocabulary "
        rf"of {manifest.vocabulary_size} tokens; the "
        rf"model has {manifest.vocabulary_size + 8}, so "
        r"its ids mean other tokens to this model; "
        r"prepare the text with the run's tokenizer",
    ):
        inputs.as_examples(files, larger)
    other = Tokenizer.from_file(manifest.tokenizer_path)
    other.add_tokens(["zzzz-not-in-the-data"])
    with pytest.raises(
        InputError,
        match=r"prepared with another tokenizer than the "
        r"model's \(other tokens at the same ids\)",
    ):
        inputs.as_examples(files, config, other)
