import dataclasses
import os
import subprocess
import sys

import pytest

import kroberta
import kroberta.cli.train
from kroberta.config import (
    Config,
    apply_dict,
    apply_overrides,
    config_path,
    from_command_line,
    load_toml,
    parse_duration,
    shipped_names,
    to_toml,
    validate,
)
from kroberta.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = shipped_names()


@pytest.mark.fast
def test_defaults_are_valid():
    validate(Config())


@pytest.mark.parametrize("name", SHIPPED)
@pytest.mark.fast
def test_every_shipped_config_loads_and_validates(name):
    path = config_path(name)
    config = validate(load_toml(path), path)
    assert config.model.hidden_dim % config.model.num_heads == 0
    with open(path) as f:
        first = f.readline()
    assert first.startswith("#"), "each config opens with a comment giving its command and cost"


@pytest.mark.fast
def test_the_small_config_matches_what_prepare_writes_for_its_command():
    # small.toml's command prepares --vocab-size 4096 --seq-len 64: the model must take both.
    config = load_toml(config_path("small"))
    with open(config_path("small")) as f:
        header = f.read().split("\n\n")[0]
    assert "--vocab-size 4096 --seq-len 64" in header and "--config small" in header
    assert (config.model.vocabulary_size, config.model.max_sequence_length) == (4096, 64)
    assert config.train.eval_every % config.train.log_every == 0


@pytest.mark.fast
def test_shipped_configs_exist_inside_the_package():
    assert {"seed", "tiny", "base", "small"} <= set(SHIPPED)
    package = os.path.dirname(os.path.abspath(kroberta.__file__))
    for name in SHIPPED:
        assert config_path(name) == os.path.join(package, "configs", f"{name}.toml")


@pytest.mark.fast
def test_seed_config_is_the_reports_model():
    m = load_toml(config_path("seed")).model
    assert (
        m.vocabulary_size,
        m.max_sequence_length,
        m.num_layers,
        m.num_heads,
        m.hidden_dim,
        m.intermediate_dim,
    ) == (10000, 64, 3, 6, 300, 600)


@pytest.mark.fast
def test_overrides_parse_types():
    config = apply_overrides(
        Config(),
        [
            "train.steps=4114",
            "train.learning_rate=3e-4",
            "train.mixed_precision=true",
            "data.train=data/*.tfrecords",
            "run_dir=runs/x",
            "data.special_token_ids=[0, 2]",
        ],
    )
    assert config.train.steps == 4114 and isinstance(config.train.steps, int)
    assert config.train.learning_rate == 3e-4
    assert config.train.mixed_precision is True
    assert config.data.train == ("data/*.tfrecords",)
    assert config.run_dir == "runs/x"
    assert config.data.special_token_ids == (0, 2)


@pytest.mark.fast
def test_int_accepted_for_float_but_not_string_for_int():
    assert apply_overrides(Config(), ["train.learning_rate=1"]).train.learning_rate == 1.0
    with pytest.raises(ConfigError, match=r"command line: train.steps: expected an integer"):
        apply_overrides(Config(), ["train.steps=many"])


