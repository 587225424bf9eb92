"""The recorder's raw stream against another version's, on one program (markers, a collective waited on or not, a
recv from any source resolved later, an iteration end reopened, flushes between) with deterministic clocks:

    git show COMMIT:prism/runtime/recorder.py > /tmp/old_recorder.py
    .venv/bin/python scripts/recorder_stream_check.py /tmp/old_recorder.py

Session 17 ran it with the recorder before the flat row store (a tuple a row: d8bec10's, and main's 8524428 before every cut of the session) against the flat one: every
column of every row identical at three flush sizes."""
import importlib.util
import itertools
import sys
import tempfile
from pathlib import Path

import pyarrow as pa

from prism.runtime import recorder as new

spec = importlib.util.spec_from_file_location("prism.runtime.old_recorder", sys.argv[1])
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)


def run(mod, d, flush_every):
    wall, cpu = itertools.count(10_000, 1000), itertools.count(5_000, 700)
    mod._wall = lambda: next(wall); mod._cpu = lambda: next(cpu)
    mod._FLUSH_EVERY = flush_every
    rec = mod.Recorder(0, d)
    n = itertools.count(1)
    rec.memory.sample = lambda: (lambda k: (k, 2 * k, -1))(next(n))
    for step in range(6):
        for k, op in enumerate(["fwd_begin", "fwd_end", "bwd_begin", "bwd_end"] * 2):
            rec.marker(op)
            if k == 2:
                s = rec.begin(); rec.end(s, "collective", "all_reduce", group="0", group_seq=step, nbytes=8, work_id=10 + step)
                if step % 2: rec.waited(10 + step, sync=False)
                rec.completed(10 + step)
            if k == 4 and step == 2:
                s = rec.begin(); rec.end(s, "p2p", "recv_anysource", group="0", work_id=99); rec.await_peer(99)
            if k == 6 and step == 4:
                rec.resolve_peer(99, 3)
        rec.marker("iteration_end"); rec.iteration += 1
        if step == 3:
            rec.marker("iteration_end"); rec.iteration += 1; rec.reopen_iteration()
    rec.close()
    with pa.ipc.open_stream(str(rec.dir / "events.arrow")) as r:
        return r.read_all().to_pydict()


for fe in (65536, 7, 16):
    a = run(old, Path(tempfile.mkdtemp()), fe); b = run(new, Path(tempfile.mkdtemp()), fe)
    assert a == b, [(k, [(i, x, y) for i, (x, y) in enumerate(zip(a[k], b[k])) if x != y][:3]) for k in a if a[k] != b[k]]
    print("flush every", fe, ": identical,", len(a["seq"]), "rows; ops", sorted(set(a["op"])))
