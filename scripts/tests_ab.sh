#!/bin/bash
# Test files' time before and after a change, in one sitting: ROUNDS rounds, each running the files from
# REV's tree (git archive, this checkout's .venv) and then from this checkout; per side and round the pytest
# durations, wall and CPU (user+sys of every process reaped, the ranks included) and the load.
#
#   scripts/tests_ab.sh REV ROUNDS OUTDIR tests/integration/test_x.py [more test paths...]
#   e.g. scripts/tests_ab.sh main 2 /tmp/ab tests/integration/test_hang_watchdog.py
#
# A capture and every pinned run claim cores through flock files in /dev/shm/prism-cores-UID
# (prism/runtime/launch/cores.py), shared by every prism run of the machine: on a box shared with other test
# runs, a side can wait there for minutes ("[prism] waiting for N free core(s)"). As root, each side runs in a
# mount namespace of its own with a private /dev/shm (unshare -m), so it waits only for its own runs; otherwise
# the waits are counted and the script says so.
set -euo pipefail
[ $# -ge 4 ] || { echo "usage: $0 REV ROUNDS OUTDIR TEST_PATH..." >&2; exit 2; }
rev=$1 rounds=$2 out=$3; shift 3
repo=$(git rev-parse --show-toplevel)
[ -x "$repo/.venv/bin/python" ] || { echo "$repo/.venv missing: run make setup first" >&2; exit 2; }
git -C "$repo" rev-parse --verify -q "$rev^{commit}" >/dev/null || { echo "$rev: no such revision" >&2; exit 2; }
mkdir -p "$out"
base=$(mktemp -d "${TMPDIR:-/tmp}/tests_ab_base.XXXXXX")
trap 'rm -rf "$base"' EXIT
git -C "$repo" archive "$rev" | tar -x -C "$base"
ln -s "$repo/.venv" "$base/.venv"   # (prism comes from the tree's cwd: tests run `python -m prism.cli` there)
private=()
if [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null; then
  private=(unshare -m bash -c 'mount -t tmpfs -o size=8g tmpfs /dev/shm && exec "$@"' _)
else
  echo "not root: the sides share /dev/shm's core locks with every other prism run of this machine" >&2
fi
for r in $(seq 1 "$rounds"); do
  for side in base new; do
    dir=$base; [ "$side" = new ] && dir=$repo
    log="$out/${side}_$r.txt"
    ( cd "$dir" && "${private[@]}" /usr/bin/time -f "$side round $r: %e s wall, %U s user, %S s sys" \
        .venv/bin/python -m pytest -q -p no:cacheprovider --durations=0 "$@" ) > "$log" 2>&1 || true
    echo "$(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$log"
    grep -E "passed|failed|round" "$log" | tr '\n' ' '; echo
  done
done
