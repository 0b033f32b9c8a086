"""Hugging Face export/import without torch or transformers: files, names, shapes, exact round trips."""

import json
import os
import sys
import uuid

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing in these tests may download
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import kroberta
import kroberta.cli.export
from kroberta.config import Config, ModelConfig, to_toml
from kroberta.errors import ConversionError, InputError
from kroberta.interop import hf
from kroberta.model.mlm import build_model
from kroberta.training import final_model

# Started at 0.02: what a Hugging Face or keras-hub import records.
TINY = ModelConfig(
    vocabulary_size=300,
    num_layers=2,
    num_heads=2,
    hidden_dim=16,
    intermediate_dim=32,
    max_sequence_length=16,
    dropout=0.0,
    initializer_range=0.02,
)


def randomized_model(model_config=TINY, seed=0):
    """A model whose every weight (biases and LayerNorms included) is distinct and nonzero."""
    model = build_model(model_config, seed=seed)
    rng = np.random.default_rng(seed)
    for v in model.weights:
        v.assign((np.asarray(v.value) + rng.normal(0, 0.02, v.shape)).astype("float32"))
    return model


def weights_of(model):
    return {v.path: np.asarray(v.value) for v in model.weights}


def assert_same_weights(a, b):
    wa, wb = weights_of(a), weights_of(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        np.testing.assert_array_equal(wa[name], wb[name], err_msg=name)


def expected_tensor_shapes(m: ModelConfig):
    h, i, L, V = m.hidden_dim, m.intermediate_dim, m.max_sequence_length, m.vocabulary_size
    shapes = {
        "roberta.embeddings.word_embeddings.weight": (V, h),
        "roberta.embeddings.position_embeddings.weight": (L + 2, h),
        "roberta.embeddings.token_type_embeddings.weight": (1, h),
        "roberta.embeddings.LayerNorm.weight": (h,),
        "roberta.embeddings.LayerNorm.bias": (h,),
        "lm_head.dense.weight": (h, h),
        "lm_head.dense.bias": (h,),
        "lm_head.layer_norm.weight": (h,),
        "lm_head.layer_norm.bias": (h,),
        "lm_head.bias": (V,),
    }
    for n in range(m.num_layers):
        p = f"roberta.encoder.layer.{n}"
        for name in (
            "attention.self.query",
            "attention.self.key",
            "attention.self.value",
            "attention.output.dense",
        ):
            shapes[f"{p}.{name}.weight"] = (h, h)
            shapes[f"{p}.{name}.bias"] = (h,)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            shapes[f"{p}.{name}.weight"] = (h,)
            shapes[f"{p}.{name}.bias"] = (h,)
        shapes[f"{p}.intermediate.dense.weight"] = (i, h)
        shapes[f"{p}.intermediate.dense.bias"] = (i,)
        shapes[f"{p}.output.dense.weight"] = (h, i)
        shapes[f"{p}.output.dense.bias"] = (h,)
    return shapes


def tiny_tokenizer():
    """The tokenizer kroberta.prepare trains (byte-level BPE, RoBERTa specials), on a few sentences."""
    import warnings

    from kroberta.text.tokenizer import train_tokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a few sentences support fewer than 300 tokens
        return train_tokenizer(
            ["hello world, the cat sat on the mat.", "hello there, hello again"] * 5,
            300,
            min_frequency=1,
        )


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory):
    model = randomized_model()
    out = str(tmp_path_factory.mktemp("hf_tiny"))
    hf.export_hf(model, out)
    return model, out


def rewrite_tensors(src, dst, edit):
    """Copies an export to `dst` with `edit(tensors)` applied to its safetensors."""
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    edit(tensors)
    save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f)
    return dst


def rewrite_config(src, dst, **changes):
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config.update(changes)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f)
    os.link(os.path.join(src, "model.safetensors"), os.path.join(dst, "model.safetensors"))
    return dst


