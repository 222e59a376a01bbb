"""Start-up stays fast: --help, the listings and every refusal decided from names and
numbers answer without importing torch or the other heavy packages.

Why ``sys.modules`` in a fresh interpreter rather than a stopwatch: timings on a shared
machine are noise, while whether torch (2-3 s to import) or scikit-learn (~2 s) was
imported is exact. Also here: the torch-free catalogues (streams, models) agree with the
modules that build what they describe.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# Packages that take seconds to import (or pull in those that do).
HEAVY = ("torch", "sklearn", "scipy", "pandas", "matplotlib", "transformers", "avalanche")

# Runs the CLI in-process like the console script, then reports the heavy modules loaded.
PROBE = """
import sys
from cfl_bench.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
else:
    code = 0
heavy = [m for m in {heavy!r} if m in sys.modules]
print("HEAVY=" + ",".join(heavy), "CODE=" + str(code), file=sys.stderr)
"""


def probe(*args: str) -> tuple[list[str], int, str]:
    """(heavy modules imported, exit code, output) of ``cfl-bench ARGS`` in a new process."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    last = result.stderr.strip().splitlines()[-1]
    heavy_part, code_part = last.split(" ")
    heavy = [m for m in heavy_part.removeprefix("HEAVY=").split(",") if m]
    output = " ".join((result.stdout + result.stderr).split())
    return heavy, int(code_part.removeprefix("CODE=")), output


def test_importing_the_cli_imports_no_heavy_package() -> None:
    code = f"import sys, cfl_bench.cli; print([m for m in {HEAVY!r} if m in sys.modules])"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["run", "--help"],
        ["list", "streams"],
        ["list", "strategies"],
        ["list", "models"],
        ["list", "partitions"],
    ],
)
def test_help_and_listings_import_no_heavy_package(args: list[str]) -> None:
    heavy, code, output = probe(*args)
    assert code == 0, output
    assert heavy == [], f"`cfl-bench {' '.join(args)}` imported {heavy}"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--stream", "rot-digit"], "unknown stream 'rot-digit' (did you mean 'rot-digits'?)"),
        (["--model", "resnet180"], "unknown model 'resnet180' (did you mean 'resnet18'?)"),
        (["--strategy", "derr"], "unknown strategy component 'derr'"),
        (["--strategy", "der:alpha=inf"], "option der:alpha must be a finite number ≥ 0"),
        (["--strategy", "der+agem"], "two local learners"),
        (["--clients", "0"], "--clients must be an integer in [1, 100000], got 0."),
        (["--lr", "nan"], "--lr must be"),
        (["--stream", "rot-mnist"], "stream 'rot-mnist' needs its data: pass --data-root"),
        (["--partition", "dirichlt"], "unknown partition 'dirichlt' (did you mean 'dirichlet'?)"),
        (["--partition", "dirichlet:alpha=1,alpha=2"], "is given twice"),
    ],
)
def test_refusals_from_names_and_numbers_import_no_heavy_package(
    args: list[str], fragment: str, tmp_path: Path
) -> None:
    heavy, code, output = probe("run", *args, "--out", str(tmp_path / "r"))
    assert code == 2, output
    assert fragment in output
    assert heavy == [], f"refusing {args} imported {heavy}"
    assert not (tmp_path / "r").exists()


def test_an_out_that_is_not_a_run_is_refused_without_heavy_packages(tmp_path: Path) -> None:
    """A folder that is not a run, and a folder inside a run: refused before torch loads
    (the claim of the run directory checks both again, after the data)."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "records.csv").write_text("epoch,loss\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"config_hash": "abc"}')
    for out, fragment in (
        (mine, f"--out '{mine}' is not a cfl-bench run directory"),
        (run / "sub", f"is inside the cfl-bench run directory '{run}'"),
    ):
        heavy, code, output = probe("run", "--out", str(out))
        assert code == 2, output
        assert fragment in output
        assert heavy == [], f"refusing --out {out} imported {heavy}"
    assert sorted(p.name for p in tmp_path.rglob("*")) == [
        "config.json",
        "mine",
        "records.csv",
        "run",
    ]


def test_bad_yaml_file_is_refused_without_heavy_packages(tmp_path: Path) -> None:
    config = tmp_path / "exp.yaml"
    config.write_text("stream: [rot-digits\n", encoding="utf-8")
    heavy, code, output = probe("run", "--config", str(config))
    assert code == 2, output
    assert "is not valid YAML" in output
    assert heavy == []


# -- the catalogues agree with what they describe ---------------------------------------------
def test_model_catalogue_lists_exactly_the_builders() -> None:
    from cfl_bench.runner import models
    from cfl_bench.runner.model_catalogue import MODEL_DESCRIPTIONS

    assert list(models.MODELS) == list(MODEL_DESCRIPTIONS)
    assert set(models._BUILDERS) == set(MODEL_DESCRIPTIONS)
    for name, info in models.MODELS.items():
        assert info.name == name and info.description == MODEL_DESCRIPTIONS[name]


def test_stream_catalogue_says_what_the_loaders_read() -> None:
    """The data hints of `list streams` are the loaders' own wording, and the registry
    re-exports the catalogue rather than keeping a second one."""
    from cfl_bench.streams import avalanche, catalogue, cifar, mnist, registry

    loaders_say = {
        "MNIST": mnist.layout_hint("MNIST"),
        "seq-cifar10": cifar.layout_hint("cifar10"),
        "seq-cifar100": cifar.layout_hint("cifar100"),
    }
    assert loaders_say == {"MNIST": catalogue.MNIST_HOLDS, **catalogue.CIFAR_HOLDS}
    assert catalogue.AVALANCHE_FORM == avalanche.SPEC_FORM
    assert catalogue.AVALANCHE_PREFIX == avalanche.AVALANCHE_PREFIX
    assert registry.STREAMS is catalogue.STREAMS
    assert registry.stream_info is catalogue.stream_info
    for info in catalogue.STREAMS.values():
        assert bool(info.data) == info.needs_data_root, info.name


def test_every_stream_entry_names_a_builder() -> None:
    """A catalogue entry carries its builder: the name resolves to a function of
    ``streams.builders`` (the Avalanche form too), or of ``carla_bridge.stream`` for the
    CARLA streams (the bridge implements the stream interface; streams never import it)."""
    import importlib

    from cfl_bench.streams import catalogue, registry

    spec = "avalanche:avalanche.benchmarks.classic:SplitMNIST"
    for info in [*catalogue.STREAMS.values(), catalogue.stream_info(spec)]:
        module, _, function = info.builder.partition(":")
        carla = info.name.startswith("carla-")
        assert module == (
            "cfl_bench.carla_bridge.stream" if carla else "cfl_bench.streams.builders"
        ), info.name
        found = getattr(importlib.import_module(module), function)
        assert registry.builder_of(info) is found, info.name
    class_il = [i for i in catalogue.STREAMS.values() if i.builder.endswith(":build_class_il")]
    assert all(i.classes_per_task > 0 and i.base for i in class_il)
