"""prepare --line-by-line: one padded sequence per line (per record), as run_mlm.py's --line_by_line."""

import json

import numpy as np

from kroberta.cli.prepare import main
from kroberta.text.build import prepare
from kroberta.text.packing import one_per_document
from kroberta.tokens import BOS_ID, EOS_ID, PAD_ID
from tests.text.test_prepare import read_split, tokenizer_path  # noqa: F401 (a fixture)


def test_one_per_document_cuts_and_pads():
    rows = list(one_per_document([[7, 8], [], list(range(10, 20))], 6))
    assert len(rows) == 2, "the empty document gives no sequence"
    (short, short_mask), (long, long_mask) = rows
    assert short.tolist() == [BOS_ID, 7, 8, EOS_ID, PAD_ID, PAD_ID] and short_mask.tolist() == [
        1,
        1,
        1,
        1,
        0,
        0,
    ]
    assert long.tolist() == [BOS_ID, 10, 11, 12, 13, EOS_ID] and long_mask.tolist() == [1] * 6


def test_a_text_file_gives_one_sequence_per_non_empty_line(tmp_path, tokenizer_path):  # noqa: F811
    lines = ["the cat sat", "on a mat while dogs ran far away " * 4, "über café"]
    corpus = tmp_path / "c.txt"
    corpus.write_text(f"{lines[0]}\n\n   \n{lines[1]}\n{lines[2]}\n", encoding="utf-8")
    manifest = prepare(
        str(corpus),
        tmp_path / "o",
        seq_len=16,
        tokenizer=tokenizer_path,
        validation_fraction=0,
        progress=False,
        line_by_line=True,
    )
    ids, mask, _ = read_split(tmp_path / "o", "train")
    assert manifest["line_by_line"] is True and manifest["train"]["sequences"] == 3
    assert (ids[:, 0] == BOS_ID).all()
    lengths = mask.sum(axis=1)
    assert lengths[1] == 16 and ids[1, -1] == EOS_ID, "the long line is cut, closed with </s>"
    assert lengths[0] < 16 and lengths[2] < 16
    assert ids[0, lengths[0] - 1] == EOS_ID and (ids[0, lengths[0] :] == PAD_ID).all()


def test_a_record_stays_one_sequence(tmp_path, tokenizer_path):  # noqa: F811
    path = tmp_path / "c.jsonl"
    records = ["the cat\nsat on a mat", "dogs ran", ""]
    path.write_text("".join(json.dumps({"text": r}) + "\n" for r in records), encoding="utf-8")
    prepare(
        str(path),
        tmp_path / "o",
        seq_len=32,
        tokenizer=tokenizer_path,
        validation_fraction=0,
        progress=False,
        line_by_line=True,
    )
    ids, mask, _ = read_split(tmp_path / "o", "train")
    assert len(ids) == 2, "the multi-line record is one sequence, the empty one none"
    assert (ids == EOS_ID).sum() == 2


def test_packing_and_line_by_line_hold_the_same_tokens(tmp_path, tokenizer_path):  # noqa: F811
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat\non a mat\n\ndogs ran far away\n", encoding="utf-8")
    prepared = {}
    for flag in (False, True):
        out = tmp_path / f"o-{flag}"
        prepare(
            str(corpus),
            out,
            seq_len=64,
            tokenizer=tokenizer_path,
            validation_fraction=0,
            progress=False,
            line_by_line=flag,
        )
        ids, mask, _ = read_split(out, "train")
        prepared[flag] = [int(i) for i in ids[mask == 1] if i not in (BOS_ID, EOS_ID)]
    # The tokens of each line, the same in both layouts: "\n" is a token of its own between lines.
    newline = set(prepared[False]) - set(prepared[True])
    assert len(newline) == 1
    assert [i for i in prepared[False] if i not in newline] == prepared[True]


def test_the_cli_flag(tmp_path, tokenizer_path):  # noqa: F811
    corpus = tmp_path / "c.txt"
    corpus.write_text("one line\nanother line\n", encoding="utf-8")
    assert (
        main(
            [
                "--input",
                str(corpus),
                "--out",
                str(tmp_path / "o"),
                "--tokenizer",
                tokenizer_path,
                "--seq-len",
                "16",
                "--validation-fraction",
                "0",
                "--line-by-line",
                "--no-progress",
            ]
        )
        == 0
    )
    ids, _, _ = read_split(tmp_path / "o", "train")
    assert len(ids) == 2
    np.testing.assert_array_equal(ids[:, 0], [BOS_ID, BOS_ID])
