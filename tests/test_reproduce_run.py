"""`cfl-bench reproduce` end to end at the smoke scale, on the real MNIST.

Why one real run: the reproduction joins four things that each work alone — the sweep, the
run records, the table mapping and the report — and a slip between them (a strategy string
that the sweep spells one way and the summary another, a scale no run matches) would leave
every cell "missing" without an error. The smoke scale runs FedGP Table 1's 22 cells (2
tasks × 1 round, 300 training images) in about a minute; everything else here reads its
folder: the rerun skips, the report files, Table 7 from the same runs, the refusals, and
shipping with --shipped.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from cfl_bench.core.errors import UserError
from cfl_bench.reproduce.command import Request, reproduce, reproductions_root
from cfl_bench.reproduce.provenance import cost_text
from cfl_bench.reproduce.tables import find_table
from cfl_bench.reproduce.verdict import VERDICTS

ROOT = reproductions_root()
TABLE = "fedgp-table1-mnist"


def quiet() -> tuple[Console, io.StringIO]:
    text = io.StringIO()
    return Console(file=text, width=100), text


def call(name: str, root: Path = ROOT, **options: object) -> tuple[int, str]:
    console, text = quiet()
    starts_runs = not (options.get("compare") or options.get("shipped"))
    jobs = 2 if starts_runs else 1  # --jobs has no effect (and is refused) without runs
    request = Request(name, jobs=jobs, **options)  # type: ignore[arg-type]
    return reproduce(request, console=console, root=root), text.getvalue()


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> Path:
    out = tmp_path_factory.mktemp("reproduce") / "smoke"
    code, output = call(TABLE, scale="smoke", data_root=str(shared_data), out=str(out))
    assert code == 0, output
    return out


def read_report(folder: Path) -> list[dict[str, str]]:
    with (folder / "report.csv").open(encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_the_smoke_reproduction_judges_every_cell(smoke: Path) -> None:
    report = smoke / "reproduction" / TABLE
    rows = read_report(report)
    assert len(rows) == 22
    assert {r["scale"] for r in rows} == {"smoke"}
    assert all(r["verdict"] in VERDICTS and r["verdict"] != "missing" for r in rows)
    assert all(r["ours_n"] == "1" for r in rows)
    der = next(r for r in rows if r["row"] == "DER w/ FedGP" and r["column"].startswith("rot"))
    assert (der["paper_value"], der["paper_pm"], der["strategy"]) == ("87.13", "1.100", "der+fedgp")
    assert float(der["difference"]) == pytest.approx(float(der["ours_mean"]) - 87.13, abs=1e-3)
    page = (report / "report.html").read_text(encoding="utf-8")
    assert "22 cells:" in page and "DER w/ FedGP" in page and "Provenance" in page
    assert "#### permuted-MNIST domain-IL (Acc_T)" in (report / "report.md").read_text("utf-8")
    facts = json.loads((report / "provenance.json").read_text(encoding="utf-8"))
    assert facts["runs"] == 22 and facts["scales"] == ["smoke"] and facts["jobs"] == 2
    assert len(list((smoke / ".reproduce").glob("sweep-*.yaml"))) == 2


def test_a_rerun_skips_every_finished_run(smoke: Path, shared_data: Path) -> None:
    code, output = call(TABLE, scale="smoke", data_root=str(shared_data), out=str(smoke))
    assert code == 0
    assert output.count("(11 skipped as already done)") == 2


def test_table7_is_judged_from_the_same_runs(smoke: Path) -> None:
    code, output = call("fedgp-table7-mnist", compare=str(smoke))
    assert code == 0, output
    folder = smoke / "reproduction" / "fedgp-table7-mnist"
    rows = read_report(folder)
    # 22 cells, each in two readings: the paper's formula and the authors' code.
    assert len(rows) == 44 and {r["metric"] for r in rows} == {"Fgt_T", "Fgt_T_clipped"}
    assert all(r["ours_n"] == "1" for r in rows)
    page = (folder / "report.md").read_text(encoding="utf-8")
    assert page.count("Reading: the paper's formula (") == 2
    assert page.count("Reading: the authors' code (") == 2


def test_runs_of_another_scale_are_not_counted(smoke: Path, tmp_path: Path) -> None:
    code, _ = call(TABLE, compare=str(smoke), scale="cpu", out=str(tmp_path / "r"))
    assert code == 0
    rows = read_report(tmp_path / "r")
    assert {r["verdict"] for r in rows} == {"missing"}
    assert "a run at scale smoke" in (tmp_path / "r" / "report.md").read_text("utf-8")
    with pytest.raises(UserError, match="are at scales: none"):
        call(TABLE, compare=str(tmp_path / "r"))


def test_shipping_then_reporting_the_shipped_results(smoke: Path, tmp_path: Path) -> None:
    root = tmp_path / "reproductions"
    shutil.copytree(ROOT / "targets", root / "targets")
    shutil.copytree(ROOT / "tables", root / "tables")
    table = find_table(TABLE, root)
    # Nothing shipped yet: the table file's measured smoke time (its ``measured_s``).
    assert cost_text(table, "smoke", root).endswith(" measured (jobs 1)")
    from cfl_bench.reproduce.shipping import ship

    target = ship(table, smoke, "smoke", root)
    runs = sorted(p for p in target.iterdir() if p.is_dir())
    assert len(runs) == 22
    assert all(
        sorted(f.name for f in run.iterdir()) == ["config.json", "records.csv", "summary.json"]
        for run in runs
    )
    assert json.loads((target / "provenance.json").read_text("utf-8"))["runs"] == 22
    assert "measured (jobs 2)" in cost_text(table, "smoke", root)
    assert "estimated from smoke" in cost_text(table, "cpu", root)
    code, _ = call(TABLE, root=root, shipped=True, scale="smoke", out=str(tmp_path / "rep"))
    assert code == 0 and len(read_report(tmp_path / "rep")) == 22
    # Your runs against ours: the shipped values appear beside yours.
    code, _ = call(TABLE, root=root, compare=str(smoke), out=str(tmp_path / "mine"))
    rows = read_report(tmp_path / "mine")
    assert all(r["shipped_n"] == "1" and r["shipped_mean"] == r["ours_mean"] for r in rows)


def test_refusals(smoke: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="name a scale"):
        call(TABLE)
    with pytest.raises(UserError, match="--scale huge is not one of smoke, cpu, paper"):
        call(TABLE, scale="huge")
    with pytest.raises(UserError, match="is not a folder"):
        call(TABLE, compare=str(tmp_path / "absent"))
    with pytest.raises(UserError, match="at most one of --compare and --shipped"):
        call(TABLE, compare=str(smoke), shipped=True)
    with pytest.raises(UserError, match="no shipped results of fedgp-table1-mnist at scale paper"):
        call(TABLE, shipped=True, scale="paper")
    with pytest.raises(UserError, match="reads its tables from a clone"):
        call("list", root=tmp_path / "absent")
