"""Hand-made run directories with known numbers, for the leaderboard (and sweep) tests.

Why hand-made: aggregation is checked against numbers a reader can verify by hand (seeds
0, 1, 2 with Acc_T 50, 60, 70 → mean 60, sample std 10, population std sqrt(200/3) ≈
8.1650), which real runs cannot give. The files have the layout ``cfl-bench run`` writes
(config.json first, summary.json last; see cfl_bench/runner/run.py), with hashes computed the same
way, so the loader sees realistic input.
A ``failed`` summary is written the way the sweep runner records a crashed run: status,
message and identity keys only, no metrics.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cfl_bench.runner.config import canonical_hash

GIT_COMMIT = "0123456789abcdef0123456789abcdef01234567"
PACKAGES: dict[str, str | None] = {
    "cfl-bench": "0.1.0",
    "numpy": "2.4.6",
    "pandas": "3.1.1",
    "scikit-learn": "1.9.1",
    "torch": "2.15.0",
    "torchvision": "0.29.2",
}
#: A run-directory name that would load an image (a network request) and run script if it
#: reached the page unescaped; directory names cannot hold "/", so no closing tags here.
IMG_INJECTION = "evil <img src=x onerror=alert(1)>"
ENVIRONMENT: dict[str, object] = {
    "device": "cpu",
    "platform": "Linux-test-x86_64",
    "python": "3.11.7",
    "torch_threads": 2,
}


def protocol(stream: str = "rot-digits", **changes: Any) -> dict[str, Any]:
    """A protocol dict like config.json's (3 tasks, 4 clients); ``changes`` override keys."""
    base: dict[str, Any] = {
        "async_shift": 0,
        "batch_size": 32,
        "buffer_batch_size": 32,
        "buffer_offer": "first_pass",
        "buffer_size": 200,
        "clients": 4,
        "epochs": 1,
        "eval_every_round": False,
        "lr": 0.05,
        "model": "mlp",
        "momentum": 0.0,
        "participation": 1.0,
        "partition": {"name": "shards", "per_task": False, "shards_per_client": 2},
        "probe_size": 500,
        "replay_augment": False,
        "rounds_per_task": 2,
        "stream": stream,
        "tasks": 3,
        "test_size": None,
        "train_size": None,
        "weight_decay": 0.0,
        "weighting": "samples",
    }
    base.update(changes)
    return base


def accuracy_matrix(acc_final: float, tasks: int, drop: float = 10.0) -> list[list[float | None]]:
    """a[t][i]: the last row is all ``acc_final`` (so Acc_T = acc_final), earlier rows are
    ``acc_final + drop`` on seen tasks (so Fgt_T = drop, BWT = -drop) and 10 on the next task
    (the FWT entry), null above. The leaderboard re-derives forgetting from this matrix, so
    the summary's forgetting keys must agree with it."""
    rows: list[list[float | None]] = []
    for t in range(tasks):
        row: list[float | None] = [None] * tasks
        for i in range(tasks):
            if t == tasks - 1 and i <= t:
                row[i] = acc_final
            elif i <= t:
                row[i] = acc_final + drop
            elif i == t + 1:
                row[i] = 10.0
        rows.append(row)
    return rows


def summary_metrics(acc_final: float, tasks: int, task_il: bool = False) -> dict[str, Any]:
    """Metric keys of a summary.json consistent with :func:`accuracy_matrix`."""
    matrix = accuracy_matrix(acc_final, tasks)
    acc_t = [sum(v for v in matrix[t][: t + 1] if v is not None) / (t + 1) for t in range(tasks)]
    out: dict[str, Any] = {
        "num_tasks": tasks,
        "acc_matrix": matrix,
        "acc_t": acc_t,
        "acc_T": acc_t[-1],
        "Acc_T": acc_t[-1],
        "fgt_acc_t": [None] + [0.0] * (tasks - 2) + [10.0],
        "Fgt_T": 10.0,
        "fgt_acc_T": 10.0,
        "Fgt_T_clipped": 10.0,
        "fgt_clipped_acc_T": 10.0,
        "BWT": -10.0,
        "bwt_acc": -10.0,
        "FWT": 0.5,
        "fwt_acc": 0.5,
        "md_t": [None] + [0.02 * t for t in range(1, tasks)],
        "MD_T": 0.02 * (tasks - 1),
        "bytes_up_total": 1000,
        "bytes_down_total": 3000,
        "wall_time_s": 2.0,
        "bytes_by_payload": {"up:model": 1000, "down:model": 3000},
    }
    if task_il:
        til = accuracy_matrix(acc_final + 20.0, tasks, drop=5.0)
        til_t = [sum(v for v in til[t][: t + 1] if v is not None) / (t + 1) for t in range(tasks)]
        out.update(
            {
                "acc_task_il_matrix": til,
                "acc_task_il_t": til_t,
                "acc_task_il_T": til_t[-1],
                "fgt_acc_task_il_t": [None] + [0.0] * (tasks - 2) + [5.0],
                "fgt_acc_task_il_T": 5.0,
                "fgt_clipped_acc_task_il_T": 5.0,
                "bwt_acc_task_il": -5.0,
                "fwt_acc_task_il": 1.0,
            }
        )
    return out


