"""Validate TFRecords of any origin against the kroberta record format.

Records are parsed in batches with `tf.io.parse_example` and `RaggedFeature`s (so a
wrong length is visible rather than a parse error) and checked with numpy against
every rule of `kroberta.data.rules` (the pipeline's and the layout rules). Only
when a batch fails to parse (wrong dtype, not an Example) is it re-examined record
by record in Python, to name the bad one.
"""

import dataclasses
import os

import numpy as np

from kroberta.data import rules
from kroberta.data.records import FEATURES, REQUIRED_FEATURES
from kroberta.storage import isfile
from kroberta.tokens import PAD_ID


@dataclasses.dataclass(frozen=True)
class Defect:
    """One problem, worded as training words a bad record:
    `FILE: record N: feature 'F' value V: problem`."""

    path: str
    index: int | None  # record index in the file; None for file-level problems
    feature: str | None
    value: object
    problem: str

    def __str__(self):
        where = self.path if self.index is None else f"{self.path}: record {self.index}"
        if self.feature is None:
            return f"{where}: {self.problem}"
        if self.value is None:  # a missing feature or one of the wrong dtype
            return f"{where}: feature '{self.feature}' {self.problem}"
        return f"{where}: feature '{self.feature}' value {self.value}: {self.problem}"


@dataclasses.dataclass
class FileReport:
    """Counts for one file and its first defects."""

    path: str
    records: int = 0
    defective_records: int = 0
    labelled_records: int = 0
    problems: int = 0  # every defect, file-level ones included; `defects` keeps the first few
    defects: list = dataclasses.field(default_factory=list)

    @property
    def ok(self):
        return self.problems == 0


@dataclasses.dataclass
class CheckReport:
    """The result of `check_records`; `ok` is True only when no defect was found."""

    files: list
    vocabulary_size: int | None
    sequence_length: int | None
    notes: list = dataclasses.field(default_factory=list)

    @property
    def ok(self):
        return all(f.ok for f in self.files)

    @property
    def defects(self):
        return [d for f in self.files for d in f.defects]

    @property
    def records(self):
        return sum(f.records for f in self.files)

    def summary(self):
        """Human-readable lines: one per file, its first defect, then a verdict."""
        lines = list(self.notes)
        for f in self.files:
            status = (
                "ok"
                if f.ok
                else f"{f.problems} problem(s), {f.defective_records} defective record(s)"
            )
            lines.append(
                f"{f.path}: {f.records} records, {f.labelled_records} with labels, {status}"
            )
            if f.defects:
                lines.append(f"  first: {f.defects[0]}")
        bad = sum(not f.ok for f in self.files)
        verdict = "clean" if self.ok else f"DEFECTS in {bad} of {len(self.files)} file(s)"
        lines.append(
            f"{verdict}: {self.records} records in {len(self.files)} file(s), "
            f"sequence_length={self.sequence_length}, vocabulary_size={self.vocabulary_size}"
        )
        return "\n".join(lines)


