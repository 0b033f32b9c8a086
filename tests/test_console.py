"""Progress (train, finetune, prepare): one redrawn line in a terminal, rows in a log file."""

import io

import pytest

from kroberta import console

# The fast tier (docs/contributing.md): builds no model and starts no process.
pytestmark = pytest.mark.fast


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _screen(text):
    """The lines a terminal shows: each redraw (after "\r") covers the one before."""
    return [line.split("\r")[-1] for line in text.split("\n")]


def test_a_log_file_gets_no_bar():
    assert console.live_progress(100, stream=io.StringIO()) is None
    assert not console.in_jupyter()  # pytest is no Jupyter kernel


def test_a_terminal_gets_one_line_redrawn_in_place():
    out = _Terminal()
    bar = console.live_progress(200, start_step=100, stream=out)
    assert isinstance(bar, console.TerminalBar)
    for step in range(110, 201, 10):
        bar.update(step, {"loss": 5.0 - step / 100, "masked_accuracy": 0.1, "step": step})
    assert "\n" not in out.getvalue()  # ten updates, still one line
    assert out.getvalue().count("\r") == 10
    bar.close()
    final = out.getvalue().split("\r")[-1]
    assert final.startswith("step 200/200 [" + "=" * 30 + "] 100%  loss 3  masked_accuracy 0.1")
    assert final.endswith("\n") and "eta" not in final


def test_a_note_gets_its_own_line_and_the_bar_comes_back():
    out = _Terminal()
    bar = console.live_progress(100, stream=out)
    bar.update(50, {"loss": 4.0})
    bar.note("step 50/100 [validation] loss 4.5")
    lines = _screen(out.getvalue())
    assert len(lines) == 2
    assert lines[0].rstrip() == "step 50/100 [validation] loss 4.5"
    assert len(lines[0]) >= len("step 50/100 [") + 30  # the longer bar under it is blanked
    assert lines[1].startswith("step 50/100 [" + "=" * 15 + ">")  # redrawn below
    assert "eta" in lines[1]


def test_the_bar_text_at_the_start_and_half_way():
    bar = console._Bar(total_steps=40, start_step=0)
    assert bar.text(width=10) == "step 0/40 [>.........]   0%"
    bar.step, bar.values = 20, {"samples_per_second": 512.25, "perplexity": 9.0}
    assert bar.text(width=10).startswith(
        "step 20/40 [=====>....]  50%  samples_per_second 512.2  eta "
    )


def test_a_byte_count_in_a_log_file_gets_a_row_every_few_seconds(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(console.time, "perf_counter", lambda: clock[0])
    out = io.StringIO()
    progress = console.Progress(10_000_000, "encode+pack+write", stream=out)
    for _ in range(40):  # 4 MB in 40 s
        clock[0] += 1.0
        progress.add(100_000)
    assert progress.close() == 40.0
    rows = out.getvalue().splitlines()
    assert len(rows) == 40 // console.LOG_EVERY_S + 1, "a row every LOG_EVERY_S and one at the end"
    assert (
        rows[0].startswith("encode+pack+write: [===>")
        and "1.0/10.0 MB  0.10 MB/s  eta 1:30" in rows[0]
    )
    assert "4.0/10.0 MB" in rows[-1] and "\r" not in out.getvalue()


def test_a_byte_count_in_a_terminal_is_one_line_and_off_when_disabled():
    out = _Terminal()
    progress = console.Progress(2_000_000, "tokenizer", stream=out)
    assert isinstance(progress.display, console.TerminalBar)
    progress.add(2_000_000)
    progress.close()
    assert _screen(out.getvalue())[0].startswith("tokenizer: [" + "=" * 30 + "] 2.0/2.0 MB")
    assert out.getvalue().endswith("\n") and out.getvalue().count("\n") == 1
    quiet = _Terminal()
    off = console.Progress(10, "tokenizer", enabled=False, stream=quiet)
    off.add(10)
    off.note("a line")
    off.close()
    assert quiet.getvalue() == ""


def test_steps_in_a_log_go_to_the_rows_callable_with_notes_between(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(console.time, "perf_counter", lambda: clock[0])
    rows = []
    progress = console.Progress(100, stream=io.StringIO(), rows=rows.append)
    for step in range(1, 31):
        clock[0] += 1.0
        progress.update(step, {"loss": 1.0 / step})
    progress.note("epoch 1/3: loss 0.05")
    progress.erase()
    assert len(rows) == 4 and rows[-1] == "epoch 1/3: loss 0.05"
    assert rows[0].startswith("step 10/100 [===>") and "loss 0.1  eta 1:30" in rows[0]


def test_a_title_leads_every_row_once_and_notes_stay_as_given(monkeypatch):
    # A fine-tune's log: each row names its trial once; its epoch lines already do.
    clock = [0.0]
    monkeypatch.setattr(console.time, "perf_counter", lambda: clock[0])
    rows = []
    progress = console.Progress(
        100, stream=io.StringIO(), rows=rows.append, title="sst2 lr 0.001 seed 0"
    )
    for step in range(1, 12):
        clock[0] += 1.0
        progress.update(step, {"loss": 0.5})
    progress.note("sst2 lr 0.001 seed 0: epoch 1/3: loss 0.5")
    assert rows[0].startswith("sst2 lr 0.001 seed 0: step 10/100 [")
    assert rows[-1] == "sst2 lr 0.001 seed 0: epoch 1/3: loss 0.5"
    assert all(row.count("sst2 lr 0.001 seed 0") == 1 for row in rows)


def test_a_count_of_examples_shows_done_rate_and_seconds_known_total_or_not(monkeypatch):
    # predict's examples: a row at the end in a log, with or without a known total.
    clock = [0.0]
    monkeypatch.setattr(console.time, "perf_counter", lambda: clock[0])
    for total, count in ((45, "45/45 examples [" + "=" * 30 + "]"), (None, "45 examples")):
        out = io.StringIO()
        progress = console.Progress(total, "predict", stream=out, unit="examples")
        for _ in range(3):
            clock[0] += 1.0
            progress.add(15)
        progress.close()
        assert out.getvalue() == f"predict: {count}  15/s  3.0s\n"
        slow = io.StringIO()
        progress = console.Progress(total, "predict", stream=slow, unit="examples")
        clock[0] += 20.0
        progress.add(3)
        assert (
            slow.getvalue().splitlines()[0].startswith("predict: 3")
            and "  0.1/s  20.0s" in slow.getvalue()
        )
