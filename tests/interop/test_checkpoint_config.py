"""`--init_from_hf=DIR` alone: the model section and tokenizer come from the checkpoint;
a config that disagrees is one error naming every key; data from another tokenizer, or
longer than the checkpoint's positions, are refused before any compute."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing in these tests may download
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import random  # noqa: E402

import pytest  # noqa: E402

transformers = pytest.importorskip("transformers", reason="needs transformers (the hf extra)")
pytest.importorskip("torch", reason="transformers saves the checkpoint with torch")

import kroberta  # noqa: E402
import kroberta.cli.train  # noqa: E402
from kroberta.config import config_path  # noqa: E402
from kroberta.errors import ConfigError, InputError
from kroberta.interop import hf  # noqa: E402
from kroberta.interop.checkpoint_config import with_checkpoint_model  # noqa: E402
from kroberta.text.tokenizer import train_tokenizer, vocabulary_size  # noqa: E402

VOCABULARY = 300
WORDS = (
    "alpha beta gamma delta epsilon zeta theta iota kappa lambda sigma omega river "
    "stone cloud field light house water paper"
).split()


def _text(seed: int, words=WORDS) -> str:
    rng = random.Random(seed)
    return "".join(
        " ".join(rng.choice(words) for _ in range(rng.randint(6, 14))) + ".\n\n" for _ in range(400)
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A `RobertaConfig()`-default checkpoint saved by transformers, 2 layers x 32, with a
    tokenizer of VOCABULARY tokens trained here; and text to prepare with it."""
    root = tmp_path_factory.mktemp("checkpoint")
    (root / "corpus.txt").write_text(_text(0))
    tokenizer = train_tokenizer([_text(0)], VOCABULARY)
    directory = root / "hf"
    model = transformers.RobertaForMaskedLM(
        transformers.RobertaConfig(
            vocab_size=vocabulary_size(tokenizer),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=34,
        )
    )
    model.save_pretrained(str(directory))
    tokenizer.save(str(directory / "tokenizer.json"))
    return root, directory


def _prepare(root, name, tokenizer, seq_len=32):
    kroberta.prepare(
        [str(root / "corpus.txt")],
        str(root / name),
        tokenizer=tokenizer,
        seq_len=seq_len,
        validation_fraction=0.1,
        progress=False,
    )
    return str(root / name)


def test_init_from_hf_alone_gives_the_checkpoints_model_section(checkpoint):
    _, directory = checkpoint
    config, args = kroberta.cli.train.parse_args([f"--init_from_hf={directory}"])
    config, sources = with_checkpoint_model(config, args.sources)
    expected = hf.model_config_from_hf(hf.read_hf_config(str(directory)), "config.json")
    assert config.model == expected
    assert (
        expected.num_layers,
        expected.hidden_dim,
        expected.max_sequence_length,
        expected.dropout,
        expected.initializer_range,
        expected.layer_norm_epsilon,
    ) == (2, 32, 32, 0.1, 0.02, 1e-12)  # RobertaConfig()'s defaults
    assert sources["model.num_layers"] == os.path.join(str(directory), "config.json")


def test_a_disagreeing_config_is_one_error_listing_every_key(checkpoint, tmp_path):
    _, directory = checkpoint
    config, args = kroberta.cli.train.parse_args(
        [
            "--config",
            "base",
            f"--init_from_hf={directory}",
            "--model.vocabulary_size=10000",
            "--model.dropout=0.0",
        ]
    )
    with pytest.raises(ConfigError) as error:
        with_checkpoint_model(config, args.sources)
    message = str(error.value)
    base = config_path("base")
    assert "on 6 key(s)" in message
    assert (
        "model.vocabulary_size=10000 (command line) but the checkpoint has vocab_size=" in message
    )
    m = config.model
    for key, theirs in (
        ("num_layers", "num_hidden_layers=2"),
        ("hidden_dim", "hidden_size=32"),
        ("num_heads", "num_attention_heads=2"),
        ("intermediate_dim", "intermediate_size=64"),
        ("max_sequence_length", "max_position_embeddings=34 (32 positions)"),
    ):
        assert f"model.{key}={getattr(m, key)} ({base}) but the checkpoint has {theirs}" in message
    assert "dropout" not in message  # a training setting the run may change
    # base.toml is shipped: its keys cannot be removed, so the advice is to leave it out.
    assert message.endswith(
        "follows the checkpoint: leave out --config (a shipped config sets "
        "them) or give the checkpoint's values"
    )
    own = tmp_path / "own.toml"
    own.write_text("[model]\nnum_layers = 5\n")
    config, args = kroberta.cli.train.parse_args(
        ["--config", str(own), f"--init_from_hf={directory}"]
    )
    with pytest.raises(
        ConfigError, match="remove these keys from the config file and the command line$"
    ):
        with_checkpoint_model(config, args.sources)


