"""Prediction compiled, sharded and reduced on the devices.

G batches run as one XLA program over a 1-D device mesh (batch axis): the
backbone, the sparse head at M slots per sequence and the reduction the caller
asked for (top-k, log-softmax, per-example loss, mean pooling), mapped over the
G batches of a (G, batch, ...) group. G is `train.steps_per_execution` (chosen
from the forward FLOPs when "auto", `kroberta.perf.dispatch_size`); a last group with
fewer batches is filled with padding batches, so every call reuses one program.
The host only receives reduced arrays, one group at a time, while the next group
is already on the devices. The model's own variables are never touched: the step runs on a
replicated copy of the weights, so a failure mid-way leaves the model usable.
"""

import contextlib
import inspect
import numbers
import warnings

import jax
import numpy as np
import tensorflow as tf

from kroberta.data import pipeline
from kroberta.downstream.prediction import predict_texts
from kroberta.errors import InputError
from kroberta.inference import DEFAULT_MAX_OUTPUT_BYTES, OUTPUTS
from kroberta.inference.inputs import as_examples, batched
from kroberta.model import predict_program
from kroberta.model.masked_lm import check_model
from kroberta.perf import dispatch_size
from kroberta.perf.hardware import size_text
from kroberta.perf.plan import make_plan

MAX_LOGITS_BYTES = 2**28  # device memory for one dispatch's logits, by default


def prediction_plan(config, length: int):
    """The plan of prediction: every device of this job in one batch axis."""
    return make_plan(config, jax.devices(), length, strategy="data")


def predict_batches(
    model,
    inputs,
    output="top_k",
    k=5,
    positions="masked",
    batch_size=None,
    slots=None,
    max_output_bytes=DEFAULT_MAX_OUTPUT_BYTES,
    batches_per_dispatch=None,
):
    """Yields the prediction in input order, one dict of numpy arrays per dispatch
    (`batches_per_dispatch` batches, padding rows dropped).

    Same arguments as `predict`; use this to stream results to disk with host
    memory bounded by two dispatches' worth of rows.
    """
    config, source = _checked_source(model, inputs, output, k, positions)
    plan_slots, global_batch, group, mesh = _program_shapes(
        config, source, output, positions, batch_size, slots, batches_per_dispatch, max_output_bytes
    )
    # One host batch per dispatch: G x batch rows, cut into (G, batch, ...) on the way to
    # the devices (one numpy pass per group, not per batch; a short last group is
    # filled with padding rows, so the same program serves it).
    groups = batched(source, config, positions, global_batch * group)
    jitted, replicated, by_batch = predict_program.compiled_step(
        model, output, k, mesh, plan_slots, group, positions
    )
    weights = predict_program.weights_snapshot(model, replicated)

    dropped = predicted = examples = 0
    in_flight = None
    lead = 2 if group > 1 else 1  # the outputs' axes that count rows: (G, batch, ...)

    def received(result, real):
        # One dispatch's reduced rows on the host, padding rows dropped (with the slots'
        # `positions`, `valid` and `dropped`); the slots' counts kept for the warnings.
        nonlocal dropped, predicted
        chunk = {
            n: np.asarray(v).reshape(len(real), *v.shape[lead:])[real] for n, v in result.items()
        }
        dropped += int(chunk.pop("dropped", np.zeros(0)).sum())
        predicted += int(chunk["valid"].sum()) if "valid" in chunk else 0
        return chunk

    with warnings.catch_warnings(), _explained_data_errors(source):
        warnings.simplefilter("ignore", category=DeprecationWarning)
        for rows in groups:
            real = rows.pop("is_real")
            examples += int(real.sum())
            if group > 1:  # (G * batch, ...) host arrays as the program's (G, batch, ...), views
                rows = {n: v.reshape(group, global_batch, *v.shape[1:]) for n, v in rows.items()}
            device_group = jax.device_put(rows, by_batch)
            result = jitted(*weights, device_group)  # dispatched asynchronously
            for value in result.values():
                value.copy_to_host_async()
            if in_flight is not None:
                yield received(*in_flight)
            in_flight = (result, real)
        if in_flight is not None:
            yield received(*in_flight)
    if positions == "masked" and output != "embeddings" and examples and not predicted:
        warnings.warn(
            f"nothing was predicted: no position of the {examples} sequence(s) holds <mask> "
            f"(id {config.data.mask_token_id})"
            + (" or a label" if source.has_labels else "")
            + ", so every 'valid' is False. Unmasked sequences (what `kroberta.prepare` "
            "writes) need positions='all' (--positions all) to predict every position, or "
            "<mask> where a prediction is wanted",
            stacklevel=2,
        )
    if dropped and output != "embeddings":
        warnings.warn(
            f"{dropped} masked position(s) beyond the {plan_slots} slots per sequence were not "
            "predicted; pass slots=N (or positions='all') to predict them",
            stacklevel=2,
        )


