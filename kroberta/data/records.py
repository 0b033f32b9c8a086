"""The on-disk record format, shared with the core's tf.data reader.

Each record is a serialized `tf.train.Example` with int64-list features:

- `input_ids`      [seq_len]  token ids; padding (id 1) only as a suffix
- `attention_mask` [seq_len]  1 = real token, 0 = padding
- `labels`         [seq_len]  optional; -100 = no loss, else the original token id
                              (the Hugging Face convention)

Records are serialized by hand: `tf.train.Example(...).SerializeToString()` one
record at a time made serialization the slowest step of `prepare`; the numpy varint
encoder below does a whole batch at once and produces bytes that
`tf.io.parse_example` reads identically (tests compare both ways). Files of records
are written by `kroberta.data.tfrecord_files`.
"""

import functools

import numpy as np

FEATURES = ("input_ids", "attention_mask", "labels")
REQUIRED_FEATURES = FEATURES[:2]  # labels are optional

# Protobuf wire-format tags: (field_number << 3) | wire_type, wire_type 2 = bytes.
_TAG_1 = b"\x0a"  # Example.features, Features.feature (map entry), entry.key, Int64List.value
_TAG_2 = b"\x12"  # map entry value (a Feature)
_TAG_3 = b"\x1a"  # Feature.int64_list


def _varint(value):
    """Protobuf base-128 varint of a non-negative Python int."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@functools.cache
def _feature_prefix(name, packed_len):
    """Bytes of one map entry up to its packed values; depends only on (name, length)."""
    int64_list = _TAG_1 + _varint(packed_len)  # Int64List.value, packed
    feature_len = len(int64_list) + packed_len
    feature = _TAG_3 + _varint(feature_len)
    value_len = len(feature) + feature_len
    name_b = name.encode()
    entry_head = _TAG_1 + _varint(len(name_b)) + name_b + _TAG_2 + _varint(value_len)
    entry_len = len(entry_head) + value_len
    return _TAG_1 + _varint(entry_len) + entry_head + feature + int64_list


def _packed_varints(values):
    """Varint-encode a 2-D int array row by row.

    Args:
        values: (n, k) integer array; negatives are encoded as 10-byte two's
            complement, as protobuf does for int64.

    Returns:
        (flat bytes of all rows, (n + 1,) int64 offsets of each row in them).
    """
    v = np.ascontiguousarray(values, dtype=np.int64).view(np.uint64)
    # Bytes per value: 1 + number of 7-bit groups above the first.
    nbytes = np.ones(v.shape, dtype=np.int64)
    for k in range(1, 10):
        nbytes += v >= np.uint64(1 << (7 * k))
    width = int(nbytes.max()) if v.size else 1
    shifts = np.arange(width, dtype=np.uint64) * np.uint64(7)
    groups = ((v[..., None] >> shifts) & np.uint64(0x7F)).astype(np.uint8)  # (n, k, width)
    position = np.arange(width)
    groups |= np.where(position < nbytes[..., None] - 1, 0x80, 0).astype(np.uint8)
    flat = groups[position < nbytes[..., None]]  # row-major: value by value, row by row
    offsets = np.zeros(v.shape[0] + 1, dtype=np.int64)
    np.cumsum(nbytes.sum(axis=1), out=offsets[1:])
    return flat.tobytes(), offsets


def encode_examples(input_ids, attention_mask, labels=None):
    """Serialize a batch of sequences as `tf.train.Example` records.

    Args:
        input_ids: (n, seq_len) int array.
        attention_mask: (n, seq_len) int array of 0/1.
        labels: optional (n, seq_len) int array (-100 = no loss).

    Returns:
        A list of n `bytes`, each a serialized `tf.train.Example`.
    """
    columns = [("input_ids", input_ids), ("attention_mask", attention_mask)]
    if labels is not None:
        columns.append(("labels", labels))
    encoded = [(name, *_packed_varints(np.atleast_2d(col))) for name, col in columns]
    n = len(encoded[0][2]) - 1
    records = []
    for i in range(n):
        parts = []
        for name, data, offsets in encoded:
            start, end = offsets[i], offsets[i + 1]
            parts.append(_feature_prefix(name, int(end - start)))
            parts.append(data[start:end])
        body = b"".join(parts)
        records.append(_TAG_1 + _varint(len(body)) + body)
    return records
