"""What the launcher tells the zygote: one typed record, written (`write`) and read (`read`) here only.

The launcher builds a `ZygoteSpec` from the checked `LaunchSpec` and writes it as `STATUS_DIR/spec.json`;
the zygote reads it back (`python -m prism.runtime.launch.zygote SPEC`) and hands it to everything it
forks: the ranks (`forked_rank.run_rank`), the replay process (`forked_rank.run_replay`, which gives it to
the slice server or the emulate worker), the fork helpers and the capture coordinator's link. The fields
after `zygote-filled` are the zygote's own notes (pids of the children it forked, how long that took),
never written by the launcher.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ZygoteSpec:
    nproc: int
    run_id: str
    status_dir: str
    mode: str  # a `modes.MODES` name
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    script: str | None = None  # the program: a script, or a module (-m)
    module: str | None = None
    args: list[str] = field(default_factory=list)
    pin: bool = False  # one core per rank
    cores: list[int] | None = None  # the cores this run claimed (`launch.cores`): the ranks are pinned to these
    devices: int | None = None  # capture / emulate: the device slots the ranks share
    shm_dir: str | None = None  # capture: the run's shared-memory folder
    preload: list[str] = field(default_factory=list)  # modules imported (and warmed up) in the zygote
    progress: str | None = None  # "tty", "lines" or None (no progress display)
    iterations: int | None = None  # the iterations the program is expected to run (the progress bar's end)
    device: str = "cpu"  # PRISM_DEVICE
    rank_output: str = "pipes"  # how the ranks' output reaches the launcher (`limits.rank_output`)
    device_memory_bytes: int | None = None  # capture: the device capacity the blocked ranks share
    log_dir: str | None = None  # emulate: the sandbox ranks' output also goes to LOG_DIR/rank=R.log
    raw_staging: str | None = None  # the replay process writes raw/replay/ there
    timed: list[str] | None = None  # slice --timed-by: [graph events, calibrated timeline]
    # a mode with a replay process (slice, emulate): the ranks run for real and the capture replayed
    ranks: list[int] | None = None
    capture: str | None = None
    pruning: bool = True
    prefetch_mb: int = 256
    steps_limit: int | None = None
    replay_timeout_s: float | None = None  # the replay process's gloo timeout (None: 600 s)
    # a capture over hosts (`launch.host_launch`): this host's view (`hosts.HostView.as_dict`; nproc, master_*
    # above are then the job's world and host 0's rendezvous) and every host's record
    hosts: dict | None = None
    host_records: list[dict] | None = None
    # zygote-filled: its notes for the children and the coordinator (not in spec.json)
    pids: dict[int, int] = field(default_factory=dict)  # rank (REPLAY: the replay process) -> pid
    warm_s: float | None = None  # from the zygote's start to its forks
    fork_s: float | None = None
    fork_helpers: int = 0
    immortal: dict | None = None
    heap_holes: dict | None = None  # capture: the C heap's free chunks the zygote took (`memory.fill_heap_holes`)

    ZYGOTE_FILLED = ("pids", "warm_s", "fork_s", "fork_helpers", "immortal", "heap_holes")

    def write(self, path: Path) -> None:
        data = {k: v for k, v in dataclasses.asdict(self).items() if k not in self.ZYGOTE_FILLED}
        Path(path).write_text(json.dumps(data))

    @classmethod
    def read(cls, path: Path) -> "ZygoteSpec":
        data = json.loads(Path(path).read_text())
        known = {f.name for f in dataclasses.fields(cls)} - set(cls.ZYGOTE_FILLED)
        unknown = sorted(set(data) - known)
        if unknown:  # a launcher and a zygote of different prism versions
            raise ValueError(f"{path}: fields this prism's zygote does not know: {', '.join(unknown)}")
        return cls(**data)
