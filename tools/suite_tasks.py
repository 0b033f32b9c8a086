"""The downstream suite's tasks: classification tasks of real text this machine has and no
one here wrote, and the pretraining corpus beside them (used by tools/bench_suite.py).

Every source yields (unit, label, text): the unit is what a split keeps whole (a man page,
a package, a source file). Units go by a stable hash (`bench_downstream.bucket`: 3 in 5
pretraining, 1 in 5 the task's training, 1 in 5 its validation), so no validation text is
in the corpus or the training set; `build_suite` then drops any example whose exact text
the corpus or the other split holds (a description two packages share).

  task            source                          labels                             kind
  man             man pages (/usr/share/man)      section 1, 2, 3, 5, 7, 8           semantic-ish, own text
  debian-other    `apt-cache dumpavail`           archive section (admin, games,     topic, neighbouring
                                                  net, science, text, utils)
  debian-few      the same, 40 labelled a class   the same                           topic, few-shot, neighbouring
  library         docstrings of numpy, scipy,     which library                      topic, few-shot, own text
                  sympy, pandas, matplotlib, torch
  docstring-kind  the standard library's          module, class, function, method    semantic, neighbouring
                  docstrings (this interpreter's)
  registry        PyPI and npm package summaries  which registry                     semantic (style), neighbouring
                  (/work/.library/env/packages)
  changelog       Debian changelog entries        new upstream version, Debian       semantic, few-shot, neighbouring
                  (/usr/share/doc/*/changelog.    revision, non-maintainer upload,
                  Debian.gz)                      stable update

Why these labels. A man page's section says what kind of thing it documents (a command,
a system call, a library function, a file format, an overview, an administration tool),
not its topic: `open(1)`, `open(2)` and `open(3)` share words. A docstring's kind (does
it document a module, a class, a function or a method) is told by how it is written
("Return ...", "A class that ..."), not by what it is about. A package summary's registry
is style: nothing in "A fast JSON parser" says PyPI or npm. A changelog entry's label
comes from its version, which the text does not hold (the entry's body only): a new
upstream version (Debian revision 1), a maintainer's revision (2 and up), a
non-maintainer upload (x.y) or a stable update (+debNuM, ~debNuM); the lines that only
restate the label ("Non-maintainer upload.", "New upstream release.") are removed. The
package's section and the library are topic labels: keywords carry them.

"own text": the corpus holds the task's training units (labels dropped) besides other
units of the same kind; "neighbouring": it holds no unit of the task, only text of the
same kind (other units; for debian-*, only packages of the other sections).
"""

import ast
import dataclasses
import glob
import gzip
import hashlib
import os
import random
import re
import subprocess
import sys
import sysconfig
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_downstream as common  # noqa: E402  (a sibling script: bucket, passages, sources)

LIBRARIES = ("numpy", "scipy", "sympy", "pandas", "matplotlib", "torch")
FILES_PER_LIBRARY = 600  # torch alone has thousands of files; a hash-chosen 600 is plenty
DOC_WORDS = (8, 120)  # an example's words: fewer is dropped, more is cut
DOCUMENT_LINES = 20  # one-line texts (summaries, descriptions) go 20 to a corpus document
PACKAGES_TSV = "/work/.library/env/packages"


# ---------------------------------------------------------------- sources
def man_source():
    """(page, section, text) of the man pages of `common.SECTIONS_MAN`."""
    return list(common.man_pages())


def debian_source():
    """(package, section, one-line description) of `apt-cache dumpavail` (none without apt;
    an empty list means `apt-get update` has not run)."""
    try:
        return list(common.debian_packages())
    except (OSError, subprocess.CalledProcessError):
        return []


def _docstrings(path: str):
    """(kind, docstring) of one Python file: module, class, function or method."""
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read())
    except (SyntaxError, ValueError, OSError, RecursionError):
        return
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Module):
            kind = "module"
        elif isinstance(node, ast.ClassDef):
            kind = "class"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            kind = "method" if isinstance(parents.get(node), ast.ClassDef) else "function"
        else:
            continue
        doc = ast.get_docstring(node, clean=True)
        if doc and len(doc.split()) >= DOC_WORDS[0]:
            yield kind, " ".join(doc.split()[: DOC_WORDS[1]])


