"""The package's layers, checked from the source: data flows one way.

`LAYERS` names them low to high: no import runs up a layer or closes a circle, and the
packages of a layer that know nothing of each other stay apart (`FORBIDDEN`). Every
import counts, module level or inside a function (a lazy import is still a
dependency), and one inside a function says why it is there.
"""

import ast
import functools
import io
import os
import tokenize

import pytest

import kroberta

# The fast tier (docs/contributing.md): builds no model and starts no process.
pytestmark = pytest.mark.fast

PACKAGE = os.path.dirname(os.path.abspath(kroberta.__file__))
CLIS = {"train", "predict", "prepare", "export", "aot", "report", "evaluate", "cli"}
SUBPACKAGES = {
    "data",
    "text",
    "model",
    "training",
    "inference",
    "parallel",
    "interop",
    "perf",
    "runtime",
    "downstream",
    "pretraining",
}

# What each subpackage may not import (besides the command-line modules, which none may):
# within a layer of `LAYERS`, which packages stay apart.
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
FOUNDATIONS = {
    "config",
    "tokens",
    "counter_hash",
    "masking",
    "errors",
    "atomic",
    "storage",
    "run_layout",
}


def _nodes(path):
    """Every node of the module at `path`'s syntax tree."""
    with open(path, encoding="utf-8") as f:
        return ast.walk(ast.parse(f.read(), path))


def _kroberta_imports(path):
    """Every kroberta module `path` imports, as dotted names below `kroberta.`."""
    found = set()
    for node in _nodes(path):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found |= {n[len("kroberta.") :] for n in names if n.startswith("kroberta.")}
    return found


def _modules():
    for root, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                yield os.path.relpath(path, PACKAGE)[:-3].replace(os.sep, "."), path


def test_the_walk_sees_the_package():
    modules = dict(_modules())
    assert {"train", "cli.train", "data.pipeline", "model.mlm", "training.run_callbacks"} <= set(
        modules
    )
    assert "data.pipeline" in _kroberta_imports(modules["pretraining.train"])


def test_no_subpackage_imports_a_command_line_module():
    # The commands themselves (kroberta/cli/) import each other's package, nothing else does.
    offences = [
        (module, target)
        for module, path in _modules()
        if "." in module and module.split(".")[0] != "cli"
        for target in _kroberta_imports(path)
        if target.split(".")[0] in CLIS
    ]
    assert offences == [], "\n".join(map(str, offences))


def test_data_flows_one_way():
    offences = []
    for module, path in _modules():
        package = module.split(".")[0]
        forbidden = SUBPACKAGES if module in FOUNDATIONS else FORBIDDEN.get(package, ())
        for target in _kroberta_imports(path):
            if target.split(".")[0] in forbidden:
                offences.append((module, target))
    assert offences == [], "\n".join(map(str, offences))


# The layers, low to high: a module imports modules of its own layer and the layers below,
# never above, and no import (module level or inside a function) closes a circle. An
# entry is a module or a package (a package's modules, less those listed on their own).
LAYERS = [
    # Import nothing of kroberta: the error classes, atomic files, token conventions and
    # the counter hash every layer above may use.
    ("errors", "atomic", "tokens", "counter_hash"),
    # The conventions every layer shares: the config, the file system, the masking
    # rules, the process (Keras on JAX, XLA's flags, logs) and its console (the progress
    # display prepare, train and finetune share).
    ("config", "storage", "masking", "runtime", "console"),
    # Records and the input pipeline, the devices and mesh, the run directory's names:
    # each knows the config, none knows a model.
    ("data", "parallel", "run_layout"),
    # The network (model) and prepare's machinery (text, which writes data's records).
    ("model", "text"),
    # Other formats (interop: a model to and from Hugging Face / keras-hub), and cost and
    # speed (perf: FLOPs, peaks, dispatch sizes, the plan of every setting derived from a
    # config and the devices, programs compiled ahead of time and the advice drawn from them).
    ("interop", "perf"),
    # A pretraining run's parts: data, callbacks, checkpoints, the run directory.
    ("training",),
    # Fine-tuning of a pretrained run (it loads runs through training).
    ("downstream",),
    # Prediction through the compiled program, for a masked LM or (through downstream's
    # texts-to-inputs) a fine-tuned classifier: `kroberta.predict` takes either.
    ("inference",),
    # The pretraining run itself: builds training's parts, and its linear probe (which
    # reads a task as downstream does and predicts embeddings through inference) when
    # train.downstream names a task.
    ("pretraining",),
    # What a user calls: the commands, their `python -m kroberta.X` entry modules, and
    # the package's lazy public API (kroberta/__init__.py's `kroberta.train`, ...).
    (
        "cli",
        "aot",
        "evaluate",
        "export",
        "finetune",
        "predict",
        "prepare",
        "report",
        "train",
        "kroberta",
    ),
]
TOP = "kroberta"  # the package itself: `import kroberta` reaches its public API


