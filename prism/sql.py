"""`prism sql`: query a job's artifacts with DuckDB, one view per Parquet artifact.

Views: ``<stage>/<name>.parquet`` -> ``<name>`` (``graph/events.parquet`` -> ``events``); a Hive-partitioned
folder ``<stage>/<key>=*/<name>.parquet`` -> ``<stage>_<name>`` (with the partition column). When several
stages write the same name, each gets ``<stage>_<name>`` and the plain name goes to the earliest stage of
the pipeline (graph before calibrated before emulation ...). Raw Arrow streams are not exposed.

``write_catalog(job_dir)`` saves the same views in ``job_dir/prism.duckdb``. DuckDB resolves a relative
path in a view against the process's working directory, not the database file, so the catalog holds
absolute paths: after moving the job folder, write it again (``prism sql --job DIR --write-catalog``).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import duckdb

DEFAULT_JOB = Path("results/default")
CATALOG = "prism.duckdb"
# Which stage keeps the plain view name when several stages write the same artifact name.
STAGE_ORDER = ("graph", "slices", "calibrated", "emulation", "baseline", "capture", "report")


class SqlError(Exception):
    """A user-facing error of `prism sql` (missing job, no artifacts)."""


@dataclass(frozen=True)
class View:
    name: str
    path: Path  # a file, or a glob over Hive partitions
    hive: bool


def _stage_rank(stage: str) -> tuple[int, str]:
    return (STAGE_ORDER.index(stage) if stage in STAGE_ORDER else len(STAGE_ORDER), stage)


def discover(job_dir: str | Path) -> list[View]:
    """The views of every Parquet artifact under `job_dir` (hidden and temp files skipped)."""
    job_dir = Path(job_dir)
    plain: dict[str, list[tuple[str, Path]]] = {}  # name -> [(stage, path)]
    hive: dict[tuple[str, tuple[str, ...], str], Path] = {}
    for path in sorted(job_dir.rglob("*.parquet")):
        rel = path.relative_to(job_dir)
        if any(part.startswith(".") for part in rel.parts):
            continue
        parts, name = rel.parts[:-1], path.stem
        if len(parts) <= 1:
            plain.setdefault(name, []).append((parts[0] if parts else "", path))
        elif all("=" in part for part in parts[1:]):
            keys = tuple(part.split("=", 1)[0] for part in parts[1:])
            hive[parts[0], keys, name] = job_dir / parts[0] / Path(*(f"{k}=*" for k in keys)) / f"{name}.parquet"
    views: list[View] = []
    for name, entries in plain.items():
        entries.sort(key=lambda entry: _stage_rank(entry[0]))
        views.append(View(name, entries[0][1], False))
        if len(entries) > 1:
            views += [View(f"{stage}_{name}" if stage else name, path, False) for stage, path in entries]
    taken = {view.name for view in views}
    for (stage, keys, name), pattern in hive.items():
        view = f"{stage}_{name}"
        if view in taken:
            view = f"{stage}_{'_'.join(keys)}_{name}"
        views.append(View(view, pattern, True))
        taken.add(view)
    unique: dict[str, View] = {}
    for view in views:
        unique.setdefault(view.name, view)
    return sorted(unique.values(), key=lambda view: view.name)


def _quote(value: str, mark: str) -> str:
    return mark + value.replace(mark, mark + mark) + mark


def create_views(con: duckdb.DuckDBPyConnection, views: list[View]) -> None:
    for view in views:
        options = ", hive_partitioning = true" if view.hive else ""
        name, path = _quote(view.name, '"'), _quote(str(view.path), "'")
        con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM read_parquet({path}{options})")


def _views_or_fail(job_dir: Path) -> list[View]:
    hint = "run the pipeline first (`make demo` or `prism run`), or pass --job / set PRISM_JOB"
    if not job_dir.is_dir():
        raise SqlError(f"{job_dir}: no such job folder; {hint}")
    views = discover(job_dir.resolve())
    if not views:
        raise SqlError(f"{job_dir}: no Parquet artifacts; {hint}")
    return views


def connect(job_dir: str | Path) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with one view per artifact of `job_dir`."""
    con = duckdb.connect()
    create_views(con, _views_or_fail(Path(job_dir)))
    return con


def write_catalog(job_dir: str | Path) -> Path:
    """Write ``job_dir/prism.duckdb`` with the views (absolute paths), atomically; return its path."""
    job_dir = Path(job_dir)
    views = _views_or_fail(job_dir)
    final = job_dir / CATALOG
    temp = job_dir / f".{CATALOG}.tmp-{os.getpid()}"
    temp.unlink(missing_ok=True)
    try:
        con = duckdb.connect(str(temp))
        try:
            create_views(con, views)
        finally:
            con.close()
        os.replace(temp, final)
    finally:
        temp.unlink(missing_ok=True)
        Path(f"{temp}.wal").unlink(missing_ok=True)
    return final


def _cell(value) -> str:
    return "NULL" if value is None else str(value)


def format_table(columns: list[str], rows: list[tuple]) -> str:
    """An aligned text table: numbers right-aligned, everything else left-aligned."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    numeric = [
        bool(rows) and all(isinstance(row[i], (int, float)) or row[i] is None for row in rows)
        for i in range(len(columns))
    ]

    def line(values: list[str]) -> str:
        return "  ".join(
            v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)
        ).rstrip()

    out = [line(list(columns)), "  ".join("-" * w for w in widths)]
    out += [line(row) for row in cells]
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out)


def run_query(job_dir: str | Path, query: str) -> tuple[list[str], list[tuple]]:
    """Column names and rows of `query` over the job's views."""
    con = connect(job_dir)
    try:
        result = con.execute(query)
        if result.description is None:
            return [], []
        return [d[0] for d in result.description], result.fetchall()
    finally:
        con.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prism sql", description=__doc__.split("\n\n")[0])
    parser.add_argument("query", nargs="?", help='SQL, e.g. "SELECT kind, count(*) FROM events GROUP BY 1"')
    parser.add_argument("--job", type=Path, help="job folder (default: $PRISM_JOB, else results/default)")
    parser.add_argument("--csv", action="store_true", help="print CSV instead of an aligned table")
    parser.add_argument("--write-catalog", action="store_true", help=f"write JOB/{CATALOG} with the views")
    args = parser.parse_args(argv)
    job_dir = args.job or Path(os.environ.get("PRISM_JOB") or DEFAULT_JOB)
    if args.query is None and not args.write_catalog:
        parser.error("give a query (or --write-catalog)")
    try:
        if args.write_catalog:
            print(f"prism sql: wrote {write_catalog(job_dir)}", file=sys.stderr)
        if args.query is None:
            return 0
        columns, rows = run_query(job_dir, args.query)
    except SqlError as exc:
        print(f"prism sql: error: {exc}", file=sys.stderr)
        return 2
    except duckdb.Error as exc:
        print(f"prism sql: {exc}", file=sys.stderr)
        return 2
    if not columns:
        return 0
    if args.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(["" if v is None else v for v in row] for row in rows)
    else:
        print(format_table(columns, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
