"""Clients that join over time (``--arrivals``): GLFC's protocol for every learner.

GLFC (Dong et al., CVPR 2022) does not start with all its clients: new local clients arrive
at every task, and at every task boundary some of the clients already there get no data of
the new task and go on training on the classes they had. The rule here is the one of the
official code (conditionWang/FCIL, ``src/fl_main.py``), which the paper leaves open:

- ``initial`` clients (code: ``--num_clients`` 30) exist at task 1; at every later task,
  ``new`` clients join (code: ``task_size`` = 10, the classes per task) with the next
  indices, so task t (1-based) has initial + (t−1)·new clients and the run
  initial + (T−1)·new in all (``--clients`` must say that number).
- At the first round of every task t ≥ 2, of the E clients already there, ⌊E · receive⌋
  (code: ``int(overall_client * 0.9)``) drawn uniformly at random get the new task's data,
  together with every joining client; the other E − ⌊E · receive⌋ keep the data they held.
  The draw is made afresh at every task, over all E clients (a keeper may receive again
  later). The code draws with Python's ``random.sample``; here each task has its own torch
  generator (run seed, "arrivals", task), so the same rule gives other clients than the
  code's for one seed.
- Every round, min(``per_round``, clients there) of the clients there (code:
  ``--local_clients`` 10, ``random.sample(range(num_clients), 10)``) take part, drawn
  uniformly without replacement by the run's participation generator. A client that has
  not joined yet takes no part and holds no data.

Why this is not a partitioner: a partitioner says what data a client holds *within* a task;
arrivals say *who* exists and who gets new data at all. The run's partition (any of them)
splits task t among its receivers (``receivers(t)``, ascending index: receiver i gets the
partition's part i). Without ``--partition`` a run with arrivals uses the official code's
split, ``class-subsets`` (each receiving client holds *all* examples of 6 classes drawn from
the task's, ``--iid_level``; clients' data overlap), so the preset is GLFC's protocol.

Synchronous task boundaries only (``--async-shift`` and ``--lead-rounds`` are refused with
it), and the plan is a pure function of (options, tasks, seed): a resumed run rebuilds it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from cfl_bench.core.errors import UserError
from cfl_bench.core.text_values import (
    non_negative_int,
    positive_int,
    quoted,
    split_options,
    unit_fraction,
)

PRESETS = ("glfc",)
# The partition of a run with --arrivals and no --partition: the GLFC code's split.
ARRIVALS_PARTITION = "class-subsets"
# Each option's meaning, in the order messages and ``--help`` list them.
OPTION_HELP: dict[str, str] = {
    "initial": "clients at task 1",
    "new": "clients that join at every later task",
    "receive": "fraction of the clients already there that get each new task's data "
    "(rounded down); the others keep their old data",
    "per_round": "clients drawn per round from those there",
}


@dataclass(frozen=True)
class Arrivals:
    """The options of ``--arrivals``; the defaults are the GLFC code's."""

    initial: int = 30
    new: int = 10
    receive: float = 0.9
    per_round: int = 10

    def total_clients(self, num_tasks: int) -> int:
        """Clients of the whole run: those of task 1 and every arrival after it."""
        return self.initial + self.new * (num_tasks - 1)

    def plan(self, num_tasks: int, seed: int) -> ArrivalPlan:
        """Who is there and who receives data at every task (seeded, pure).

        torch is imported here, not at the top: the command line parses ``--arrivals``
        (``parse_arrivals``) before it loads torch, so a typo is answered at once."""
        import torch

        from cfl_bench.core.seeding import generator

        joined = tuple(self.initial + self.new * t for t in range(num_tasks))
        receivers = [tuple(range(self.initial))]
        for t in range(1, num_tasks):
            there = joined[t - 1]
            count = int(there * self.receive)
            drawn = torch.randperm(there, generator=generator(seed, "arrivals", t))[:count]
            old = sorted(int(k) for k in drawn.tolist())
            receivers.append((*old, *range(there, joined[t])))
            if not receivers[t]:
                raise UserError(
                    f"--arrivals gives task {t + 1} no client to receive its data "
                    f"({there} clients there, receive={self.receive}, new=0); raise "
                    f"receive or new."
                )
        return ArrivalPlan(joined, tuple(receivers), self.per_round)

    def describe(self) -> dict[str, object]:
        """The options, for the protocol (runs with other arrivals are other protocols)."""
        return {"name": "glfc", **{f.name: getattr(self, f.name) for f in fields(self)}}


@dataclass(frozen=True)
class ArrivalPlan:
    """Per task (0-based): how many clients are there and which of them get its data."""

    joined: tuple[int, ...]
    receivers: tuple[tuple[int, ...], ...]
    per_round: int

    def keepers(self, task: int) -> tuple[int, ...]:
        """Clients there at ``task`` that keep the data they held (no data of ``task``)."""
        got = set(self.receivers[task])
        return tuple(k for k in range(self.joined[task]) if k not in got)

    def held_task(self, client: int, task: int) -> int | None:
        """The task whose data ``client`` trains on during ``task`` (None: not there yet)."""
        for t in range(task, -1, -1):
            if client in self.receivers[t]:
                return t
        return None

    def ending_clients(self, task: int, last: bool) -> tuple[int, ...]:
        """Clients whose training data ends with global task ``task``: those that receive
        the next task's data, or every client there after the last task. A keeper's data
        does not end, so the learner's task-end work (A-GEM's memory fill) runs once per
        data a client held, not once per global task."""
        if last:
            return tuple(range(self.joined[task]))
        return tuple(k for k in self.receivers[task + 1] if k < self.joined[task])

    def describe(self) -> list[dict[str, object]]:
        """config.json → ``arrivals``: per task (1-based) who is there, receives, keeps."""
        return [
            {
                "task": t + 1,
                "clients": self.joined[t],
                "joined": list(range(self.joined[t - 1] if t else 0, self.joined[t])),
                "receivers": list(self.receivers[t]),
                "keepers": list(self.keepers(t)),
            }
            for t in range(len(self.joined))
        ]


def parse_arrivals(spec: str) -> Arrivals:
    """``glfc`` or ``glfc:key=value,...`` (keys of ``OPTION_HELP``); one-line refusals."""
    text = spec.strip()
    name, colon, opt_text = text.partition(":")
    name = name.strip()
    if name not in PRESETS:
        raise UserError(
            f"unknown --arrivals {quoted(text or spec)}; write 'glfc' (GLFC's clients joining "
            f"over time) or glfc:key=value,... with keys {', '.join(OPTION_HELP)}."
        )
    if not colon:
        return Arrivals()
    raw = split_options("arrivals", name, opt_text, list(OPTION_HELP), _unknown_key)
    parsers = {
        "initial": positive_int,
        "new": non_negative_int,
        "receive": unit_fraction,
        "per_round": positive_int,
    }
    values: dict[str, object] = {}
    for key, value in raw.items():
        try:
            values[key] = parsers[key](value)
        except ValueError as exc:
            raise UserError(f"--arrivals option {key} {exc}, got {quoted(value)}.") from None
    return Arrivals(**values)  # type: ignore[arg-type]


def _unknown_key(key: str, _has_value: bool) -> str:
    return f"unknown --arrivals option {quoted(key)}; its options are: {', '.join(OPTION_HELP)}."
