"""What a user may pass to the model's Keras `fit` / `evaluate` / `predict`, and the checks.

keras-hub's functional `RobertaMaskedLM` knows only `token_ids`, `padding_mask` and
`mask_positions`. `kroberta.MaskedLM` also takes Hugging Face's names (`input_ids`,
`attention_mask`), a bare (batch, length) array of token ids and no `mask_positions`
(every position is predicted, as Hugging Face's `RobertaForMaskedLM` does):
`model_inputs` completes and renames them. `check_arrays` refuses, before Keras
starts, in-memory inputs that a gather would silently clamp (ids outside the
vocabulary, positions outside the sequence) or that are text.
"""

import keras
import numpy as np

from kroberta.errors import InputError
from kroberta.masking import STEP_INPUTS
from kroberta.tokens import PAD_ID

# Hugging Face's input names -> keras-hub's.
HF_NAMES = {"input_ids": "token_ids", "attention_mask": "padding_mask"}
MODEL_INPUTS = ("token_ids", "padding_mask", "mask_positions")
WHAT_TO_PASS = (
    "pass a (batch, length) array of token ids, or a dict with 'token_ids' (or "
    "'input_ids'), optionally 'padding_mask' (or 'attention_mask') and 'mask_positions' "
    "(batch, slots); or use kroberta.predict(model, ...) for top-k, loss or embeddings "
    "reduced on the device"
)


def model_inputs(x, where: str = "model.predict") -> dict:
    """The three model inputs from what a user passed (tensors or tf.data elements too).

    Args:
        x: token ids (batch, length), or a dict with keras-hub's or Hugging Face's names.
        where: the call that errors name.

    Returns:
        {"token_ids" (B, L), "padding_mask" (B, L), "mask_positions" (B, M)}, int32;
        mask_positions defaults to every position (M = L).
    """
    if not isinstance(x, dict):
        x = {"token_ids": x}
    unknown = sorted(set(x) - set(MODEL_INPUTS) - set(HF_NAMES))
    drawn = [name for name in unknown if name in STEP_INPUTS]
    if drawn:  # kroberta.dataset's default batches, for a model compiled without a masker
        raise InputError(
            f"{where}: the batches carry {drawn[0]!r}, from which a training run's step masks "
            "them, and this model was compiled without that step's masker; give "
            "kroberta.dataset(config, masks_on_host=True) (batches masked on the host, with "
            "their labels)"
        )
    if unknown:
        raise InputError(f"{where}: unknown input(s) {unknown}; {WHAT_TO_PASS}")
    renamed = {}
    for name, value in x.items():
        key = HF_NAMES.get(name, name)
        if key in renamed:
            raise InputError(f"{where}: {key!r} given twice (as {name!r} too)")
        renamed[key] = value
    if "token_ids" not in renamed:
        raise InputError(f"{where}: no token ids; {WHAT_TO_PASS}")
    token_ids = keras.ops.cast(renamed["token_ids"], "int32")
    if len(token_ids.shape) != 2:
        raise InputError(
            f"{where}: token ids must be (batch, length), got shape {tuple(token_ids.shape)}"
        )
    padding_mask = renamed.get("padding_mask")
    if padding_mask is None:  # the positions of <pad>
        padding_mask = keras.ops.not_equal(token_ids, PAD_ID)
    positions = renamed.get("mask_positions")
    if positions is None:
        length = token_ids.shape[1]
        positions = keras.ops.broadcast_to(
            keras.ops.arange(length, dtype="int32")[None, :], keras.ops.shape(token_ids)
        )
    return {
        "token_ids": token_ids,
        "padding_mask": keras.ops.cast(padding_mask, "int32"),
        "mask_positions": keras.ops.cast(positions, "int32"),
    }


def check_arrays(
    x, sequence_length: int, vocabulary_size: int, where: str = "model.predict"
) -> dict:
    """Eager checks of in-memory inputs (an array, or a dict of arrays or lists), before
    Keras starts; returns them completed by `model_inputs`, as numpy arrays."""
    if isinstance(x, np.ndarray):
        x = {"token_ids": x}
    x = {k: np.asarray(v) if isinstance(v, (list, tuple)) else v for k, v in x.items()}
    for name, value in x.items():
        if isinstance(value, np.ndarray) and value.dtype.kind in "USO":
            raise InputError(
                f"{where}: {name!r} holds strings, not token ids; "
                "kroberta.fill_mask(model, texts) fills <mask> in text, and "
                "model.tokenizer.encode(text).ids gives a text's ids"
            )
    completed = model_inputs(x, where=where)
    length = np.shape(x.get("token_ids", x.get("input_ids")))[-1]
    # Out of range, an id or a position would be clamped by a gather: a wrong answer.
    limits = {
        "token_ids": (vocabulary_size, "the vocabulary"),
        "mask_positions": (length, "the sequence's positions"),
    }
    for name, value in x.items():
        shape = np.shape(value)
        if len(shape) != 2:
            raise InputError(f"{where}: {name!r} must be 2-D (batch, ...), got shape {shape}")
        key = HF_NAMES.get(name, name)
        if key != "mask_positions" and shape[1] > sequence_length:
            raise InputError(
                f"{where}: {name!r} holds {shape[1]} positions but the model reads at "
                f"most {sequence_length} (model.max_sequence_length)"
            )
        limit = limits.get(key)
        if limit is not None and isinstance(value, np.ndarray) and value.size:
            bad = np.argwhere((value < 0) | (value >= limit[0]))
            if len(bad):
                at = ", ".join(str(int(i)) for i in bad[0])
                raise InputError(
                    f"{where}: {name}[{at}] = {int(value[tuple(bad[0])])} is outside "
                    f"{limit[1]} [0, {limit[0]})"
                )
    return {name: np.asarray(value) for name, value in completed.items()}
