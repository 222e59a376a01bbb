"""The protocol files under docs/protocols are runnable as written: every grid point
validates and plans (strategy set-up, public data, schedule, every client split) on the
shared data, with nothing trained. A renamed option, a refused composition or a component
that is not registered fails here, not an hour into someone's sweep."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cfl_bench.runner.config import RunConfig
from cfl_bench.runner.run import plan_run
from cfl_bench.sweeps.grid import build_spec, expand

PROTOCOLS = sorted((Path(__file__).parent.parent / "docs" / "protocols").glob("*.yaml"))


def test_the_papers_protocol_files_exist() -> None:
    names = {p.stem for p in PROTOCOLS}
    assert {"fedntd-cifar10", "fedproj-cifar10", "static-cifar10-cpu"} <= names


@pytest.mark.parametrize("path", PROTOCOLS, ids=lambda p: p.stem)
def test_every_point_of_a_protocol_file_plans(
    path: Path, shared_data: Path, tmp_path: Path
) -> None:
    spec = build_spec(str(path), [], out=str(tmp_path / "sweep"))
    points = expand(spec)
    assert points, f"{path.name} has no grid points"
    seeds = {p.request["seed"] for p in points}
    for point in points:
        if point.request["seed"] != min(seeds):  # seeds change nothing a plan checks
            continue
        config = dataclasses.replace(
            RunConfig(**point.request),
            data_root=str(shared_data),
            device="cpu",
            out=str(tmp_path / point.name),
        )
        plan = plan_run(config)
        assert plan.stream.name == point.request["stream"]
        assert plan.schedule.rounds_per_task == point.request["rounds_per_task"]
        assert not Path(config.out).exists()  # planning writes nothing
