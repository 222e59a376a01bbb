"""The longest functions and classes of the project's packages, in lines.

    python bench/code_shape.py [--top 5] [--root .]

Why: docs/architecture.md ("Code shape and speed rules") treats a function over ~60 lines or
a class over ~200 as a smell, and the engine-shape issue reports the longest of each before
and after. Lines are counted from the ``def``/``class`` line to the last line of the body,
docstrings included.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

PACKAGES = ("cfl_bench", "streams", "strategies", "leaderboard", "carla_bridge")


def spans(root: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(length, "path:line name") of every function and every class under ``root``."""
    functions: list[tuple[int, str]] = []
    classes: list[tuple[int, str]] = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    continue
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                where = f"{path.relative_to(root)}:{node.lineno} {node.name}"
                (classes if isinstance(node, ast.ClassDef) else functions).append((length, where))
    return sorted(functions, reverse=True), sorted(classes, reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--top", type=int, default=5)
    args = parser.parse_args()
    functions, classes = spans(args.root)
    for title, rows in (("functions", functions), ("classes", classes)):
        print(f"longest {title}:")
        for length, where in rows[: args.top]:
            print(f"  {length:>4}  {where}")


if __name__ == "__main__":
    main()
