"""The package's layering (docs/ARCHITECTURE.md), checked from the source's own imports.

Layers, bottom to top; a module may import modules of lower layers and of its own package, never
a higher layer or a sibling package of its own layer:

    0  pallas_kernels            (imports nothing from jaxdqn)
    1  jaxdqn.branches           the action layout
    2  jaxdqn.config             read by all
    3  jaxdqn.market | jaxdqn.model   (siblings: the model knows nothing of the market)
    4  jaxdqn.agent
    5  jaxdqn.evaluation
    6  jaxdqn.program            the only layer that does I/O, in rooms of its own, bottom to top:
         6a  program.records | program.checkpoints | program.launch   (siblings)
         6b  program.report
         6c  program.run
         6d  program.walkforward
         6e  program.trained
         6f  program.sweep
    7  jaxdqn.train | evaluate | predict | export | baselines | ablate | walkforward | sweep  thin
       ``python -m`` entry points

A module belongs to the longest package of LAYERS that holds it. The two package faces
``jaxdqn`` and ``jaxdqn.program`` define nothing and import nothing.

Every ``import`` statement counts, also those inside functions and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("jaxdqn", "pallas_kernels")
LAYERS: tuple[tuple[str, ...], ...] = (
    ("pallas_kernels",),
    ("jaxdqn.branches", "jaxdqn.shards"),
    ("jaxdqn.config",),
    ("jaxdqn.market", "jaxdqn.model"),
    ("jaxdqn.agent",),
    ("jaxdqn.evaluation",),
    ("jaxdqn.program.records", "jaxdqn.program.checkpoints", "jaxdqn.program.launch"),
    ("jaxdqn.program.report",),
    ("jaxdqn.program.run",),
    ("jaxdqn.program.walkforward",),
    ("jaxdqn.program.trained",),
    ("jaxdqn.program.sweep",),
    (
        "jaxdqn.train",
        "jaxdqn.evaluate",
        "jaxdqn.predict",
        "jaxdqn.export",
        "jaxdqn.baselines",
        "jaxdqn.ablate",
        "jaxdqn.walkforward",
        "jaxdqn.sweep",
    ),
)
FACES = ("jaxdqn", "jaxdqn.program")
PROGRAM_ROOMS = (
    "records",
    "checkpoints",
    "launch",
    "report",
    "run",
    "walkforward",
    "trained",
    "sweep",
)
MAX_LINES = 500
MAX_PROGRAM_LINES = 400
MAX_LOOP_LINES = 250
MAX_AGENT_FUNCTION_LINES = 60
LOOP = "jaxdqn.program.run.loop"
SECTIONS = (
    "data",
    "features",
    "env",
    "model",
    "acting",
    "replay",
    "optim",
    "loss",
    "dynamics",
    "kernels",
    "eval",
    "baselines",
    "train",
    "learner",
)


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The project module that ``name`` refers to (a module, or the package it lies in)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str, path: Path) -> set[str]:
    """Project modules imported anywhere in ``path``."""
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_pkg else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import name``: the module pkg.name if there is one, else pkg itself.
            names = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names
            ]
        else:
            continue
        for n in names:
            target = _resolve(n)
            if target is not None and target != module:
                found.add(target)
    return found


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _layer(module: str, layers=LAYERS) -> tuple[int, str]:
    """``(layer index, the package of that layer the module belongs to)``: the longest package
    of ``layers`` that is the module or holds it."""
    found = [
        (len(pkg), i, pkg)
        for i, group in enumerate(layers)
        for pkg in group
        if module == pkg or module.startswith(pkg + ".")
    ]
    if not found:
        raise AssertionError(f"{module}: in no layer; add it to LAYERS in tests/test_layering.py")
    _, i, pkg = max(found)
    return i, pkg


def test_layering_every_module_has_a_layer():
    for m in MODULES:
        if m not in FACES:
            _layer(m)


def test_layering_the_longest_package_decides_the_layer():
    layers = (("a",), ("a.b",), ("a.c", "a.d"))
    assert _layer("a.b.x", layers) == (1, "a.b")
    assert _layer("a.d", layers) == (2, "a.d")
    assert _layer("a.x", layers) == (0, "a")


@pytest.mark.parametrize("face", FACES)
def test_layering_package_faces_define_and_import_nothing(face):
    tree = ast.parse(MODULES[face].read_text())
    body = [n for n in tree.body if not isinstance(n, ast.Expr)]  # the docstring only
    assert body == [], f"{face}: its __init__.py holds code; put it in a room"
    assert GRAPH[face] == set()


def test_layering_program_is_rooms_only():
    program = ROOT / "jaxdqn" / "program"
    loose = [p.name for p in program.glob("*.py") if p.name != "__init__.py"]
    assert loose == [], f"modules directly in jaxdqn/program/ (put each in a room): {loose}"
    rooms = sorted(p.name for p in program.iterdir() if (p / "__init__.py").exists())
    assert rooms == sorted(PROGRAM_ROOMS)
    for room in PROGRAM_ROOMS:
        _layer(f"jaxdqn.program.{room}")
        doc = ast.get_docstring(ast.parse((program / room / "__init__.py").read_text()))
        assert doc, f"jaxdqn/program/{room}/__init__.py: say what the room is for"


def test_layering_imports_point_down_only():
    bad = []
    for m, targets in GRAPH.items():
        if m in FACES:
            continue
        layer, pkg = _layer(m)
        for t in sorted(targets):
            if t in FACES:
                bad.append(f"{m} -> {t} (import the module, not the bare package)")
                continue
            t_layer, t_pkg = _layer(t)
            if t_layer > layer or (t_layer == layer and t_pkg != pkg):
                bad.append(f"{m} (layer {layer}) -> {t} (layer {t_layer})")
    assert not bad, "imports that run up or across the layers:\n" + "\n".join(bad)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_layering_no_import_cycle():
    assert _cycles(GRAPH) == []


def test_layering_cycle_detector_finds_a_cycle():
    # The detector itself must work, or the test above could never fail.
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_layering_file_sizes(module):
    lines = len(MODULES[module].read_text().splitlines())
    if module == LOOP:
        limit = MAX_LOOP_LINES
    elif module.startswith("jaxdqn.program."):
        limit = MAX_PROGRAM_LINES
    else:
        limit = MAX_LINES
    assert lines <= limit, f"{MODULES[module]}: {lines} lines > {limit}"


def _long_functions(path: Path, limit: int) -> list[str]:
    """Functions (methods and nested functions included, each counted with its body) of more
    than ``limit`` lines, from ``def`` to the last line."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                out.append(f"{path.name}:{node.lineno} {node.name}: {lines} lines")
    return out