def test_export_writes_hf_names_shapes_and_config(tiny_export):
    model, out = tiny_export
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]  # no tokenizer given
    tensors = load_file(os.path.join(out, "model.safetensors"))
    expected = expected_tensor_shapes(TINY)
    assert {k: v.shape for k, v in tensors.items()} == expected
    assert all(t.dtype == np.float32 for t in tensors.values())
    positions = tensors["roberta.embeddings.position_embeddings.weight"]
    np.testing.assert_array_equal(positions[:2], 0.0)  # HF never reads rows 0-1
    np.testing.assert_array_equal(
        positions[2:],
        np.asarray(model.backbone.embeddings.position_embedding.position_embeddings.value),
    )
    np.testing.assert_array_equal(tensors["roberta.embeddings.token_type_embeddings.weight"], 0.0)
    # torch Linear weights are (out, in): the transpose of Keras' (in, out) kernel.
    layer = model.backbone.transformer_layers[1]
    np.testing.assert_array_equal(
        tensors["roberta.encoder.layer.1.intermediate.dense.weight"],
        np.asarray(layer._feedforward_intermediate_dense.kernel.value).T,
    )
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    assert config["model_type"] == "roberta" and config["architectures"] == ["RobertaForMaskedLM"]
    assert (
        config["vocab_size"],
        config["hidden_size"],
        config["num_hidden_layers"],
        config["num_attention_heads"],
        config["intermediate_size"],
    ) == (300, 16, 2, 2, 32)
    assert config["max_position_embeddings"] == 18 and config["type_vocab_size"] == 1
    assert config["layer_norm_eps"] == 1e-5 and config["hidden_act"] == "gelu"
    assert (config["pad_token_id"], config["bos_token_id"], config["eos_token_id"]) == (1, 0, 2)
    assert config["tie_word_embeddings"] is True
    assert config["hidden_dropout_prob"] == config["attention_probs_dropout_prob"] == 0.0


@pytest.mark.stack
def test_export_then_load_gives_identical_weights(tiny_export):
    model, out = tiny_export
    loaded = kroberta.load(out)
    assert_same_weights(model, loaded)
    assert loaded.kroberta_config.model == TINY
    assert loaded.tokenizer is None


def test_init_from_hf_loads_into_an_existing_model(tiny_export):
    model, out = tiny_export
    other = build_model(TINY, seed=5)
    assert hf.init_from_hf(other, out) is other
    assert_same_weights(model, other)


def test_load_and_init_from_hf_read_a_url(tiny_export):
    from kroberta import storage

    model, out = tiny_export
    url = f"memory://kroberta-{uuid.uuid4().hex[:8]}/hf"
    storage.put_tree(out, url)
    assert_same_weights(model, kroberta.load(url))
    other = build_model(TINY, seed=5)
    hf.init_from_hf(other, url)
    assert_same_weights(model, other)
    with pytest.raises(FileNotFoundError, match=f"{url}/none: no such directory"):
        kroberta.load(f"{url}/none")


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("hidden_size", 32, "hidden_size=32 gives model.hidden_dim=32, but the model has 16"),
        (
            "max_position_embeddings",
            34,
            "max_position_embeddings=34 gives model.max_sequence_length=32, but the model has 16",
        ),
    ],
)
def test_init_from_hf_refuses_another_shape(tiny_export, tmp_path, key, value, message):
    model, out = tiny_export
    with pytest.raises(ConversionError, match=message):
        hf.init_from_hf(model, rewrite_config(out, str(tmp_path / "other"), **{key: value}))


def test_token_type_row_is_folded_into_positions(tiny_export, tmp_path):
    model, out = tiny_export
    row = np.linspace(-1, 1, 16, dtype=np.float32)

    def add_types(t):
        t["roberta.embeddings.token_type_embeddings.weight"] = np.stack([row, row * 7])  # 2 types

    loaded = kroberta.load(rewrite_tensors(out, str(tmp_path / "tt"), add_types))
    want = np.asarray(model.backbone.embeddings.position_embedding.position_embeddings.value) + row
    np.testing.assert_array_equal(
        np.asarray(loaded.backbone.embeddings.position_embedding.position_embeddings.value), want
    )


def test_tokenizer_is_exported_and_imported(tmp_path):
    tokenizer = tiny_tokenizer()
    model = randomized_model()
    model.tokenizer = tokenizer  # as kroberta.load sets it
    out = hf.export_hf(model, str(tmp_path))
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "vocab.json",
        "merges.txt",
    ):
        assert os.path.isfile(os.path.join(out, name)), name
    with open(os.path.join(out, "tokenizer_config.json")) as f:
        tok_config = json.load(f)
    assert tok_config["model_max_length"] == 16 and tok_config["add_prefix_space"] is False
    assert tok_config["mask_token"] == "<mask>" and tok_config["pad_token"] == "<pad>"
    loaded = kroberta.load(out)
    assert loaded.tokenizer.encode("hello <mask>").ids == tokenizer.encode("hello <mask>").ids
    assert loaded.kroberta_config.data.mask_token_id == 4
    assert loaded.kroberta_config.data.special_token_ids == (0, 1, 2, 3, 4)
    # Without tokenizer.json, the slow tokenizer's vocab.json + merges.txt are the tokenizer
    # (as training from the checkpoint reads them), not "no tokenizer".
    os.remove(os.path.join(out, "tokenizer.json"))
    slow = kroberta.load(out).tokenizer
    assert slow is not None
    assert slow.encode("hello <mask>").ids == tokenizer.encode("hello <mask>").ids


