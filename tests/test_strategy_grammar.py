"""The strategy grammar's edges: every bad input is one ``UserError`` sentence that names the
problem and a fix that makes sense, numbers are plain finite decimals, and every form that
was legal before still parses to the same specs.

Why table-driven: each row is one user mistake, and the refusal is the contract — a new
parser or grammar rule must keep every row's sentence true.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cfl_bench.core.errors import UserError
from cfl_bench.strategies.base import (
    Option,
    boolean,
    non_negative_float,
    positive_float,
    positive_int,
    text,
    unit_fraction,
)
from cfl_bench.strategies.compose import ComponentSpec, build_strategy, parse_strategy
from cfl_bench.strategies.declarations import generation_length, gref_samples

# (strategy, phrase the one-line refusal must contain)
REFUSALS: list[tuple[str, str]] = [
    # floats are finite plain decimals
    ("fedprox:mu=inf", "option fedprox:mu must be a finite number ≥ 0, got 'inf'."),
    ("fedprox:mu=-inf", "option fedprox:mu must be a finite number ≥ 0, got '-inf'."),
    ("fedprox:mu=nan", "option fedprox:mu must be a finite number ≥ 0, got 'nan'."),
    ("fedprox:mu=Infinity", "must be a finite number ≥ 0, got 'Infinity'."),
    ("der:alpha=inf", "option der:alpha must be a finite number ≥ 0, got 'inf'."),
    ("derpp:beta=nan", "option derpp:beta must be a finite number ≥ 0, got 'nan'."),
    ("fedcurv:lam=1e400", "option fedcurv:lam must be a finite number ≥ 0 (at most about"),
    ("fedprox:mu=1e999", "got '1e999'."),
    ("fedprox:mu=1e-400", "that does not round to 0 as a float"),
    ("fedproj:temperature=nan", "option fedproj:temperature must be a finite number > 0, got"),
    ("fedproj:distill_lr=inf", "option fedproj:distill_lr must be a finite number > 0"),
    ("fedntd:tau=0", "option fedntd:tau must be a finite number > 0, got '0'."),
    ("ifa:rho=nan", "option ifa:rho must be a fraction in (0, 1], got 'nan'."),
    ("ifa:rho=1e400", "option ifa:rho must be a fraction in (0, 1], got '1e400'."),
    ("ifa:rho=1.5", "option ifa:rho must be a fraction in (0, 1], got '1.5'."),
    ("fedprox:mu=-1", "option fedprox:mu must be a finite number ≥ 0, got '-1'."),
    ("fedprox:mu=1_0", "must be a finite number ≥ 0, got '1_0'."),
    ("fedprox:mu=0x10", "must be a finite number ≥ 0, got '0x10'."),
    ("fedprox:mu=1 0", "must be a finite number ≥ 0, got '1 0'."),
    ("fedprox:mu=١", "must be a finite number ≥ 0"),  # Unicode digit that float() accepts
    ("fedprox:mu=１", "must be a finite number ≥ 0"),  # full-width digit
    ("fedprox:mu=1e", "must be a finite number ≥ 0, got '1e'."),
    ("fedprox:mu=.", "must be a finite number ≥ 0, got '.'."),
    # integers are plain decimal integers
    ("fedgp:gref_interval=1.5", "option fedgp:gref_interval must be a positive integer, got"),
    ("fedgp:gref_interval=1e3", "must be a positive integer, got '1e3'."),
    ("fedgp:gref_interval=true", "must be a positive integer, got 'true'."),
    ("fedgp:gref_interval=0x10", "must be a positive integer, got '0x10'."),
    ("fedgp:gref_interval=1_000", "must be a positive integer, got '1_000'."),
    ("fedgp:gref_interval=1.0", "must be a positive integer, got '1.0'."),
    ("fedgp:gref_interval=0", "must be a positive integer, got '0'."),
    ("fedgp:gref_interval=-2", "must be a positive integer, got '-2'."),
    ("fedcurv:samples=inf", "option fedcurv:samples must be a positive integer, got 'inf'."),
    ("fedgp:gref_samples=none", "must be a positive integer or 'all', got 'none'."),
    ("fedgp:gref_samples=2.5", "must be a positive integer or 'all', got '2.5'."),
    ("ifa:generation=0", "must be a positive integer, 'task' or 'auto', got '0'."),
    ("ifa:generation=1e2", "must be a positive integer, 'task' or 'auto', got '1e2'."),
    # booleans are true/false only
    ("fedgp:equal_comm=yes", "option fedgp:equal_comm must be true or false, got 'yes'."),
    ("fedgp:equal_comm=1", "must be true or false, got '1'."),
    ("fedgp:equal_comm=on", "must be true or false, got 'on'."),
    ("fedgp:equal_comm=no", "must be true or false, got 'no'."),
    ("fedgp:equal_comm=0", "must be true or false, got '0'."),
    # choices
    ("fedgp:gref_mode=bogus", "option fedgp:gref_mode must be one of train, eval, got 'bogus'."),
    ("fedgp:gref_mode=EVAL", "must be one of train, eval, got 'EVAL'."),
    # options
    ("der:alpha=1,alpha=2", "option 'alpha' of component 'der' is given twice; give it once."),
    (
        "fedgp:gref_mode=eval,gref_mode=eval",
        "option 'gref_mode' of component 'fedgp' is given twice",
    ),
    ("der:alpha", "option 'alpha' of component 'der' needs a value; write der:alpha=VALUE."),
    ("der:alpha=", "option der:alpha has no value after '='; write der:alpha=VALUE."),
    ("der:alpha==1", "option 'alpha==1' of component 'der' has more than one '='"),
    ("der:alpha=1=2", "has more than one '='"),
    (
        "der:=1",
        "option '=1' of component 'der' has no name before '='; name one of its options (alpha)",
    ),
    ("der:bogus", "unknown option 'bogus' for 'der'; its options are: alpha."),
    ("der:ALPHA=1", "unknown option 'ALPHA' for 'der'; its options are: alpha."),
    ("der:mu=1", "unknown option 'mu' for 'der'; its options are: alpha ('mu' is an option of"),
    ("der:beta=1", "('beta' is an option of derpp and fedntd)"),
    ("der:fedgp", "'fedgp' is a strategy component, not an option of 'der'; join components"),
    # colons and commas
    ("der::", "component 'der' has more than one ':'"),
    ("der:alpha=1:2", "component 'der' has more than one ':'"),
    ("der:", "component 'der' has ':' but no options after it; drop the ':'"),
    ("der: ", "component 'der' has ':' but no options after it"),
    ("der:,alpha=1", "component 'der' has an empty option in ',alpha=1'"),
    ("der:alpha=1,", "component 'der' has an empty option in 'alpha=1,'"),
    ("derpp:alpha=1,,beta=1", "component 'derpp' has an empty option"),
    ("fedavg:", "component 'fedavg' takes no options; drop ':' after it."),
    ("fedavg:x=1", "component 'fedavg' takes no options; drop ':x=1' after it."),
    (":alpha=1", "component ':alpha=1' has no name before ':'"),
    # plus signs
    ("+", "strategy '+' names no component"),
    ("++", "strategy '++' names no component"),
    ("der+", "has an empty component after its last '+'; remove the trailing '+'"),
    ("+der", "has an empty component before its first '+'; remove the leading '+'."),
    ("der++fedgp", "has an empty component between two '+'; write one '+' between components."),
    ("der + + fedgp", "has an empty component between two '+'"),
    ("der:alpha=+fedgp", "option der:alpha has no value after '='"),
    ("der:alpha=1+beta=2", "'beta=2' is not a strategy component; options follow their"),
    ("der,fedgp", "'der,fedgp' is not a strategy component; join components with '+'"),
    # names
    ("nosuch", "unknown strategy component 'nosuch'; choose from: agem, der,"),
    ("d er", "unknown strategy component 'd er'; choose from:"),
    ("dér", "unknown strategy component 'dér'; choose from:"),
    ("de\nr", "unknown strategy component 'de\\nr'"),  # escaped, so still one line
    ("der+\x1b[31mfedgp", "unknown strategy component '\\x1b[31mfedgp'"),
    ("x" * 5000, "unknown strategy component 'xxxxxxxxx"),
    ("", "the strategy is empty; give one like 'der+fedgp'"),
    ("   ", "the strategy is empty"),
    # compositions
    ("fedgp+fedgp", "'fedgp' appears twice in strategy 'fedgp+fedgp'; use it once."),
    ("fedgp+FEDGP", "component names are lower-case: write 'fedgp'"),
    ("DER+FedGP", "unknown strategy component 'DER'; component names are lower-case"),
    ("der:alpha=1+der:alpha=2", "'der' appears twice"),
    ("der+agem", "has two local learners (der and agem); keep exactly one learner"),
    ("der+agem+er", "has three local learners (der, agem and er); keep exactly one learner"),
    ("fedavg+der", "has two local learners (fedavg and der)"),
]


@pytest.mark.parametrize(("strategy", "phrase"), REFUSALS)
def test_refusal_is_one_sentence(strategy: str, phrase: str) -> None:
    with pytest.raises(UserError) as caught:
        build_strategy(strategy)
    message = str(caught.value)
    assert phrase in message
    assert "\n" not in message and "\r" not in message
    assert message.endswith(".") and len(message) < 400  # long input is cut, not echoed
    assert "::=" not in message and "VALUE=" not in message  # no nonsense suggestions


def test_long_input_is_cut_in_the_message() -> None:
    with pytest.raises(UserError, match="…'; choose from") as caught:
        build_strategy("x" * 5000)
    assert "x" * 41 not in str(caught.value)


# Legal before and after, with the specs they parse to.
LEGAL: list[tuple[str, list[ComponentSpec]]] = [
    (
        "der:alpha=0.5+fedgp:gref_samples=all,gref_mode=eval+ifa:mode=random",
        [
            ComponentSpec("der", {"alpha": 0.5}),
            ComponentSpec("fedgp", {"gref_samples": "all", "gref_mode": "eval"}),
            ComponentSpec("ifa", {"mode": "random"}),
        ],
    ),
    ("der + fedgp", [ComponentSpec("der", {}), ComponentSpec("fedgp", {})]),
    ("  der+fedgp  ", [ComponentSpec("der", {}), ComponentSpec("fedgp", {})]),
    ("der\t+\nfedgp", [ComponentSpec("der", {}), ComponentSpec("fedgp", {})]),
    (" der : alpha = 0.5 ", [ComponentSpec("der", {"alpha": 0.5})]),
    ("derpp:alpha=0.1 , beta=2", [ComponentSpec("derpp", {"alpha": 0.1, "beta": 2.0})]),
    ("fedgp:gref_samples=ALL", [ComponentSpec("fedgp", {"gref_samples": "all"})]),
    ("fedgp:gref_samples=64", [ComponentSpec("fedgp", {"gref_samples": 64})]),
    ("fedgp:equal_comm=true", [ComponentSpec("fedgp", {"equal_comm": True})]),
    ("fedgp:equal_comm=False", [ComponentSpec("fedgp", {"equal_comm": False})]),
    ("fedgp:equal_comm=TRUE", [ComponentSpec("fedgp", {"equal_comm": True})]),
    ("ifa:generation=task", [ComponentSpec("ifa", {"generation": None})]),
    ("ifa:generation=auto", [ComponentSpec("ifa", {"generation": None})]),
    ("ifa:generation=3,rho=1", [ComponentSpec("ifa", {"generation": 3, "rho": 1.0})]),
    ("fedprox:mu=0", [ComponentSpec("fedprox", {"mu": 0.0})]),
    ("fedprox:mu=1e-5", [ComponentSpec("fedprox", {"mu": 1e-5})]),
    ("fedprox:mu=2.5E-3", [ComponentSpec("fedprox", {"mu": 2.5e-3})]),
    ("der:alpha=.5", [ComponentSpec("der", {"alpha": 0.5})]),
    ("der:alpha=5.", [ComponentSpec("der", {"alpha": 5.0})]),
    ("fedcurv:samples=0500", [ComponentSpec("fedcurv", {"samples": 500})]),
    ("fedproj:distill_lr=1e-4", [ComponentSpec("fedproj", {"distill_lr": 1e-4})]),
    ("fedprox:mu=1e308", [ComponentSpec("fedprox", {"mu": 1e308})]),
    # A '+' directly after '=' or in an exponent, before a digit, is the number's sign.
    ("der:alpha=+0.5+fedgp", [ComponentSpec("der", {"alpha": 0.5}), ComponentSpec("fedgp", {})]),
    ("fedprox:mu=1e+3+der", [ComponentSpec("fedprox", {"mu": 1000.0}), ComponentSpec("der", {})]),
    ("fedgp:gref_interval=+2", [ComponentSpec("fedgp", {"gref_interval": 2})]),
]


@pytest.mark.parametrize(("strategy", "specs"), LEGAL)
def test_legal_forms_parse(strategy: str, specs: list[ComponentSpec]) -> None:
    assert parse_strategy(strategy) == specs
    build_strategy(strategy)


def test_negative_zero_is_zero() -> None:
    (spec,) = parse_strategy("fedprox:mu=-0")
    assert str(spec.options["mu"]) == "0.0"


@pytest.mark.parametrize(
    "strategy",
    ["der:alpha=0.5+fedgp:gref_samples=all,equal_comm=true", "fedprox:mu=1e20", "ifa:rho=1e-07"],
)
def test_canonical_names_parse_back(strategy: str) -> None:
    """A run's recorded name (``mu=1e+20``, ``equal_comm=True``) is itself a valid strategy."""
    name = build_strategy(strategy).name
    assert build_strategy(name).name == name


