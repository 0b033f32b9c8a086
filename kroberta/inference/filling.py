"""Text in, the model's guesses for each <mask> out (Hugging Face fill-mask pipeline's shape)."""

import numbers

import numpy as np

from kroberta.errors import InputError
from kroberta.inference.prediction import predict
from kroberta.model.masked_lm import check_model

MASK_TOKEN = "<mask>"


def fill_mask(model, texts, top_k=5):
    """Fills every <mask> in each text with the model's `top_k` best tokens.

    Args:
        model: a model from `kroberta.load` whose run had a tokenizer.
        texts: one string or a list of strings, each with at least one "<mask>".
        top_k: candidates per mask.

    Returns:
        Like Hugging Face's fill-mask pipeline: for a text with one mask, a list of
        `{"score", "token", "token_str", "sequence"}` dicts (and `token_id`, the same as
        `token`), best first (score is a probability); for a text with several masks, one
        such list per mask. A single string gives that text's result; a list, a list of them.
    """
    check_model(model, "fill_mask")
    single = isinstance(texts, str)
    if not single:
        listed = isinstance(texts, (list, tuple))
        others = (
            sorted({type(t).__name__ for t in texts if not isinstance(t, str)}) if listed else []
        )
        if not listed or others:
            got = type(texts).__name__ + (f" holding {', '.join(others)}" if others else "")
            raise InputError(f"fill_mask: texts must be a string or a list of strings, got {got}")
    vocabulary = model.kroberta_config.model.vocabulary_size
    if (
        not isinstance(top_k, numbers.Integral)
        or isinstance(top_k, bool)
        or not 1 <= top_k <= vocabulary
    ):
        # Named as this function's argument, not as `predict`'s `k` it becomes.
        raise InputError(f"fill_mask: top_k must be an integer in [1, {vocabulary}], got {top_k!r}")
    tokenizer = model.tokenizer
    if tokenizer is None:
        raise InputError(
            "fill_mask needs a tokenizer: this model has none (a run trained "
            "with --data.dir from kroberta.prepare keeps one; a model from "
            "keras.saving.load_model has lost it: use kroberta.load)"
        )
    texts = [texts] if single else list(texts)
    if not texts:
        raise InputError("fill_mask: no texts given")
    length = model.kroberta_config.model.max_sequence_length
    mask_id = tokenizer.token_to_id(MASK_TOKEN)
    pad_id = tokenizer.token_to_id("<pad>")
    if mask_id is None or pad_id is None:
        raise InputError("fill_mask: the tokenizer has no <mask> or <pad> token")
    encodings = tokenizer.encode_batch(texts)  # adds <s> ... </s>
    ids = np.full((len(texts), length), pad_id, np.int32)
    attention = np.zeros((len(texts), length), np.int32)
    for row, (text, encoding) in enumerate(zip(texts, encodings)):
        if mask_id not in encoding.ids:
            raise InputError(f"fill_mask: text {row} has no {MASK_TOKEN}: {text[:80]!r}")
        if len(encoding.ids) > length:
            raise InputError(
                f"fill_mask: text {row} is {len(encoding.ids)} tokens, the "
                f"model takes at most {length}"
            )
        ids[row, : len(encoding.ids)] = encoding.ids
        attention[row, : len(encoding.ids)] = 1
    slots = int((ids == mask_id).sum(axis=1).max())
    out = predict(model, {"input_ids": ids, "attention_mask": attention}, k=top_k, slots=slots)
    results = [
        _answers(tokenizer, ids[row][attention[row] == 1], out, row) for row in range(len(texts))
    ]
    return results[0] if single else results


def _answers(tokenizer, real, out, row: int):
    """Text `row`'s candidates in Hugging Face's shape (a list per mask; the list when one),
    from `predict`'s top_k `out` of every text; `real`: its token ids, no padding."""
    per_mask = []
    for slot in np.flatnonzero(out["valid"][row]):
        position = int(out["positions"][row, slot])
        candidates = []
        for token_id, log_prob in zip(out["token_ids"][row, slot], out["log_probs"][row, slot]):
            filled = real.copy()
            filled[position] = token_id
            candidates.append(
                {
                    "token": int(token_id),  # Hugging Face's pipeline's name for the id
                    "token_id": int(token_id),
                    "token_str": tokenizer.decode([int(token_id)]),
                    "score": float(np.exp(log_prob)),
                    # Other masks stay as <mask>, as in Hugging Face's pipeline.
                    "sequence": tokenizer.decode(filled.tolist(), skip_special_tokens=False)
                    .replace("<s>", "")
                    .replace("</s>", ""),
                }
            )
        per_mask.append(candidates)
    return per_mask[0] if len(per_mask) == 1 else per_mask
