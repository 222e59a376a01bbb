"""A figure's claim reproduced: FedGP Fig. 4b's "FedAvg falls after the shift, DER holds".

Why: the figure prints no number, so its claim is all there is to test, and a curve that
wobbles round to round must not pass for a fall. These tests pin the headlines (window
means before the shift and at the end, computed from records.csv by hand here), the claims'
t-tests on hand-made seeds (a resolved fall holds; one inside the noise, reversed, or of
one seed does not), every refusal of a damaged figure file, and the sweep a figure runs.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from cfl_bench.core.errors import UserError
from cfl_bench.core.run_reader import RunReading
from cfl_bench.reproduce.command import Request, reproduce, reproductions_root
from cfl_bench.reproduce.figure_command import select_figure, sweep_document
from cfl_bench.reproduce.figure_runs import Windows, windows_of
from cfl_bench.reproduce.figure_verdict import RowHeadlines, close, judge
from cfl_bench.reproduce.figures import find_figure, load_figure
from cfl_bench.reproduce.verdict import Ours

ROOT = reproductions_root()
NAME = "fedgp-fig4-carla"


def reading(curve: dict[int, float], shift: int, total: int) -> RunReading:
    """A finished two-task run whose urban map50 (eval task 0) is ``curve`` by round; the
    highway's (eval task 1) and the round-0 value are there too and must not be read."""
    rows = [(0, -1, 0, "global", "map50", 99.0)]
    rows += [(r, 0, 0, "global", "map50", v) for r, v in curve.items()]
    rows += [(r, 0, 1, "global", "map50", 50.0) for r in curve]
    rows += [(r, 0, 0, "global", "map", 7.0) for r in curve]
    records = pd.DataFrame(
        rows, columns=["round", "trained_task", "eval_task", "scope", "metric", "value"]
    )
    clock = {"task_clock": {"total_rounds": total, "eval_rounds": [shift, total]}}
    return RunReading(Path("run"), "finished", "", clock, {"num_tasks": 2}, row={}, records=records)


def test_the_windows_are_the_k_rounds_up_to_the_shift_and_the_last_k() -> None:
    curve = {r: float(r) for r in range(1, 11)}  # the value of round r is r
    windows = windows_of(reading(curve, shift=7, total=10), "map50", 0, 2)
    assert isinstance(windows, Windows)
    assert (windows.before, windows.end, windows.shift) == (6.5, 9.5, 7)  # (6+7)/2, (9+10)/2
    assert windows.fall == -3.0
    assert list(windows.curve.index) == list(range(1, 11))


def test_a_run_lacking_a_window_round_is_not_read() -> None:
    curve = {r: 1.0 for r in range(1, 11) if r != 6}
    why = windows_of(reading(curve, shift=7, total=10), "map50", 0, 2)
    assert why == "no map50 of eval task 0 at round 6 (eval_every_round?)"


def ours(*values: float) -> Ours:
    return Ours(values, tuple(range(len(values))))


def headlines(before: tuple[float, ...], end: tuple[float, ...]) -> RowHeadlines:
    falls = tuple(b - e for b, e in zip(before, end, strict=True))
    return RowHeadlines(ours(*before), ours(*end), ours(*falls))


def test_a_resolved_fall_holds_and_a_smaller_fall_holds() -> None:
    rows = {
        # falls 4, 5, 6: mean 5, SE 0.577, t = 8.7 > t(0.95, 2) = 2.92
        "FedAvg": headlines((10, 11, 12), (6, 6, 6)),
        # falls 0, 1, 0 → FedAvg − DER = 4, 4, 6: mean 4.67, SE 0.67, t = 7 → holds
        "DER": headlines((10, 11, 12), (10, 10, 12)),
        # falls 4, 6, 5 → FedAvg − it = 0, -1, 1: inside the noise
        "DER+FedGP": headlines((10, 11, 12), (6, 5, 7)),
    }
    results = judge(rows, ("FedAvg",), ("DER", "DER+FedGP"))
    assert [r.status for r in results] == ["holds", "holds", "inside noise"]
    assert results[0].ours_difference == pytest.approx(5.0)
    assert results[1].ours_difference == pytest.approx(14 / 3)


