"""`prism.runtime.launch.rank_fork` alone, in a subprocess (it makes that process a child subreaper): ranks forked
by helpers are reaped by the forking process with their own exit status, and a helper that cannot fork makes
one clear error with no rank left behind."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

from tests.conftest import REPO, make_env

SCRIPT = textwrap.dedent("""
    import os, sys
    from prism.runtime.launch import rank_fork
    from prism.runtime.launch.rank_output import LineForwarder
    from prism.runtime.launch.zygote_spec import ZygoteSpec

    ids = list(range(10))
    if sys.argv[1] == "fail":  # the helper of ranks 4-5 cannot fork its second rank
        real_fork = os.fork
        def fork():
            if os.getpid() != zygote and os.environ.get("FORKED_ONE"):
                raise OSError(11, "Resource temporarily unavailable")
            pid = real_fork()
            if pid and os.getpid() != zygote:
                os.environ["FORKED_ONE"] = "1"
            return pid
        zygote = os.getpid()
        os.fork = fork
    out = LineForwarder()
    def run(rank):  # a rank's exit code: rank + 10 (after a minute where forking failed: it must be stopped)
        if sys.argv[1] == "fail":
            import time
            time.sleep(60)
        return rank + 10
    spec = ZygoteSpec(nproc=len(ids), run_id="t", status_dir=".", mode="real")
    forker = rank_fork.RankForker(spec, ids, False, out, None, run)
    try:
        forker.fork_all()
    except rank_fork.ForkError as exc:
        print("error", exc, "children", len(forker.children))
        print("left", [p for p in forker.children if os.path.exists(f"/proc/{p}")])
        sys.exit(0)
    codes = {}
    while len(codes) < len(ids):
        pid, status = os.waitpid(-1, 0)
        codes[forker.children[pid]] = os.waitstatus_to_exitcode(status)
    out.drain(1.0)
    print("helpers", forker.helpers, "codes", [codes[r] for r in ids])
""")


def _run(how: str) -> str:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, how], capture_output=True, text=True, timeout=120,
                          cwd=REPO, env=make_env(PRISM_FORK_BATCH="2"))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_helpers_ranks_are_reaped_with_their_exit_status():
    assert _run("ok").strip() == "helpers 5 codes " + str([r + 10 for r in range(10)])


def test_a_helper_that_cannot_fork_is_one_error_and_no_rank_survives():
    text = _run("fail")  # every helper forks its first rank (0, 2, .., 8), not its second
    assert re.search(r"^error could not fork rank [13579] \(Resource temporarily unavailable\)", text), text
    assert "ulimit -u" in text and "children 5\n" in text, text
    assert "\nleft []" in text, text  # the 5 forked ranks (sleeping for a minute) were stopped and reaped
