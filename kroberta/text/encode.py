"""Documents -> token ids, batched and overlapped with the rest of prepare.

`tokenizers`' encode_batch runs on the library's own threads and releases the GIL,
so reading and encoding run in a background thread while the main thread packs and
serializes (Python + numpy, about a quarter of prepare's time).
"""

import contextlib
import itertools
import queue
import threading

import numpy as np

from kroberta.text.textfiles import iter_documents

ENCODE_BATCH_CHARS = 1 << 20  # text per encode_batch call: enough to keep its threads busy


def _encode_batches(tok, files, on_bytes, line_by_line, counts):
    """Lists of token-id lists (no special tokens) of the files' documents
    (`iter_documents`), about 1 MB of text per `encode_batch_fast` call."""
    batch, chars = [], 0
    for doc in iter_documents(files, on_bytes, line_by_line, counts):
        batch.append(doc)
        chars += len(doc)
        if chars >= ENCODE_BATCH_CHARS:
            yield [e.ids for e in tok.encode_batch_fast(batch, add_special_tokens=False)]
            batch, chars = [], 0
    if batch:
        yield [e.ids for e in tok.encode_batch_fast(batch, add_special_tokens=False)]


def encoded_documents(tok, files, on_bytes=None, line_by_line=False, counts=None):
    """One token-id list per document, in file order, read and encoded in a background
    thread (`counts`: a `textfiles.ReadCounts` to fill). The bounded queue (4 batches) keeps memory flat; an error in the thread is
    re-raised here; stopping early (error, interrupt) stops the thread."""
    out = queue.Queue(maxsize=4)
    stop = threading.Event()
    done = object()

    def produce():
        try:
            for ids in _encode_batches(tok, files, on_bytes, line_by_line, counts):
                while True:
                    if stop.is_set():
                        return
                    with contextlib.suppress(queue.Full):
                        out.put(ids, timeout=0.1)
                        break
            out.put(done)
        except BaseException as e:  # re-raised in the consumer, with its traceback
            out.put(e)

    thread = threading.Thread(target=produce, name="kroberta-encode", daemon=True)
    thread.start()
    try:
        while (item := out.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield from item
    finally:
        stop.set()  # the consumer stopped early (error, interrupt): let the producer end
        thread.join(timeout=5)


def blocks(sequences, size):
    """Group (ids, mask) rows into ((n, L), (n, L)) arrays of up to `size` rows (n <= size)."""
    sequences = iter(sequences)
    while rows := list(itertools.islice(sequences, size)):
        ids, masks = zip(*rows)
        yield np.stack(ids), np.stack(masks)
