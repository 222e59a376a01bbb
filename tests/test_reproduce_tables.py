"""The papers' targets and the table files: loading, every refusal, and the defaults audit.

Why: a reproduction is only as good as the mapping from a printed cell to a run. These tests
pin the shipped targets (every cell of the five papers, digit for digit), check that every
table file maps each of its cells to exactly one printed number and to a strategy that
builds, that the suite's stream defaults are the FedGP MNIST protocol (T = 10), and that a
damaged targets or table file is refused with a sentence naming the fix.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cfl_bench.core.errors import UserError
from cfl_bench.reproduce.command import Request, reproductions_root, select, sweep_documents
from cfl_bench.reproduce.tables import find_table, load_all, load_table
from cfl_bench.reproduce.targets import COLUMNS, CellKey, load_targets
from cfl_bench.runner.config import RunConfig
from cfl_bench.streams.catalogue import STREAMS

ROOT = reproductions_root()
PAPER_CELLS = {
    "fedgp": 400,
    "fedntd": 559,
    "fedproj-arxiv": 104,
    "fedproj-anon": 149,
    "ifa": 78,
    "glfc": 346,
}


@pytest.mark.parametrize(("paper", "cells"), sorted(PAPER_CELLS.items()))
def test_every_papers_targets_load(paper: str, cells: int) -> None:
    targets = load_targets(ROOT / "targets" / f"{paper}.csv")
    assert len(targets) == cells


def test_a_target_is_the_printed_cell() -> None:
    targets = load_targets(ROOT / "targets" / "fedgp.csv")
    key = CellKey(
        "Table 1", "rotated-MNIST", "domain-IL; K=10, buffer 200", "DER", "w/ FedGP", "Acc_T (%)"
    )
    cell = targets[key]
    assert (cell.value, cell.pm, cell.n_seeds, cell.source_line) == (87.13, 1.1, 5, "143")
    ideal = next(t for k, t in targets.items() if k.method == "Ideal" and k.table == "Table 1")
    assert ideal.text == "90.00"  # the printed digits are kept


def write_targets(tmp_path: Path, *rows: str) -> Path:
    path = tmp_path / "t.csv"
    path.write_text(",".join(COLUMNS) + "\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path


GOOD = "P,T1,d,s,m,v,Acc,50.1,1.2,5,10,"


@pytest.mark.parametrize(
    ("rows", "fragment"),
    [
        ((GOOD, GOOD), "is given twice"),
        (("P,T1,d,s,m,v,Acc,Failure,,5,10,",), "not a number and its notes do not say why"),
        (("P,T1,d,s,m,v,Acc,50,-1,5,10,",), "pm -1.0 is negative"),
        (("P,T1,d,s,m,v,Acc,50,x,5,10,",), "pm 'x' is not a number"),
        (("P,T1,d,s,m,v,Acc,50,inf,5,10,",), "is not finite"),
        (("P,T1,d,s,m,v,Acc,50,,five,10,",), "n_seeds 'five'"),
        ((GOOD, "Q,T1,d,s,m,v2,Acc,50,,5,10,"), "one paper per targets file"),
        (("P,T1,,s,m,v,Acc,50,,5,10,",), "must be given"),
        (("P,T1,d,s,m,v,Acc,50",), "wrong number of fields"),
    ],
)
def test_damaged_targets_are_refused(tmp_path: Path, rows: tuple[str, ...], fragment: str) -> None:
    with pytest.raises(UserError, match=fragment):
        load_targets(write_targets(tmp_path, *rows))


def test_targets_with_another_header_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("paper,value\nP,1\n", encoding="utf-8")
    with pytest.raises(UserError, match="the header must be"):
        load_targets(path)
    with pytest.raises(UserError, match="does not exist"):
        load_targets(tmp_path / "absent.csv")


def test_non_numeric_cells_keep_their_text() -> None:
    targets = load_targets(ROOT / "targets" / "fedntd.csv")
    failures = [t for t in targets.values() if t.text == "Failure"]
    assert failures and all(t.value is None and t.notes for t in failures)


def test_every_shipped_table_loads_with_a_number_for_every_cell() -> None:
    tables = load_all(ROOT)
    assert "fedgp-table1-mnist" in [t.name for t in tables]
    for table in tables:
        assert len(table.targets) == len(table.rows) * len(table.columns)
        assert all(t.value is not None for t in table.targets.values())


def test_fedgp_table1_mnist_maps_the_papers_cells() -> None:
    table = find_table("fedgp-table1-mnist", ROOT)
    rows = {r.label: r for r in table.rows}
    columns = {c.label: c for c in table.columns}
    der_gp = table.target(rows["DER w/ FedGP"], columns["permuted-MNIST domain-IL"])
    assert (der_gp.value, der_gp.pm) == (43.43, 0.9)
    assert rows["FedCurv w/ FedGP"].canonical == "fedavg+fedcurv+fedgp"
    assert table.runs("cpu") == 66 and table.runs("paper") == 110
    assert len(table.claims.pairs) == 5 and table.claims.upper_bound == "Ideal (upper bound)"


def test_fot_table_pmnist_maps_the_readmes_acc_and_fgt_cells(tmp_path: Path) -> None:
    table = find_table("fot-table-pmnist", ROOT)
    rows = {r.label: r for r in table.rows}
    columns = {c.label: c for c in table.columns}
    # README Table 1, PMNIST non-IID: FOT's FGT 1.97 ± 0.22 and FedAvg's ACC 80.06 ± 0.43
    fgt = table.target(rows["FOT"], columns["PMNIST non-IID FGT"])
    acc = table.target(rows["FL (FedAvg)"], columns["PMNIST non-IID ACC"])
    assert (fgt.value, fgt.pm, acc.value, acc.pm) == (1.97, 0.22, 80.06, 0.43)
    # the code's FGT is -BWT; the suite's Fgt_T reads the same cell a second way
    assert [c.metric for c in table.columns] == ["Acc_T", "-BWT", "Fgt_T"] * 2
    assert table.runs("smoke") == 4 and table.runs("cpu") == 12  # ACC and FGT: the same runs
    assert table.protocol["model"] == "fot-mlp" and table.protocol["participation"] == 0.512
    # without target_metric each (row, column) names both the ACC and the FGT cell
    damaged = damaged_fot_table(tmp_path, "    target_metric: FGT (%)\n", "")
    with pytest.raises(UserError, match="matches 2 printed cells of README Table 1, not one"):
        load_table(damaged, tmp_path)


def test_glfc_table1_maps_the_digitized_cells() -> None:
    table = find_table("glfc-table1-cifar100", ROOT)
    rows = {r.label: r for r in table.rows}
    (column,) = table.columns
    # read from the figure the README captions CIFAR-100, T = 10, after the 10th task
    glfc = table.target(rows["GLFC"], column)
    icarl = table.target(rows["iCaRL+FL"], column)
    assert (glfc.value, glfc.pm, icarl.value, icarl.pm) == (49.99, 0.11, 36.69, 0.5)
    assert glfc.n_seeds is None and "README" in glfc.notes
    assert table.runs("smoke") == 2 and table.runs("paper") == 6
    assert (table.protocol["arrivals"], table.protocol["clients"]) == ("glfc", 120)


def test_table7_reads_table1s_runs() -> None:
    seven, one = find_table("fedgp-table7-mnist", ROOT), find_table("fedgp-table1-mnist", ROOT)
    assert seven.runs_name == "fedgp-table1-mnist"
    assert seven.protocol == one.protocol and seven.scales == one.scales
    assert [c.metric for c in seven.columns] == ["Fgt_T", "Fgt_T_clipped"] * 2
    assert seven.runs("cpu") == one.runs("cpu") == 66  # two readings, the same runs


# Three tasks; task 1 ends at its best (85 after 80 and 70), task 2 drops from 90 to 60.
# The paper's formula (max over the earlier task ends): ((80 - 85) + (90 - 60)) / 2 = 12.5.
# The authors' code (the max also counts the final evaluation): ((85 - 85) + (90 - 60)) / 2
# = 15.0.
SMALL_MATRIX = [[80.0, 10.0, 10.0], [70.0, 90.0, 10.0], [85.0, 60.0, 95.0]]
BY_READING = {"paper's formula": 12.5, "authors' code": 15.0}


@pytest.mark.parametrize("name", ["fedgp-table7-mnist", "fedgp-table7-cifar"])
def test_table7_reports_both_forgetting_readings(name: str) -> None:
    """Every Table 7 cell is read twice from the same run: once by the paper's formula,
    once by the authors' code; each column names its reading, and each reads the value its
    rule gives on a hand-computed matrix (the run reader re-derives forgetting from the
    stored matrices, as it does for every run)."""
    from cfl_bench.core.run_reader import MATRICES, rederive_forgetting

    table = find_table(name, ROOT)
    row: dict[str, object] = dict.fromkeys(MATRICES, SMALL_MATRIX)
    rederive_forgetting(row)
    datasets: dict[tuple[str, str], list[str]] = {}
    for column in table.columns:
        reading = next(r for r in BY_READING if column.label.endswith(f", {r}"))
        assert column.reading.startswith(f"the {reading} (")
        assert row[column.metric] == pytest.approx(BY_READING[reading], abs=1e-12)
        datasets.setdefault((column.dataset, column.setting), []).append(reading)
    assert all(sorted(r) == sorted(BY_READING) for r in datasets.values())


def test_stream_defaults_are_the_fedgp_mnist_protocol() -> None:
    """Item 2 of the reproduction issue: a plain `--stream rot-mnist` run is the paper's
    protocol (T = 10 tasks, 20 rounds, 1 epoch, lr 0.01, the MNIST CNN, shards, K = 10,
    batch 32, buffer 200, all clients every round)."""
    protocol = find_table("fedgp-table1-mnist", ROOT).protocol
    defaults = RunConfig()
    for stream in ("rot-mnist", "perm-mnist"):
        info = STREAMS[stream]
        assert info.default_tasks == protocol["tasks"] == 10
        assert info.default_model == protocol["model"]
        assert info.default_partition == protocol["partition"]
        assert info.default_rounds_per_task == protocol["rounds_per_task"]
        assert info.default_epochs == protocol["epochs"]
        assert info.default_lr == protocol["lr"]
    for key in ("clients", "participation", "batch_size", "buffer_size"):
        assert getattr(defaults, key) == protocol[key], key


def test_sweep_documents_put_seeds_slowest_and_pass_the_place_options() -> None:
    table = find_table("fedgp-table1-mnist", ROOT)
    docs = sweep_documents(table, "cpu", Path("out"), {"data_root": "D", "device": "cuda"}, 2)
    assert [d["grid"]["stream"] for d in docs] == [["rot-mnist"], ["perm-mnist"]]
    grid, base = docs[0]["grid"], docs[0]["base"]
    assert list(grid) == ["seed", "stream", "strategy"] and grid["seed"] == [0, 1, 2]
    assert grid["strategy"] == [r.strategy for r in table.rows]
    assert base["rounds_per_task"] == 5 and base["train_size"] == 6000 and base["tasks"] == 10
    assert (base["data_root"], base["device"], docs[0]["jobs"]) == ("D", "cuda", 2)


def test_a_selection_runs_only_the_named_rows_columns_and_seeds() -> None:
    table = find_table("fedgp-table1-mnist", ROOT)
    request = Request(
        table.name,
        rows=("DER w/ FedGP", "FedAvg w/o FedGP"),
        columns=("rotated-MNIST domain-IL",),
        seeds=(2, 0),
    )
    chosen = select(table, "paper", request)
    (doc,) = sweep_documents(chosen, "paper", Path("out"), {}, 1)
    # The table's order, whatever the order on the command line.
    expected = {"seed": [0, 2], "stream": ["rot-mnist"], "strategy": ["fedavg", "der+fedgp"]}
    assert doc["grid"] == expected
    assert chosen.scales["cpu"].seeds == (0, 1, 2)  # other scales untouched
    assert select(table, "cpu", Request(table.name)) == table


@pytest.mark.parametrize(
    ("request_options", "fragment"),
    [
        ({"rows": ("DER",)}, r"--row 'DER' is not in fedgp-table1-mnist; choose from: FedAvg w/o"),
        ({"columns": ("rot",)}, r"--column 'rot' is not in .*rotated-MNIST domain-IL"),
        ({"seeds": (3,)}, r"--seed 3 is not a seed of fedgp-table1-mnist at scale cpu; .*0, 1, 2"),
    ],
)
def test_a_selection_naming_nothing_in_the_table_is_refused(
    request_options: dict[str, tuple[object, ...]], fragment: str
) -> None:
    table = find_table("fedgp-table1-mnist", ROOT)
    with pytest.raises(UserError, match=fragment):
        select(table, "cpu", Request(table.name, **request_options))  # type: ignore[arg-type]


def test_a_selection_is_refused_with_shipped_or_compare() -> None:
    from cfl_bench.reproduce.command import reproduce

    with pytest.raises(UserError, match="--row, --column and --seed choose which runs"):
        reproduce(Request("fedgp-table1-mnist", shipped=True, seeds=(0,)), root=ROOT)


def copy_root(tmp_path: Path) -> Path:
    root = tmp_path / "reproductions"
    shutil.copytree(ROOT / "targets", root / "targets")
    (root / "tables").mkdir()
    shutil.copy(ROOT / "tables" / "fedgp-table1-mnist.yaml", root / "tables")
    return root


def edited_table(tmp_path: Path, old: str, new: str) -> Path:
    root = copy_root(tmp_path)
    path = root / "tables" / "fedgp-table1-mnist.yaml"
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return path


ROT_OPTIONS = "    options: {stream: rot-mnist}"
CPU_SEEDS = "    seeds: [0, 1, 2]\n"


@pytest.mark.parametrize(
    ("old", "new", "fragment"),
    [
        ("metric: Acc_T", "metric: Acc_T\nnonsense: 1", "unknown key"),
        (
            "variant: w/ FedGP, strategy: der+fedgp",
            "variant: w/ FedGQ, strategy: der+fedgp",
            "matches 0 printed cells",
        ),
        ("strategy: der+fedgp}", "strategy: der+nosuch}", "unknown strategy component"),
        ("  lr: 0.01\n", "  lr: 0.01\n  seed: 3\n", "fixes 'seed'"),
        ("  lr: 0.01\n", "  lr: 0.01\n  speed: 3\n", "not a run option"),
        ("    seeds: [0, 1, 2]\n", "    seeds: []\n", "needs seeds"),
        ("upper_bound: Ideal (upper bound)", "upper_bound: Oracle", "is not a row"),
        ("[DER w/o FedGP, DER w/ FedGP]", "[DER w/o FedGP, DER]", "must name two rows"),
        ("train_per_task: 60000", "train_per_task: 0", "train_per_task"),
        ("{stream: rot-mnist}", "{stream: rot-mnist, lr: 0.1}", "sets lr, which the protocol"),
        (CPU_SEEDS, f"{CPU_SEEDS}    measured_s: 0\n", "measured_s must"),
        (CPU_SEEDS, f"{CPU_SEEDS}    measured_s: true\n", "measured_s must"),
        (CPU_SEEDS, f"{CPU_SEEDS}    measured_s: .inf\n", "measured_s must"),
        (ROT_OPTIONS, f"    round_fraction: 0\n{ROT_OPTIONS}", "round_fraction must be"),
        (ROT_OPTIONS, f"    round_fraction: half\n{ROT_OPTIONS}", "round_fraction must be"),
        (ROT_OPTIONS, f"    round_fraction: 1.5\n{ROT_OPTIONS}", "round_fraction must be"),
    ],
)
def test_damaged_tables_are_refused(tmp_path: Path, old: str, new: str, fragment: str) -> None:
    path = edited_table(tmp_path, old, new)
    with pytest.raises(UserError, match=fragment):
        load_table(path, path.parent.parent)


def test_a_runs_of_table_may_not_set_its_own_protocol(tmp_path: Path) -> None:
    root = copy_root(tmp_path)
    seven = (ROOT / "tables" / "fedgp-table7-mnist.yaml").read_text(encoding="utf-8")
    path = root / "tables" / "fedgp-table7-mnist.yaml"
    path.write_text(seven + "train_per_task: 5\n", encoding="utf-8")
    with pytest.raises(UserError, match="takes train_per_task from it"):
        load_table(path, root)
    path.write_text(seven.replace("strategy: der+fedgp}", "strategy: derpp+fedgp}"), "utf-8")
    with pytest.raises(UserError, match="is not run by fedgp-table1-mnist"):
        load_table(path, root)


def test_an_unknown_table_names_the_known_ones() -> None:
    with pytest.raises(UserError, match=r"choose one of .*fedgp-table1-mnist"):
        find_table("fedgp-table99", ROOT)


SMOKE_LIMIT_S = 120  # issue 41: a smoke scale checks the pipeline in at most 2 minutes


def test_every_smoke_scale_is_measured_within_two_minutes() -> None:
    """Each table's and figure's smoke scale carries its measured wall time
    (``measured_s``, docs/reproductions.md says where and when), at most 2 minutes, and
    that measurement is what ``reproduce list`` shows, not an estimate from the cpu scale
    (which leaves out the fixed costs per run: '~6 s' for a smoke that took a minute)."""
    from cfl_bench.reproduce.figure_command import figure_cost_text
    from cfl_bench.reproduce.figures import load_all_figures
    from cfl_bench.reproduce.provenance import _hours, cost_text

    for table in load_all(ROOT):
        seconds = table.scales["smoke"].measured_s
        assert seconds is not None and seconds <= SMOKE_LIMIT_S, table.name
        assert cost_text(table, "smoke", ROOT) == f"{_hours(seconds)} measured (jobs 1)"
    for figure in load_all_figures(ROOT):
        seconds = figure.scales["smoke"].measured_s
        assert seconds is not None and seconds <= SMOKE_LIMIT_S, figure.name
        assert figure_cost_text(figure, "smoke", ROOT) == f"{_hours(seconds)} measured (jobs 1)"


def test_shipped_results_of_a_whole_scale_outrank_the_table_files_measurement(
    tmp_path: Path,
) -> None:
    """A scale whose every run is shipped is measured by its provenance (the sweep's
    elapsed time, jobs as run); ``measured_s`` is for the scales nobody ships."""
    from cfl_bench.reproduce.provenance import _hours, cost_text

    root = copy_root(tmp_path)
    table = find_table("fedgp-table1-mnist", root)
    measured = table.scales["smoke"].measured_s
    assert measured is not None
    assert cost_text(table, "smoke", root) == f"{_hours(measured)} measured (jobs 1)"
    folder = root / "results" / "fedgp-table1-mnist" / "smoke"
    folder.mkdir(parents=True)
    facts = {"runs": 22, "expected_runs": 22, "elapsed_s": 75.0, "jobs": 2}
    (folder / "provenance.json").write_text(json.dumps(facts), encoding="utf-8")
    assert cost_text(table, "smoke", root) == "75 s measured (jobs 2)"
    facts["runs"] = 11  # half shipped: the table file's whole-scale measurement again
    (folder / "provenance.json").write_text(json.dumps(facts), encoding="utf-8")
    assert cost_text(table, "smoke", root).endswith("measured (jobs 1)")


def test_the_list_command_shows_every_table_and_scale() -> None:
    from tests.test_cli import in_process

    code, output = in_process("reproduce", "list")
    assert code == 0, output
    for name in ("fedgp-table1-mnist", "fedgp-table7-mnist", "smoke", "cpu", "paper"):
        assert name in output
    assert "66 (3 seeds)" in output


def test_the_command_refuses_an_unknown_table_in_one_line() -> None:
    from tests.test_cli import in_process

    code, output = in_process("reproduce", "fedgp-table99", "--scale", "cpu")
    assert code == 2
    assert "no reproducible table 'fedgp-table99'" in " ".join(output.split())
    assert "Traceback" not in output


def test_ifa_table2_reads_three_rounds_of_one_run() -> None:
    """Gen. 1, 3 and 10 of 10 generations are rounds 1/10, 3/10 and 10/10 of the same runs
    (one sweep), and every IFA row splits the run into 10 generations at any scale."""
    table = find_table("ifa-table2-cifar10", ROOT)
    assert [c.round_fraction for c in table.columns] == [0.1, 0.3, 1.0]
    assert table.column_groups() == [{}]
    assert table.runs("cpu") == 9
    assert table.base_options("cpu")["eval_every_round"] is True
    assert [r.strategy for r in table.rows][1:] == [
        "fedavg+ifa:mode=random,generations=10",
        "fedavg+ifa:mode=later,later_unit=layers,generations=10",
    ]


CPU_OPTIONS = "    options: {rounds_per_task: 5, train_size: 6000, test_size: 1000}\n"


def cheaper_der_at_cpu(tmp_path: Path, strategies: str) -> Path:
    """The FedGP MNIST table with a cpu scale that runs some rows with other options."""
    return edited_table(tmp_path, CPU_OPTIONS, CPU_OPTIONS + f"    strategies: {strategies}\n")


def test_a_scale_runs_and_reads_a_row_with_its_own_options(tmp_path: Path) -> None:
    from cfl_bench.reproduce.collect import _place

    path = cheaper_der_at_cpu(tmp_path, '{"DER w/ FedGP": "der:alpha=0.5+fedgp"}')
    table = load_table(path, path.parent.parent)
    (cpu_doc, _) = sweep_documents(table, "cpu", Path("out"), {}, 1)
    (paper_doc, _) = sweep_documents(table, "paper", Path("out"), {}, 1)
    assert "der:alpha=0.5+fedgp" in cpu_doc["grid"]["strategy"]
    assert "der+fedgp" not in cpu_doc["grid"]["strategy"]
    assert paper_doc["grid"]["strategy"] == [r.strategy for r in table.rows]
    cpu = {**table.base_options("cpu"), "stream": "rot-mnist"}
    paper = {**table.base_options("paper"), "stream": "rot-mnist"}
    places, scale, _ = _place(table, cpu, "der:alpha=0.5+fedgp")
    assert scale == "cpu" and {(r.label, c.label) for r, c in places} == {
        ("DER w/ FedGP", "rotated-MNIST domain-IL")
    }
    # The row's own strategy is not that row's cell at cpu scale; it is at paper scale.
    assert _place(table, cpu, "der+fedgp")[0] == []
    assert "no cell of the table" in _place(table, cpu, "der+fedgp")[2]
    assert _place(table, paper, "der+fedgp")[1] == "paper"
    assert _place(table, paper, "der:alpha=0.5+fedgp")[0] == []
    assert "is no row" in _place(table, cpu, "derpp")[2]


@pytest.mark.parametrize(
    ("strategies", "fragment"),
    [
        ('{"DER": "der:alpha=0.5+fedgp"}', "strategies names 'DER', which is no row"),
        ('{"DER w/ FedGP": "derpp+fedgp"}', "whose methods are not the row's"),
        ('{"DER w/ FedGP": "fedgp+der"}', "whose methods are not the row's"),
        ('{"DER w/ FedGP": "der:nosuch=1+fedgp"}', "nosuch"),
        ('{"DER w/ FedGP": ""}', "must be non-empty text"),
        ("[der]", "strategies must be a mapping"),
    ],
)
def test_a_scale_changing_a_rows_methods_is_refused(
    tmp_path: Path, strategies: str, fragment: str
) -> None:
    path = cheaper_der_at_cpu(tmp_path, strategies)
    with pytest.raises(UserError, match=fragment):
        load_table(path, path.parent.parent)


def test_a_misspelt_scale_key_is_refused(tmp_path: Path) -> None:
    path = edited_table(tmp_path, CPU_OPTIONS, CPU_OPTIONS + "    strategy: {}\n")
    with pytest.raises(UserError, match=r"scale cpu has unknown key\(s\) strategy"):
        load_table(path, path.parent.parent)


def test_a_column_metric_with_a_minus_reads_the_metric_negated() -> None:
    """FOT's FGT is the code's mean of a[i][i] - a[T][i], i.e. -BWT: a "-BWT" column turns a
    run's BWT of -1.25 into 1.25, and a run without BWT stays missing (None), never 0."""
    from cfl_bench.core.run_reader import RunReading
    from cfl_bench.reproduce.collect import column_value

    table = find_table("fot-table-pmnist", ROOT)
    code_fgt = next(c for c in table.columns if c.label == "PMNIST IID FGT")
    chaudhry = next(c for c in table.columns if c.label == "PMNIST IID FGT, Chaudhry")
    reading = RunReading(Path("r"), "finished", "", {}, {}, row={"BWT": -1.25, "Fgt_T": 2.5})
    assert column_value(code_fgt, reading) == (1.25, "-BWT")
    assert column_value(chaudhry, reading) == (2.5, "Fgt_T")
    empty = RunReading(Path("r"), "finished", "", {}, {}, row={"BWT": None})
    assert column_value(code_fgt, empty) == (None, "-BWT")