class _FileChecker:
    """Checks one file's records batch by batch; shares L (sequence length) across files."""

    def __init__(self, report, state, max_errors):
        self.report = report
        self.state = state  # {"L": ..., "V": ..., "pad": ..., "errors": ...}
        self.max_errors = max_errors
        self.found = []  # the defects not yet kept

    def defect(self, index, feature, value, problem):
        self.report.problems += 1
        if index is not None:
            self.report.defective_records += 1
        self.found.append(Defect(self.report.path, index, feature, value, problem))

    def keep_found(self):
        """Keeps the first defects in file order (file-level ones last): a batch's
        unparseable records are found before its others, so the first one reported is
        the first in the file."""
        for found in sorted(self.found, key=lambda d: float("inf") if d.index is None else d.index):
            if self.state["errors"] < self.max_errors:
                self.report.defects.append(found)
            self.state["errors"] += 1
        self.found = []

    def check_batch(self, serialized, start):
        """Check a list of serialized records whose first index in the file is `start`."""
        # start-up: TensorFlow loads when records are read, after the arguments' checks
        import tensorflow as tf

        from kroberta.data.batch_parsing import parse_spec

        spec = parse_spec(with_labels=True)
        try:
            parsed = tf.io.parse_example(tf.constant(serialized), spec)
        except (tf.errors.OpError, UnicodeDecodeError):
            # UnicodeDecodeError: TF's own error message quotes the bad bytes and
            # then fails to decode them.
            good = self._examine_one_by_one(serialized, start)
            if not good:
                return
            parsed = tf.io.parse_example(tf.constant([serialized[i] for i in good]), spec)
            rows = np.asarray(good)
        else:
            rows = np.arange(len(serialized))
        self._check_parsed(parsed, start + rows)

    def _examine_one_by_one(self, serialized, start):
        """Name records that do not parse as kroberta Examples; return the indices of the rest."""
        # start-up: TensorFlow (bad_records) loads when records are read
        from kroberta.data.bad_records import payload_problem

        good = []
        for i, record in enumerate(serialized):
            # The pipeline's own judgement (protobuf, feature kinds, then TF's parser).
            problem = payload_problem(record, with_labels=True)
            if problem is None:
                good.append(i)
            elif problem.startswith("feature '"):
                feature = problem.split("'")[1]
                self.defect(start + i, feature, None, problem[len(f"feature '{feature}' ") :])
            else:
                self.defect(start + i, None, None, problem)
        return good

    def _check_parsed(self, parsed, indices):
        """Numpy checks over one parsed batch; `indices` are the records' file indices."""
        n = len(indices)
        # (lengths (n,), values) per feature; a missing feature has no values.
        columns = {
            name: (parsed[name].row_lengths().numpy(), parsed[name].flat_values.numpy())
            for name in FEATURES
        }
        lengths_ids = columns["input_ids"][0]
        if self.state["L"] is None and np.any(lengths_ids > 0):
            self.state["L"] = int(lengths_ids[lengths_ids > 0][0])
        L = self.state["L"]
        bad = np.zeros(n, dtype=bool)  # one defect per record: the first found

        def flag(mask, feature, values, problem):
            for r in np.flatnonzero(mask & ~bad):
                value = values[r] if values is not None else None
                self.defect(
                    int(indices[r]), feature, value, problem(r) if callable(problem) else problem
                )
            bad[:] |= mask

        for name in FEATURES:
            length = columns[name][0]
            if name in REQUIRED_FEATURES:
                flag(length == 0, name, None, "missing feature (or empty list)")
            if L is not None:  # 0 values: missing (flagged above), or no labels (optional)
                flag(
                    (length != 0) & (length != L),
                    name,
                    None,
                    lambda r, length=length: "".join(map(str, rules.wrong_length(length[r], L))),
                )
        good = np.flatnonzero(~bad)
        if not len(good) or L is None:
            return
        dense = {}
        for name in FEATURES:
            length, values = columns[name]
            starts = np.concatenate([[0], np.cumsum(length)[:-1]])
            has = length[good] == L
            take = starts[good[has]][:, None] + np.arange(L)
            dense[name] = (good[has], values[take])  # (rows, (rows, L))
        self.report.labelled_records += len(dense["labels"][0])
        self._check_values(dense, indices, flag)

    def _check_values(self, dense, indices, flag):
        """The record rules (`rules.RECORD_RULES`, in order) over the dense (rows, L)
        features of the records whose lengths are right."""
        n = len(indices)
        V, pad = self.state["V"], self.state["pad"]

        def flag_rows(rows, matrix_bad, matrix, feature, problem):
            """Flags the records `rows` of a (rows, K) defect matrix with their first bad
            value of `matrix`; `problem(position)` words it."""
            hit, first, where = np.zeros(n, bool), np.zeros(n, np.int64), np.zeros(n, np.int64)
            pos = matrix_bad.argmax(axis=1)
            hit[rows] = matrix_bad.any(axis=1)
            first[rows] = matrix[np.arange(len(rows)), pos]
            where[rows] = pos
            flag(hit, feature, first, lambda r: problem(where[r]))

        rows, ids = dense["input_ids"]
        _, mask = dense["attention_mask"]
        for rule in rules.RECORD_RULES:
            if isinstance(rule, rules.LayoutRule):
                matrix_bad, matrix = rule.where(ids, mask, pad)
                flag_rows(
                    rows, matrix_bad, matrix, rule.feature, lambda p, rule=rule: rule.found(p, pad)
                )
                continue
            feature_rows, values = dense[rule.feature]
            if len(feature_rows):  # labels are optional
                flag_rows(
                    feature_rows,
                    rule.bad(values, V),
                    values,
                    rule.feature,
                    lambda p, rule=rule: rule.found(p, rule.upper_bound(V)),
                )


