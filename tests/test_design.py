"""docs/DESIGN.md stays true to the code (issue 31): every component ID a test name or a
docstring uses is defined there, and every place it names (``path::name`` code spans: the
component's code and its tests) exists."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "DESIGN.md"
# The families of component IDs: the model, learner, optimisation, acting, environment and
# kernel components of the original design, then statistics, walk-forward, determinism,
# scale-out, universes (panels), the bar clock, predict/export and hyperparameter populations.
FAMILIES = "MLOAEPSWDXUCRH"
# C51: the algorithm, H0: a null hypothesis; neither is an ID
ID = re.compile(rf"\b(?!C51\b|H0\b)([{FAMILIES}]\d{{1,2}})\b")
HEADING = re.compile(rf"^### ([{FAMILIES}]\d{{1,2}}) — \S", re.M)
SPAN = re.compile(r"`((?:jaxdqn|pallas_kernels|tests|bench)/[\w/]+\.py)(?:::([\w.]+))?`")
FIELDS = ("- **Lives in:**", "- **Switch:**", "- **Tests:**")


def sections(text: str) -> dict[str, str]:
    """``{ID: its section's text}`` of a DESIGN.md text (one ``### ID — name`` heading each)."""
    marks = list(HEADING.finditer(text))
    out = {}
    for m, nxt in zip(marks, [*marks[1:], None], strict=True):
        body = text[m.start() : nxt.start() if nxt else len(text)]
        body = body.split("\n## ", 1)[0]  # a section ends at the next part's heading
        if m.group(1) in out:
            raise AssertionError(f"docs/DESIGN.md defines {m.group(1)} twice")
        out[m.group(1)] = body
    return out


def defined_names(path: Path) -> set[str]:
    """Top-level functions, classes and assigned names of a module, and ``Class.method``."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(f"{node.name}.{item.name}")
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def missing_places(body: str) -> list[str]:
    """The ``path`` and ``path::name`` spans of a section that do not exist."""
    missing = []
    for path, name in SPAN.findall(body):
        file = ROOT / path
        if not file.is_file():
            missing.append(path)
        elif name and name not in defined_names(file):
            missing.append(f"{path}::{name}")
    return missing


def used_ids() -> dict[str, str]:
    """``{ID: where it is first used}`` over test names (``test_m3_m6_...`` uses M3 and M6) and
    the docstrings of every module, class and function of the package, the kernels and the
    tests."""
    used = {}
    files = sorted([*ROOT.glob("jaxdqn/**/*.py"), *ROOT.glob("pallas_kernels/*.py")])
    files += sorted(ROOT.glob("tests/*.py"))
    for file in files:
        tree = ast.parse(file.read_text())
        rel = file.relative_to(ROOT)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                for token in node.name.split("_")[1:]:
                    if not re.fullmatch(rf"[{FAMILIES.lower()}]\d{{1,2}}", token):
                        break  # the IDs lead the name: test_<id>_<id>_<what it checks>
                    used.setdefault(token.upper(), f"{rel}::{node.name}")
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef):
                doc = ast.get_docstring(node) or ""
                for found in ID.findall(doc):
                    used.setdefault(found, f"a docstring in {rel}")
    return used


@pytest.fixture(scope="module")
def design() -> dict[str, str]:
    return sections(DESIGN.read_text())


def test_design_defines_every_id_the_code_and_tests_use(design):
    missing = {i: where for i, where in used_ids().items() if i not in design}
    assert not missing, f"IDs used but not defined in docs/DESIGN.md: {missing}"
    original = [f"{f}{k}" for f, n in (("M", 14), ("L", 8), ("O", 6)) for k in range(1, n + 1)]
    original += [f"{f}{k}" for f, n in (("A", 3), ("E", 3), ("P", 2)) for k in range(1, n + 1)]
    newer = ["S1", "W1", "D1", "X1", "U1", "C1", "R1"]
    assert set(original + newer) <= set(design), sorted(set(original + newer) - set(design))


def test_design_every_section_names_existing_code_switches_and_tests(design):
    for key, body in design.items():
        for field in FIELDS:
            assert field in body, f"{key}: no {field!r} line"
        lives = body.split("- **Lives in:**", 1)[1].split("\n- **", 1)[0]
        tests = body.split("- **Tests:**", 1)[1].split("\n\n", 1)[0]
        assert SPAN.search(lives), f"{key}: 'Lives in' names no code"
        assert re.search(r"`tests/\w+\.py::test_\w+`", tests), f"{key}: names no test"
        assert not missing_places(body), f"{key}: {missing_places(body)} do not exist"


def test_design_check_fails_when_an_id_or_a_place_goes_missing(design):
    """The two checks above can fail: a section removed leaves its ID undefined, and a renamed
    function is a place that does not exist."""
    used = used_ids()
    assert "M4" in used and "M4" in design
    text = DESIGN.read_text()
    start = text.index("### M4 — ")
    end = text.index("\n### ", start + 1)
    assert "M4" not in sections(text[:start] + text[end + 1 :])
    assert missing_places("`jaxdqn/agent/losses.py::no_such_function`") == [
        "jaxdqn/agent/losses.py::no_such_function"
    ]
    assert missing_places("`jaxdqn/agent/no_such_module.py`") == ["jaxdqn/agent/no_such_module.py"]