def test_auto_names_a_stream_resolved_default() -> None:
    """``cfl-bench list strategies`` shows options resolved at setup as ``=auto``; the same
    word is accepted back, and still refused where the default is a value."""
    (spec,) = parse_strategy("der:alpha=auto")
    assert spec.options["alpha"] is None
    name = build_strategy("der:alpha=auto+fedproj:public_size=auto").name
    assert name == "der:alpha=auto+fedproj:public_size=auto"
    assert build_strategy(name).name == name
    with pytest.raises(UserError, match="option fedprox:mu must be a finite number"):
        parse_strategy("fedprox:mu=auto")


@pytest.mark.parametrize(
    ("parse", "good", "bad"),
    [
        (non_negative_float, {"0": 0.0, "1.5": 1.5, "-0.0": 0.0}, ["inf", " 1", "-1e-3", ""]),
        (positive_float, {"3": 3.0, "1e-8": 1e-8}, ["0", "nan", "1e-400", "1.0f"]),
        (unit_fraction, {"1": 1.0, "0.2": 0.2}, ["0", "1.0000001", "nan", "1e400"]),
        (positive_int, {"7": 7, "+7": 7, "007": 7}, ["0", "1.0", "1e1", " 7", "true", "٣"]),
        (boolean, {"true": True, "FALSE": False, "True": True}, ["yes", "1", "", " true"]),
        (gref_samples, {"all": "all", "All": "all", "8": 8}, ["0", "every", "8.0"]),
        (generation_length, {"task": None, "AUTO": None, "4": 4}, ["0", "epoch", "4.5"]),
    ],
)
def test_parsers_directly(parse: object, good: dict[str, object], bad: list[str]) -> None:
    """The parsers see already-trimmed text and refuse with a ``must …`` clause."""
    assert callable(parse)
    for raw, value in good.items():
        assert parse(raw) == value
    for raw in bad:
        with pytest.raises(ValueError, match=r"^must "):
            parse(raw)


