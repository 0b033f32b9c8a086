"""prepare at scale: chunks, workers, resuming, the tokenizer's sample, TFRecords without
TensorFlow, memory per process."""

import csv
import gzip
import itertools
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from kroberta.data.records import encode_examples
from kroberta.data.tfrecord_files import RecordFileWriter, read_records
from kroberta.errors import InputError
from kroberta.text.build import prepare
from kroberta.text.chunks import Chunk, csv_cut_points, cut_points, plan_chunks
from kroberta.text.job import ChunkResult, SplitCount
from kroberta.text.sample import sample_documents
from kroberta.text.textfiles import Source, iter_documents
from kroberta.text.work_dir import WorkDir
from tests.text.test_prepare import REPO, make_docs, write_corpus

SETTINGS = dict(
    vocab_size=300,
    seq_len=16,
    validation_fraction=0.1,
    progress=False,
    chunk_bytes=3000,
    tokenizer_sample_bytes=20_000,
)


def _quoted_docs(n, seed):
    """Documents that a CSV must quote: line breaks, commas, quotes (a stray one in an
    unquoted field too, which the reader keeps as a character)."""
    docs = make_docs(n, seed=seed)
    return [
        d.replace("cat", 'the "cat"').replace("mat", "mat, rug")
        if i % 3
        else d.split("\n")[0] + ' 5" tall'
        for i, d in enumerate(docs)
    ]


def _write_csv(path, docs):
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "text"])
        writer.writerows([i, d] for i, d in enumerate(docs))
    return str(path)


def _write_tsv(path, docs):
    with open(path, "w", encoding="utf-8") as f:
        f.write(
            "text\tid\n" + "".join(f"{d.replace(chr(10), ' ')}\t{i}\n" for i, d in enumerate(docs))
        )
    return str(path)


