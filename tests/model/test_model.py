import math

import keras
import keras_hub
import numpy as np
import pytest

import kroberta
from kroberta.config import Config, ModelConfig, to_toml
from kroberta.errors import KrobertaError
from kroberta.model.metrics import MaskedAccuracy, MaskedLMLoss, Perplexity
from kroberta.model.mlm import build_compiled_model, build_model
from kroberta.perf.plan import for_local_devices
from kroberta.training import final_model

TINY = ModelConfig(
    vocabulary_size=200,
    num_layers=2,
    num_heads=2,
    hidden_dim=16,
    intermediate_dim=32,
    max_sequence_length=16,
    dropout=0.0,
)


def _batch(batch=4, length=16, slots=5, vocab=200, seed=0):
    rng = np.random.default_rng(seed)
    x = {
        "token_ids": rng.integers(5, vocab, (batch, length)).astype("int32"),
        "padding_mask": np.ones((batch, length), "int32"),
        "mask_positions": rng.integers(1, length, (batch, slots)).astype("int32"),
    }
    labels = rng.integers(5, vocab, (batch, slots)).astype("int32")
    labels[:, -2:] = -100  # two padded slots per sequence
    return x, labels


def test_logits_exist_only_at_the_prediction_slots():
    model = build_model(TINY, seed=0)
    x, _ = _batch()
    assert model(x).shape == (4, 5, 200)


def test_loss_is_the_mean_over_real_masked_slots_only():
    model = build_model(TINY, seed=0)
    x, labels = _batch()
    logits = np.asarray(model(x), np.float64)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    real = labels != -100
    expected = -np.mean([log_probs[b, s, labels[b, s]] for b, s in zip(*np.nonzero(real))])
    loss = float(MaskedLMLoss()(labels, logits.astype("float32")))
    assert loss == pytest.approx(expected, rel=1e-5)
    # At initialisation the loss is about ln(V), not diluted by the padded slots.
    assert abs(loss - math.log(200)) < 0.5


def test_loss_of_a_batch_without_labels_is_zero_not_nan():
    logits = np.zeros((2, 3, 10), "float32")
    assert float(MaskedLMLoss()(np.full((2, 3), -100), logits)) == 0.0


def test_accuracy_and_perplexity_ignore_padded_slots():
    logits = np.full((1, 3, 4), -10.0, "float32")
    logits[0, 0, 1] = logits[0, 1, 2] = logits[0, 2, 3] = 10.0
    labels = np.array([[1, 0, -100]])  # right, wrong, padding
    accuracy, perplexity = MaskedAccuracy(), Perplexity()
    accuracy.update_state(labels, logits)
    perplexity.update_state(labels, logits)
    assert float(accuracy.result()) == pytest.approx(0.5)
    uniform = Perplexity()
    uniform.update_state(labels, np.zeros((1, 3, 4), "float32"))
    assert float(uniform.result()) == pytest.approx(4.0, rel=1e-5)


def test_head_is_tied_to_the_token_embedding():
    model = build_model(TINY, seed=0)
    head_kernels = [w for w in model.masked_lm_head.weights if "embeddings" in w.path]
    assert head_kernels and head_kernels[0] is model.backbone.token_embedding.embeddings


def test_same_seed_same_initial_weights():
    a, b = build_model(TINY, seed=3), build_model(TINY, seed=3)
    for wa, wb in zip(a.weights, b.weights):
        np.testing.assert_array_equal(np.asarray(wa.value), np.asarray(wb.value))


def test_initializer_range_scales_every_kernel_and_embedding_and_nothing_else():
    import dataclasses

    stock = build_model(dataclasses.replace(TINY, initializer_range=0.02), seed=0)
    wide = build_model(dataclasses.replace(TINY, initializer_range=0.1), seed=0)
    scaled = 0
    for a, b in zip(stock.weights, wide.weights):
        assert a.path == b.path
        if a.path.endswith(("/kernel", "/embeddings")):
            # keras-hub's own start (truncated at 2 std: std 0.88 x 0.02; small samples vary)...
            assert 0.75 * 0.02 < float(np.std(a.numpy())) < 1.0 * 0.02, a.path
            # ...and the same draw, five times wider.
            np.testing.assert_allclose(b.numpy(), 5.0 * a.numpy(), rtol=1e-6, err_msg=a.path)
            scaled += 1
        else:  # biases 0, LayerNorm scales 1 and offsets 0, as keras-hub starts them
            np.testing.assert_array_equal(b.numpy(), a.numpy(), err_msg=a.path)
    # token and position tables, q/k/v/output and two feed-forward kernels per layer, the head's dense
    assert scaled == 2 + 6 * TINY.num_layers + 1


def test_get_config_round_trip():
    model = build_model(TINY, seed=0)
    clone = keras_hub.models.RobertaMaskedLM.from_config(model.get_config())
    assert clone.backbone.get_config() == model.backbone.get_config()
    assert [w.shape for w in clone.weights] == [w.shape for w in model.weights]


def test_save_and_load_give_identical_predictions(tmp_path):
    config = Config(model=TINY, run_dir=str(tmp_path))
    model = build_compiled_model(for_local_devices(config))
    (tmp_path / "config.toml").write_text(to_toml(config))
    final_model.save(model, str(tmp_path))
    loaded = kroberta.load(str(tmp_path))
    x, _ = _batch()
    np.testing.assert_allclose(np.asarray(loaded(x)), np.asarray(model(x)), atol=1e-6)
    assert loaded.kroberta_config.model == TINY and loaded.tokenizer is None


