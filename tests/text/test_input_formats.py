"""prepare's input formats: each gives the documents (so the tokens) of the same text in a .txt file."""

import csv
import dataclasses
import gzip
import json
import os
import re
import sys

import numpy as np
import pytest

from kroberta.cli.prepare import main
from kroberta.config import load_config
from kroberta.errors import InputError
from kroberta.text import build
from kroberta.text.build import prepare
from kroberta.text.textfiles import iter_documents, record_document
from tests.text.test_prepare import make_docs, read_split, tokenizer_path, write_corpus  # noqa: F401

DOCS = make_docs(60, seed=3)


def write_jsonl(path, docs, field="text", opener=open):
    with opener(path, "wt", encoding="utf-8") as f:
        for i, doc in enumerate(docs):
            f.write(json.dumps({"id": i, field: doc}, ensure_ascii=False) + "\n")
    return str(path)


def write_json_array(path, docs):
    with open(path, "w", encoding="utf-8-sig") as f:  # with a byte-order mark, as some tools write
        json.dump([{"text": doc, "n": 1.5} for doc in docs], f, indent=1, ensure_ascii=False)
    return str(path)


def write_csv(path, docs, delimiter=","):
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter=delimiter)
        writer.writerow(["id", "text"])
        writer.writerows([i, doc] for i, doc in enumerate(docs))
    return str(path)


def write_parquet(path, docs):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": list(range(len(docs))), "text": docs})
    pq.write_table(table, path, row_group_size=7)  # several row groups: read one at a time
    return str(path)


def write_datasets(path, docs, dict_split=None):
    import datasets

    dataset = datasets.Dataset.from_dict({"id": list(range(len(docs))), "text": docs})
    if dict_split:
        other = datasets.Dataset.from_dict({"id": [0], "text": ["only in the other split"]})
        dataset = datasets.DatasetDict({dict_split: dataset, "test": other})
    dataset.save_to_disk(str(path))
    return str(path)


def _prepare(inputs, out, tokenizer, **kwargs):
    kwargs.setdefault("validation_fraction", 0.1)
    return prepare(inputs, out, seq_len=16, tokenizer=tokenizer, progress=False, **kwargs)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tokenizer_path):  # noqa: F811
    root = tmp_path_factory.mktemp("reference")
    manifest = _prepare(write_corpus(root / "c.txt", DOCS), root / "out", tokenizer_path)
    return root / "out", manifest


def _assert_same_as_reference(reference, out, manifest):
    ref_dir, ref = reference
    for split in ("train", "validation"):
        assert manifest[split]["tokens"] == ref[split]["tokens"] > 0
        assert manifest[split]["sequences"] == ref[split]["sequences"]
        for a, b in zip(read_split(out, split), read_split(ref_dir, split)):
            np.testing.assert_array_equal(a, b) if a is not None else None


# A TSV is left out: it is split at tabs with no quoting, so its records cannot hold the
# line breaks these documents have (tests/text/test_delimited_files.py reads TSVs).
WRITERS = {
    "txt.gz": lambda p, d: write_corpus_gz(p, d),
    "jsonl": lambda p, d: write_jsonl(p, d),
    "jsonl.gz": lambda p, d: write_jsonl(p, d, opener=gzip.open),
    "json": lambda p, d: write_jsonl(p, d),
    "array.json": lambda p, d: write_json_array(p, d),
    "csv": lambda p, d: write_csv(p, d),
    "parquet": lambda p, d: write_parquet(p, d),
}


def write_corpus_gz(path, docs):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n\n".join(docs) + "\n")
    return str(path)


@pytest.mark.parametrize("suffix", sorted(WRITERS))
def test_each_format_gives_the_txt_tokens(reference, tmp_path, tokenizer_path, suffix):  # noqa: F811
    path = WRITERS[suffix](tmp_path / f"corpus.{suffix}", DOCS)
    manifest = _prepare([path], tmp_path / "out", tokenizer_path)
    _assert_same_as_reference(reference, tmp_path / "out", manifest)
    assert manifest["source"]["files"] == [os.path.abspath(path)]
    assert manifest["source"]["text_field"] == (None if suffix == "txt.gz" else "text")


