"""TFRecord files written, read back and joined without TensorFlow: the project's one writer.

Every TFRecord file kroberta writes (prepare's shards, synthetic data) goes through
`RecordFileWriter`, not `tf.io.TFRecordWriter`: importing TensorFlow costs a process
about 0.9 GB of resident memory and seconds of start-up, and prepare's worker
processes only need the file framing, which is simple: per record

    uint64 length (little-endian) | uint32 masked crc32c(length) | data | uint32 masked crc32c(data)

The CRC-32C is computed with numpy over a whole batch of records at once (one table
step per byte position, across all records), so it costs little next to tokenizing.
Tests check the bytes against `tf.io.TFRecordWriter`'s, and read them with `tf.data`.
"""

import os
import shutil
import struct

import numpy as np

from kroberta.atomic import temporary_name
from kroberta.errors import InputError

_POLYNOMIAL = 0x82F63B78  # CRC-32C (Castagnoli), reflected
COPY_BLOCK = 1 << 24  # bytes per copy call when parts are joined


def _table():
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(_POLYNOMIAL), table >> 1).astype(
            np.uint32
        )
    return table


_TABLE = _table()


def crc32c(items: list[bytes]) -> np.ndarray:
    """(n,) uint32: the CRC-32C of each of the n byte strings."""
    n = len(items)
    lengths = np.fromiter((len(b) for b in items), dtype=np.int64, count=n)
    width = int(lengths.max()) if n else 0
    # (n, width) bytes, each row its string then zeros; `live` says which are real.
    flat = np.frombuffer(b"".join(items), dtype=np.uint8)
    live = np.arange(width)[None, :] < lengths[:, None]
    padded = np.zeros((n, width), dtype=np.uint8)
    padded[live] = flat
    crc = np.full(n, 0xFFFFFFFF, dtype=np.uint32)
    for j in range(width):
        step = _TABLE[(crc ^ padded[:, j]) & 0xFF] ^ (crc >> np.uint32(8))
        crc = np.where(live[:, j], step, crc)
    return crc ^ np.uint32(0xFFFFFFFF)


def _masked(crc: np.ndarray) -> np.ndarray:
    """TFRecord's masked CRC: rotated right by 15 bits plus a constant (mod 2**32)."""
    crc = crc.astype(np.uint64)
    rotated = ((crc >> np.uint64(15)) | (crc << np.uint64(17))) & np.uint64(0xFFFFFFFF)
    return ((rotated + np.uint64(0xA282EAD8)) & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def frame(records: list[bytes]) -> bytes:
    """The records framed as a TFRecord file holds them, one after another."""
    if not records:
        return b""
    heads = [struct.pack("<Q", len(r)) for r in records]
    head_crcs = _masked(crc32c(heads)).tolist()
    data_crcs = _masked(crc32c(records)).tolist()
    parts = []
    for head, head_crc, record, data_crc in zip(heads, head_crcs, records, data_crcs):
        parts += [head, struct.pack("<I", head_crc), record, struct.pack("<I", data_crc)]
    return b"".join(parts)


class RecordFileWriter:
    """A TFRecord file written under a temporary name, renamed on `close()`: a killed
    process never leaves a partial file under the final name. As a context manager it
    closes on success and aborts on an error."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self.tmp_path = temporary_name(self.path)
        self.records = 0
        self._file = open(self.tmp_path, "wb")

    def write_many(self, records: list[bytes]):
        """Append serialized records."""
        self._file.write(frame(records))
        self.records += len(records)

    def close(self):
        self._file.close()
        os.replace(self.tmp_path, self.path)

    def abort(self):
        """Discard everything written; no file is left under either name (also where
        closing fails: a full disk fails the flush of the last bytes)."""
        try:
            self._file.close()
        finally:
            if os.path.exists(self.tmp_path):
                os.remove(self.tmp_path)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close() if exc_type is None else self.abort()
        return False


def frames(path):
    """Yields the byte offset of each record of a local TFRecord file, walking its
    framing (headers only). TensorFlow silently stops at a file cut inside a record
    header: a file cut inside a record is an `InputError` naming the record here."""
    size = os.path.getsize(path)
    position = count = 0
    with open(path, "rb") as f:
        while position < size:
            header = f.read(8)
            if len(header) < 8 or size - position < 16:
                raise InputError(
                    f"{path}: record {count}: truncated (the file ends inside a record "
                    f"header at byte {size})"
                )
            (length,) = struct.unpack("<Q", header)
            end = position + 8 + 4 + length + 4
            if end > size:
                # A first "record" longer than the file: most likely not a TFRecord at all.
                hint = (
                    "; is it a TFRecord file? Text goes through python -m kroberta.prepare first"
                    if count == 0
                    else ""
                )
                raise InputError(
                    f"{path}: record {count}: truncated (the record needs {length} "
                    f"bytes; the file ends at byte {size}){hint}"
                )
            yield position
            f.seek(end)
            position, count = end, count + 1


def record_offsets(path) -> list[int]:
    """The byte offset of each record of a TFRecord file, then the file's size."""
    return [*frames(path), os.path.getsize(path)]


def read_records(path) -> list[bytes]:
    """Every record's data of a (small) TFRecord file, CRCs not checked."""
    with open(path, "rb") as f:
        data = f.read()
    offsets = record_offsets(path)
    # A frame: length (8 bytes) and its CRC (4), the data, the data's CRC (4).
    return [data[start + 12 : end - 4] for start, end in zip(offsets, offsets[1:])]


def concatenate(parts, path, last_part_bytes=None):
    """Writes the TFRecord files `parts` one after another into `path` (a TFRecord file
    is its records' frames end to end), atomically; only the first `last_part_bytes` of
    the last part (None: all of it). A single whole part is renamed."""
    if len(parts) == 1 and last_part_bytes is None:
        os.replace(parts[0], path)
        return
    tmp = temporary_name(path)
    try:
        with open(tmp, "wb", buffering=0) as out:
            for part in parts:
                with open(part, "rb", buffering=0) as f:
                    _append(f, out)
            if last_part_bytes is not None:  # the last part's tail cut off again
                out.truncate(out.tell() - os.path.getsize(parts[-1]) + last_part_bytes)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _append(source, out):
    """The rest of `source` appended to `out` (unbuffered files): in the kernel where it can."""
    try:
        while os.sendfile(out.fileno(), source.fileno(), None, COPY_BLOCK):
            pass
    except OSError:  # no sendfile between files here: the rest through Python
        shutil.copyfileobj(source, out, COPY_BLOCK)
