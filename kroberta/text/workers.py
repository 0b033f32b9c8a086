"""prepare's workers: each chunk tokenized, packed, split and written as its own parts.

A chunk's records are a function of the chunk alone (its text, the tokenizer, the
seed and its index): its sequences are packed from its own documents, the last one
padded; sequence `j` of chunk `c` has the id `c * 2**40 + j`, which chooses its
validation split and its static mask. So any number of processes, in any order,
write the same parts, and a chunk whose result file exists is done: a run that was
stopped skips it. Parts are written under temporary names and renamed, the result
file last. A write that fails (a full disk, a read-only directory) is one
`StorageError` naming the file and the free space (`WorkDir.writing`).

The worker processes (`kroberta.text.pool`) hold the tokenizer, numpy and nothing
more: no TensorFlow (`kroberta.data.tfrecord_files` writes the files) and, without
static labels, no JAX.
"""

import contextlib

import numpy as np
from tokenizers import Tokenizer

from kroberta.data.records import encode_examples
from kroberta.data.tfrecord_files import RecordFileWriter
from kroberta.text.encode import blocks, encoded_documents
from kroberta.text.job import SPLITS, ChunkResult, SplitCount, WorkerJob
from kroberta.text.packing import one_per_document, pack_documents
from kroberta.text.splits import in_validation
from kroberta.text.textfiles import ReadCounts
from kroberta.tokens import PAD_ID

BLOCK = 1024  # sequences per block: the unit of static masking and of serialization
CHUNK_ID_SHIFT = 40  # a sequence's id: its chunk's index * 2**40 + its index in the chunk


def load_tokenizer_of(job):
    """The tokenizer the job names (its JSON), set to read "<s>" in text as text."""
    tok = Tokenizer.from_str(job.tokenizer_json)
    tok.encode_special_tokens = True
    return tok


def prepare_chunk(job: WorkerJob, tok, chunk, on_bytes=None) -> ChunkResult:
    """Tokenizes, packs, splits and writes one chunk; returns (and writes) its result."""
    if job.labels == "static":
        from kroberta.masking import static_labels  # JAX, imported only to make static labels
    counts = ReadCounts()
    docs = encoded_documents(
        tok, chunk.sources, on_bytes, line_by_line=job.line_by_line, counts=counts
    )
    arrange = one_per_document if job.line_by_line else pack_documents
    specials = job.specials
    sequences = arrange(docs, job.seq_len, specials["bos"], specials["eos"], PAD_ID)
    work = job.work_dir
    parts = {split: work.part_path(chunk.index, split) for split in SPLITS}
    writers = {}
    totals = {split: {"sequences": 0, "tokens": 0} for split in SPLITS}
    last_tokens = dict.fromkeys(SPLITS, 0)  # of each split's last record, for `assembly._moved`
    start = 0
    try:
        for split, path in parts.items():
            with work.writing(path, "records"):
                writers[split] = RecordFileWriter(path)
        for ids, mask in blocks(sequences, BLOCK):  # (n, L) each
            indices = (chunk.index << CHUNK_ID_SHIFT) + np.arange(
                start, start + len(ids), dtype=np.int64
            )
            labels = None
            if job.labels == "static":  # each sequence's mask: a function of (seed, its id)
                ids, labels = static_labels(
                    ids,
                    mask,
                    job.seed,
                    indices,
                    mask_rate=job.mask_rate,
                    mask_token_id=specials["mask"],
                    special_token_ids=job.special_ids,
                    vocabulary_size=job.vocabulary_size,
                )
            held_out = in_validation(indices, job.validation_fraction, job.seed)  # (n,)
            records = encode_examples(ids, mask, labels)
            tokens = mask.sum(axis=1).tolist()
            for split, chosen in (("train", ~held_out), ("validation", held_out)):
                rows = np.flatnonzero(chosen).tolist()
                with work.writing(parts[split], "records"):
                    writers[split].write_many([records[i] for i in rows])
                totals[split]["sequences"] += len(rows)
                totals[split]["tokens"] += sum(tokens[i] for i in rows)
                last_tokens[split] = tokens[rows[-1]] if rows else last_tokens[split]
            start += len(ids)
        for split, writer in writers.items():
            with work.writing(parts[split], "records"):
                writer.close() if writer.records else writer.abort()
    except BaseException:
        for writer in writers.values():
            with contextlib.suppress(OSError, ValueError):
                writer.abort()
        raise
    result = ChunkResult(
        chunk.index,
        SplitCount(**totals["train"]),
        SplitCount(**totals["validation"]),
        counts.documents,
        counts.lines,
        counts.long_documents,
        last_tokens,
    )
    work.save_result(result)
    return result
