"""`prism sql`: read-only DuckDB queries over a job's artifacts, one view per Parquet artifact.

Views, unqualified (kept for compatibility): ``<stage>/<name>.parquet`` -> ``<name>`` (``graph/events.parquet``
-> ``events``); a Hive-partitioned folder ``<stage>/<key>=*/<name>.parquet`` -> ``<stage>_<name>`` (with the
partition column). When several stages write the same name, the plain name goes to the earliest stage of the
pipeline (graph before calibrated before emulation ...) and each later one gets ``<stage>_<name>``: one view
per artifact, never two. Raw Arrow streams
are not exposed.

Side by side, one DuckDB schema per part of the job, so one query compares prediction and truth:
``capture`` (the capture's graph tables: ``capture.events``, ``capture.comms`` ...), ``baseline`` (the real
run's graph tables, ``baseline/graph/``), ``slices`` (``plan``, ``durations``, ``transfers``, and ``events``
over ``slice=K``), ``calibrated`` (``timeline``, ``iterations``), ``emulation``: a schema exists when its
stage has written something.

It is a query command: only read-only statements (SELECT, WITH, FROM, VALUES, DESCRIBE, SHOW, SUMMARIZE)
run; file access is limited to the job folder (DuckDB's ``allowed_directories`` with
``enable_external_access`` off, extension auto-loading off, the configuration locked). DuckDB opens a
database file, not an in-memory one, read-only; the statement check is what keeps the session read-only.
An artifact that cannot be read is reported and its view left out; the others stay queryable.

``write_catalog(job_dir)`` saves the same views in ``job_dir/prism.duckdb``, naming the files relative to the
job folder, so that a moved or copied folder reads its own files. DuckDB resolves a relative path against the
process's working directory (or its ``file_search_path``), not the database file: open the catalog from the
job folder (``cd results/tiny && duckdb prism.duckdb``), or ``SET file_search_path = 'results/tiny'`` first.

Besides one view per artifact, `prism.sql_views` derives the views users ask for: ``calibrated.events``
(the timeline with each event's kind, op, group name and label, rank coordinates, idle), ``calibrated.idle``
(per rank and iteration, with its pipeline stage and rank class), ``baseline.iterations``,
``capture.group_labels``.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import signal
import socket
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import duckdb

from prism import folder_lock
from prism import artifacts, job_paths, settings, sql_views

DEFAULT_JOB = Path("results/default")
CATALOG = "prism.duckdb"
# Which stage keeps the plain view name when several stages write the same artifact name.
STAGE_ORDER = ("graph", "slices", "calibrated", "emulation", "baseline", "capture", "report")
# The DuckDB schema of a stage's folder: the graph tables are the capture's; other folders keep their name.
SCHEMA_OF_FOLDER = {"graph": "capture"}
RESERVED_SCHEMAS = {"main", "temp", "system", "pg_catalog", "information_schema"}
READ_ONLY = {duckdb.StatementType.SELECT}
HINT = "run the pipeline first (`make demo`, or `prism launch` then `prism graph`), or pass --job / set PRISM_JOB"


class SqlError(Exception):
    """A user-facing error of `prism sql` (missing job, no artifacts, a refused statement)."""


@dataclass(frozen=True)
class View:
    name: str
    path: Path  # a file, or a glob over Hive partitions
    hive: bool
    schema: str = "main"

    @property
    def qualified(self) -> str:
        return self.name if self.schema == "main" else f"{self.schema}.{self.name}"

    def files(self) -> list[Path]:
        if not self.hive:
            return [self.path]
        parts = self.path.parts
        first = next(i for i, part in enumerate(parts) if "*" in part)
        return sorted(Path(*parts[:first]).glob(str(Path(*parts[first:]))))


def _stage_rank(stage: str) -> tuple[int, str]:
    return (STAGE_ORDER.index(stage) if stage in STAGE_ORDER else len(STAGE_ORDER), stage)


def _artifacts(job_dir: Path):
    for path in sorted(job_dir.rglob("*.parquet")):
        rel = path.relative_to(job_dir)
        if not any(part.startswith(".") for part in rel.parts):
            yield path, rel


def discover(job_dir: str | Path) -> list[View]:
    """The unqualified views of every Parquet artifact under `job_dir` (hidden and temp files skipped)."""
    job_dir = Path(job_dir)
    plain: dict[str, list[tuple[str, Path]]] = {}  # name -> [(stage, path)]
    hive: dict[tuple[str, tuple[str, ...], str], Path] = {}
    for path, rel in _artifacts(job_dir):
        parts, name = rel.parts[:-1], path.stem
        if len(parts) <= 1:
            plain.setdefault(name, []).append((parts[0] if parts else "", path))
        elif all("=" in part for part in parts[1:]):
            keys = tuple(part.split("=", 1)[0] for part in parts[1:])
            partitions = job_dir / parts[0] / Path(*(f"{k}=*" for k in keys))
            hive[parts[0], keys, name] = job_paths.table_file(partitions, name)
    views: list[View] = []
    for name, entries in plain.items():
        entries.sort(key=lambda entry: _stage_rank(entry[0]))
        views.append(View(name, entries[0][1], False))  # the earliest stage's, under the plain name only
        views += [View(f"{stage}_{name}" if stage else name, path, False) for stage, path in entries[1:]]
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


def discover_schemas(job_dir: str | Path) -> list[View]:
    """The schema-qualified views: ``<schema>.<name>`` for ``<folder>/[<sub>/][<key>=*/]<name>.parquet``
    (``graph/`` -> schema ``capture``; ``baseline/graph/events.parquet`` -> ``baseline.events``; a sub-folder
    other than ``graph`` prefixes the name)."""
    job_dir = Path(job_dir)
    found: dict[tuple[str, str], View] = {}
    for path, rel in _artifacts(job_dir):
        if len(rel.parts) < 2:
            continue
        folder, middle = rel.parts[0], rel.parts[1:-1]
        schema = SCHEMA_OF_FOLDER.get(folder, folder)
        if schema in RESERVED_SCHEMAS or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", schema):
            continue
        subs = [part for part in middle if "=" not in part]
        keys = [part.split("=", 1)[0] for part in middle if "=" in part]
        if list(middle) != subs + [f"{k}={part.split('=', 1)[1]}" for k, part in zip(keys, middle[len(subs):])]:
            continue  # a partition folder above a plain one: not a layout prism writes
        name = "_".join([s for s in subs if s != "graph"] + [path.stem])
        pattern = job_paths.table_file(job_dir / folder / Path(*subs, *(f"{k}=*" for k in keys)), path.stem)
        found.setdefault((schema, name), View(name, pattern, bool(keys), schema))
    return sorted(found.values(), key=lambda view: (view.schema, view.name))


def _quote(value: str, mark: str) -> str:
    return mark + value.replace(mark, mark + mark) + mark


def _why_unreadable(view: View, exc: Exception) -> str:
    """One line naming the artifact that cannot be read and the command that rewrites it."""
    for path in view.files():
        try:
            artifacts.verify_parquet(path)
        except artifacts.ArtifactError as err:
            return str(err)
    detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"{view.path}: unreadable ({detail}); re-run the stage that writes it: {artifacts.writer_of(view.path)}"


def create_views(con: duckdb.DuckDBPyConnection, views: list[View], base: Path | None = None) -> dict[str, str]:
    """Create every view that can be created, then the derived ones (`prism.sql_views`); return {qualified
    view name: why it was left out}. `base`: the views name their files relative to it (the connection's
    ``file_search_path`` must hold it)."""
    skipped: dict[str, str] = {}
    created: set[str] = set()
    for view in views:
        options = ", hive_partitioning = true" if view.hive else ""
        where = view.path.relative_to(base) if base is not None else view.path
        name, path = _quote(view.name, '"'), _quote(str(where), "'")
        if view.schema != "main":
            con.execute(f"CREATE SCHEMA IF NOT EXISTS {_quote(view.schema, chr(34))}")
            name = f"{_quote(view.schema, chr(34))}.{name}"
        try:
            con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM read_parquet({path}{options})")
            created.add(view.qualified if view.schema != "main" else f"main.{view.name}")
        except duckdb.Error as exc:
            skipped[view.qualified] = _why_unreadable(view, exc)
    for schema, view_name, select in sql_views.derived(created):
        qualified = f"{_quote(schema, chr(34))}.{_quote(view_name, chr(34))}"
        try:
            con.execute(f"CREATE SCHEMA IF NOT EXISTS {_quote(schema, chr(34))}")
            con.execute(f"CREATE OR REPLACE VIEW {qualified} AS {select}")
        except duckdb.Error as exc:
            skipped[f"{schema}.{view_name}"] = (f"the derived view cannot be built from its artifacts "
                                                f"({str(exc).splitlines()[0]}); re-run the stages that wrote them")
    return skipped


def _views_or_fail(job_dir: Path) -> list[View]:
    if not job_dir.is_dir():
        raise SqlError(f"{job_dir}: no such job folder; {HINT}")
    job_dir = job_dir.resolve()
    views = discover(job_dir)
    if not views:
        raise SqlError(f"{job_dir}: no Parquet artifacts; {HINT}")
    return views + discover_schemas(job_dir)


def _lock_down(con: duckdb.DuckDBPyConnection, job_dir: Path) -> None:
    """File access only under the job folder, no extensions, and no way to change that afterwards."""
    con.execute(f"SET allowed_directories = [{_quote(str(job_dir.resolve()) + os.sep, chr(39))}]")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def connect(job_dir: str | Path) -> tuple[duckdb.DuckDBPyConnection, dict[str, str]]:
    """An in-memory, locked-down DuckDB connection with one view per readable artifact of `job_dir`, and
    {view: why it was left out} for the artifacts that could not be read."""
    job_dir = Path(job_dir)
    views = _views_or_fail(job_dir)
    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    try:
        _lock_down(con, job_dir)
        skipped = create_views(con, views)
    except BaseException:
        con.close()
        raise
    return con, skipped


def mixed_runs(job_dir: str | Path) -> list[str]:
    """Why the job's artifacts do not describe one run (the pipeline's and the baseline's, each), if so:
    e.g. a capture launched again into the folder, with the old graph left in place."""
    job_dir = Path(job_dir).resolve()
    groups: dict[str, list[Path]] = {}
    for path, rel in _artifacts(job_dir):
        try:
            if artifacts.is_prism_artifact(path):
                groups.setdefault("baseline" if rel.parts[0] == "baseline" else "job", []).append(path)
        except artifacts.ArtifactError:
            continue  # reported as a view left out
    problems = []
    for paths in groups.values():
        try:
            artifacts.same_run(paths)
        except artifacts.ArtifactError as exc:
            problems.append(f"answers may mix runs: {exc}")
    return problems


def _warn(message: str) -> None:
    print(f"prism sql: warning: {message}", file=sys.stderr)


def _report_skipped(skipped: dict[str, str], warn: Callable[[str], None] = _warn) -> None:
    by_reason: dict[str, list[str]] = {}
    for view, why in skipped.items():
        by_reason.setdefault(why, []).append(view)
    for why, views in by_reason.items():
        warn(f"left out view{'s' if len(views) > 1 else ''} {', '.join(views)}: {why}")


def write_catalog(job_dir: str | Path, warn: Callable[[str], None] = _warn) -> Path:
    """Write ``job_dir/prism.duckdb`` with the views (paths relative to the job folder), atomically; return
    its path. An artifact that cannot be read is reported through `warn` and left out."""
    job_dir = Path(job_dir)
    views = _views_or_fail(job_dir)
    final = job_dir / CATALOG
    temp = job_dir / f".{CATALOG}.tmp-{os.getpid()}"
    temp.unlink(missing_ok=True)
    try:
        con = duckdb.connect(str(temp))
        try:
            # paths relative to the job folder, so that a moved or copied folder reads its own files
            con.execute(f"SET file_search_path = {_quote(str(job_dir.resolve()), chr(39))}")
            _report_skipped(create_views(con, views, base=job_dir.resolve()), warn)
        finally:
            con.close()
        os.replace(temp, final)
    finally:
        temp.unlink(missing_ok=True)
        Path(f"{temp}.wal").unlink(missing_ok=True)
    return final


def check_read_only(query: str) -> None:
    """Raise SqlError unless every statement of `query` is a read-only query (and there is one)."""
    statements = duckdb.extract_statements(query)
    if not statements:
        raise SqlError(f"the query {query!r} holds no statement (empty, or only a comment): give one, e.g. "
                       "prism sql \"SELECT * FROM ranks LIMIT 5\"")
    for statement in statements:
        if statement.type not in READ_ONLY:
            kind = statement.type.name.replace("_", " ")
            text = " ".join(statement.query.split())
            raise SqlError(
                f"refused {kind} statement ({text[:60]}{'...' if len(text) > 60 else ''}): prism sql runs "
                "read-only queries only (SELECT, WITH, FROM, VALUES, DESCRIBE, SHOW, SUMMARIZE) and reads only "
                "the job's folder; to keep a result, print it with --csv and redirect the output")


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


@contextmanager
def _interrupt_on_ctrl_c(con: duckdb.DuckDBPyConnection):
    """While a query runs, Ctrl-C interrupts it at once: Python runs its SIGINT handler only when DuckDB next
    checks for signals (seconds to tens of seconds on a busy query), but the C-level handler writes the signal
    to the wakeup fd immediately; a thread reading it interrupts the connection."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)

    def watch() -> None:
        while data := reader.recv(64):
            if signal.SIGINT in data:
                con.interrupt()

    watcher = threading.Thread(target=watch, name="prism-sql-ctrl-c", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous)
        writer.close()  # the watcher's recv returns b"" and it ends
        watcher.join(1)
        reader.close()


