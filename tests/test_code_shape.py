"""Product modules stay small enough to read: at most 500 lines a module, 60 a function.

A function's lines run from its ``def`` (or first decorator) to its last line, docstring and
comments included: what a reader has to hold at once.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_import_graph import turnlog_modules

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def long_functions(tree: ast.Module, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int, int]]:
    """(qualified name, first line, lines) of every function longer than ``limit`` lines."""
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = getattr(child, "name", "")
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                lines = (child.end_lineno or child.lineno) - first + 1
                if lines > limit:
                    found.append((f"{scope}{name}", first, lines))
            visit(child, f"{scope}{name}." if name else scope)

    visit(tree, "")
    return found


def _product_files() -> dict[str, Path]:
    repo = Path(__file__).resolve().parent.parent
    return {str(path.relative_to(repo)): path for path in turnlog_modules().values()}


def test_no_product_module_over_500_lines() -> None:
    long = {
        rel: n
        for rel, path in _product_files().items()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"split these by concern (at most {MAX_MODULE_LINES} lines each): {long}"


def test_no_product_function_over_60_lines() -> None:
    long = {
        f"{rel}:{line} {name}": n
        for rel, path in _product_files().items()
        for name, line, n in long_functions(ast.parse(path.read_text()))
    }
    assert not long, f"split these functions (at most {MAX_FUNCTION_LINES} lines each): {long}"


def test_the_measure_counts_decorators_docstrings_and_nested_functions() -> None:
    source = "\n".join(
        [
            "class A:",
            "    @staticmethod",
            "    def f():",
            '        """doc"""',
            "        def inner():",
            "            return 1",
            "        return inner",
            "async def g():",
            "    pass",
        ]
    )
    assert long_functions(ast.parse(source), limit=4) == [("A.f", 2, 6)]
    assert long_functions(ast.parse(source), limit=1) == [("A.f", 2, 6), ("A.f.inner", 5, 2), ("g", 8, 2)]
