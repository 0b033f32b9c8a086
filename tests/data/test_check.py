"""check_records / `prepare --check`: clean seed-format files pass, each planted defect is caught."""

import pytest

from kroberta.cli.prepare import main
from kroberta.data.check import check_records
from tests.conftest import serialize_example, write_records

# The fast tier (docs/contributing.md): builds no model and starts no process.
pytestmark = pytest.mark.fast

L, V = 8, 50


def example(input_ids=None, attention_mask=None, labels=None, drop=(), floats=()):
    """A seed-format record built with tf.train.Example directly (not our serializer)."""
    features = {
        "input_ids": [0, 7, 8, 9, 2, 1, 1, 1] if input_ids is None else input_ids,
        "attention_mask": [1, 1, 1, 1, 1, 0, 0, 0] if attention_mask is None else attention_mask,
        "labels": [-100, 7, -100, -100, -100, -100, -100, -100] if labels is None else labels,
    }
    return serialize_example({k: None if k in drop else v for k, v in features.items()}, floats)


write = write_records


def clean(n=10):
    return [example() for _ in range(n)]


def test_clean_seed_format_passes(tmp_path):
    path = write(tmp_path / "seed.tfrecord", clean(3000))  # several parse batches
    report = check_records([path], vocabulary_size=V, sequence_length=L)
    assert report.ok, report.summary()
    assert report.records == 3000 and report.files[0].labelled_records == 3000
    no_labels = write(tmp_path / "nolabels.tfrecord", [example(drop=("labels",))] * 5)
    assert check_records(no_labels, vocabulary_size=V).ok


@pytest.mark.parametrize(
    "bad, feature, problem",
    [
        (example(input_ids=[0, 7, 8, 9, 2, 1, 1]), "input_ids", "has 7 values, expected 8"),
        (
            example(input_ids=[0, 7, 8, 99, 2, 1, 1, 1]),
            "input_ids",
            "outside [0, 50) at position 3",
        ),
        (
            example(attention_mask=[1, 1, 2, 1, 1, 0, 0, 0]),
            "attention_mask",
            "not 0/1 at position 2",
        ),
        (
            example(attention_mask=[1, 1, 1, 1, 1, 0, 1, 0]),
            "attention_mask",
            "1 after padding at position 6",
        ),
        (
            example(input_ids=[0, 7, 8, 9, 2, 1, 5, 1]),
            "input_ids",
            "not the pad id 1 where attention_mask is 0",
        ),
        (
            example(labels=[-100, 7, -5, -100, -100, -100, -100, -100]),
            "labels",
            "neither -100 nor an id",
        ),
        (
            example(labels=[-100, 7, 50, -100, -100, -100, -100, -100]),
            "labels",
            "neither -100 nor an id",
        ),
        (example(drop=("attention_mask",)), "attention_mask", "missing feature"),
        (example(floats=("labels",)), "labels", "wrong dtype"),
        (b"not a proto at all \xff\xff", None, "not a tf.train.Example"),
    ],
)
def test_each_planted_defect_is_named(tmp_path, bad, feature, problem):
    path = write(tmp_path / "d.tfrecord", clean(5) + [bad] + clean(4))
    report = check_records([path], vocabulary_size=V, sequence_length=L)
    assert not report.ok
    assert report.files[0].records == 10 and report.files[0].defective_records == 1
    first = str(report.defects[0])
    assert first.startswith(f"{path}: record 5: ") and problem in first
    if feature:
        assert f"feature '{feature}' " in first


def test_truncated_and_empty_and_missing_files(tmp_path):
    good = write(tmp_path / "good.tfrecord", clean(20))
    data = open(good, "rb").read()
    truncated = tmp_path / "trunc.tfrecord"
    truncated.write_bytes(data[: len(data) - 30])  # cut inside the last record
    empty = tmp_path / "empty.tfrecord"
    empty.write_bytes(b"")
    report = check_records(
        [good, str(truncated), str(empty), str(tmp_path / "gone.tfrecord")], V, L
    )
    ok, trunc, emp, gone = report.files
    assert ok.ok and not trunc.ok and not emp.ok and not gone.ok
    assert trunc.records == 19 and str(trunc.defects[0]).startswith(
        f"{truncated}: record 19: corrupt or truncated"
    )
    assert "empty file" in str(emp.defects[0]) and "does not exist" in str(gone.defects[0])


def test_without_vocabulary_ids_are_not_range_checked(tmp_path):
    path = write(tmp_path / "x.tfrecord", [example(input_ids=[0, 7, 8, 999, 2, 1, 1, 1])])
    report = check_records(path)
    assert report.ok and report.sequence_length == L
    assert any("ids not checked" in note for note in report.notes)


def test_lengths_must_agree_across_files_and_max_records(tmp_path):
    a = write(tmp_path / "a.tfrecord", clean(3))
    b = write(
        tmp_path / "b.tfrecord", [example(input_ids=[0, 5, 2, 1], attention_mask=[1, 1, 1, 0])] * 2
    )
    assert not check_records([a, b]).files[1].ok
    c = write(tmp_path / "c.tfrecord", clean(3) + [example(input_ids=[0, 7, 8, 99, 2, 1, 1, 1])])
    assert check_records(c, V, L, max_records=3).ok


def test_check_cli_exit_codes(tmp_path, capsys):
    good = write(tmp_path / "good.tfrecord", clean(4))
    write(tmp_path / "bad.tfrecord", clean(2) + [example(input_ids=[0, 7, 8, 99, 2, 1, 1, 1])])
    assert main(["--check", good, "--vocab-size", str(V), "--seq-len", str(L)]) == 0
    assert main(["--check", str(tmp_path / "*.tfrecord"), "--vocab-size", str(V)]) == 1
    out = capsys.readouterr().out
    assert f"{tmp_path / 'bad.tfrecord'}: record 2: feature 'input_ids' value 99: " in out
    assert main(["--check", good, "--out", str(tmp_path)]) == 2


def test_a_corrupt_record_is_described_without_tensorflow_op_names(tmp_path):
    good = write(tmp_path / "good.tfrecord", clean(20))
    data = bytearray(open(good, "rb").read())
    data[len(data) // 2] ^= 0xFF  # inside a record: its checksum fails
    flipped = tmp_path / "flipped.tfrecord"
    flipped.write_bytes(bytes(data))
    (report,) = check_records([str(flipped)], V, L).files
    message = str(report.defects[0])
    assert "corrupt or truncated record (bad checksum or length at byte" in message
    for internal in ("function_node", "Op:", "IteratorGetNext"):
        assert internal not in message
