"""Logit parity with Hugging Face `transformers` (needs torch and transformers; skipped without).

Both directions are checked at every non-padding position of a right-padded batch:
kroberta -> `RobertaForMaskedLM.from_pretrained` and `save_pretrained` -> `kroberta.load`.
"""

import dataclasses
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing in these tests may download
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="HF parity tests need torch (pip install torch==2.13.0)"
)
transformers = pytest.importorskip("transformers", reason="HF parity tests need transformers")

import kroberta  # noqa: E402
from kroberta.config import ModelConfig  # noqa: E402
from kroberta.interop import hf  # noqa: E402
from kroberta.model.mlm import build_model  # noqa: E402

# The seed configuration and a tiny one, started as RoBERTa (and Hugging Face's default,
# which an import records) at 0.02.
SEED = ModelConfig(
    vocabulary_size=10000,
    num_layers=3,
    num_heads=6,
    hidden_dim=300,
    intermediate_dim=600,
    max_sequence_length=64,
    dropout=0.0,
    initializer_range=0.02,
)
TINY = ModelConfig(
    vocabulary_size=300,
    num_layers=2,
    num_heads=2,
    hidden_dim=16,
    intermediate_dim=32,
    max_sequence_length=16,
    dropout=0.0,
    initializer_range=0.02,
)
CONFIGS = {"seed": SEED, "tiny": TINY}
TOLERANCE = 1e-4  # float32; measured ~2e-7 (tiny) and ~2.5e-6 (seed), logits of std ~0.1-0.5


def randomized_model(model_config, seed=0):
    """Random weights with nonzero biases and non-unit LayerNorm scales (so every tensor matters)."""
    model = build_model(model_config, seed=seed)
    rng = np.random.default_rng(seed)
    for v in model.weights:
        v.assign((np.asarray(v.value) + rng.normal(0, 0.02, v.shape)).astype("float32"))
    return model


def padded_batch(model_config, seed=0):
    """(token_ids, attention_mask): right-padded with <pad>=1, starting with <s>=0, ending with </s>=2."""
    rng = np.random.default_rng(seed)
    L = model_config.max_sequence_length
    lengths = [L, L // 2, 3, L - 1]  # 4 rows: divisible by the 4 simulated devices
    ids = rng.integers(5, model_config.vocabulary_size, (len(lengths), L)).astype("int32")
    mask = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
        ids[row, 0], ids[row, n - 1] = 0, 2
    ids[mask == 0] = 1  # HF derives position ids from the pad token, so padding must be <pad>
    return ids, mask


def kroberta_logits(model, ids, mask):
    positions = np.broadcast_to(np.arange(ids.shape[1], dtype="int32"), ids.shape)
    # One compiled call: faster here than the first eager call, which compiles op by op.
    return np.asarray(
        model.predict_on_batch(
            {"token_ids": ids, "padding_mask": mask, "mask_positions": positions}
        )
    )  # (batch, length, vocab)


def hf_logits(hf_model, ids, mask):
    hf_model.eval()
    with torch.no_grad():
        out = hf_model(
            input_ids=torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.long),
        )
    return out.logits.numpy()  # (batch, length, vocab)


def max_diff_at_real_tokens(a, b, mask):
    return float(np.abs(a - b)[mask == 1].max())


def load_hf(directory):
    model, info = transformers.RobertaForMaskedLM.from_pretrained(
        directory, output_loading_info=True
    )
    assert not info["missing_keys"], info
    assert not info["unexpected_keys"], info
    assert not info["mismatched_keys"], info
    return model


@pytest.mark.parametrize("name", list(CONFIGS))
def test_export_matches_transformers_logits(name, tmp_path):
    model_config = CONFIGS[name]
    model = randomized_model(model_config)
    hf_model = load_hf(hf.export_hf(model, str(tmp_path)))
    ids, mask = padded_batch(model_config)
    theirs, ours = hf_logits(hf_model, ids, mask), kroberta_logits(model, ids, mask)
    assert ours.shape == theirs.shape == (*ids.shape, model_config.vocabulary_size)
    diff = max_diff_at_real_tokens(ours, theirs, mask)
    print(f"export {name}: max |logit diff| = {diff:.3g}")
    assert diff < TOLERANCE


