"""A private single-node SLURM (Debian's slurm-wlm + munge) for the workflow tests.

Everything lives under one folder: munge key and socket, slurm.conf, state, spool, logs and pid files, on
free ports, so it never touches (or is touched by) a SLURM the machine may already run. The daemons are
started directly (no systemd) and stopped by the pids in their own pid files, nothing else.
Client commands (sbatch, squeue, scancel; also those Snakemake's executor plugin calls) find this cluster
through `SLURM_CONF` in `cluster.env`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")  # (two nodes: slurmd-<node> each)
# Where SLURM's commands look when SLURM_CONF is unset. The slurm executor plugin's job step drops every SLURM_*
# variable (SLURM_CONF too) before its `srun`, so inside a job only this path works: the cluster links its
# slurm.conf here while it runs (and only where no slurm.conf exists), like a real cluster's.
DEFAULT_CONF = Path("/etc/slurm/slurm.conf")


class SlurmUnavailable(RuntimeError):
    """SLURM cannot run here (packages missing, not root): the test skips, or fails under PRISM_REQUIRE_SLURM."""


def missing_requirements(link: bool = True) -> str | None:
    """Why a private SLURM cannot start on this machine, or None when it can (`link`: one that links its
    slurm.conf at DEFAULT_CONF, for clients that drop SLURM_CONF)."""
    missing = [d for d in (*DAEMONS, "sbatch", "squeue", "scancel", "sinfo") if shutil.which(d) is None]
    if missing:
        return f"not installed: {', '.join(missing)} (apt-get install -y slurm-wlm munge)"
    if os.geteuid() != 0:
        return "slurmd must run as root to start jobs"
    if not link:
        return None
    clear_stale_link()
    if DEFAULT_CONF.exists() or DEFAULT_CONF.is_symlink():
        return f"{DEFAULT_CONF} exists (a SLURM is configured here): a private test cluster would clash with it"
    return None


def clear_stale_link() -> Path | None:
    """Removes the /etc/slurm/slurm.conf link a test cluster left when its run was killed before `stop` (the link
    points at a `ClusterName=prismtest` config, or at nothing, and none of that cluster's daemons is alive);
    returns the link's old target, or None when there was nothing stale. A real SLURM's file (not a link), or a
    test cluster whose daemons still run (another test session), is left alone."""
    if not DEFAULT_CONF.is_symlink():
        return None
    target = Path(os.readlink(DEFAULT_CONF))
    try:
        ours = "ClusterName=prismtest" in target.read_text()
    except OSError:
        ours = not target.exists()
    if not ours:
        return None
    for pid_file in (target.parent / "run").glob("*.pid"):
        try:
            if _alive(int(pid_file.read_text().strip())):
                return None
        except (OSError, ValueError):
            continue
    DEFAULT_CONF.unlink()
    return target


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mem_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


class SlurmCluster:
    """One node (this machine: its CPUs, 80% of its memory), one partition `debug`, no accounting.

    `nodes=2`: two "nodes" on this machine, `<host>-1` and `<host>-2` (one slurmd each on its own port, as
    Debian's slurm-wlm allows: SLURM's multiple-slurmd mode, `%n` in the slurmd's pid, spool and log paths),
    each with half the CPUs and memory; its slurm.conf is not linked at DEFAULT_CONF (clients find it through
    SLURM_CONF), so it can run beside a one-node cluster."""

    def __init__(self, root: Path, cpus: int | None = None, nodes: int = 1):
        self.root = Path(root)
        self.cpus = cpus or len(os.sched_getaffinity(0))
        self.mem_mb = int(_mem_mb() * 0.8)
        self.node = socket.gethostname().split(".")[0]
        self.nodes = [self.node] if nodes == 1 else [f"{self.node}-{k}" for k in range(1, nodes + 1)]
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.pid_files = {d: self.root / "run" / f"{d}.pid" for d in DAEMONS}
        if nodes > 1:
            del self.pid_files["slurmd"]
            self.pid_files.update({f"slurmd-{n}": self.root / "run" / f"slurmd-{n}.pid" for n in self.nodes})
        self.started: list[str] = []
        self.linked_conf = False

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def _write_config(self) -> None:
        for sub in ("munge", "run", "state", "spool", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        r = self.root
        if len(self.nodes) == 1:
            slurmd = f"SlurmdPidFile={self.pid_files['slurmd']}\nSlurmdLogFile={r}/log/slurmd.log\n"
            node_lines = (f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.mem_mb} "
                          "State=UNKNOWN\n")
        else:  # multiple slurmd: %n is the node's name
            slurmd = f"SlurmdPidFile={r}/run/slurmd-%n.pid\nSlurmdLogFile={r}/log/slurmd-%n.log\n"
            cpus, mem = max(1, self.cpus // len(self.nodes)), self.mem_mb // len(self.nodes)
            node_lines = "".join(f"NodeName={n} NodeHostname={self.node} NodeAddr=127.0.0.1 Port={_free_port()} "
                                 f"CPUs={cpus} RealMemory={mem} State=UNKNOWN\n" for n in self.nodes)
            for n in self.nodes:
                (r / "spool" / n).mkdir(parents=True, exist_ok=True)
        spool = f"{r}/spool" + ("" if len(self.nodes) == 1 else "/%n")
        self.conf.write_text(f"""\
ClusterName=prismtest
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={r}/state
SlurmdSpoolDir={spool}
SlurmctldPidFile={self.pid_files['slurmctld']}
SlurmctldLogFile={r}/log/slurmctld.log
{slurmd}ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU={max(256, self.mem_mb // self.cpus // 2)}
MinJobAge=300
SchedulerType=sched/builtin
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
{node_lines}PartitionName=debug Nodes={",".join(self.nodes)} Default=YES MaxTime=INFINITE State=UP
""")

    def _run_daemon(self, name: str, argv: list[str]) -> None:
        log = self.root / "log" / f"{name}.start.log"
        with open(log, "w") as out:
            proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **self.env},
                                  timeout=60)
        if proc.returncode != 0:
            raise SlurmUnavailable(f"{name} did not start (exit {proc.returncode}): {log.read_text()[-2000:]}")
        pid_file = self.pid_files[name]
        deadline = time.monotonic() + 20
        while not pid_file.exists() or not pid_file.read_text().strip():
            if time.monotonic() > deadline:
                raise SlurmUnavailable(f"{name} wrote no pid file {pid_file}: {self.logs()}")
            time.sleep(0.1)
        self.started.append(name)

    def start(self, timeout: float = 60) -> "SlurmCluster":
        link = len(self.nodes) == 1
        why = missing_requirements(link)
        if why:
            raise SlurmUnavailable(why)
        self._write_config()
        m = self.root / "munge"
        try:
            if link:
                DEFAULT_CONF.parent.mkdir(parents=True, exist_ok=True)
                DEFAULT_CONF.symlink_to(self.conf)
                self.linked_conf = True
            self._run_daemon("munged", ["munged", "--force", f"--socket={self.munge_socket}",
                                        f"--key-file={m / 'munge.key'}", f"--pid-file={self.pid_files['munged']}",
                                        f"--log-file={self.root / 'log' / 'munged.log'}",
                                        f"--seed-file={m / 'munged.seed'}"])
            self._run_daemon("slurmctld", ["slurmctld", "-f", str(self.conf)])
            for n in self.nodes:
                self._run_daemon("slurmd" if link else f"slurmd-{n}", ["slurmd", "-f", str(self.conf), "-N", n])
            self._wait_idle(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True,
                                  env={**os.environ, **self.env}, timeout=30)
            state = (proc.stdout + proc.stderr).strip()
            if proc.returncode == 0 and state.split() == ["idle"] * len(self.nodes):
                return
            time.sleep(0.5)
        raise SlurmUnavailable(f"node not idle after {timeout:.0f} s (sinfo: {state!r}): {self.logs()}")

    def squeue(self) -> list[str]:
        """`JOBID STATE NAME` of every job this cluster still knows (MinJobAge keeps finished ones 300 s)."""
        proc = subprocess.run(["squeue", "-h", "--states=all", "-o", "%i %T %j"], capture_output=True, text=True,
                              env={**os.environ, **self.env}, timeout=30, check=True)
        return proc.stdout.splitlines()

    def logs(self) -> str:
        parts = []
        for f in sorted((self.root / "log").glob("*.log")):
            parts.append(f"--- {f.name}\n{f.read_text(errors='replace')[-1500:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancels what is left, then stops the daemons this object started, newest first, by their pid files."""
        if "slurmctld" in self.started:
            subprocess.run(["scancel", "--user", str(os.getuid())], env={**os.environ, **self.env},
                           capture_output=True, timeout=30)
        for name in reversed(self.started):
            pid_file = self.pid_files[name]
            try:
                pid = int(pid_file.read_text().strip())
            except (OSError, ValueError):
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.1)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        self.started.clear()
        if self.linked_conf and DEFAULT_CONF.is_symlink() and DEFAULT_CONF.resolve() == self.conf.resolve():
            DEFAULT_CONF.unlink()
        self.linked_conf = False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is not alive; the daemons are not our children, so /proc tells
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False
