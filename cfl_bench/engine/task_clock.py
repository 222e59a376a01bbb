"""Which task each client trains in each round, and when the global model is evaluated.

Why a separate clock: with asynchronous task boundaries (FedGP's Table-4 setting,
``--async-shift S``) clients leave a task at different rounds, so "the current task" is no
longer one number. The clock is a pure function of (T, R, offsets) that the loop, the
strategies and the tests can all reason about.

Definitions (rounds are 0-based here; run records count them from 1):

- Client k has an offset o_k, drawn uniformly from {0, …, S} with the run's seed
  (``generator(seed, "async-shift")``); S = 0 gives the synchronous schedule.
  L = max_k o_k is the lag of the slowest client.
- Client k trains task 0 in rounds [0, R + o_k) and task t ≥ 1 in rounds
  [o_k + t·R, o_k + (t+1)·R): every boundary is delayed by o_k rounds. After its last task
  a client keeps training on it until the run ends.
- ``--lead-rounds`` N adds N to every offset: the first task then lasts N rounds longer
  for everyone (phases of different lengths, e.g. CARLA's 60 urban rounds before a 10-round
  highway phase), and nothing else changes.
- The run has T·R + L rounds, so the slowest client also gets R rounds of the last task.
- **Evaluation**: task t counts as trained, and the global model is evaluated (accuracy
  matrix row t, memory drift, A-GEM-style task-end work of the server), at the end of round
  e_t = (t+1)·R + L − 1: the first round after which *every* client has finished its R rounds
  of task t. Faster clients have by then trained up to L rounds of task t+1, so row t may
  already show some transfer to task t+1 (FWT is therefore optimistic under a shift).
- The **global task** of round g is the t with e_{t−1} < g ≤ e_t (e_{−1} = −1); server-side
  schedules keyed to tasks (IFA's generations, per-task logging) follow it. Task 0 thus
  spans R + L rounds and every later task R rounds.
- A client's own task end (e.g. A-GEM fills its episodic memory) happens after round
  o_k + (t+1)·R − 1 for t < T−1 and after the final round for its last task.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cfl_bench.core.errors import UserError
from cfl_bench.core.seeding import generator


@dataclass(frozen=True)
class TaskClock:
    num_tasks: int
    rounds_per_task: int
    offsets: tuple[int, ...]

    @classmethod
    def draw(
        cls,
        num_tasks: int,
        rounds_per_task: int,
        num_clients: int,
        shift: int,
        seed: int,
        lead: int = 0,
    ) -> TaskClock:
        """The seeded per-client offsets in {0, …, shift}, each plus ``lead``: all clients
        train the first task ``lead`` rounds longer (``--lead-rounds``)."""
        if isinstance(lead, bool) or not isinstance(lead, int) or lead < 0:
            raise UserError(f"--lead-rounds must be an integer >= 0, got {lead!r}")
        if isinstance(shift, bool) or not isinstance(shift, int) or shift < 0:
            raise UserError(f"--async-shift must be an integer >= 0, got {shift!r}")
        if shift == 0:
            return cls(num_tasks, rounds_per_task, (lead,) * num_clients)
        draws = torch.randint(
            0, shift + 1, (num_clients,), generator=generator(seed, "async-shift")
        )
        return cls(num_tasks, rounds_per_task, tuple(lead + int(o) for o in draws.tolist()))

    @property
    def lag(self) -> int:
        return max(self.offsets, default=0)

    @property
    def total_rounds(self) -> int:
        return self.num_tasks * self.rounds_per_task + self.lag

    def client_task(self, client: int, round_: int) -> int:
        """The task client ``client`` trains in 0-based round ``round_``."""
        shifted = (round_ - self.offsets[client]) // self.rounds_per_task
        return min(max(shifted, 0), self.num_tasks - 1)

    def client_task_start(self, client: int, task: int) -> int:
        """The first 0-based round in which client ``client`` trains task ``task``."""
        return 0 if task == 0 else self.offsets[client] + task * self.rounds_per_task

    def eval_round(self, task: int) -> int:
        """The 0-based round after which task ``task`` is evaluated as trained."""
        return (task + 1) * self.rounds_per_task + self.lag - 1

    def task_start(self, task: int) -> int:
        """First 0-based round of global task ``task``."""
        return 0 if task == 0 else self.eval_round(task - 1) + 1

    def global_task(self, round_: int) -> int:
        """The global task of 0-based round ``round_``."""
        for t in range(self.num_tasks):
            if round_ <= self.eval_round(t):
                return t
        return self.num_tasks - 1

    def task_rounds(self, task: int) -> int:
        """How many rounds global task ``task`` spans (R + L for task 0, R afterwards)."""
        return self.eval_round(task) - self.task_start(task) + 1

    def ending_tasks(self, round_: int) -> list[tuple[int, int]]:
        """(client, task) pairs whose client finishes that task at the end of ``round_``."""
        last = round_ == self.total_rounds - 1
        ends = []
        for k in range(len(self.offsets)):
            t = self.client_task(k, round_)
            if last or self.client_task(k, round_ + 1) != t:
                ends.append((k, t))
        return ends

    def describe(self) -> dict[str, object]:
        return {
            "offsets": list(self.offsets),
            "lag": self.lag,
            "total_rounds": self.total_rounds,
            "eval_rounds": [self.eval_round(t) + 1 for t in range(self.num_tasks)],
        }