def _read_batches(path, batch_size, max_records):
    """Yield (start_index, [serialized]) and, at a corrupt record, (index, DataLossError)."""
    # start-up: TensorFlow loads when records are read
    import tensorflow as tf

    dataset = tf.data.TFRecordDataset(path)
    if max_records is not None:
        dataset = dataset.take(max_records)
    start = 0
    try:
        for batch in dataset.batch(batch_size):
            records = list(batch.numpy())
            yield start, records
            start += len(records)
    except tf.errors.DataLossError:
        # The failing batch is lost: re-read its records one by one to keep the
        # good ones and find the exact index of the bad one.
        records, error = [], None
        try:
            for record in tf.data.TFRecordDataset(path).skip(start).take(batch_size):
                records.append(record.numpy())
        except tf.errors.DataLossError as e:
            error = e
        if records:
            yield start, records
        yield (
            start + len(records),
            error or tf.errors.DataLossError(None, None, "corrupt record"),
        )


def check_records(
    paths,
    vocabulary_size=None,
    sequence_length=None,
    max_errors=20,
    max_records=None,
    pad_id=PAD_ID,
    batch_size=1024,
):
    """Validate TFRecord files of `tf.train.Example`s in the kroberta format.

    Args:
        paths: a file path or a list of them.
        vocabulary_size: ids must lie in [0, vocabulary_size); None skips that check.
        sequence_length: every feature's length; None takes the first record's.
        max_errors: how many defects to keep (all are counted).
        max_records: check only the first records of each file (None: all).
        pad_id: the id required where attention_mask is 0.
        batch_size: records parsed per `tf.io.parse_example` call.

    Returns:
        A `CheckReport`: per-file record counts, defective-record counts and the
        first defects, each printable as `FILE: record N: feature 'F' value V: problem`.
    """
    # start-up: TensorFlow loads when records are read
    import tensorflow as tf

    from kroberta.data.bad_records import describe_read_error

    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    report = CheckReport(files=[], vocabulary_size=vocabulary_size, sequence_length=sequence_length)
    if vocabulary_size is None:
        report.notes.append(
            "note: no vocabulary size given: ids not checked against it (pass --vocab-size)"
        )
    state = {"L": sequence_length, "V": vocabulary_size, "pad": pad_id, "errors": 0}
    for path in paths:
        path = os.fspath(path)
        file_report = FileReport(path)
        report.files.append(file_report)
        checker = _FileChecker(file_report, state, max_errors)
        if not isfile(path):
            checker.defect(None, None, None, "file does not exist")
        else:
            try:
                for start, item in _read_batches(path, batch_size, max_records):
                    if isinstance(item, tf.errors.OpError):
                        checker.defect(
                            start,
                            None,
                            None,
                            f"corrupt or truncated record ({describe_read_error(item)})",
                        )
                        break
                    file_report.records += len(item)
                    checker.check_batch(item, start)
            except tf.errors.OpError as e:
                checker.defect(None, None, None, f"cannot read: {describe_read_error(e)}")
            else:
                if file_report.records == 0 and file_report.ok:
                    checker.defect(None, None, None, "empty file (no records)")
        checker.keep_found()
    report.sequence_length = state["L"]
    if sequence_length is None and state["L"] is not None:
        report.notes.append(f"note: sequence length taken from the first record: {state['L']}")
    return report