def test_layering_agent_functions_are_short():
    """The agent layer reads like its anchors (acme's ``sgd_step`` is ~25 lines): every function
    a short composition of named steps."""
    bad = []
    for m, path in MODULES.items():
        if m.startswith("jaxdqn.agent."):
            bad += _long_functions(path, MAX_AGENT_FUNCTION_LINES)
    assert not bad, f"functions over {MAX_AGENT_FUNCTION_LINES} lines:\n" + "\n".join(bad)


def test_layering_long_function_detector_counts_nested_bodies(tmp_path):
    src = tmp_path / "x.py"
    body = "".join(f"        y{i} = {i}\n" for i in range(5))
    src.write_text(f"def outer():\n    def inner():\n{body}        return 0\n    return inner\n")
    assert _long_functions(src, 8) == ["x.py:1 outer: 9 lines"]
    assert _long_functions(src, 6) == ["x.py:1 outer: 9 lines", "x.py:2 inner: 7 lines"]


def _deep_config_reads(path: Path) -> list[str]:
    """``<...>cfg.<section>.<field>`` reads outside the body of a ``make_*``/``build_*``
    factory or ``resolve`` (or at module level), i.e. inside code that may run under
    ``jax.jit``. Checked in
    the layers whose code is jitted: agent, model and the environment."""
    tree = ast.parse(path.read_text())
    found = []

    def visit(node: ast.AST, func: str | None) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            func = getattr(node, "name", "<lambda>")
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr in SECTIONS
        ):
            base = node.value.value
            is_cfg = (isinstance(base, ast.Name) and base.id == "cfg") or (
                isinstance(base, ast.Attribute) and base.attr == "cfg"
            )
            factory = func is None or func.startswith(("make_", "build_", "resolve"))
            if is_cfg and not factory:
                found.append(f"{path.name}:{node.lineno} in {func}: {ast.unparse(node)}")
        for child in ast.iter_child_nodes(node):
            visit(child, func)

    visit(tree, None)
    return found


def test_layering_jitted_code_reads_config_only_through_factories():
    bad = []
    for m, path in MODULES.items():
        if m.startswith(("jaxdqn.agent", "jaxdqn.model", "jaxdqn.market.env")):
            bad += _deep_config_reads(path)
    assert not bad, "config read inside a function that is not a factory:\n" + "\n".join(bad)


def test_layering_config_read_detector_flags_a_deep_read(tmp_path):
    src = tmp_path / "x.py"
    src.write_text(
        "def make_a(cfg):\n    n = cfg.loss.gamma\n    return lambda: n\n"
        "def update(setup):\n    return setup.cfg.learner.lr\n"
    )
    assert _deep_config_reads(src) == ["x.py:5 in update: setup.cfg.learner.lr"]


def _definitions(name: str) -> list[str]:
    where = []
    for m, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
                where.append(m)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    where.append(m)
    return where


@pytest.mark.parametrize(
    "name",
    ["NUM_BRANCHES", "BRANCHES", "NUM_ACTIONS", "BRANCH_KEYS", "clock", "to_jsonable", "METRICS"],
)
def test_layering_one_definition(name):
    assert len(_definitions(name)) == 1, f"{name} defined in {_definitions(name)}"
