"""The tokenizer's training text: the whole corpus, or a deterministic sample of it.

Training a BPE on all of a 100 GB corpus costs hours and memory for a vocabulary a
few GB of text decide (SentencePiece's `input_sentence_size` and Hugging Face's
scripts train on a sample too). The sample takes from every file, and every range of a
large file (`kroberta.text.chunks`), its share of the budget, its first whole
documents: spread over all the files and the whole of each large one, and the same for
the same corpus.
"""

from kroberta.text.textfiles import iter_documents

DEFAULT_SAMPLE_BYTES = 1 << 30


def sample_documents(chunks, total_bytes, sample_bytes, on_bytes=None, taken=None):
    """The documents (str) to train the tokenizer on: every chunk's when the corpus
    (`total_bytes`) is no larger than `sample_bytes`; else from each chunk its first
    documents until their UTF-8 bytes reach its share, sample_bytes * size / total (each
    file or range of a chunk its own share, what one left or overshot carried on).

    `on_bytes(n)` hears the bytes read (input bytes for the whole corpus, document bytes
    for a sample); `taken`, a one-element list, adds up the sample's bytes.
    """
    taken = [0] if taken is None else taken
    if total_bytes <= sample_bytes:
        for chunk in chunks:
            yield from iter_documents(chunk.sources, on_bytes)
            taken[0] += chunk.size
        return
    # Each piece (a file, a range of a large one) is owed its share; a piece is read once
    # what is owed reaches `least`, so a corpus of a million small files is not opened a
    # million times for a few bytes each.
    least, owed = min(1 << 16, max(1, sample_bytes // 64)), 0
    for source, source_size in (
        (s, n) for chunk in chunks for s, n in zip(chunk.sources, chunk.sizes)
    ):
        owed += sample_bytes * source_size / total_bytes
        if owed < least:
            continue
        read = 0
        for document in iter_documents([source]):
            yield document
            size = len(document.encode("utf-8")) + 1  # and the line end that separated it
            read += size
            if on_bytes is not None:
                on_bytes(size)
            if read >= owed:
                break
        owed -= read
        taken[0] += read
