"""The sweep grid: which run configurations a sweep covers, in which order, under which names.

A sweep file is YAML with four top-level keys (all optional)::

    out: runs/sweep1            # the sweep folder; one sub-folder per grid point
    jobs: 2                     # runs in parallel
    base: {stream: rot-mnist, data_root: ../shared/data, tasks: 5, rounds_per_task: 3}
    grid: {strategy: [fedavg, der, der+fedgp, agem+fedgp], seed: [0, 1], buffer_size: [200]}

``base`` holds constant options, ``grid`` the axes (a scalar is a one-value axis). Their keys
are `cfl-bench run` option names, with dashes or underscores, checked against ``RunConfig``
like ``cfl-bench run --config``. ``out`` and ``overwrite`` are the sweep's business and cannot
be grid options.

On the command line every `cfl-bench run` option may be given, and repeated to add values
to its axis (``--strategy fedavg --strategy der --seed 0 --seed 1``); ``--set KEY=V1,V2``
adds several values at once (``strategy`` and ``partition`` values are never split on commas
because their own grammar uses commas: repeat ``--set`` for them). Boolean options take the
flag forms ``--download`` / ``--no-download`` (and ``--eval-task-end``) or
``--set KEY=true,false``. A key given on the command line replaces that key's values from
the file; ``--out`` and ``--jobs`` replace the file's ``out`` and ``jobs``.

Order is deterministic: the cartesian product over the axes in the order they were given
(file ``base`` keys, then file ``grid`` keys, then keys only on the command line in
command-line order), the first axis varying slowest. Every point is checked with
``config.validate`` here, before anything is written or run.

A point's directory is ``<out>/<slug>-<hash8>``: the slug is readable
(``stream_strategy_s<seed>`` plus every other axis with more than one value, sanitised like
run directory names), and the hash is ``canonical_hash`` of the point's fully specified
``RunConfig`` dict without ``out``/``overwrite`` — the *request*, known without building any
stream, so the same request always lands in the same directory and can be skipped when done.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cfl_bench.core.errors import UserError
from cfl_bench.core.text_values import quoted
from cfl_bench.engine.arrivals import ARRIVALS_PARTITION
from cfl_bench.runner.config import (
    RunConfig,
    canonical_hash,
    check_path_text,
    check_value,
    field_names,
    option_kind,
    parse_text,
    read_yaml_mapping,
    validate,
)
from cfl_bench.runner.run_names import (
    NAME_KEYS,
    SWEEP_OWNED,
    point_name,
    point_request,
)

SWEEP_FILE_KEYS = ("out", "jobs", "base", "grid")
# Their values contain commas by grammar (der:alpha=0.5,..., dirichlet:alpha=1,min_size=5).
UNSPLIT_KEYS = frozenset({"strategy", "partition"})
# Command-line flags whose name is not --<field> / --no-<field> (as in `cfl-bench run`).
FLAG_ALIASES: dict[str, tuple[str, bool]] = {"eval-task-end": ("eval_every_round", False)}
# More points than anyone runs in one sweep: a slip (six axes of ten values) is refused at
# once instead of validating a million points.
MAX_SWEEP_POINTS = 10_000

Axes = dict[str, list[Any]]


@dataclass(frozen=True)
class SweepSpec:
    """A sweep as asked for: its folder, its parallelism and its ordered axes."""

    out: Path
    jobs: int
    axes: Axes
    # Whether ``jobs`` was asked for (--jobs or the file's ``jobs:``), not the default 1:
    # on a Ray cluster an unset ``jobs`` leaves every point in flight (Ray queues them).
    jobs_set: bool = True


@dataclass(frozen=True)
class GridPoint:
    """One run of the sweep: its full request, the hash that identifies it, and its name."""

    index: int
    name: str
    request: dict[str, Any]
    request_hash: str
    varying: dict[str, Any]

    def label(self) -> str:
        """The values that tell this point from its neighbours, for messages."""
        shown = self.varying or {k: self.request[k] for k in NAME_KEYS}
        return ", ".join(f"{k}={v}" for k, v in shown.items())


def _check_key(raw: object, where: str) -> str:
    key = str(raw).replace("-", "_")
    if key in SWEEP_OWNED:
        raise UserError(
            f"'{raw}' cannot be a sweep option ({where}); the sweep gives every point its own "
            f"directory under the sweep folder (set it with --out or `out:`)."
        )
    if key not in field_names():
        raise UserError(
            f"unknown option '{raw}' ({where}); sweep options are the `cfl-bench run` options "
            f"(see `cfl-bench run --help`)."
        )
    return key


def coerce(key: str, raw: str) -> Any:
    """A command-line string turned into the option's type by the one strict parser of
    ``cfl_bench.runner.config`` (``none``/``null`` unset an optional option)."""
    return parse_text(key, raw, allow_null=True)


def _add(axes: Axes, key: str, values: list[Any], where: str) -> None:
    axis = axes.setdefault(key, [])
    for value in values:
        if value in axis:
            raise UserError(f"{where} lists {value!r} twice for '{key}'; give each value once.")
        axis.append(value)


def parse_cli(args: list[str]) -> Axes:
    """Axes from repeated `cfl-bench run` options and ``--set KEY=V1,V2``, in the order given.

    These arrive as the command's extra arguments (typer parses only --config, --out and
    --jobs), so one parser sees every grid option and keeps command-line order.
    """
    axes: Axes = {}
    i = 0
    while i < len(args):
        token = args[i]
        if not token.startswith("--") or token == "--":
            raise UserError(
                f"unexpected argument {token!r}; sweep options look like --strategy der or "
                f"--set seed=0,1 (see `cfl-bench sweep --help`)."
            )
        name, eq, inline = token[2:].partition("=")
        bare = name[3:] if name.startswith("no-") else name
        if bare.replace("-", "_") in SWEEP_OWNED:
            _check_key(bare, "command line")  # refused with the reason
        if name in FLAG_ALIASES or _is_flag(name):
            if eq:
                raise UserError(f"{token} is a flag and takes no value; write --{name} alone.")
            key, flag = FLAG_ALIASES.get(name) or _flag(name)
            _add(axes, key, [flag], "the command line")
            i += 1
            continue
        if eq:
            value, i = inline, i + 1
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            value, i = args[i + 1], i + 2
        else:
            raise UserError(f"--{name} needs a value, e.g. --{name} VALUE.")
        if name == "set":
            key, values = parse_set(value)
            _add(axes, key, values, "--set")
        else:
            key = _check_key(name, "command line")
            _add(axes, key, [coerce(key, value)], "the command line")
    return axes


def _is_flag(name: str) -> bool:
    bare = name[3:] if name.startswith("no-") else name
    key = bare.replace("-", "_")
    return key in field_names() and key not in SWEEP_OWNED and option_kind(key)[0] is bool


def _flag(name: str) -> tuple[str, bool]:
    if name.startswith("no-"):
        return name[3:].replace("-", "_"), False
    return name.replace("-", "_"), True


def coerce_jobs(raw: object) -> int:
    """``--jobs`` / ``jobs:`` as a positive integer."""
    if isinstance(raw, str):
        with contextlib.suppress(ValueError):
            raw = int(raw.strip())
    if isinstance(raw, bool) or not isinstance(raw, int) or raw <= 0:
        raise UserError(f"--jobs must be a positive integer, got {raw!r}.")
    return raw


def parse_set(text: str) -> tuple[str, list[Any]]:
    """``KEY=V1,V2`` → (field, typed values)."""
    raw_key, eq, rest = text.partition("=")
    if not eq or not raw_key.strip() or not rest.strip():
        raise UserError(f"--set {text!r} must look like KEY=VALUE or KEY=V1,V2 (e.g. seed=0,1).")
    key = _check_key(raw_key.strip(), "--set")
    parts = [rest] if key in UNSPLIT_KEYS else rest.split(",")
    if any(not part.strip() for part in parts):
        raise UserError(
            f"--set {text!r} has an empty value; separate values with single commas "
            f"(e.g. {raw_key.strip()}=0,1)."
        )
    return key, [coerce(key, p) for p in parts]


def load_sweep_file(path: str | Path) -> tuple[Axes, str | None, int | None]:
    """Axes (``base`` keys first, then ``grid`` keys, file order), ``out`` and ``jobs``."""
    p = Path(path)
    data = read_yaml_mapping(p, "sweep file", "with keys out, jobs, base, grid")
    unknown = sorted(str(k) for k in data if k not in SWEEP_FILE_KEYS)
    if unknown:
        raise UserError(
            f"sweep file '{p}' has unknown key(s) {', '.join(unknown)}; a sweep file has out, "
            f"jobs, base and grid (run options go under base or grid)."
        )
    axes: Axes = {}
    for section in ("base", "grid"):
        block = data.get(section) or {}
        if not isinstance(block, dict):
            raise UserError(f"'{section}' in sweep file '{p}' must be a mapping of options.")
        for raw_key, raw_values in block.items():
            key = _check_key(raw_key, f"{section} in '{p}'")
            if key in axes:
                raise UserError(
                    f"'{key}' appears twice in sweep file '{p}' (base and grid or two "
                    f"spellings); keep it in one place."
                )
            values = raw_values if section == "grid" and isinstance(raw_values, list) else None
            if values is not None and not values:
                raise UserError(f"grid key '{key}' in '{p}' has no values; list at least one.")
            where = f"{section} in sweep file '{p}': "
            checked = [check_value(key, v, where) for v in (values or [raw_values])]
            _add(axes, key, checked, f"'{p}'")
    out = data.get("out")
    if out is not None and (not isinstance(out, str) or not out.strip()):
        raise UserError(
            f"'out' in sweep file '{p}' must be a folder path (text), got {out!r}; write e.g. "
            f"out: runs/sweep1."
        )
    jobs = data.get("jobs")
    return axes, out, None if jobs is None else coerce_jobs(jobs)


def spec_from_options(out: str, jobs: int | None, options: dict[str, Any]) -> SweepSpec:
    """A sweep from Python values (``cfl_bench.sweep``): a list or tuple is an axis, any other
    value a one-value axis, checked as a sweep file's ``grid`` is."""
    axes: Axes = {}
    for raw_key, raw in options.items():
        key = _check_key(raw_key, "cfl_bench.sweep")
        values = list(raw) if isinstance(raw, (list, tuple)) else [raw]
        if not values:
            raise UserError(f"sweep option '{key}' has no values; give at least one.")
        checked = [check_value(key, v, "cfl_bench.sweep: ") for v in values]
        _add(axes, key, checked, "cfl_bench.sweep")
    if not axes:
        raise UserError("the sweep grid is empty; give run options, e.g. strategy=['der', 'er'].")
    try:
        check_path_text(str(out))
    except ValueError as exc:
        raise UserError(f"the sweep folder {quoted(str(out))} {exc}; give a plain path.") from None
    chosen = 1 if jobs is None else jobs
    return SweepSpec(Path(out), coerce_jobs(chosen), axes, jobs is not None)


