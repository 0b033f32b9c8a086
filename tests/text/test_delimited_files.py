"""TSV and CSV as their conventions read them: a TSV split at tabs with no quote processing
(as GLUE's processors read it), a CSV with RFC 4180 quoting, and a warning with both counts
when a CSV's records are fewer than its data lines."""

import gzip
import logging

import pytest

from kroberta.downstream.tasks import TaskSpec, read_labelled
from kroberta.errors import InputError
from kroberta.text import recordfiles

pytestmark = pytest.mark.fast

# The third sentence opens a quote it never closes: with CSV quoting it swallows the rows
# after it, and the merged text takes a later row's label.
ROWS = [
    ("a plain sentence", "a"),
    ("another one", "b"),
    ('"an unmatched quote', "c"),
    ("row four", "d"),
    ('row "five" quotes a word', "e"),
    ("row six", "f"),
]


def _tsv(path, rows=ROWS, header=("sentence", "label"), opener=open):
    with opener(path, "wt", encoding="utf-8") as f:
        f.write("\t".join(header) + "\n" + "".join(f"{text}\t{label}\n" for text, label in rows))
    return str(path)


@pytest.mark.parametrize("name", ["d.tsv", "d.tsv.gz"])
def test_a_tsv_with_an_unmatched_quote_keeps_every_row_and_its_label(tmp_path, name, caplog):
    caplog.set_level(logging.WARNING, logger="kroberta")
    path = _tsv(tmp_path / name, opener=gzip.open if name.endswith(".gz") else open)
    labelled, names = read_labelled(path, TaskSpec("t", ("sentence",)))
    assert labelled.texts == ([text for text, _ in ROWS],)  # the quotes are kept as text
    assert [names[i] for i in labelled.labels] == [label for _, label in ROWS]
    assert "data line" not in caplog.text  # as many records as lines: nothing to say


def test_prepare_reads_a_tsv_s_quotes_as_text(tmp_path):
    path = _tsv(tmp_path / "corpus.tsv")
    texts = list(recordfiles.iter_values(path, "tsv", "sentence", "train"))
    assert texts == [text for text, _ in ROWS]


def test_a_csv_keeps_rfc_4180_quoting_and_warns_of_a_field_spanning_lines(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="kroberta")
    path = tmp_path / "d.csv"
    path.write_text('text,label\nplain,a\n"with, a comma",b\n"two\nlines",c\n"say ""hi""",d\n')
    labelled, names = read_labelled(str(path), TaskSpec("t"))
    assert labelled.texts == (["plain", "with, a comma", "two\nlines", 'say "hi"'],)
    assert [names[i] for i in labelled.labels] == ["a", "b", "c", "d"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"warning: {path}: read 4 record(s) from 5 data line(s): a quoted field "
        "spans lines (the first from line 4); if its opening quote is a stray one, "
        "the rows up to the next quote were merged into one record"
    ]


def test_a_stray_quote_in_a_csv_is_told_by_the_counts(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="kroberta")
    path = tmp_path / "d.csv"
    path.write_text("text,label\n" + "".join(f"{text},{label}\n" for text, label in ROWS))
    labelled, names = read_labelled(str(path), TaskSpec("t"))
    # Rows 3 to 5 merged up to the next quote, under row 5's label: what the warning is for.
    assert [names[i] for i in labelled.labels] == ["a", "b", "e", "f"]
    assert "read 4 record(s) from 6 data line(s)" in caplog.text
    assert "(the first from line 4)" in caplog.text


def test_blank_lines_and_a_headerless_file_count_as_their_data_lines(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="kroberta")
    path = tmp_path / "d.csv"
    path.write_text("text,label\r\n\r\none,a\r\n\r\ntwo,b\r\n")
    assert len(read_labelled(str(path), TaskSpec("t"))[0]) == 2
    headerless = tmp_path / "h.tsv"
    headerless.write_text("x\ta\t\tone\ny\tb\t\ttwo\n")
    spec = TaskSpec("t", ("sentence",), columns=("source", "label", "notes", "sentence"))
    assert read_labelled(str(headerless), spec)[0].texts == (["one", "two"],)
    assert "data line" not in caplog.text


def test_a_tsv_record_cannot_span_lines_and_the_error_says_why(tmp_path):
    path = tmp_path / "corpus.tsv"
    path.write_text('id\ttext\n0\t"two\nlines"\n')  # what csv.writer(delimiter="\t") writes
    with pytest.raises(
        InputError,
        match=(
            rf"^{path}: line 3: 1 column\(s\), the header has 2: no field 'text'; a TSV is read "
            r"as GLUE's processors read it, split at tabs with no quoting, so a record cannot span "
            r"lines: write such texts with their line breaks to a \.csv \(RFC 4180 quoting\) or a "
            r"\.jsonl$"
        ),
    ):
        list(recordfiles.iter_values(str(path), "tsv", "text", "train"))
    # A label left out (texts to predict) is no error; a short row of a CSV keeps its message.
    path.write_text("text\tlabel\none\n")
    assert read_labelled(str(path), TaskSpec("t"), require_labels=False)[0].texts == (["one"],)
