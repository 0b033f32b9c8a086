"""`kroberta.evaluate(model, data)` and `python -m kroberta.evaluate`: a run's model on its
validation data gives that run's validation row; other data are refused as training
refuses them."""

import dataclasses
import json
import math
import os

import pytest

import kroberta
import kroberta.cli.evaluate
from kroberta.config import config_path, load_toml
from kroberta.errors import InputError
from tests.conftest import prepare_word_corpus

WORDS = (
    "alpha beta gamma delta epsilon zeta theta iota kappa lambda sigma omega river stone "
    "cloud field light house water paper"
).split()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny run trained 4 steps on prepared (unlabelled) data, evaluated at steps 2 and 4
    with masks at data.eval_mask_rate = 0.3."""
    root = tmp_path_factory.mktemp("evaluate")
    data = prepare_word_corpus(root, WORDS, documents=200)
    config = load_toml(config_path("tiny"))
    config = dataclasses.replace(
        config,
        run_dir=str(root / "run"),
        model=dataclasses.replace(config.model, vocabulary_size=300),
        data=dataclasses.replace(config.data, dir=str(data), eval_mask_rate=0.3),
        train=dataclasses.replace(
            config.train,
            steps=4,
            warmup_steps=1,
            log_every=2,
            eval_every=2,
            checkpoint_every=2,
            steps_per_execution=1,
        ),
    )
    kroberta.train(config)
    with open(os.path.join(config.run_dir, "metrics.jsonl")) as f:
        rows = [r for r in map(json.loads, f) if r["split"] == "validation"]
    return config.run_dir, str(data), rows


def test_a_runs_model_gives_its_validation_row(trained):
    run_dir, data, rows = trained
    assert [r["step"] for r in rows] == [2, 4]
    result = kroberta.evaluate(kroberta.load(run_dir), data)
    last = rows[-1]
    assert result["loss"] == pytest.approx(last["loss"], rel=1e-5)
    assert result["masked_accuracy"] == pytest.approx(last["masked_accuracy"], abs=1e-6)
    assert result["perplexity"] == pytest.approx(math.exp(result["loss"]), rel=1e-6)
    # The checkpoint of step 2 gives the row of step 2 (another model, another number).
    earlier = kroberta.evaluate(kroberta.load(run_dir, checkpoint=2), data)
    assert earlier["loss"] == pytest.approx(rows[0]["loss"], rel=1e-5)
    assert earlier["loss"] != pytest.approx(result["loss"], rel=1e-3)


def test_the_command_prints_the_same_numbers(trained, capsys):
    run_dir, data, rows = trained
    assert kroberta.cli.evaluate.main(["--model", run_dir, "--data", data, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["loss"] == pytest.approx(rows[-1]["loss"], rel=1e-5)
    assert printed["sequences"] > 0
    assert kroberta.cli.evaluate.main(["--model", run_dir, "--data", data]) == 0
    table = capsys.readouterr().out
    assert "masked_accuracy" in table and f"{printed['loss']:.4f}" in table


def test_an_exported_model_gives_the_same_loss(trained, tmp_path):
    run_dir, data, _ = trained
    model = kroberta.load(run_dir)
    exported = kroberta.export_hf(model, str(tmp_path / "hf"))
    # The imported model's default config draws other masks (another seed, mask rate):
    # the same config gives the same number.
    imported = kroberta.load(exported)
    imported.kroberta_config = model.kroberta_config
    assert kroberta.evaluate(imported, data)["loss"] == pytest.approx(
        kroberta.evaluate(model, data)["loss"], rel=1e-5
    )


def test_data_from_another_tokenizer_and_bad_arguments_are_refused(trained, tmp_path, capsys):
    run_dir, _, _ = trained
    other = prepare_word_corpus(tmp_path, [w.upper() + "q" for w in WORDS], documents=200)
    model = kroberta.load(run_dir)
    with pytest.raises(InputError, match="another tokenizer than the model's"):
        kroberta.evaluate(model, str(other))
    with pytest.raises(InputError, match="multiple of the 4 devices"):
        kroberta.evaluate(model, str(other), batch_size=6)
    assert kroberta.cli.evaluate.main(["--model", str(tmp_path), "--data", str(other)]) == 2
    assert "config.toml is missing), and no config.json" in capsys.readouterr().err
