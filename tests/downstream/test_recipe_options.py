"""The fine-tuning recipe's options (`--probe-epochs`, `--layer-decay`, `--adapt-steps`,
`--reinit-layers`): off they change nothing; on, each does what it says, is recorded,
is part of the trials' settings, and is refused in one line where it cannot apply."""

import dataclasses
import json

import keras
import numpy as np
import pytest

from kroberta.cli import finetune
from kroberta.downstream import adaptation, classifiers, finetuning, starts, trial
from kroberta.downstream.settings import FinetuneConfig
from kroberta.errors import InputError
from kroberta.run_layout import TRIALS_FILE
from tests.downstream.tasks import marker_task, sentences

ONE = dict(learning_rates=[3e-3], seeds=1, epochs=1, batch_size=32, max_length=16, widen=False)
OFF = dict(probe_epochs=0, layer_decay=1.0, adapt_steps=0, reinit_layers=0)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return marker_task(tmp_path_factory.mktemp("recipe_task"), train=96, validation=32)


@pytest.fixture(scope="module")
def plain(downstream_model, task):
    """The fine-tune with no option given (the recipe as it was)."""
    return finetuning.finetune(downstream_model, data=task[0], validation=task[1], **ONE)


def _weights_differ(a, b) -> bool:
    return any(x.shape != y.shape or not np.array_equal(x, y) for x, y in zip(a, b))


def _starts(monkeypatch) -> list:
    """The backbone weights each trial starts from, as they are handed to it."""
    seen, run_trial = [], trial.run_trial

    def recording(classifier, setup, start, *args):
        seen.append([np.array(w) for w in start])
        return run_trial(classifier, setup, start, *args)

    monkeypatch.setattr(trial, "run_trial", recording)
    return seen


def test_options_off_are_the_recipe_as_it_was(downstream_model, task, plain, monkeypatch, tmp_path):
    def never(*args, **kwargs):
        raise AssertionError("an option's code ran while the option was off")

    for module, name in ((adaptation, "adapt"), (trial, "train_head"), (starts, "reinitialised")):
        monkeypatch.setattr(module, name, never)
    out = tmp_path / "out"
    explicit = finetuning.finetune(
        downstream_model, data=task[0], validation=task[1], out=str(out), **ONE, **OFF
    )
    assert [t.scores for t in explicit.trials] == [t.scores for t in plain.trials]
    assert explicit.kept.predictions == plain.kept.predictions
    for a, b in zip(explicit.classifier.get_weights(), plain.classifier.get_weights()):
        np.testing.assert_array_equal(a, b)
    # Keras' own AdamW, as before; the trials' settings name no option (old logs resume).
    assert type(explicit.classifier.optimizer) is keras.optimizers.AdamW
    settings = json.loads((out / TRIALS_FILE).read_text().splitlines()[0])["settings"]
    assert set(settings) == {
        "task",
        "data",
        "epochs",
        "patience",
        "batch_size",
        "max_length",
        "start",
    }
    assert plain.recipe == OFF and plain.adaptation is None


def test_lp_ft_trains_the_head_alone_then_everything(downstream_model, task, plain, monkeypatch):
    phases, train_head = [], trial.train_head

    def watched(classifier, *args):
        before = [np.array(w) for w in classifier.get_weights()]
        body = len(classifier.backbone.get_weights())
        diverged = train_head(classifier, *args)
        after = classifier.get_weights()
        phases.append((before[:body], after[:body], before[body:], after[body:]))
        assert classifier.backbone.trainable  # thawed again for the whole-model epochs
        return diverged

    monkeypatch.setattr(trial, "train_head", watched)
    result = finetuning.finetune(
        downstream_model, data=task[0], validation=task[1], probe_epochs=1, **ONE
    )
    ((body_before, body_after, head_before, head_after),) = phases
    for a, b in zip(body_before, body_after):
        np.testing.assert_array_equal(a, b)  # the body frozen while the head trained
    assert _weights_differ(head_before, head_after)
    assert result.classifier.backbone.trainable
    # Then the whole model trained: the body moved from the start.
    assert _weights_differ(
        classifiers.backbone_weights(result.classifier),
        classifiers.backbone_weights(downstream_model),
    )
    assert _weights_differ(result.classifier.get_weights(), plain.classifier.get_weights())
    assert result.recipe == {**OFF, "probe_epochs": 1}


