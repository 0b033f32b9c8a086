"""Training progress: one redrawn line in a terminal, plain lines in a log file."""

import io

import pytest

from kroberta.training import console

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
        "step 20/40 [=====>....]  50%  samples_per_second 512.2  eta ")