def _python_files(root: str, most: int | None = None) -> list:
    files = [
        p
        for p in glob.glob(os.path.join(root, "**", "*.py"), recursive=True)
        if not re.search(r"/(tests?|testing|_vendor|site-packages)/", p[len(root) :])
    ]
    files.sort(key=lambda p: zlib.crc32(p[len(root) :].encode()))
    return files[:most]


def library_source():
    """(library/file, library, docstring) of the installed `LIBRARIES`."""
    site = sysconfig.get_paths()["purelib"]
    rows = []
    for library in LIBRARIES:
        root = os.path.join(site, library)
        for path in _python_files(root, FILES_PER_LIBRARY):
            unit = f"{library}/{os.path.relpath(path, root)}"
            rows += [(unit, library, doc) for _, doc in _docstrings(path)]
    return rows


def stdlib_source():
    """(file, kind, docstring) of this interpreter's standard library."""
    root = sysconfig.get_paths()["stdlib"]
    return [
        (os.path.relpath(path, root), kind, doc)
        for path in _python_files(root)
        for kind, doc in _docstrings(path)
    ]


def _summaries(path: str, column: int):
    with open(path, encoding="utf-8", errors="replace") as f:
        next(f)  # the column names
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if len(fields) > column:
                text = re.sub(r"^\[tested here:[^\]]*\]\s*", "", fields[column]).strip()
                if len(text.split()) >= 5:
                    yield fields[0], text


def registry_source(most: int = 40_000):
    """(registry/name, registry, summary) of PyPI and npm packages (a hash-chosen sample of
    at most `most` a registry)."""
    rows = []
    for registry, file, column in (("pypi", "pypi.tsv", 4), ("npm", "npm.tsv", 3)):
        path = os.path.join(PACKAGES_TSV, file)
        if not os.path.isfile(path):
            continue
        found = [(f"{registry}/{name}", registry, text) for name, text in _summaries(path, column)]
        found.sort(key=lambda row: zlib.crc32(row[0].encode()))
        rows += found[:most]
    return rows


_CHANGELOG_HEADER = re.compile(r"^(\S+) \(([^)]+)\) [^;]+; urgency=\w+", re.M)
_RESTATES_LABEL = re.compile(r"non[- ]maintainer upload|new upstream (?:release|version)", re.I)


def changelog_kind(version: str) -> str | None:
    """The kind of change a Debian version names, None for others (native, experimental)."""
    if re.search(r"[+~]deb\d+u\d+", version):
        return "stable-update"
    if "-" not in version:
        return None
    revision = version.rsplit("-", 1)[1]
    if revision == "1":
        return "new-upstream"
    if re.fullmatch(r"[2-9]|\d\d", revision):
        return "revision"
    if re.fullmatch(r"\d+\.\d+", revision):
        return "non-maintainer"
    return None


def changelog_source(most_per_package: int = 30):
    """(source package, kind, entry body) of /usr/share/doc/*/changelog.Debian.gz, the
    newest `most_per_package` entries of each source package."""
    rows, seen = [], set()
    for path in sorted(glob.glob("/usr/share/doc/*/changelog.Debian.gz")):
        try:
            with gzip.open(path, "rt", errors="replace") as f:
                text = f.read()
        except (OSError, EOFError):
            continue
        headers = list(_CHANGELOG_HEADER.finditer(text))
        for header, after in zip(
            headers[:most_per_package], headers[1 : most_per_package + 1] + [None]
        ):
            source, version = header.group(1), header.group(2)
            kind = changelog_kind(version)
            if kind is None or (source, version) in seen:
                continue
            seen.add((source, version))
            body = text[header.end() : after.start() if after else len(text)].split("\n -- ")[0]
            lines = [line.strip().lstrip("*+-").strip() for line in body.splitlines()]
            words = " ".join(
                line for line in lines if line and not _RESTATES_LABEL.search(line)
            ).split()
            if len(words) >= DOC_WORDS[0]:
                rows.append((source, kind, " ".join(words[: DOC_WORDS[1]])))
    return rows


