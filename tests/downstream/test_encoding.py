"""Tokenising as RoBERTa (a pair as <s> a </s></s> b </s>) and padding into fixed buckets."""

import numpy as np

from kroberta.downstream import encoding


def test_bucket_lengths_are_few_and_capped():
    assert encoding.bucket_lengths(512) == (64, 128, 256, 512)
    assert encoding.bucket_lengths(16) == (8, 16)
    assert encoding.bucket_lengths(12) == (8, 12)


def test_a_pair_is_encoded_as_roberta_and_truncated(downstream_model):
    tokenizer = downstream_model.tokenizer
    ids = {t: tokenizer.token_to_id(t) for t in ("<s>", "</s>")}
    encoded = encoding.encode(tokenizer, (["The apple"], ["The river"]), np.zeros(1, np.int32), 32)
    tokens = [tokenizer.id_to_token(i) for i in encoded.ids[0]]
    assert tokens == ["<s>", "The", "Ġapple", "</s>", "</s>", "The", "Ġriver", "</s>"]
    assert encoded.ids[0][0] == ids["<s>"] and encoded.pad_id == tokenizer.token_to_id("<pad>")
    long = encoding.encode(tokenizer, ([" ".join(["The apple"] * 40)],), np.zeros(1, np.int32), 16)
    assert len(long.ids[0]) == 16 and long.ids[0][-1] == ids["</s>"]
    # The model's tokenizer itself is left as it was (no truncation, no padding set).
    assert tokenizer.truncation is None


def test_batches_are_full_bucketed_and_padding_rows_weigh_nothing(downstream_model):
    texts = ["The apple"] * 5 + [" ".join(["The apple river"] * 4)] * 3
    labels = np.arange(8, dtype=np.int32)
    encoded = encoding.encode(downstream_model.tokenizer, (texts,), labels, 16)
    batches = encoding.batches(encoded, 4, 16)
    assert [x["token_ids"].shape for x, *_ in batches] == [(4, 8), (4, 8), (4, 16)]
    rows = np.concatenate([b[3] for b in batches])
    assert sorted(rows[rows >= 0].tolist()) == list(range(8))
    for x, batch_labels, weights, where in batches:
        np.testing.assert_array_equal(weights, (where >= 0).astype(np.float32))
        np.testing.assert_array_equal(batch_labels[where >= 0], labels[where[where >= 0]])
        np.testing.assert_array_equal(
            x["padding_mask"].sum(1)[where >= 0], [len(encoded.ids[i]) for i in where[where >= 0]]
        )
    shuffled = encoding.batches(encoded, 4, 16, seed=3)
    again = encoding.batches(encoded, 4, 16, seed=3)
    assert [b[3].tolist() for b in shuffled] == [b[3].tolist() for b in again]
    data, data_rows = encoding.dataset(encoded, 4, 16, seed=3)
    assert data_rows.tolist() == np.concatenate([b[3] for b in shuffled]).tolist()
    first = next(iter(data))
    np.testing.assert_array_equal(first[0]["token_ids"].numpy(), shuffled[0][0]["token_ids"])
