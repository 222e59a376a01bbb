"""`reproduce NAME --compare RUNS` with a method outside the package: its runs on the table's
protocol are shown beside the table's rows, never judged and never dropped.

One row and one column of FedGP Table 1 at the smoke scale on the real MNIST, then the same
run with an unchanged subclass of DER named by its import path (a plugin): its value must be
DER's exactly, in the report's "other methods" section.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

import cfl_bench
from cfl_bench.reproduce.command import Request, reproduce
from cfl_bench.strategies.der import DER

TABLE = "fedgp-table1-mnist"
ROW, COLUMN = "DER w/o FedGP", "rotated-MNIST domain-IL"
PLUGIN = f"{__name__}.SameDER"


class SameDER(DER):
    """DER, unchanged: a method outside the package."""


def call(**options: object) -> tuple[int, str]:
    text = io.StringIO()
    code = reproduce(Request(TABLE, **options), console=Console(file=text, width=200))  # type: ignore[arg-type]
    return code, text.getvalue()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> Path:
    """DER's smoke run of the rotated-MNIST column, and the plugin's with its options."""
    out = tmp_path_factory.mktemp("other") / "runs"
    code, output = call(
        scale="smoke", data_root=str(shared_data), out=str(out), rows=(ROW,), columns=(COLUMN,)
    )
    assert code == 0, output
    (der,) = [p.parent for p in out.rglob("config.json") if "_der_" in p.parent.name]
    options = json.loads((der / "config.json").read_text(encoding="utf-8"))["config"]
    options = {k: v for k, v in options.items() if k not in ("strategy", "out", "overwrite")}
    cfl_bench.run(strategy=PLUGIN, out=str(out / "mine" / "plugin"), progress=False, **options)
    return out


def test_the_plugins_runs_are_shown_beside_the_table(runs: Path, tmp_path: Path) -> None:
    code, output = call(compare=str(runs), out=str(tmp_path / "r"))
    assert code == 0, output
    report = (tmp_path / "r" / "report.md").read_text(encoding="utf-8")
    section = report.split("#### Other methods on this table's protocol")[1]
    plugin_line = next(line for line in section.splitlines() if line.startswith(f"| {PLUGIN} |"))
    der_line = next(line for line in report.splitlines() if line.startswith(f"| {ROW} |"))
    ours = der_line.split(" | ")[2]  # "mean (n=1)": DER's value in the table's column
    assert plugin_line == f"| {PLUGIN} | {ours} | — |"
    assert "Other methods on this table's protocol" in output
    assert PLUGIN in (tmp_path / "r" / "report.html").read_text(encoding="utf-8")
    notes = report.split("\nNotes:\n")[1] if "\nNotes:\n" in report else ""
    assert PLUGIN not in notes  # shown, not listed as a run that was not counted
