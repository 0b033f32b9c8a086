"""Text every machine has: the Python standard library's docstrings.

The default training job needs a corpus without downloading anything. Docstrings
are read with `ast` from the source files, never by importing the modules (some
have side effects: `antigravity` opens a browser, `this` prints).
"""

import ast
import os
import sysconfig
import warnings

from kroberta.atomic import atomic_write

# Directories whose files are not library prose: tests, the IDLE GUI, installed packages.
_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__"}


def stdlib_files(root):
    """Sorted .py paths under `root`, skipping _SKIP_DIRS (sorted: deterministic order)."""
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        paths.extend(os.path.join(dirpath, f) for f in filenames if f.endswith(".py"))
    return sorted(paths)


def stdlib_docstrings(root=None):
    """The non-empty docstrings of the Python standard library under `root` (default:
    this interpreter's), file by file in sorted path order (`file_docstrings`)."""
    root = root or sysconfig.get_paths()["stdlib"]
    for path in stdlib_files(root):
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
    docs = (ast.get_docstring(node, clean=True) for node in ast.walk(tree) if isinstance(node, kinds))
    return [doc for doc in docs if doc and doc.strip()]


def write_stdlib_corpus(path, root=None):
    """Writes the stdlib docstrings (`stdlib_docstrings(root)`) to the UTF-8 text file
    `path`, one document each, separated by blank lines as `prepare` reads them;
    returns dict(documents=..., bytes=..., files=..., path=...)."""
    root = root or sysconfig.get_paths()["stdlib"]
    documents = 0
    with atomic_write(path, encoding="utf-8", newline="\n") as f:
        for doc in stdlib_docstrings(root):
            # prepare separates documents by blank lines: a docstring's own are dropped
            text = "\n".join(line for line in doc.splitlines() if line.strip())
            if text:
                f.write(text + "\n\n")
                documents += 1
    return {
        "documents": documents,
        "bytes": os.path.getsize(path),
        "files": len(stdlib_files(root)),
        "path": os.fspath(path),
    }