@pytest.mark.fast
def test_unknown_key_names_key_and_source(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[model]\nhidden_size = 3\n")
    with pytest.raises(ConfigError, match=r"bad.toml: unknown key 'model.hidden_size'"):
        load_toml(str(path))
    with pytest.raises(
        ConfigError,
        match=r"^command line: unknown key 'train.stepz': did you mean 'train.steps'\? "
        r"\(known: batch_size_per_device, ",
    ):
        apply_overrides(Config(), ["train.stepz=3"])
    with pytest.raises(ConfigError, match=r"unknown key 'train.step': did you mean 'train.steps'"):
        apply_overrides(Config(), ["train.step=3"])
    with pytest.raises(ConfigError, match=r"unknown key 'optimizer' \(known: model, "):
        apply_overrides(Config(), ["optimizer.lr=3"])
    with pytest.raises(ConfigError, match=r"unknown key 'rundir': did you mean 'run_dir'\? "):
        apply_overrides(Config(), ["rundir=runs/x"])
    # A top-level key written inside a section (after [model] in a file) says where it goes.
    path.write_text('[model]\ninit_from_hf = "roberta"\n')
    with pytest.raises(
        ConfigError,
        match=r"unknown key 'model.init_from_hf' \(a top-level "
        r"key: init_from_hf, above any \[section\]",
    ):
        load_toml(str(path))


@pytest.mark.fast
def test_wrong_type_in_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[train]\nmixed_precision = "yes"\n')
    with pytest.raises(
        ConfigError, match=r"bad.toml: train.mixed_precision: expected true or false"
    ):
        load_toml(str(path))


@pytest.mark.fast
def test_invalid_toml_and_missing_file(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("[model\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_toml(str(path))
    with pytest.raises(ConfigError, match="no such config file"):
        load_toml(str(tmp_path / "absent.toml"))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.num_heads=7"], r"model.num_heads: 7 heads do not divide hidden_dim=128"),
        (["train.eval_every=75"], r"train.eval_every: 75 is not a multiple of train.log_every=50"),
        (["train.batch_size_per_device=0"], r"train.batch_size_per_device: must be >= 1"),
        (["data.masking=sometimes"], r"data.masking: must be one of"),
        (["data.mask_rate=1.5"], r"data.mask_rate: must be in \(0, 1\]"),
        (
            ["train.warmup_steps=5000", "train.warmup_fraction=0"],
            r"train.warmup_steps: 5000 exceeds train.steps",
        ),
        (["model.dropout=1.0"], r"model.dropout"),
        (["model.initializer_range=0"], r"model.initializer_range: must be in \(0, 1\]"),
        (["data.mask_token_id=99999"], r"data.mask_token_id: 99999 is outside the vocabulary"),
    ],
)
@pytest.mark.fast
def test_impossible_values(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(apply_overrides(Config(), overrides), "command line")


@pytest.mark.fast
def test_toml_round_trip():
    config = apply_overrides(Config(), ['data.train=["a", "b"]', "train.steps=7"])
    text = to_toml(config)
    again = apply_dict(Config(), __import__("tomllib").loads(text), "round trip")
    assert again == config


@pytest.mark.fast
def test_prediction_slots_auto_and_explicit():
    assert Config().data.prediction_slots(64) == 24  # ceil(1.25 * 0.3 * 64)
    assert dataclasses.replace(Config().data, max_predictions=5).prediction_slots(64) == 5


def test_cli_config_error_is_one_line_exit_2(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kroberta.train",
            "--model.num_heads=7",
            f"--run_dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode == 2
    assert "error: command line: model.num_heads: 7 heads do not divide" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists(), "nothing is written for a rejected config"


@pytest.mark.fast
def test_a_config_is_found_by_name_or_by_path(tmp_path, monkeypatch):
    by_name, _ = from_command_line("seed", [])
    by_path, _ = from_command_line(config_path("seed"), [])
    assert by_name == by_path and by_name.model.hidden_dim == 300
    own = tmp_path / "mine.toml"
    own.write_text("[train]\nsteps = 7\n")
    assert from_command_line(str(own), [])[0].train.steps == 7
    # A file whose name looks like a name still works when no shipped config has it.
    (tmp_path / "plain").write_text("[train]\nsteps = 9\n")
    monkeypatch.chdir(tmp_path)
    assert from_command_line("plain", [])[0].train.steps == 9
    # A run directory stands for the config it ran with (its config.toml).
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.toml").write_text("[train]\nsteps = 110\n")
    assert kroberta.load_config(str(tmp_path / "run")).train.steps == 110


@pytest.mark.fast
def test_an_unknown_config_lists_the_shipped_names():
    for value in ("nope", "configs/absent.toml"):
        with pytest.raises(
            ConfigError,
            match=rf"config '{value}': neither a shipped config "
            r"\(base, seed, small, tiny\) nor a file",
        ):
            from_command_line(value, [])


@pytest.mark.fast
def test_load_config_applies_overrides_over_a_named_config():
    config = kroberta.load_config(
        "seed",
        {
            "train.steps": 100,
            "data.dir": "data/x",
            "data.train": "a/*.tfrecords",
            "run_dir": "runs/y",
        },
    )
    seed = load_toml(config_path("seed"))
    assert config.train.steps == 100 and config.data.dir == "data/x"
    assert config.data.train == ("a/*.tfrecords",) and config.run_dir == "runs/y"
    assert config.model == seed.model  # untouched keys keep the file's values
    assert kroberta.load_config() == Config()
    assert kroberta.load_config("tiny") == load_toml(config_path("tiny"))


@pytest.mark.fast
def test_load_config_matches_the_command_line():

    from_python = kroberta.load_config(
        "tiny", {"train.steps": 30, "train.learning_rate": 1e-3, "run_dir": "runs/z"}
    )
    from_cli, _ = kroberta.cli.train.parse_args(
        ["--config", "tiny", "--train.steps=30", "--train.learning_rate=1e-3", "--run_dir=runs/z"]
    )
    assert from_python == from_cli


@pytest.mark.parametrize(
    "name, overrides, message",
    [
        (
            "seed",
            {"train.stepz": 3},
            r"^overrides: unknown key 'train.stepz': did you mean 'train.steps'\? \(known: ",
        ),
        ("seed", {"optimizer.lr": 3}, r"^overrides: unknown key 'optimizer'"),
        (
            "tiny",
            {"train.steps": "100"},
            r"^overrides: train.steps: expected an integer, got '100'",
        ),
        (
            "seed",
            {"model.num_heads": 7},
            r"^overrides: model.num_heads: 7 heads do not divide "
            r"hidden_dim=300",
        ),
        (None, {"a.b.c": 1}, r"^overrides: 'a.b.c': expected 'section.key'"),
        (None, ["train.steps=3"], r"^overrides: expected a dict"),
        ("nope", None, r"^config 'nope': neither a shipped config \(base, seed, small, tiny\)"),
    ],
)
@pytest.mark.fast
def test_load_config_errors_name_the_key(name, overrides, message):
    with pytest.raises(ConfigError, match=message):
        kroberta.load_config(name, overrides)


@pytest.mark.fast
def test_load_config_names_the_file_for_an_impossible_value_it_holds(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[train]\neval_every = 75\n")
    with pytest.raises(
        ConfigError,
        match=rf"^{path}: train.eval_every: 75 is not a multiple "
        r"of train.log_every=50$",
    ):
        kroberta.load_config(str(path))


@pytest.mark.fast
def test_a_combination_names_the_source_of_each_key_it_involves():
    config, sources = from_command_line("tiny", ["--train.steps=2"])
    with pytest.raises(ConfigError) as raised:
        validate(config, sources)
    tiny = str(config_path("tiny"))
    assert str(raised.value) == (
        f"{tiny}: train.warmup_steps: 20 exceeds train.steps=2; set a smaller "
        "train.warmup_steps or more train.steps (train.steps from command line)"
    )
    # Both set in one place: the line names both, and their source once.
    config, sources = from_command_line(
        None, ["--train.warmup_steps=300", "--train.warmup_fraction=0.25"]
    )
    with pytest.raises(ConfigError) as raised:
        validate(config, sources)
    assert str(raised.value) == (
        "command line: train.warmup_fraction: train.warmup_steps=300 and "
        "train.warmup_fraction=0.25 both set the warmup: set one, the other to 0 "
        "(--train.warmup_fraction=0 counts it in steps)"
    )


@pytest.mark.fast
def test_a_warmup_fraction_counts_its_steps_from_train_steps():
    train = dataclasses.replace(Config().train, steps=1800, warmup_steps=0, warmup_fraction=0.5)
    assert train.effective_warmup_steps() == 900
    assert dataclasses.replace(train, steps=10, warmup_fraction=0.26).effective_warmup_steps() == 3
    # 0 = the absolute warmup_steps, whatever the run's length.
    assert (
        dataclasses.replace(train, warmup_fraction=0.0, warmup_steps=37).effective_warmup_steps()
        == 37
    )
    assert dataclasses.replace(train, warmup_fraction=0.0).effective_warmup_steps() == 0


@pytest.mark.fast
def test_small_config_runs_15_minutes_and_warms_up_over_half_of_them():
    # The budget fixes the steps: the file leaves train.steps out.
    with open(config_path("small"), "rb") as f:
        stated = __import__("tomllib").load(f)["train"]
    assert stated["time_budget"] == "15m" and "steps" not in stated
    config, sources = from_command_line("small", [])
    fixed = dataclasses.replace(config.train, steps=2340)  # as the budget fixes them
    assert fixed.effective_warmup_steps() == 1170
    config, sources = from_command_line("small", ["--train.steps=3000", "--train.time_budget="])
    assert validate(config, sources).train.effective_warmup_steps() == 1500


@pytest.mark.parametrize(
    "name, warmup, mask_rate",
    [("seed", 0, 0.15), ("tiny", 20, 0.15), ("base", 24000, 0.15), ("small", 900, 0.3)],
)
@pytest.mark.fast
def test_each_shipped_config_states_its_own_warmup_and_mask_rate(name, warmup, mask_rate):
    # A key a file leaves out takes the dataclass default: each shipped config says its
    # recipe's warmup and mask rate itself, so a change of the defaults leaves it alone.
    with open(config_path(name), "rb") as f:
        stated = __import__("tomllib").load(f)
    assert {"warmup_steps", "warmup_fraction"} <= set(stated["train"]) and "mask_rate" in stated[
        "data"
    ]
    config = validate(load_toml(config_path(name)))
    assert (config.train.effective_warmup_steps(), config.data.mask_rate) == (warmup, mask_rate)


@pytest.mark.fast
def test_warmup_steps_and_fraction_both_set_in_one_place_is_refused_naming_both(tmp_path):
    path = tmp_path / "both.toml"
    path.write_text("[train]\nwarmup_steps = 300\nwarmup_fraction = 0.5\n")
    with pytest.raises(ConfigError) as raised:
        kroberta.load_config(str(path))
    assert str(raised.value) == (
        f"{path}: train.warmup_fraction: train.warmup_steps=300 and "
        "train.warmup_fraction=0.5 both set the warmup: set one, the other to 0 "
        "(--train.warmup_fraction=0 counts it in steps)"
    )
    # Setting the other to 0 is the way out.
    config, sources = from_command_line(
        "small", ["--train.warmup_steps=300", "--train.warmup_fraction=0"]
    )
    assert validate(config, sources).train.effective_warmup_steps() == 300


@pytest.mark.fast
@pytest.mark.parametrize("name", [None, "small"])
def test_a_setting_given_closer_to_the_run_wins_over_the_configs_way_of_setting_it(name):
    # The default job's and small.toml's warmup is a fraction: warmup_steps on the command
    # line (or in overrides) decides, as Hugging Face's warmup_steps beats warmup_ratio,
    # and the sources say which key decided.
    config, sources = from_command_line(name, ["--train.warmup_steps=2"])
    train = validate(config, sources).train
    assert (train.warmup_steps, train.warmup_fraction, train.effective_warmup_steps()) == (
        2,
        0.0,
        2,
    )
    assert sources["train.warmup_fraction"] == "command line (by train.warmup_steps)"
    assert kroberta.load_config(name, {"train.warmup_steps": 2}).train.warmup_fraction == 0.0
    # The fraction on the command line beats a file's steps (tiny.toml: warmup_steps = 20).
    config, sources = from_command_line("tiny", ["--train.warmup_fraction=0.5"])
    train = validate(config, sources).train
    assert (train.warmup_steps, train.effective_warmup_steps()) == (0, round(0.5 * train.steps))
    # Steps on the command line turn a file's time budget off; the run is counted in steps.
    config, sources = from_command_line("small", ["--train.steps=3000"])
    train = validate(config, sources).train
    assert (train.steps, train.time_budget, train.effective_warmup_steps()) == (3000, "", 1500)


@pytest.mark.parametrize("fraction", [1.0, 1.5, -0.1])
@pytest.mark.fast
def test_a_warmup_fraction_outside_zero_to_one_is_refused(fraction):
    config = apply_overrides(
        Config(), ["train.warmup_steps=0", f"train.warmup_fraction={fraction}"]
    )
    with pytest.raises(
        ConfigError,
        match=rf"^command line: train.warmup_fraction: must be in \[0, 1\) "
        rf"\(0 = train.warmup_steps\), got {fraction}$",
    ):
        validate(config, "command line")


@pytest.mark.fast
def test_the_wsd_decay_leaves_room_for_a_warmup_given_as_a_fraction():
    config = apply_overrides(
        Config(),
        [
            "train.warmup_steps=0",
            "train.warmup_fraction=0.5",
            "train.steps=100",
            "train.schedule=wsd",
            "train.decay_steps=60",
        ],
    )
    with pytest.raises(
        ConfigError,
        match=r"train.decay_steps: must be in \[0, train.steps - "
        r"round\(train.warmup_fraction \* train.steps\) = 50\], got 60",
    ):
        validate(config, "command line")
    validate(dataclasses.replace(config, train=dataclasses.replace(config.train, decay_steps=50)))


@pytest.mark.fast
def test_model_parallel_with_the_data_strategy_is_refused():
    config = apply_overrides(Config(), ["distributed.model_parallel=2"])
    with pytest.raises(
        ConfigError,
        match=r"command line: distributed.model_parallel: 2 has no "
        r"effect with distributed.strategy='data'",
    ):
        validate(config, "command line")
    validate(apply_overrides(Config(), ["distributed.model_parallel=1"]), "command line")


@pytest.mark.fast
def test_a_value_after_a_space_says_to_use_equals():
    with pytest.raises(
        ConfigError,
        match=r"unexpected argument '20'; a value goes after '=': "
        r"--train.steps=20$",
    ):
        from_command_line("tiny", ["--train.steps", "20"])
    # A top-level key too; a stray word after a flag that is no key gets no hint.
    with pytest.raises(ConfigError, match=r"'runs/x'; a value goes after '=': --run_dir=runs/x$"):
        from_command_line("tiny", ["--run_dir", "runs/x"])
    # A misspelt option (`--confg seed`) is named.
    with pytest.raises(
        ConfigError,
        match=r"unexpected argument 'seed' after '--confg', which is "
        r"no option of this command \(see --help\)",
    ):
        from_command_line("tiny", ["--confg", "seed"])
    with pytest.raises(ConfigError, match=r"unexpected argument 'runs/x'$"):
        from_command_line("tiny", ["--train.steps=3", "runs/x"])


@pytest.mark.fast
def test_what_dataclasses_replace_or_python_puts_in_is_typed_or_refused_by_key(tmp_path):
    """validate types every field: a replace() can put in a Path, one string for a list, a
    numpy integer, or a wrong type; a dict or a name is not a Config."""
    import dataclasses
    import pathlib

    import numpy as np

    config = kroberta.load_config(
        "tiny", {"train.steps": np.int64(50)}
    )  # numpy's integers are integers
    assert config.train.steps == 50 and type(config.train.steps) is int
    typed = validate(
        dataclasses.replace(
            config,
            run_dir=pathlib.Path("runs/p"),
            data=dataclasses.replace(config.data, train="data/x/train-0.tfrecord"),
        )
    )
    assert typed.run_dir == "runs/p" and typed.data.train == ("data/x/train-0.tfrecord",)
    with pytest.raises(ConfigError, match=r"^config: train.steps: expected an integer, got '20'$"):
        validate(dataclasses.replace(config, train=dataclasses.replace(config.train, steps="20")))
    with pytest.raises(ConfigError, match=r"^config: train: expected a TrainConfig .*got dict$"):
        validate(dataclasses.replace(config, train={"steps": 5}))
    for wrong in ({"train.steps": 5}, "tiny", None):
        with pytest.raises(
            ConfigError, match=r"^expected a kroberta Config \(kroberta.load_config"
        ):
            validate(wrong)
    (tmp_path / "my.toml").write_text("[train]\nsteps = 700\n")
    assert kroberta.load_config(tmp_path / "my.toml").train.steps == 700  # a Path names a file too
    with pytest.raises(
        ConfigError, match="expected a shipped config's name or a TOML file's path, got int"
    ):
        kroberta.load_config(5)


@pytest.mark.fast
@pytest.mark.parametrize(
    "budget, seconds", [("90s", 90), ("15m", 900), ("2h", 7200), ("1h30m", 5400)]
)
def test_a_time_budget_reads_hours_minutes_and_seconds(budget, seconds):
    assert parse_duration(budget) == seconds
    assert kroberta.load_config("tiny", {"train.time_budget": budget}).train.time_budget == budget


@pytest.mark.fast
def test_a_time_budget_that_is_no_duration_is_one_line_naming_the_key():
    config, sources = from_command_line("small", ["--train.time_budget=15 mins"])
    with pytest.raises(ConfigError) as raised:
        validate(config, sources)
    assert str(raised.value) == (
        "command line: train.time_budget: '15 mins' is not a duration; write 90s, 15m, 2h or 1h30m"
    )
    with pytest.raises(ConfigError, match=r"^overrides: train.time_budget: '0m' is no time at all"):
        kroberta.load_config("small", {"train.time_budget": "0m"})


@pytest.mark.fast
def test_train_steps_given_with_a_time_budget_is_refused_in_one_line():
    config, sources = from_command_line("small", ["--train.steps=3000", "--train.time_budget=15m"])
    with pytest.raises(ConfigError) as raised:
        validate(config, sources)
    assert str(raised.value) == (
        "command line: train.steps: 3000 and train.time_budget='15m' both set the run's length: "
        "set one (leave train.steps out and the budget fixes it; --train.time_budget='' counts "
        "the run in steps)"
    )
    with pytest.raises(
        ConfigError, match=r"^overrides: train.steps: 10 and train.time_budget='1m'"
    ):
        kroberta.load_config(None, {"train.steps": 10, "train.time_budget": "1m"})
    # Counting in steps again, or a budget on the command line over a file's steps: one length.
    config, sources = from_command_line("small", ["--train.steps=3000", "--train.time_budget="])
    assert validate(config, sources).train.steps == 3000
    config, sources = from_command_line("tiny", ["--train.time_budget=2m"])
    assert validate(config, sources).train.time_budget == "2m"


@pytest.mark.fast
def test_a_budget_runs_recorded_config_names_its_fixed_steps_without_a_conflict(tmp_path):
    # A run directory given to --config: its config.toml holds the budget and the steps it fixed.
    config = dataclasses.replace(
        Config(), train=dataclasses.replace(Config().train, time_budget="15m", steps=2340)
    )
    (tmp_path / "config.toml").write_text(to_toml(config))
    (tmp_path / "metrics.jsonl").write_text("")
    loaded, sources = from_command_line(str(tmp_path), [])
    assert validate(loaded, sources).train.steps == 2340
    # The same file elsewhere is a file that gives both.
    (tmp_path / "metrics.jsonl").unlink()
    loaded, sources = from_command_line(str(tmp_path), [])
    with pytest.raises(ConfigError, match=r"train.steps: 2340 and train.time_budget='15m' both"):
        validate(loaded, sources)