def test_train_with_only_init_from_hf_builds_the_checkpoints_model_and_keeps_its_tokenizer(
    checkpoint, tmp_path
):
    root, directory = checkpoint
    data = _prepare(root, "same", str(directory / "tokenizer.json"))
    run_dir = tmp_path / "run"
    code = kroberta.cli.train.main(
        [
            f"--init_from_hf={directory}",
            f"--data.dir={data}",
            f"--run_dir={run_dir}",
            "--train.steps=2",
            "--train.warmup_steps=1",
            "--train.warmup_fraction=0",
            "--train.log_every=1",
            "--train.eval_every=2",
            "--train.batch_size_per_device=2",
            "--train.steps_per_execution=1",
            "--no-examples",
        ]
    )
    assert code == 0
    model = kroberta.load(str(run_dir))
    b = model.backbone
    assert (
        b.vocabulary_size,
        b.num_layers,
        b.hidden_dim,
        b.num_heads,
        b.intermediate_dim,
        b.max_sequence_length,
    ) == (vocabulary_size(model.tokenizer), 2, 32, 2, 64, 32)
    assert (run_dir / "tokenizer.json").read_text() == (directory / "tokenizer.json").read_text()


def _refused_before_compute(monkeypatch, capsys, argv, run_dir) -> str:
    from kroberta.model import mlm

    def no_compute(*args, **kwargs):
        raise AssertionError("a model was built")

    monkeypatch.setattr(mlm, "build_compiled_model", no_compute)
    assert kroberta.cli.train.main(argv) == 2
    assert not os.path.exists(os.path.join(run_dir, "checkpoints"))
    return capsys.readouterr().err


def test_data_from_another_tokenizer_of_the_same_size_is_refused(
    checkpoint, tmp_path, monkeypatch, capsys
):
    root, directory = checkpoint
    other = train_tokenizer([_text(1, [w[::-1] + "x" for w in WORDS])], VOCABULARY)
    assert vocabulary_size(other) == VOCABULARY
    other_path = tmp_path / "other.json"
    other.save(str(other_path))
    data = _prepare(root, "other", str(other_path))
    run_dir = str(tmp_path / "run")
    error = _refused_before_compute(
        monkeypatch,
        capsys,
        [f"--init_from_hf={directory}", f"--data.dir={data}", f"--run_dir={run_dir}"],
        run_dir,
    )
    assert "another tokenizer than the checkpoint's" in error
    assert f"python -m kroberta.prepare --tokenizer {directory}" in error


def test_sequences_longer_than_the_checkpoints_positions_are_refused(
    checkpoint, tmp_path, monkeypatch, capsys
):
    root, directory = checkpoint
    data = _prepare(root, "long", str(directory / "tokenizer.json"), seq_len=48)
    run_dir = str(tmp_path / "run")
    error = _refused_before_compute(
        monkeypatch,
        capsys,
        [f"--init_from_hf={directory}", f"--data.dir={data}", f"--run_dir={run_dir}"],
        run_dir,
    )
    assert "holds sequences of 48 tokens" in error and "32 positions" in error
    assert "--seq-len 32" in error


