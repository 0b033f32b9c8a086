"""Prepare's inputs: glob expansion, a validity scan, and streaming documents.

A text file (`.txt` or any name no other format claims; gzipped when it ends in
`.gz`) is a stream of documents separated by blank lines (lines holding only
whitespace); lines inside a document are joined with "\\n". Record files (JSON
lines, CSV/TSV, Parquet, `datasets` directories: `kroberta.text.recordfiles`) hold one
document per record, normalised the same way (so the same documents give the same
tokens in either form). Everything is read streaming, never whole, so memory stays
flat however large the corpus is.
"""

import codecs
import dataclasses
import os
import zlib

from kroberta import storage
from kroberta.errors import InputError, StorageError
from kroberta.text import locations, recordfiles
from kroberta.text.progress import ByteProgress

_SCAN_BLOCK = 1 << 20


@dataclasses.dataclass(frozen=True)
class Source:
    """One input: a file (or a `datasets` directory) and how to read documents from it.

    `format` is None for text, else a `recordfiles` format; `text_field` names the
    records' text column; `split` the DatasetDict split to read. A text, JSON lines or
    CSV/TSV file that is not gzipped may be read from byte `start` to byte `end` (None:
    its end), boundaries at record starts (`kroberta.text.chunks`).
    """

    path: str
    format: str | None = None
    text_field: str = "text"
    split: str = "train"
    start: int = 0
    end: int | None = None

    @classmethod
    def of(cls, path, text_field="text", split="train"):
        return cls(os.fspath(path), recordfiles.record_format(os.fspath(path)), text_field, split)


def expand_inputs(inputs):
    """The files of `inputs` (a pattern/path or a list of them; `**` recurses), sorted
    and each once: a directory stands for every file under it, except that a directory
    written by `datasets`' `save_to_disk` is one input of its own. InputError naming a
    pattern that matches no file."""
    patterns = [inputs] if isinstance(inputs, (str, os.PathLike)) else inputs
    if not isinstance(patterns, (list, tuple)) or not all(
        isinstance(p, (str, os.PathLike)) for p in patterns
    ):
        raise InputError(
            f"inputs: expected a path or pattern, or a list of them, got {type(inputs).__name__}"
        )
    if not patterns:
        raise InputError("no input given (pass --input 'corpus/*.txt')")
    files = []
    for pattern in patterns:
        pattern = os.fspath(pattern)
        found = []
        try:
            matches = storage.glob(pattern, recursive=True)
        except StorageError as error:
            raise InputError(f"--input {pattern}: {error}") from None
        for match in matches:
            # A URL (gs://...): every file under a directory, since `datasets` directories
            # (read by `datasets.load_from_disk`) are local only.
            if storage.is_url(match):
                found.extend(storage.files_under(match) if storage.isdir(match) else [match])
            elif recordfiles.is_dataset_dir(match):
                found.append(match)  # a `datasets` directory is one input
            elif os.path.isdir(match):
                for dirpath, dirnames, filenames in os.walk(match):
                    dirnames.sort()
                    datasets_dirs = [
                        d for d in dirnames if recordfiles.is_dataset_dir(os.path.join(dirpath, d))
                    ]
                    found.extend(os.path.join(dirpath, d) for d in datasets_dirs)
                    dirnames[:] = [d for d in dirnames if d not in datasets_dirs]
                    found.extend(os.path.join(dirpath, f) for f in sorted(filenames))
            elif os.path.isfile(match):
                found.append(match)
        if not found:
            raise InputError(
                f"--input {pattern}: no files match it; give a file, a folder or a glob "
                "(quoted, so that the shell passes it whole)"
            )
        files.extend(found)
    unique = {}
    for f in files:  # a file matched by two patterns is read once
        unique.setdefault(storage.absolute(f), f)
    return list(unique.values())


def scan_file(path):
    """(size in bytes, problem, byte offset, has text) of a file, read in 1 MB blocks:
    problem is None for UTF-8 text, else "binary (NUL byte)" or "not UTF-8" with the
    offset of the first bad byte; has text is False for an empty or whitespace-only file.
    A .gz file's size is its compressed size, which progress counts."""
    raw, stream = locations.open_stream(path)
    with raw, stream:
        try:
            found = _scan_stream(stream)
        except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
            if stream is raw:
                raise
            return locations.size(path), f"not a readable gzip file ({e})", None, False
    return found if stream is raw else (locations.size(path), *found[1:])


