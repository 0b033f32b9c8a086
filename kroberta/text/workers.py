"""prepare's workers: each chunk tokenized, packed, split and written as its own parts.

A chunk's records are a function of the chunk alone (its text, the tokenizer, the
seed and its index): its sequences are packed from its own documents, the last one
padded; sequence `j` of chunk `c` has the id `c * 2**40 + j`, which chooses its
validation split and its static mask. So any number of processes, in any order,
write the same parts, and a chunk whose result file exists is done: a run that was
stopped skips it. Parts are written under temporary names and renamed, the result
file last.

Workers are forked from a process that has not imported JAX or TensorFlow (the
command's); from one that has (a notebook, the tests), whose threads a fork would
copy mid-flight, they are spawned fresh: a script calling `prepare(workers=N)` then
needs the usual `if __name__ == "__main__":` guard. Either way a worker holds the
tokenizer, numpy and nothing more: no TensorFlow (`kroberta.text.tfrecord_files`
writes the files) and, without static labels, no JAX.
"""

import contextlib
import json
import multiprocessing
import os
import signal
import sys

import numpy as np
from tokenizers import Tokenizer

from kroberta.atomic import atomic_write
from kroberta.data.records import encode_examples
from kroberta.text.encode import blocks, encoded_documents
from kroberta.text.packing import one_per_document, pack_documents
from kroberta.text.splits import in_validation
from kroberta.text.textfiles import ReadCounts
from kroberta.text.tfrecord_files import RecordFileWriter
from kroberta.tokens import PAD_ID

BLOCK = 1024  # sequences per block: the unit of static masking and of serialization
CHUNK_ID_SHIFT = 40  # a sequence's id: its chunk's index * 2**40 + its index in the chunk


def part_path(work_dir, index, split):
    """A chunk's records of one split."""
    return os.path.join(work_dir, f"chunk-{index:06d}.{split}.tfrecord")


def result_path(work_dir, index):
    """A chunk's result (counts), written last: the chunk is done when it exists."""
    return os.path.join(work_dir, f"chunk-{index:06d}.json")


def load_result(work_dir, index):
    """The result of a finished chunk, or None."""
    try:
        with open(result_path(work_dir, index), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_tokenizer_of(job):
    """The tokenizer the job names (its JSON), set to read "<s>" in text as text."""
    tok = Tokenizer.from_str(job["tokenizer_json"])
    tok.encode_special_tokens = True
    return tok


def prepare_chunk(job, tok, chunk, on_bytes=None):
    """Tokenizes, packs, splits and writes one chunk; returns (and writes) its result:
    {"index", "train": {"sequences", "tokens"}, "validation": {...}, "documents",
    "lines", "long_documents", "last_tokens": {split: tokens of its last record}}."""
    if job["labels"] == "static":
        from kroberta.masking import static_labels  # JAX, imported only to make static labels
    counts = ReadCounts()
    docs = encoded_documents(tok, chunk.sources, on_bytes, line_by_line=job["line_by_line"], counts=counts)
    arrange = one_per_document if job["line_by_line"] else pack_documents
    specials = job["specials"]
    sequences = arrange(docs, job["seq_len"], specials["bos"], specials["eos"], PAD_ID)
    writers = {split: RecordFileWriter(part_path(job["work_dir"], chunk.index, split))
               for split in ("train", "validation")}
    totals = {split: {"sequences": 0, "tokens": 0} for split in writers}
    last_tokens = {split: 0 for split in writers}  # of each split's last record, for `assembly.hold_back`
    start = 0
    try:
        for ids, mask in blocks(sequences, BLOCK):  # (n, L) each
            indices = (chunk.index << CHUNK_ID_SHIFT) + np.arange(start, start + len(ids), dtype=np.int64)
            labels = None
            if job["labels"] == "static":  # each sequence's mask: a function of (seed, its id)
                ids, labels = static_labels(
                    ids, mask, job["seed"], indices, mask_rate=job["mask_rate"], mask_token_id=specials["mask"],
                    special_token_ids=job["special_ids"], vocabulary_size=job["vocabulary_size"])
            held_out = in_validation(indices, job["validation_fraction"], job["seed"])  # (n,)
            records = encode_examples(ids, mask, labels)
            tokens = mask.sum(axis=1).tolist()
            for split, chosen in (("train", ~held_out), ("validation", held_out)):
                rows = np.flatnonzero(chosen).tolist()
                writers[split].write_many([records[i] for i in rows])
                totals[split]["sequences"] += len(rows)
                totals[split]["tokens"] += sum(tokens[i] for i in rows)
                last_tokens[split] = tokens[rows[-1]] if rows else last_tokens[split]
            start += len(ids)
        for split, writer in writers.items():
            writer.close() if writer.records else writer.abort()
    except BaseException:
        for writer in writers.values():
            with contextlib.suppress(OSError, ValueError):
                writer.abort()
        raise
    result = {"index": chunk.index, **totals, "documents": counts.documents, "lines": counts.lines,
              "long_documents": counts.long_documents, "last_tokens": last_tokens}
    with atomic_write(result_path(job["work_dir"], chunk.index), encoding="utf-8") as f:
        json.dump(result, f)
    return result


# One worker process's state, set by `_start_worker`.
_worker = {}


def _start_worker(job, counter):
    # Ctrl-C reaches the whole process group: the parent stops the workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # One thread of `tokenizers` per worker: the workers are the parallelism.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _worker.update(job=job, tok=load_tokenizer_of(job), counter=counter)


def _count(nbytes):
    with _worker["counter"].get_lock():
        _worker["counter"].value += nbytes


def _run_in_worker(chunk):
    return prepare_chunk(_worker["job"], _worker["tok"], chunk, _count)


def run_chunks(job, chunks, workers, progress):
    """Prepares the `chunks` with `workers` processes (1: in this one); `progress` (a
    `kroberta.console.Progress`) hears the bytes read. Returns the results, by chunk index."""
    results = {}
    if workers <= 1 or len(chunks) <= 1:
        tok = load_tokenizer_of(job)
        for chunk in chunks:
            results[chunk.index] = prepare_chunk(job, tok, chunk, progress.add)
        return results
    context = multiprocessing.get_context(start_method())
    counter = context.Value("q", 0)
    # Forked workers must not inherit `tokenizers`' thread pool (it warns, then turns it
    # off): they start with it off.
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        pool = context.Pool(min(workers, len(chunks)), initializer=_start_worker, initargs=(job, counter))
    finally:
        if previous is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous
    try:
        done, reported = pool.imap_unordered(_run_in_worker, chunks), 0
        while len(results) < len(chunks):
            try:
                result = done.next(timeout=0.5)
                results[result["index"]] = result
            except multiprocessing.TimeoutError:
                pass
            now = counter.value
            progress.add(now - reported)
            reported = now
        pool.close()
    except BaseException:
        pool.terminate()  # an error in one chunk, or Ctrl-C: the others stop too
        raise
    finally:
        pool.join()
    return results


def start_method():
    """"fork" where it is safe and available, else "spawn"."""
    threaded = any(name in sys.modules for name in ("jax", "tensorflow"))
    return "fork" if not threaded and "fork" in multiprocessing.get_all_start_methods() else "spawn"


def default_workers():
    """The CPU cores this process may use."""
    with contextlib.suppress(AttributeError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1

