"""Input text files: glob expansion, a validity scan, and streaming documents.

A file is a stream of documents separated by blank lines (lines holding only
whitespace); lines inside a document are joined with "\\n". Files are read line by
line, never whole, so memory stays flat however large the corpus is.
"""

import codecs
import glob
import os

_SCAN_BLOCK = 1 << 20


class InputError(ValueError):
    """The inputs cannot be used (no match, unreadable, not UTF-8 text in strict mode)."""


def expand_inputs(inputs):
    """Expand glob patterns (and directories) into a sorted, de-duplicated file list.

    Args:
        inputs: a pattern/path or a list of them; `**` recurses; a directory
            stands for every file under it.

    Returns:
        A list of file paths. Raises `InputError` naming any pattern that matches
        no file.
    """
    patterns = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    if not patterns:
        raise InputError("no input given (pass --input 'corpus/*.txt')")
    files = []
    for pattern in patterns:
        pattern = os.fspath(pattern)
        matches = sorted(glob.glob(pattern, recursive=True))
        found = []
        for match in matches:
            if os.path.isdir(match):
                for dirpath, dirnames, filenames in os.walk(match):
                    dirnames.sort()
                    found.extend(os.path.join(dirpath, f) for f in sorted(filenames))
            elif os.path.isfile(match):
                found.append(match)
        if not found:
            raise InputError(f"no files match {pattern!r}")
        files.extend(found)
    unique, seen = [], set()
    for f in files:  # a file matched by two patterns is read once
        key = os.path.abspath(f)
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


def scan_file(path):
    """Check that a file is UTF-8 text, reading it in 1 MB blocks.

    Args:
        path: the file.

    Returns:
        (size_in_bytes, problem, byte_offset, has_text): problem is None for a good
        file, else "binary (NUL byte)" or "not UTF-8" with the offset of the first
        bad byte; has_text is False for an empty or whitespace-only file.
    """
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, has_text = 0, False
    with open(path, "rb") as f:
        while block := f.read(_SCAN_BLOCK):
            nul = block.find(b"\x00")
            if nul >= 0:
                return os.path.getsize(path), "binary (NUL byte)", offset + nul, False
            # e.start counts from the bytes the decoder still holds (a character
            # split across blocks, < 4 bytes) followed by this block.
            pending = len(decoder.getstate()[0])
            try:
                decoder.decode(block)
            except UnicodeDecodeError as e:
                return os.path.getsize(path), "not UTF-8", offset - pending + e.start, False
            has_text = has_text or bool(block.strip(b" \t\r\n\v\f\xef\xbb\xbf"))
            offset += len(block)
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            return offset, "not UTF-8 (truncated character at the end)", offset - len(decoder.getstate()[0]), False
    return offset, None, None, has_text


def iter_documents(paths, on_bytes=None):
    """Yield documents (str) from UTF-8 files, streaming line by line.

    Args:
        paths: files already accepted by `scan_file`.
        on_bytes: optional callback, called with the number of bytes read (in
            chunks of about 1 MB) for progress display.

    Yields:
        Each non-empty document: its lines joined with "\\n", line endings
        normalized (\\r\\n -> \\n), no trailing newline.
    """
    pending_bytes = 0
    for path in paths:
        lines = []
        with open(path, "rb") as f:
            for number, raw in enumerate(f):
                pending_bytes += len(raw)
                if pending_bytes >= _SCAN_BLOCK and on_bytes is not None:
                    on_bytes(pending_bytes)
                    pending_bytes = 0
                if raw.endswith(b"\n"):
                    raw = raw[:-1]
                    if raw.endswith(b"\r"):
                        raw = raw[:-1]
                line = raw.decode("utf-8")
                if number == 0 and line.startswith("\ufeff"):
                    line = line[1:]  # a byte-order mark is not text
                if line.strip():
                    lines.append(line)
                elif lines:
                    yield "\n".join(lines)
                    lines = []
        if lines:
            yield "\n".join(lines)
    if on_bytes is not None and pending_bytes:
        on_bytes(pending_bytes)
