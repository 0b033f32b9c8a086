"""Labelled files: every format, label ids and values, and errors that name file, record, field."""

import json

import numpy as np
import pytest

from kroberta.downstream.tasks import REGRESSION, TaskSpec, check_labelled_file, read_labelled
from kroberta.errors import InputError, KrobertaError

RECORDS = [
    {"text": "a cat", "other": "x", "label": "pos"},
    {"text": "a dog", "other": "y", "label": "neg"},
    {"text": "a cow", "other": "z", "label": "pos"},
]
SPEC = TaskSpec("t")


def _write(tmp_path, name, records=RECORDS):
    path = tmp_path / name
    fields = list(records[0])
    if name.endswith((".tsv", ".csv")):
        sep = "\t" if name.endswith(".tsv") else ","
        path.write_text(
            "\n".join([sep.join(fields)] + [sep.join(str(r[f]) for f in fields) for r in records])
            + "\n"
        )
    elif name.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(records), path)
    elif name.endswith(".json"):
        path.write_text(json.dumps(records))
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


@pytest.mark.parametrize("name", ["d.jsonl", "d.json", "d.tsv", "d.csv", "d.parquet"])
def test_every_format_gives_the_same_texts_and_class_ids(tmp_path, name):
    if name.endswith(".parquet"):
        pytest.importorskip("pyarrow")
    labelled, names = read_labelled(_write(tmp_path, name), SPEC)
    assert labelled.texts == (["a cat", "a dog", "a cow"],)
    assert names == ("neg", "pos")  # sorted
    np.testing.assert_array_equal(labelled.labels, [1, 0, 1])


