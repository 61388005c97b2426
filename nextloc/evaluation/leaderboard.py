"""One leaderboard, three renderings: the training parent run's description and the run summary (Markdown),
and the terminal tables of ``nextloc train`` / ``nextloc compare`` (rich).

:func:`leaderboard` aggregates the runs' results into a board (per model kind the mean, standard deviation
and count over seeds of every result key, :func:`summarise`); :func:`build_leaderboard` turns a board and
the champion decisions into rows, best test place Acc@1 first. The renderers only lay the rows out: they
share the metric families and the cell format (:func:`format_summary`) and keep their own titles, which the
surfaces have always shown. A champion decision is told by one sentence (:func:`decision_text`), the same on
every surface. Pure aggregation: no torch (the train flow builds the board on every run, cached or not).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from nextloc.evaluation.metrics import (
    DEDUP_KEYS,
    HEADLINE,
    NEW_PLACE_KEYS,
    PLACE_KEYS,
    REFERENCE_KEYS,
    RESULT_KEYS,
)

#: ``{"mean": ..., "std": ..., "n": ...}`` of one metric over seeds (:func:`summarise`)
Summary = Mapping[str, float]
#: model kind -> result key -> summary (:func:`leaderboard`)
Board = Mapping[str, Mapping[str, Summary]]

#: the metric families of the full tables (run summary, terminal), in the order they are shown
FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("place", PLACE_KEYS),
    ("new_place", NEW_PLACE_KEYS),
    ("reference", REFERENCE_KEYS),
)
#: the short table of the parent run's description
DESCRIPTION_KEYS = (HEADLINE, "place_mrr", "acc@1", "mrr")
SUMMARY_TITLES = {
    "place": "Place metrics (%): real places only; a new place is a miss",
    "new_place": "P(new place): share of new targets (%), ROC-AUC (%), Brier",
    "reference": "Reference protocol metrics (%): classes 0 and 1 ranked too (for published comparisons)",
}
TERMINAL_TITLES = {
    "place": "place metrics (%): real places only, a new place is a miss",
    "new_place": "P(new place): share of new targets, ROC-AUC (%), Brier",
    "reference": "reference protocol metrics (%): classes 0 and 1 ranked too",
}


def summarise(values: Sequence[float]) -> dict[str, float]:
    """Mean, sample standard deviation (0 for one value) and count of a metric over seeds (NaNs ignored)."""
    array = np.asarray(values, dtype=float)
    array = array[~np.isnan(array)]
    return {
        "mean": float(array.mean()) if len(array) else float("nan"),
        "std": float(array.std(ddof=1)) if len(array) > 1 else 0.0,
        "n": int(len(array)),
    }


def leaderboard(rows: Sequence[tuple[str, Mapping[str, float]]]) -> dict[str, dict[str, dict[str, float]]]:
    """Mean +- std over seeds of every result key, per model kind (kinds in first-seen order).

    Args:
        rows: ``(kind, results)`` per trained run; ``results`` holds :data:`nextloc.evaluation.metrics.RESULT_KEYS`, and
            the metrics without copied test samples (:data:`DEDUP_KEYS`), which the board then holds too.
    """
    keys = (*RESULT_KEYS, *(k for k in DEDUP_KEYS if any(k in results for _, results in rows)))
    board: dict[str, dict[str, dict[str, float]]] = {}
    for kind in dict.fromkeys(kind for kind, _ in rows):
        runs = [results for k, results in rows if k == kind]
        board[kind] = {key: summarise([r.get(key, float("nan")) for r in runs]) for key in keys}
    return board


def format_summary(summary: Mapping[str, float] | None, sep: str = " ± ") -> str:
    """``mean ± std`` (3 decimals below 1, e.g. a Brier score; 2 otherwise), or ``-`` without a value.

    Examples:
        >>> format_summary({"mean": 43.4912, "std": 0.5, "n": 5})
        '43.49 ± 0.50'
    """
    if not summary or summary["mean"] != summary["mean"]:
        return "-"
    digits = 3 if abs(summary["mean"]) < 1 else 2
    return f"{summary['mean']:.{digits}f}{sep}{summary['std']:.{digits}f}"


def rank_board(board: Mapping[str, Mapping[str, Mapping[str, float]]], key: str) -> list[str]:
    """Model kinds by descending mean of ``key`` (NaN last)."""
    return sorted(board, key=lambda kind: -np.nan_to_num(board[kind][key]["mean"], nan=-np.inf))


@dataclass(frozen=True)
class Row:
    """One model kind: its seeds (the count of the headline metric) and every metric's summary."""

    kind: str
    seeds: int
    metrics: Mapping[str, Summary]

    def cell(self, key: str, sep: str = " ± ") -> str:
        """``mean ± std`` of one metric, ``-`` without a value."""
        return format_summary(self.metrics.get(key), sep)


@dataclass(frozen=True)
class Champion:
    """The champion decision of one model kind: its registered model, the decision's sentence
    (:func:`decision_text`) and the mean difference per user group (``{group: {"n", "delta"}}``)."""

    registered_name: str
    decision: str
    groups: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        """``promoted`` or ``kept``: the sentence up to its first colon."""
        return self.decision.partition(": ")[0]

    @property
    def detail(self) -> str:
        """The sentence after its verdict."""
        return self.decision.partition(": ")[2]


