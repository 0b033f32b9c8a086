"""prepare: text -> tokenizer -> packed TFRecords + manifest. Tiny corpora, property checks."""

import json
import os
import random
import subprocess
import sys
import warnings

import numpy as np
import pytest
import tensorflow as tf

from kroberta.cli.prepare import main
from kroberta.data.manifest import load_manifest
from kroberta.data.records import encode_examples
from kroberta.data.tfrecord_files import RecordFileWriter
from kroberta.errors import InputError
from kroberta.masking import static_labels
from kroberta.text.build import PrepareWarning, prepare
from kroberta.text.packing import pack_documents
from kroberta.text.tokenizer import load_tokenizer, special_token_ids, train_tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORDS = "the cat sat on a mat while dogs ran far away über naïve café 日本 résumé <s> </s> <mask>".split()


def make_docs(n, seed=0, max_words=40):
    """Deterministic documents; some span lines, some hold special-token text literally."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        lines = [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, max_words)))
            for _ in range(rng.randint(1, 3))
        ]
        docs.append("\n".join(lines))
    return docs


def write_corpus(path, docs):
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n\n".join(docs) + "\n")
    return str(path)


def read_split(directory, split):
    """(ids, mask, labels|None) arrays of one split, files in manifest order."""
    data = json.load(open(os.path.join(directory, "manifest.json")))
    L = data["sequence_length"]
    spec = {k: tf.io.FixedLenFeature([L], tf.int64) for k in ("input_ids", "attention_mask")}
    if data["labels"]:
        spec["labels"] = tf.io.FixedLenFeature([L], tf.int64)
    out = {k: [] for k in spec}
    for name in data[split]["files"]:
        for rec in tf.data.TFRecordDataset(os.path.join(directory, name)):
            for k, v in tf.io.parse_single_example(rec, spec).items():
                out[k].append(v.numpy())
    arrays = {k: np.array(v).reshape(-1, L) for k, v in out.items()}
    return arrays["input_ids"], arrays["attention_mask"], arrays.get("labels")


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train_tokenizer(iter(make_docs(300, seed=1)), 400, out_path=path)
    return str(path)


def test_tokenizer_special_ids_and_mask_lstrip(tokenizer_path):
    tok = load_tokenizer(tokenizer_path)
    assert special_token_ids(tok) == {"bos": 0, "pad": 1, "eos": 2, "unk": 3, "mask": 4}
    enc = tok.encode("the <mask> sat")
    assert enc.ids[0] == 0 and enc.ids[-1] == 2 and 4 in enc.ids
    after = enc.tokens[enc.ids.index(4) + 1]
    assert after.startswith("Ġ"), "the space before <mask> is stripped, the next word keeps its own"
    assert tok.decode(tok.encode("café über 日本").ids) == "café über 日本"


def test_tokenizer_without_specials_is_a_clear_error(tmp_path):
    from tokenizers import Tokenizer, models

    path = tmp_path / "plain.json"
    Tokenizer(models.BPE()).save(str(path))
    with pytest.raises(InputError, match=r"plain\.json.*<s>"):
        load_tokenizer(path)


def test_encode_examples_parse_like_tf_train_example():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 70000, (5, 16))
    mask = np.ones((5, 16), dtype=np.int64)
    labels = np.where(rng.random((5, 16)) < 0.3, ids, -100)
    spec = {
        k: tf.io.FixedLenFeature([16], tf.int64) for k in ("input_ids", "attention_mask", "labels")
    }
    parsed = tf.io.parse_example(encode_examples(ids, mask, labels), spec)
    for k, v in (("input_ids", ids), ("attention_mask", mask), ("labels", labels)):
        np.testing.assert_array_equal(parsed[k].numpy(), v)
    ref = tf.train.Example(
        features=tf.train.Features(
            feature={
                k: tf.train.Feature(int64_list=tf.train.Int64List(value=v[0].tolist()))
                for k, v in (("input_ids", ids), ("attention_mask", mask))
            }  # fmt: skip
        )
    )
    assert tf.train.Example.FromString(encode_examples(ids[:1], mask[:1])[0]) == ref


def check_packed(ids, mask):
    """Every sequence: <s> first, real part ends with </s>, padding (id 1) a suffix, only in the last."""
    assert (ids[:, 0] == 0).all()
    real = mask.sum(axis=1)
    assert (ids[np.arange(len(ids)), real - 1] == 2).all()
    assert (np.diff(mask, axis=1) <= 0).all()
    assert (ids[mask == 0] == 1).all()
    assert (real[:-1] == ids.shape[1]).all()


def test_packing_fills_sequences_and_splits_long_documents():
    rng = np.random.default_rng(0)
    docs = [list(rng.integers(5, 400, rng.integers(1, 200))) for _ in range(2000)]
    docs[7] = list(rng.integers(5, 400, 1000))  # longer than many sequences: split, not an error
    rows = list(pack_documents(docs, 64))
    ids, mask = np.stack([r for r, _ in rows]), np.stack([m for _, m in rows])
    check_packed(ids, mask)
    assert (mask == 0).sum() / mask.size < 0.01
    content = ids[(mask == 1) & (ids > 4)]
    np.testing.assert_array_equal(content, np.concatenate(docs))


def test_round_trip_reproduces_the_text(tmp_path, tokenizer_path):
    docs = make_docs(60, seed=2)
    corpus = write_corpus(tmp_path / "c.txt", docs)
    prepare(
        corpus,
        tmp_path / "out",
        seq_len=16,
        validation_fraction=0,
        shards=1,
        tokenizer=tokenizer_path,
        progress=False,
    )
    ids, mask, _ = read_split(tmp_path / "out", "train")
    check_packed(ids, mask)
    tok = load_tokenizer(tmp_path / "out" / "tokenizer.json")
    stream = ids[(mask == 1) & (ids > 4)]  # real, non-special tokens in order
    # Literal "<s>" in the text was encoded as text, so dropping special ids loses nothing.
    assert tok.decode(stream.tolist(), skip_special_tokens=False) == "".join(docs)
    assert (ids == 2).sum() >= len(docs)  # every document is closed by </s>


def test_manifest_matches_shards(tmp_path, tokenizer_path):
    corpus = write_corpus(tmp_path / "c.txt", make_docs(200, seed=3))
    m = prepare(corpus, tmp_path / "out", seq_len=16, validation_fraction=0.2, shards=3, tokenizer=tokenizer_path,
                progress=False)  # fmt: skip
    man = load_manifest(tmp_path / "out")
    assert len(man.train_files) == 3 and all(
        os.path.isabs(f) and os.path.isfile(f) for f in man.files
    )
    assert [os.path.basename(f) for f in man.train_files] == [
        f"train-0000{i}-of-00003.tfrecord" for i in range(3)
    ]
    for split in ("train", "validation"):
        ids, mask, _ = read_split(tmp_path / "out", split)
        assert len(ids) == m[split]["sequences"] > 0
        assert mask.sum() == m[split]["tokens"]
    assert man.vocabulary_size == load_tokenizer(tokenizer_path).get_vocab_size()
    assert man.sequence_length == 16 and man.special_tokens["mask"] == 4
    assert man.tokenizer_path == os.path.join(man.dir, "tokenizer.json")
    assert 0.1 < man.validation_sequences / (man.validation_sequences + man.train_sequences) < 0.3
    assert not [f for f in os.listdir(tmp_path / "out") if ".tmp" in f]


def test_manifest_errors_name_the_problem(tmp_path, tokenizer_path):
    with pytest.raises(InputError, match="no manifest.json"):
        load_manifest(tmp_path)
    prepare(write_corpus(tmp_path / "c.txt", make_docs(20)), tmp_path / "o", seq_len=16, tokenizer=tokenizer_path,
            progress=False)  # fmt: skip
    path = tmp_path / "o" / "manifest.json"
    data = json.loads(path.read_text())
    os.remove(tmp_path / "o" / data["train"]["files"][0])
    with pytest.raises(InputError, match="train.files lists train-00000-of-00001.tfrecord"):
        load_manifest(tmp_path / "o")
    del data["sequence_length"]
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="'sequence_length'"):
        load_manifest(tmp_path / "o")
    path.write_text("{not json")
    with pytest.raises(InputError, match="malformed JSON"):
        load_manifest(tmp_path / "o")


def test_static_labels_format(tmp_path, tokenizer_path):
    corpus = write_corpus(tmp_path / "c.txt", make_docs(100, seed=4))
    kw = dict(seq_len=32, validation_fraction=0, shards=1, tokenizer=tokenizer_path, progress=False)
    prepare(corpus, tmp_path / "plain", **kw)
    m = prepare(corpus, tmp_path / "lab", labels="static", seed=7, **kw)
    assert m["labels"] == "static"
    orig, mask, _ = read_split(tmp_path / "plain", "train")
    ids, mask2, labels = read_split(tmp_path / "lab", "train")
    np.testing.assert_array_equal(mask, mask2)
    chosen = labels != -100
    np.testing.assert_array_equal(labels[chosen], orig[chosen])  # exactly -100 or the original id
    assert not chosen[(orig <= 4) | (mask == 0)].any()  # specials and padding never labelled
    np.testing.assert_array_equal(ids[~chosen], orig[~chosen])  # only chosen positions change
    assert (ids[chosen] == 4).mean() > 0.5
    candidates = ((orig > 4) & (mask == 1)).sum(1).astype(np.float32)  # each row's: exactly
    expected = np.where(candidates > 0, np.maximum(np.round(np.float32(0.15) * candidates), 1), 0)
    np.testing.assert_array_equal(chosen.sum(1), expected)  # round(rate x candidates), at least 1
    prepare(corpus, tmp_path / "again", labels="static", seed=7, **kw)
    np.testing.assert_array_equal(
        read_split(tmp_path / "again", "train")[2], labels
    )  # deterministic by seed


def test_static_mask_rates():
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 1000, (400, 256))
    ids[:, 0], ids[:, -1] = 0, 2
    mask = np.ones_like(ids)
    corrupted, labels = static_labels(
        ids,
        mask,
        1,
        np.arange(400),
        mask_rate=0.15,
        mask_token_id=4,
        special_token_ids={0, 1, 2, 3, 4},
        vocabulary_size=1000,
    )
    chosen = labels != -100
    real = ids > 4
    assert (chosen.sum(1) == round(0.15 * 254)).all()  # exactly round(rate x candidates) per row
    assert not chosen[~real].any()
    assert abs((corrupted[chosen] == 4).mean() - 0.8) < 0.02
    kept = (corrupted[chosen] == ids[chosen]).mean()
    assert 0.09 < kept < 0.12  # 10% kept, plus random draws that hit the same id
    assert (corrupted[chosen] > 4).mean() > 0.18  # random ids are never specials


def test_corner_cases(tmp_path, tokenizer_path):
    good = write_corpus(tmp_path / "good.txt", make_docs(30))
    with pytest.raises(InputError, match=r"--input .*nothing\*\.txt: no files match it"):
        prepare(str(tmp_path / "nothing*.txt"), tmp_path / "o", progress=False)
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.txt").write_text("\n  \n\n")
    with pytest.raises(InputError, match="no text"):
        prepare(
            [str(tmp_path / "empty.txt"), str(tmp_path / "blank.txt")],
            tmp_path / "o",
            progress=False,
        )
    # An empty record file too, before a tokenizer is trained on nothing (no vocabulary warning).
    (tmp_path / "empty.jsonl").write_text("")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InputError, match=r"no text in the inputs: 1 file\(s\)"):
            prepare(str(tmp_path / "empty.jsonl"), tmp_path / "o", progress=False)
    with pytest.raises(InputError, match="seq-len 4 is too short"):
        prepare(good, tmp_path / "o", seq_len=4, progress=False)
    with pytest.raises(InputError, match="at least 261"):
        prepare(good, tmp_path / "o", vocab_size=100, progress=False)
    # Python's wrong types name the argument (they were Python's own TypeErrors).
    with pytest.raises(
        InputError,
        match=r"--vocab-size \(prepare's vocab_size\) must be an "
        r"integer, got '500'",
    ):
        prepare(good, tmp_path / "o", vocab_size="500", progress=False)
    with pytest.raises(
        ValueError, match="inputs: expected a path or pattern, or a list of them, got int"
    ):
        prepare(5, tmp_path / "o", progress=False)

    (tmp_path / "bin.txt").write_bytes(b"abc\x00\x01\x02")
    (tmp_path / "latin1.txt").write_bytes("caf\u00e9 ok\n".encode("latin-1"))
    inputs = [good, str(tmp_path / "bin.txt"), str(tmp_path / "latin1.txt")]
    with pytest.warns(PrepareWarning) as caught:
        m = prepare(inputs, tmp_path / "o", seq_len=16, tokenizer=tokenizer_path, progress=False)
    assert [str(w.message).split(":")[1] for w in caught] == [
        " binary (NUL byte) at byte 3",
        " not UTF-8 at byte 3",
    ]
    skipped = {os.path.basename(s["path"]): s for s in m["source"]["skipped_files"]}
    assert skipped["bin.txt"]["offset"] == 3 and skipped["latin1.txt"] == {
        "path": str(tmp_path / "latin1.txt"), "problem": "not UTF-8", "offset": 3}  # fmt: skip
    with pytest.raises(InputError, match=r"latin1\.txt: not UTF-8 at byte 3 \(--strict\)"):
        prepare([good, str(tmp_path / "latin1.txt")], tmp_path / "s", strict=True, progress=False)

    with pytest.raises(InputError, match="already holds a prepared dataset.*--overwrite"):
        prepare(good, tmp_path / "o", seq_len=16, tokenizer=tokenizer_path, progress=False)
    with pytest.raises(
        InputError, match=r"--out .*bin.txt: exists and is a file; give a directory"
    ):
        prepare(good, tmp_path / "bin.txt", seq_len=16, tokenizer=tokenizer_path, progress=False)
    m = prepare(
        good, tmp_path / "o", seq_len=16, tokenizer=tokenizer_path, progress=False, overwrite=True
    )
    assert m["source"]["skipped_files"] == []


def test_vocabulary_larger_than_the_data_is_recorded(tmp_path):
    corpus = write_corpus(tmp_path / "c.txt", make_docs(20, seed=5))
    with pytest.warns(
        PrepareWarning, match=r"supports only \d+ tokens \(requested vocab_size=5000\).*must equal"
    ):
        m = prepare(corpus, tmp_path / "o", vocab_size=5000, seq_len=16, progress=False)
    assert 261 <= m["vocabulary_size"] < 5000 and m["requested_vocabulary_size"] == 5000
    assert (
        load_tokenizer(tmp_path / "o" / "tokenizer.json").get_vocab_size() == m["vocabulary_size"]
    )
    assert load_manifest(tmp_path / "o").vocabulary_size == m["vocabulary_size"]
    assert "must equal" in m["source"]["vocabulary_note"]


def test_record_file_writer_is_atomic(tmp_path):
    path = tmp_path / "x.tfrecord"
    with pytest.raises(RuntimeError):
        with RecordFileWriter(path) as w:
            w.write_many(encode_examples([0, 5, 2], [1, 1, 1]))
            raise RuntimeError("interrupted")
    assert os.listdir(tmp_path) == []
    with RecordFileWriter(path) as w:
        w.write_many(encode_examples([0, 5, 2], [1, 1, 1]))
    assert os.listdir(tmp_path) == ["x.tfrecord"]


def _interrupt_on_second_block(monkeypatch):
    calls = []

    def failing(*args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return encode_examples(*args)

    monkeypatch.setattr("kroberta.text.workers.BLOCK", 16)
    monkeypatch.setattr("kroberta.text.workers.encode_examples", failing)


def test_interrupted_prepare_keeps_only_its_work_directory(tmp_path, tokenizer_path, monkeypatch):
    corpus = write_corpus(tmp_path / "c.txt", make_docs(400))
    _interrupt_on_second_block(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        prepare(
            corpus,
            tmp_path / "new" / "o",
            seq_len=16,
            tokenizer=tokenizer_path,
            progress=False,
            workers=1,
        )
    assert os.listdir(tmp_path / "new" / "o") == [".prepare"], (
        "what the next run resumes from, nothing else"
    )
    assert not [n for n in os.listdir(tmp_path / "new" / "o" / ".prepare") if n.startswith(".tmp")]


@pytest.mark.parametrize("failure", ["interrupt", "manifest"])
def test_failed_prepare_in_an_existing_directory_removes_only_its_files(
    tmp_path, tokenizer_path, monkeypatch, failure
):
    corpus = write_corpus(tmp_path / "c.txt", make_docs(400))
    out = tmp_path / "o"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    if failure == "interrupt":
        _interrupt_on_second_block(monkeypatch)
    else:  # after the shards and tokenizer.json are in place under their final names

        def no_manifest(*args):
            names = os.listdir(out)
            assert "tokenizer.json" in names and "train-00000-of-00001.tfrecord" in names
            raise OSError("disk full")

        monkeypatch.setattr("kroberta.text.build.write_manifest", no_manifest)
    with pytest.raises((KeyboardInterrupt, OSError)):
        prepare(corpus, out, seq_len=16, tokenizer=tokenizer_path, progress=False, workers=1)
    assert sorted(os.listdir(out)) == [".prepare", "notes.txt"]


@pytest.mark.parametrize("problem", ["tokenizer", "input"])
def test_cli_failure_leaves_no_out_directory(tmp_path, tokenizer_path, capsys, problem):
    corpus = write_corpus(tmp_path / "c.txt", make_docs(20))
    tokenizer = str(tmp_path / "missing") if problem == "tokenizer" else tokenizer_path
    inputs = corpus if problem == "tokenizer" else str(tmp_path / "none*.txt")
    assert (
        main(
            [
                "--input",
                inputs,
                "--out",
                str(tmp_path / "o"),
                "--tokenizer",
                tokenizer,
                "--no-progress",
            ]
        )
        == 2
    )
    assert (
        "tokenizer not found" if problem == "tokenizer" else "none*.txt"
    ) in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_cli_exit_codes(tmp_path, tokenizer_path, capsys):
    corpus = write_corpus(tmp_path / "c.txt", make_docs(40))
    out = str(tmp_path / "o")
    args = [
        "--input",
        corpus,
        "--out",
        out,
        "--seq-len",
        "16",
        "--tokenizer",
        tokenizer_path,
        "--no-progress",
    ]
    assert main(args) == 0
    assert main(["--check", out]) == 0
    assert "clean" in capsys.readouterr().out
    assert main(args) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["--input", str(tmp_path / "none*.txt"), "--out", out]) == 2
    capsys.readouterr()
    assert main(["--check", str(tmp_path / "none*.tfrecord")]) == 2
    assert capsys.readouterr().err == (
        f"error: --check {tmp_path / 'none*.tfrecord'}: no files match it; give a prepared "
        "directory, a directory of TFRecord files, a file or a glob\n"
    )
    assert (
        main(["--check", str(tmp_path)]) == 2
    )  # a directory without manifest.json needs --vocab-size
    with pytest.raises(SystemExit) as e:
        main(["--labels", "dynamic"])
    assert e.value.code == 2


def test_cli_in_a_subprocess(tmp_path, tokenizer_path):
    """The real entry point: one-line error and exit code 2, never a traceback."""
    run = subprocess.run(
        [sys.executable, "-m", "kroberta.prepare", "--input", str(tmp_path / "missing*.txt"), "--out", str(tmp_path / "o")],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2
    assert "Traceback" not in run.stderr
    assert run.stderr.endswith(
        f"error: --input {tmp_path / 'missing*.txt'}: no files match it; give a file, a folder "
        "or a glob (quoted, so that the shell passes it whole)\n"
    )


def test_stdlib_docstrings_reads_source_without_importing(tmp_path):
    from kroberta.text.corpus import stdlib_docstrings, write_stdlib_corpus

    root = tmp_path / "lib"
    for sub in ("pkg", "test", "tests", "idlelib", "site-packages"):
        (root / sub).mkdir(parents=True)
        (root / sub / "m.py").write_text(f'"""Doc of {sub}."""\nraise SystemExit("imported!")\n')
    (root / "a.py").write_text(
        '"""Module a.\n\nSecond paragraph."""\ndef f():\n    """Function f."""\n'
    )
    (root / "broken.py").write_text('"""Never read."""\ndef (:\n')
    docs = list(stdlib_docstrings(str(root)))
    assert docs == ["Module a.\n\nSecond paragraph.", "Function f.", "Doc of pkg."]
    stats = write_stdlib_corpus(tmp_path / "c.txt", root=str(root))
    assert stats["documents"] == 3
    # One document per docstring: blank lines inside a docstring are dropped.
    assert (
        tmp_path / "c.txt"
    ).read_text() == "Module a.\nSecond paragraph.\n\nFunction f.\n\nDoc of pkg.\n\n"


def test_a_small_validation_split_is_named_with_the_fraction_that_holds_about_100(
    tmp_path, tokenizer_path
):
    corpus = write_corpus(tmp_path / "c.txt", make_docs(400))
    with pytest.warns(PrepareWarning) as caught:
        m = prepare(corpus, tmp_path / "o", seq_len=16, tokenizer=tokenizer_path, progress=False)
    held_out = m["validation"]["sequences"]
    total = held_out + m["train"]["sequences"]
    fraction = min(0.5, np.ceil(100 * 100 / total) / 100)
    assert [str(w.message) for w in caught] == [
        f"the validation split holds {held_out} of {total} sequences (--validation-fraction "
        f"0.01): its loss is noisy; --validation-fraction {fraction} holds about "
        f"{round(fraction * total)}"
    ]
    # The fraction it names holds at least 100 sequences: no warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = prepare(
            corpus,
            tmp_path / "p",
            seq_len=16,
            tokenizer=tokenizer_path,
            progress=False,
            validation_fraction=fraction,
        )
    assert m["validation"]["sequences"] >= 90