# ---------------------------------------------------------------- refusals


def test_missing_directory_and_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such directory"):
        kroberta.load(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="config.json"):
        kroberta.load(str(tmp_path))


def test_missing_weights_file_is_named(tiny_export, tmp_path):
    _, out = tiny_export
    os.link(os.path.join(out, "config.json"), tmp_path / "config.json")
    with pytest.raises(FileNotFoundError, match="model.safetensors or pytorch_model.bin"):
        kroberta.load(str(tmp_path))


def test_pytorch_bin_without_torch_is_a_clear_error(tiny_export, tmp_path, monkeypatch):
    _, out = tiny_export
    os.link(os.path.join(out, "config.json"), tmp_path / "config.json")
    (tmp_path / "pytorch_model.bin").write_bytes(b"not read")
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    with pytest.raises(
        ConversionError, match="pytorch_model.bin: reading a PyTorch checkpoint needs torch"
    ):
        kroberta.load(str(tmp_path))


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("model_type", "bert", "model_type: kroberta imports 'roberta' models only, got 'bert'"),
        ("position_embedding_type", "relative_key", "position_embedding_type"),
        ("hidden_act", "relu", "hidden_act"),
        ("layer_norm_eps", 0, r"layer_norm_eps: expected a number in \(0, 1\), got 0"),
        ("pad_token_id", 0, "pad_token_id"),
        ("num_attention_heads", 3, "num_attention_heads: 3 heads do not divide hidden_size=16"),
        ("hidden_size", None, "hidden_size: expected a positive integer"),
        ("hidden_dropout_prob", None, r"hidden_dropout_prob: expected a number, got None"),
        (
            "attention_probs_dropout_prob",
            "0.1",
            r"attention_probs_dropout_prob: expected a number, "
            r"got '0.1'",
        ),
        ("initializer_range", None, r"initializer_range: expected a number, got None"),
    ],
)
def test_unrepresentable_configs_are_refused_by_key(tiny_export, tmp_path, key, value, message):
    _, out = tiny_export
    with pytest.raises(ConversionError, match=message):
        kroberta.load(rewrite_config(out, str(tmp_path / "bad"), **{key: value}))


def test_missing_tensor_is_named(tiny_export, tmp_path):
    _, out = tiny_export
    bad = rewrite_tensors(
        out, str(tmp_path / "bad"), lambda t: t.pop("roberta.encoder.layer.1.output.dense.bias")
    )
    with pytest.raises(
        ConversionError, match=r"missing tensor\(s\): roberta.encoder.layer.1.output.dense.bias"
    ):
        kroberta.load(bad)


def test_shape_mismatch_names_tensor_expected_and_got(tiny_export, tmp_path):
    _, out = tiny_export

    def shrink(t):
        t["lm_head.dense.weight"] = t["lm_head.dense.weight"][:, :8].copy()

    with pytest.raises(
        ConversionError,
        match=r"tensor lm_head.dense.weight: expected shape \(16, 16\), got \(16, 8\)",
    ):
        kroberta.load(rewrite_tensors(out, str(tmp_path / "bad"), shrink))


# ---------------------------------------------------------------- CLI


def make_run(run_dir, tokenizer=None):
    model = randomized_model()
    config = Config(model=TINY, run_dir=str(run_dir))
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, final_model.CONFIG_FILE), "w") as f:
        f.write(to_toml(config))
    final_model.save(model, str(run_dir))
    if tokenizer is not None:
        tokenizer.save(os.path.join(run_dir, final_model.TOKENIZER_FILE))
    return model