def damaged_fot_table(tmp_path: Path, old: str, new: str) -> Path:
    """A copy of the FOT table under ``tmp_path`` (with its targets) whose first ``old``
    reads ``new``."""
    source = (ROOT / "tables" / "fot-table-pmnist.yaml").read_text(encoding="utf-8")
    (tmp_path / "tables").mkdir()
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "fot.csv").write_bytes((ROOT / "targets" / "fot.csv").read_bytes())
    damaged = tmp_path / "tables" / "fot-table-pmnist.yaml"
    damaged.write_text(source.replace(old, new, 1), encoding="utf-8")
    return damaged


def test_a_column_naming_no_leaderboard_metric_is_refused(tmp_path: Path) -> None:
    damaged = damaged_fot_table(tmp_path, "metric: -BWT", "metric: -BTW")
    with pytest.raises(UserError, match="metric '-BTW' is not a leaderboard metric; use one of"):
        load_table(damaged, tmp_path)


def test_a_scale_leaving_an_option_to_the_stream_matches_the_runs_resolved_value() -> None:
    """GLFC's smoke scale sets a partition, so partition is compared at every scale; its
    cpu scale leaves it to the default, which a run under --arrivals records as
    ``class-subsets``. Such a run is a cpu cell; a run with another partition is none."""
    from cfl_bench.reproduce.collect import scale_of

    table = find_table("glfc-table1-cifar100", ROOT)
    (column,) = table.columns
    assert "partition" in table.compared_keys()
    assert table.base_options("cpu").get("partition") is None
    recorded = {**table.base_options("cpu"), "partition": "class-subsets"}
    recorded.update(model="cifar-cnn", tasks=10, lr=2.0, epochs=1, optimizer="sgd")
    assert scale_of(table, recorded, column) == "cpu"
    assert scale_of(table, {**recorded, "partition": "dirichlet"}, column) is None
    assert scale_of(table, {**recorded, "epochs": 2}, column) is None
