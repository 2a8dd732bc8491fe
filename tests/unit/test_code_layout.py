"""The code's layout (STYLE.md, "One home per concern"): the layers point one way, ``dags`` →
``pipelines`` → ``dcp_cdc``; no module of ours imports a module that imports it back; every
error class lives in one of the two error modules; table names come from one module; the
command line's job modules import without Spark.

The import graph is read from the source with ``ast``, so an import hidden in a function body
or under ``if TYPE_CHECKING:`` counts. Left out: ``if __name__ == "__main__":`` blocks (a
script's own entry: run as a script, the module is a different module object).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("dcp_cdc", "pipelines", "dags")
LAYER = {"dcp_cdc": 0, "pipelines": 1, "dags": 2}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(path): path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def _skipped(node: ast.If) -> bool:
    """``if __name__ == "__main__":``."""
    return ast.unparse(node.test).replace("'", '"') == '__name__ == "__main__"'


def _imports(tree: ast.AST) -> Iterator[tuple[int, str, list[str]]]:
    """(line, module, names) of every import statement at any depth, but a script's entry."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _skipped(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module, [a.name for a in node.names]
        stack.extend(ast.iter_child_nodes(node))


def _edges(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    """module -> {imported module of ours: line}; ``from pkg import mod`` names the module."""
    edges: dict[str, dict[str, int]] = {name: {} for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for line, target, names in _imports(tree):
            if target.split(".")[0] not in PACKAGES:
                continue
            found = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
            if len(found) < len(names) or not names:
                found.append(target)
            for module in found:
                # importing one's own package (as Python does for every submodule) is no circle
                if module in modules and not (name + ".").startswith(module + "."):
                    edges[name].setdefault(module, line)
    return edges


def _cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_imports_inside_functions_and_type_checking() -> None:
    tree = ast.parse(
        "import os\n"
        "def f():\n    from pipelines.silver import job\n"
        "if TYPE_CHECKING:\n    from pipelines import cli\n"
        'if __name__ == "__main__":\n    import dags\n'
        "from . import relative\n"
    )
    found = sorted(target for _, target, _ in _imports(tree))
    assert found == ["os", "pipelines", "pipelines.silver"]


def test_cycles_are_found() -> None:
    edges = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}
    assert _cycles(edges) == [["a", "b", "c"]]


def test_no_import_circle() -> None:
    edges = _edges(_modules())
    cycles = _cycles(edges)
    detail = [
        f"{m} imports {n} (line {edges[m][n]})"
        for c in cycles
        for m in c
        for n in c
        if n in edges[m]
    ]
    assert not cycles, "import circles:\n" + "\n".join(detail)


def test_layers_point_one_way() -> None:
    """dags -> pipelines -> dcp_cdc, never back up: the library never imports pipelines."""
    edges = _edges(_modules())
    upward = [
        f"{module} imports {target} (line {line})"
        for module, targets in edges.items()
        for target, line in targets.items()
        if LAYER[target.split(".")[0]] > LAYER[module.split(".")[0]]
    ]
    assert not upward, "\n".join(upward)


ERROR_MODULES = ("dcp_cdc.errors", "pipelines.errors")


def test_every_error_class_lives_in_an_error_module() -> None:
    """One home for errors: a class deriving from an exception is in one of the two modules."""
    elsewhere = [
        f"{name}.{node.name} (line {node.lineno})"
        for name, path in _modules().items()
        if name not in ERROR_MODULES
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef)
        and (
            node.name.endswith("Error")
            or any(ast.unparse(b).endswith(("Error", "Exception")) for b in node.bases)
        )
    ]
    assert not elsewhere, "\n".join(elsewhere)


def test_every_error_is_a_dcp_error() -> None:
    import importlib

    from dcp_cdc.errors import DcpError

    for module_name in ERROR_MODULES:
        module = importlib.import_module(module_name)
        classes = [v for v in vars(module).values() if isinstance(v, type)]
        errors = [c for c in classes if issubclass(c, BaseException)]
        assert errors
        assert [c.__name__ for c in errors if not issubclass(c, DcpError)] == []


TABLES_MODULE = "pipelines.tables"
TABLE_NAME = re.compile(
    r"(?<![\w/.])(bronze|silver|quality)\.(\{|\w*(__|_(events|quarantine|ingest_log|results|all)\b))"
)