SOURCES = {
    "man": man_source,
    "debian": debian_source,
    "library": library_source,
    "stdlib": stdlib_source,
    "registry": registry_source,
    "changelog": changelog_source,
}


# ---------------------------------------------------------------- tasks
@dataclasses.dataclass
class Task:
    """One classification task: rows are (unit, label, text); `corpus` is (unit, text)."""

    name: str
    source: str
    few_shot: bool
    semantic: bool
    own_text: bool  # the corpus holds its training units (else neighbouring text only)
    train: list = dataclasses.field(default_factory=list)
    dev: list = dataclasses.field(default_factory=list)
    corpus: list = dataclasses.field(default_factory=list)


def _split(rows, prefix: str):
    """{"pretrain"|"train"|"dev": [(unit, label, text)]} by the hash of each unit."""
    parts = {"pretrain": [], "train": [], "dev": []}
    for row in rows:
        parts[common.bucket(f"{prefix}/{row[0]}")].append(row)
    return parts


def _cap(rows, per_class: int, rng) -> list:
    """At most `per_class` rows of each label, chosen by `rng`, in a shuffled order."""
    by_label = {}
    for row in rows:
        by_label.setdefault(row[1], []).append(row)
    kept = []
    for label in sorted(by_label):
        chosen = by_label[label][:]
        rng.shuffle(chosen)
        kept += chosen[:per_class]
    rng.shuffle(kept)
    return kept


def _corpus(rows, most_bytes: int, rng) -> list:
    """(unit, text) of `rows` up to about `most_bytes`, in a shuffled order."""
    rows = rows[:]
    rng.shuffle(rows)
    out, size = [], 0
    for unit, _, text in rows:
        if size >= most_bytes:
            break
        out.append((unit, text))
        size += len(text)
    return out


def man_task(rows, rng, per_class=(120, 60)) -> Task:
    parts = _split(rows, "man")
    task = Task("man", "man", few_shot=False, semantic=True, own_text=True)
    for part, cap in zip(("train", "dev"), per_class):
        examples = [
            (unit, section, p)
            for unit, section, text in parts[part]
            for p in common.passages(text, rng, 2)
        ]
        setattr(task, part, _cap(examples, cap, rng))
        if part == "train":  # its own text: every training page's passages, labels dropped
            task.corpus += [(unit, text) for unit, _, text in examples]
    by_section = {}
    for row in parts["pretrain"]:  # man1 alone would be 40 MB
        by_section.setdefault(row[1], []).append(row)
    for section_rows in by_section.values():
        task.corpus += _corpus(section_rows, common.MAN_SECTION_BYTES, rng)
    return task


def debian_tasks(rows, rng, per_class=(120, 60), few=40) -> list:
    """debian-other and debian-few: the six sections; the corpus is every package of the
    other sections."""
    labelled = [row for row in rows if row[1] in common.SECTIONS_DEBIAN]
    parts = _split(labelled, "deb")
    other = [(unit, text) for unit, section, text in rows if section not in common.SECTIONS_DEBIAN]
    full = Task(
        "debian-other",
        "debian",
        few_shot=False,
        semantic=False,
        own_text=False,
        train=_cap(parts["train"], per_class[0], rng),
        dev=_cap(parts["dev"], per_class[1], rng),
        corpus=other,
    )
    few_shot = Task(
        "debian-few",
        "debian",
        few_shot=True,
        semantic=False,
        own_text=False,
        train=_cap(full.train, few, rng),
        dev=full.dev,
        corpus=other,
    )
    return [full, few_shot]


def docstring_task(name, source, rows, rng, per_class, semantic, own_text, corpus_bytes) -> Task:
    """A task whose examples are whole texts (docstrings, summaries, changelog entries)."""
    parts = _split(rows, source)
    task = Task(
        name,
        source,
        few_shot=per_class[0] <= 50,
        semantic=semantic,
        own_text=own_text,
        train=_cap(parts["train"], per_class[0], rng),
        dev=_cap(parts["dev"], per_class[1], rng),
        corpus=_corpus(parts["pretrain"], corpus_bytes, rng),
    )
    if own_text:  # every training unit's texts, labelled or not
        task.corpus += [(unit, text) for unit, _, text in parts["train"]]
    return task