# "tiny" keeps RobertaConfig()'s default layer_norm_eps (1e-12), as every model built from
# transformers' defaults has it.
@pytest.mark.parametrize("name, type_vocab_size, epsilon", [("seed", 1, 1e-5), ("tiny", 2, None)])
def test_load_of_a_transformers_directory_matches_its_logits(
    name, type_vocab_size, epsilon, tmp_path
):
    m = CONFIGS[name]
    torch.manual_seed(0)
    hf_config = transformers.RobertaConfig(
        vocab_size=m.vocabulary_size,
        hidden_size=m.hidden_dim,
        num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_heads,
        intermediate_size=m.intermediate_dim,
        max_position_embeddings=m.max_sequence_length + 2,
        type_vocab_size=type_vocab_size,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        **({} if epsilon is None else {"layer_norm_eps": epsilon}),
    )
    m = dataclasses.replace(m, layer_norm_epsilon=hf_config.layer_norm_eps)
    hf_model = transformers.RobertaForMaskedLM(hf_config)
    with torch.no_grad():  # HF initialises biases to 0 and LayerNorm to 1: perturb all
        for p in hf_model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    hf_model.save_pretrained(str(tmp_path))
    model = kroberta.load(str(tmp_path))
    assert model.kroberta_config.model == m
    ids, mask = padded_batch(m, seed=1)
    diff = max_diff_at_real_tokens(
        kroberta_logits(model, ids, mask), hf_logits(hf_model, ids, mask), mask
    )
    print(f"import {name}: max |logit diff| = {diff:.3g}")
    assert diff < TOLERANCE
    # Exported again, the epsilon goes back with the weights.
    again = load_hf(hf.export_hf(model, str(tmp_path / "again")))
    assert again.config.layer_norm_eps == hf_config.layer_norm_eps
    diff = max_diff_at_real_tokens(
        hf_logits(again, ids, mask), hf_logits(hf_model, ids, mask), mask
    )
    assert diff < TOLERANCE


def test_round_trip_through_transformers_is_exact(tmp_path):
    model = randomized_model(TINY)
    hf_model = load_hf(hf.export_hf(model, str(tmp_path / "a")))
    hf_model.save_pretrained(str(tmp_path / "b"))  # transformers writes its own file
    back = kroberta.load(str(tmp_path / "b"))
    mine = {v.path: np.asarray(v.value) for v in model.weights}
    theirs = {v.path: np.asarray(v.value) for v in back.weights}
    assert mine.keys() == theirs.keys()
    for key in mine:
        np.testing.assert_array_equal(mine[key], theirs[key], err_msg=key)


def test_init_from_hf_matches_transformers(tmp_path):
    source = randomized_model(TINY, seed=3)
    hf_model = load_hf(hf.export_hf(source, str(tmp_path)))
    model = hf.init_from_hf(build_model(TINY, seed=0), str(tmp_path))
    ids, mask = padded_batch(TINY)
    assert (
        max_diff_at_real_tokens(
            kroberta_logits(model, ids, mask), hf_logits(hf_model, ids, mask), mask
        )
        < TOLERANCE
    )


def test_pytorch_bin_is_read_with_torch(tmp_path):
    model = randomized_model(TINY)
    hf_model = load_hf(hf.export_hf(model, str(tmp_path / "a")))
    # transformers 5 always saves safetensors; an old-style checkpoint is a pickled state
    # dict, tied lm_head.decoder.weight/bias included.
    (tmp_path / "b").mkdir()
    os.link(tmp_path / "a" / "config.json", tmp_path / "b" / "config.json")
    torch.save(hf_model.state_dict(), tmp_path / "b" / "pytorch_model.bin")
    back = kroberta.load(str(tmp_path / "b"))
    for a, b in zip(model.weights, back.weights):
        np.testing.assert_array_equal(np.asarray(a.value), np.asarray(b.value), err_msg=a.path)


def test_auto_tokenizer_encodes_like_tokenizers(tmp_path):
    from tests.interop.test_hf_no_torch import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    hf.export_hf(randomized_model(TINY), str(tmp_path), tokenizer=tokenizer)
    auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    for text in ("hello <mask>", "hello <mask> world", " the cat sat\non the mat"):
        assert auto(text)["input_ids"] == tokenizer.encode(text).ids, text
    assert (
        auto.bos_token_id,
        auto.pad_token_id,
        auto.eos_token_id,
        auto.unk_token_id,
        auto.mask_token_id,
    ) == (0, 1, 2, 3, 4)
    assert auto.model_max_length == TINY.max_sequence_length
