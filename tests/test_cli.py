"""One way for every `python -m kroberta.X` to end: exit codes and the error line."""

import pytest

from kroberta import cli
from kroberta.errors import ConfigError, DivergedError, KrobertaError, StorageError


def _raise(error):
    def body():
        raise error

    return body


@pytest.mark.parametrize("error", [ConfigError("bad key"), StorageError("disk full")])
@pytest.mark.fast
def test_kroberta_errors_are_bad_input(error, capsys):
    assert isinstance(error, KrobertaError)
    assert cli.run(_raise(error)) == 2
    assert capsys.readouterr().err == f"error: {error}\n"


@pytest.mark.fast
def test_divergence_is_3_and_still_a_floating_point_error(capsys):
    error = DivergedError("loss became nan by step 3")
    assert isinstance(error, FloatingPointError)
    assert cli.run(_raise(error)) == 3
    assert capsys.readouterr().err == "error: loss became nan by step 3\n"


@pytest.mark.fast
def test_interrupt_is_130_with_the_command_s_line(capsys):
    assert (
        cli.run(_raise(KeyboardInterrupt()), interrupted="interrupted; nothing was written") == 130
    )
    assert capsys.readouterr().err == "interrupted; nothing was written\n"


@pytest.mark.fast
def test_sigterm_is_143_after_the_cleanups_an_interrupt_runs(capsys):
    import signal

    cleaned = []

    def body():
        try:
            signal.raise_signal(signal.SIGTERM)  # at its default, it would end pytest
        finally:
            cleaned.append(True)

    before = signal.getsignal(signal.SIGTERM)
    assert cli.run(body, interrupted="interrupted; nothing was written") == cli.PREEMPTED == 143
    assert capsys.readouterr().err == "stopped by SIGTERM; nothing was written\n"
    assert cleaned == [True]
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is undone


@pytest.mark.fast
@pytest.mark.parametrize(
    "signum, code, line", [("SIGTERM", 143, "stopped by SIGTERM"), ("SIGINT", 130, "interrupted")]
)
def test_a_stop_that_lands_in_a_garbage_collector_callback_still_stops(signum, code, line, capsys):
    """JAX's gc callback (`_xla_gc_callback`): an exception raised there is only printed
    ("Exception ignored in ..."), and the command would run on to the end."""
    import gc
    import signal
    import time

    def landing_in_the_callback(phase, info):
        gc.callbacks.remove(landing_in_the_callback)
        signal.raise_signal(getattr(signal, signum))  # the handler runs here, inside gc

    def body():
        gc.callbacks.append(landing_in_the_callback)
        gc.collect()
        for _ in range(200):  # 10 s: the stop, sent again, ends this long before
            time.sleep(0.05)
        return 0

    assert cli.run(body) == code
    assert capsys.readouterr().err == line + "\n"  # nothing printed from inside gc


def test_a_stop_inside_an_import_ends_the_command_at_once_with_its_line(tmp_path):
    """Raised inside an import, a KeyboardInterrupt can leave NumPy half imported, and JAX's
    extension then dies of a segmentation fault: the command ends at once instead."""
    import subprocess
    import sys

    (tmp_path / "stopped_in_import.py").write_text(
        "import signal, time\nsignal.raise_signal(signal.SIGTERM)\ntime.sleep(30)\n"
    )
    program = (
        "import sys; from kroberta import cli; sys.path.insert(0, sys.argv[1]); "
        "sys.exit(cli.run(lambda: __import__('stopped_in_import'), "
        "interrupted='interrupted; nothing was written'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", program, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stderr) == (143, "stopped by SIGTERM; nothing was written\n")