def write_run(
    root: Path,
    name: str,
    *,
    strategy: str = "fedavg",
    seed: int = 0,
    acc: float = 60.0,
    proto: dict[str, Any] | None = None,
    scenario: str = "domain-il",
    status: str | None = "finished",
    message: str = "",
    metrics: dict[str, Any] | None = None,
    git_commit: str | None = GIT_COMMIT,
    packages: dict[str, str | None] | None = None,
    environment: dict[str, object] | None = None,
    initial: bool = True,
    records: list[tuple[Any, ...]] | None = None,
    recorded: dict[str, Any] | None = None,
) -> Path:
    """Write one run directory ``root/name`` and return it.

    ``status=None`` leaves out summary.json (an incomplete run); ``"failed"`` writes the
    sweep's crash record (no metrics); ``metrics`` overrides summary keys (e.g.
    ``{"wall_time_s": 5.0}``; a summary key that records.csv gives otherwise makes the run
    damaged). Class-IL streams (``scenario="class-il"``) get the task-IL keys. A run that is
    not failed gets the records.csv its summary is computed from: ``records`` (rows), or by
    default the rows of the hand-made numbers (``initial=False`` leaves the initial model's
    accuracy out of them: FWT unknown; ``recorded`` changes hand-made numbers that the
    records then give, e.g. ``{"bytes_up_total": 2000}``).
    """
    proto = proto or protocol()
    protocol_hash = canonical_hash(proto)
    strategy_info = {"name": strategy, "components": [{"name": strategy, "options": {}}]}
    config_hash = canonical_hash({"protocol": proto, "strategy": strategy_info, "seed": seed})
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    config = {
        "config": {**proto, "seed": seed, "strategy": strategy, "device": "cpu"},
        "protocol": proto,
        "protocol_hash": protocol_hash,
        "config_hash": config_hash,
        "strategy": strategy_info,
        "stream": {"name": proto["stream"], "scenario": scenario, "num_tasks": proto["tasks"]},
        "schedule": {"rounds_per_task": proto["rounds_per_task"], "epochs": proto["epochs"]},
        "packages": dict(PACKAGES if packages is None else packages),
        "git_commit": git_commit,
        "environment": dict(ENVIRONMENT if environment is None else environment),
    }
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    if status is None:
        return path
    identity = {
        "status": status,
        "message": message,
        "stream": proto["stream"],
        "strategy": strategy,
        "seed": seed,
        "protocol_hash": protocol_hash,
        "config_hash": config_hash,
    }
    summary = dict(identity)
    if status != "failed":
        hand = summary_metrics(acc, proto["tasks"], task_il=scenario == "class-il")
        hand.update(recorded or {})
        summary.update(recorded_summary(path, hand, proto, initial=initial, rows=records))
    summary.update(metrics or {})
    (path / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    return path


def rows_for(hand: dict[str, Any], rounds_per_task: int, initial: bool) -> list[tuple[Any, ...]]:
    """records.csv rows that give the hand-made numbers of :func:`summary_metrics`: each
    matrix entry at its task's last round, the memory drift of every older task, the
    initial model's accuracy (10 − FWT on the tasks after the first; ``initial=False``
    leaves it out, so FWT is unknown) and the bytes in round 1."""
    rows: list[tuple[Any, ...]] = []
    for metric, fwt in (("acc", "FWT"), ("acc_task_il", "fwt_acc_task_il")):
        matrix = hand.get(f"{metric}_matrix")
        if matrix is None:
            continue
        if initial:
            rows += [(0, -1, i, "global", metric, 10.0 - hand[fwt]) for i in range(len(matrix))]
        for t, row in enumerate(matrix):
            end = (t + 1) * rounds_per_task
            rows += [(end, t, i, "global", metric, v) for i, v in enumerate(row) if v is not None]
    for t, drift in enumerate(hand["md_t"]):
        end = (t + 1) * rounds_per_task
        rows += [(end, t, i, "global", "kl_drift", drift) for i in range(t)]
    rows += [(1, 0, -1, "global", "bytes_up", float(hand["bytes_up_total"]))]
    rows += [(1, 0, -1, "global", "bytes_down", float(hand["bytes_down_total"]))]
    return sorted(rows, key=lambda r: (r[0], r[1]))


def recorded_summary(
    path: Path,
    hand: dict[str, Any],
    proto: dict[str, Any],
    *,
    initial: bool,
    rows: list[tuple[Any, ...]] | None = None,
) -> dict[str, Any]:
    """Write the records.csv behind the hand-made numbers ``hand`` into ``path`` and return
    the summary keys that ``cfl_bench.core.metrics.summarize`` computes from it (as ``cfl-bench
    run`` does: every command checks that a summary is what its records give), after
    checking that they are the hand-made numbers (so the tests' expectations stay ones a
    reader can verify by hand), plus the run's own keys (wall time, bytes by payload)."""
    import pandas as pd

    from cfl_bench.core.metrics import RECORD_COLUMNS, summarize
    from cfl_bench.core.run_agreement import same

    given = rows is not None
    rows = rows if rows is not None else rows_for(hand, proto["rounds_per_task"], initial)
    lines = [",".join(RECORD_COLUMNS)]
    lines += [f"{r},{tt},{e},{sc},{m},{float(v)!r}" for r, tt, e, sc, m, v in rows]
    (path / "records.csv").write_text("\n".join(lines) + "\n")
    computed = summarize(pd.DataFrame(rows, columns=list(RECORD_COLUMNS)), proto["tasks"])
    for key, value in () if given else hand.items():
        if key in computed and (initial or "fwt" not in key.lower()):
            assert same(value, computed[key]), (key, value, computed[key])
    run_keys = {k: hand[k] for k in ("wall_time_s", "bytes_by_payload")}
    return {**computed, **run_keys}


def standard_runs(root: Path, injection: str = "<script>alert(1)</script>") -> Path:
    """A small, varied set of runs under ``root`` (returned), used by several tests:

    * protocol A (rot-digits, domain-IL): ``fedavg`` seeds 0, 1, 2 with Acc_T 50, 60, 70;
      ``der+fedgp`` seeds 0, 1 with Acc_T 80, 90 plus a diverged seed 2, a failed seed 3 and
      an incomplete seed 4; ``injection`` (a hostile strategy name) seed 0 with Acc_T 40 in a
      directory named :data:`IMG_INJECTION`, and its seed 1 (Acc_T 42) with a git commit
      that disagrees;
    * protocol B (the same stream with 8 clients): ``fedavg`` seed 0, Acc_T 30;
    * protocol C (seq-cifar10, class-IL): ``er`` seeds 0, 1, Acc_T 20, 24.
    """
    a = protocol()
    b = protocol(clients=8)
    c = protocol("seq-cifar10", model="cifar-cnn", tasks=2)
    for seed, acc in enumerate((50.0, 60.0, 70.0)):
        write_run(root / "a", f"fedavg_s{seed}", seed=seed, acc=acc, proto=a)
    write_run(root / "a", "der_s0", strategy="der+fedgp", seed=0, acc=80.0, proto=a)
    write_run(root / "a" / "nested", "der_s1", strategy="der+fedgp", seed=1, acc=90.0, proto=a)
    write_run(
        root / "a",
        "der_s2",
        strategy="der+fedgp",
        seed=2,
        acc=5.0,
        proto=a,
        status="diverged",
        message="loss became NaN in round 3",
    )
    write_run(
        root / "a",
        "der_s3",
        strategy="der+fedgp",
        seed=3,
        proto=a,
        status="failed",
        message=f"RuntimeError: out of memory {injection}",
    )
    write_run(root / "a", "der_s4", strategy="der+fedgp", seed=4, proto=a, status=None)
    write_run(root / "a", IMG_INJECTION, strategy=injection, seed=0, acc=40.0, proto=a)
    write_run(
        root / "a",
        "evil_s1",
        strategy=injection,
        seed=1,
        acc=42.0,
        proto=a,
        git_commit="fedcba9876543210fedcba9876543210fedcba98",
    )
    write_run(root / "b", "fedavg_s0", seed=0, acc=30.0, proto=b)
    for seed, acc in enumerate((20.0, 24.0)):
        write_run(
            root / "c",
            f"er_s{seed}",
            strategy="er",
            seed=seed,
            acc=acc,
            proto=c,
            scenario="class-il",
        )
    return root


def recorded_rows(
    tasks: int, rounds_per_task: int, clients: int, task_il: bool
) -> list[tuple[int, int, int, str, str, float]]:
    """records.csv rows laid out as the engine writes them (see cfl_bench/engine/loop.py):
    the initial model's accuracy at round 0; every round its bytes, training loss and
    per-client buffer drift; every task end the accuracy of tasks 0..t+1, the memory drift
    of older tasks and each client's local-model accuracy. Values are simple formulas of
    the indices, so a test can predict every number (e.g. a[t][i] = 40 + 10 i + 5 t − 3 (t − i)
    for i ≤ t, 12.5 for the task before its training; task-IL 20 more; at most 100)."""
    metrics = ("acc", "acc_task_il") if task_il else ("acc",)
    rows: list[tuple[int, int, int, str, str, float]] = []
    for metric in metrics:
        rows += [(0, -1, i, "global", metric, 10.0) for i in range(tasks)]
    for g in range(1, tasks * rounds_per_task + 1):
        t = (g - 1) // rounds_per_task
        rows += [
            (g, t, -1, "global", "bytes_up", 1000.0 * clients),
            (g, t, -1, "global", "bytes_down", 3000.0 * clients),
            (g, t, -1, "global", "train_loss", 2.0 / g),
        ]
        rows += [
            (g, t, -1, f"client_{k}", "buffer_drift", 0.01 * g * (1 + k / 10))
            for k in range(clients)
        ]
        if g % rounds_per_task:
            continue
        for bonus, metric in enumerate(metrics):
            for i in range(min(t + 2, tasks)):
                value = 40.0 + 10 * i + 5 * t - 3 * (t - i) if i <= t else 12.5
                rows.append((g, t, i, "global", metric, min(value + 20 * bonus, 100.0)))
        rows += [(g, t, i, "global", "kl_drift", 0.02 * (t - i)) for i in range(t)]
        rows += [(g, t, -1, f"client_{k}", "client_acc", 20.0 + 3 * k + t) for k in range(clients)]
    return rows


def resummarize(path: Path) -> None:
    """Recompute the summary keys of ``path/summary.json`` from its records.csv, as the engine
    does at a run's end (for a test that writes records of its own)."""
    from cfl_bench.core.metrics import summarize
    from cfl_bench.core.run_reader import read_rows

    summary = json.loads((path / "summary.json").read_text())
    computed = summarize(read_rows(path / "records.csv"), int(summary["num_tasks"]))
    (path / "summary.json").write_text(json.dumps({**summary, **computed}, indent=2))


def write_recorded_run(
    root: Path,
    name: str,
    *,
    strategy: str = "der",
    seed: int = 0,
    tasks: int = 3,
    clients: int = 4,
    rounds_per_task: int = 2,
    scenario: str = "domain-il",
    classes: int = 10,
    finished: bool = True,
) -> Path:
    """A run directory with a real-looking ``records.csv`` (:func:`recorded_rows`), the
    client × class tables and task clock of ``config.json``, and (``finished``) the
    ``summary.json`` that ``cfl_bench.core.metrics.summarize`` computes from those records, as
    ``cfl-bench run`` does. Class-IL runs hold two classes per task (0-1, 2-3, ...)."""
    import pandas as pd

    from cfl_bench.core.metrics import RECORD_COLUMNS, summarize

    stream = "seq-cifar10" if scenario == "class-il" else "rot-digits"
    proto = protocol(stream, tasks=tasks, clients=clients, rounds_per_task=rounds_per_task)
    path = write_run(
        root, name, strategy=strategy, seed=seed, proto=proto, scenario=scenario, status=None
    )
    config = json.loads((path / "config.json").read_text())
    config["stream"]["num_classes"] = classes
    tables = {}
    for t in range(tasks):
        table = [[0] * classes for _ in range(clients)]
        for k in range(clients):
            if scenario == "class-il":
                own = ((2 * t) % classes, (2 * t + 1) % classes)
            else:
                own = (k % classes, (k + 1) % classes)
            table[k][own[0]] += 5 + k
            table[k][own[1]] += 3 + t
        tables[str(t + 1)] = table
    config["client_class_counts"] = tables
    config["task_clock"] = {
        "eval_rounds": [rounds_per_task * (t + 1) for t in range(tasks)],
        "lag": 0,
        "offsets": [0] * clients,
        "total_rounds": tasks * rounds_per_task,
    }
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    rows = recorded_rows(tasks, rounds_per_task, clients, task_il=scenario == "class-il")
    lines = [",".join(RECORD_COLUMNS)]
    lines += [f"{r},{tt},{e},{s},{m},{float(v)!r}" for r, tt, e, s, m, v in rows]
    (path / "records.csv").write_text("\n".join(lines) + "\n")
    if finished:
        frame = pd.DataFrame(rows, columns=list(RECORD_COLUMNS))
        summary = {
            "status": "finished",
            "message": "",
            **summarize(frame, tasks),
            "stream": stream,
            "strategy": strategy,
            "seed": seed,
            "protocol_hash": config["protocol_hash"],
            "config_hash": config["config_hash"],
            "wall_time_s": 2.0,
            "bytes_by_payload": {"up:model": 1000, "down:model": 3000},
        }
        (path / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    return path