def test_a_rise_is_reversed_one_seed_is_not_judged_and_no_run_is_missing() -> None:
    rising = {"FedAvg": headlines((1, 2, 3), (5, 6, 8)), "DER": RowHeadlines(None, None, None)}
    fall, versus = judge(rising, ("FedAvg",), ("DER",))
    assert fall.status == "reversed" and versus.status is None and versus.holds is None
    single = {"FedAvg": headlines((10,), (4,)), "DER": headlines((10,), (10,))}
    assert [r.status for r in judge(single, ("FedAvg",), ("DER",))] == ["one seed"] * 2


def test_close_pairs_are_reported_with_their_standard_error() -> None:
    rows = {
        "DER+FedGP": headlines((5, 5, 5), (8, 9, 10)),
        "Ideal": headlines((5, 5, 5), (9, 10, 12)),
    }
    (result,) = close(rows, (("DER+FedGP", "Ideal"),))
    assert result.difference == pytest.approx(4 / 3) and result.seeds == 3
    assert result.se == pytest.approx(0.3333333, abs=1e-6)


def test_the_carla_figure_runs_every_row_and_seed_at_its_scale() -> None:
    figure = find_figure(NAME, ROOT)
    assert figure is not None
    doc = sweep_document(figure, "cpu", Path("out"), {"data_root": "D"}, 2)
    assert doc["grid"] == {"seed": [0, 1, 2], "strategy": ["ideal", "fedavg", "der", "der+fedgp"]}
    base = doc["base"]
    assert (base["stream"], base["tasks"], base["clients"], base["data_root"]) == (
        "carla-highway",
        2,
        2,
        "D",
    )
    assert (base["lead_rounds"], base["rounds_per_task"], base["eval_every_round"]) == (
        20,
        10,
        True,
    )
    assert figure.window("cpu") == 5 and figure.window("smoke") == 1
    chosen = select_figure(figure, "cpu", Request(NAME, rows=("DER",), seeds=(1,)))
    assert sweep_document(chosen, "cpu", Path("o"), {}, 1)["grid"] == {
        "seed": [1],
        "strategy": ["der"],
    }
    with pytest.raises(UserError, match="is a figure and has no columns"):
        select_figure(figure, "cpu", Request(NAME, columns=("x",)))


def edited_figure(tmp_path: Path, old: str, new: str) -> Path:
    path = tmp_path / f"{NAME}.yaml"
    shutil.copy(ROOT / "figures" / f"{NAME}.yaml", path)
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("old", "new", "fragment"),
    [
        ("eval_task: 0", "eval_task: 0\ncolumns: []", "unknown key"),
        ("cpu: 5,", "cpu: 11,", "window 11 does not fit scale cpu"),
        ("smoke: 1,", "smoke: 0,", "window.smoke must be an integer >= 1"),
        ("  tasks: 2\n", "  tasks: 3\n", "must run tasks: 2 with eval_every_round"),
        ("  eval_every_round: true\n", "", "must run tasks: 2 with eval_every_round"),
        ("drops: [FedAvg]", "drops: [FedAvgs]", "claims.drops must list rows"),
        ("drops: [FedAvg]", "drops: []", "claims.drops must name the row"),
        ("- [DER+FedGP, Ideal]", "- [DER+FedGP]", "claims.close pair"),
        ("strategy: der+fedgp}", "strategy: der+nosuch}", "unknown strategy component"),
        ("  batch_size: 8\n", "  batch_size: 8\n  seed: 1\n", "fixes 'seed'"),
        ("  epochs: 2\n", "", "scale smoke sets epochs, which the protocol does not"),
    ],
)
def test_damaged_figure_files_are_refused(
    tmp_path: Path, old: str, new: str, fragment: str
) -> None:
    path = edited_figure(tmp_path, old, new)
    with pytest.raises(UserError, match=fragment):
        load_figure(path)


def test_an_unknown_name_lists_the_tables_and_the_figures() -> None:
    with pytest.raises(UserError, match=f"choose one of .*{NAME}.*fedgp-table1-mnist"):
        reproduce(Request("fedgp-fig5"), root=ROOT)