@pytest.mark.fast
def test_without_a_way_to_end_at_once_a_stop_waits_for_the_import(tmp_path, monkeypatch):
    import sys
    import time

    (tmp_path / "stopped_mid_import.py").write_text(
        "import signal\nsignal.raise_signal(signal.SIGTERM)\nWHOLE = True\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(cli.Terminated):
        with cli.stop_signals():
            import stopped_mid_import  # noqa: F401 (the import is what is stopped)

            for _ in range(200):  # 10 s: the stop, sent again after the import, ends this
                time.sleep(0.05)
    assert sys.modules["stopped_mid_import"].WHOLE  # imported whole, then stopped


@pytest.mark.fast
def test_sigint_inherited_ignored_still_interrupts(capsys):
    """A command a script starts with `&` inherits SIGINT ignored: it stops all the same."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert cli.run(lambda: signal.raise_signal(signal.SIGINT)) == 130
        assert capsys.readouterr().err == "interrupted\n"
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # given back as it was
    finally:
        signal.signal(signal.SIGINT, previous)
    # A handler installed in Python is the caller's choice: it stays.
    calls = []
    previous = signal.signal(signal.SIGINT, lambda *_: calls.append(1))
    try:
        assert cli.run(lambda: signal.raise_signal(signal.SIGINT)) == 0 and calls == [1]
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.fast
def test_exit_codes_pass_through_and_other_errors_propagate(capsys):
    assert cli.run(lambda: None) == 0
    assert cli.run(lambda: cli.PREEMPTED) == 143
    assert cli.run(_raise(FileNotFoundError("x.npz")), also=(FileNotFoundError,)) == 2
    with pytest.raises(RuntimeError):
        cli.run(_raise(RuntimeError("a bug, not bad input")))


@pytest.mark.fast
def test_running_out_of_device_memory_names_what_to_lower(capsys):
    import jax.numpy as jnp

    def allocate():  # 16 TiB: XLA's own error, raised before any memory is touched
        jnp.ones((2**42,), jnp.float32).block_until_ready()

    assert cli.run(allocate, when_out_of_memory="--batch-size") == 2
    assert capsys.readouterr().err == (
        "error: the device ran out of memory (RESOURCE_EXHAUSTED: Out of memory allocating "
        f"{2**44} bytes.); lower --batch-size\n"
    )
    with pytest.raises(Exception, match="RESOURCE_EXHAUSTED"):  # a command that says nothing
        cli.run(allocate)
    # Other errors keep their ways: bad input, and a bug's traceback.
    assert cli.run(_raise(ConfigError("bad key")), when_out_of_memory="--batch-size") == 2
    assert capsys.readouterr().err == "error: bad key\n"
    with pytest.raises(RuntimeError):
        cli.run(_raise(RuntimeError("a bug")), when_out_of_memory="--batch-size")


@pytest.mark.parametrize("command", ["train", "predict", "prepare", "export", "report", "evaluate"])
def test_help_answers_without_starting_jax_keras_or_tensorflow(command):
    """`--help` (and a bad argument) needs none of the seconds those imports take."""
    import subprocess
    import sys

    from tests.conftest import REPO

    code = (
        "import runpy, sys\n"
        f"sys.argv = ['kroberta.{command}', '--help']\n"
        "try:\n"
        f"    runpy.run_module('kroberta.{command}', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), e.code\n"
        "print('LOADED', sorted(m for m in ('jax', 'keras', 'tensorflow', 'keras_hub')"
        " if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage: python -m kroberta." in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "LOADED []"


COMMANDS = ("train", "predict", "prepare", "export", "aot", "report", "evaluate")


@pytest.mark.parametrize("name", COMMANDS)
@pytest.mark.fast
def test_every_command_is_main_of_argv_returning_its_exit_code(name, capsys):
    import importlib
    import inspect

    command = importlib.import_module(f"kroberta.cli.{name}")
    assert list(inspect.signature(command.main).parameters) == ["argv"]
    with pytest.raises(SystemExit) as exited:  # argparse's own exit after the help text
        command.main(["--help"])
    assert exited.value.code == 0 and f"python -m kroberta.{name}" in capsys.readouterr().out


@pytest.mark.fast
def test_the_python_api_is_functions():
    import importlib
    import inspect

    import kroberta

    for name in ("train", "predict", "prepare", "report"):
        # The file that keeps `python -m kroberta.X` refuses to replace the function.
        with pytest.raises(ImportError, match=f"kroberta.cli.{name}"):
            importlib.import_module(f"kroberta.{name}")
        assert inspect.isfunction(getattr(kroberta, name))
        assert not hasattr(getattr(kroberta, name), "main")  # no former spellings kept


@pytest.mark.fast
def test_a_wrong_argument_is_one_line_and_names_an_expanded_pattern(tmp_path, capsys):
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text("text")
    parser = cli.ArgumentParser(prog="python -m kroberta.x")
    parser.add_argument("--input")
    parser.add_argument("--labels", choices=["static"])
    # `--input corpus/*.txt` unquoted: the shell passed the second file on its own.
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["--input", str(tmp_path / "a.txt"), str(tmp_path / "b.txt")])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        f"python -m kroberta.x: error: unrecognized arguments: {tmp_path / 'b.txt'}; if the "
        f"shell expanded an unquoted pattern into these, quote it: '{tmp_path}/*.txt' "
        "(see --help)\n"
    )
    # A path given alone, as many commands take it: the option it needs is named.
    inputs = cli.ArgumentParser(prog="python -m kroberta.x", inputs="--input")
    inputs.add_argument("--input")
    inputs.add_argument("--out")
    with pytest.raises(SystemExit):
        inputs.parse_args([str(tmp_path / "a.txt"), "--out", "data"])
    assert capsys.readouterr().err == (
        f"python -m kroberta.x: error: unrecognized arguments: {tmp_path / 'a.txt'}; input "
        f"paths follow --input: --input {tmp_path / 'a.txt'} (see --help)\n"
    )
    with pytest.raises(SystemExit):  # --input=... given: the pattern is the likely cause
        inputs.parse_args([f"--input={tmp_path / 'a.txt'}", str(tmp_path / "b.txt")])
    assert "quote it" in capsys.readouterr().err
    # A misspelt option before an existing file: the option is the cause, not a pattern.
    with pytest.raises(SystemExit):
        parser.parse_args(["--inptu", str(tmp_path / "a.txt")])
    assert capsys.readouterr().err == (
        f"python -m kroberta.x: error: unrecognized arguments: "
        f"--inptu {tmp_path / 'a.txt'}; --inptu: did you mean "
        f"--input? (see --help)\n"
    )
    # A misspelt required flag: argparse names the missing one first, the typo is named too.
    required = cli.ArgumentParser(prog="python -m kroberta.x")
    required.add_argument("--model", required=True)
    required.add_argument("--data")
    for argv, hint in (
        (["--modle", "m"], "--modle: did you mean --model?"),
        (["--zzz", "m"], "--zzz: unrecognized"),
    ):
        with pytest.raises(SystemExit):
            required.parse_args(argv)
        assert capsys.readouterr().err == (
            "python -m kroberta.x: error: the following arguments "
            f"are required: --model; {hint} (see --help)\n"
        )
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["--labels", "dynamic"])
    assert exited.value.code == 2
    err = capsys.readouterr().err  # one line; argparse words the choices by Python version
    assert err.startswith("python -m kroberta.x: error: argument --labels: invalid choice: ")
    assert "static" in err and err.endswith(" (see --help)\n") and err.count("\n") == 1


@pytest.mark.fast
def test_a_flag_is_spelled_whole(capsys):
    from kroberta.cli import prepare

    # argparse would take `--vocab 500` for `--vocab-size 500` without a word.
    with pytest.raises(SystemExit) as exited:
        prepare.main(["--input", "x.txt", "--out", "o", "--vocab", "500"])
    assert exited.value.code == 2
    assert "error: unrecognized arguments: --vocab 500" in capsys.readouterr().err


def test_a_wrong_path_fails_before_jax_keras_or_tensorflow_are_imported(tmp_path):
    """Every check that needs no model runs first: the error comes at once (exit 2, its
    line), with none of the heavy libraries imported (each command in an interpreter of
    its own)."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    run = tmp_path / "run"  # what the path checks take for a run: its config.toml
    run.mkdir()
    (run / "config.toml").write_text("")
    train_tsv = tmp_path / "train.tsv"
    train_tsv.write_text("sentence\tgold\na\tb\n")
    missing = str(tmp_path / "missing")
    cases = [
        (
            ["train", f"--run_dir={tmp_path / 'r'}", f"--data.train={missing}.tfrecord"],
            f"error: data.train: no file matches '{missing}.tfrecord'",
        ),
        (
            ["train", f"--run_dir={tmp_path / 'r'}", f"--data.dir={missing}"],
            f"error: data.dir: {missing} is not a directory; give the --out of python -m "
            "kroberta.prepare",
        ),
        (
            ["train", f"--run_dir={train_tsv / 'r'}"],
            f"error: run_dir {train_tsv / 'r'}: {train_tsv} is a file, not a folder; choose "
            "another run_dir",
        ),
        (
            ["predict", "--run", missing, "--data", "x.tfrecord", "--out", str(tmp_path / "p.npz")],
            f"error: --run: {missing}: no such directory; give a training run, a Hugging Face "
            "RoBERTa directory or a keras-hub preset directory",
        ),
        (
            [
                "predict",
                "--run",
                str(run),
                "--data",
                f"{missing}/*.tfrecord",
                "--out",
                str(tmp_path / "p.npz"),
            ],
            f"error: --data: no file matches '{missing}/*.tfrecord'",
        ),
        (
            ["evaluate", "--model", missing, "--data", "x"],
            f"error: --model: {missing}: no such directory; give a training run, a Hugging Face "
            "RoBERTa directory or a keras-hub preset directory",
        ),
        (
            ["evaluate", "--model", str(run), "--data", missing],
            f"error: --data: no file matches '{missing}'",
        ),
        (
            ["export", "--run", missing, "--out", str(tmp_path / "e")],
            f"error: --run: {missing}: no such directory; give a training run, a Hugging Face "
            "RoBERTa directory or a keras-hub preset directory",
        ),
        (
            ["finetune", "--run", missing, "--data", "t.tsv", "--validation", "d.tsv"],
            f"error: --run: {missing}: no such directory; give a training run, a Hugging Face "
            "RoBERTa directory or a keras-hub preset directory",
        ),
        (
            ["finetune", "--run", str(run), "--validation", "d.tsv"],
            "error: validation (--validation) without data (--data, the training file): a "
            "labelled task needs both",
        ),
        (
            ["finetune", "--run", str(run), "--data", f"{missing}.tsv", "--validation", "d.tsv"],
            f"error: --data {missing}.tsv: no such file",
        ),
        (
            [
                "finetune",
                "--run",
                str(run),
                "--data",
                str(train_tsv),
                "--validation",
                str(train_tsv),
            ],
            f"error: {train_tsv}: no column 'label' (columns: sentence, gold; "
            "the first line is read as the header); pick one with --label-field",
        ),
        (
            [
                "finetune",
                "--run",
                str(run),
                "--data",
                str(train_tsv),
                "--validation",
                str(train_tsv),
                "--label-field",
                "gold",
                "--learning-rates",
                "1e-4;3e-4",
            ],
            "error: --learning-rates '1e-4;3e-4': expected numbers separated by commas, "
            "e.g. 1e-5,3e-5",
        ),
        (
            ["finetune", "--classifier", missing, "--predict", "p.tsv", "--predictions", "o.jsonl"],
            f"error: --classifier {missing}: no such directory",
        ),
        (
            [
                "finetune",
                "--classifier",
                str(run),
                "--predict",
                f"{missing}.tsv",
                "--predictions",
                str(tmp_path / "o.jsonl"),
            ],
            f"error: --predict {missing}.tsv: no such file",
        ),
        (["prepare", "--input", f"{missing}.txt", "--out", str(tmp_path / "d")], f"{missing}.txt"),
    ]
    code = (
        "import runpy, sys\n"
        "sys.argv = sys.argv[1:]\n"
        "try:\n"
        "    runpy.run_module(sys.argv[0], run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    print('EXIT', e.code)\n"
        "print('LOADED', sorted(m for m in ('jax', 'keras', 'tensorflow', 'keras_hub')"
        " if m in sys.modules))\n"
    )
    for (command, *argv), message in cases:
        result = subprocess.run(
            [sys.executable, "-c", code, f"kroberta.{command}", *argv],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,
            env={**os.environ, "PYTHONPATH": REPO},
        )
        assert result.stdout.strip().splitlines()[-2:] == ["EXIT 2", "LOADED []"], (
            command,
            argv,
            result.stdout,
            result.stderr[-2000:],
        )
        assert message in result.stderr.strip().splitlines()[-1], (command, argv, result.stderr)


@pytest.mark.parametrize("name", COMMANDS + ("finetune",))
@pytest.mark.fast
def test_help_gives_every_option_s_default(name, monkeypatch, capsys):
    """An option with a default (`--seeds 3`, `--k 5`) says it in `--help`."""
    import argparse
    import importlib
    import re

    parsers = []
    parse_known_args = cli.ArgumentParser.parse_known_args

    def recording(self, *args, **kwargs):
        parsers.append(self)
        return parse_known_args(self, *args, **kwargs)

    monkeypatch.setattr(cli.ArgumentParser, "parse_known_args", recording)
    with pytest.raises(SystemExit):
        importlib.import_module(f"kroberta.cli.{name}").main(["--help"])
    text = capsys.readouterr().out
    # Each option's block: from its flags at the start of a line to the next option's.
    blocks = re.split(r"\n  (?=-)", text.split("options:", 1)[1])
    for action in parsers[0]._actions:
        if not action.option_strings or action.default in (None, argparse.SUPPRESS):
            continue
        if action.default is False:
            continue
        block = next(b for b in blocks if b.startswith(action.option_strings[0]))
        assert "default" in " ".join(block.split()), (name, action.option_strings, block)
