"""Reading files one after the other in blocks, as evaluation and prediction do.

A record's (file, index within the file) tag names it in error messages. When the
files' record counts are known (local files), a block's tags are a function of its
number: record j of block k is record k * block + j of the files in order, found
by a search over the files' cumulative counts. The consumer computes them inside
its own map (`FileOrder.tagged`), so no tf.data stage of their own runs per block:
a map stage costs ~100 us per call, ~1.6 us per 512-token record at batch 64
(docs/design.md, "The input pipeline"). Without the counts (remote files) the blocks are
tagged as they are read (`epochs.read_tagged_blocks`).
"""

import numpy as np
import tensorflow as tf

from kroberta.data import epochs


class FileOrder:
    """`files` read one after the other in blocks of `block` records (blocks span
    files; the last may be shorter).

    `blocks()` is a dataset of (block number, element); inside a map,
    `tagged(k, element)` gives the block's (files (n,), record indices (n,) int64,
    records (n,)), the same as `epochs.read_tagged_blocks(files, block)`'s block k.
    """

    def __init__(self, files, file_records, block: int):
        self.files = tuple(files)
        self.block = block
        # Records per file, or None when unknown (remote): then the reader tags. File f
        # holds places starts[f] ... ends[f] - 1 of the files in order.
        self.ends = None if file_records is None else np.cumsum(file_records, dtype=np.int64)
        self.starts = None if self.ends is None else np.concatenate([[0], self.ends[:-1]])

    def blocks(self):
        """(block number k int64, element) for each block, in file order."""
        if self.ends is None:
            files = tf.data.Dataset.from_tensor_slices(list(self.files))
            return epochs.read_tagged_blocks(files, self.block).enumerate()
        return tf.data.TFRecordDataset(list(self.files)).batch(self.block).enumerate()

    def tagged(self, block_number, element):
        """(files (n,), record indices (n,), records (n,)) of block `block_number`."""
        if self.ends is None:
            return element
        records = element
        # Places in file order (n,); a place's file is the number of files that end at
        # or before it.
        places = block_number * self.block + tf.range(tf.size(records, out_type=tf.int64))
        file = tf.searchsorted(tf.constant(self.ends), places, side="right")  # (n,)
        return (tf.gather(tf.constant(list(self.files)), file),
                places - tf.gather(tf.constant(self.starts), file), records)