def _strings(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Every string literal (f-strings' literal parts too) that is not a docstring."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings:
                yield node.lineno, node.value
        elif isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            yield node.lineno, text


def test_table_names_come_from_one_module() -> None:
    """No job, report or command spells a bronze, silver or quality table name itself."""
    spelled = [
        f"{name} line {line}: {text!r}"
        for name, path in _modules().items()
        if name != TABLES_MODULE
        for line, text in _strings(ast.parse(path.read_text(encoding="utf-8")))
        if TABLE_NAME.search(text)
    ]
    assert not spelled, "\n".join(spelled)


def test_silver_modules_point_one_way() -> None:
    """job -> store (registry, state, store) -> transforms (and walk): the pure transforms know
    no store, the store no job; the MERGEs know the registry, never the other way."""
    edges = _edges(_modules())
    stores = {"pipelines.silver.registry", "pipelines.silver.state", "pipelines.silver.store"}
    for pure in ("pipelines.silver.transforms", "pipelines.silver.walk"):
        assert not (stores | {"pipelines.silver.job"}) & set(edges[pure])
    for store in stores:
        assert "pipelines.silver.job" not in edges[store]
    assert "pipelines.silver.store" not in edges["pipelines.silver.registry"]


COMMAND_MODULES = [
    "pipelines.app.cli",
    *(
        f"pipelines.app.commands.{p.stem}"
        for p in sorted((ROOT / "pipelines" / "app" / "commands").glob("*.py"))
        if p.stem != "__init__"
    ),
]
HEAVY = ("pyspark", "delta", "great_expectations")


def test_command_modules_import_without_spark_delta_or_great_expectations() -> None:
    """The command line's faces of the jobs import none of them (the job modules do, at the
    top): ``dcp-cdc --help`` and the Spark-free verbs start no Spark."""
    script = (
        "import importlib, json, sys\n"
        f"for m in {COMMAND_MODULES!r}: importlib.import_module(m)\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert json.loads(done.stdout) == []


def test_table_names() -> None:
    from pipelines.tables import BucketTables, all_rows, view_of

    names = BucketTables("travel-sample")
    assert names.bronze == {
        "events": "bronze.travel_sample_a8560dff_events",
        "quarantine": "bronze.travel_sample_a8560dff_quarantine",
        "ingest_log": "bronze.travel_sample_a8560dff_ingest_log",
    }
    assert names.silver_support == (
        "silver.travel_sample_a8560dff__collections",
        "silver.travel_sample_a8560dff__stream_state",
        "silver.travel_sample_a8560dff__tombstone_purges",
    )
    assert names.collection("inventory", "Airline") == (
        "silver.travel_sample_a8560dff__inventory__airline_23a92764"
    )
    assert names.collection_all("inventory", "route") == (
        "silver.travel_sample_a8560dff__inventory__route_all"
    )
    assert view_of(all_rows("silver.b__s__c")) == "silver.b__s__c"
    assert names.results == "quality.travel_sample_a8560dff_results"


# Citations: a wire fact's comment cites the project's own protocol docs by section
# ("docs/protocol/dcp.md §6.3"); every such section exists, and nothing cites a document that
# is not in the repository.
CITATION = re.compile(r"((?:docs/)?[\w./-]+\.md) ?§ ?(\d+(?:\.\d+)*)")
# our docs' names are lower case; kv_engine's (docs/BinaryProtocol.md, ...) are not
DOC_MENTION = re.compile(r"(?<![\w./-])docs/[a-z0-9_./-]*[a-z0-9]\.md")
STRAY = re.compile(r"(?<![\w./-])(spec|research) ?§|shared/(spec|research|seeds)/")
CITING = [
    *(p for package in (*PACKAGES, "tests", "benchmarks") for p in (ROOT / package).rglob("*.py")),
    *(ROOT / "docs").rglob("*.md"),
    ROOT / "README.md",
]


def _sections(doc: Path) -> set[str]:
    """The numbers of a Markdown file's numbered headings (``### 6.3 ...``, ``## 2. ...``)."""
    found = re.findall(r"^#+ (\d+(?:\.\d+)*)\.? ", doc.read_text(encoding="utf-8"), re.M)
    return set(found)


def _target(source: Path, name: str) -> Path:
    """A cited file: from the repository's root (``docs/...``), else beside the citing doc."""
    if name.startswith("docs/") or source.suffix == ".py":
        return ROOT / (name if name.startswith("docs/") else f"docs/{name}")
    return (source.parent / name).resolve()


def test_every_citation_resolves_to_a_section_in_the_repository() -> None:
    broken: list[str] = []
    for source in CITING:
        for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{source.relative_to(ROOT)}:{number}"
            if STRAY.search(line):
                broken.append(f"{where}: cites a document outside the repository: {line.strip()}")
            for name, section in CITATION.findall(line):
                doc = _target(source, name)
                if not doc.is_file():
                    broken.append(f"{where}: {name} is not a file in the repository")
                elif section not in _sections(doc):
                    broken.append(f"{where}: {name} has no section {section}")
            for name in DOC_MENTION.findall(line):
                if not (ROOT / name).is_file():
                    broken.append(f"{where}: {name} is not a file in the repository")
    assert not broken, "\n".join(broken)


def test_a_broken_citation_is_found(tmp_path: Path) -> None:
    doc = tmp_path / "d.md"
    doc.write_text("# T\n## 6. Messages\n### 6.3 Marker\n", encoding="utf-8")
    assert _sections(doc) == {"6", "6.3"}
    assert CITATION.findall("see docs/protocol/dcp.md §6.3.") == [("docs/protocol/dcp.md", "6.3")]
    outside = ("(spec " + "§6.3)", "shared/" + "spec/dcp-messages.md", "research " + "§1.3")
    assert all(STRAY.search(text) for text in outside)
    assert not STRAY.search("docs/protocol/dcp.md §6.3")


def _layout_entries() -> dict[str, str]:
    """docs/architecture.md's layout block: the text said of each package (``dcp_cdc/``,
    ``dcp_cdc/agent/``, ``pipelines/``, ``dags/``): an entry is a line at indent 0 or 2 (a
    package's own modules are entries at indent 2 below it), and the deeper lines below it."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    entries: dict[str, str] = {}
    top = current = ""
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        word = line.strip().split(" ", 1)[0]
        if word and indent == 0:
            top = current = word[: word.rindex("/") + 1] if "/" in word else ""
        elif word and indent == 2:
            current = top + word if word.endswith("/") else top
        entries[current] = entries.get(current, "") + " " + line.strip()
    return entries


def test_the_architecture_page_names_every_module() -> None:
    """Every module of the library, the jobs and the DAGs is named in docs/architecture.md's
    layout, in its package's entry (``name.py``, or its name in a list of stages)."""
    entries = _layout_entries()
    unnamed = []
    for name, path in _modules().items():
        if path.name == "__init__.py":
            continue
        package = path.parent.relative_to(ROOT).as_posix() + "/"
        said = entries.get(package, "")
        if not re.search(rf"(?<!\w){re.escape(path.stem)}(\.py)?\b", said):
            unnamed.append(f"{name} (in the entry of {package})")
    assert not unnamed, "docs/architecture.md does not name:\n" + "\n".join(unnamed)


FILE_LINES = {"pipelines": 700, "dcp_cdc": 800}
FUNCTION_LINES = 100
TOP_LEVEL_MODULES = 5


def test_files_and_functions_stay_readable() -> None:
    """A newcomer reads a file or a function at one sitting: no file in ``pipelines/`` over
    700 lines or in ``dcp_cdc/`` over 800, no function over 100 lines in either, and at most
    five modules beside the packages at the top of ``pipelines/``."""
    too_long = []
    for package, limit in FILE_LINES.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            source = path.read_text(encoding="utf-8")
            where = path.relative_to(ROOT)
            if (lines := source.count("\n")) > limit:
                too_long.append(f"{where}: {lines} lines (limit {limit})")
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    if length > FUNCTION_LINES:
                        too_long.append(f"{where}:{node.lineno} {node.name}: {length} lines")
    assert not too_long, "\n".join(too_long)
    top = [p.name for p in (ROOT / "pipelines").glob("*.py") if p.name != "__init__.py"]
    assert len(top) <= TOP_LEVEL_MODULES, top