def _scan_stream(f):
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, has_text = 0, False
    while block := f.read(_SCAN_BLOCK):
        nul = block.find(b"\x00")
        if nul >= 0:
            return offset + len(block), "binary (NUL byte)", offset + nul, False
        # e.start counts from the bytes the decoder still holds (a character
        # split across blocks, < 4 bytes) followed by this block.
        pending = len(decoder.getstate()[0])
        try:
            decoder.decode(block)
        except UnicodeDecodeError as e:
            return offset + len(block), "not UTF-8", offset - pending + e.start, False
        has_text = has_text or bool(block.strip(b" \t\r\n\v\f\xef\xbb\xbf"))
        offset += len(block)
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return (
            offset,
            "not UTF-8 (truncated character at the end)",
            offset - len(decoder.getstate()[0]),
            False,
        )
    return offset, None, None, has_text


LONG_DOCUMENT_LINES = 1000  # lines without a blank one, above which a text file is told of


@dataclasses.dataclass
class ReadCounts:
    """What `iter_documents` read: documents yielded, lines per text file (path ->
    lines), and per text file (path -> (lines, first line number, counted from the
    `Source`'s start)) its longest document when that ran over `LONG_DOCUMENT_LINES`."""

    documents: int = 0
    lines: dict = dataclasses.field(default_factory=dict)
    long_documents: dict = dataclasses.field(default_factory=dict)


def iter_documents(sources, on_bytes=None, line_by_line=False, counts=None):
    """Each non-empty document (str) of the `Source`s, streaming: text files accepted by
    `scan_file`, record files checked by `recordfiles.check_source`. A document's lines
    are joined with "\\n", whitespace-only lines dropped (`\\r\\n` -> `\\n`, no trailing
    newline); a record is one document, a text file's end at blank lines (or lines,
    with `line_by_line`). `on_bytes(n)` hears the bytes read, about 1 MB at a time,
    adding up to the sizes `scan_file` / `check_source` returned; `counts` (a
    `ReadCounts`), when given, hears what was read."""
    counts = ReadCounts() if counts is None else counts
    for source in sources:
        if source.format is None:
            for document, first_line in _text_documents(source, on_bytes, counts):
                lines = document.count("\n") + 1
                if (
                    lines > LONG_DOCUMENT_LINES
                    and not line_by_line
                    and lines > counts.long_documents.get(source.path, (0,))[0]
                ):
                    counts.long_documents[source.path] = (lines, first_line)
                if line_by_line:
                    counts.documents += lines
                    yield from document.split("\n")
                else:
                    counts.documents += 1
                    yield document
            continue
        for value in recordfiles.iter_values(
            source.path,
            source.format,
            source.text_field,
            source.split,
            on_bytes,
            source.start,
            source.end,
        ):
            if value and (document := record_document(value)):
                counts.documents += 1
                yield document


def record_document(text: str) -> str:
    """A record's text as the document a text file holding it would give (line by
    line: "\\r\\n" -> "\\n", whitespace-only lines dropped); "" when it has no text."""
    lines = (line[:-1] if line.endswith("\r") else line for line in text.split("\n"))
    return "\n".join(line for line in lines if line.strip())


def _text_documents(source, on_bytes, counts):
    """(document, its first line's number from 1) of a text file's byte range."""
    lines, first, number = [], 0, -1
    path = source.path
    end = locations.size(path) if source.end is None else source.end
    raw, stream = locations.open_range(path, source.start, source.end)
    progress = ByteProgress(raw, on_bytes, source.start)
    with raw, stream:
        for number, line_bytes in enumerate(stream):
            progress.poll()
            if line_bytes.endswith(b"\n"):
                line_bytes = line_bytes[:-1]
                if line_bytes.endswith(b"\r"):
                    line_bytes = line_bytes[:-1]
            line = line_bytes.decode("utf-8")
            if number == 0 and source.start == 0 and line.startswith("\ufeff"):
                line = line[1:]  # a byte-order mark is not text
            if line.strip():
                first = first if lines else number + 1
                lines.append(line)
            elif lines:
                yield "\n".join(lines), first
                lines = []
        progress.finish(end)
    counts.lines[path] = counts.lines.get(path, 0) + number + 1
    if lines:
        yield "\n".join(lines), first
