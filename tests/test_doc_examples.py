"""Every example in README.md and docs/ runs as written, with small sizes (tests/doc_examples.py).

The blocks of a page run in order in one workspace (a page prepares, trains and predicts:
the README's in the default suite, the other pages' in the slow one); the default suite
also checks every command's module and flags (tests/test_docs.py) and lists the skipped
blocks here.
"""

import os
import subprocess
import sys

import pytest

from tests import doc_examples

RUNNABLE = [
    page for page in doc_examples.pages() if any(not b.skip for b in doc_examples.examples(page))
]
SKIPPED = [b for page in doc_examples.pages() for b in doc_examples.examples(page) if b.skip]

# Pages whose examples wait on a change in progress elsewhere in the package: {page: reason}.
EXPECTED_TO_FAIL = {}


def _environment(workspace: str) -> dict:
    env = dict(os.environ)
    bin_dir = doc_examples.write_python_shim(workspace, sys.executable)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = doc_examples.REPO + os.pathsep + env.get("PYTHONPATH", "")
    # A user's CPU machine: one device, not the 4 simulated ones of the test suite.
    flags = env.get("XLA_FLAGS", "").split()
    env["XLA_FLAGS"] = " ".join(
        f for f in flags if not f.startswith("--xla_force_host_platform_device_count")
    )
    env["JAX_PLATFORMS"] = "cpu"
    return env


def run_block(block: doc_examples.Block, workspace: str, env: dict) -> subprocess.CompletedProcess:
    """Runs one example in `workspace`; fails the test with its output unless it exits 0,
    leaves the paths its `# writes:` comments name and prints what its `# prints:` ones quote."""
    if block.lang == "bash":
        argv = ["bash", "-euo", "pipefail", "-c", block.code]
    else:
        script = os.path.join(workspace, f"_example_{block.line}.py")
        with open(script, "w") as f:
            f.write(doc_examples.PYTHON_PRELUDE + "\n" + block.code)
        argv = [sys.executable, script]
    result = subprocess.run(
        argv, cwd=workspace, env=env, capture_output=True, text=True, timeout=900
    )
    output = (result.stdout + result.stderr)[-4000:]
    assert result.returncode == 0, (
        f"{block.name} exited {result.returncode}:\n{block.code}\n{output}"
    )
    for path in block.writes():
        assert os.path.exists(os.path.join(workspace, path)), (
            f"{block.name} did not write {path}:\n{output}"
        )
    for text in block.prints():
        assert text in result.stdout + result.stderr, (
            f"{block.name} did not print {text!r}:\n{output}"
        )
    return result


# The README's examples (prepare, train the seed config, predict, export: what a new user
# runs first) in the default suite; the other pages in the slow one.
DEFAULT_SUITE_PAGES = ("README.md",)


@pytest.mark.parametrize(
    "page",
    [
        page if page in DEFAULT_SUITE_PAGES else pytest.param(page, marks=pytest.mark.slow)
        for page in RUNNABLE
    ],
)
def test_the_examples_of_a_page_run_in_order(page, tmp_path, request):
    if page in EXPECTED_TO_FAIL:
        request.applymarker(pytest.mark.xfail(strict=False, reason=EXPECTED_TO_FAIL[page]))
    workspace = str(tmp_path)
    doc_examples.write_corpus(workspace)
    env = _environment(workspace)
    for block in doc_examples.examples(page):
        if not block.skip:
            run_block(block, workspace, env)


@pytest.mark.parametrize("block", SKIPPED, ids=[b.name for b in SKIPPED])
def test_skipped_examples_say_why(block):
    """Lists each skipped example with its reason (pytest -ra shows them)."""
    assert len(block.skip) > 10, f"{block.name}: give the reason it cannot run here"
    pytest.skip(f"{block.name}: {block.skip}")


def test_every_example_is_bash_or_python_or_says_why_not():
    for page in doc_examples.pages():
        for block in doc_examples.blocks(page):
            assert block.lang in ("bash", "python", "text", "toml", "json", "yaml"), (
                f"{block.name}: a ```{block.lang} block; use bash or python (run by the tests), "
                "or text for what is not a command"
            )


def test_the_python_shim_appends_the_small_sizes(tmp_path):
    """The one mechanism, on its own: `python -m kroberta.train ...` in a workspace gets SMALL's
    flags after its own; other commands pass through unchanged."""
    bin_dir = doc_examples.write_python_shim(str(tmp_path), "echo")
    shim = os.path.join(bin_dir, "python")
    out = subprocess.run(
        [shim, "-m", "kroberta.train", "--config", "seed"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == [
        "-m",
        "kroberta.train",
        "--config",
        "seed",
        *doc_examples.SMALL["kroberta.train"],
    ]
    out = subprocess.run(
        [shim, "-m", "kroberta.report", "runs/x"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["-m", "kroberta.report", "runs/x"]


def test_the_python_prelude_applies_the_small_sizes():
    import kroberta
    import kroberta.config

    original = kroberta.config.load_config
    try:
        exec(doc_examples.PYTHON_PRELUDE, {})
        config = kroberta.load_config("seed", {"train.steps": 500, "data.masking": "dynamic"})
        assert config.train.steps == 2 and config.model.hidden_dim == 32
        assert config.data.masking == "dynamic"  # the block's own keys are kept
    finally:
        kroberta.config.load_config = original