def test_export_cli_round_trip(tmp_path, capsys):

    model = make_run(tmp_path / "run", tokenizer=tiny_tokenizer())
    out = str(tmp_path / "hf")
    assert kroberta.cli.export.main(["--run", str(tmp_path / "run"), "--out", out]) == 0
    loaded = kroberta.load(out)
    assert_same_weights(model, loaded)
    assert loaded.tokenizer is not None
    # A non-empty --out is refused, and accepted with --overwrite.
    assert kroberta.cli.export.main(["--run", str(tmp_path / "run"), "--out", out]) == 2
    assert "not empty" in capsys.readouterr().err
    assert (
        kroberta.cli.export.main(["--run", str(tmp_path / "run"), "--out", out, "--overwrite"]) == 0
    )
    # Overwriting with a run that has no tokenizer leaves no stale tokenizer behind.
    make_run(tmp_path / "run2")
    assert (
        kroberta.cli.export.main(["--run", str(tmp_path / "run2"), "--out", out, "--overwrite"])
        == 0
    )
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]


def test_export_cli_errors_are_one_line_exit_2(tmp_path, capsys):

    assert (
        kroberta.cli.export.main(["--run", str(tmp_path / "missing"), "--out", str(tmp_path / "o")])
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such directory" in err
    (tmp_path / "empty_run").mkdir()
    assert (
        kroberta.cli.export.main(
            ["--run", str(tmp_path / "empty_run"), "--out", str(tmp_path / "o")]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a finished kroberta run" in err


def test_python_exports_refuse_a_directory_holding_files(tmp_path):
    # As the command line: nothing a user wrote is replaced, and two formats never mix.
    model = randomized_model()
    out = tmp_path / "mine"
    out.mkdir()
    (out / "config.json").write_text("mine")
    (out / "notes.txt").write_text("mine")
    for export in (kroberta.export_hf, kroberta.export_keras_hub):
        with pytest.raises(
            InputError,
            match=rf"out_dir {out}: directory is not empty \(pass "
            r"--overwrite, overwrite=True in Python",
        ):
            export(model, str(out))
    assert (out / "config.json").read_text() == "mine"
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="file: exists and is not a directory"):
        kroberta.export_hf(model, str(tmp_path / "file"))
    # overwrite=True replaces an export only: these files are no export.
    for export in (kroberta.export_hf, kroberta.export_keras_hub):
        with pytest.raises(
            InputError,
            match=rf"out_dir {out}: holds files, but not .* is missing\); "
            r"--overwrite replaces an export of the same format",
        ):
            export(model, str(out), overwrite=True)
    assert sorted(os.listdir(out)) == ["config.json", "notes.txt"]


def _tree(directory) -> dict:
    """{relative path: bytes} of every file under `directory`."""
    return {
        os.path.relpath(os.path.join(root, name), directory): open(
            os.path.join(root, name), "rb"
        ).read()
        for root, _, names in os.walk(directory)
        for name in names
    }


@pytest.mark.fast
@pytest.mark.parametrize("format", ["hf", "keras-hub"])
@pytest.mark.parametrize(
    "marker, kind",
    [
        ("classifier.json", "a fine-tuned classifier's folder"),
        ("config.toml", "a kroberta run"),
        ("checkpoints/", "a kroberta run"),
        ("manifest.json", "prepared data"),
    ],
)
def test_an_overwriting_export_refuses_each_other_output(tmp_path, format, marker, kind):
    from kroberta.interop import check_out_dir

    if marker.endswith("/"):
        (tmp_path / marker).mkdir()
    else:
        (tmp_path / marker).write_text("{}")
    with pytest.raises(InputError) as error:
        check_out_dir(str(tmp_path), True, "--out", format)
    assert str(error.value) == (
        f"--out {tmp_path}: holds {kind} ({marker.rstrip('/')}), which an export must not "
        "replace; export into a directory of its own"
    )


def test_overwrite_never_replaces_a_run_data_or_the_other_format(tmp_path, capsys):
    make_run(tmp_path / "run", tokenizer=tiny_tokenizer())
    run = _tree(tmp_path / "run")
    # The run's own directory as --out: the export's weights and tokenizer replaced the run's.
    for out, kind in ((tmp_path / "run", "a kroberta run (config.toml)"),):
        for format in ("hf", "keras-hub"):
            assert (
                kroberta.cli.export.main(
                    [
                        "--run",
                        str(tmp_path / "run"),
                        "--out",
                        str(out),
                        "--format",
                        format,
                        "--overwrite",
                    ]
                )
                == 2
            )
            assert capsys.readouterr().err == (
                f"error: --out {out}: holds {kind}, which an export must not replace; export "
                "into a directory of its own\n"
            )
    assert _tree(tmp_path / "run") == run
    # A run's subfolder (its logs, checkpoints) holds no export either.
    (tmp_path / "run" / "tensorboard").mkdir()
    (tmp_path / "run" / "tensorboard" / "events.out.tfevents.1").write_text("")
    assert (
        kroberta.cli.export.main(
            [
                "--run",
                str(tmp_path / "run"),
                "--out",
                str(tmp_path / "run" / "tensorboard"),
                "--overwrite",
            ]
        )
        == 2
    )
    assert (
        "holds files, but not a Hugging Face export (model.safetensors is missing)"
        in capsys.readouterr().err
    )
    model = randomized_model()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text("{}")
    with pytest.raises(InputError, match=r"holds prepared data \(manifest.json\)"):
        kroberta.export_hf(model, str(tmp_path / "data"), overwrite=True)
    # An export of the other format: the two would mix into a directory neither library reads.
    kroberta.export_hf(model, str(tmp_path / "hf"))
    hf_files = _tree(tmp_path / "hf")
    with pytest.raises(InputError, match=r"holds a Hugging Face export \(model.safetensors\)"):
        kroberta.export_keras_hub(model, str(tmp_path / "hf"), overwrite=True)
    kroberta.export_keras_hub(model, str(tmp_path / "preset"))
    with pytest.raises(InputError, match=r"holds a keras-hub preset \(metadata.json\)"):
        kroberta.export_hf(model, str(tmp_path / "preset"), overwrite=True)
    assert _tree(tmp_path / "hf") == hf_files


@pytest.mark.parametrize("format", ["hf", "keras-hub"])
def test_an_interrupted_export_leaves_the_previous_one_whole(tmp_path, monkeypatch, format):
    import keras_hub

    model = randomized_model()
    export = kroberta.export_hf if format == "hf" else kroberta.export_keras_hub
    out = tmp_path / "export"
    export(model, str(out), tokenizer=tiny_tokenizer())
    (out / "README.md").write_text("a model card")
    before = _tree(out)

    def interrupted(*args, **kwargs):  # Ctrl-C after the weights were written
        raise KeyboardInterrupt

    if format == "hf":
        monkeypatch.setattr(hf, "_export_tokenizer", interrupted)
    else:  # the classifier preprocessor's files, saved after the model's
        monkeypatch.setattr(
            keras_hub.models.RobertaTextClassifierPreprocessor, "save_to_preset", interrupted
        )
    with pytest.raises(KeyboardInterrupt):
        export(randomized_model(seed=3), str(out), tokenizer=tiny_tokenizer(), overwrite=True)
    assert _tree(out) == before
    assert sorted(os.listdir(tmp_path)) == ["export"]  # no partial directory beside it
    (tmp_path / "new").mkdir()
    with pytest.raises(KeyboardInterrupt):  # a new export: nothing at all is left
        export(model, str(tmp_path / "new" / "export"), tokenizer=tiny_tokenizer())
    assert os.listdir(tmp_path / "new") == []
    monkeypatch.undo()
    export(randomized_model(seed=3), str(out), overwrite=True)  # without a tokenizer now
    assert (out / "README.md").read_text() == "a model card"  # the user's file is kept
    assert "tokenizer.json" not in os.listdir(out)  # the previous export's is not
    assert_same_weights(randomized_model(seed=3), kroberta.load(str(out)))


def test_export_arguments_of_the_wrong_kind_write_nothing(tmp_path):
    from kroberta.errors import ArgumentKindError

    model = randomized_model()
    for export in (kroberta.export_hf, kroberta.export_keras_hub):
        with pytest.raises(
            ArgumentKindError,
            match=r"tokenizer: expected a tokenizers.Tokenizer.*"
            r"got bool \(overwrite is passed by name",
        ):
            export(model, str(tmp_path / "out"), True)
        with pytest.raises(ArgumentKindError, match="tokenizer: .*got str"):
            export(model, str(tmp_path / "out"), str(tmp_path / "tokenizer.json"))
        with pytest.raises(ArgumentKindError, match="out_dir: expected a directory's path, got ''"):
            export(model, "")
    assert os.listdir(tmp_path) == []


def test_reading_the_wrong_thing_says_what_to_give(tmp_path):
    from kroberta.errors import ArgumentKindError, NotFoundError

    model = randomized_model()
    kroberta.export_hf(model, str(tmp_path / "hf"))
    kroberta.export_keras_hub(model, str(tmp_path / "preset"))
    with pytest.raises(
        ArgumentKindError,
        match=r"expected a directory's path, got MaskedLM "
        r"\(a model already: use it as it is\)",
    ):
        kroberta.load(model)
    with pytest.raises(
        NotFoundError,
        match=rf"config.json: a file, not a directory; give "
        rf"the directory that holds it \({tmp_path / 'hf'}\)",
    ):
        kroberta.load(str(tmp_path / "hf" / "config.json"))
    # One loader tells the two formats apart by their files.
    assert_same_weights(model, kroberta.load(str(tmp_path / "preset")))
    assert_same_weights(model, kroberta.load(str(tmp_path / "hf")))
    # Swapped arguments are named as such, not as a path to load.
    for call, name in (
        (kroberta.export_hf, "export_hf"),
        (kroberta.export_keras_hub, "export_keras_hub"),
    ):
        with pytest.raises(
            ArgumentKindError,
            match=rf"^{name}: the model first, then the path: "
            rf"kroberta.{name}\(model, out_dir\)$",
        ):
            call(str(tmp_path / "out"), model)
    with pytest.raises(ArgumentKindError, match=r"kroberta.evaluate\(model, data\)"):
        kroberta.evaluate(str(tmp_path / "data"), model)


def _truncate(path, size=100):
    with open(path, "r+b") as f:
        f.truncate(size)


def test_damaged_files_are_one_error_naming_the_file(tmp_path, capsys):
    make_run(tmp_path / "run", tokenizer=tiny_tokenizer())
    model = kroberta.load(str(tmp_path / "run"))
    kroberta.export_hf(model, str(tmp_path / "hf"))
    kroberta.export_keras_hub(model, str(tmp_path / "preset"))
    # No tokenizer given: each export writes the model's own.
    assert {"tokenizer.json", "vocab.json"} <= set(os.listdir(tmp_path / "hf"))
    assert "preprocessor.json" in os.listdir(tmp_path / "preset")
    (tmp_path / "hf" / "tokenizer.json").write_text('{"version": "1.0", "truncated')
    with pytest.raises(InputError, match=rf"{tmp_path / 'hf' / 'tokenizer.json'}"):
        kroberta.load(str(tmp_path / "hf"))
    damaged = [
        (tmp_path / "run" / "model.weights.h5", kroberta.load, tmp_path / "run"),
        (tmp_path / "hf" / "model.safetensors", kroberta.load, tmp_path / "hf"),
        (tmp_path / "preset" / "task.weights.h5", kroberta.load, tmp_path / "preset"),
    ]
    for path, read, directory in damaged:  # a copy cut short
        _truncate(path)
        with pytest.raises(InputError, match=r"cannot read this .*: damaged"):
            read(str(directory))
    assert (
        kroberta.cli.export.main(["--run", str(tmp_path / "run"), "--out", str(tmp_path / "out")])
        == 2
    )
    error = capsys.readouterr().err
    assert error.startswith(
        f"error: {tmp_path / 'run' / 'model.weights.h5'}: cannot read this "
        "weights file: damaged, truncated or not this model's ("
    )
    assert error.count("\n") == 1
    (tmp_path / "run" / "tokenizer.json").write_text('{"version": "1.0", "truncated')
    with pytest.raises(
        InputError,
        match=rf"{tmp_path / 'run' / 'tokenizer.json'}: cannot read "
        r"this tokenizer: damaged",
    ):
        kroberta.load(str(tmp_path / "run"))


def test_an_export_has_the_usual_modes_and_no_leftover_when_interrupted_at_its_end(
    tmp_path, monkeypatch
):
    import shutil

    from kroberta import interop
    from kroberta.atomic import umask

    model = randomized_model()
    out = tmp_path / "export"
    kroberta.export_hf(model, str(out))
    # Not mkdtemp's owner-only 0700 (nor safetensors' 0600): others may read an export.
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask()
    assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask()
    removals, rmtree = [], shutil.rmtree

    def interrupted_once(path, ignore_errors=False):  # Ctrl-C while the old export is removed
        removals.append(path)
        if len(removals) == 1:
            raise KeyboardInterrupt
        rmtree(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(interop.shutil, "rmtree", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        kroberta.export_hf(randomized_model(seed=3), str(out), overwrite=True)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["export"]  # the old one went all the same
    assert_same_weights(randomized_model(seed=3), kroberta.load(str(out)))
