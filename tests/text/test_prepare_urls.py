"""prepare on URLs: inputs globbed and streamed through fsspec (memory:// stands in for
gs://; file:// URLs for a filesystem every worker process reaches), the output uploaded
through fsspec; the result is byte for byte the local one's."""

import gzip
import io
import json
import uuid

import pytest
import tensorflow as tf

import kroberta.cli.prepare
from kroberta import prepare, storage
from kroberta.errors import InputError
from kroberta.text.textfiles import Source, expand_inputs, iter_documents, scan_file
from kroberta.text.tokenizer import load_tokenizer, train_tokenizer

# The fast tier (docs/contributing.md): builds no model and starts no process.
pytestmark = pytest.mark.fast


def _corpus(root):
    """The same documents as .txt, .txt.gz, .jsonl and .parquet files under `root`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    documents = [f"Document {i} says the river {'runs ' * (i % 7)}to the sea." for i in range(400)]
    parquet = io.BytesIO()
    pq.write_table(pa.table({"text": documents[300:]}), parquet)
    files = {
        "a.txt": "\n\n".join(documents[:100]).encode(),
        "b.txt.gz": gzip.compress("\n\n".join(documents[100:200]).encode()),
        "c.jsonl": "".join(json.dumps({"text": d}) + "\n" for d in documents[200:300]).encode(),
        "d.parquet": parquet.getvalue(),
    }
    for name, data in files.items():
        storage.write_bytes(f"{root}/{name}", data)


def test_prepare_reads_url_inputs_and_writes_a_url_like_local_paths(tmp_path, capsys):
    ram = f"memory://kroberta-{uuid.uuid4().hex[:8]}/corpus"
    _corpus(ram)
    (tmp_path / "corpus").mkdir()
    _corpus(str(tmp_path / "corpus"))
    out = f"memory://kroberta-{uuid.uuid4().hex[:8]}/data"
    # memory:// lives in this process only: one worker, this one.
    settings = dict(vocab_size=300, seq_len=32, validation_fraction=0.1, progress=False, workers=1)

    local = prepare([str(tmp_path / "corpus" / "*")], str(tmp_path / "data"), **settings)
    remote = prepare([f"{ram}/*"], out, **settings)
    assert remote["source"]["files"] == [
        f"{ram}/{n}" for n in ("a.txt", "b.txt.gz", "c.jsonl", "d.parquet")
    ]
    assert remote["train"] == local["train"] and remote["validation"] == local["validation"]
    for name in [*local["train"]["files"], *local["validation"]["files"], "tokenizer.json"]:
        assert storage.read_bytes(f"{out}/{name}") == (tmp_path / "data" / name).read_bytes(), name
    assert storage.isfile(f"{out}/manifest.json")

    with pytest.raises(InputError, match="already holds a prepared dataset"):
        prepare([f"{ram}/*"], out, **settings)
    assert (
        kroberta.cli.prepare.main(
            [
                "--input",
                f"{ram}/*.txt",
                "--out",
                out,
                "--overwrite",
                "--workers",
                "1",
                "--vocab-size",
                "300",
                "--seq-len",
                "32",
                "--no-progress",
            ]
        )
        == 0
    )
    manifest = json.loads(storage.read_text(f"{out}/manifest.json"))
    assert manifest["source"]["files"] == [f"{ram}/a.txt"]

    # --check on a prepared directory at a URL (its manifest read through kroberta.storage,
    # its records through tf.data: a file:// URL, which both read).
    url_data = f"file://{tmp_path}/checked"
    for name in storage.listdir(out):
        storage.write_bytes(f"{url_data}/{name}", storage.read_bytes(f"{out}/{name}"))
    capsys.readouterr()
    assert kroberta.cli.prepare.main(["--check", url_data]) == 0, capsys.readouterr()


def test_every_worker_streams_url_inputs(tmp_path):
    """file:// URLs go through fsspec as gs:// would, and every worker process opens them."""
    (tmp_path / "corpus").mkdir()
    _corpus(str(tmp_path / "corpus"))
    settings = dict(
        vocab_size=300, seq_len=32, validation_fraction=0.1, progress=False, chunk_bytes=1500
    )
    local = prepare(
        [str(tmp_path / "corpus" / "*")], str(tmp_path / "local"), workers=1, **settings
    )
    remote = prepare(
        [f"file://{tmp_path}/corpus/*"], str(tmp_path / "remote"), workers=3, **settings
    )
    assert local["source"]["chunks"] == remote["source"]["chunks"] > 3
    for name in [*local["train"]["files"], *local["validation"]["files"], "tokenizer.json"]:
        assert (tmp_path / "remote" / name).read_bytes() == (
            tmp_path / "local" / name
        ).read_bytes(), name


def test_a_tokenizer_and_a_corpus_at_a_memory_url_read_like_local_ones(tmp_path, monkeypatch):
    """One storage layer: a memory:// URL (which TensorFlow cannot open) reads as the local
    copy does, and nothing asks tf.io.gfile."""

    def refused(*args, **kwargs):
        raise AssertionError("tf.io.gfile used")

    for name in ("GFile", "exists", "isdir", "glob", "walk"):
        monkeypatch.setattr(tf.io.gfile, name, refused)
    ram = f"memory://kroberta-{uuid.uuid4().hex[:8]}"
    (tmp_path / "corpus").mkdir()
    _corpus(str(tmp_path / "corpus"))
    _corpus(f"{ram}/corpus")
    train_tokenizer(["the river runs to the sea"] * 10, 270, out_path=tmp_path / "tokenizer.json")
    storage.write_bytes(f"{ram}/tokenizer.json", (tmp_path / "tokenizer.json").read_bytes())
    assert (
        load_tokenizer(f"{ram}/tokenizer.json").to_str()
        == load_tokenizer(tmp_path / "tokenizer.json").to_str()
    )

    def read(root):
        files = expand_inputs(f"{root}/*")
        assert [scan_file(f) for f in files if f.endswith(".txt")]  # sized and checked as text
        return list(iter_documents([Source.of(f) for f in files]))

    local = read(str(tmp_path / "corpus"))
    assert len(local) == 400 and read(f"{ram}/corpus") == local
