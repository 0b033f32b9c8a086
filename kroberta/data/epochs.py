"""The training stream as a sequence of epochs: every record exactly once per epoch.

Epoch e of the stream:
  1. the files in a stateless permutation of (seed, e), the same in every process;
  2. with several processes and at least as many files, process p takes every
     count-th file of that list (file sharding);
  3. the files are read side by side, up to 4 at a time, one record from each in
     turn (`interleave`, block 1); each file is opened once per epoch, so no record
     is read twice;
  4. with more processes than files, process p takes every count-th record of that
     stream instead (record sharding);
  5. the epoch's records are shuffled in blocks of `shuffle_buffer`, each block in a
     stateless permutation of (seed, e, block); no block spans two epochs.
So within an epoch each process reads a disjoint share, and the shares together
hold every record once. Elements are (file, record index in the file, record).

Resuming after n consumed records starts at the epoch that holds record n (when
the files' record counts are known, i.e. local files) and skips only the rest,
without parsing anything.

Training reads the stream as batch plans (`EpochPlan.batch_plans`: the block and the
rows to take from it): each batch is gathered straight from its block through the
block's shuffle order, so a record is copied once between the file and its batch (not
by a shuffle and again by a cut: a copy is ~2 us for a 512-token record), and no
per-record step follows the read. The training pipeline gathers them in its parallel
parsing map, so the stream's single thread only reads and plans.

Evaluation and prediction read the files once, in order, in blocks (`FileOrder`).
"""

import numpy as np
import tensorflow as tf

AUTOTUNE = tf.data.AUTOTUNE
MAX_FILES_READ_AT_ONCE = 4
# Records per block when an epoch is not shuffled (any size gives the same batches).
UNSHUFFLED_BLOCK = 1024
_ENDLESS = 2**62


def read_tagged(files_ds, cycle_length=1):
    """(file, index within file, serialized record) for each record of the files.

    The tags let a bad record be reported by name, whichever parallel step meets it.
    `cycle_length=1` reads the files one after the other (input order).
    """

    def read(path):
        return tf.data.TFRecordDataset(path).enumerate().map(lambda i, r: (path, i, r))

    if cycle_length == 1:
        return files_ds.flat_map(read)
    return files_ds.interleave(
        read,
        cycle_length=cycle_length,
        block_length=1,
        num_parallel_calls=AUTOTUNE,
        deterministic=True,
    )


def read_tagged_blocks(files_ds, block: int):
    """`read_tagged(files_ds)` (the files one after the other) in blocks of `block`
    records: (files (n,), indices within files (n,), records (n,)); blocks span files,
    the last may be shorter. The same records in the same order as
    `read_tagged(files_ds).batch(block)`, with one tagging step per block instead of
    one per record.
    """

    def read(path):
        return (
            tf.data.TFRecordDataset(path)
            .batch(block)
            .enumerate()
            .map(
                lambda k, records: (
                    tf.fill(tf.shape(records), path),
                    k * block + tf.range(tf.size(records, out_type=tf.int64)),
                    records,
                )
            )
        )

    return files_ds.flat_map(read).rebatch(block)


