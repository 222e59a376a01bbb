"""How the cost estimate prices a task end's data-free synthesis (``ExtraWork.task_end_server``)
for TARGET and LANDER: the schedule counted in steps of three kinds, each kind timed once.

Why kinds: a round's cost depends on where it stands in the schedule. A generator step
with the adversarial term also forwards and back-propagates the student (1.6 times a plain
step for LANDER's ResNet-18, ``bench/lander_synthesis_cost.py``), and the rounds from
``warmup`` on add the student's KD steps. Timing the schedule's first round alone priced
LANDER's task end at half its measured cost. Why steps, not rounds: one LANDER round is 40
generator steps on 256 images (about 17 minutes on one CPU thread), and the probe times
each unit three times; a step of each kind is the same information in seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cfl_bench.strategies.base import TaskEndWork

#: Whether a round (1-based, as the codes count ``ep``) has the property.
RoundTest = Callable[[int], bool]


@dataclass(frozen=True)
class StepCounts:
    """A task end's steps by kind: generator steps without and with the adversarial term,
    and the KD student's steps."""

    plain: int
    adversarial: int
    kd: int


def count_steps(
    rounds: int, steps: tuple[int, int], adversarial: RoundTest, distils: RoundTest
) -> StepCounts:
    """The steps of ``rounds`` rounds of ``steps`` = (generator steps, KD steps) each;
    ``adversarial`` tells the rounds whose generator steps have the adversarial term,
    ``distils`` the rounds followed by KD steps."""
    g_steps, kd_steps = steps
    with_adversary = sum(1 for ep in range(1, rounds + 1) if adversarial(ep))
    distilling = sum(1 for ep in range(1, rounds + 1) if distils(ep))
    return StepCounts(
        plain=(rounds - with_adversary) * g_steps,
        adversarial=with_adversary * g_steps,
        kd=distilling * kd_steps,
    )


def priced(
    counts: StepCounts,
    plain: Callable[[], object],
    adversarial: Callable[[], object],
    kd: Callable[[], object],
) -> TaskEndWork:
    """The kinds of work with at least one step, each with one step's callable."""
    kinds = ((counts.plain, plain), (counts.adversarial, adversarial), (counts.kd, kd))
    return tuple((float(n), unit) for n, unit in kinds if n)