def build_tasks(sources: dict, seed: int = 0, only=None) -> list:
    """The suite's tasks from `sources` ({name: () -> [(unit, label, text)]}, as
    `SOURCES`), with disjoint splits; a source that yields nothing leaves its tasks out.

    Args:
        sources: where each source's rows come from (tests give small lists).
        seed: draws the capped examples and passages.
        only: task names to build (default: all).

    Returns:
        [Task], each checked by `check_disjoint`.
    """
    rng = random.Random(seed)
    wanted = lambda *names: only is None or any(n in only for n in names)  # noqa: E731
    tasks = []
    if wanted("man") and (rows := sources["man"]()):
        tasks.append(man_task(rows, rng))
    if wanted("debian-other", "debian-few") and (rows := sources["debian"]()):
        tasks += debian_tasks(rows, rng)
    specs = [
        ("library", "library", (40, 60), False, True, 1_200_000),
        ("docstring-kind", "stdlib", (120, 60), True, False, 3_000_000),
        ("registry", "registry", (120, 150), True, False, 1_500_000),
        ("changelog", "changelog", (40, 60), True, False, 2_000_000),
    ]
    for name, source, per_class, semantic, own_text, corpus_bytes in specs:
        if wanted(name) and (rows := sources[source]()):
            tasks.append(
                docstring_task(name, source, rows, rng, per_class, semantic, own_text, corpus_bytes)
            )
    tasks = [t for t in tasks if only is None or t.name in only]
    built = {t.source for t in tasks}
    for source in sorted(set(SOURCES) - built if only is None else ()):
        print(
            f"suite: no text from the source {source!r} here: its tasks are left out",
            file=sys.stderr,
        )
    for task in tasks:
        _drop_shared_texts(task)
        check_disjoint(task)
    return tasks


def text_hash(text: str) -> str:
    return hashlib.sha1(" ".join(text.split()).encode()).hexdigest()


def _drop_shared_texts(task: Task):
    """Drops validation examples whose exact text is in the corpus or the training set (a
    description two packages share), and a neighbouring task's training examples whose
    text is in the corpus."""
    corpus = {text_hash(text) for _, text in task.corpus}
    train = {text_hash(text) for _, _, text in task.train}
    task.dev = [r for r in task.dev if text_hash(r[2]) not in corpus | train]
    if not task.own_text:
        task.train = [r for r in task.train if text_hash(r[2]) not in corpus]


def check_disjoint(task: Task):
    """Raises AssertionError when a validation unit or text is in the corpus or training
    set, or a neighbouring task's training unit or text is in the corpus."""
    corpus_units = {unit for unit, _ in task.corpus}
    corpus_texts = {text_hash(text) for _, text in task.corpus}
    train_units = {r[0] for r in task.train}
    for unit, _, text in task.dev:
        assert unit not in corpus_units and unit not in train_units, (task.name, unit)
        assert text_hash(text) not in corpus_texts, (task.name, unit)
    if not task.own_text:
        assert not train_units & corpus_units, (task.name, sorted(train_units & corpus_units)[:3])


def corpus_documents(tasks: list, rng) -> list:
    """The pretraining corpus of every task, each unit once: a long text is a document,
    one-line texts go `DOCUMENT_LINES` to a document (as a package list reads)."""
    seen, long_texts, lines = set(), [], []
    for task in tasks:
        for unit, text in task.corpus:
            key = (task.source, unit, text_hash(text))
            if key in seen:
                continue
            seen.add(key)
            (long_texts if len(text.split()) > 40 else lines).append(text)
    rng.shuffle(lines)
    documents = long_texts + [
        " \n".join(lines[i : i + DOCUMENT_LINES]) for i in range(0, len(lines), DOCUMENT_LINES)
    ]
    rng.shuffle(documents)
    return documents
