"""The views `prism sql` derives from the artifacts' views: the questions users ask, answered without joins.

Each is created when the views it reads exist (`derived`); no column is named after an SQL keyword (the
artifacts' own are not either: ``group_name``, ``group_desc``, never ``group`` / ``desc``):

- ``capture.group_labels``: group_name (torch's name of the process group), group_desc (the program's
  ``group_desc``), group_label (its description and ranks, ``tp[0,1]``), size, members;
- ``calibrated.events``: the calibrated timeline joined with the graph's events (kind, op, group_name and its
  group_label, peer, stream, iteration, microbatch, comm, bytes), the rank's coordinates (tp, pp, dp, ep),
  and ``idle_ns``: the part of a wait beyond its own duration (the durations the calibration swept: ``slices_timed/`` when the job has it,
  else ``slices/``), the time the rank was blocked on others (the report's idle); NULL without slice runs;
- ``calibrated.idle``: per rank and iteration, its pipeline stage, rank class (``slices/plan.parquet``), idle
  and the iteration's span on that rank;
- ``baseline.iterations``: the baseline's (the real run's) iterations as ``calibrated.iterations`` has them
  (rank, iteration, start_ns, end_ns, duration_ns; ns from the run's first event; iteration k of a rank ends
  with its k-th ``iteration_end`` marker and starts where the previous one ended, or at its first event).

``calibrated.critical_path`` (the artifact), ``emulation.iterations`` (``source``: 'computed', 'sandbox'),
``emulation.figures`` (the emulation's iteration times, `prism.emulate.results`) and ``emulation.delays`` (its own
delay per op kind of the sandbox's real exchanges, `prism.emulate.delays`) are artifacts' own views.
"""

from __future__ import annotations

from typing import Callable

GROUP_LABELS = """
SELECT group_name, group_desc,
       coalesce(group_desc, 'group ' || group_name) || '[' || array_to_string(list_sort(members), ',') || ']'
           AS group_label,
       size, members
FROM capture.groups
"""


def _calibrated_events(have: set[str]) -> str:
    durations = next((f"{s}.durations" for s in ("slices_timed", "slices") if f"{s}.durations" in have), None)
    idle = ("CASE WHEN e.kind = 'wait' THEN greatest(0, (t.end_ns - t.start_ns) - d.duration_ns) ELSE 0 END"
            if durations else "CAST(NULL AS BIGINT)")
    join = f"LEFT JOIN {durations} d ON d.event_id = t.event_id" if durations else ""
    return f"""
SELECT t.rank, t.seq, t.event_id, e.kind, e.op, e.group_name, g.group_label, e.peer, e.stream,
       e.iteration, e.microbatch, e.comm_id, e.op_event_id, e.bytes, r.tp, r.pp, r.dp, r.ep,
       t.start_ns, t.end_ns, t.end_ns - t.start_ns AS duration_ns, {idle} AS idle_ns
FROM calibrated.timeline t
JOIN capture.events e ON e.event_id = t.event_id
LEFT JOIN capture.ranks r ON r.rank = t.rank
LEFT JOIN capture.group_labels g ON g.group_name = e.group_name
{join}
"""


def _calibrated_idle(have: set[str]) -> str:
    plan = "slices.plan" in have
    return f"""
SELECT e.rank, e.iteration, any_value(e.pp) AS pp, {"any_value(p.rank_class)" if plan else "CAST(NULL AS VARCHAR)"}
       AS rank_class, sum(e.idle_ns) AS idle_ns, max(e.end_ns) - min(e.start_ns) AS span_ns
FROM calibrated.events e {"LEFT JOIN slices.plan p ON p.rank = e.rank" if plan else ""}
GROUP BY e.rank, e.iteration
"""


BASELINE_ITERATIONS = """
WITH t0 AS (SELECT min(t_start_ns) AS t0 FROM baseline.events),
     firsts AS (SELECT rank, min(t_start_ns) AS first_ns FROM baseline.events GROUP BY rank),
     ends AS (SELECT rank, iteration, t_end_ns,
                     coalesce(lag(t_end_ns) OVER (PARTITION BY rank ORDER BY iteration), first_ns) AS t_start_ns
              FROM baseline.events JOIN firsts USING (rank)
              WHERE kind = 'marker' AND op = 'iteration_end')
SELECT rank, iteration, t_start_ns - t0 AS start_ns, t_end_ns - t0 AS end_ns, t_end_ns - t_start_ns AS duration_ns
FROM ends, t0
"""

# (schema, name, the views it needs, its SELECT given the views there are), in creation order
DERIVED: list[tuple[str, str, tuple[str, ...], Callable[[set[str]], str]]] = [
    ("capture", "group_labels", ("capture.groups",), lambda have: GROUP_LABELS),
    ("calibrated", "events", ("calibrated.timeline", "capture.events", "capture.ranks", "capture.group_labels"),
     _calibrated_events),
    ("calibrated", "idle", ("calibrated.events",), _calibrated_idle),
    ("baseline", "iterations", ("baseline.events",), lambda have: BASELINE_ITERATIONS),
]


def derived(have: set[str]) -> list[tuple[str, str, str]]:
    """(schema, name, SELECT) of every derived view whose inputs are among `have` (qualified view names),
    in creation order; a view is left out when an artifact's view of the same name exists."""
    have = set(have)
    out = []
    for schema, name, needs, select in DERIVED:
        qualified = f"{schema}.{name}"
        if qualified in have or not all(n in have for n in needs):
            continue
        out.append((schema, name, select(have)))
        have.add(qualified)
    return out


__all__ = ["DERIVED", "derived"]