def test_save_refuses_a_run_of_another_shape_and_arguments_of_the_wrong_kind(tmp_path):
    import dataclasses

    import kroberta
    from kroberta.errors import ArgumentKindError, InputError

    other = dataclasses.replace(TINY, hidden_dim=32, intermediate_dim=64)
    (tmp_path / "config.toml").write_text(to_toml(Config(model=other, run_dir=str(tmp_path))))
    model = build_model(TINY, config=Config(model=TINY))
    with pytest.raises(
        InputError,
        match=r"kroberta.save: .* holds a run of another model "
        r"\(hidden_dim 32 there, 16 here; intermediate_dim 64 "
        r"there, .* here\); save into a new directory",
    ):
        kroberta.save(model, str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"]  # nothing written
    with pytest.raises(
        ArgumentKindError,
        match=r"kroberta.save: the model first, then the "
        r"path: kroberta.save\(model, run_dir\)",
    ):
        kroberta.save(str(tmp_path), model)
    with pytest.raises(
        ArgumentKindError,
        match=r"kroberta.save: run_dir: expected a directory's "
        r"path, got int",
    ):
        kroberta.save(model, 3)
    with pytest.raises(ArgumentKindError, match=r"kroberta.save: expected a model"):
        kroberta.save("runs/x", "runs/y")
    with pytest.raises(
        ArgumentKindError,
        match=r"kroberta.report: expected a run directory's "
        r"path, got MaskedLM",
    ):
        kroberta.report(model)
    with pytest.raises(KrobertaError, match=r"data: give a prepared directory .* got MaskedLM"):
        kroberta.evaluate(model, model)


def test_load_of_an_unfinished_run_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a finished kroberta run") as raised:
        kroberta.load(str(tmp_path))
    assert isinstance(raised.value, KrobertaError)  # `except KrobertaError` catches it
    with pytest.raises(KrobertaError, match="no such directory"):
        kroberta.load(str(tmp_path / "nothing"))
    # A file of the run, and a directory of another kind, say what to give instead.
    (tmp_path / "model.weights.h5").write_text("")
    with pytest.raises(
        KrobertaError,
        match=rf"model.weights.h5: a file, not a directory; "
        rf"give the directory that holds it \({tmp_path}\)",
    ):
        kroberta.load(str(tmp_path / "model.weights.h5"))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(
        KrobertaError,
        match=r"config.toml is missing\), and no config.json of a "
        r"Hugging Face model or keras-hub preset",
    ):
        kroberta.load(str(tmp_path))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text("{}")
    with pytest.raises(
        KrobertaError,
        match=r"prepared data \(python -m kroberta.prepare's output\), "
        r"not a model",
    ):
        kroberta.load(str(tmp_path / "data"))
    step = tmp_path / "checkpoints" / "step_00000020"
    step.mkdir(parents=True)
    with pytest.raises(
        KrobertaError,
        match=rf"a checkpoint of the run {tmp_path}: give the "
        rf"run \(kroberta.load\('{tmp_path}', checkpoint=20\)",
    ):
        kroberta.load(str(step))
    (tmp_path / "config.toml").write_text("")
    with pytest.raises(KrobertaError, match=r"checkpoint: expected None.*got 'latest'"):
        kroberta.load(str(tmp_path), checkpoint="latest")


def test_mixed_precision_keeps_float32_weights_and_bf16_compute():
    model = build_model(TINY, mixed_precision=True, seed=0, config=Config(model=TINY))
    assert all(w.dtype == "float32" for w in model.trainable_weights)
    assert model.backbone.dtype_policy.compute_dtype == "bfloat16"
    # kroberta.load(run, mixed_precision=True) of a float32 run: the config says bf16 too.
    assert model.kroberta_config.train.mixed_precision is True
    x, labels = _batch()
    assert np.isfinite(float(MaskedLMLoss()(labels, model(x))))


def test_weight_decay_spares_biases_and_layer_norms():
    model = build_compiled_model(for_local_devices(Config(model=TINY)))
    optimizer = model.optimizer
    decayed = {v.path for v in model.trainable_variables if optimizer._use_weight_decay(v)}
    assert any("kernel" in p for p in decayed)
    assert not any(p.endswith(("bias", "gamma", "beta")) for p in decayed)
    assert isinstance(optimizer, keras.optimizers.AdamW)


def test_cross_entropy_and_its_gradient_equal_keras_sparse_cross_entropy():
    import jax

    from kroberta.model.metrics import sparse_cross_entropy

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 4, 50)).astype("float32") * 3
    targets = rng.integers(0, 50, (3, 4)).astype("int32")
    weights = rng.random((3, 4)).astype("float32")

    def ours(x):
        return (sparse_cross_entropy(x, targets) * weights).sum()

    def reference(x):
        return (
            keras.ops.sparse_categorical_crossentropy(targets, x, from_logits=True) * weights
        ).sum()

    np.testing.assert_allclose(ours(logits), reference(logits), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(ours)(logits), jax.grad(reference)(logits), atol=1e-6)
    # Under jit and vmap-free batching as in the train step.
    np.testing.assert_allclose(
        jax.jit(jax.grad(ours))(logits), jax.grad(reference)(logits), atol=1e-6
    )


def test_accuracy_counts_the_label_at_the_row_maximum():
    logits = np.zeros((1, 2, 5), "float32")
    logits[0, 0, 3] = 1.0
    accuracy = MaskedAccuracy()
    accuracy.update_state(np.array([[3, 2]]), logits)  # right; a five-way tie at 0
    assert float(accuracy.result()) == pytest.approx(1.0)
    accuracy.update_state(np.array([[4, -100]]), logits)  # wrong; padding
    assert float(accuracy.result()) == pytest.approx(2 / 3)