def _movement(monkeypatch, run) -> tuple:
    """(max |change| of the embeddings, of the head's output kernel) over one trial."""
    started, reset = [], classifiers.reset

    def recording(classifier, *args):
        reset(classifier, *args)
        started.append({v.path: np.array(v.value) for v in classifier.trainable_variables})

    monkeypatch.setattr(classifiers, "reset", recording)
    result = run()
    end = {v.path: np.array(v.value) for v in result.classifier.trainable_variables}
    change = {path: np.max(np.abs(end[path] - value)) for path, value in started[0].items()}
    embeddings = max(c for path, c in change.items() if path.startswith("embeddings"))
    return embeddings, change["logits/kernel"]


def test_layer_decay_leaves_the_embeddings_nearly_still(downstream_model, task, monkeypatch):
    def run(decay):
        return lambda: finetuning.finetune(
            downstream_model, data=task[0], validation=task[1], layer_decay=decay, **ONE
        )

    embeddings, head = _movement(monkeypatch, run(0.01))  # 2 layers: embeddings at 1e-4
    plain_embeddings, plain_head = _movement(monkeypatch, run(1.0))
    assert head > 0 and plain_embeddings / plain_head > 0.1
    assert embeddings / head < 1e-3


def test_layer_scales_follow_the_depth(downstream_model):
    classifier = classifiers.build_classifier(downstream_model.kroberta_config.model, 2)
    from kroberta.downstream.layer_decay import layer_scales

    scales = layer_scales(classifier.trainable_variables, 2, 0.5)
    assert scales["logits/kernel"] == scales["pooled_dense/bias"] == 1.0
    assert scales["transformer_layer_1/feedforward_output_dense/kernel"] == 1.0
    assert scales["transformer_layer_0/self_attention_layer/query/kernel"] == 0.5
    assert scales["embeddings/token_embedding/embeddings"] == 0.25
    assert scales["embeddings_layer_norm/gamma"] == 0.25


def test_task_adaptive_pretraining_moves_the_body_first(downstream_model, task, plain, monkeypatch):
    seen = _starts(monkeypatch)
    before = [np.array(w) for w in downstream_model.get_weights()]
    result = finetuning.finetune(
        downstream_model, data=task[0], validation=task[1], adapt_steps=10, **ONE
    )
    (start,) = seen
    assert _weights_differ(start, classifiers.backbone_weights(downstream_model))
    (losses,) = result.adaptation
    assert losses["seed"] is None and losses["loss_after"] < losses["loss_before"]
    for a, b in zip(before, downstream_model.get_weights()):
        np.testing.assert_array_equal(a, b)  # a copy was adapted, not the model given
    assert _weights_differ(result.classifier.get_weights(), plain.classifier.get_weights())
    assert result.recipe == {**OFF, "adapt_steps": 10}


def test_the_sequences_are_the_training_texts_packed(downstream_model):
    ids, mask = adaptation.task_sequences(
        downstream_model.tokenizer, (["The apple river", "The stone"],), 8
    )
    tokens = downstream_model.tokenizer.encode("The apple river", add_special_tokens=False).ids
    assert ids.shape == mask.shape and ids.shape[1] == 8
    assert list(ids[0, 1 : 1 + len(tokens)]) == tokens and mask[:-1].all()


def test_adapting_again_gives_the_same_weights(downstream_model):
    """A resumed fine-tune adapts its start again: it must be the start the finished
    trials ran from."""
    from kroberta.parallel.distribute import global_distribution

    sequences = adaptation.task_sequences(downstream_model.tokenizer, (sentences(64, 3),), 16)
    with global_distribution(classifiers.data_parallel()):
        first, losses = adaptation.adapt(downstream_model, sequences, 3, 32, seed=0)
        again, losses_again = adaptation.adapt(downstream_model, sequences, 3, 32, seed=0)
    assert losses == losses_again
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_the_random_start_is_adapted_alike_with_a_baseline(downstream_model, task):
    result = finetuning.finetune(
        downstream_model, data=task[0], validation=task[1], adapt_steps=5, baseline=True, **ONE
    )
    (losses,) = result.baseline.adaptation
    assert losses["seed"] == 0 and losses["loss_after"] < losses["loss_before"]
    assert result.baseline.recipe["adapt_steps"] == 5


