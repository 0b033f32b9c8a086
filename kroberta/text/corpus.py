"""Text every machine has: the Python standard library's docstrings.

The default training job needs a corpus without downloading anything. Docstrings
are read with `ast` from the source files, never by importing the modules (some
have side effects: `antigravity` opens a browser, `this` prints). The corpus leaves
out the modules the embedded fine-tuning task validates on (`held_out_files`).
"""

import ast
import os
import sysconfig
import warnings

from kroberta.atomic import atomic_write

# Directories whose files are not library prose: tests, the IDLE GUI, installed packages.
_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__"}

# The embedded fine-tuning task (`kroberta.downstream.tasks`): which package a
# docstring is from, among these (packages with many docstrings in every CPython
# 3.9-3.13, in the order the task tries them). It validates on every VALIDATION_EVERY-th
# module of a package (sorted by path, from the second), and the pretraining corpus
# leaves those modules out, so that the task scores text the pretraining never read.
TASK_PACKAGES = (
    "asyncio",
    "email",
    "multiprocessing",
    "unittest",
    "xml",
    "importlib",
    "tkinter",
    "http",
    "concurrent",
    "logging",
)
VALIDATION_EVERY = 4


def stdlib_files(root):
    """Sorted .py paths under `root`, skipping _SKIP_DIRS (sorted: deterministic order)."""
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        paths.extend(os.path.join(dirpath, f) for f in filenames if f.endswith(".py"))
    return sorted(paths)


def task_modules(root, package) -> tuple[list, list]:
    """The (training, validation) source files of one of TASK_PACKAGES under `root`:
    the package's modules (`stdlib_files`), every VALIDATION_EVERY-th for validation."""
    files = stdlib_files(os.path.join(root, package))
    return (
        [f for i, f in enumerate(files) if i % VALIDATION_EVERY != 1],
        [f for i, f in enumerate(files) if i % VALIDATION_EVERY == 1],
    )


def held_out_files(root=None) -> frozenset:
    """The embedded task's validation modules under `root` (default: this interpreter's
    standard library): the files the pretraining corpus leaves out."""
    root = root or sysconfig.get_paths()["stdlib"]
    return frozenset(path for package in TASK_PACKAGES for path in task_modules(root, package)[1])


def stdlib_docstrings(root=None, exclude=frozenset()):
    """The non-empty docstrings of the Python standard library under `root` (default:
    this interpreter's), file by file in sorted path order (`file_docstrings`), less
    the files in `exclude`."""
    root = root or sysconfig.get_paths()["stdlib"]
    for path in stdlib_files(root):
        if path not in exclude:
            yield from file_docstrings(path)


def file_docstrings(path) -> list[str]:
    """The non-empty docstrings of one Python source file's module, classes and functions
    (cleaned indentation), in `ast.walk` order; none when it cannot be read or parsed
    (e.g. lib2to3 test data, files in a non-UTF-8 encoding)."""
    try:
        with open(path, "rb") as f:
            source = f.read()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escape sequences in old files
            tree = ast.parse(source, filename=path)
    except (OSError, SyntaxError, ValueError):
        return []
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docs = (
        ast.get_docstring(node, clean=True) for node in ast.walk(tree) if isinstance(node, kinds)
    )
    return [doc for doc in docs if doc and doc.strip()]


def write_stdlib_corpus(path, root=None):
    """Writes the stdlib docstrings to the UTF-8 text file `path`, one document each,
    separated by blank lines as `prepare` reads them, leaving out the embedded task's
    validation modules (`held_out_files`); returns dict(documents=..., bytes=...,
    files=..., held_out_files=..., path=...)."""
    root = root or sysconfig.get_paths()["stdlib"]
    held_out = held_out_files(root)
    documents = 0
    with atomic_write(path, encoding="utf-8", newline="\n") as f:
        for doc in stdlib_docstrings(root, exclude=held_out):
            # prepare separates documents by blank lines: a docstring's own are dropped
            text = "\n".join(line for line in doc.splitlines() if line.strip())
            if text:
                f.write(text + "\n\n")
                documents += 1
    return {
        "documents": documents,
        "bytes": os.path.getsize(path),
        "files": len(stdlib_files(root)) - len(held_out),
        "held_out_files": len(held_out),
        "path": os.fspath(path),
    }
