"""Components written outside the package (``strategies.plugins``): named by import path or
by an installed entry point, run like built-in ones, and refused in one line when they
cannot work.

The plugin modules are written by the tests into a temporary folder, as a user writes them;
an "installed" plugin is a real distribution's metadata (a ``.dist-info`` folder with an
``entry_points.txt``) on ``sys.path``, which ``importlib.metadata`` finds as it finds any.
"""

from __future__ import annotations

import io
import json
import sys
import textwrap
from pathlib import Path

import pytest
from rich.console import Console

from cfl_bench.api import RunOutcome, run
from cfl_bench.core.errors import UserError
from cfl_bench.strategies.compose import build_strategy, validate_strategy
from cfl_bench.strategies.registry import describe_components
from tests.cli_helpers import cli

METHODS = '''
from dataclasses import dataclass

from cfl_bench.plugin import Component, Declaration, Learner, ReplayPlan, ReplayTerm, Role
from cfl_bench.plugin import option, positive_float
from cfl_bench.strategies.er import ER
from cfl_bench.strategies.fedcurv import FedCurv


@dataclass(frozen=True)
class WeightedOptions:
    weight: float = option(1.0, "weight of the replay term", positive_float)


class WeightedER(Learner):
    """ER whose replay term has a weight."""

    declaration = Declaration(
        name="weighted_er", summary="ER, weighted", roles=frozenset({Role.LEARNER}),
        options=WeightedOptions,
    )
    needs_buffer = True

    def replay_plan(self) -> ReplayPlan:
        return ReplayPlan(1, (ReplayTerm(0, "ce", self.opts.weight),))


class SameER(ER):
    """ER, unchanged."""


class SameFedCurv(FedCurv):
    """FedCurv, unchanged (its Fisher draws use its parent's random stream)."""


class NoDeclaration(Component):
    pass


class LearnerWithoutRole(Learner):
    declaration = Declaration(name="odd", roles=frozenset())


def not_a_class():
    return 1
'''

TINY = {
    "stream": "rot-digits",
    "tasks": 2,
    "rounds_per_task": 2,
    "clients": 3,
    "participation": 1.0,
    "train_size": 240,
    "test_size": 90,
    "buffer_size": 30,
    "threads": 1,
}


