"""The package's layers, checked from the source: data flows one way.

config -> data + model -> training / inference -> run dir. Every import counts,
module level or inside a function (a lazy import is still a dependency).
"""

import ast
import os

import kroberta

PACKAGE = os.path.dirname(os.path.abspath(kroberta.__file__))
CLIS = {"train", "predict", "prepare", "export", "aot", "report", "cli"}
SUBPACKAGES = {"data", "text", "model", "training", "inference", "parallel", "interop", "perf", "runtime"}

# What each subpackage may not import (besides the command-line modules, which none may).
FORBIDDEN = {
    "runtime": SUBPACKAGES - {"runtime"},  # runs at `import kroberta`, before anything else
    "data": {"model", "training", "inference", "interop", "text", "parallel"},  # knows no layers
    "model": {"data", "text", "training", "inference", "interop"},  # knows no files
    "text": {"model", "training", "inference", "interop", "parallel"},
    "parallel": {"data", "text", "model", "training", "inference", "interop"},
    "perf": {"data", "text", "training", "interop"},
    "inference": {"training", "text", "interop"},
    "interop": {"data", "training", "inference"},
}
# The top of the flow: the config and the conventions every layer shares.
FOUNDATIONS = {"config", "config_checks", "named_configs", "tokens", "mask_hash", "errors", "atomic"}


def _kroberta_imports(path):
    """Every kroberta module `path` imports, as dotted names below `kroberta.`."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found |= {n[len("kroberta."):] for n in names if n.startswith("kroberta.")}
    return found


def _modules():
    for root, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                yield os.path.relpath(path, PACKAGE)[:-3].replace(os.sep, "."), path


def test_the_walk_sees_the_package():
    modules = dict(_modules())
    assert {"train", "data.pipeline", "model.mlm", "training.run_callbacks"} <= set(modules)
    assert "data.pipeline" in _kroberta_imports(modules["train"])


def test_no_subpackage_imports_a_command_line_module():
    offences = [(module, target) for module, path in _modules() if "." in module
                for target in _kroberta_imports(path) if target.split(".")[0] in CLIS]
    assert offences == []


def test_data_flows_one_way():
    offences = []
    for module, path in _modules():
        package = module.split(".")[0]
        forbidden = SUBPACKAGES if module in FOUNDATIONS else FORBIDDEN.get(package, ())
        for target in _kroberta_imports(path):
            if target.split(".")[0] in forbidden:
                offences.append((module, target))
    assert offences == []
