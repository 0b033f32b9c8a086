"""Task-adaptive pretraining (TAPT, Gururangan et al. 2020): before fine-tuning, the masked
LM goes on training on the task's own training texts (their labels unused).

The texts are tokenised with the model's tokenizer and packed into full sequences of the
fine-tune's length as pretraining packs documents (`kroberta.text.packing`: each text a
document, `<s> a </s> b </s> ...`); the model's own masked-LM training step
(`kroberta.MaskedLM`) draws dynamic masks from one key per sequence as a run does, with
the run's masking (`data.mask_rate`, whole words, slots) and the run's optimizer (peak
learning rate, betas, epsilon, weight decay, clipping) on Gururangan's TAPT schedule:
6% linear warmup, then linear decay to 0 over the steps. Batches are the fine-tune's
size; the sequences are shuffled anew on each pass over them. The loss before and after
is measured on the same masks of the packed texts (the training masks of the first pass).
"""

import dataclasses
import logging

import numpy as np

from kroberta import masking
from kroberta.model.mlm import build_model, build_optimizer
from kroberta.text.packing import pack_documents
from kroberta.text.tokenizer import special_token_ids, word_start_table

WARMUP_FRACTION = 0.06  # Gururangan et al.'s TAPT schedule: 6% warmup, linear decay

logger = logging.getLogger(__name__)


def task_sequences(tokenizer, texts: tuple, length: int) -> tuple:
    """(token_ids (n, length), padding_mask (n, length)) int32: every text of `texts` (one
    list per text field) a document, packed as pretraining packs them."""
    specials = special_token_ids(tokenizer)
    documents = [
        encoding.ids
        for field in texts
        for encoding in tokenizer.encode_batch(list(field), add_special_tokens=False)
    ]
    rows = list(
        pack_documents(documents, length, specials["bos"], specials["eos"], specials["pad"])
    )
    return (
        np.stack([ids for ids, _ in rows]).astype(np.int32),
        np.stack([mask for _, mask in rows]).astype(np.int32),
    )


def adapt(model, sequences: tuple, steps: int, batch_size: int, seed: int) -> tuple:
    """Trains a copy of `model` (a `kroberta.MaskedLM`, left as it is) for `steps`
    masked-LM steps on `sequences` (`task_sequences`); returns (the copy's backbone
    weights as host arrays, {"loss_before", "loss_after"} on the first pass's masks).
    Runs under the current distribution (`batch_size` a multiple of its devices)."""
    # start-up: TensorFlow loads for the batches, as in `encoding.dataset`
    import tensorflow as tf

    config = model.kroberta_config
    tokenizer = model.tokenizer
    specials = special_token_ids(tokenizer)
    data = dataclasses.replace(
        config.data,
        pad_token_id=specials["pad"],
        mask_token_id=specials["mask"],
        special_token_ids=tuple(sorted(set(specials.values()))),
    )
    train = dataclasses.replace(
        config.train,
        steps=steps,
        warmup_fraction=WARMUP_FRACTION,
        warmup_steps=0,
        schedule="linear",
        min_learning_rate=0.0,
        gradient_accumulation_steps=1,
    )
    vocabulary = config.model.vocabulary_size
    word_starts = word_start_table(tokenizer, vocabulary) if data.whole_word_masking else None
    twin = build_model(config.model, seed=seed, config=config, tokenizer=tokenizer)
    twin.set_weights([np.asarray(w) for w in model.get_weights()])
    twin.compile(
        optimizer=build_optimizer(train),
        masker=masking.masker(data, vocabulary, word_starts),
        jit_compile=True,
    )

    token_ids, padding_mask = sequences  # (n, length) each
    count = len(token_ids)
    rng = np.random.default_rng(seed)
    passes = -(-steps * batch_size // count)
    order = np.concatenate([rng.permutation(count) for _ in range(passes)])[: steps * batch_size]
    # One key per sequence of the stream: a sequence seen again gets new masks.
    keys = masking.element_keys(seed, np.arange(len(order), dtype=np.int64))

    def batches(rows, row_keys):
        return (
            tf.data.Dataset.from_tensor_slices((rows, row_keys))
            .batch(batch_size, drop_remainder=True)
            .map(
                lambda r, k: {
                    "token_ids": tf.gather(token_ids, r),
                    "padding_mask": tf.gather(padding_mask, r),
                    masking.KEYS: k,
                }
            )
        )

    # The loss on the first pass's batches (at least one), before and after.
    measured = max(batch_size, count // batch_size * batch_size)
    probe = batches(order[:measured], keys[:measured])
    before = twin.evaluate(probe, verbose=0, return_dict=True)["loss"]
    twin.fit(batches(order, keys), epochs=1, verbose=0, shuffle=False)
    after = twin.evaluate(probe, verbose=0, return_dict=True)["loss"]
    logger.info(
        "task-adaptive pretraining: %d masked-LM steps on %d sequences of the training "
        "texts: loss %.4f -> %.4f",
        steps,
        count,
        before,
        after,
    )
    return (
        [np.asarray(w) for w in twin.backbone.get_weights()],
        {"loss_before": float(before), "loss_after": float(after)},
    )
