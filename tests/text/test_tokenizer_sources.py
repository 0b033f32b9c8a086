"""prepare --tokenizer: a tokenizer.json, a Hugging Face model directory (tokenizer.json or
vocab.json + merges.txt) or a keras-hub preset directory; ids equal Hugging Face's."""

import json
import os
import shutil
import uuid

import numpy as np
import pytest

from kroberta import storage
from kroberta.cli.prepare import main
from kroberta.errors import InputError
from kroberta.text.build import prepare
from kroberta.text.tokenizer import load_tokenizer
from tests.text.test_prepare import read_split

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
TRAINING = [
    "the cat sat on the mat",
    "dogs ran far away and back",
    "über naïve café 日本 résumé",
] * 20
# Runs of spaces, tabs, words the merges never saw, a line longer than the sequence.
LINES = [
    "the cat  sat   on the mat",
    "  dogs\tran far",
    "über naïve café 日本",
    "catalogue of mats",
    "x",
    " ".join(["the cat sat on the mat"] * 8),
]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """One byte-level BPE tokenizer in every layout prepare reads, and Hugging Face's tokenizer."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaTokenizerFast

    root = tmp_path_factory.mktemp("sources")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        TRAINING, vocab_size=330, min_frequency=2, special_tokens=SPECIALS, show_progress=False
    )
    bpe_dir = root / "bpe"
    bpe_dir.mkdir()
    bpe.save_model(str(bpe_dir))  # vocab.json + merges.txt
    hf_vocab = root / "hf-vocab"  # a Hugging Face model directory without tokenizer.json
    shutil.copytree(bpe_dir, hf_vocab)
    reference = RobertaTokenizerFast.from_pretrained(str(hf_vocab))
    hf_json = root / "hf-json"
    reference.save_pretrained(str(hf_json))
    import keras_hub

    preset = root / "preset"  # tokenizer.json (a Keras layer config) + assets/tokenizer/
    keras_hub.models.RobertaTokenizer(
        vocabulary=str(bpe_dir / "vocab.json"), merges=str(bpe_dir / "merges.txt")
    ).save_to_preset(str(preset))
    urls = {}  # the same directories at a URL (fsspec's memory://, the code path of gs://)
    for name, local in (("hf-vocab", hf_vocab), ("preset", preset)):
        urls[f"{name} at a URL"] = f"memory://kroberta-{uuid.uuid4().hex[:8]}/{name}"
        for path in local.rglob("*"):
            if path.is_file():
                target = f"{urls[f'{name} at a URL']}/{path.relative_to(local).as_posix()}"
                storage.write_bytes(target, path.read_bytes())
    return {
        "reference": reference,
        "tokenizer.json": str(hf_json / "tokenizer.json"),
        "hf-json": str(hf_json),
        "hf-vocab": str(hf_vocab),
        "preset": str(preset),
        **urls,
    }


def test_the_fixture_covers_each_layout(sources):
    assert "tokenizer.json" in os.listdir(sources["hf-json"])
    assert {"tokenizer.json", "assets"} <= set(os.listdir(sources["preset"]))
    assert not os.path.exists(os.path.join(sources["hf-vocab"], "tokenizer.json"))
    assert sources["reference"]("a  b")["input_ids"][0] == 0  # <s> has RoBERTa's id


@pytest.mark.parametrize(
    "layout",
    ["tokenizer.json", "hf-json", "hf-vocab", "preset", "hf-vocab at a URL", "preset at a URL"],
)
def test_prepared_ids_equal_hugging_face_ids(tmp_path, sources, layout):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    out = tmp_path / "o"
    L = 16
    manifest = prepare(
        str(corpus),
        out,
        seq_len=L,
        tokenizer=sources[layout],
        validation_fraction=0,
        progress=False,
        line_by_line=True,
    )
    ids, mask, _ = read_split(out, "train")
    expected = sources["reference"](LINES, truncation=True, max_length=L, padding="max_length")
    np.testing.assert_array_equal(ids, expected["input_ids"])
    np.testing.assert_array_equal(mask, expected["attention_mask"])
    assert manifest["vocabulary_size"] == len(sources["reference"])
    written = load_tokenizer(out / "tokenizer.json")  # what training runs read
    for line in LINES:
        assert written.encode(line).ids == sources["reference"](line)["input_ids"]


def test_packed_ids_equal_hugging_face_ids(tmp_path, sources):
    text = "the cat  sat   on the mat\nüber naïve café"
    corpus = tmp_path / "c.txt"
    corpus.write_text(text + "\n", encoding="utf-8")
    prepare(
        str(corpus),
        tmp_path / "o",
        seq_len=32,
        tokenizer=sources["hf-vocab"],
        validation_fraction=0,
        progress=False,
    )
    ids, _, _ = read_split(tmp_path / "o", "train")
    expected = sources["reference"](text, max_length=32, padding="max_length")["input_ids"]
    np.testing.assert_array_equal(ids, [expected])


def test_cli_takes_a_hugging_face_directory(tmp_path, sources, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n".join(LINES) + "\n", encoding="utf-8")
    assert (
        main(
            [
                "--input",
                str(corpus),
                "--out",
                str(tmp_path / "o"),
                "--tokenizer",
                sources["hf-vocab"],
                "--seq-len",
                "16",
                "--no-progress",
            ]
        )
        == 0
    )
    assert json.load(open(tmp_path / "o" / "manifest.json"))["tokenizer"] == "tokenizer.json"


def test_a_directory_without_a_tokenizer_is_refused(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("some text\n", encoding="utf-8")
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        InputError,
        match=r"empty: no tokenizer in this directory; expected a tokenizer.json, "
        r"a Hugging Face model directory",
    ):
        prepare(str(corpus), tmp_path / "o", tokenizer=tmp_path / "empty", progress=False)
    assert not (tmp_path / "o").exists()


def test_a_vocabulary_without_roberta_specials_is_refused(tmp_path, sources):
    directory = tmp_path / "bert-like"
    shutil.copytree(sources["hf-vocab"], directory)
    vocabulary = json.load(open(directory / "vocab.json"))
    vocabulary["[MASK]"] = vocabulary.pop("<mask>")
    (directory / "vocab.json").write_text(json.dumps(vocabulary))
    corpus = tmp_path / "c.txt"
    corpus.write_text("some text\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"vocab.json lacks the special token\(s\) <mask>"):
        prepare(str(corpus), tmp_path / "o", tokenizer=directory, progress=False)


def test_load_of_a_preset_reads_its_tokenizer_the_same_way(sources):
    from kroberta.interop.keras_hub_presets import preset_tokenizer

    rebuilt = preset_tokenizer(sources["preset"])
    for line in LINES:
        assert rebuilt.encode(line).ids == sources["reference"](line)["input_ids"]


def test_a_merges_file_with_a_blank_line_is_refused_as_the_library_refuses_it(tmp_path, sources):
    directory = tmp_path / "broken"
    shutil.copytree(sources["hf-vocab"], directory)
    lines = (directory / "merges.txt").read_text(encoding="utf-8").split("\n")
    (directory / "merges.txt").write_text("\n".join(lines[:3] + [""] + lines[3:]), encoding="utf-8")
    with pytest.raises(InputError, match=r"cannot read .*vocab.json \+ .*merges.txt"):
        load_tokenizer(directory)
