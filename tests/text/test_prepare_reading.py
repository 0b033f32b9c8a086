"""What prepare says about what it read, and its argument errors before any framework loads."""

import logging
import os
import subprocess
import sys
import warnings

import pytest

from kroberta.text.build import PrepareWarning, prepare
from kroberta.text.textfiles import LONG_DOCUMENT_LINES, ReadCounts, Source, iter_documents
from tests.text.test_prepare import REPO, make_docs, tokenizer_path, write_corpus  # noqa: F401 (a fixture)


@pytest.mark.fast
def test_counts_documents_and_lines(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("a b\nc d\n\n\ne f\n", encoding="utf-8")
    counts = ReadCounts()
    assert list(iter_documents([Source.of(path)], counts=counts)) == ["a b\nc d", "e f"]
    assert counts.documents == 2 and counts.long_documents == {}
    by_line = ReadCounts()
    assert (
        len(list(iter_documents([Source.of(path)], line_by_line=True, counts=by_line)))
        == by_line.documents
        == 3
    )


def test_prepare_logs_the_documents_it_read(tmp_path, tokenizer_path, caplog):  # noqa: F811
    corpus = write_corpus(tmp_path / "c.txt", make_docs(37))
    with caplog.at_level(logging.INFO, logger="kroberta"):
        prepare(corpus, tmp_path / "o", seq_len=16, tokenizer=tokenizer_path, progress=False)
    assert "read 37 document(s) from 1 file(s)" in caplog.text


def test_a_file_of_one_document_per_line_is_warned_of(tmp_path, tokenizer_path):  # noqa: F811
    lines = LONG_DOCUMENT_LINES + 5
    corpus = tmp_path / "lines.txt"
    corpus.write_text(
        "intro\n\n" + "".join(f"description {i} of a thing\n" for i in range(lines)),
        encoding="utf-8",
    )
    with pytest.warns(
        PrepareWarning,
        match=rf"lines.txt: one document of {lines} lines from line 3: .*--line-by-line",
    ):
        prepare(str(corpus), tmp_path / "o", seq_len=16, tokenizer=tokenizer_path, progress=False)
    # The same lines, --line-by-line: as many sequences as lines, no warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrepareWarning)
        m = prepare(
            str(corpus),
            tmp_path / "l",
            seq_len=16,
            tokenizer=tokenizer_path,
            progress=False,
            line_by_line=True,
            validation_fraction=0,
        )
    assert m["train"]["sequences"] == lines + 1


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--input", "{tmp}/missing.txt", "--out", "{tmp}/o"], "no files match"),
        (
            ["--input", "{tmp}/c.txt", "--out", "{tmp}/o", "--tokenizer", "{tmp}/none.json"],
            "tokenizer not found",
        ),
        (
            ["--input", "{tmp}/c.txt", "--out", "{tmp}/o", "--seq-len", "4"],
            "--seq-len 4 is too short",
        ),
        (["--input", "{tmp}/c.jsonl", "--out", "{tmp}/o", "--text-field", "body"], "body"),
        (["--check", "{tmp}/missing"], "no files match"),
    ],
)
def test_argument_errors_come_before_jax_tensorflow_and_keras(tmp_path, arguments, message):
    (tmp_path / "c.txt").write_text("some text\n", encoding="utf-8")
    (tmp_path / "c.jsonl").write_text('{"text": "some text"}\n', encoding="utf-8")
    arguments = [a.format(tmp=tmp_path) for a in arguments]
    probe = (
        "import sys\nfrom kroberta.cli.prepare import main\ncode = main(sys.argv[1:])\n"
        "print(code, [m for m in ('jax', 'tensorflow', 'keras') if m in sys.modules])"
    )
    env = {**os.environ, "PYTHONPATH": REPO}
    done = subprocess.run(
        [sys.executable, "-c", probe, *arguments],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.stdout.split("\n")[0] == "2 []", done.stdout + done.stderr
    assert message in done.stderr