def _corpus(root):
    """Three text files (one gzipped: a chunk of its own), a JSON lines, a CSV (quoted
    fields spanning lines) and a TSV file, ~80 KB: each file but the gzipped one cut."""
    root.mkdir()
    write_corpus(root / "a.txt", make_docs(400, seed=1))
    with gzip.open(root / "b.txt.gz", "wt", encoding="utf-8") as f:
        f.write("\n\n".join(make_docs(100, seed=2)))
    write_corpus(root / "c.txt", make_docs(300, seed=3))
    with open(root / "d.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in make_docs(100, seed=4))
    _write_csv(root / "e.csv", _quoted_docs(100, seed=5))
    _write_tsv(root / "f.tsv", make_docs(100, seed=6))
    return [str(root / "*")]


def _files(directory):
    """Every file of a prepared directory (manifest without its timings) by name."""
    out = {}
    for name in sorted(os.listdir(directory)):
        data = (directory / name).read_bytes()
        if name == "manifest.json":
            manifest = json.loads(data)
            manifest.pop("timing_s")
            data = manifest
        out[name] = data
    return out


@pytest.mark.fast
def test_cuts_fall_at_blank_lines_and_the_chunks_give_the_file_s_documents(tmp_path):
    docs = make_docs(300, seed=7)
    path = write_corpus(tmp_path / "c.txt", docs)
    size = os.path.getsize(path)
    cuts = cut_points(path, size, 2000)
    data = open(path, "rb").read()
    assert len(cuts) > 5 and cuts == sorted(set(cuts)) and 0 < cuts[0] and cuts[-1] < size
    assert all(data[c - 2 : c] == b"\n\n" for c in cuts), "each cut right after a blank line"
    chunks = plan_chunks([Source.of(path)], [size], 2000)
    assert sum(c.size for c in chunks) == size and [c.index for c in chunks] == list(
        range(len(chunks))
    )
    read = [d for c in chunks for d in iter_documents(c.sources)]
    assert read == list(iter_documents([Source.of(path)])) == docs


@pytest.mark.fast
def _pieces_read(source, chunk_bytes):
    """(the pieces of one file, its documents read piece by piece)."""
    size = os.path.getsize(source.path)
    chunks = plan_chunks([source], [size], chunk_bytes)
    pieces = [s for c in chunks for s in c.sources]
    assert sum(c.size for c in chunks) == size
    return pieces, [d for piece in pieces for d in iter_documents([piece])]


@pytest.mark.fast
@pytest.mark.parametrize("chunk_bytes", [1, 97, 1000, 4000])
def test_json_lines_and_tsv_files_are_cut_at_line_starts_into_the_same_records(
    tmp_path, chunk_bytes
):
    docs = make_docs(120, seed=8)
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    tsv = _write_tsv(tmp_path / "d.tsv", docs)
    for path in (str(jsonl), tsv):
        data = open(path, "rb").read()
        pieces, read = _pieces_read(Source.of(path), chunk_bytes)
        assert len(pieces) >= min(5, len(data) // chunk_bytes), "several pieces"
        assert all(data[p.start - 1 : p.start] == b"\n" for p in pieces[1:])
        assert read == list(iter_documents([Source.of(path)]))
    assert _pieces_read(Source.of(jsonl), chunk_bytes)[1] == docs


@pytest.mark.fast
def test_a_record_that_straddles_the_target_offset_stays_whole(tmp_path):
    """A JSON line and a CSV record (a quoted field of many lines, the target inside it)
    over the cut's target: the cut comes after it, and the record is read once, whole."""
    long_doc = "\n".join(f'line {i}, of a "quoted" field' for i in range(60))  # ~1.7 KB
    docs = ["short one", long_doc, "after it", 'a stray 5" quote, unquoted'] * 3
    csv_path = _write_csv(tmp_path / "d.csv", docs)
    data = open(csv_path, "rb").read()
    target = data.index(b"line 30")  # inside the second record
    cuts = csv_cut_points(csv_path, len(data), target)
    assert cuts and cuts[0] == data.index(b"\r\n2,after it") + 2, (
        "after the record, at the next one's start"
    )
    pieces, read = _pieces_read(Source.of(csv_path, text_field="text"), target)
    assert len(pieces) > 3 and read == [d for d in docs]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    data = jsonl.read_bytes()
    target = data.index(b"line 30")
    assert cut_points(str(jsonl), len(data), target, blank_lines=False)[0] == data.index(
        b'{"text": "after it"}'
    )
    assert _pieces_read(Source.of(jsonl), target)[1] == docs


@pytest.mark.fast
@pytest.mark.parametrize("chunk_bytes", [1, 50, 700, 5000])
def test_a_csv_is_cut_at_record_starts_into_the_same_records(tmp_path, chunk_bytes):
    docs = _quoted_docs(150, seed=9)
    path = _write_csv(tmp_path / "d.csv", docs)
    text = open(path, "rb").read()
    pieces, read = _pieces_read(Source.of(path), chunk_bytes)
    assert len(pieces) >= min(5, len(text) // chunk_bytes)
    # Each piece starts a record: its id, then a comma, right after the previous record's end.
    assert all(
        re.match(rb"\d+,", text[p.start :]) and text[p.start - 2 : p.start] == b"\r\n"
        for p in pieces[1:]
    )
    assert read == docs


@pytest.mark.fast
def test_a_csv_s_multi_line_records_are_told_once_whether_cut_or_not(tmp_path, caplog):
    path = _write_csv(tmp_path / "d.csv", _quoted_docs(60, seed=11))
    caplog.set_level("WARNING", "kroberta.text.recordfiles")
    told = {}
    for chunk_bytes in (300, 10**6):
        caplog.clear()
        pieces, _ = _pieces_read(Source.of(path), chunk_bytes)
        assert (len(pieces) > 1) == (chunk_bytes == 300)
        told[chunk_bytes] = [
            r.getMessage() for r in caplog.records if "a quoted field spans lines" in r.getMessage()
        ]
    assert len(told[300]) == 1 and told[300] == told[10**6]
    assert re.search(
        r"read 60 record\(s\) from \d+ data line\(s\).*\(the first from line \d+\)", told[300][0]
    )


@pytest.mark.fast
def test_gzipped_files_and_json_arrays_are_one_piece(tmp_path):
    docs = make_docs(80, seed=10)
    gz = tmp_path / "d.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in docs)
    array = tmp_path / "d.json"
    array.write_text(json.dumps([{"text": d} for d in docs], indent=1), encoding="utf-8")
    for path in (gz, array):
        pieces, read = _pieces_read(Source.of(path), 100)
        assert len(pieces) == 1 and pieces[0].start == 0 and pieces[0].end is None and read == docs


@pytest.mark.fast
def test_a_bad_record_in_a_piece_is_named_from_the_piece_s_first_byte(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(
        "".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(50)) + "{oops\n",
        encoding="utf-8",
    )
    size = os.path.getsize(path)
    last = plan_chunks([Source.of(path)], [size], 200)[-1].sources[-1]
    assert last.start > 0
    with pytest.raises(
        InputError, match=rf"d.jsonl: line \d+ from byte {last.start}: not a JSON object"
    ):
        list(iter_documents([last]))


@pytest.mark.fast
def test_a_file_without_blank_lines_is_cut_at_line_starts(tmp_path):
    path = tmp_path / "lines.txt"
    path.write_text("".join(f"line {i} of many\n" for i in range(2000)), encoding="utf-8")
    data = path.read_bytes()
    cuts = cut_points(str(path), len(data), 1000)
    assert len(cuts) > 10 and all(data[c - 1 : c] == b"\n" for c in cuts)
    chunks = plan_chunks([Source.of(path)], [len(data)], 1000)
    lines = [line for c in chunks for d in iter_documents(c.sources) for line in d.split("\n")]
    assert lines == data.decode().splitlines()


def test_the_same_records_in_the_same_order_for_any_number_of_workers(tmp_path):
    inputs = _corpus(tmp_path / "corpus")
    prepared = {}
    for workers in (1, 2, 3):
        manifest = prepare(inputs, tmp_path / f"w{workers}", workers=workers, **SETTINGS)
        assert manifest["source"]["chunks"] > 6, "several chunks per worker"
        prepared[workers] = _files(tmp_path / f"w{workers}")
    assert prepared[1] == prepared[2] == prepared[3]
    assert 0 < manifest["validation"]["sequences"] < manifest["train"]["sequences"]
    assert manifest["source"]["documents"] == 1100
    paths = sorted(str(p) for p in (tmp_path / "corpus").iterdir())
    chunks = plan_chunks(
        [Source.of(p) for p in paths], [os.path.getsize(p) for p in paths], SETTINGS["chunk_bytes"]
    )
    pieces = [os.path.basename(s.path) for c in chunks for s in c.sources]
    assert all(pieces.count(name) > 3 for name in ("a.txt", "d.jsonl", "e.csv", "f.tsv")), (
        "record files cut too"
    )


def test_static_labels_are_the_same_for_any_number_of_workers(tmp_path):
    inputs = _corpus(tmp_path / "corpus")
    one = prepare(inputs, tmp_path / "w1", workers=1, labels="static", **SETTINGS)
    two = prepare(inputs, tmp_path / "w2", workers=2, labels="static", **SETTINGS)
    assert one["train"] == two["train"]
    assert _files(tmp_path / "w1") == _files(tmp_path / "w2")


_KILL_AFTER_CHUNKS = """
import os, signal, sys
import kroberta.text.workers as workers
from kroberta.text.build import prepare
real, done = workers.prepare_chunk, []
def prepare_chunk(*args, **kwargs):
    result = real(*args, **kwargs)
    done.append(result)
    if len(done) == int(sys.argv[3]):
        os.kill(os.getpid(), signal.SIGKILL)  # as kill -9 would
    return result
workers.prepare_chunk = prepare_chunk
prepare([sys.argv[1]], sys.argv[2], workers=1, **eval(sys.argv[4]))
"""


def test_a_killed_prepare_resumes_to_the_same_output(tmp_path):
    inputs = _corpus(tmp_path / "corpus")
    whole = prepare(inputs, tmp_path / "whole", workers=2, **SETTINGS)
    out = tmp_path / "stopped"
    killed = subprocess.run(
        [sys.executable, "-c", _KILL_AFTER_CHUNKS, inputs[0], str(out), "4", repr(SETTINGS)],
        env={**os.environ, "PYTHONPATH": REPO},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -9, killed.stderr
    assert os.listdir(out) == [".prepare"]
    finished = sorted(
        n for n in os.listdir(out / ".prepare") if n.startswith("chunk-") and n.endswith(".json")
    )
    assert len(finished) == 4
    with pytest.raises(
        InputError, match="unfinished prepare of other inputs or arguments.*--overwrite"
    ):
        prepare(inputs, out, workers=2, **{**SETTINGS, "seq_len": 32})
    resumed = prepare(inputs, out, workers=2, **SETTINGS)
    assert resumed["train"] == whole["train"] and _files(out) == _files(tmp_path / "whole")
    assert not (out / ".prepare").exists()


def test_overwrite_starts_a_stopped_prepare_over(tmp_path, monkeypatch):
    inputs = _corpus(tmp_path / "corpus")
    out = tmp_path / "o"
    calls = []

    def interrupted(*args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return encode_examples(*args)

    monkeypatch.setattr("kroberta.text.workers.encode_examples", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare(inputs, out, workers=1, **SETTINGS)
    monkeypatch.undo()
    done_before = {
        n for n in os.listdir(out / ".prepare") if n.endswith(".json") and n.startswith("chunk-")
    }
    assert len(done_before) == 2
    seen = []
    monkeypatch.setattr(
        "kroberta.text.workers.encode_examples", lambda *a: seen.append(1) or encode_examples(*a)
    )
    fresh = prepare(inputs, out, workers=1, overwrite=True, **SETTINGS)
    assert len(seen) >= fresh["source"]["chunks"], "every chunk made again"


@pytest.mark.fast
def test_the_tokenizer_sample_is_deterministic_bounded_and_spread(tmp_path):
    inputs = _corpus(tmp_path / "corpus")
    paths = sorted(str(p) for p in (tmp_path / "corpus").iterdir())
    sources = [Source.of(p) for p in paths]
    sizes = [os.path.getsize(p) for p in paths]
    chunks = plan_chunks(sources, sizes, 3000)
    total, budget = sum(sizes), 10_000
    taken = [0]
    first = list(sample_documents(chunks, total, budget, taken=taken))
    assert first == list(sample_documents(chunks, total, budget))
    longest = max(len(d.encode()) + 1 for d in first)
    assert budget / 2 < taken[0] <= budget + len(chunks) * longest
    assert sum(len(d.encode()) + 1 for d in first) == taken[0]
    everything = [d for c in chunks for d in iter_documents(c.sources)]
    assert set(first) <= set(everything) and len(first) < len(everything) / 2
    from_files = {
        s.path for c in chunks for s in c.sources for d in iter_documents([s]) if d in set(first)
    }
    assert from_files == set(paths), "every file gives some"
    whole = [0]
    assert (
        list(sample_documents(chunks, total, total, taken=whole)) == everything
        and whole[0] == total
    )
    manifest = prepare(inputs, tmp_path / "o", workers=1, **SETTINGS)
    assert 10_000 < manifest["source"]["tokenizer_sample_bytes"] < 30_000 < total


@pytest.mark.fast
def test_tfrecord_files_are_tensorflow_s_bytes(tmp_path):
    import tensorflow as tf

    rng = np.random.default_rng(0)
    ids = rng.integers(0, 70000, (50, 40))
    records = encode_examples(ids, np.ones_like(ids), np.where(ids % 3 == 0, ids, -100)) + [
        b"",
        b"x" * 300,
    ]
    with tf.io.TFRecordWriter(str(tmp_path / "tf.tfrecord")) as writer:
        for record in records:
            writer.write(record)
    mine = RecordFileWriter(tmp_path / "mine.tfrecord")
    mine.write_many(records[:20])
    mine.write_many(records[20:])
    mine.close()
    assert (tmp_path / "mine.tfrecord").read_bytes() == (tmp_path / "tf.tfrecord").read_bytes()
    assert read_records(tmp_path / "mine.tfrecord") == records
    # tf.data checks each record's CRCs as it reads: TensorFlow takes the file as its own.
    read = tf.data.TFRecordDataset(str(tmp_path / "mine.tfrecord")).as_numpy_iterator()
    assert list(read) == records


_PEAK_MEMORY = """
import json, resource, sys
from kroberta.text.build import prepare
if __name__ == "__main__":
    manifest = prepare([sys.argv[1]], sys.argv[2], workers=2, vocab_size=2000, progress=False,
                       chunk_bytes=int(sys.argv[3]), tokenizer_sample_bytes=int(sys.argv[3]))
    # This process's own peak (VmHWM: ru_maxrss would count the test process it was forked from).
    main = [int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")][0]
    print(json.dumps({"chunks": manifest["source"]["chunks"], "main": main,
                      "workers": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


@pytest.mark.slow
def test_a_worker_s_memory_stays_flat(tmp_path):
    """A corpus of 20 chunks: each process's peak resident memory under 400 MB."""
    chunk = 1 << 20
    corpus = tmp_path / "c.txt"
    with open(corpus, "w", encoding="utf-8") as f:
        for seed in itertools.count():
            f.write("\n\n".join(make_docs(600, seed=seed, max_words=60)) + "\n\n")
            if f.tell() > 21 * chunk:
                break
    script = tmp_path / "peak.py"
    script.write_text(_PEAK_MEMORY)
    done = subprocess.run(
        [sys.executable, str(script), str(corpus), str(tmp_path / "o"), str(chunk)],
        env={**os.environ, "PYTHONPATH": REPO},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    peak = json.loads(done.stdout.strip().splitlines()[-1])
    assert peak["chunks"] >= 20
    # In KiB; RUSAGE_CHILDREN: the largest of the workers.
    assert peak["workers"] < 400 * 1024 and peak["main"] < 400 * 1024, peak


def test_small_files_share_a_chunk_and_its_one_padded_sequence(tmp_path):
    root = tmp_path / "many"
    root.mkdir()
    for i in range(40):
        write_corpus(root / f"{i:03d}.txt", make_docs(4, seed=100 + i))
    paths = sorted(str(p) for p in root.iterdir())
    sizes = [os.path.getsize(p) for p in paths]
    chunks = plan_chunks([Source.of(p) for p in paths], sizes, 3000)
    assert [s.path for c in chunks for s in c.sources] == paths
    assert len(chunks) < len(paths) / 3 and all(c.size >= 3000 for c in chunks[:-1])
    manifest = prepare([str(root)], tmp_path / "o", workers=2, **SETTINGS)
    from tests.text.test_prepare import read_split

    padded = sum(
        int((read_split(tmp_path / "o", split)[1] == 0).any(axis=1).sum())
        for split in ("train", "validation")
    )
    assert manifest["source"]["chunks"] == len(chunks) and padded <= len(chunks)


@pytest.mark.fast
def test_a_chunk_result_is_saved_in_its_json_format_and_read_back_equal(tmp_path):
    work = WorkDir.of(tmp_path)
    os.makedirs(work.path)
    result = ChunkResult(
        3,
        SplitCount(5, 300),
        SplitCount(1, 64),
        7,
        {"a.txt": 40},
        {"a.txt": [30, 2]},
        {"train": 60, "validation": 64},
    )
    work.save_result(result)
    # The format a stopped prepare left before: its .prepare/ resumes.
    assert (tmp_path / ".prepare" / "chunk-000003.json").read_text() == (
        '{"index": 3, "train": {"sequences": 5, "tokens": 300}, "validation": {"sequences": 1, "tokens": 64}, '
        '"documents": 7, "lines": {"a.txt": 40}, "long_documents": {"a.txt": [30, 2]}, '
        '"last_tokens": {"train": 60, "validation": 64}}'
    )
    assert work.load_result(3) == result
    assert work.finished([Chunk(3, (), ())]) == {}, "its parts are missing: not finished"
    for split in ("train", "validation"):
        open(work.part_path(3, split), "wb").close()
    assert work.finished([Chunk(3, (), ())]) == {3: result}
    assert work.load_result(4) is None
    # A damaged result, or an older version's (other fields): not finished, redone.
    for text in ('{"index": 3', '{"index": 3, "chunk_tokens": 1}'):
        (tmp_path / ".prepare" / "chunk-000003.json").write_text(text)
        assert work.load_result(3) is None and work.finished([Chunk(3, (), ())]) == {}
    (tmp_path / ".prepare" / "plan.json").write_text('{"chunks": [[0, [], []]]}')
    assert work.load_plan() is None  # an older plan: prepared afresh