def build_spec(
    sweep_file: str | None, args: list[str], out: str | None = None, jobs: int | None = None
) -> SweepSpec:
    """File < command line, per key; ``out``/``jobs`` (from --out/--jobs) win over the file."""
    axes, file_out, file_jobs = load_sweep_file(sweep_file) if sweep_file else ({}, None, None)
    for key, values in parse_cli(args).items():
        axes[key] = values  # an existing key keeps its position in the product order
    folder = out or file_out
    if not folder:
        raise UserError("the sweep needs a folder: pass --out DIR or set `out:` in the sweep file.")
    try:
        check_path_text(folder)  # every point's --out lies below it
    except ValueError as exc:
        raise UserError(f"the sweep folder {quoted(folder)} {exc}; give a plain path.") from None
    if not axes:
        raise UserError(
            "the sweep grid is empty; give values with run options (--strategy der --seed 0 "
            "--seed 1), --set KEY=V1,V2 or a `grid:` section in the sweep file."
        )
    chosen = jobs if jobs is not None else file_jobs
    jobs_set = chosen is not None
    return SweepSpec(Path(folder), coerce_jobs(1 if chosen is None else chosen), axes, jobs_set)


def expand(spec: SweepSpec) -> list[GridPoint]:
    """Every point of the grid, validated, in product order.

    Refused before any point runs: a grid of more than ``MAX_SWEEP_POINTS`` points (counted
    without building them), a point any `cfl-bench run` would refuse from its options alone,
    and two points that are the same run once the stream's defaults and the strategy's canonical
    name are filled in (``tasks: [null, 5]`` on a 5-task stream).
    """
    keys = list(spec.axes)
    check_grid_size(spec.axes)
    varying_keys = [k for k in keys if len(spec.axes[k]) > 1]
    points: list[GridPoint] = []
    seen: dict[str, GridPoint] = {}
    for index, combo in enumerate(itertools.product(*(spec.axes[k] for k in keys))):
        values = dict(zip(keys, combo, strict=True))
        varying = {k: values[k] for k in varying_keys}
        config = RunConfig(**values)
        try:
            validate(config)
            check_sweep_point(config)
            resolved = resolved_request(config)
        except UserError as exc:
            shown = ", ".join(f"{k}={v}" for k, v in (varying or values).items())
            raise UserError(f"grid point {index + 1} ({shown}): {exc}") from None
        request = point_request(config)
        request_hash = canonical_hash(request)
        point = GridPoint(
            index, point_name(request, varying, request_hash), request, request_hash, varying
        )
        same = seen.setdefault(canonical_hash(resolved), point)
        if same is not point:
            raise UserError(
                f"grid points {same.index + 1} ({same.label()}) and {index + 1} "
                f"({point.label()}) are the same run once defaults are filled in; drop one of "
                f"the values."
            )
        points.append(point)
    return points


