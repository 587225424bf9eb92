"""What a forked rank's garbage collections copy of the zygote's fork-time objects (issue 25 item 2).

The zygote freezes its heap (`gc.freeze`) before it forks, but it makes per-rank objects while forking: each
rank's output pipes registered with the forwarder's selector (`rank_output.LineForwarder.add`), its control
socket object, its `children` entry (`rank_fork.RankForker`). A rank forked after r others inherits r such
sets, unfrozen. Here a parent makes N such sets the same way (real pipes, real socket pairs, the real
`LineForwarder`), forks, and the child measures its private memory (`memory.private_bytes`) before and after
one full collection, with and without `gc.freeze()` first (what `RankForker._detach_sockets` now does).

    .venv/bin/python scripts/fork_inherited_gc.py --sizes 512,2048,4096
"""

from __future__ import annotations

import argparse
import gc
import os
import socket
import sys

from prism.runtime import memory
from prism.runtime.launch.rank_output import LineForwarder


def child_growth(n: int, freeze: bool) -> int:
    gc.collect()
    gc.freeze()  # as the zygote does before its fork loop
    out, ctl, children = LineForwarder(), {}, {}
    for rank in range(n):  # what the fork loop keeps per rank (the child's ends closed, as in `_adopt`)
        r_out, w_out = os.pipe()
        r_err, w_err = os.pipe()
        os.close(w_out)
        os.close(w_err)
        out.add(r_out, sys.stdout.buffer)
        out.add(r_err, sys.stderr.buffer)
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        child.close()
        ctl[rank] = parent
        children[10_000_000 + rank] = rank
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        if freeze:
            gc.freeze()
        before = memory.private_bytes()
        gc.collect()
        grew = memory.private_bytes() - before
        os.write(w, str(grew).encode())
        os._exit(0)
    os.close(w)
    data = os.read(r, 64)
    os.waitpid(pid, 0)
    os.close(r)
    for sock in ctl.values():
        sock.close()
    for key in list(out.sel.get_map().values()):
        out.sel.unregister(key.fd)
        os.close(key.fd)
    gc.unfreeze()
    return int(data)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="512,2048,4096", help="ranks forked before the measured one")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print("ranks before it | child's private KiB copied by one gc.collect(): without freeze (runs) | with freeze (runs)")
    for n in (int(s) for s in args.sizes.split(",")):
        plain = [child_growth(n, False) // 1024 for _ in range(args.repeat)]
        frozen = [child_growth(n, True) // 1024 for _ in range(args.repeat)]
        print(f"{n:>15} | {', '.join(map(str, plain)):>40} | {', '.join(map(str, frozen))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