def test_datasets_directory_and_dict_split(reference, tmp_path, tokenizer_path):  # noqa: F811
    plain = write_datasets(tmp_path / "ds", DOCS)
    manifest = _prepare(plain, tmp_path / "out", tokenizer_path)
    _assert_same_as_reference(reference, tmp_path / "out", manifest)
    # A DatasetDict: --split picks the split (default train); found inside a directory too.
    (tmp_path / "corpora").mkdir()
    write_datasets(tmp_path / "corpora" / "dict", DOCS, dict_split="train")
    manifest = _prepare(str(tmp_path / "corpora"), tmp_path / "out2", tokenizer_path)
    _assert_same_as_reference(reference, tmp_path / "out2", manifest)
    assert manifest["source"]["split"] == "train"
    other = _prepare(
        str(tmp_path / "corpora"),
        tmp_path / "out3",
        tokenizer_path,
        split="test",
        validation_fraction=0,
    )
    from kroberta.text.tokenizer import load_tokenizer

    tokens = (
        load_tokenizer(tokenizer_path)
        .encode("only in the other split", add_special_tokens=False)
        .ids
    )
    # The "test" split's one record, cut into sequences of <s> + 14 tokens + </s>.
    assert other["train"]["sequences"] == -(-len(tokens) // 14)
    assert other["train"]["tokens"] == len(tokens) + 2 * other["train"]["sequences"]
    with pytest.raises(
        InputError,
        match=r"dict: a DatasetDict without a 'dev' split \(splits: train, test\); "
        "pick one with --split",
    ):
        _prepare(str(tmp_path / "corpora" / "dict"), tmp_path / "out4", tokenizer_path, split="dev")


def test_mixed_inputs_in_order(tmp_path, tokenizer_path):  # noqa: F811
    """Text and records together: the documents in input order, as one .txt of all of them."""
    halves = DOCS[:30], DOCS[30:]
    mixed = _prepare(
        [
            write_corpus(tmp_path / "a.txt", halves[0]),
            write_parquet(tmp_path / "b.parquet", halves[1]),
        ],
        tmp_path / "mixed",
        tokenizer_path,
    )
    whole = _prepare(write_corpus(tmp_path / "all.txt", DOCS), tmp_path / "whole", tokenizer_path)
    assert text_tokens(tmp_path / "mixed") == text_tokens(tmp_path / "whole")
    assert mixed["source"]["documents"] == whole["source"]["documents"] == len(DOCS)


def text_tokens(directory):
    """The real tokens of a prepared directory's records, <s> and </s> left out, in record
    order (train, then validation): the same documents give the same ones, however packed."""
    tokens = []
    for split in ("train", "validation"):
        ids, mask, _ = read_split(directory, split)
        tokens.append(ids[(mask == 1) & (ids > 4)])
    return sorted(np.concatenate(tokens).tolist())


def test_text_field_and_missing_column_lists_the_columns(tmp_path, tokenizer_path):  # noqa: F811
    body = write_jsonl(tmp_path / "c.jsonl", DOCS, field="body")
    with pytest.raises(
        InputError,
        match=r"c.jsonl: line 1: no field 'text' \(fields: id, body\); pick one "
        "with --text-field",
    ):
        _prepare(body, tmp_path / "o", tokenizer_path)
    assert _prepare(body, tmp_path / "o", tokenizer_path, text_field="body")["train"]["tokens"] > 0
    for path in (
        write_csv(tmp_path / "c.csv", DOCS),
        write_parquet(tmp_path / "c.parquet", DOCS),
        write_datasets(tmp_path / "ds", DOCS),
    ):
        # A CSV's first line may be a record of a file without a header: it says so.
        header = "; the first line is read as the header" if path.endswith(".csv") else ""
        with pytest.raises(
            InputError,
            match=rf"no column 'body' \(columns: id, text{header}\); "
            r"pick one with --text-field",
        ):
            _prepare(path, tmp_path / "o2", tokenizer_path, text_field="body")
    with pytest.raises(InputError, match=r"c.parquet: column 'id' holds int64, not text"):
        _prepare(str(tmp_path / "c.parquet"), tmp_path / "o2", tokenizer_path, text_field="id")
    assert not (tmp_path / "o2").exists(), "checked before any work"


def test_a_repeated_column_name_reads_its_first_column_and_a_short_row_is_named(tmp_path):
    from kroberta.text.recordfiles import iter_values

    path = tmp_path / "r.csv"
    path.write_text('text,text,n\nfirst,second,1\n"two\nlines",x,2\nshort\n\n,\n')
    assert list(iter_values(str(path), "csv", "text", "train")) == [
        "first",
        "two\nlines",
        "short",
        "",
    ]
    path.write_text("n,text\n1,a\n2\n")
    with pytest.raises(InputError, match=r"r.csv: line 3: no field 'text' \(fields: n\)"):
        list(iter_values(str(path), "csv", "text", "train"))


def test_one_object_over_many_lines_is_told_what_json_lines_are(tmp_path):
    from kroberta.text.recordfiles import iter_values

    path = tmp_path / "one.json"
    path.write_text('{\n  "text": "hello"\n}\n')
    with pytest.raises(
        InputError,
        match=r"one.json: line 1: not a JSON object: .*; JSON lines hold one "
        r"whole object per line \(or give a JSON array",
    ):
        list(iter_values(str(path), "jsonl", "text", "train"))


def test_bad_records_are_named(tmp_path, tokenizer_path, capsys):  # noqa: F811
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine"}\n{"text": "fine"\n')
    assert (
        main(
            [
                "--input",
                str(path),
                "--out",
                str(tmp_path / "o"),
                "--tokenizer",
                tokenizer_path,
                "--no-progress",
            ]
        )
        == 2
    )
    assert (
        "bad.jsonl: line 2: not a JSON object: Expecting ',' delimiter" in capsys.readouterr().err
    )
    assert not (tmp_path / "o").exists(), "the directory prepare created is removed again"
    with pytest.raises(
        InputError, match="bad.jsonl: line 2"
    ):  # found while training a tokenizer too
        prepare([str(path)], tmp_path / "o2", vocab_size=300, seq_len=16, progress=False)
    for content, problem in (
        ('[{"text": "a"}, {"text": "b"} {"text": "c"}]', "record 2: expected ',' or ']'"),
        ('[{"text": "a"}, {"text": "b"', "record 2: not valid JSON"),
        ('[{"text": "a"}, ', "the JSON array ends early, after 1 record"),
        ('[{"text": "a"}, ["b"]]', "record 2: a JSON list, not an object"),
    ):
        array = tmp_path / "array.json"
        array.write_text(content)
        with pytest.raises(InputError, match=f"array.json: {re.escape(problem)}"):
            list(iter_documents([build.Source.of(array)]))
    number = tmp_path / "number.jsonl"
    number.write_text('{"text": "a"}\n{"text": 7}\n')
    with pytest.raises(
        InputError, match=r"number.jsonl: line 2: field 'text' holds int '7', not text"
    ):
        list(iter_documents([build.Source.of(number)]))
    # Bytes that are not UTF-8 in a CSV are named by their line, near the start or far in.
    for rows, bad_row in ((2, 2), (2000, 1500)):
        lines = [b"id,text\n"] + [b"%d,row %d\n" % (i, i) for i in range(1, rows + 1)]
        lines[bad_row] = b"%d,caf\xe9\n" % bad_row
        latin = tmp_path / f"latin{rows}.csv"
        latin.write_bytes(b"".join(lines))
        with pytest.raises(InputError, match=rf"latin{rows}.csv: line {bad_row + 1}: not UTF-8"):
            list(iter_documents([build.Source.of(latin)]))


def test_missing_extra_says_what_to_install(tmp_path, tokenizer_path, monkeypatch, capsys):  # noqa: F811
    parquet = write_parquet(tmp_path / "c.parquet", DOCS)
    dataset = write_datasets(tmp_path / "ds", DOCS)
    for name in [m for m in sys.modules if m == "pyarrow" or m.startswith("pyarrow.")]:
        monkeypatch.setitem(sys.modules, name, None)  # `import pyarrow...` now raises ImportError
    monkeypatch.setitem(sys.modules, "datasets", None)
    capsys.readouterr()  # datasets' own progress bars while writing
    assert (
        main(["--input", parquet, "--out", str(tmp_path / "o"), "--tokenizer", tokenizer_path]) == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert (
        "c.parquet: reading Parquet needs the 'pyarrow' package: pip install -e \".[parquet]\""
        in err
    )
    assert (
        main(["--input", dataset, "--out", str(tmp_path / "o"), "--tokenizer", tokenizer_path]) == 2
    )
    assert "needs the 'datasets' package: pip install -e \".[datasets]\"" in capsys.readouterr().err


def test_record_documents_are_normalised_like_text_files():
    assert record_document("a\r\nb\n\n  \nc\n") == "a\nb\nc"
    assert record_document("  \n\t") == ""
    assert record_document("one line") == "one line"


def test_parquet_streams_by_batches(tmp_path, monkeypatch):
    """Flat memory: the reader never holds more than one batch of rows."""
    from kroberta.text import arrowfiles

    path = write_parquet(tmp_path / "c.parquet", DOCS)
    monkeypatch.setattr(arrowfiles, "ARROW_BATCH_ROWS", 5)
    sizes = []
    real = arrowfiles.parquet_file

    def spy(p):
        parquet = real(p)
        original = parquet.iter_batches

        def iter_batches(**kwargs):
            for batch in original(**kwargs):
                sizes.append(batch.num_rows)
                yield batch

        parquet.iter_batches = iter_batches
        return parquet

    monkeypatch.setattr(arrowfiles, "parquet_file", spy)
    seen = []
    docs = list(iter_documents([build.Source.of(path)], seen.append))
    assert docs == [record_document(d) for d in DOCS]
    assert max(sizes) <= 5 and sum(sizes) == len(DOCS)
    assert sum(seen) == os.path.getsize(path)  # progress adds up to the file's size


def test_check_a_plain_directory_with_a_planted_defect(tmp_path, capsys):
    from kroberta.data.records import encode_examples
    from kroberta.data.tfrecord_files import RecordFileWriter

    folder = tmp_path / "elsewhere"
    folder.mkdir()
    good = np.arange(5, 21, dtype=np.int64)
    for name, bad_id in (("a.tfrecord", None), ("b.tfrecords", 999)):
        with RecordFileWriter(folder / name) as writer:
            for i in range(3):
                ids = good.copy()
                if bad_id is not None and i == 2:
                    ids[4] = bad_id
                writer.write_many(encode_examples(ids, np.ones(16, np.int64)))
    (folder / "notes.txt").write_text("not a record file")
    assert main(["--check", str(folder)]) == 2
    assert "needs --vocab-size" in capsys.readouterr().err
    assert main(["--check", str(folder), "--vocab-size", "100"]) == 1
    out = capsys.readouterr().out
    assert "a.tfrecord: 3 records, 0 with labels, ok" in out
    assert (
        "b.tfrecords: 3 records" in out
        and "b.tfrecords: record 2: feature 'input_ids' value 999: " in out
    )
    assert "notes.txt" not in out
    assert main(["--check", str(folder), "--vocab-size", "1000"]) == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["--check", str(empty), "--vocab-size", "100"]) == 2
    assert "no manifest.json and no TFRecord files" in capsys.readouterr().err


def test_every_format_end_to_end_trains_the_same_tokenizer_and_a_model(tmp_path):
    """All formats in one prepare, without a given tokenizer: the tokenizer and token counts of one
    .txt holding the same documents, then a short training run from the prepared directory."""
    from kroberta import train

    inputs = [WRITERS[suffix](tmp_path / f"corpus.{suffix}", DOCS) for suffix in sorted(WRITERS)]
    inputs.append(write_datasets(tmp_path / "corpus.datasets", DOCS))
    text = prepare(
        write_corpus(tmp_path / "all.txt", DOCS * len(inputs)),
        tmp_path / "from_txt",
        vocab_size=300,
        seq_len=16,
        progress=False,
        validation_fraction=0.1,
    )
    records = prepare(
        inputs,
        tmp_path / "from_all",
        vocab_size=300,
        seq_len=16,
        progress=False,
        validation_fraction=0.1,
    )
    assert (tmp_path / "from_txt" / "tokenizer.json").read_text() == (
        tmp_path / "from_all" / "tokenizer.json"
    ).read_text()
    assert text_tokens(tmp_path / "from_all") == text_tokens(tmp_path / "from_txt")
    assert records["source"]["documents"] == text["source"]["documents"]
    assert len(records["source"]["files"]) == len(inputs) == 8
    config = load_config("tiny")
    config = dataclasses.replace(
        config,
        run_dir=str(tmp_path / "run"),
        data=dataclasses.replace(config.data, dir=str(tmp_path / "from_all")),
        model=dataclasses.replace(
            config.model, vocabulary_size=records["vocabulary_size"], max_sequence_length=16
        ),
        train=dataclasses.replace(
            config.train, steps=4, warmup_steps=0, log_every=2, eval_every=4, checkpoint_every=4
        ),
    )
    summary = train(config)
    assert summary["final_step"] == 4
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    rows = [
        r for r in rows if r["split"] != "checkpoint"
    ]  # checkpoint rows carry blocked time only
    assert all(np.isfinite(r["loss"]) for r in rows) and {r["split"] for r in rows} == {
        "train",
        "validation",
    }


@pytest.mark.parametrize("block", [1, 7, 64])
def test_json_array_records_across_read_blocks(tmp_path, monkeypatch, block):
    """Records, numbers and strings cut at any block boundary decode whole."""
    from kroberta.text import recordfiles

    monkeypatch.setattr(recordfiles, "_PROGRESS_EVERY", block)
    path = write_json_array(tmp_path / "c.json", DOCS[:12])
    seen = []
    assert list(iter_documents([build.Source.of(path)], seen.append)) == [
        record_document(d) for d in DOCS[:12]
    ]
    assert sum(seen) == os.path.getsize(path)


@pytest.mark.parametrize("suffix", sorted(WRITERS) + ["datasets"])
def test_progress_adds_up_to_the_scanned_size(tmp_path, suffix):
    from kroberta.text.recordfiles import check_source
    from kroberta.text.textfiles import scan_file

    path = (
        write_datasets(tmp_path / "ds", DOCS)
        if suffix == "datasets"
        else WRITERS[suffix](tmp_path / f"c.{suffix}", DOCS)
    )
    source = build.Source.of(path)
    size = (
        scan_file(path)[0]
        if source.format is None
        else check_source(path, source.format, "text", "train")
    )
    seen = []
    assert len(list(iter_documents([source], seen.append))) == len(DOCS)
    assert sum(seen) == size > 0


def test_a_damaged_gzip_text_file_is_skipped_with_a_warning(tmp_path, tokenizer_path):  # noqa: F811
    good = write_corpus(tmp_path / "good.txt", DOCS)
    (tmp_path / "bad.txt.gz").write_bytes(b"\x1f\x8b\x08\x00 this is not deflate data")
    with pytest.warns(
        build.PrepareWarning, match=r"skipping .*bad.txt.gz: not a readable gzip file"
    ):
        manifest = _prepare([good, str(tmp_path / "bad.txt.gz")], tmp_path / "o", tokenizer_path)
    assert manifest["source"]["skipped_files"][0]["problem"].startswith("not a readable gzip file")


def test_a_damaged_gzip_record_file_is_named(tmp_path, tokenizer_path):  # noqa: F811
    whole = gzip.compress("".join(json.dumps({"text": d}) + "\n" for d in DOCS * 20).encode())
    for name, data in (
        ("cut.jsonl.gz", whole[: len(whole) // 2]),
        ("junk.csv.gz", b"\x1f\x8b\x08\x00 no data"),
        ("plain.jsonl.gz", b'{"text": "not gzipped"}\n'),
    ):  # the header itself is wrong
        (tmp_path / name).write_bytes(data)
        with pytest.raises(InputError, match=f"{name}: not a readable gzip file"):
            _prepare(str(tmp_path / name), tmp_path / "o", tokenizer_path, overwrite=True)
