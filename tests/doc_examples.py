"""The examples in README.md and docs/**/*.md, and the one mechanism that runs them small.

Every ```bash and ```python block of those pages is an example that the tests run
(tests/test_doc_examples.py), in the order of its page, all blocks of one page in one
temporary directory (a workspace), so a page can prepare data, train on it and predict
from the run in turn. A block preceded by the line `<!-- example: skip (REASON) -->`
(the marker applies to the next block) is not run; the tests list it with its reason.

Small sizes come from one table, `SMALL`, and nowhere else:
- its flags are appended to every `python -m kroberta.X ...` command of module X: the
  workspace's `bin/python`, first on the PATH, adds them and then runs the real
  interpreter (later flags win: argparse keeps the last value, config overrides apply
  in order);
- its dotted `train.*` / `model.*` keys are applied by `kroberta.load_config` in the
  Python blocks, after the block's own overrides (a prelude wraps it).
So a page shows the command a user runs, and the test runs that same command, shorter.

Each workspace holds a small corpus: `corpus/part0.txt`, `corpus/part1.txt` (text with
enough distinct words for a 10000-token vocabulary) and `dump/part0.jsonl.gz` (JSON
lines whose text is in the field "body"). A block may name what it must leave behind in
a comment line `# writes: PATH, PATH`, and a text its output must hold in `# prints: TEXT`;
the test checks those after the block.
"""

import dataclasses
import gzip
import json
import os
import random
import re
import shlex

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = re.compile(r"<!--\s*example:\s*skip\s*\((?P<reason>.+)\)\s*-->")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w-]*)\s*$")
WRITES = re.compile(r"^\s*#\s*writes:\s*(?P<paths>.+)$")
PRINTS = re.compile(r"^\s*#\s*prints:\s*(?P<text>.+)$")
COMMAND = re.compile(r"python -m (?P<module>kroberta(?:\.\w+)+)")

# The one table of small sizes: flags appended to `python -m MODULE` commands.
SMALL = {
    "kroberta.train": [
        "--train.steps=2",
        "--train.warmup_steps=1",
        "--train.warmup_fraction=0",
        "--train.log_every=1",
        "--train.eval_every=2",
        "--train.eval_steps=1",
        "--train.checkpoint_every=1",
        "--train.steps_per_execution=1",
        "--train.batch_size_per_device=2",
        "--model.num_layers=1",
        "--model.hidden_dim=32",
        "--model.num_heads=2",
        "--model.intermediate_dim=64",
        "--no-examples",
    ],
    "kroberta.finetune": ["--seeds=1", "--epochs=1", "--learning-rates=1e-4"],
}


def small_overrides() -> dict:
    """SMALL's dotted config flags of kroberta.train as `load_config` overrides."""
    out = {}
    for flag in SMALL["kroberta.train"]:
        if "=" in flag:
            key, value = flag[2:].split("=", 1)
            out[key] = int(value) if value.lstrip("-").isdigit() else value
    return out


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: str  # relative to the repository
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip: str | None  # the skip marker's reason, or None

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"

    def writes(self) -> list[str]:
        """The paths named in `# writes:` comments."""
        paths = []
        for line in self.code.splitlines():
            match = WRITES.match(line)
            if match:
                paths += [p.strip() for p in match.group("paths").split(",") if p.strip()]
        return paths

    def prints(self) -> list[str]:
        """The texts named in `# prints:` comments (each must appear in the block's output)."""
        return [m.group("text").strip() for m in map(PRINTS.match, self.code.splitlines()) if m]


def pages() -> list[str]:
    """README.md and every page under docs/, relative to the repository."""
    docs = []
    for root, _, files in os.walk(os.path.join(REPO, "docs")):
        docs += [os.path.relpath(os.path.join(root, f), REPO) for f in files if f.endswith(".md")]
    return ["README.md", *sorted(docs)]


