"""The ``--partition name:key=value,...`` grammar: legal specs keep their protocol description,
every bad spec is one clear sentence, and the CLI refuses before it writes anything."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from cfl_bench.core.errors import UserError
from cfl_bench.streams.partition import (
    _PARTITIONER_TYPES,
    OPTION_PARSERS,
    DirichletPartitioner,
    ShardPartitioner,
    build_partitioner,
    partitioner_from_spec,
)

_SHARDS_REMAINDER = "dropped from the end of the label-sorted order"
_BALANCE = "N/K cap while drawing"

# describe() enters the protocol hash, so these are the exact values the parser gave at
# a501b3f (computed by importing that commit's streams/partition.py); they must never drift.
HEAD_DESCRIBE: dict[str, dict[str, object]] = {
    "shards": {
        "name": "shards",
        "shards_per_client": 2,
        "remainder": _SHARDS_REMAINDER,
        "per_task": False,
    },
    "dirichlet": {
        "name": "dirichlet",
        "alpha": 0.3,
        "min_size": 10,
        "balance": _BALANCE,
        "per_task": True,
    },
    "iid": {"name": "iid", "per_task": False},
    "dirichlet:alpha=1,min_size=5": {
        "name": "dirichlet",
        "alpha": 1.0,
        "min_size": 5,
        "balance": _BALANCE,
        "per_task": True,
    },
    "shards:shards_per_client=3": {
        "name": "shards",
        "shards_per_client": 3,
        "remainder": _SHARDS_REMAINDER,
        "per_task": False,
    },
}


@pytest.mark.parametrize("spec", sorted(HEAD_DESCRIBE))
def test_default_specs_keep_their_protocol_description(spec: str) -> None:
    described = partitioner_from_spec(spec).describe()
    assert described == HEAD_DESCRIBE[spec]
    # Same types too: 1 and 1.0 hash the same in Python but not in canonical JSON.
    assert [type(v) for v in described.values()] == [type(v) for v in HEAD_DESCRIBE[spec].values()]


def _dirichlet(alpha: float = 0.3, min_size: int = 10) -> dict[str, object]:
    return {**HEAD_DESCRIBE["dirichlet"], "alpha": alpha, "min_size": min_size}


def _shards(per_client: int) -> dict[str, object]:
    return {**HEAD_DESCRIBE["shards"], "shards_per_client": per_client}


# Spellings legal before the strict grammar that stay legal, with the description they gave.
LEGAL: list[tuple[str, dict[str, object]]] = [
    (" shards : shards_per_client=3 ", _shards(3)),
    ("dirichlet : alpha = 2 , min_size = 3", _dirichlet(2.0, 3)),
    ("\tdirichlet:alpha=1\n", _dirichlet(1.0)),
    (" iid ", HEAD_DESCRIBE["iid"]),
    ("dirichlet:alpha=.5", _dirichlet(0.5)),
    ("dirichlet:alpha=5.", _dirichlet(5.0)),
    ("dirichlet:alpha=+0.25", _dirichlet(0.25)),
    ("dirichlet:alpha=1E-1", _dirichlet(0.1)),
    ("dirichlet:alpha=3e+0", _dirichlet(3.0)),
    ("dirichlet:alpha=010", _dirichlet(10.0)),
    ("dirichlet:alpha=1e300", _dirichlet(1e300)),
    ("dirichlet:min_size=0", _dirichlet(min_size=0)),
    ("dirichlet:min_size=-0", _dirichlet(min_size=0)),
    ("dirichlet:min_size=+007", _dirichlet(min_size=7)),
    ("dirichlet:min_size=5,alpha=1", _dirichlet(1.0, 5)),
    ("dirichlet:max_redraws=5", _dirichlet()),
    ("shards:shards_per_client=+1", _shards(1)),
]


@pytest.mark.parametrize(("spec", "described"), LEGAL)
def test_legal_specs_parse_as_before(spec: str, described: dict[str, object]) -> None:
    assert partitioner_from_spec(spec).describe() == described


def test_max_redraws_still_reaches_the_partitioner() -> None:
    part = partitioner_from_spec("dirichlet:max_redraws=5")
    assert isinstance(part, DirichletPartitioner) and part.max_redraws == 5


# Each bad spec and a phrase its one-line refusal must contain.
BAD: list[tuple[str, str]] = [
    # the reported cases
    (
        "dirichlet:alpha=1,alpha=2",
        "option 'alpha' of partition 'dirichlet' is given twice; give it once.",
    ),
    (
        "dirichlet:min_size=1,min_size=1",
        "option 'min_size' of partition 'dirichlet' is given twice",
    ),
    (
        "shards:shards_per_client=2,shards_per_client=3",
        "'shards_per_client' of partition 'shards' is given twice",
    ),
    ("iid:foo=1", "partition 'iid' takes no options; drop ':foo=1' after it."),
    ("iid:", "partition 'iid' takes no options; drop ':' after it."),
    # numbers: plain ASCII decimals, finite, integers without a fraction or exponent
    ("dirichlet:alpha=inf", "option dirichlet:alpha must be a finite number > 0, got 'inf'."),
    ("dirichlet:alpha=-inf", "must be a finite number > 0, got '-inf'"),
    ("dirichlet:alpha=nan", "must be a finite number > 0, got 'nan'"),
    ("dirichlet:alpha=infinity", "must be a finite number > 0, got 'infinity'"),
    ("dirichlet:alpha=1e400", "must be a finite number > 0 (at most about 1.8e308 in size)"),
    ("dirichlet:alpha=1" + "0" * 400, "must be a finite number > 0 (at most about 1.8e308"),
    ("dirichlet:alpha=1e-400", "does not round to 0 as a float"),
    ("dirichlet:alpha=1_0", "must be a finite number > 0, got '1_0'"),
    ("dirichlet:alpha=١", "must be a finite number > 0, got '١'"),
    ("dirichlet:alpha=0x10", "must be a finite number > 0, got '0x10'"),
    ("dirichlet:alpha=1 0", "must be a finite number > 0, got '1 0'"),
    ("dirichlet:alpha=high", "must be a finite number > 0, got 'high'"),
    ("dirichlet:alpha=true", "must be a finite number > 0, got 'true'"),
    ("dirichlet:min_size=1.5", "option dirichlet:min_size must be an integer ≥ 0, got '1.5'."),
    ("dirichlet:min_size=1e1", "must be an integer ≥ 0, got '1e1'"),
    ("dirichlet:min_size=1_0", "must be an integer ≥ 0, got '1_0'"),
    ("dirichlet:min_size=١٠", "must be an integer ≥ 0, got '١٠'"),
    ("dirichlet:min_size=true", "must be an integer ≥ 0, got 'true'"),
    ("dirichlet:min_size=" + "1" * 5000, "must be an integer ≥ 0 of at most"),
    (
        "shards:shards_per_client=1e3",
        "option shards:shards_per_client must be a positive integer, got '1e3'.",
    ),
    ("shards:shards_per_client=2.0", "must be a positive integer, got '2.0'"),
    ("shards:shards_per_client=true", "must be a positive integer, got 'true'"),
    ("dirichlet:max_redraws=1.5", "option dirichlet:max_redraws must be a positive integer"),
    # out of range
    ("dirichlet:alpha=0", "option dirichlet:alpha must be a finite number > 0, got '0'."),
    ("dirichlet:alpha=-0.5", "must be a finite number > 0, got '-0.5'"),
    ("dirichlet:min_size=-1", "must be an integer ≥ 0, got '-1'"),
    ("shards:shards_per_client=0", "must be a positive integer, got '0'"),
    ("shards:shards_per_client=-2", "must be a positive integer, got '-2'"),
    (
        "dirichlet:max_redraws=0",
        "option dirichlet:max_redraws must be a positive integer, got '0'.",
    ),
    # grammar
    ("", "the partition is empty; give one like 'dirichlet'"),
    ("   ", "the partition is empty"),
    ("dirichlet:", "partition 'dirichlet' has ':' but no options after it; drop the ':'"),
    ("shards: ", "partition 'shards' has ':' but no options after it"),
    (
        "dirichlet::",
        "partition 'dirichlet' has more than one ':'; write all its options after a single ':'",
    ),
    ("dirichlet:alpha=1:min_size=5", "has more than one ':'"),
    (
        "dirichlet:=1",
        "option '=1' of partition 'dirichlet' has no name before '='; name one of its options "
        "(alpha, min_size, max_redraws), e.g. dirichlet:alpha=VALUE.",
    ),
    (
        "dirichlet:alpha",
        "option 'alpha' of partition 'dirichlet' needs a value; write dirichlet:alpha=VALUE.",
    ),
    (
        "dirichlet:alpha=",
        "option dirichlet:alpha has no value after '='; write dirichlet:alpha=VALUE.",
    ),
    ("dirichlet:alpha= ", "option dirichlet:alpha has no value after '='"),
    ("dirichlet:alpha==1", "option 'alpha==1' of partition 'dirichlet' has more than one '='"),
    ("dirichlet:alpha=1 min_size=5", "separate options with commas"),
    (
        "dirichlet:,alpha=1",
        "partition 'dirichlet' has an empty option in ',alpha=1'; separate options with "
        "single commas",
    ),
    (
        "dirichlet:alpha=1,",
        "has an empty option in 'alpha=1,'; separate options with single commas and drop "
        "leading or trailing ones.",
    ),
    ("dirichlet:alpha=1,,min_size=5", "has an empty option in 'alpha=1,,min_size=5'"),
    ("dirichlet:alpha=1, ,min_size=5", "has an empty option"),
    (":alpha=1", "partition ':alpha=1' has no name before ':'; write the partition first"),
    ("alpha=1", "'alpha=1' is not a partition; options follow the partition's name and a ':'"),
    ("dirichlet,alpha=1", "is not a partition; options follow the partition's name and a ':'"),
    # names and keys
    (
        "dirichlt",
        "unknown partition 'dirichlt' (did you mean 'dirichlet'?); choose one of: "
        "class-shards, class-subsets, dirichlet, iid, label-quantity, shards.",
    ),
    ("shard", "unknown partition 'shard' (did you mean 'shards'?)"),
    ("lda", "unknown partition 'lda' (did you mean 'dirichlet'?)"),
    (
        "foo",
        "unknown partition 'foo'; choose one of: class-shards, class-subsets, dirichlet, iid, "
        "label-quantity, shards.",
    ),
    (
        "DIRICHLET",
        "unknown partition 'DIRICHLET'; partition names are lower case, write 'dirichlet'.",
    ),
    ("Shards:shards_per_client=3", "partition names are lower case, write 'shards'"),
    (
        "dirichlet:beta=1",
        "unknown option 'beta' for partition 'dirichlet'; its options are: alpha, min_size, "
        "max_redraws.",
    ),
    ("dirichlet:alfa=1", "unknown option 'alfa' for partition 'dirichlet' (did you mean 'alpha'?)"),
    ("dirichlet:ALPHA=1", "(option names are lower case: write 'alpha'); its options are:"),
    (
        "dirichlet:shards_per_client=3",
        "('shards_per_client' is an option of shards and class-shards); its options are: alpha",
    ),
    ("shards:alpha=1", "('alpha' is an option of dirichlet); its options are: shards_per_client."),
    (
        "shards:foo",
        "unknown option 'foo' for partition 'shards'; its options are: shards_per_client.",
    ),
    # hostile text stays on one line, quoted and cut
    ("dirichlet:alpha=x\nrm -rf /", r"got 'x\nrm -rf /'"),
    ("dirichlet:=1\nx", r"option '=1\nx' of partition 'dirichlet' has no name before '='"),
    ("nope\n\x1b[31mred", r"unknown partition 'nope\n\x1b[31mred'"),
    ("dirichlet:alpha=" + "9" * 100 + "x", "…'"),
]


@pytest.mark.parametrize(("spec", "phrase"), BAD)
def test_bad_specs_are_one_clear_line(spec: str, phrase: str) -> None:
    with pytest.raises(UserError) as info:
        partitioner_from_spec(spec)
    message = str(info.value)
    assert "\n" not in message and "\r" not in message and "\x1b" not in message
    assert phrase in message
    assert len(message) < 300, message
    assert "Partitioner" not in message  # no Python internals


def test_option_tables_match_the_constructors() -> None:
    """The grammar's keys are exactly the constructors' keyword arguments."""
    assert set(OPTION_PARSERS) == set(_PARTITIONER_TYPES)
    for name, cls in _PARTITIONER_TYPES.items():
        params = [
            p.name
            for p in inspect.signature(cls).parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        assert list(OPTION_PARSERS[name]) == params, name


def test_build_partitioner_refuses_unknown_names_and_keys_in_the_same_words() -> None:
    shards = build_partitioner("shards", shards_per_client=3)
    assert isinstance(shards, ShardPartitioner) and shards.shards_per_client == 3
    with pytest.raises(UserError, match=r"^partition 'iid' takes no options, got 'alpha'"):
        build_partitioner("iid", alpha=0.3)
    with pytest.raises(UserError, match=r"^unknown option 'beta' for partition 'dirichlet'"):
        build_partitioner("dirichlet", beta=0.5)
    with pytest.raises(UserError, match=r"^unknown partition 'DIRICHLET'; .* lower case"):
        build_partitioner("DIRICHLET")


def _cfl_bench() -> list[str]:
    """The installed console script of this interpreter (the module if it is absent)."""
    script = Path(sys.executable).with_name("cfl-bench")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "cfl_bench.cli"]


def test_cli_refuses_a_duplicate_option_in_one_line_before_writing(tmp_path: Path) -> None:
    out = tmp_path / "r"
    result = subprocess.run(
        [
            *_cfl_bench(), "run", "--partition", "dirichlet:alpha=1,alpha=2", "--tasks", "2",
            "--rounds-per-task", "1", "--threads", "1", "--out", str(out),
        ],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr + result.stdout
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "option 'alpha' of partition 'dirichlet' is given twice; give it once." in lines[0]
    assert not out.exists()
