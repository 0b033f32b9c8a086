"""Pack tokenized documents into full sequences of exactly `seq_len` tokens.

Layout (RoBERTa's "full sentences"): `<s> doc1 </s> doc2 </s> ... </s>`. Every
sequence begins with `<s>` and its real part ends with `</s>`; a document that does
not fit is cut, closed with `</s>`, and continues right after the next sequence's
`<s>`. So nearly every position holds a real token and only the last sequence is
padded. A consequence, as in fairseq: a `</s>` at a sequence's end may mark a cut
rather than a document's end.
"""

import numpy as np

from kroberta.tokens import BOS_ID, EOS_ID, PAD_ID


def pack_documents(documents, seq_len, bos_id=BOS_ID, eos_id=EOS_ID, pad_id=PAD_ID):
    """(input_ids, attention_mask), two (seq_len,) int32 arrays, per packed sequence of
    the token-id lists `documents` (encoded without special tokens; empty ones skipped).
    Only the final sequence may hold padding (pad_id, attention 0), as a suffix. A
    generator over at most one sequence plus one document: memory stays flat.
    """
    body = seq_len - 1  # positions after <s>, the last of which must be </s>
    full_mask = np.ones(seq_len, dtype=np.int32)
    eos = np.array([eos_id], dtype=np.int32)
    # The stream is doc1 </s> doc2 </s> ...; `buffer` holds its unconsumed tail
    # (fewer than `body` tokens between documents). A numpy array and a moving
    # start keep a huge document linear in its length.
    buffer = np.empty(0, dtype=np.int32)
    for doc in documents:
        if len(doc) == 0:
            continue
        buffer = np.concatenate([buffer, np.asarray(doc, dtype=np.int32), eos])
        start = 0
        while len(buffer) - start >= body:
            if buffer[start + body - 1] == eos_id:
                # A document ends exactly at the last position.
                cut = body
            else:
                # Cut mid-document: close with an inserted </s>; the rest continues
                # after the next <s>. (When a document ended one position earlier
                # this gives `</s></s>`, RoBERTa's own pair separator: rare, harmless.)
                cut = body - 1
            row = np.empty(seq_len, dtype=np.int32)
            row[0] = bos_id
            row[1 : cut + 1] = buffer[start : start + cut]
            row[cut + 1 :] = eos_id  # one position, only when cut = body - 1
            start += cut
            yield row, full_mask
        buffer = buffer[start:]
    if len(buffer):
        # The last sequence: the rest of the stream (ends with </s>), then padding.
        # At most `body` tokens remain, so it always fits.
        yield _padded(buffer, seq_len, bos_id, pad_id)


def one_per_document(documents, seq_len, bos_id=BOS_ID, eos_id=EOS_ID, pad_id=PAD_ID):
    """One sequence per document, `<s> doc </s>` cut to `seq_len` and padded (Hugging
    Face run_mlm.py's --line_by_line; prepare feeds it lines or records), as
    `pack_documents` yields them.
    """
    for doc in documents:
        if len(doc):
            yield _padded([*doc[: seq_len - 2], eos_id], seq_len, bos_id, pad_id)


def _padded(tokens, seq_len, bos_id, pad_id):
    """(input_ids, attention_mask) (seq_len,) int32: `<s>`, `tokens`, then padding."""
    row = np.full(seq_len, pad_id, dtype=np.int32)
    row[0] = bos_id
    row[1 : len(tokens) + 1] = tokens
    mask = np.zeros(seq_len, dtype=np.int32)
    mask[: len(tokens) + 1] = 1
    return row, mask
