"""The end-to-end benchmark's numbers: its tables, its metrics and its JSON."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from bench.cpu_split import KINDS
from bench.e2e_bench import CONCURRENCY, RETENTION_SECONDS, E2EResult, RoundResult, SettingResult
from bench.pg_counters import TableFootprint
from bench.stats import fmt, fmt_ratio, percentile, ratio, table
from bench.transaction_kinds import (
    BACKGROUND,
    KNOWN_KINDS,
    SERVES,
    STATEMENT_MICROSECONDS,
    STATEMENTS,
)


def _side(result: SettingResult, side: str) -> tuple[int, float, list[float]]:
    """Tasks, wall seconds and call times of one side over all its rounds."""
    rounds = result.of(side)
    calls = [ms for r in rounds for ms in r.timing.call_ms]
    return sum(r.timing.tasks for r in rounds), sum(r.timing.wall_seconds for r in rounds), calls


def per_second(result: SettingResult, side: str) -> float:
    tasks, wall, _ = _side(result, side)
    return tasks / wall if wall > 0 else math.nan


def _at(result: E2EResult, latency_ms: float) -> SettingResult | None:
    return next((s for s in result.settings if s.setting.latency_ms == latency_ms), None)


def throughput_ratio(result: E2EResult, latency_ms: float = 0.0) -> float:
    """agboss / plain tasks per second at a gateway latency (0 ms: the issue's goal)."""
    setting = _at(result, latency_ms)
    if setting is None:
        return math.nan
    return ratio(per_second(setting, "agboss"), per_second(setting, "plain"))


def outbound_added_p50_ms(result: E2EResult, latency_ms: float = 0.0) -> float:
    """What ``self.outbound`` adds over the direct call at p50, in ms."""
    setting = _at(result, latency_ms)
    if setting is None:
        return math.nan
    return percentile(_side(setting, "agboss")[2], 0.5) - percentile(
        _side(setting, "plain")[2], 0.5
    )


def _agboss_rounds(result: E2EResult) -> list[RoundResult]:
    return [r for s in result.settings for r in s.of("agboss")]


def breakdown(result: E2EResult) -> Counter[str]:
    total: Counter[str] = Counter()
    for r in _agboss_rounds(result):
        total.update(r.kinds)
    return total


def _background(name: str) -> bool:
    """A ``role: kind`` of the breakdown that a process opens on a timer or once."""
    return name.split(": ", 1)[-1] in BACKGROUND


def commits_per_task(result: E2EResult) -> float:
    """Store transactions per agboss task: every transaction the publisher and the workers
    opened (the breakdown), but the kinds opened on a timer or once per process
    (``BACKGROUND``), which a longer run spreads thinner. A kind the breakdown does not
    know counts as the task's. PostgreSQL's own count, background and autovacuum
    included, is printed beside it (``_breakdown_lines``)."""
    rounds = _agboss_rounds(result)
    tasks = sum(r.timing.tasks for r in rounds)
    if tasks == 0:
        return math.nan
    kinds = breakdown(result)
    return sum(count for name, count in kinds.items() if not _background(name)) / tasks


def worker_peak_rss_mb(result: E2EResult) -> float:
    """The largest ``VmHWM`` of any agboss worker process (main or child), MiB."""
    peaks = [s.peak["agboss"].max_kib for s in result.settings if "agboss" in s.peak]
    return max(peaks) / 1024 if peaks else math.nan


def metrics(result: E2EResult) -> dict[str, float]:
    return {
        "commits_per_task": commits_per_task(result),
        **{
            metric: throughput_ratio(result, latency)
            for latency, metric in THROUGHPUT_METRICS.items()
        },
        "outbound_added_p50_ms": outbound_added_p50_ms(result),
        "worker_peak_rss_mb": worker_peak_rss_mb(result),
    }


def _rounds_table(result: E2EResult) -> str:
    rows = []
    for s in result.settings:
        counts = {"plain": 0, "agboss": 0}
        for r in s.rounds:
            counts[r.side] += 1
            t = r.timing
            rows.append(
                [
                    f"{s.setting.latency_ms:g} ms",
                    str(counts[r.side]),
                    r.side,
                    f"{t.tasks}" + ("*" if t.cut_short else ""),
                    fmt(t.wall_seconds, 2),
                    fmt(t.per_second),
                    fmt(percentile(t.call_ms, 0.5), 2),
                    fmt(percentile(t.call_ms, 0.99), 2),
                    "" if r.transactions is None else fmt(r.transactions / max(t.tasks, 1), 2),
                ]
            )
    headers = ["latency", "round", "side", "tasks", "wall s", "tasks/s", "call p50 ms"]
    return table([*headers, "call p99 ms", "txn/task"], rows)


def _summary_lines(result: E2EResult) -> list[str]:
    lines = []
    for s in result.settings:
        plain, agboss = _side(s, "plain"), _side(s, "agboss")
        added = [
            percentile(agboss[2], q) - percentile(plain[2], q) for q in (0.5, 0.99)
        ]  # fmt: skip
        lines.append(
            f"ratio: e2e at {s.setting.latency_ms:g} ms  tasks/s "
            f"{fmt_ratio(ratio(per_second(s, 'agboss'), per_second(s, 'plain')))}"
            f" ({fmt(per_second(s, 'agboss'))} against {fmt(per_second(s, 'plain'))})"
            f"  self.outbound adds {fmt(added[0], 2)} ms at p50, {fmt(added[1], 2)} ms at p99"
            " over the direct call"
        )
    return lines


def _breakdown_lines(result: E2EResult) -> list[str]:
    rounds = _agboss_rounds(result)
    tasks = sum(r.timing.tasks for r in rounds)
    kinds = breakdown(result)
    if tasks == 0:
        return []
    order = {kind.name: i for i, kind in enumerate(KNOWN_KINDS)}

    def flow(name: str) -> tuple[int, str]:
        role, kind = name.split(": ", 1)
        return order.get(kind, len(order)), role

    rows = []
    for name in sorted(kinds, key=flow):
        kind = name.split(": ", 1)[-1]
        count = kinds[name]
        rows.append([name, fmt(count / tasks, 2), str(count), SERVES.get(kind, "? (not known)")])
    counted = sum(kinds.values())
    background = sum(count for name, count in kinds.items() if _background(name))
    lines = [
        f"Store transactions per agboss task ({tasks} tasks in {len(rounds)} rounds), by the "
        "step that opened each (SQLAlchemy begin events, and statements sent as their own "
        "transaction):",
        table(["role: kind", "per task", "total", "guarantee it serves"], rows, left=(0, 3)),
    ]
    lines.append(
        f"per task: {fmt((counted - background) / tasks, 2)} (commits_per_task); the processes' "
        f"background (renewals, sweep watch, held messages, connection set-up, pings): "
        f"{background} in all, not per task"
    )
    if all(r.transactions is not None for r in rounds):
        by_postgres = sum(r.transactions or 0 for r in rounds)
        settled = all(r.settled for r in rounds)
        lines.append(
            f"PostgreSQL counted {by_postgres} transactions on the run's database "
            f"({fmt(by_postgres / tasks, 2)} per task, everything included), the breakdown "
            f"{counted} ({fmt(counted / tasks, 2)}): difference {by_postgres - counted} "
            "(autovacuum, the driver's own queries)"
            + ("" if settled else "; the counters had NOT settled, the count is a guess")
        )
    else:
        lines.append(f"no PostgreSQL counters (SQLite): the breakdown's {counted} is the count")
    return [*lines, ""]


def cpu_ms_per_task(result: SettingResult, side: str) -> dict[str, float]:
    """CPU per task of one side over its rounds, by process kind (ms)."""
    tasks = sum(r.timing.tasks for r in result.of(side))
    spent: dict[str, float] = {}
    for r in result.of(side):
        for kind, seconds in r.cpu_seconds.items():
            spent[kind] = spent.get(kind, 0.0) + seconds
    return {kind: seconds * 1000 / tasks for kind, seconds in spent.items()} if tasks else {}


def statement_ms_per_task(result: SettingResult, role: str = "worker") -> tuple[float, float]:
    """The store statements of ``role`` per agboss task, and their wall time in ms."""
    rounds = result.of("agboss")
    tasks = sum(r.timing.tasks for r in rounds)
    if tasks == 0:
        return math.nan, math.nan
    count = sum(r.timings.get(f"{role}: {STATEMENTS}", 0) for r in rounds)
    spent = sum(r.timings.get(f"{role}: {STATEMENT_MICROSECONDS}", 0) for r in rounds)
    if count == 0:
        return math.nan, math.nan
    return count / tasks, spent / 1000 / tasks


THROUGHPUT_METRICS = {0.0: "throughput_ratio", 50.0: "throughput_ratio_50ms"}


def throughput_target(latency_ms: float) -> float | None:
    """The throughput goal at a gateway latency (``bench.report.GOALS`` holds it)."""
    from bench.report import GOALS  # it imports this module

    metric = THROUGHPUT_METRICS.get(latency_ms)
    return next((goal.target for goal in GOALS if goal.metric == metric), None)


def _statement_lines(result: E2EResult) -> list[str]:
    """What the store's statements cost a task's own time, against the goal's budget."""
    lines = []
    for s in result.settings:
        statements, worker_ms = statement_ms_per_task(s)
        if math.isnan(worker_ms):
            continue
        plain = per_second(s, "plain")
        # -c 2 per worker: each process spends CONCURRENCY / rate seconds per task.
        plain_ms = CONCURRENCY / plain * 1000 if plain > 0 else math.nan
        published, publisher_ms = statement_ms_per_task(s, "publisher")
        line = (
            f"store at {s.setting.latency_ms:g} ms: the worker waits {fmt(worker_ms, 2)} ms per "
            f"task on {fmt(statements, 2)} statements (the publisher {fmt(publisher_ms, 2)} ms "
            f"on {fmt(published, 2)}); a plain task takes {fmt(plain_ms, 1)} ms of a worker "
            "process"
        )
        target = throughput_target(s.setting.latency_ms)
        if target is not None:
            line += (
                f", so {target:g}x leaves {fmt(plain_ms / target - plain_ms, 2)} ms for all "
                "that protection adds to it"
            )
        lines.append(line)
    return [*lines, ""] if lines else []


def _cpu_lines(result: E2EResult) -> list[str]:
    rows = []
    for s in result.settings:
        plain, agboss = cpu_ms_per_task(s, "plain"), cpu_ms_per_task(s, "agboss")
        if not plain and not agboss:
            continue
        present = [k for k in KINDS if k in plain or k in agboss]
        others = sorted((set(plain) | set(agboss)) - set(KINDS))
        for kind in [*present, *others, "all"]:
            mine = sum(agboss.values()) if kind == "all" else agboss.get(kind, 0.0)
            theirs = sum(plain.values()) if kind == "all" else plain.get(kind, 0.0)
            rows.append(
                [f"{s.setting.latency_ms:g} ms", kind, fmt(theirs, 2), fmt(mine, 2),
                 fmt(mine - theirs, 2)]
            )  # fmt: skip
    if not rows:
        return []
    return [
        "CPU per task by process (user + system from /proc, over each side's timed rounds; "
        "2 cores shared by all of them):",
        table(["latency", "process", "plain ms", "agboss ms", "added ms"], rows, left=(1,)),
        "",
    ]


def _memory_lines(result: E2EResult) -> list[str]:
    rows = []
    for s in result.settings:
        for side in ("plain", "agboss"):
            peak = s.peak.get(side)
            if peak is not None:
                rows.append(
                    [
                        f"{s.setting.latency_ms:g} ms",
                        side,
                        fmt(peak.main_kib / 1024),
                        fmt(peak.max_child_kib / 1024),
                        str(peak.children),
                    ]
                )
    headers = ["latency", "side", "main MiB", "max child MiB", "children"]
    return ["Peak resident memory (VmHWM) per worker process:", table(headers, rows), ""]


def _footprint_lines(result: E2EResult) -> list[str]:
    if not result.retained or result.payments == 0:
        return []
    after = {t.table: t for t in result.after_retention}
    n = result.payments
    rows = [
        [
            t.table,
            str(t.rows),
            fmt(t.rows / n, 2),
            fmt(t.bytes / n, 0),
            str(after[t.table].rows) if t.table in after else "?",
        ]
        for t in result.retained
    ]
    total = TableFootprint(
        "all", sum(t.rows for t in result.retained), sum(t.bytes for t in result.retained)
    )
    left = sum(t.rows for t in result.after_retention)
    rows.append(
        [total.table, str(total.rows), fmt(total.rows / n, 2), fmt(total.bytes / n, 0), str(left)]
    )
    return [
        f"Store footprint for {n} payments while retained (bytes: pg_total_relation_size, "
        "indexes included), and rows left after the retention sweep:",
        table(["table", "rows", "rows/payment", "bytes/payment", "rows after"], rows),
        f"retention sweep (retention {RETENTION_SECONDS:g} s instead of 7 days): "
        + result.retention_note,
        "",
    ]


def section(result: E2EResult) -> list[str]:
    return [
        "End-to-end: prefork -c 2 workers, Redis broker + result backend, store on "
        f"{result.backend}; plain = a task making the HTTP call,",
        "agboss = a PaymentTask making it through one self.outbound; rounds alternate "
        "plain/agboss; wall: a round's first publish to its last result",
        "(* = the round's time budget ended it before all its tasks were published)",
        _rounds_table(result),
        *_summary_lines(result),
        "",
        *_breakdown_lines(result),
        *_statement_lines(result),
        *_cpu_lines(result),
        *_memory_lines(result),
        *_footprint_lines(result),
    ]


def _clean(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 4)


def as_json(result: E2EResult) -> dict[str, Any]:
    return {
        "backend": result.backend,
        "settings": [
            {
                "latency_ms": s.setting.latency_ms,
                "rounds": [
                    {
                        "side": r.side,
                        "tasks": r.timing.tasks,
                        "planned": r.timing.planned,
                        "wall_seconds": _clean(r.timing.wall_seconds),
                        "per_second": _clean(r.timing.per_second),
                        "call_p50_ms": _clean(percentile(r.timing.call_ms, 0.5)),
                        "call_p99_ms": _clean(percentile(r.timing.call_ms, 0.99)),
                        "transactions": r.transactions,
                        "kinds": dict(r.kinds),
                        "cpu_seconds": {k: round(v, 4) for k, v in r.cpu_seconds.items()},
                        "timings": dict(r.timings),
                    }
                    for r in s.rounds
                ],
                "peak_kib": {
                    side: {"main": p.main_kib, "max_child": p.max_child_kib}
                    for side, p in s.peak.items()
                },
            }
            for s in result.settings
        ],
        "payments": result.payments,
        "retained": [t.__dict__ for t in result.retained],
        "after_retention": [t.__dict__ for t in result.after_retention],
        "retention_note": result.retention_note,
        "metrics": {k: _clean(v) for k, v in metrics(result).items()},
    }


__all__ = [
    "as_json",
    "breakdown",
    "commits_per_task",
    "cpu_ms_per_task",
    "metrics",
    "outbound_added_p50_ms",
    "section",
    "statement_ms_per_task",
    "throughput_ratio",
]
