"""train.profile (kroberta.training.profiling): a trace of exactly the window's dispatches, on
dispatch boundaries, and clear errors for a bad window."""

import dataclasses
import gzip
import json

import pytest

from kroberta import train
from kroberta.config import parse_window, validate
from kroberta.errors import ConfigError
from kroberta.training import profiling
from tests.conftest import tiny_config


def test_window_parses_and_widens_to_dispatch_boundaries():
    assert parse_window("") is None
    assert parse_window("100:120") == (100, 120)
    assert profiling.aligned_window((100, 120), 1, 1000) == (100, 120)
    assert profiling.aligned_window((5, 7), 2, 1000) == (4, 8)
    assert profiling.aligned_window((33, 70), 32, 1000) == (32, 96)
    assert profiling.aligned_window((33, 70), 32, 80) == (32, 80)  # the run's end ends a dispatch


@pytest.mark.parametrize(
    "value, problem",
    [
        ("7", 'expected "START:STOP"'),
        ("a:b", 'expected "START:STOP"'),
        ("5:5", "START must be below STOP"),
        ("-1:4", 'expected "START:STOP"'),
        ("300:400", "starts at step 300, but the run ends at train.steps=200"),
    ],
)
def test_bad_window_is_a_config_error(tiny_data, tmp_path, value, problem):
    with pytest.raises(ConfigError, match=r"train.profile: .*" + problem.replace("(", r"\(")):
        validate(tiny_config(tiny_data, tmp_path, profile=value))


def test_trace_holds_the_window_and_nothing_outside_it(tiny_data, tmp_path, caplog):
    # 12 steps, 2 per dispatch: steps 5:7 widen to 4:8, the dispatches at steps 4 and 6;
    # those at 0, 2, 8 and 10 run untraced (one log interval: no evaluation in between).
    config = tiny_config(
        tiny_data,
        tmp_path / "run",
        steps=12,
        warmup_steps=2,
        log_every=12,
        eval_every=12,
        checkpoint_every=12,
        steps_per_execution=2,
        profile="5:7",
    )
    config = dataclasses.replace(
        config, distributed=dataclasses.replace(config.distributed, devices=1)
    )
    train(config)
    out = caplog.text
    assert "steps 5:7 widened to 4:8" in out and "tracing steps 5-8" in out
    traces = list((tmp_path / "run" / "profile" / "plugins" / "profile").iterdir())
    assert len(traces) == 1  # one trace
    files = {p.name for p in traces[0].iterdir()}
    assert "perfetto_trace.json.gz" in files and any(f.endswith(".xplane.pb") for f in files)
    with gzip.open(traces[0] / "perfetto_trace.json.gz") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    calls = sorted(
        (e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "PjitFunction(run)"
    )  # the fused K-step program
    # Each call shows as a pair of nested spans (the jitted wrapper and its callee).
    outermost = [
        c for c in calls if not any(o != c and o[0] <= c[0] and c[1] <= o[1] for o in calls)
    ]
    assert len(calls) >= 2 and len(outermost) == 2