def _package(root):
    """{dotted module name below the package (TOP for its __init__): path} of `root`."""
    found = {}
    for directory, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                dotted = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                found[TOP if dotted == "__init__" else dotted.removesuffix(".__init__")] = path
    return found


def _imports_of(path, modules, module=None):
    """(module imported, line, inside a function) for every import of the package in the
    module at `path` (named `module`, for its relative imports): `from kroberta.x import
    y` imports x.y when that is a module, else x; `import kroberta` and `from kroberta
    import name` (not a module) import TOP."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    found = []

    def resolve(name):  # a dotted name below the package -> the module it is or is in
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        return name if name in modules else None

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            )
            names = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                names = [f"{_absolute(child, path, module)}.{a.name}" for a in child.names]
            for name in names:
                if name == TOP or name.startswith(f"{TOP}."):
                    below = name[len(TOP) + 1 :]
                    target = resolve(below) or TOP if below else TOP
                    found.append((target, child.lineno, in_function))
            visit(child, inside)

    visit(tree, False)
    return found


def _absolute(node, path, module):
    """The dotted module an `ImportFrom` names, a relative one made absolute."""
    if node.level == 0:
        return node.module
    package = (
        (module or "").split(".")
        if path.endswith("__init__.py")
        else (module or "").split(".")[:-1]
    )
    base = [TOP] + [p for p in package[: len(package) - node.level + 1] if p and p != TOP]
    return ".".join(base + ([node.module] if node.module else []))


def _layer_of(module):
    """The index in LAYERS of `module`'s longest matching entry; None when it has none."""
    best = None
    for index, entries in enumerate(LAYERS):
        for entry in entries:
            if module == entry or module.startswith(entry + ".") and entry != TOP:
                if best is None or len(entry) > len(best[1]):
                    best = (index, entry)
    return None if best is None else best[0]


def _circles(graph):
    """The strongly connected components of more than one module in `graph` (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def connect(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def _commented_lines(path):
    """(lines holding a comment, lines that are only a comment) of the file at `path`."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    comments = [
        t
        for t in tokenize.generate_tokens(io.StringIO(source).readline)
        if t.type == tokenize.COMMENT
    ]
    lines = source.splitlines()
    return (
        {t.start[0] for t in comments},
        {t.start[0] for t in comments if not lines[t.start[0] - 1][: t.start[1]].strip()},
    )