def test_option_convert_wraps_a_foreign_value_error() -> None:
    """A parser that raises Python's own ValueError still yields one line naming the option."""
    option = Option("k", 1, "help", int)
    with pytest.raises(UserError) as caught:
        option.convert("comp", "x\ny")
    message = str(caught.value)
    assert message.startswith("option comp:k has an invalid value (")
    assert "\n" not in message and message.endswith("got 'x\\ny'.")
    assert Option("t", "a", "help", text, choices=("a", "b")).convert("comp", "b") == "b"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cfl_bench.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("strategy", "message"),
    [
        ("fedprox:mu=inf", "error: option fedprox:mu must be a finite number ≥ 0, got 'inf'."),
        ("der::", "error: component 'der' has more than one ':'; write all its options"),
    ],
)
def test_cli_refuses_in_one_line(strategy: str, message: str, tmp_path: Path) -> None:
    out = tmp_path / "r"
    result = cli(
        "run",
        *("--strategy", strategy, "--tasks", "2", "--rounds-per-task", "1"),
        *("--threads", "1", "--out", str(out)),
    )
    assert result.returncode == 2, result.stderr + result.stdout
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(message)
    assert not out.exists()


@pytest.mark.parametrize(
    "text",
    [
        "ifa:generation=task",
        "ifa:generation=3,mode=random,reset_to=init",
        "der:alpha=0.50+fedgp:equal_comm=true,gref_samples=all",
        "fedproj:public=holdout,public_size=100+fedprox:mu=1e-3",
    ],
)
def test_the_canonical_name_parses_back_to_itself(text: str) -> None:
    """The name is what run directories, sweeps and the config hash are keyed by."""
    name = build_strategy(text).name
    assert build_strategy(name).name == name
    assert build_strategy(name).describe() == build_strategy(text).describe()
