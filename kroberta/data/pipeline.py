"""tf.data input pipelines: TFRecords in the seed's format -> masked, batched model inputs.

The records are in the format of `kroberta.data.records` (the seed's, and what
`kroberta.prepare` writes); `kroberta.data.files` finds and inspects the files.

Training order: epochs of records tagged with file and index (`epochs`: every
record once per epoch, shuffled within it, in blocks) -> skip(resume) -> batches
of raw strings gathered from the blocks -> parse, check and mask the whole batch -> prefetch.
Parsing a batch at a time (one `parse_example`, checks as reductions) is what lets
one host feed an accelerator. Every element's mask is a function of (run seed, element
index), so a resumed run sees exactly the examples and masks an uninterrupted one
would have. With `device_masks=True` the pipeline sends the unmasked ids and each
element's uint32 key (`mask_keys`, (B,)), and the training step draws the masks on the
device; with static labels it sends them per position (`token_labels`, (B, L)) and the
step chooses the slots. Without it, the same JAX functions finish the batches here, on
the host CPU (`kroberta.masking`, `kroberta.data.host_masking`).

TensorFlow here runs on the host CPU only; JAX owns the accelerators.
"""

import os

import numpy as np
import tensorflow as tf

from kroberta.config import DataConfig
from kroberta.data import epochs, host_masking
from kroberta.data.bad_records import explain_pipeline_error, first_bad_record
from kroberta.data.batch_parsing import parse_checked_batch
from kroberta.data.epochs import FileOrder
from kroberta.data.file_patterns import resolve_files
from kroberta.data.files import DataSpec, check_against_model, inspect_files, spec_records
from kroberta.errors import InputError
from kroberta.tokens import IGNORE_LABEL

AUTOTUNE = tf.data.AUTOTUNE

__all__ = [
    "DataSpec",
    "explain_pipeline_error",
    "resolve_files",
    "inspect_files",
    "check_against_model",
    "train_dataset",
    "eval_dataset",
    "batches_per_call",
]


def parallel_batches() -> int:
    """How many batches a parse-check-mask map works on at once: one per core this
    process may use, plus one so no core waits for the next hand-off.

    tf.data's AUTOTUNE kept these maps at ~1.45 of 2 cores, a quarter slower than this
    (docs/design.md, "The input pipeline"); more than cores + 1 gained nothing.
    """
    if hasattr(os, "sched_getaffinity"):  # the cores this process may run on (containers)
        return len(os.sched_getaffinity(0)) + 1
    return (os.cpu_count() or 1) + 1


# Records a parsing map's call works on at least (whole batches): a tf.data call and each
# op in it cost a fixed ~2-100 us, which batches of 64 paid per ~64 records (side by side,
# 4 batches of 64 per call: 1.76x the samples/s at 64 tokens, docs/design.md, "The input pipeline").
RECORDS_PER_CALL = 256
# ... and when the map also masks (masks drawn on the host): the masking's
# `tf.numpy_function` into a jitted JAX program costs a fixed share per call, on top
# of the ops' (docs/benchmarks/input-pipeline.md, "Masks drawn on the host").
HOST_MASKED_RECORDS_PER_CALL = 2048