def _uncommented_imports(path):
    """Lines of imports inside a function (any module, not only the package's) with no
    comment saying why: on their line, or on a line of its own directly above them or
    above the block of imports (blank lines between its groups allowed) they stand in."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    tree = ast.parse("\n".join(lines), path)
    with_comment, comment_only = _commented_lines(path)
    statements = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    import_lines = {line for node in statements for line in range(node.lineno, node.end_lineno + 1)}
    inside = sorted(
        {
            node.lineno
            for function in ast.walk(tree)
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
            for node in ast.walk(function)
            if isinstance(node, (ast.Import, ast.ImportFrom))
        }
    )
    offences = []
    for line in inside:
        above = line - 1
        while (
            above > 0
            and above not in with_comment
            and (above in import_lines or not lines[above - 1].strip())
        ):
            above -= 1  # up the block of imports this one stands in
        explained = (
            line in with_comment
            or above in comment_only
            or (above in import_lines and above in with_comment)
        )
        if not explained:
            offences.append(line)
    return offences


@functools.cache  # one reading of the package for the four tests below
def layout_offences(root):
    """{"circles": [...], "upward": [...], "unplaced": [...], "uncommented": [...]} of the
    package at `root` (each a list of readable strings)."""
    modules = _package(root)
    graph = {module: set() for module in modules}
    upward, unplaced, uncommented = [], [], []
    for module, path in sorted(modules.items()):
        if _layer_of(module) is None:
            unplaced.append(module)
        for target, line, _ in _imports_of(path, modules, module):
            if target == module:
                continue
            graph[module].add(target)
            low, high = _layer_of(module), _layer_of(target)
            if None not in (low, high) and high > low:
                upward.append(f"{os.path.relpath(path, root)}:{line}: {module} -> {target}")
        uncommented += [
            f"{os.path.relpath(path, root)}:{line}" for line in _uncommented_imports(path)
        ]
    return {
        "circles": [" -> ".join(c) for c in _circles(graph)],
        "upward": upward,
        "unplaced": unplaced,
        "uncommented": uncommented,
    }


def test_no_import_circle():
    circles = layout_offences(PACKAGE)["circles"]
    assert circles == [], "modules that import each other in a loop:\n" + "\n".join(circles)


def check_layers(root):
    """Fails (AssertionError, the offences listed) when a module of the package at `root`
    stands on no layer or imports a module of a higher layer."""
    found = layout_offences(root)
    assert found["unplaced"] == [], "modules on no layer (add them to LAYERS):\n" + "\n".join(
        found["unplaced"]
    )
    upward = found["upward"]
    assert upward == [], "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_no_import_runs_up_the_layers():
    check_layers(PACKAGE)


def test_the_layer_check_fails_on_one_upward_import(tmp_path):
    # Two layers (data below training) and a single import that runs up: a module of a
    # package reaching a package above it, as once the plan reached perf's advice.
    package = tmp_path / "scratch"
    for folder in ("data", "training"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "data" / "records.py").write_text("import json\n")
    (package / "data" / "pipeline.py").write_text(
        "from kroberta.data import records\nfrom kroberta.training import run\n"
    )
    (package / "training" / "run.py").write_text("from kroberta.data import records\n")
    with pytest.raises(AssertionError, match="data/pipeline.py:2: data.pipeline -> training.run"):
        check_layers(str(package))
    assert layout_offences(str(package))["upward"] == [
        "data/pipeline.py:2: data.pipeline -> training.run"
    ]
    (package / "data" / "pipeline.py").write_text("from kroberta.data import records\n")
    layout_offences.cache_clear()  # the package changed: read it again
    check_layers(str(package))


def test_an_import_inside_a_function_says_why():
    # Start-up time (a command answers --help before JAX loads) or an optional extra;
    # anything else goes to the top of the module.
    uncommented = layout_offences(PACKAGE)["uncommented"]
    assert uncommented == [], (
        "imports inside a function without a comment saying why "
        "(or move them to the top):\n" + "\n".join(uncommented)
    )


def test_the_layout_checks_find_a_circle_an_upward_import_and_an_uncommented_one(tmp_path):
    package = tmp_path / "scratch"
    (package / "model").mkdir(parents=True)
    (package / "training").mkdir()
    files = {
        "__init__.py": "",
        "errors.py": "",
        "config.py": "from kroberta import errors\n",
        "model/__init__.py": "",
        # A circle through an import inside a function (the comment does not excuse it).
        "model/a.py": "from kroberta.model import b\n",
        "model/b.py": "def f():\n    # a real cycle\n    from . import a\n",  # relative
        # storage (layer 1) reaching up to training: an upward import, uncommented.
        "training/__init__.py": "",
        "training/run.py": "import kroberta.config\nfrom ..model import a\n",
        "storage.py": "def g():\n    import json\n\n    from .training import run\n",
        # Commented: on the line, above it, and a block of imports under one comment.
        "masking.py": (
            "def h():\n    import json  # start-up\n    # an optional extra\n"
            "    import csv\n\n    from kroberta import (\n        errors)\n"
            "    import io\n"
        ),
        # A comment on the code above is that code's, not the import's.
        "tokens.py": "def k():\n    x = 1  # one\n    import json\n",
        "elsewhere.py": "",
    }
    for name, text in files.items():
        (package / name).write_text(text)
    found = layout_offences(str(package))
    assert found["circles"] == ["model.a -> model.b"]
    assert found["upward"] == ["storage.py:4: storage -> training.run"]
    assert found["unplaced"] == ["elsewhere"]
    assert found["uncommented"] == ["storage.py:2", "storage.py:4", "tokens.py:3"]


# The only modules that reach into JAX's or Keras' private modules (`jax._src`,
# `keras.src`, imported or named), each with the public API that is missing.
PRIVATE_API_USERS = {
    # Keras 3.15's fit/evaluate build their epoch iterator by the module-level name
    # `JAXEpochIterator` (no public hook); goes with the 3.15 floor: Keras >= 3.16
    # fuses steps_per_execution itself and the module takes no private path there.
    "model.fused_steps": "keras.src.backend.jax.trainer.JAXEpochIterator (Keras 3.15 only)",
    # Finds live Keras objects before switching backends: Keras exports no base class
    # common to layers, variables and symbolic tensors (none in 3.16 either).
    "runtime.backend": "keras.src KerasSaveable / Variable / KerasTensor classes by name",
    # Whether XLA already read its flags: JAX has no public "backends initialised"
    # query (none through 0.12).
    "runtime.xla_cpu": "jax._src.xla_bridge.backends_are_initialized",
    # The coordination service's preemption notice: no public API through JAX 0.12.
    "training.preemption": "jax._src.distributed.global_state.preemption_sync_manager",
    # Remat inside the step: the enclosing stateless scope and whether one is open (the
    # traced step); Keras exports StatelessScope but no getter for the current one
    # (none in 3.16 either).
    "model.remat": "keras.src.backend.common.stateless_scope get_stateless_scope / in_stateless_scope",
    # Whether libtpu found a Cloud TPU VM without starting a backend: no public API.
    "parallel.startup": "jax._src.cloud_tpu_init.running_in_cloud_tpu_vm",
}
PRIVATE_PREFIXES = ("jax._src", "keras.src", "keras_hub.src")


def _private_names(path):
    """The private JAX / Keras modules `path` imports or names in a string."""
    found = set()
    for node in _nodes(path):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)
    return {name for name in found if name.startswith(PRIVATE_PREFIXES)}


@pytest.mark.stack
def test_private_apis_stay_in_the_named_modules():
    tools = os.path.join(os.path.dirname(PACKAGE), "tools")
    users = {module for module, path in _modules() if _private_names(path)}
    users |= {
        f"tools.{name[:-3]}"
        for name in os.listdir(tools)
        if name.endswith(".py") and _private_names(os.path.join(tools, name))
    }
    assert users == set(PRIVATE_API_USERS)


def _renaming_imports(path):
    """`import kroberta.x as y` and `from kroberta[.x] import z as y` in `path`."""
    found = []
    for node in _nodes(path):
        if isinstance(node, ast.Import):
            found += [
                (a.name, a.asname)
                for a in node.names
                if a.asname and a.name.split(".")[0] == "kroberta"
            ]
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module
            and node.module.split(".")[0] in ("kroberta", "tests")
        ):
            found += [(f"{node.module}.{a.name}", a.asname) for a in node.names if a.asname]
    return found


def test_nothing_of_kroberta_is_renamed_on_import():
    # A module or function is called by its own name everywhere (`np`, `tf`, `jnp` are
    # the ecosystem's, not ours): an alias hides a bad name instead of fixing it.
    root = os.path.dirname(PACKAGE)
    paths = [path for _, path in _modules()]
    for folder in ("tests", "tools"):
        for directory, _, files in os.walk(os.path.join(root, folder)):
            paths += [os.path.join(directory, name) for name in files if name.endswith(".py")]
    offences = [
        (os.path.relpath(path, root), name, alias)
        for path in paths
        for name, alias in _renaming_imports(path)
    ]
    assert offences == [], "\n".join(map(str, offences))


def _imported_names(path):
    """{name: module} of every name the module at `path` imports with `from ... import`,
    less those it hands on on purpose (listed in its `__all__`)."""
    found, public = {}, set()
    for node in _nodes(path):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.update({a.asname or a.name: node.module for a in node.names})
        elif isinstance(node, ast.Assign) and any(
            getattr(t, "id", None) == "__all__" for t in node.targets
        ):
            public |= set(ast.literal_eval(node.value))
    return {name: module for name, module in found.items() if name not in public}


def test_a_name_of_kroberta_is_imported_from_the_module_that_defines_it():
    # One name per thing, one place it comes from: `from kroberta.x import NAME` where
    # x only imported NAME itself hides NAME's home (and keeps a dead import alive in x).
    # The package's own __init__ and a module's `__all__` hand names on on purpose.
    root = os.path.dirname(PACKAGE)
    paths = {f"kroberta.{name}".removesuffix(".__init__"): path for name, path in _modules()}
    passed_on = {
        module: _imported_names(path) for module, path in paths.items() if module != "kroberta"
    }
    users = list(paths.values())
    for folder in ("tests", "tools"):
        for directory, _, files in os.walk(os.path.join(root, folder)):
            users += [os.path.join(directory, name) for name in files if name.endswith(".py")]
    offences = []
    for path in users:
        for node in _nodes(path):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in passed_on:
                offences += [
                    (
                        os.path.relpath(path, root),
                        node.module,
                        a.name,
                        passed_on[node.module][a.name],
                    )
                    for a in node.names
                    if a.name in passed_on[node.module] and f"{node.module}.{a.name}" not in paths
                ]
    assert offences == [], "\n".join(map(str, offences))


# Functions over 80 lines that are still to be split (module.function: lines now). The
# list only shrinks: a function split below the limit must leave it, and no new one joins.
LONG_FUNCTIONS_TO_SPLIT = {
    # none left: inference.prediction.predict_batches (100 lines) was the last
}
MAX_FUNCTION_LINES = 80


def _functions(path, module):
    """(dotted name, lines) of every function and method defined in the module at `path`."""

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}.{child.name}"
                yield name, child.end_lineno - child.lineno + 1
                yield from walk(child, name)
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}.{child.name}")
            else:
                yield from walk(child, prefix)

    with open(path, encoding="utf-8") as f:
        yield from walk(ast.parse(f.read(), path), module)


def test_no_function_is_over_80_lines():
    lines = {
        name: length for module, path in _modules() for name, length in _functions(path, module)
    }
    offences = [
        f"{name}: {length} lines"
        for name, length in sorted(lines.items())
        if length > MAX_FUNCTION_LINES and name not in LONG_FUNCTIONS_TO_SPLIT
    ]
    assert offences == [], f"functions over {MAX_FUNCTION_LINES} lines (split them):\n" + "\n".join(
        offences
    )
    split = [name for name in LONG_FUNCTIONS_TO_SPLIT if lines.get(name, 0) <= MAX_FUNCTION_LINES]
    assert split == [], "split (or gone): remove from LONG_FUNCTIONS_TO_SPLIT:\n" + "\n".join(split)


# Methods of Keras objects that code might swap on a live instance (`model.call = ...`):
# a model then behaves unlike its class, and saving, cloning or tracing it surprises.
# Subclass instead. Only the model builder (kroberta/model/) swaps, at the layer level.
SWAPPED_METHODS = {
    "__call__",
    "call",
    "build",
    "compute_loss",
    "compute_metrics",
    "compile",
    "evaluate",
    "fit",
    "generate_step",
    "get_config",
    "load_weights",
    "make_predict_function",
    "make_test_function",
    "make_train_function",
    "predict",
    "predict_step",
    "save",
    "save_weights",
    "stateless_call",
    "test_step",
    "train_step",
}


def _swaps(path):
    """(line, code) of every `X.__class__ = ...` and every assignment of a method name
    (`X.call = ...`, `setattr(X, "call", ...)`) in the module at `path`."""
    found = []
    for node in _nodes(path):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found += [
                (node.lineno, ast.unparse(target))
                for top in targets
                for target in ast.walk(top)
                if isinstance(target, ast.Attribute)
                and target.attr in SWAPPED_METHODS | {"__class__"}
            ]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in SWAPPED_METHODS | {"__class__"}
        ):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_class_or_method_is_swapped_on_an_instance_outside_the_model_builder():
    offences = [
        f"kroberta/{module.replace('.', '/')}.py:{line}: {code}"
        for module, path in _modules()
        if module.split(".")[0] != "model"
        for line, code in _swaps(path)
    ]
    assert offences == [], (
        "a class or method swapped on a live object (subclass instead; "
        "only kroberta/model/'s builder may):\n" + "\n".join(offences)
    )


def test_the_swap_check_sees_a_swap(tmp_path):
    path = tmp_path / "swapping.py"
    path.write_text(
        "def f(model, layer, fn):\n    model.predict_step = fn\n"
        "    layer.__class__ = type(layer)\n    setattr(model, 'call', fn)\n"
        "    model.stop_training = True\n"
    )
    assert [line for line, _ in _swaps(path)] == [2, 3, 4]