def test_init_from_keras_hub_alone_gives_the_presets_model_section(checkpoint, tmp_path):
    _, directory = checkpoint
    imported = kroberta.load(str(directory))
    preset = kroberta.export_keras_hub(imported, str(tmp_path / "preset"))
    config, args = kroberta.cli.train.parse_args([f"--init_from_keras_hub={preset}"])
    config, sources = with_checkpoint_model(config, args.sources)
    m = imported.kroberta_config.model
    for key in (
        "vocabulary_size",
        "num_layers",
        "num_heads",
        "hidden_dim",
        "intermediate_dim",
        "max_sequence_length",
        "dropout",
        "attention_dropout_rate",
        "layer_norm_epsilon",
    ):
        assert getattr(config.model, key) == getattr(m, key), key
    assert sources["model.hidden_dim"] == os.path.join(preset, "config.json")
    # `python -m kroberta.evaluate --model` tells a preset from a Hugging Face directory.
    loaded = kroberta.load(preset)
    assert loaded.tokenizer.get_vocab() == imported.tokenizer.get_vocab()
    with pytest.raises(
        ConfigError,
        match=r"model.num_layers=3 \(command line\) but the "
        r"checkpoint has config.num_layers=2",
    ):
        config, args = kroberta.cli.train.parse_args(
            [f"--init_from_keras_hub={preset}", "--model.num_layers=3"]
        )
        with_checkpoint_model(config, args.sources)


def test_a_python_config_takes_the_keys_it_leaves_at_their_defaults(checkpoint):
    _, directory = checkpoint
    config = kroberta.load_config(overrides={"init_from_hf": str(directory), "model.dropout": 0.05})
    resolved, sources = with_checkpoint_model(config)
    assert sources is None
    assert (resolved.model.num_layers, resolved.model.hidden_dim, resolved.model.dropout) == (
        2,
        32,
        0.05,
    )  # the shape from the checkpoint, the dropout as set
    wrong = kroberta.load_config(
        overrides={"init_from_hf": str(directory), "model.hidden_dim": 64, "model.num_heads": 8}
    )
    with pytest.raises(ConfigError, match=r"on 2 key\(s\): model.num_heads=8 \(config\)"):
        with_checkpoint_model(wrong)


def test_kroberta_train_from_python_takes_the_checkpoints_model(checkpoint):
    from kroberta.training.run_data import run_data_for

    root, directory = checkpoint
    data = _prepare(root, "python", str(directory))
    config = kroberta.load_config(overrides={"init_from_hf": str(directory), "data.dir": data})
    run = run_data_for(config)  # what kroberta.train(config) builds its model from
    assert run.config.model == hf.model_config_from_hf(hf.read_hf_config(str(directory)), "")
    assert run.tokenizer_path == str(directory / "tokenizer.json")


def test_a_keras_hub_presets_tokenizer_is_checked_too(checkpoint, tmp_path):
    from kroberta.training.run_data import run_data_for

    root, directory = checkpoint
    preset = kroberta.export_keras_hub(kroberta.load(str(directory)), str(tmp_path / "preset"))
    same = _prepare(root, "for-preset", preset)
    config = kroberta.load_config(overrides={"init_from_keras_hub": preset, "data.dir": same})
    assert run_data_for(config).config.model.hidden_dim == 32
    other = train_tokenizer([_text(2, [w + "zz" for w in WORDS])], VOCABULARY)
    other.save(str(tmp_path / "other.json"))
    data = _prepare(root, "other-for-preset", str(tmp_path / "other.json"))
    config = kroberta.load_config(overrides={"init_from_keras_hub": preset, "data.dir": data})
    with pytest.raises(InputError, match=f"python -m kroberta.prepare --tokenizer {preset}"):
        run_data_for(config)


@pytest.mark.fast
def test_a_path_that_is_no_model_says_what_it_is(tmp_path):
    from kroberta.errors import NotFoundError
    from kroberta.run_layout import model_source

    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text("{}")
    for path, what in [
        ("nope", r".*nope: no such directory; give a training run"),
        ("file.txt", r".*file.txt: a file, not a directory; give"),
        (
            "data",
            r".*data: prepared data \(python -m kroberta.prepare's output\), "
            r"not a model; give a training run",
        ),
    ]:
        with pytest.raises(NotFoundError, match=rf"^--model: {what}"):
            model_source(str(tmp_path / path), "--model")