def batches_per_call(batch_size: int, host_masks: bool = False) -> int:
    """How many batches of `batch_size` one call of a parsing map works on (training,
    evaluation and prediction alike; more when the map draws the masks, `host_masks`)."""
    records = HOST_MASKED_RECORDS_PER_CALL if host_masks else RECORDS_PER_CALL
    return max(1, records // batch_size)


def _parse(spec: DataSpec, vocabulary_size: int, tagged) -> dict:
    """(files, record indices, records) (B,) -> int32 (B, L) features, checked. The fast
    parse: a missing feature or wrong length fails unnamed, and the caller's replay
    (`replay_train_errors`, `replay_file_errors`) names it."""
    return parse_checked_batch(
        *tagged,
        length=spec.sequence_length,
        vocabulary_size=vocabulary_size,
        with_labels=spec.has_labels,
        lengths_named=False,
    )


def _batch_parser(
    spec: DataSpec,
    data: DataConfig,
    vocabulary_size: int,
    seed: int,
    word_starts=None,
    device_masks: bool = False,
):
    """(element indices (B,) int64 (the mask seeds), (files, record indices, records) (B,),
    the rows' element keys (B,) uint32 when already computed) -> (x, y): the model's
    input dict and the labels at the prediction slots; or, when the step finishes the
    batch (`device_masks`), x alone: the unmasked tokens and each row's element key, or
    for static masking the file's tokens and labels (`kroberta.masking`). Both are the
    same step inputs, finished here (on the host CPU, `host_masking.finished`) or on the
    device by the training step."""

    def parse(indices, tagged, keys=None):
        parsed = _parse(spec, vocabulary_size, tagged)  # int32 (B, L) each
        if data.masking == "static":  # the slots come from the file's labels
            x = {
                "token_ids": parsed["input_ids"],
                "padding_mask": parsed["attention_mask"],
                "token_labels": parsed["labels"],
            }  # (B, L) each
        else:
            originals = parsed["input_ids"]
            if "labels" in parsed:
                # Files masked once (the seed's format): recover the unmasked text.
                originals = tf.where(parsed["labels"] != IGNORE_LABEL, parsed["labels"], originals)
            keys = host_masking.element_keys(seed, indices) if keys is None else keys
            x = {
                "token_ids": originals,
                "padding_mask": parsed["attention_mask"],
                "mask_keys": keys,
            }  # (B, L), (B, L), (B,) uint32
        return x if device_masks else host_masking.finished(x, data, vocabulary_size, word_starts)

    return parse


def epoch_plan(
    spec: DataSpec, data: DataConfig, seed: int, shard: tuple[int, int] | None = None
) -> epochs.EpochPlan:
    """How a process reads the training epochs (see `kroberta.data.epochs`)."""
    count, index = shard or (1, 0)
    if spec.records is not None and count > 1 and len(spec.files) < count and spec.records < count:
        raise InputError(
            f"{spec.files[0]}: {spec.records} record(s) cannot be shared by {count} processes"
        )
    return epochs.EpochPlan(spec.files, spec.file_records, seed, data.shuffle_buffer, shard)


def train_dataset(
    spec: DataSpec,
    data: DataConfig,
    vocabulary_size: int,
    global_batch: int,
    seed: int,
    start_step: int = 0,
    shard: tuple[int, int] | None = None,
    word_starts=None,
    device_masks: bool = False,
):
    """Endless training batches of `global_batch`, starting after `start_step` batches.

    Returns a dataset of (x, y) with x = {token_ids (B, L), padding_mask (B, L),
    mask_positions (B, M)} and y = labels (B, M), all int32. With `device_masks`
    and dynamic masking, of x alone:
    {token_ids (B, L) unmasked, padding_mask (B, L), mask_keys (B,) uint32}, whose
    masks the training step draws (`kroberta.masking.masker`), exactly those
    this function makes without `device_masks`; with static masking, of x alone:
    {token_ids (B, L), padding_mask (B, L), token_labels (B, L)}, the file's, from which
    the step chooses the same slots (`DataConfig.step_input`). The records come in
    epochs, each record once per epoch (see `kroberta.data.epochs`); a batch may span
    two epochs.

    With `shard=(count, index)` (one of `count` processes), `global_batch` is this
    process's share of a step and the process reads only its share of each epoch
    (by file when there are at least `count` files, else by record). Element i of
    process p stands for element i*count+p of the unsharded stream (its masking
    seed). With shuffle_buffer = 1, count dividing 4 and files of equal length
    (record sharding: any files), the processes' batches k together hold exactly
    the records and masks of the single-process batch k. `word_starts`: the
    tokenizer's (V,) word-start table, for `data.whole_word_masking` (the pipeline needs
    it only without `device_masks`).
    """
    count, index = shard or (1, 0)

    # The step's mask keys are hashed once per block of the stream, not per batch: ~36
    # small ops a batch cost ~1.4 us per record at batch 64 (docs/design.md, "The input pipeline").
    def block_keys(indices):  # (n,) stream positions -> (n,) uint32
        return host_masking.element_keys(seed, indices * count + index)

    # Several batches per call of the parsing map, then cut: the stream batched by k B
    # and cut into B is the stream batched by B, and each op's dispatch is paid once
    # for k batches.
    rows = batches_per_call(global_batch, host_masks=not device_masks) * global_batch
    keyed = data.step_input() == "mask_keys"
    plans = epoch_plan(spec, data, seed, shard).batch_plans(
        start_step * global_batch, rows, block_keys if keyed else None
    )
    parse = _batch_parser(spec, data, vocabulary_size, seed, word_starts, device_masks)

    def gather_and_parse(indices, plan, keys=None):
        # The rows are gathered here, in parallel, not in the stream's one thread.
        return parse(indices * count + index, epochs.planned_rows(plan, rows), keys)

    ds = plans.map(gather_and_parse, num_parallel_calls=parallel_batches(), deterministic=True)
    if rows > global_batch:
        ds = ds.rebatch(global_batch, drop_remainder=True)
    return ds.prefetch(AUTOTUNE)


def replay_train_errors(
    spec: DataSpec,
    data: DataConfig,
    vocabulary_size: int,
    seed: int,
    start_step: int,
    steps: int,
    global_batch: int,
    shard: tuple[int, int] | None = None,
):
    """A function naming the first bad record among the next `steps` training batches."""

    def replay():
        tagged = epoch_plan(spec, data, seed, shard).stream(start_step * global_batch)
        return first_bad_record(
            tagged.map(lambda i, t: t),
            length=spec.sequence_length,
            vocabulary_size=vocabulary_size,
            with_labels=spec.has_labels,
            max_records=steps * global_batch,
        )

    return replay


def eval_dataset(
    spec: DataSpec,
    data: DataConfig,
    vocabulary_size: int,
    global_batch: int,
    seed: int,
    max_batches: int = 0,
    shard: tuple[int, int] | None = None,
    word_starts=None,
    device_masks: bool = False,
):
    """Every validation example once, in file order, with the same masks on every call.

    The last batch is completed with padding examples whose labels are all -100
    (whose padding_mask is all 0, so the step draws no masks for them), so no example
    is dropped and every batch has the shape the devices expect; the masked loss and
    metrics give the padding no weight. With `shard=(count, index)` each process
    yields its 1/count slice of every global batch (it reads all the files:
    validation sets are small). `device_masks`: as in `train_dataset`.
    """
    count, index = shard or (1, 0)
    parse = _batch_parser(spec, data, vocabulary_size, seed, word_starts, device_masks)
    share = global_batch // count

    # Several global batches per call of the map, then cut, as in `train_dataset`.
    rows = batches_per_call(global_batch, host_masks=not device_masks) * global_batch

    def parse_and_pad(block_number, block):
        tagged = order.tagged(block_number, block)
        # Element indices (mask seeds): places in file order.
        indices = block_number * rows + tf.range(tf.size(tagged[0], out_type=tf.int64))
        batch = parse(indices, tagged)
        missing = -tf.size(indices) % global_batch  # to whole global batches
        pad = lambda name, t: _pad_rows(t, missing, padding_value(name, data.pad_token_id))

        def take(t):  # of each global batch, process p takes rows p*share ... (p+1)*share - 1
            if count == 1:
                return t
            trailing = tf.shape(t)[1:]
            whole = tf.reshape(t, tf.concat([[-1, global_batch], trailing], 0))
            return tf.reshape(
                whole[:, index * share : (index + 1) * share], tf.concat([[-1], trailing], 0)
            )

        if isinstance(batch, dict):  # x alone: the step draws the masks
            return {name: take(pad(name, t)) for name, t in batch.items()}
        x, y = batch
        return {name: take(pad(name, t)) for name, t in x.items()}, take(pad("labels", y))

    order = FileOrder(spec.files, spec.file_records, rows)
    ds = order.blocks().map(
        parse_and_pad, num_parallel_calls=parallel_batches(), deterministic=True
    )
    ds = ds.rebatch(share, drop_remainder=True)  # whole batches: nothing dropped
    batches = -(-spec_records(spec) // global_batch)
    if max_batches:
        batches = min(batches, max_batches)
        ds = ds.take(max_batches)
    # A known length lets Keras end the evaluation without an "ran out of data" warning.
    return ds.apply(tf.data.experimental.assert_cardinality(batches)).prefetch(AUTOTUNE)


def replay_file_errors(spec: DataSpec, vocabulary_size: int):
    """A function naming the first bad record of the files, in file order."""
    return lambda: first_bad_record(
        epochs.read_tagged(tf.data.Dataset.from_tensor_slices(list(spec.files))),
        length=spec.sequence_length,
        vocabulary_size=vocabulary_size,
        with_labels=spec.has_labels,
    )


def padding_value(name: str, pad_token_id: int) -> int:
    """What a padding example holds in the model input or result column `name`.

    <pad> tokens, no labels, zeros elsewhere (no real token, no slot, not real, not
    valid, mask key 0): the masked loss and metrics give it no weight and predict drops it.
    """
    return {
        "token_ids": pad_token_id,
        "labels": IGNORE_LABEL,
        "token_labels": IGNORE_LABEL,
        "marks": IGNORE_LABEL,
    }.get(name, 0)


def _pad_rows(tensor, rows, value):
    """Appends `rows` rows of `value` to a (B, ...) tensor."""
    padding = [[0, rows]] + [[0, 0]] * (tensor.shape.rank - 1)
    return tf.pad(tensor, padding, constant_values=tf.cast(value, tensor.dtype))


def file_batches(spec: DataSpec, vocabulary_size: int, batch_size: int):
    """Every record of the files once, in order, checked, in two parts: (blocks, parse),
    a dataset of raw batches and the function that parses and checks one of them (its
    elements as arguments) into int32 (b, L) dicts, to run inside a map. A consumer
    with a map of its own calls `parse` in it: one tf.data stage less per batch.

    The last batch may be shorter.
    """
    order = FileOrder(spec.files, spec.file_records, batch_size)

    def parse(batch_number, block):
        return _parse(spec, vocabulary_size, order.tagged(batch_number, block))

    return order.blocks(), parse


def count_labels_beyond_slots(
    spec: DataSpec, slots: int, vocabulary_size: int, sample: int = 2000
) -> tuple[int, int]:
    """(sequences, labelled positions) among the first `sample` that exceed `slots`.

    Raises:
        InputError: a corrupt file or malformed record, named by file and record.
    """
    ds = tf.data.TFRecordDataset(list(spec.files)).take(sample).batch(256)
    ds = ds.map(
        lambda r: tf.io.parse_example(
            r, {"labels": tf.io.FixedLenFeature([spec.sequence_length], tf.int64)}
        )["labels"]
    )
    over_sequences = over_labels = 0
    try:
        for labels in ds.as_numpy_iterator():
            counts = (labels != IGNORE_LABEL).sum(axis=1)
            over_sequences += int((counts > slots).sum())
            over_labels += int(np.maximum(counts - slots, 0).sum())
    except tf.errors.OpError as error:  # a corrupt file or record: named, not TF's op text
        explained = explain_pipeline_error(
            error, spec.files, replay=replay_file_errors(spec, vocabulary_size)
        )
        if explained is None:
            raise
        raise explained from None
    return over_sequences, over_labels