def blocks(page: str) -> list[Block]:
    """The fenced code blocks of `page`, in order, with their skip markers."""
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
        lines = f.read().splitlines()
    found, skip, i = [], None, 0
    while i < len(lines):
        marker = SKIP.search(lines[i])
        if marker:
            skip = marker.group("reason")
        fence = FENCE.match(lines[i])
        if fence:
            indent, start = len(fence.group("indent")), i
            body = []
            i += 1
            while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
                line = lines[i]
                body.append(line[indent:] if line[:indent].strip() == "" else line.lstrip())
                i += 1
            found.append(Block(page, start + 1, fence.group("lang"), "\n".join(body) + "\n", skip))
            skip = None
        i += 1
    return found


def examples(page: str) -> list[Block]:
    """The page's bash and python blocks (the examples), skipped ones included."""
    return [b for b in blocks(page) if b.lang in ("bash", "python")]


def commands(block: Block) -> list[list[str]]:
    """Each `python -m kroberta.X ...` command of a bash block, as argv after the module."""
    text = re.sub(r"\\\n", " ", block.code)
    found = []
    for line in text.splitlines():
        line = line.split(" #", 1)[0] if not line.lstrip().startswith("#") else ""
        for part in re.split(r"&&|;|\|\|", line):
            match = COMMAND.search(part)
            if match:
                rest = part[match.end() :]
                if (
                    rest.count('"') % 2
                ):  # the end of a quoted remote command (gcloud --command="...")
                    rest = rest.replace('"', "")
                found.append([match.group("module"), *shlex.split(rest)])
    return found


def write_corpus(root: str) -> None:
    """The small corpus every workspace holds (see the module docstring)."""
    rng = random.Random(0)
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(30000)]
    common = "the a of and to in is that it was for on with as at by".split()

    def document():
        sentences = []
        for _ in range(rng.randint(2, 5)):
            sentence = " ".join(
                rng.choice(common) if rng.random() < 0.4 else rng.choice(words)
                for _ in range(rng.randint(6, 16))
            )
            sentences.append(sentence.capitalize() + ".")
        return " ".join(sentences)

    os.makedirs(os.path.join(root, "corpus"), exist_ok=True)
    for part in range(2):
        with open(os.path.join(root, "corpus", f"part{part}.txt"), "w") as f:
            f.write("\n\n".join(document() for _ in range(1500)) + "\n")
    os.makedirs(os.path.join(root, "dump"), exist_ok=True)
    with gzip.open(os.path.join(root, "dump", "part0.jsonl.gz"), "wt") as f:
        for number in range(300):
            f.write(json.dumps({"id": number, "body": document()}) + "\n")


def write_python_shim(root: str, python: str) -> str:
    """Writes root/bin/python, which appends SMALL's flags to `-m MODULE` commands and runs
    `python`; returns the bin directory (put it first on the PATH)."""
    cases = "".join(
        f'    {module}) set -- "$@" {" ".join(shlex.quote(f) for f in flags)} ;;\n'
        for module, flags in SMALL.items()
    )
    script = (
        "#!/usr/bin/env bash\n"
        "# tests/doc_examples.py: the docs' commands with small sizes appended.\n"
        'if [ "$1" = "-m" ]; then\n  case "$2" in\n' + cases + "  esac\nfi\n"
        f'exec {shlex.quote(python)} "$@"\n'
    )
    bin_dir = os.path.join(root, "bin")
    os.makedirs(bin_dir, exist_ok=True)
    path = os.path.join(bin_dir, "python")
    with open(path, "w") as f:
        f.write(script)
    os.chmod(path, 0o755)
    return bin_dir


PYTHON_PRELUDE = f"""\
# tests/doc_examples.py: kroberta.load_config applies SMALL's sizes after the block's own.
import kroberta.config


def _small(load_config):
    def load_small(name_or_path=None, overrides=None):
        return load_config(name_or_path, {{**(overrides or {{}}), **{small_overrides()!r}}})
    return load_small


kroberta.config.load_config = _small(kroberta.config.load_config)
del _small
"""
