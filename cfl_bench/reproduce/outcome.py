"""A reproduction: a table's cells with the paper's numbers, ours and their verdicts.

:func:`build` joins a table (:mod:`cfl_bench.reproduce.tables`) with the runs sorted into its
cells (:mod:`cfl_bench.reproduce.collect`) and judges them (:mod:`cfl_bench.reproduce.verdict`);
the writers (:mod:`cfl_bench.reproduce.report`) only format the result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cfl_bench.reproduce.collect import Collected
from cfl_bench.reproduce.tables import ReproTable
from cfl_bench.reproduce.verdict import (
    Cell,
    CellVerdict,
    ClaimResult,
    Ours,
    counts,
    judge_cells,
    judge_claims,
    kendall_tau,
    table_claims,
)


@dataclass
class Reproduction:
    table: ReproTable
    scale: str
    source: str
    verdicts: list[CellVerdict]
    claims: list[ClaimResult]
    taus: dict[str, float | None]
    notes: list[str]
    # Shipped reference results by (row, column), when the user's runs are compared to them.
    reference: dict[tuple[str, str], Ours | None] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    # Methods that are no row of the table, run on its protocol: strategy → column → values
    # (``collect``, "Other methods"); shown beside the table, never judged.
    others: dict[str, dict[str, Ours]] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return counts(self.verdicts)

    def column_verdicts(self, column: str) -> list[CellVerdict]:
        return [v for v in self.verdicts if v.cell.column == column]

    def claim_counts(self) -> tuple[int, int]:
        """(claims that hold, claims with both cells run)."""
        judged = [c for c in self.claims if c.holds is not None]
        return sum(bool(c.holds) for c in judged), len(judged)


def ours_of(collected: Collected, row: str, column: str) -> Ours | None:
    values = collected.values(row, column)
    if not values:
        return None
    ordered = sorted(values, key=lambda v: v.seed)
    return Ours(tuple(v.value for v in ordered), tuple(v.seed for v in ordered))


def build(
    table: ReproTable,
    collected: Collected,
    scale: str,
    source: str,
    reference: Collected | None = None,
    provenance: dict[str, Any] | None = None,
) -> Reproduction:
    """Judge every cell of ``table`` from ``collected``; ``reference`` (shipped results)
    only adds a column to compare with."""
    cells = [
        Cell(
            row.label,
            column.label,
            float(table.target(row, column).value or 0.0),
            table.target(row, column).pm,
            ours_of(collected, row.label, column.label),
        )
        for column in table.columns
        for row in table.rows
    ]
    claims = judge_claims(
        cells,
        table_claims(
            [c.label for c in table.columns],
            [r.label for r in table.rows],
            table.claims.pairs,
            table.claims.upper_bound,
        ),
    )
    taus = {}
    for column in table.columns:
        done = [c for c in cells if c.column == column.label and c.ours is not None]
        taus[column.label] = kendall_tau(
            [c.paper for c in done], [c.ours.mean for c in done if c.ours is not None]
        )
    shipped = {}
    if reference is not None:
        shipped = {(c.row, c.column): ours_of(reference, c.row, c.column) for c in cells}
    return Reproduction(
        table=table,
        scale=scale,
        source=source,
        verdicts=judge_cells(cells, claims),
        claims=claims,
        taus=taus,
        notes=list(collected.notes),
        reference=shipped,
        provenance=provenance or {},
        others=other_methods(collected),
    )


def other_methods(collected: Collected) -> dict[str, dict[str, Ours]]:
    """The other methods' values by strategy and column, seeds in order."""
    found: dict[str, dict[str, Ours]] = {}
    for (strategy, column), values in sorted(collected.others.items()):
        ordered = sorted(values, key=lambda v: v.seed)
        found.setdefault(strategy, {})[column] = Ours(
            tuple(v.value for v in ordered), tuple(v.seed for v in ordered)
        )
    return found
