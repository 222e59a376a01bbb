"""The reference results shipped in ``reproductions/results/`` and the reports in the docs.

Why: shipped results are what users compare against without rerunning, so they must be
exactly the table's runs at the scale they claim (no stray run, the three files each, a
provenance that counts them), and ``docs/reproductions.md`` must show the report those files
give today — not an older one. Needs no datasets: everything is read from the repository.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cfl_bench.reproduce.collect import collect
from cfl_bench.reproduce.command import reproductions_root
from cfl_bench.reproduce.figure_report import build_figure
from cfl_bench.reproduce.figure_report import markdown as markdown_figure
from cfl_bench.reproduce.figure_report import write as write_figure
from cfl_bench.reproduce.figure_runs import collect_figure
from cfl_bench.reproduce.figures import find_figure, load_all_figures
from cfl_bench.reproduce.outcome import build
from cfl_bench.reproduce.report import markdown
from cfl_bench.reproduce.shipping import SHIPPED_FILES, shipped_folder
from cfl_bench.reproduce.tables import find_table, load_all

ROOT = reproductions_root()
DOCS = Path(__file__).resolve().parent.parent / "docs" / "reproductions.md"
SHIPPED = [
    (table.name, scale)
    for table in load_all(ROOT)
    for scale in table.scales
    if shipped_folder(ROOT, table.runs_name, scale).is_dir()
]


def test_fedgp_table1_mnist_is_shipped_at_cpu_scale() -> None:
    assert ("fedgp-table1-mnist", "cpu") in SHIPPED
    assert ("fedgp-table7-mnist", "cpu") in SHIPPED


@pytest.mark.parametrize(("name", "scale"), SHIPPED)
def test_shipped_runs_are_the_tables_runs(name: str, scale: str) -> None:
    table = find_table(name, ROOT)
    folder = shipped_folder(ROOT, table.runs_name, scale)
    collected = collect(table, folder, scale)
    assert collected.notes == []
    runs = collected.runs()
    facts = json.loads((folder / "provenance.json").read_text(encoding="utf-8"))
    assert facts["runs"] == len(runs) and facts["expected_runs"] == table.runs(scale)
    assert facts["scales"] == [scale] and facts["elapsed_s"] > 0
    for run in folder.iterdir():
        if run.is_dir():
            assert sorted(f.name for f in run.iterdir()) == sorted(SHIPPED_FILES), run
    seeds = set(table.scales[scale].seeds)
    for values in collected.cells.values():
        assert {v.seed for v in values} <= seeds


def test_every_shipped_run_names_a_clean_commit() -> None:
    """A run made in a tree with uncommitted changes (``<commit>-dirty``) cannot be rerun
    by anyone, so none may be shipped: ``--ship`` refuses them, and the 18 FedGP MNIST runs
    that predate the refusal were rerun at commits (issue 41). ``provenance.json`` must say
    the same as the runs."""
    results = ROOT / "results"
    configs = sorted(results.glob("*/*/*/config.json"))
    assert len(configs) > 66
    for config in configs:
        commit = json.loads(config.read_text(encoding="utf-8")).get("git_commit", "")
        assert len(commit) == 40 and not commit.endswith("-dirty"), (config, commit)
    for provenance in results.glob("*/*/provenance.json"):
        facts = json.loads(provenance.read_text(encoding="utf-8"))
        assert not [c for c in facts["git_commits"] if c.endswith("-dirty")], provenance


@pytest.mark.parametrize(("name", "scale"), SHIPPED)
def test_the_docs_show_the_report_of_the_shipped_results(name: str, scale: str) -> None:
    table = find_table(name, ROOT)
    folder = shipped_folder(ROOT, table.runs_name, scale)
    source = f"the shipped results ({scale} in reproductions/results/{table.runs_name})"
    report = markdown(build(table, collect(table, folder, scale), scale, source))
    assert report in DOCS.read_text(encoding="utf-8"), (
        f"docs/reproductions.md does not hold the current report of {name} at {scale}; "
        f"paste the output of report.md of `cfl-bench reproduce {name} --shipped --scale {scale}`"
    )


SHIPPED_FIGURES = [
    (figure.name, scale)
    for figure in load_all_figures(ROOT)
    for scale in figure.scales
    if shipped_folder(ROOT, figure.name, scale).is_dir()
]


def test_fedgp_fig4_carla_is_shipped_at_cpu_scale() -> None:
    assert ("fedgp-fig4-carla", "cpu") in SHIPPED_FIGURES


@pytest.mark.parametrize(("name", "scale"), SHIPPED_FIGURES)
def test_a_shipped_figure_is_its_runs_and_the_docs_show_its_report(
    name: str, scale: str, tmp_path: Path
) -> None:
    figure = find_figure(name, ROOT)
    assert figure is not None
    folder = shipped_folder(ROOT, name, scale)
    runs = collect_figure(figure, folder, scale)
    assert runs.collected.notes == []
    facts = json.loads((folder / "provenance.json").read_text(encoding="utf-8"))
    assert facts["runs"] == len(runs.collected.runs()) == figure.runs(scale)
    assert facts["expected_runs"] == figure.runs(scale) and facts["elapsed_s"] > 0
    assert {label: len(seeds) for label, seeds in runs.curves.items()} == {
        row.label: len(figure.scales[scale].seeds) for row in figure.rows
    }
    source = f"the shipped results ({scale} in reproductions/results/{name})"
    rep = build_figure(figure, runs, scale, source)
    assert markdown_figure(rep) in DOCS.read_text(encoding="utf-8"), (
        f"docs/reproductions.md does not hold the current report of {name} at {scale}; "
        f"paste report.md of `cfl-bench reproduce {name} --shipped --scale {scale}`"
    )
    page = write_figure(rep, tmp_path)["html"].read_text(encoding="utf-8")
    assert page.count("<svg") == 1 and figure.claims.drops[0] in page
