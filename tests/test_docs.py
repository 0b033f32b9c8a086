"""The documentation: the site builds strictly, the configuration reference is generated and
fresh, every command in the docs names a real module and real flags, the README stays short."""

import ast
import contextlib
import dataclasses
import io
import os
import re
import runpy
import shutil
import subprocess
import sys
import warnings

import pytest

from kroberta.config import SECTIONS, TOP_LEVEL_KEYS, Config, apply_overrides, shipped_names
from tests import doc_examples
from tests.conftest import load_tool

REPO = doc_examples.REPO
# Modules whose leftover `--section.key=value` arguments are config overrides.
TAKES_OVERRIDES = ("kroberta.train", "kroberta.aot")


def _generator():
    return load_tool("gen_config_reference")


@pytest.mark.fast
def test_every_config_field_has_a_docstring():
    missing = _generator().undocumented()
    assert not missing, (
        f"config fields without an attribute docstring in kroberta/config.py: "
        f"{', '.join(missing)}; document each on the line after it"
    )


@pytest.mark.fast
def test_the_configuration_reference_is_fresh():
    generator = _generator()
    with open(generator.PAGE, encoding="utf-8") as f:
        checked_in = f.read()
    assert checked_in == generator.render(), (
        f"docs/reference/config.md is stale: run `{generator.COMMAND}`"
    )


@pytest.mark.fast
def test_the_reference_lists_every_key_with_its_default():
    text = _generator().render()
    for name, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            assert f"| `{name}.{f.name}` |" in text
    assert '| `train.steps_per_execution` | integer or "auto" | `"auto"` |' in text


def test_the_site_builds_strictly(tmp_path):
    mkdocs = shutil.which("mkdocs", path=os.path.dirname(sys.executable)) or shutil.which("mkdocs")
    if mkdocs is None:
        pytest.skip('mkdocs is not installed (pip install -e ".[docs]")')
    result = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "site" / "reference" / "config" / "index.html").exists()
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert "run_dir" in api and "fill_mask" in api  # mkdocstrings rendered the docstrings


@pytest.mark.fast
def test_every_page_is_in_the_navigation():
    with open(os.path.join(REPO, "mkdocs.yml"), encoding="utf-8") as f:
        nav = f.read()
    for page in doc_examples.pages()[1:]:
        assert os.path.relpath(page, "docs") in nav, f"{page} is not in mkdocs.yml's nav"


def _help_texts() -> dict:
    """{module: its --help text}, for every module the docs' commands name, each run as
    `python -m MODULE --help` would run it (in this process: the modules are mostly imported
    already)."""
    modules = sorted(
        {
            c[0]
            for page in doc_examples.pages()
            for b in doc_examples.examples(page)
            if b.lang == "bash"
            for c in doc_examples.commands(b)
        }
    )
    texts = {}
    argv = sys.argv
    for module in modules:
        buffer = io.StringIO()
        sys.argv = [module, "--help"]
        try:
            # (runpy warns that the module is imported already: a fresh copy runs as __main__.)
            with contextlib.redirect_stdout(buffer), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit:
            pass
        except ImportError as error:
            buffer.write(f"cannot import: {error}")
        finally:
            sys.argv = argv
        texts[module] = buffer.getvalue()
    return texts


def _config_keys() -> set:
    keys = set(TOP_LEVEL_KEYS)
    for name, cls in SECTIONS.items():
        keys |= {f"{name}.{f.name}" for f in dataclasses.fields(cls)}
    return keys


@pytest.mark.fast
def test_every_command_in_the_docs_names_a_real_module_and_real_flags():
    """Each `python -m kroberta.X ...` in README.md and docs/ (skipped examples too): X exists,
    every `--flag` is one of its --help options, and for train/aot every `--section.key=value`
    is a config key whose value has the right type."""
    helps = _help_texts()
    keys = _config_keys()
    checked = 0
    for page in doc_examples.pages():
        for block in doc_examples.examples(page):
            if block.lang != "bash":
                continue
            for module, *argv in doc_examples.commands(block):
                where = f"{block.name}: python -m {module} {' '.join(argv)}"
                text = helps.get(module, "")
                assert text.startswith("usage:"), f"{where}: no such command ({text[:200]})"
                options = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))
                overrides = []
                for word in argv:
                    if not word.startswith("--"):
                        continue
                    flag = word.split("=", 1)[0]
                    if flag in options:
                        continue
                    assert module in TAKES_OVERRIDES and flag[2:] in keys, (
                        f"{where}: {flag} is neither an option of {module} nor a config key"
                    )
                    overrides.append(word[2:])
                apply_overrides(Config(), overrides)  # types, as the CLI does
                if "--config" in argv:
                    name = argv[argv.index("--config") + 1]
                    assert name in shipped_names(), f"{where}: no shipped config {name!r}"
                checked += 1
    assert checked >= 10


@pytest.mark.fast
def test_troubleshooting_covers_every_error_class():
    """Every subclass of KrobertaError in the package has a section or a row."""
    bases = {}
    for root, _, files in os.walk(os.path.join(REPO, "kroberta")):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(root, name), encoding="utf-8") as f:
                    tree = ast.parse(f.read())
                for node in ast.walk(tree):
                    if isinstance(node, ast.ClassDef):
                        bases[node.name] = {
                            getattr(b, "id", getattr(b, "attr", "")) for b in node.bases
                        }
    errors = {"KrobertaError"}
    while True:
        more = {n for n, b in bases.items() if b & errors} - errors
        if not more:
            break
        errors |= more
    with open(os.path.join(REPO, "docs", "troubleshooting.md"), encoding="utf-8") as f:
        page = f.read()
    missing = sorted(e for e in errors if e not in page)
    assert not missing, f"docs/troubleshooting.md does not explain {', '.join(missing)}"


@pytest.mark.fast
def test_reliability_lists_every_exit_code():
    from kroberta import cli

    with open(os.path.join(REPO, "docs", "reliability.md"), encoding="utf-8") as f:
        page = f.read()
    for name in ("BAD_INPUT", "DIVERGED", "INTERRUPTED", "PREEMPTED"):
        assert f"| {getattr(cli, name)} |" in page, (
            f"exit code {name} missing from docs/reliability.md"
        )


@pytest.mark.fast
def test_the_readme_is_short_and_for_users():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    assert len(text.splitlines()) <= 250
    dated = re.findall(r".*(?:20\d\d-\d\d-\d\d|\d\d:\d\d UTC).*", text)
    assert not dated, f"dates belong on docs/benchmarks pages: {dated}"
    for link in re.findall(r"\]\(((?:docs/)[^)#]+)", text):
        assert os.path.exists(os.path.join(REPO, link)), f"README links to a missing page: {link}"


@pytest.mark.fast
def test_no_comment_cites_the_readme_for_a_reason():
    """Design reasons live on docs pages; a comment points at the page that holds one."""
    cited = []
    for root, _, files in os.walk(os.path.join(REPO, "kroberta")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                with open(path, encoding="utf-8") as f:
                    for number, line in enumerate(f, 1):
                        if "README" in line:
                            cited.append(f"{os.path.relpath(path, REPO)}:{number}")
    assert not cited, f"point these at the docs page instead: {cited}"
