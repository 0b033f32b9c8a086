"""`FinetuneConfig`: each setting refused once, named as the keyword in Python and as the
flag on the command line, before JAX loads; the command and the API build equal configs."""

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest

from kroberta import FinetuneConfig
from kroberta.cli import finetune
from kroberta.cli.finetune import finetune_config
from kroberta.errors import InputError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BAD = [  # (keyword arguments, the same as flags, the problem both name)
    (dict(epochs=0), ["--epochs", "0"], "0: expected a whole number of at least 1"),
    (dict(seeds=0), ["--seeds", "0"], "0: expected at least one seed"),
    (dict(early_stopping=0), ["--early-stopping", "0"], "0: expected a patience of at least 1"),
    (dict(batch_size=0), ["--batch-size", "0"], "0: must be a positive multiple of the devices"),
    (dict(max_length=4), ["--max-length", "4"], "4: expected at least 8"),
    (dict(probe_epochs=-1), ["--probe-epochs", "-1"], "-1: expected a whole number of epochs"),
    (dict(layer_decay=1.5), ["--layer-decay", "1.5"], "1.5: expected a factor in (0, 1]"),
    (dict(adapt_steps=-2), ["--adapt-steps", "-2"], "-2: expected a whole number of masked-LM"),
    (dict(reinit_layers=-1), ["--reinit-layers", "-1"], "-1: expected a whole number of top"),
]


@pytest.mark.fast
@pytest.mark.parametrize("settings, argv, problem", BAD)
def test_a_bad_setting_names_the_keyword_in_python_and_the_flag_on_the_command_line(
    capsys, settings, argv, problem
):
    (name,) = settings
    with pytest.raises(InputError) as refused:
        FinetuneConfig(**settings)
    assert str(refused.value).startswith(f"{name}={problem}")
    assert finetune.main(["--run", "nowhere", *argv]) == 2  # before --run is looked at
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"error: {argv[0]} {problem}") and "\n" not in error


@pytest.mark.fast
def test_the_pooling_and_rates_are_refused_naming_them():
    with pytest.raises(InputError, match="^pooling='max': expected one of first, mean$"):
        FinetuneConfig(pooling="max")
    with pytest.raises(InputError, match="^baseline_learning_rates 30000: outside 1e-08 to 1"):
        FinetuneConfig(baseline_learning_rates=[3e4])
    with pytest.raises(InputError, match=r"^seeds=\[\]: expected at least one seed$"):
        FinetuneConfig(seeds=[])
    # One number where a grid is expected (a string would be read a character at a time).
    for rates in ("1e-3", 1e-3, ["1e-3"], [None]):
        with pytest.raises(InputError) as refused:
            FinetuneConfig(learning_rates=rates)
        assert str(refused.value) == (
            f"learning_rates={rates!r}: expected a list of learning rates, e.g. [1e-3, 3e-3]"
        )
    assert FinetuneConfig(learning_rates=np.array([1e-3, 3e-3])).learning_rates == (1e-3, 3e-3)


@pytest.mark.fast
def test_the_command_line_and_the_api_build_equal_configs():
    args = finetune._parser().parse_args(
        [
            "--run",
            "r",
            "--data",
            "t.jsonl",
            "--validation",
            "v.jsonl",
            "--learning-rates",
            "1e-3,3e-3",
            "--seeds",
            "2",
            "--epochs",
            "4",
            "--early-stopping",
            "2",
            "--batch-size",
            "16",
            "--max-length",
            "64",
            "--pooling",
            "mean",
            "--no-widen",
            "--probe-epochs",
            "1",
            "--layer-decay",
            "0.8",
            "--adapt-steps",
            "5",
            "--reinit-layers",
            "1",
            "--baseline",
        ]
    )
    assert finetune_config(args) == FinetuneConfig(
        learning_rates=[1e-3, 3e-3],
        seeds=2,
        epochs=4,
        early_stopping=2,
        batch_size=16,
        max_length=64,
        pooling="mean",
        widen=False,
        probe_epochs=1,
        layer_decay=0.8,
        adapt_steps=5,
        reinit_layers=1,
        baseline=True,
    )
    # No flags: the dataclass's defaults (the random start is on for the embedded task only).
    plain = finetune._parser().parse_args(["--run", "r", "--data", "t.jsonl"])
    assert finetune_config(plain) == FinetuneConfig()
    embedded = finetune._parser().parse_args(["--run", "r"])
    assert finetune_config(embedded) == FinetuneConfig(baseline=True)
    # Sequences become tuples: a config is hashable, and equal whatever sequence built it.
    assert hash(FinetuneConfig(seeds=[0, 1], learning_rates=[1e-3])) == hash(
        FinetuneConfig(seeds=(0, 1), learning_rates=(1e-3,))
    )


@pytest.mark.fast
def test_finetune_takes_a_config_or_its_keywords_not_both():
    from kroberta.downstream import finetuning

    with pytest.raises(
        InputError,
        match=r"^kroberta.finetune: config= and epochs= given "
        r"together",
    ):
        finetuning.finetune("nowhere", config=FinetuneConfig(), epochs=5)
    with pytest.raises(
        TypeError, match=r"unexpected keyword argument 'epoch'; did you mean 'epochs'\?$"
    ):
        finetuning.finetune("nowhere", epoch=5)
    with pytest.raises(TypeError, match=r"'learning_rate'; did you mean 'learning_rates'\?$"):
        finetuning.finetune("nowhere", learning_rate=1e-3)
    with pytest.raises(TypeError, match=r"'text_field'; did you mean 'text_fields'\?$"):
        finetuning.finetune("nowhere", text_field="body")
    with pytest.raises(
        TypeError, match=r"'xyzzy' \(settings: learning_rates, baseline_learning_rates, "
    ):
        finetuning.finetune("nowhere", xyzzy=1)
    with pytest.raises(InputError, match="^epochs=0: "):
        finetuning.finetune("nowhere", epochs=0)
    assert dataclasses.replace(FinetuneConfig(), epochs=5) == FinetuneConfig(epochs=5)


def test_a_bad_setting_is_refused_before_jax_keras_and_tensorflow_load(tmp_path):
    probe = (
        "import sys\nimport kroberta\nfrom kroberta.cli.finetune import main\n"
        "try:\n    kroberta.FinetuneConfig(epochs=0)\nexcept kroberta.errors.InputError "
        "as e:\n    print(e)\ncode = main(['--run', 'nowhere', '--layer-decay', '0'])\n"
        "print(code, [m for m in ('jax', 'tensorflow', 'keras') if m in sys.modules])"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": REPO},
        cwd=tmp_path,
        timeout=120,
    )
    assert done.stdout.splitlines() == [
        "epochs=0: expected a whole number of at least 1",
        "2 []",
    ], done.stdout + done.stderr
    assert done.stderr.strip() == (
        "error: --layer-decay 0.0: expected a factor in (0, 1] (1, "
        "the default, gives every layer the trial's learning rate)"
    )