def run_query(job_dir: str | Path, query: str) -> tuple[list[str], list[tuple], dict[str, str]]:
    """Column names and rows of a read-only `query` over the job's views, and the views left out."""
    check_read_only(query)
    con, skipped = connect(job_dir)
    try:
        try:
            with _interrupt_on_ctrl_c(con):
                result = con.execute(query)
                if result.description is None:
                    return [], [], skipped
                return [d[0] for d in result.description], result.fetchall(), skipped
        except duckdb.InterruptException:  # Ctrl-C: DuckDB stopped the query; no artifact is to blame
            raise KeyboardInterrupt from None
        except RuntimeError as exc:  # how DuckDB's Python client reports the Ctrl-C it caught itself
            if "interrupted" in str(exc).lower():
                raise KeyboardInterrupt from None
            raise
        except duckdb.PermissionException as exc:
            raise SqlError(f"{str(exc).splitlines()[0]} (prism sql reads only files under {job_dir})") from None
        except (duckdb.ParserException, duckdb.BinderException, duckdb.CatalogException) as exc:
            why = [f"{view} was left out: {reason}" for view, reason in skipped.items() if view in query]
            if why:
                raise SqlError(f"{str(exc).splitlines()[0]}; {'; '.join(why)}") from None
            raise
        except duckdb.Error as exc:  # reading data: name the artifact that is corrupt
            for view in _views_or_fail(Path(job_dir)):
                if re.search(rf"\b{re.escape(view.name)}\b", query):
                    for path in view.files():
                        try:
                            artifacts.verify_parquet(path)
                        except artifacts.ArtifactError as err:
                            raise SqlError(str(err)) from exc
            raise
    finally:
        con.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prism sql", description=__doc__.split("\n\n")[0])
    parser.add_argument("query", nargs="?", help='SQL, e.g. "SELECT kind, count(*) FROM events GROUP BY 1"')
    parser.add_argument("--job", type=Path, help="job folder (default: $PRISM_JOB, else results/default)")
    parser.add_argument("--csv", action="store_true", help="print CSV instead of an aligned table")
    parser.add_argument("--write-catalog", action="store_true", help=f"write JOB/{CATALOG} with the views")
    args = parser.parse_args(argv)
    job_dir = args.job or Path(settings.JOB.get() or DEFAULT_JOB)
    if args.query is None and not args.write_catalog:
        parser.error("give a query (or --write-catalog)")
    try:
        if args.write_catalog:  # writes into the job: holds its lock (`folder_lock`)
            with folder_lock.holding(job_dir, "prism sql"):
                print(f"prism sql: wrote {write_catalog(job_dir)}", file=sys.stderr)
        if args.query is None:
            return 0
        columns, rows, skipped = run_query(job_dir, args.query)
    except (SqlError, folder_lock.FolderBusy) as exc:
        print(f"prism sql: error: {exc}", file=sys.stderr)
        return 2
    except duckdb.Error as exc:
        print(f"prism sql: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("prism sql: interrupted", file=sys.stderr)
        return 130
    _report_skipped(skipped)
    for problem in mixed_runs(job_dir):
        _warn(problem)
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
