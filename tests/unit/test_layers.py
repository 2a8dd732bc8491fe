"""Layers point one way: ``dags`` -> ``pipelines`` -> ``dcp_cdc``, never back up."""

from __future__ import annotations

import ast
from pathlib import Path

LIBRARY = Path(__file__).resolve().parents[2] / "dcp_cdc"


def _imported(tree: ast.AST) -> list[tuple[int, str]]:
    """Every module an import statement names, anywhere in the tree (inside functions and
    ``if TYPE_CHECKING:`` too), with its line."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def _imports_pipelines(name: str) -> bool:
    return name == "pipelines" or name.startswith("pipelines.")


def test_the_library_imports_nothing_from_pipelines() -> None:
    files = sorted(LIBRARY.rglob("*.py"))
    assert len(files) > 10
    offenders = [
        f"{path.relative_to(LIBRARY.parent)}:{line}: imports {name}"
        for path in files
        for line, name in _imported(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        if _imports_pipelines(name)
    ]
    assert not offenders, "dcp_cdc must not import pipelines:\n" + "\n".join(offenders)


def test_the_import_finder_sees_every_form() -> None:
    source = (
        "import pipelines.cli\n"
        "from pipelines import tables\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from pipelines.run import local_config\n"
        "def f():\n"
        "    import pipelines\n"
        "from . import pipelines as relative\n"
    )
    names = [(line, n) for line, n in _imported(ast.parse(source)) if _imports_pipelines(n)]
    assert names == [(1, "pipelines.cli"), (2, "pipelines"), (5, "pipelines.run"), (7, "pipelines")]