@pytest.fixture
def methods(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``my_methods.py`` in a folder on ``sys.path`` (removed from ``sys.modules`` after)."""
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "my_methods.py").write_text(textwrap.dedent(METHODS), encoding="utf-8")
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    sys.modules.pop("my_methods", None)


def tiny_run(strategy: str, out: Path, **extra: object) -> RunOutcome:
    return run(strategy=strategy, out=str(out), progress=False, **{**TINY, **extra})


def same_records(a: RunOutcome, b: RunOutcome) -> None:
    """Identical records.csv but for the columns naming the strategy."""
    left, right = a.records, b.records
    named = [c for c in left.columns if "strategy" in c]
    assert list(left.columns) == list(right.columns)
    assert left.drop(columns=named).equals(right.drop(columns=named))


def test_an_import_path_names_a_component_and_its_options(methods: Path) -> None:
    spec = validate_strategy("my_methods.WeightedER:weight=0.5+fedgp")
    assert spec.learner.name == "my_methods.WeightedER"
    assert spec.learner.options == {"weight": 0.5}
    assert spec.name == "my_methods.WeightedER:weight=0.5+fedgp"
    strategy = build_strategy(spec.name)  # the canonical name parses back
    assert strategy.name == spec.name
    assert strategy.learner.opts.weight == 0.5  # type: ignore[attr-defined]
    assert strategy.learner.random_stream == "weighted_er"
    with pytest.raises(UserError, match=r"unknown option 'wieght' for 'my_methods\.WeightedER'"):
        validate_strategy("my_methods.WeightedER:wieght=2")


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_a_subclass_of_a_built_in_gives_its_records(
    methods: Path, tmp_path: Path, executor: str
) -> None:
    built_in = tiny_run("er+fedcurv", tmp_path / "a", executor=executor)
    plugin = tiny_run("my_methods.SameER+my_methods.SameFedCurv", tmp_path / "b", executor=executor)
    assert plugin.summary["strategy"] == "my_methods.SameER+my_methods.SameFedCurv"
    same_records(built_in, plugin)


def test_a_weighted_replay_changes_the_run_and_weight_one_is_er(
    methods: Path, tmp_path: Path
) -> None:
    er = tiny_run("er", tmp_path / "er")
    one = tiny_run("my_methods.WeightedER:weight=1", tmp_path / "one")
    five = tiny_run("my_methods.WeightedER:weight=5", tmp_path / "five")
    same_records(er, one)
    assert not er.records["value"].equals(five.records["value"])


@pytest.mark.parametrize(
    ("strategy", "message"),
    [
        (
            "no_such_module.Method",
            "cannot import module 'no_such_module' for strategy component "
            "'no_such_module.Method'; install its package, or run from the folder that holds "
            "no_such_module.py.",
        ),
        ("my_methods.Missing", "module 'my_methods' has no 'Missing'; check the name in"),
        ("my_methods.not_a_class", "'my_methods.not_a_class' is a function, not a cfl-bench"),
        ("my_methods.NoDeclaration", "'my_methods.NoDeclaration' has no declaration"),
        (
            "my_methods.LearnerWithoutRole",
            "'my_methods.LearnerWithoutRole' is a Learner subclass but its declaration lacks "
            "Role.LEARNER",
        ),
        ("my_methods.SameER+er", "two local learners (my_methods.SameER and er)"),
        (
            "fedcurv+my_methods.SameFedCurv",
            "'fedcurv' and 'my_methods.SameFedCurv' in strategy 'fedcurv+my_methods.SameFedCurv' "
            "both send payload 'fedcurv.U'",
        ),
        ("my_methods.", "is neither a component name nor an import path"),
    ],
)
def test_what_cannot_work_is_refused_in_one_line(
    methods: Path, strategy: str, message: str
) -> None:
    with pytest.raises(UserError) as caught:
        validate_strategy(strategy)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_command_line_refuses_in_one_line_with_exit_2(methods: Path, tmp_path: Path) -> None:
    done = cli(["run", "--strategy", "my_methods.NotThere", "--out", "r"], cwd=methods)
    assert done.returncode == 2, done.stderr
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert lines == [
        "error: module 'my_methods' has no 'NotThere'; check the name in 'my_methods.NotThere'."
    ]
    assert not (methods / "r").exists()


def test_the_command_line_finds_a_method_in_the_current_folder(methods: Path) -> None:
    args = ["run", "--strategy", "my_methods.WeightedER:weight=2", "--out", "r"]
    args += [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
    done = cli(args, cwd=methods, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "run folder: r" in done.stdout
    summary = json.loads((methods / "r/summary.json").read_text(encoding="utf-8"))
    assert summary["strategy"] == "my_methods.WeightedER:weight=2.0"


def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entry_points: str) -> None:
    """A distribution's metadata on ``sys.path``: what `pip install` leaves for a package
    declaring ``entry_points`` in the group ``cfl_bench.components``."""
    info = tmp_path / "site" / "my_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[cfl_bench.components]\n{entry_points}\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))


def test_an_entry_point_gives_a_short_name_that_runs_and_is_listed(
    methods: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed(tmp_path, monkeypatch, "my_er = my_methods:WeightedER")
    strategy = build_strategy("my_er:weight=2+fedgp")
    assert strategy.name == "my_er:weight=2.0+fedgp"
    assert type(strategy.learner).__mro__[1].__name__ == "WeightedER"
    rows = {row["name"]: row for row in describe_components()}
    assert rows["my_er"]["summary"] == "ER, weighted" and rows["my_er"]["roles"] == ["learner"]
    one = tiny_run("my_er:weight=1", tmp_path / "ep")
    same_records(tiny_run("er", tmp_path / "er"), one)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("der = my_methods:SameER", "clashes with the built-in component 'der'; rename"),
        ("My-ER = my_methods:SameER", "has a name --strategy cannot write"),
        ("broken = my_methods:Missing", "loading the entry point 'broken = my_methods:Missing'"),
    ],
)
def test_a_bad_entry_point_is_refused_in_one_line(
    methods: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    entry: str,
    message: str,
) -> None:
    installed(tmp_path, monkeypatch, entry)
    name = entry.split(" = ")[0].lower()
    with pytest.raises(UserError) as caught:
        validate_strategy(f"{name}+fedgp" if name != "der" else "fedavg")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_plugin_run_resumes_from_its_checkpoint(methods: Path, tmp_path: Path) -> None:
    # Interrupted after round 2 (its checkpoint written), then resumed by the same call: the
    # records are those of the built-in composition run without interruption, so the
    # plugin's server and client state (FedCurv's sums, its per-client Fisher draws) went
    # through the checkpoint under the plugin's name.
    from cfl_bench.core.errors import RunInterruptedError
    from cfl_bench.engine.progress import RoundReport
    from cfl_bench.runner.config import make_config
    from cfl_bench.runner.run import execute

    def stop_after_round_2(report: RoundReport) -> None:
        if report.round_index == 2:
            raise KeyboardInterrupt

    plugin = "my_methods.SameER+my_methods.SameFedCurv"
    values = {**TINY, "strategy": plugin, "checkpoint_every": 1, "out": str(tmp_path / "p")}
    with pytest.raises(RunInterruptedError, match="kept rounds 1-2"):
        execute(make_config(values), stop_after_round_2)
    said = io.StringIO()
    resumed = run(
        strategy=plugin,
        out=str(tmp_path / "p"),
        progress=False,
        console=Console(file=said),
        **{**TINY, "checkpoint_every": 1},
    )
    assert "resuming after round 2 of 4 (next: round 3)" in said.getvalue()
    same_records(tiny_run("er+fedcurv", tmp_path / "b", checkpoint_every=1), resumed)