def test_reinit_draws_the_top_layer_afresh(downstream_model, task, plain, monkeypatch):
    seen = _starts(monkeypatch)
    result = finetuning.finetune(
        downstream_model, data=task[0], validation=task[1], reinit_layers=1, **ONE
    )
    (start,) = seen
    pretrained = classifiers.backbone_weights(downstream_model)
    random = starts.random_start(downstream_model, None, 0)
    top = set(starts.top_layer_indices(downstream_model.backbone, 1))
    assert top and len(top) < len(start)
    for i, weights in enumerate(start):
        expected = random[i] if i in top else pretrained[i]
        np.testing.assert_array_equal(weights, expected)
    assert any(not np.array_equal(start[i], pretrained[i]) for i in top)
    assert _weights_differ(result.classifier.get_weights(), plain.classifier.get_weights())
    assert result.recipe == {**OFF, "reinit_layers": 1}


@pytest.mark.parametrize(
    "option, message",
    [
        (dict(probe_epochs=-1), r"^probe_epochs=-1: expected a whole number of epochs"),
        (dict(probe_epochs=1.5), r"^probe_epochs=1.5: expected a whole number"),
        (dict(layer_decay=0.0), r"^layer_decay=0.0: expected a factor in \(0, 1\]"),
        (dict(layer_decay=1.5), r"^layer_decay=1.5: expected a factor in \(0, 1\]"),
        (dict(layer_decay=float("nan")), r"^layer_decay=nan: expected a factor"),
        (dict(adapt_steps=-2), r"^adapt_steps=-2: expected a whole number of masked-LM steps"),
        (dict(reinit_layers=-1), r"^reinit_layers=-1: expected a whole number of top layers"),
        (
            dict(reinit_layers=3),
            (
                r"^reinit_layers=3: the model has 2 encoder layer\(s\); give 0 "
                r"to 2$"
            ),
        ),
    ],
)
def test_an_option_that_cannot_apply_is_refused_in_one_line(
    downstream_model, task, option, message
):
    with pytest.raises(InputError, match=message) as refused:
        finetuning.finetune(downstream_model, data=task[0], validation=task[1], **ONE, **option)
    assert "\n" not in str(refused.value)


def test_adapting_a_classifier_is_refused(downstream_model, plain, task, tmp_path):
    import kroberta

    message = (
        r"^adapt_steps=5: the model is a fine-tuned classifier, which has no "
        r"masked-LM head to adapt; give the pretrained masked LM"
    )
    with pytest.raises(InputError, match=message):
        finetuning.finetune(
            plain.classifier, data=task[0], validation=task[1], adapt_steps=5, **ONE
        )
    kroberta.save(plain.classifier, str(tmp_path / "classifier"))
    with pytest.raises(InputError, match=message):
        finetuning.finetune(
            str(tmp_path / "classifier"), data=task[0], validation=task[1], adapt_steps=5, **ONE
        )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--probe-epochs", "-1"], "error: --probe-epochs -1: expected a whole number of epochs"),
        (["--layer-decay", "0"], r"error: --layer-decay 0.0: expected a factor in (0, 1]"),
        (["--adapt-steps", "-3"], "error: --adapt-steps -3: expected a whole number"),
        (["--reinit-layers", "-1"], "error: --reinit-layers -1: expected a whole number"),
        (
            ["--reinit-layers", "3"],
            ("error: --reinit-layers 3: the model has 2 encoder layer(s); give 0 to 2"),
        ),
    ],
)
def test_the_command_refuses_an_option_in_one_line_with_exit_code_2(
    downstream_model, task, tmp_path_factory, capsys, argv, message
):
    from kroberta.training import final_model

    run = tmp_path_factory.getbasetemp() / "recipe_run"
    if not run.exists():
        final_model.save(downstream_model, str(run))
    code = finetune.main(
        [
            "--run",
            str(run),
            "--data",
            task[0],
            "--validation",
            task[1],
            "--learning-rates",
            "3e-3",
            "--seeds",
            "1",
            "--epochs",
            "1",
            *argv,
        ]
    )
    assert code == 2
    *before, error = capsys.readouterr().err.strip().splitlines()
    assert error.startswith(message)
    # Before it at most the training file's classes: the command reads its task with its checks.
    assert all("examples of 2 classes" in line for line in before)


