"""A Trace Event Format checker (the JSON that Perfetto, chrome://tracing and HTA read), for the export tests.

`problems(trace, strict_tracks)` lists what a viewer would show wrong: a complete ("X") event without a
non-negative duration; a track (pid, tid) whose events are not in time order in the file; two events of a
track that overlap without one enclosing the other (on a `strict_tracks` track: that overlap at all); a flow
("s"/"f" pair) that is not one start and one finish, points backwards in time, or has an end not inside a
slice of its track; a track without a name (``thread_name`` / ``process_name`` metadata).
"""

from __future__ import annotations

from collections import defaultdict

EPS_US = 0.0005  # timestamps are us with ns resolution: ends computed as ts + dur may be off by rounding


def _tracks(events: list[dict]) -> dict[tuple, list[dict]]:
    tracks: dict[tuple, list[dict]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            tracks[e["pid"], e["tid"]].append(e)
    return tracks


def _inside(track: list[dict], ts: float) -> bool:
    return any(e["ts"] - EPS_US <= ts <= e["ts"] + e["dur"] + EPS_US for e in track)


def problems(trace: dict, strict_tracks=lambda pid, tid: True, limit: int = 20) -> list[str]:
    """What is wrong with `trace` (a dict with ``traceEvents``), at most `limit` lines; [] when nothing."""
    events = trace["traceEvents"]
    out: list[str] = []
    tracks = _tracks(events)
    named_threads = {(e["pid"], e["tid"]) for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    named_procs = {e["pid"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    for (pid, tid), track in sorted(tracks.items()):
        if (pid, tid) not in named_threads:
            out.append(f"track ({pid}, {tid}) has no thread_name")
        if pid not in named_procs:
            out.append(f"process {pid} has no process_name")
        bad = [e for e in track if not isinstance(e.get("dur"), (int, float)) or e["dur"] < 0]
        if bad:
            out.append(f"track ({pid}, {tid}): {len(bad)} event(s) without a duration >= 0, e.g. {bad[0]}")
        unsorted = sum(b["ts"] < a["ts"] - EPS_US for a, b in zip(track, track[1:]))
        if unsorted:
            out.append(f"track ({pid}, {tid}): {unsorted} event(s) start before the one listed before them")
        stack: list[float] = []  # ends of the enclosing slices
        strict = strict_tracks(pid, tid)
        for e in sorted(track, key=lambda e: (e["ts"], -e["dur"])):
            start, end = e["ts"], e["ts"] + e["dur"]
            while stack and stack[-1] <= start + EPS_US:
                stack.pop()
            if stack and (strict and e["dur"] > 0 or end > stack[-1] + EPS_US):
                out.append(f"track ({pid}, {tid}): {e['name']} [{start}, {end}] overlaps a slice ending at "
                           f"{stack[-1]}")
                break
            if e["dur"] > 0:
                stack.append(end)
    flows: dict = defaultdict(list)
    for e in events:
        if e.get("ph") in ("s", "f"):
            flows[e["id"]].append(e)
    for fid, pair in sorted(flows.items()):
        phases = sorted(e["ph"] for e in pair)
        if phases != ["f", "s"]:
            out.append(f"flow {fid}: phases {phases}, not one s and one f")
            continue
        s, f = sorted(pair, key=lambda e: e["ph"] != "s")
        if f["ts"] < s["ts"] - EPS_US:
            out.append(f"flow {fid} ({s['name']}): points backwards, {s['ts']} -> {f['ts']}")
        for end in (s, f):
            if not _inside(tracks.get((end["pid"], end["tid"]), []), end["ts"]):
                out.append(f"flow {fid} ({s['name']}): its {end['ph']} at {end['ts']} is inside no slice of "
                           f"track ({end['pid']}, {end['tid']})")
    return out[:limit]
