"""The metric registry is the one list every report reads.

Why these tests: the registry only removes work if the summary, the CLI table and the
leaderboard really are derived from it. Each test below breaks if a consumer goes back to a
list of its own: a key computed but not registered (or registered but never computed), a
renamed label that does not reach a table, a task-IL metric shown on a domain-IL stream, a
ranking that ignores the registered direction.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from cfl_bench.core import metric_registry as registry
from cfl_bench.core import metrics
from cfl_bench.core.metric_registry import METRICS, MetricSpec
from tests.leaderboard_fixtures import recorded_rows, standard_runs


def _summary(task_il: bool) -> dict[str, object]:
    rows = recorded_rows(tasks=3, rounds_per_task=2, clients=3, task_il=task_il)
    return metrics.summarize(pd.DataFrame(rows, columns=list(metrics.RECORD_COLUMNS)), 3)


def _replaced(monkeypatch: pytest.MonkeyPatch, key: str, **changes: object) -> MetricSpec:
    """Swap one registry entry for a changed copy (what editing its registry line does)."""
    changed = dataclasses.replace(registry.metric(key), **changes)  # type: ignore[arg-type]
    entries = tuple(changed if s.key == key else s for s in METRICS)
    monkeypatch.setattr(registry, "METRICS", entries)
    return changed


def test_entries_are_consistent() -> None:
    keys = [s.key for s in METRICS]
    columns = [s.column for s in METRICS if s.column]
    assert len(keys) == len(set(keys)) and len(columns) == len(set(columns))
    for spec in METRICS:
        assert spec.direction in ("higher", "lower", None), spec.key
        assert spec.views <= set(registry.VIEWS), spec.key
        assert (spec.origin == "summary") == (spec.compute is not None), spec.key
        assert all(registry.metric(p).column for p in spec.parts), spec.key
        if spec.task_il_of is not None:
            assert registry.metric(spec.task_il_of).scenarios is None
        for view in spec.views:
            assert spec.direction is not None, f"{spec.key} is shown in {view}"


def test_every_compute_names_a_function_of_metrics() -> None:
    for spec in registry.summary_metrics():
        assert callable(getattr(metrics, str(spec.compute), None)), spec.compute


@pytest.mark.parametrize("task_il", [True, False])
def test_summarize_produces_exactly_the_registered_keys(task_il: bool) -> None:
    scenario = "class-il" if task_il else "domain-il"
    # The diagnostics exist only in runs made with --diagnostics (tests/test_diagnostics.py).
    want = {
        s.key
        for s in registry.metrics_for(scenario)
        if s.origin == "summary" and s.family != "diagnostics"
    }
    assert set(_summary(task_il)) == want


def test_task_il_metrics_exist_for_class_il_only() -> None:
    task_il = {s.key for s in METRICS if s.source == "acc_task_il"}
    assert task_il and {s.key for s in METRICS if s.scenarios == ("class-il",)} == task_il
    assert not task_il & {s.key for s in registry.metrics_for("domain-il")}
    assert task_il <= {s.key for s in registry.metrics_for("class-il")}
    assert not task_il & set(_summary(task_il=False))
    assert registry.TASK_IL_MARKER in task_il


def test_leaderboard_columns_come_from_the_registry() -> None:
    from cfl_bench.leaderboard.aggregate import BOARD_COLUMNS
    from cfl_bench.leaderboard.runs import CURVES, MATRICES, RANGES
    from cfl_bench.leaderboard.runs import METRICS as BOARD_METRICS

    board = [s.column for s in registry.board_columns()]
    assert list(BOARD_METRICS) == board
    # every metric's mean, then the two --target means (not per-run registry metrics: they
    # depend on the target given to the leaderboard)
    target_means = ["rounds_to_target_mean", "bytes_to_target_mean"]
    means = [c for c in BOARD_COLUMNS if c.endswith("_mean")]
    assert means == [f"{c}_mean" for c in board] + target_means
    assert set(CURVES) | set(MATRICES) == {
        s.column for s in METRICS if s.column and s.shape != "scalar"
    }
    assert all(RANGES[s.key] == s.range for s in METRICS if s.range and s.origin != "leaderboard")


def test_a_renamed_label_reaches_the_cli_table(monkeypatch: pytest.MonkeyPatch) -> None:
    from cfl_bench.cli import results_table

    _replaced(monkeypatch, "MD_T", label="memory drift", short="")
    console = Console(width=80, record=True)
    console.print(results_table(_summary(task_il=True), "seq-cifar10", "der"))
    text = console.export_text()
    assert "memory drift" in text and "MD_T" not in text
    for spec in registry.view("cli"):
        # A scenario's own metric (the test town's mAP) is shown only where it exists.
        assert (spec.narrow_label in text) == (spec.scenarios is None), spec.key


def test_a_new_view_entry_reaches_the_html_and_the_report(monkeypatch: pytest.MonkeyPatch) -> None:
    from cfl_bench.leaderboard.html import table_columns

    _replaced(monkeypatch, "Fgt_T_clipped", views=frozenset({"board", "report"}))
    headers = [c[0] for c in table_columns(task_il=False, scenario_label="domain-IL")]
    # the ranked metric is followed by its 95 % CI and its standing against the best row
    assert headers == [
        "strategy", "seeds", "Acc_T domain-IL (%)", "95 % CI", "vs best", "AIA (%)",
        "Fgt_T (%)", "Fgt_T clipped (%)", "BWT (%)", "FWT (%)", "MD_T", "bytes", "wall time",
        "notes",
    ]  # fmt: skip
    til = [c[0] for c in table_columns(task_il=True, scenario_label="class-IL")]
    assert til[2:10] == [
        "Acc_T class-IL (%)", "95 % CI", "vs best", "AIA (%)", "Acc_T task-IL (%)",
        "AIA task-IL (%)", "Fgt_T (%)", "Fgt_T clipped (%)",
    ]  # fmt: skip
    assert "Fgt_T task-IL (%)" in til and "BWT task-IL (%)" not in til


def test_the_terminal_table_follows_the_registry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cfl_bench.leaderboard.aggregate import aggregate
    from cfl_bench.leaderboard.command import summary_tables
    from cfl_bench.leaderboard.runs import load_runs

    board = aggregate(load_runs([standard_runs(tmp_path)]))
    _replaced(monkeypatch, "BWT", views=frozenset({"terminal"}))
    headers = [str(c.header) for c in summary_tables(board)[0].columns]
    assert headers[:7] == ["strategy", "seeds", "Acc_T %", "vs best", "Fgt_T %", "BWT %", "bytes"]


@pytest.mark.parametrize("direction", ["higher", "lower"])
def test_ranking_uses_the_registered_direction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direction: str
) -> None:
    from cfl_bench.leaderboard.aggregate import aggregate
    from cfl_bench.leaderboard.runs import load_runs

    runs = load_runs([standard_runs(tmp_path)])
    _replaced(monkeypatch, registry.RANK_BY, direction=direction)
    board = aggregate(runs)
    for _, rows in board.groupby("protocol_hash", sort=False):
        means = list(rows["Acc_T_mean"].dropna())
        assert means == sorted(means, reverse=direction == "higher")
    assert board["Acc_T_mean"].notna().sum() > 3  # the check above compared something


def test_display_order_puts_each_metric_beside_its_task_il_twin() -> None:
    shown = [s.key for s in registry.display_order(registry.view("report"))]
    assert shown.index("acc_task_il_T") == shown.index("Acc_T") + 1
    assert shown.index("Fgt_T") < shown.index("fgt_acc_task_il_T") < shown.index("BWT")
    for spec in registry.view("report"):
        twin = registry.task_il_twin(spec.key)
        assert twin is None or twin.task_il_of == spec.key


def test_recorded_metrics_feed_the_report_checks() -> None:
    from cfl_bench.leaderboard.run_data import TASK_END_METRICS, VALUE_RANGES
    from cfl_bench.runner.trackers import scalars

    assert {r.name: r.range for r in registry.RECORDED} == VALUE_RANGES
    task_end = {"acc", "acc_task_il", "map50", "map", "kl_drift", "own_acc", "own_acc_task_il"}
    assert set(TASK_END_METRICS) == task_end
    accuracy_like = ("acc", "acc_task_il", "map50", "map")
    assert metrics.ACCURACY_METRICS == registry.ACCURACY_METRICS == accuracy_like
    tags = {tag for tag, _, _ in scalars([(1, 0, 0, "global", "acc_task_il", 50.0)])}
    assert "acc_task_il/avg_seen" in tags