def test_datasets_directory(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(RECORDS).save_to_disk(str(tmp_path / "ds"))
    labelled, names = read_labelled(str(tmp_path / "ds"), TaskSpec("t", ("text", "other")))
    assert labelled.texts == (["a cat", "a dog", "a cow"], ["x", "y", "z"])
    assert names == ("neg", "pos")


def test_integer_labels_sort_numerically_and_match_their_strings(tmp_path):
    train = _write(tmp_path, "train.jsonl", [{"text": "a", "label": v} for v in (10, 2, 2)])
    labelled, names = read_labelled(train, SPEC)
    assert names == ("2", "10")
    np.testing.assert_array_equal(labelled.labels, [1, 0, 0])
    validation = _write(tmp_path, "v.tsv", [{"text": "b", "label": "10"}])
    assert read_labelled(validation, SPEC, names)[0].labels.tolist() == [1]


def test_a_validation_label_unseen_in_training_names_file_record_and_field(tmp_path):
    path = _write(
        tmp_path, "v.jsonl", [{"text": "a", "label": "pos"}, {"text": "b", "label": "meh"}]
    )
    with pytest.raises(InputError, match=r"v\.jsonl: line 2: field 'label' holds the label 'meh'"):
        read_labelled(path, SPEC, ("neg", "pos"))


def test_regression_labels_are_floats_and_a_non_number_is_named(tmp_path):
    spec = TaskSpec("r", kind=REGRESSION, metric="pearson")
    good = _write(tmp_path, "g.csv", [{"text": "a", "label": "0.5"}, {"text": "b", "label": "4"}])
    labelled, names = read_labelled(good, spec)
    assert names is None and labelled.labels.dtype == np.float32
    np.testing.assert_allclose(labelled.labels, [0.5, 4.0])
    bad = _write(tmp_path, "b.csv", [{"text": "a", "label": "0.5"}, {"text": "b", "label": "high"}])
    with pytest.raises(
        InputError, match=r"b\.csv: line 3: field 'label' holds 'high', not a number"
    ):
        read_labelled(bad, spec)


@pytest.mark.parametrize(
    "record, problem",
    [
        ({"label": "pos"}, "no field 'text'"),
        ({"text": "  ", "label": "pos"}, "the field 'text' is empty; fix or drop the record"),
    ],
)
def test_a_missing_or_empty_text_names_file_record_and_field(tmp_path, record, problem):
    path = _write(tmp_path, "t.jsonl", [RECORDS[0], record])
    with pytest.raises(InputError, match=rf"t\.jsonl: line 2: {problem}"):
        read_labelled(path, SPEC)


def test_a_missing_label_and_a_missing_file_are_named(tmp_path):
    path = _write(tmp_path, "t.jsonl", [RECORDS[0], {"text": "b"}])
    with pytest.raises(
        InputError,
        match=r"t\.jsonl: line 2: no label in field 'label' "
        r"\(fields: text; name it with --label-field\)",
    ):
        read_labelled(path, SPEC)
    path = _write(tmp_path, "e.jsonl", [RECORDS[0], {"text": "b", "label": ""}])
    with pytest.raises(
        InputError,
        match=r"e\.jsonl: line 2: the label \(field 'label'\) is "
        r"empty; fix or drop the record$",
    ):
        read_labelled(path, SPEC)
    with pytest.raises(KrobertaError) as missing:  # checked once, where a path comes in
        check_labelled_file(str(tmp_path / "nope.jsonl"))
    assert "nope.jsonl: no such file" in str(missing.value)


def test_texts_to_predict_need_no_labels(tmp_path):
    path = _write(tmp_path, "p.jsonl", [{"text": "a"}, {"text": "b"}])
    labelled, names = read_labelled(path, SPEC, ("neg", "pos"), require_labels=False)
    assert labelled.texts == (["a", "b"],) and names == ("neg", "pos")


@pytest.mark.parametrize("name", ["d.csv", "d.tsv", "d.parquet"])
def test_a_header_without_a_named_column_names_the_option_that_picks_it(tmp_path, name):
    if name.endswith(".parquet"):
        pytest.importorskip("pyarrow")
    path = _write(tmp_path, name, [{"sentence": "a cat", "target": "pos"}])
    header = "" if name.endswith(".parquet") else "; the first line is read as the header"
    with pytest.raises(
        InputError,
        match=rf"no column 'text' \(columns: sentence, target"
        rf"{header}\); pick one with --text-field",
    ):
        read_labelled(path, SPEC)
    with pytest.raises(
        InputError,
        match=rf"no column 'label' \(columns: sentence, target"
        rf"{header}\); pick one with --label-field",
    ):
        read_labelled(path, TaskSpec("t", ("sentence",)))


@pytest.mark.parametrize(
    ("name", "separator"), [("d.csv", ";"), ("d.csv", "\t"), ("d.tsv", ","), ("d.tsv", ";")]
)
def test_a_file_split_by_another_delimiter_is_named_so(tmp_path, name, separator):
    path = tmp_path / name
    path.write_text(f"text{separator}label\na cat{separator}pos\n")
    with pytest.raises(InputError) as refused:
        read_labelled(str(path), SPEC)
    assert str(refused.value) == (
        f"{path}: no column 'text': the header {'text' + separator + 'label'!r} is one column, "
        f"its fields separated by {separator!r}; a .csv is split at commas and a .tsv at "
        "tabs: write the file with one of those (and its name's suffix)"
    )


def test_an_empty_csv_is_named_empty(tmp_path):
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(InputError, match=r"empty.csv: empty \(no header line, no records\)$"):
        read_labelled(str(tmp_path / "empty.csv"), SPEC)


def test_the_training_classes_are_logged_and_scores_or_single_examples_warned_of(tmp_path, caplog):
    caplog.set_level("INFO", logger="kroberta")
    records = [{"text": "a", "label": ["food", "sport"][i % 2]} for i in range(30)]
    read_labelled(_write(tmp_path, "t.jsonl", records + [{"text": "b", "label": "Food"}]), SPEC)
    assert "t.jsonl: 31 examples of 3 classes: Food (1), food (15), sport (15)" in caplog.text
    assert "t.jsonl: 1 class(es) with a single example (a mistyped label?): 'Food'" in caplog.text
    caplog.clear()
    scores = [{"text": "a", "score": round(0.2 * i, 1)} for i in range(1, 15)] * 2
    _, names = read_labelled(_write(tmp_path, "s.csv", scores), TaskSpec("s", label_field="score"))
    assert (
        len(names) == 14
        and "s.csv: field 'score' holds numbers such as 0.2, 0.4, 0.6, read "
        "as 14 classes; for a score, fine-tune with --kind regression"
        in caplog.text
    )
    # Whole numbers are class ids, not scores: no warning.
    caplog.clear()
    read_labelled(
        _write(tmp_path, "i.jsonl", [{"text": "a", "label": i % 3} for i in range(30)]), SPEC
    )
    assert (
        "WARNING" not in caplog.text and "30 examples of 3 classes: 0 (10), 1 (10)" in caplog.text
    )
    # An unseen validation label lists at most ten of the classes.
    many = tuple(str(i) for i in range(40))
    with pytest.raises(
        InputError,
        match=r"\(labels: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, \.\.\. "
        r"\(40 in all\)\)",
    ):
        read_labelled(_write(tmp_path, "v.jsonl", [{"text": "a", "label": "x"}]), SPEC, many)