def _checked_source(model, inputs, output, k, positions):
    """(config, examples of `inputs`) once the arguments that need no program are checked."""
    if output not in OUTPUTS:
        raise InputError(f"output must be one of {OUTPUTS}, got {output!r}")
    if positions not in ("masked", "all"):
        raise InputError(f"positions must be 'masked' or 'all', got {positions!r}")
    check_model(model, "predict")
    config = model.kroberta_config
    if config is None:
        raise InputError("model has no kroberta_config: load it with kroberta.load(run_dir)")
    source = as_examples(inputs, config, model.tokenizer)
    if output == "loss" and not source.has_labels:
        raise InputError(
            "output='loss' needs labels (a 'labels' array or feature, -100 = none); "
            "prepare writes them with --labels static"
        )
    if output == "top_k" and (
        not isinstance(k, numbers.Integral)
        or isinstance(k, bool)
        or not 1 <= k <= config.model.vocabulary_size
    ):
        raise InputError(f"k must be an integer in [1, {config.model.vocabulary_size}], got {k!r}")
    return config, source


def _program_shapes(
    config, source, output, positions, batch_size, slots, batches_per_dispatch, max_output_bytes
):
    """(slots, global batch, G, mesh) of the program for `predict_batches`' arguments
    (checked here), from the plan of prediction."""
    length = source.sequence_length
    # 0 and negatives would otherwise surface from inside TensorFlow or JAX.
    if batch_size is not None and batch_size < 1:
        raise InputError(
            f"batch_size must be >= 1 (sequences per step over all devices), got {batch_size}"
        )
    if slots is not None and not 1 <= slots <= length:
        raise InputError(
            f"slots must be in [1, {length}] (positions predicted per sequence "
            f"of {length} tokens), got {slots}"
        )
    plan_slots = length if positions == "all" else slots or config.data.prediction_slots(length)
    if batches_per_dispatch is not None and batches_per_dispatch < 1:
        raise InputError(f"batches_per_dispatch must be >= 1, got {batches_per_dispatch}")
    resolved = prediction_plan(config, length)
    mesh = jax.sharding.Mesh(np.array(resolved.topology.devices), ("batch",))
    global_batch = resolved.prediction_batch(batch_size)
    group = batches_per_dispatch or resolved.prediction_group(
        global_batch, plan_slots, source.examples
    )
    if output == "logits" and not batches_per_dispatch:
        # Full logits are large: at most MAX_LOGITS_BYTES of them per dispatch, and no
        # more padding batches than the inputs need (their bytes go to the host too).
        per_batch = global_batch * plan_slots * config.model.vocabulary_size * 4
        group = dispatch_size.at_most_needed(
            max(1, min(group, MAX_LOGITS_BYTES // per_batch)), source.examples, global_batch
        )
    if output == "logits" and source.examples is not None:
        size = source.examples * plan_slots * config.model.vocabulary_size * 4
        if size > max_output_bytes:
            raise InputError(
                f"output='logits' for {source.examples} examples x {plan_slots} positions x "
                f"{config.model.vocabulary_size} tokens is {size_text(size)} of float32, over "
                f"the {size_text(max_output_bytes)} budget; use output='top_k' (reduced on the "
                "device) or raise max_output_bytes (the command's --max-output-gib)"
            )
    return plan_slots, global_batch, group, mesh


@contextlib.contextmanager
def _explained_data_errors(source):
    try:
        yield
    except (tf.errors.OpError, UnicodeDecodeError) as error:
        explained = pipeline.explain_pipeline_error(error, source.files, replay=source.replay)
        if explained is None:
            raise
        raise explained from None


def _check_classifier_arguments(given: dict):
    """The masked LM's arguments mean nothing to a classifier: refused, never ignored."""
    defaults = inspect.signature(predict).parameters
    for name, value in given.items():
        if value != defaults[name].default:
            raise InputError(
                f"kroberta.predict: {name}={value!r} is for a masked LM; a fine-tuned "
                "classifier predicts its probabilities (or values) from texts and takes "
                "only batch_size (for embeddings, predict with the pretrained model)"
            )


def predict(
    model,
    inputs,
    output="top_k",
    k=5,
    positions="masked",
    batch_size=None,
    slots=None,
    max_output_bytes=DEFAULT_MAX_OUTPUT_BYTES,
    batches_per_dispatch=None,
):
    """Predicts with a kroberta model, reduced on the devices.

    A fine-tuned classifier (`kroberta.finetune`'s, `kroberta.load`'s) takes texts
    instead, through the same compiled program: `predict(classifier, ["a text", ...])` (a
    pair task: two lists) returns {"probabilities": (N, K) float32, "labels": N class
    names}, or for regression {"values": (N,) float32}; of the other arguments it reads
    only `batch_size` (default 32).

    Args:
        model: a masked LM or a fine-tuned classifier (`kroberta.load(path)`).
        inputs: a TFRecord path (str or `pathlib.Path`), glob or list of them; a
            `tf.data.Dataset` of dicts (batched or not); a dict of numpy arrays
            `input_ids` (N, L), `attention_mask` (N, L) and optionally `labels`
            (N, L) (keras-hub's names `token_ids` / `padding_mask` too); or a bare
            (N, L) array of token ids (the pad id's positions are padding).
        output: "top_k", "logits", "loss" or "embeddings".
        k: candidates per position for "top_k".
        positions: "masked" (where the input holds <mask>, or where labels are
            not -100 when labels are given; M slots per sequence) or "all" (M = L).
        batch_size: sequences per step over all devices (rounded up to a
            multiple of the device count); default: the training batch.
        slots: M for positions="masked"; default: the training config's.
        max_output_bytes: refuse "logits" results larger than this.
        batches_per_dispatch: batches computed by one compiled dispatch; default:
            the training config's `train.steps_per_execution` ("auto": from the
            model's forward FLOPs and the devices' peak), at most what the inputs need.

    Returns:
        A dict of numpy arrays with one row per input example, in input order:
        top_k: token_ids int32 [N, M, k] and log_probs float32 [N, M, k], best
        first; logits: logits float32 [N, M, V]; loss: loss, masked_accuracy
        float32 [N] and num_predictions int32 [N]; embeddings: embeddings
        float32 [N, hidden]. Except for embeddings, also positions int32 [N, M]
        and valid bool [N, M] (which slots hold a real position).
    """
    masked_lm_arguments = dict(
        output=output,
        k=k,
        positions=positions,
        slots=slots,
        max_output_bytes=max_output_bytes,
        batches_per_dispatch=batches_per_dispatch,
    )
    if predict_program.is_classifier(model):
        _check_classifier_arguments(masked_lm_arguments)
        return predict_texts(model, inputs, batch_size or 32)
    chunks, held = [], 0
    for chunk in predict_batches(model, inputs, batch_size=batch_size, **masked_lm_arguments):
        held += sum(a.nbytes for a in chunk.values())
        if held > max_output_bytes:
            # Inputs of unknown length (a dataset) are only measured as they arrive.
            raise InputError(
                f"the {output!r} result passed the {size_text(max_output_bytes)} budget after "
                f"{sum(len(c['valid' if 'valid' in c else output]) for c in chunks)} examples; use "
                "output='top_k', predict_batches() to stream, or raise max_output_bytes"
            )
        chunks.append(chunk)
    if not chunks:
        raise InputError("the inputs hold no examples")
    return {name: np.concatenate([c[name] for c in chunks]) for name in chunks[0]}