def test_the_command_records_the_options_in_the_result(downstream_model, task, tmp_path):
    from kroberta.training import final_model

    final_model.save(downstream_model, str(tmp_path / "run"))
    out = tmp_path / "out"
    assert (
        finetune.main(
            [
                "--run",
                str(tmp_path / "run"),
                "--data",
                task[0],
                "--validation",
                task[1],
                "--learning-rates",
                "3e-3",
                "--seeds",
                "1",
                "--epochs",
                "1",
                "--max-length",
                "16",
                "--layer-decay",
                "0.5",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads((out / "result.json").read_text())
    assert result["recipe"] == {**OFF, "layer_decay": 0.5} and result["adaptation"] is None
    config = FinetuneConfig(
        learning_rates=[3e-3], seeds=1, epochs=1, max_length=16, layer_decay=0.5
    )
    assert result["config"] == json.loads(json.dumps(dataclasses.asdict(config)))
    settings = json.loads((out / TRIALS_FILE).read_text().splitlines()[0])["settings"]
    assert settings["layer_decay"] == 0.5


def test_a_changed_option_does_not_reuse_the_trials(downstream_model, task, tmp_path, monkeypatch):
    out = str(tmp_path / "out")
    finetuning.finetune(downstream_model, data=task[0], validation=task[1], out=out, **ONE)
    with pytest.raises(
        InputError,
        match=r"holds trials of another fine-tune \(probe_epochs "
        r"differ\)",
    ):
        finetuning.finetune(
            downstream_model, data=task[0], validation=task[1], out=out, probe_epochs=1, **ONE
        )
    other = str(tmp_path / "other")
    first = finetuning.finetune(
        downstream_model, data=task[0], validation=task[1], out=other, layer_decay=0.5, **ONE
    )
    # The same options resume: no trial runs again.
    monkeypatch.setattr(trial, "run_trial", None)
    resumed = finetuning.finetune(
        downstream_model, data=task[0], validation=task[1], out=other, layer_decay=0.5, **ONE
    )
    assert [t.scores for t in resumed.trials] == [t.scores for t in first.trials]
    with pytest.raises(InputError, match=r"\(layer_decay differ\)"):  # switched off again
        finetuning.finetune(downstream_model, data=task[0], validation=task[1], out=other, **ONE)
    with pytest.raises(InputError, match=r"\(layer_decay differ\)"):
        finetuning.finetune(
            downstream_model, data=task[0], validation=task[1], out=other, layer_decay=0.25, **ONE
        )


def test_layer_decay_adamw_is_keras_adamw_with_each_rate_scaled():
    from kroberta.downstream.layer_decay import LayerDecayAdamW
    from kroberta.model.mlm import NO_DECAY_NAMES

    def trained(optimizer):
        rng = np.random.default_rng(0)
        kernel = keras.Variable(rng.normal(size=(3, 2)).astype("float32"), name="kernel")
        bias = keras.Variable(rng.normal(size=(2,)).astype("float32"), name="bias")
        for _ in range(3):
            grads = [
                keras.ops.convert_to_tensor(rng.normal(size=v.shape).astype("float32"))
                for v in (kernel, bias)
            ]
            optimizer.apply(grads, [kernel, bias])
        return np.array(kernel.value), np.array(bias.value)

    def adamw(rate):
        optimizer = keras.optimizers.AdamW(
            learning_rate=rate, weight_decay=0.1, beta_1=0.9, beta_2=0.98, epsilon=1e-6
        )
        optimizer.exclude_from_weight_decay(var_names=NO_DECAY_NAMES)
        return optimizer

    def decayed(scales):
        return LayerDecayAdamW(
            scales, 0.1, learning_rate=0.01, beta_1=0.9, beta_2=0.98, epsilon=1e-6
        )

    kernel, bias = trained(decayed({}))
    expected_kernel, expected_bias = trained(adamw(0.01))
    np.testing.assert_allclose(kernel, expected_kernel, rtol=1e-6)
    np.testing.assert_allclose(bias, expected_bias, rtol=1e-6)
    # The kernel at half the rate (its decay too): AdamW at half the rate, for the kernel.
    kernel, bias = trained(decayed({"kernel": 0.5}))
    np.testing.assert_allclose(kernel, trained(adamw(0.005))[0], rtol=1e-6)
    np.testing.assert_allclose(bias, expected_bias, rtol=1e-6)