class EpochPlan:
    """How one process reads the epochs of `files`: its shard and its record counts."""

    def __init__(
        self,
        files,
        file_records,
        seed: int,
        shuffle_buffer: int,
        shard: tuple[int, int] | None = None,
    ):
        self.files = tuple(files)
        self.file_records = file_records  # records per file, or None when unknown (remote)
        self.seed = int(seed)
        self.shuffle_buffer = shuffle_buffer
        self.count, self.index = shard or (1, 0)
        self.by_file = self.count > 1 and len(self.files) >= self.count
        cycle = min(MAX_FILES_READ_AT_ONCE, len(self.files))
        # File shards read cycle/count files at a time, so the processes' streams
        # interleave into the single-process one (equal-length files).
        self.cycle_length = max(1, cycle // self.count) if self.by_file else cycle

    @property
    def block_size(self) -> int:
        """Records per block (an epoch's last may be shorter)."""
        return self.shuffle_buffer if self.shuffle_buffer > 1 else UNSHUFFLED_BLOCK

    def _permuted(self, epoch):
        return tf.random.experimental.stateless_shuffle(
            tf.constant(list(self.files)), seed=tf.stack([tf.cast(self.seed, tf.int64), epoch])
        )

    def epoch(self, epoch):
        """The records this process reads in `epoch` (an int64 scalar tensor)."""
        return self.epoch_orders(epoch).map(_in_order).unbatch()

    def epoch_orders(self, epoch):
        """`epoch` as blocks as read, each with the order its records leave in:
        ((files (n,), record indices (n,), records (n,)), order (n,) int32)."""
        files = tf.data.Dataset.from_tensor_slices(self._permuted(epoch))
        if self.by_file:
            files = files.shard(self.count, self.index)
        block = self.block_size
        by_record = self.count > 1 and not self.by_file
        if self.cycle_length == 1 and not by_record:
            blocks = read_tagged_blocks(files, block)
        else:  # records from several files in turn, or every count-th record
            records = read_tagged(files, self.cycle_length)
            if by_record:
                records = records.shard(self.count, self.index)
            blocks = records.batch(block)
        if self.shuffle_buffer > 1:
            return self._shuffled(blocks, epoch)
        return blocks.map(lambda *tagged: (tagged, tf.range(tf.shape(tagged[0])[0])))

    def _shuffled(self, blocks, epoch):
        # Blocks of `shuffle_buffer` records, each in a stateless permutation of
        # (seed, epoch, block): a pure function of the seed, as a resumed run needs
        # (tf.data's shuffle cannot take a per-epoch seed tensor once a global seed is set).
        epoch_seed = tf.stack([tf.cast(self.seed, tf.int64), epoch])

        def order(block, tagged):
            return tagged, tf.random.experimental.stateless_shuffle(
                tf.range(tf.shape(tagged[0])[0]),
                seed=tf.random.experimental.stateless_fold_in(epoch_seed, block),
            )

        return blocks.enumerate().map(order)

    def epoch_size(self, epoch: int) -> int | None:
        """Records this process reads in `epoch`; None when the counts are unknown."""
        if self.file_records is None:
            return None
        total = sum(self.file_records)
        if self.count == 1:
            return total
        if not self.by_file:
            return len(range(self.index, total, self.count))
        per_file = dict(zip(self.files, self.file_records))
        names = [n.decode() for n in self._permuted(tf.constant(epoch, tf.int64)).numpy()]
        return sum(per_file[n] for n in names[self.index :: self.count])

    def _start(self, consumed: int) -> tuple[int, int]:
        """(first epoch to read, records of it already consumed) after `consumed` records.

        With unknown record counts: (0, consumed), every consumed record is read again.
        """
        first_epoch, within = 0, consumed
        if self.epoch_size(0) is not None:
            while within >= (size := self.epoch_size(first_epoch)):
                within -= size
                first_epoch += 1
        return first_epoch, within

    def stream(self, consumed: int = 0):
        """(element index, (file, record index, record)), endless, after `consumed` records.

        The element index counts this process's records from the start of the run.
        """
        first_epoch, within = self._start(consumed)
        ds = tf.data.Dataset.range(first_epoch, _ENDLESS).flat_map(self.epoch)
        return ds.skip(within).enumerate(start=consumed)

    def batch_plans(self, consumed: int, batch_size: int, per_element=None):
        """`stream(consumed).batch(batch_size, drop_remainder=True)` as plans, each batch
        gathered from its block: (element indices (B,) int64, plan), where
        `planned_rows(plan, batch_size)` is the batch's (files (B,), record indices (B,),
        records (B,)). A consumer with a map of its own gathers the rows in
        it, in parallel, instead of in this stream's single thread, which then only
        reads (the ceiling per file on a host with many cores).

        `per_element`: a function of element indices (n,) int64 -> values (n,), computed
        once per block for all its batches (a few ops on 10^4 rows instead of the same ops
        on B rows per batch); each plan then comes with its batch's values:
        (element indices, plan, values (B,)).
        """
        first_epoch, within = self._start(consumed)
        # The next block is read while this one is cut: a block is read whole before its
        # first batch leaves, and without this the parsing stalled at every block
        # (docs/design.md, "The input pipeline"); it costs one more block in memory.
        blocks = (
            tf.data.Dataset.range(first_epoch, _ENDLESS).flat_map(self.epoch_orders).prefetch(1)
        )
        blocks = _drop_rows(blocks, within)
        offsets = tf.range(batch_size, dtype=tf.int64)
        nothing = tuple(tf.zeros([0], column.dtype) for column in blocks.element_spec[0])
        if self.block_size < batch_size:
            # Every batch spans blocks: carrying rows from block to block would copy a
            # batch's rows once per block, so put the blocks in order and cut them instead;
            # the cut batch is the plan's carried rows, nothing left to gather.
            cut = blocks.map(_in_order).rebatch(batch_size, drop_remainder=True).enumerate()

            def cut_batch(k, tagged):
                indices = consumed + k * batch_size + offsets
                plan = (indices, (tagged, nothing, tf.zeros([0], tf.int32)))
                return plan if per_element is None else (*plan, per_element(indices))

            return cut.map(cut_batch)
        # Which batches each block gives: a scan carries the rows of a block that did
        # not fill a batch (< B, already in order) to the next block, and the number of
        # batches so far (for the element indices).
        planned = blocks.scan(
            (nothing, tf.constant(0, tf.int64)),
            lambda state, block: _plan_block(state, block, batch_size),
        )

        def block_batches(carried, tagged, order, batches_before, count):
            first_element = consumed + batches_before * batch_size
            if per_element is not None:  # the values of all the block's batches at once
                values = per_element(first_element + tf.range(count * batch_size))

            def batch(j):
                # Batch j: the carried rows first when j = 0, then its next rows in `order`.
                carried_rows = tf.size(carried[0])
                first = tf.cast(j, tf.int32) * batch_size - carried_rows
                rows = order[tf.maximum(first, 0) : first + batch_size]
                carried_now = tuple(c[: tf.where(j == 0, carried_rows, 0)] for c in carried)
                plan = (first_element + j * batch_size + offsets, (carried_now, tagged, rows))
                if per_element is None:
                    return plan
                return (*plan, values[j * batch_size : (j + 1) * batch_size])

            return tf.data.Dataset.range(count).map(batch)

        return planned.flat_map(block_batches)


def planned_rows(plan, batch_size: int):
    """A batch plan's rows (`EpochPlan.batch_plans`): its carried rows, then its block's
    rows at its order; (files (B,), record indices (B,), records (B,)) with the static
    shape (B,). One gather per column (the records copied once), none when the batch
    is all carried rows."""
    carried, tagged, order = plan
    rows = tf.cond(
        tf.size(order) == 0,
        lambda: carried,
        lambda: tf.cond(
            tf.size(carried[0]) == 0,
            lambda: _in_order(tagged, order),
            lambda: _carried_then(carried, tagged, order),
        ),
    )
    return tuple(tf.ensure_shape(t, [batch_size]) for t in rows)


def _plan_block(state, block, batch_size: int):
    """One scan step of `EpochPlan.batch_plans`: (carried rows, batches so far) and a block
    -> the new state, and what the block's batches need: (carried rows, block rows,
    order, batches before it, its number of batches)."""
    (carried, batches_before), (tagged, order) = state, block
    carried_rows = tf.size(carried[0])  # r < B, in stream order
    count = (carried_rows + tf.size(order)) // batch_size  # batches this block completes

    def carry_all():  # no batch completed: the block's rows join the carried ones
        return _carried_then(carried, tagged, order)

    def carry_tail():  # the rows after the block's last full batch
        return _in_order(tagged, order[count * batch_size - carried_rows :])

    carried_next = tf.cond(count == 0, carry_all, carry_tail)
    count = tf.cast(count, tf.int64)
    return ((carried_next, batches_before + count), (carried, tagged, order, batches_before, count))


def _in_order(tagged, order):
    """The block's columns (n,) each, at the rows `order` lists (one gather per column)."""
    return tuple(tf.gather(column, order) for column in tagged)


def _carried_then(carried, tagged, order):
    """The carried rows, then the block's rows at `order`."""
    return tuple(tf.concat([c, t], 0) for c, t in zip(carried, _in_order(tagged, order)))


def _drop_rows(blocks, rows: int):
    """`blocks` ((tagged, order) pairs) without the first `rows` rows of the stream they
    make (across blocks), skipping emptied blocks; only the orders are cut."""
    if rows == 0:
        return blocks

    def drop(remaining, block):
        tagged, order = block
        dropped = tf.minimum(remaining, tf.size(order, out_type=tf.int64))
        return remaining - dropped, (tagged, order[dropped:])

    return blocks.scan(tf.constant(rows, tf.int64), drop).filter(
        lambda tagged, order: tf.size(order) > 0
    )


# Evaluation and prediction read the files one after the other in blocks (no epochs).
# A record's (file, index within the file) tag names it in error messages. When the
# files' record counts are known (local files), a block's tags are a function of its
# number: record j of block k is record k * block + j of the files in order, found
# by a search over the files' cumulative counts. The consumer computes them inside
# its own map (`FileOrder.tagged`), so no tf.data stage of their own runs per block:
# a map stage costs ~100 us per call, ~1.6 us per 512-token record at batch 64
# (docs/design.md, "The input pipeline"). Without the counts (remote files) the blocks are
# tagged as they are read (`read_tagged_blocks`).


class FileOrder:
    """`files` read one after the other in blocks of `block` records (blocks span
    files; the last may be shorter).

    `blocks()` is a dataset of (block number, element); inside a map,
    `tagged(k, element)` gives the block's (files (n,), record indices (n,) int64,
    records (n,)), the same as `read_tagged_blocks(files, block)`'s block k.
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
            return read_tagged_blocks(files, self.block).enumerate()
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
        return (
            tf.gather(tf.constant(list(self.files)), file),
            places - tf.gather(tf.constant(self.starts), file),
            records,
        )