def check_grid_size(axes: Axes) -> None:
    """Refuse a grid larger than ``MAX_SWEEP_POINTS`` from its axis lengths alone."""
    sizes = [len(values) for values in axes.values()]
    count = math.prod(sizes)
    if count > MAX_SWEEP_POINTS:
        shape = " × ".join(str(n) for n in sizes if n > 1)
        raise UserError(
            f"the sweep grid has {count:,} points ({shape} values) and a sweep runs at most "
            f"{MAX_SWEEP_POINTS:,}; split it into smaller sweeps."
        )


def check_sweep_point(config: RunConfig) -> None:
    """What `cfl-bench run` refuses from options alone, and what a sweep cannot run."""
    from cfl_bench.runner.run_checks import check_diagnostics, check_run_length
    from cfl_bench.streams.catalogue import check_class_order, check_classes_per_task, stream_info

    info = stream_info(config.stream)
    check_classes_per_task(info, config.classes_per_task)
    check_class_order(info, config.class_order)
    check_diagnostics(config)
    check_run_length(config)


def resolved_request(config: RunConfig) -> dict[str, Any]:
    """A point's request with the stream's defaults filled in and the strategy in canonical
    form: equal exactly when two points would run the same configuration."""
    from cfl_bench.strategies.compose import validate_strategy
    from cfl_bench.streams.catalogue import default_task_count, stream_info

    info = stream_info(config.stream)
    request = point_request(config)
    defaults = {
        "model": info.default_model,
        "tasks": default_task_count(info, config.classes_per_task) or None,
        # Under --arrivals the GLFC code's split (``runner.plan.default_partition``).
        "partition": ARRIVALS_PARTITION if config.arrivals is not None else info.default_partition,
        "rounds_per_task": info.default_rounds_per_task,
        "epochs": info.default_epochs,
        "lr": info.default_lr,
        "optimizer": info.default_optimizer,
        "buffer_batch_size": config.batch_size,
    }
    for key, value in defaults.items():
        if request.get(key) is None:
            request[key] = value
    request["strategy"] = validate_strategy(config.strategy).name
    return request
