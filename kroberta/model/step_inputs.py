"""Batches the compiled step finishes: the host sends tokens, the device masks them.

With `data.masking = "dynamic"` the training and validation pipelines send each
sequence unmasked with one uint32 key (`kroberta.masking.element_keys`: a hash of the
run seed and the element's index), and the step draws the masks from it before the
model runs:

    x = {token_ids (B, L), padding_mask (B, L), mask_keys (B,) uint32}
      -> x = {token_ids (B, L) masked, padding_mask (B, L), mask_positions (B, M)},
         labels (B, M)

With `data.masking = "static"` the pipelines send the file's labels per position
instead, and the step chooses the prediction slots from them:

    x = {token_ids (B, L) as masked in the file, padding_mask (B, L), token_labels (B, L)}
      -> x = {token_ids, padding_mask, mask_positions (B, M)}, labels (B, M)

Either way with `kroberta.masking.masker`, the function the pipeline runs on the host
for `kroberta.dataset(..., masks_on_host=True)`, so the batches are the same bit for
bit. On an accelerator this takes microseconds per step, while on the host the hash,
the choice and the scatter were a fifth of the pipeline's CPU time at 512 tokens
(docs/design.md, "Device masking").

The training model's steps (`kroberta.model.masked_lm.MaskedLM`) call
`finish_batch` / `finish_inputs` with the run's masker first; a finished batch
(without `mask_keys` or `token_labels`) passes through unchanged.
"""

import keras

from kroberta.masking import KEYS, STEP_INPUTS, TOKEN_LABELS


def _step_input(x) -> str | None:
    """The entry from which the step finishes this batch (`STEP_INPUTS`), or None."""
    if isinstance(x, dict):
        found = [name for name in STEP_INPUTS if name in x]
        if len(found) > 1:
            raise ValueError(f"a batch carries both '{KEYS}' and '{TOKEN_LABELS}'; "
                             "it can be finished from one only")
        return found[0] if found else None
    return None


def finish_batch(mask, data):
    """`data` = (x, [y, [sample_weight]]) as the step receives it, finished: when x
    carries `mask_keys` or `token_labels`, (masked x, labels[, sample_weight]);
    otherwise `data` itself."""
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    entry = _step_input(x)
    if entry is None:
        return data
    if y is not None:
        raise ValueError(f"a batch with '{entry}' gets its labels from it in the step; "
                         "it also had labels")
    x, y = mask(x)
    return (x, y) if sample_weight is None else (x, y, sample_weight)


def finish_inputs(mask, x):
    """The model inputs of a prediction batch `x`: masked from its step input, if any."""
    return mask(x)[0] if _step_input(x) is not None else x