@dataclass(frozen=True)
class Leaderboard:
    """Rows best test place Acc@1 first (NaN last), and the champion decisions in the order made."""

    rows: tuple[Row, ...]
    champions: tuple[Champion, ...] = ()


def decision_text(registered_name: str, decision: Mapping[str, Any]) -> str:
    """One sentence for a champion decision, the same on the parent run, the challenger's run, its registry
    version, in ``leaderboard.json`` and on every leaderboard:
    ``promoted: v2 (seed 1) is the champion of nextloc-mhsa (...)``."""
    version = decision.get("challenger_version")
    if not version:
        return f"kept: {decision.get('reason', '')}"
    seed = decision.get("challenger_seed")
    who = f"v{version}" + (f" (seed {seed})" if seed is not None else "")
    if decision.get("promoted"):
        return f"promoted: {who} is the champion of {registered_name} ({decision.get('reason', '')})"
    holder = decision.get("champion_version", version)
    if holder == version:
        return f"kept: {who} already is the champion of {registered_name} ({decision.get('reason', '')})"
    reason = decision.get("reason", "")
    return f"kept: v{holder} stays the champion of {registered_name}; challenger {who}: {reason}"


def champions(
    decisions: Mapping[str, Mapping[str, Any]], registered_name: Callable[[str], str]
) -> tuple[Champion, ...]:
    """The champion decisions per model kind (as :func:`tasks.promotion.champion_challenger` returns them);
    a decision without its sentence gets one."""
    marks = []
    for kind, decision in decisions.items():
        name = registered_name(kind)
        text = decision.get("decision") or decision_text(name, decision)
        marks.append(Champion(name, text, decision.get("groups") or {}))
    return tuple(marks)


def build_leaderboard(board: Board, champions: Sequence[Champion] = ()) -> Leaderboard:
    """The rows of ``board``, best test place Acc@1 first, with the champion decisions."""
    rows = tuple(
        Row(kind, int(board[kind][HEADLINE]["n"]), board[kind]) for kind in rank_board(board, HEADLINE)
    )
    return Leaderboard(rows, tuple(champions))


# --------------------------------------------------------------------------- #
# Markdown
# --------------------------------------------------------------------------- #


def markdown_table(board: Leaderboard, keys: Sequence[str]) -> list[str]:
    """A Markdown table: model, seeds, then ``mean ± std`` of each key."""
    lines = ["| model | seeds | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
    for row in board.rows:
        lines.append(f"| {row.kind} | {row.seeds} | " + " | ".join(row.cell(key) for key in keys) + " |")
    return lines


def description_markdown(board: Leaderboard, preface: str = "") -> str:
    """The training parent run's description: the short test leaderboard, the champion decisions, then
    ``preface`` (the Prefect links)."""
    lines = [
        "**Test leaderboard**, mean ± std over seeds (%; metrics `<kind>.test_<metric>_mean` / `_std`)",
        "",
        *markdown_table(board, DESCRIPTION_KEYS),
    ]
    if board.champions:
        lines += ["", "**Champions** (`champion` alias):", ""]
        lines += [f"- `{mark.registered_name}`: {mark.decision}" for mark in board.champions]
    if preface:
        lines += ["", preface]
    return "\n".join(lines)


def summary_tables_markdown(board: Leaderboard) -> list[str]:
    """The run summary's tables: one per metric family, each followed by an empty line."""
    lines: list[str] = []
    for family, keys in FAMILIES:
        lines += [f"**{SUMMARY_TITLES[family]}**, test split, mean ± std over seeds", ""]
        lines += [*markdown_table(board, keys), ""]
    return lines


def summary_champions_markdown(board: Leaderboard) -> list[str]:
    """The run summary's champion decisions, verdict in bold, with the difference per user group."""
    if not board.champions:
        return []
    lines = ["", "Champion (`champion` alias; the one champion rule, see the README):", ""]
    for mark in board.champions:
        lines.append(f"- `{mark.registered_name}`: **{mark.verdict}**: {mark.detail}")
        for group, values in mark.groups.items():
            lines.append(f"  - users {group}: {values['n']} samples, delta {values['delta']:+.2f}")
    return lines


# --------------------------------------------------------------------------- #
# terminal
# --------------------------------------------------------------------------- #


def terminal_tables(board: Leaderboard, caption: str) -> list[Table]:
    """One rich table per metric family, ``mean +- std`` cells, ``caption`` under each."""
    tables = []
    for family, keys in FAMILIES:
        table = Table(title=f"test {TERMINAL_TITLES[family]}, mean +- std over seeds", caption=caption)
        table.add_column("model", no_wrap=True)
        table.add_column("seeds", justify="right")
        for key in keys:
            table.add_column(key, justify="right", no_wrap=True)
        for row in board.rows:
            table.add_row(row.kind, str(row.seeds), *(row.cell(key, " +- ") for key in keys))
        tables.append(table)
    return tables


def print_terminal(board: Leaderboard, caption: str, console: Console | None = None) -> None:
    """Print the terminal tables, at least 150 columns wide so that no metric column wraps."""
    console = console or Console(width=max(150, Console().width))
    for table in terminal_tables(board, caption):
        console.print(table)
