"""A stand-in for ``prism launch --mode emulate`` that writes OUT in the contract's format (tests of the stage).

The sandbox ranks "measure" their captured events again: times shifted onto a new clock, compute events'
device time scaled by `scale` (and their span stretched to match); the virtual ranks in `replayed` are
written as the replay worker's timeline.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from prism import artifacts, schemas

T0 = 10**12  # the fake run's t0_ns on the host clock


def _write(table: pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = table.select(schemas.RAW_EVENTS.names).cast(schemas.with_version(schemas.RAW_EVENTS))
    with pa.OSFile(str(path), "wb") as sink, ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)


def restamp(table: pa.Table, scale: float) -> pa.Table:
    """The events re-timed from T0: each event as long as captured (compute: device_ns * scale)."""
    kind = table["kind"].cast(pa.string()).to_numpy(zero_copy_only=False)
    span = np.maximum(table["t_end_ns"].to_numpy() - table["t_start_ns"].to_numpy(), 0)
    dev = table["device_ns"].to_numpy().copy()
    compute = kind == "compute"
    dev[compute] = (dev[compute] * scale).astype(np.int64)
    span[compute] = np.maximum(dev[compute], 0)
    end = T0 + np.cumsum(span)
    start = end - span
    complete = table["t_complete_ns"].to_numpy()
    complete = np.where(complete >= 0, end, -1)
    out = table
    for name, values in (("t_start_ns", start), ("t_end_ns", end), ("device_ns", dev), ("cpu_ns", dev),
                         ("t_complete_ns", complete)):
        out = out.set_column(out.schema.get_field_index(name), name, pa.array(values, pa.int64()))
    return out


def fake_launcher(capture: Path, sandbox: list[int], replayed: list[int], scale: float = 1.0,
                  edit=None, fail: int = 0, cone: tuple[int, int] | None = None):
    """A `launch(cmd, out)` for `prism.emulate.stage.emulate`; `edit(rank, table)` may alter a sandbox rank;
    `cone=(lo, hi)`: the replay holds only the replayed ranks' events lo <= seq < hi (the live cone)."""

    def launch(cmd: list[str], out: Path) -> int:
        if fail:
            return fail
        assert cmd[cmd.index("--mode") + 1] == "emulate"
        assert cmd[cmd.index("--sandbox") + 1] == ",".join(map(str, sandbox))
        meta = json.loads((capture / "raw" / "meta.json").read_text())
        for r in sandbox:
            t = restamp(artifacts.read_raw_stream(capture / "raw" / f"rank={r}" / "events.arrow"), scale)
            _write(edit(r, t) if edit else t, out / "raw" / f"rank={r}" / "events.arrow")
            (out / "logs").mkdir(parents=True, exist_ok=True)
            (out / "logs" / f"rank={r}.log").write_text(f"rank {r} ran\n")
        parts = [restamp(artifacts.read_raw_stream(capture / "raw" / f"rank={r}" / "events.arrow"), 1.0)
                 for r in replayed]
        if cone is not None:
            parts = [t.slice(cone[0], cone[1] - cone[0]) for t in parts]
        if parts:
            _write(pa.concat_tables(parts), out / "raw" / "replay" / "events.arrow")
        (out / "raw" / "meta.json").write_text(json.dumps({
            "mode": "emulate", "world_size": meta["world_size"], "sandbox": sandbox, "capture_dir": str(capture),
            "t0_ns": T0, "emulation": {"startup_s": 0.5, "communicators": 3, "prefetch_stalls": 0}}))
        return 0

    return launch


def only_kind(table: pa.Table, kind: str) -> pa.Table:
    return table.filter(pc.equal(table["kind"].cast(pa.string()), kind))

