"""The files a launch owns: the --out lock, emptiness and --force, and the sweep of dead runs' temporaries."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from prism.runtime.launch import launcher
from prism.runtime.launch import run_files


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert not run_files.pid_alive(proc.pid)
    return proc.pid


def test_sweep_removes_dead_launchers_temporaries_only(tmp_path):
    dead = dead_pid()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / f"prism-{dead}-0123abcd").mkdir()                       # a capture's shm folder
        (tmp_path / f"prism-{dead}-0123abcd-x1y2" / "sub").mkdir(parents=True)  # a status folder
        (tmp_path / f"prism-{live.pid}-0123abcd").mkdir()                   # a live launcher's
        (tmp_path / f"prism-{os.getpid()}-0123abcd").mkdir()                # our own
        (tmp_path / "prism-notes").mkdir()                                  # not prism's naming
        (tmp_path / f"prism-{dead}-nothex12").mkdir()
        removed = run_files.sweep_temporaries([str(tmp_path)])
        assert sorted(p.name for p in removed) == [f"prism-{dead}-0123abcd", f"prism-{dead}-0123abcd-x1y2"]
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [f"prism-{live.pid}-0123abcd", f"prism-{os.getpid()}-0123abcd", "prism-notes", f"prism-{dead}-nothex12"])
    finally:
        live.kill()
        live.wait()


def test_temp_tag_names_this_process():
    tag = run_files.temp_tag("0123456789abcdef" * 2)
    assert tag == f"prism-{os.getpid()}-01234567"
    assert run_files.TEMP_NAME.match(tag) and run_files.TEMP_NAME.match(tag + "-abc")


def test_a_new_folder_is_created_locked_and_removed_after_a_failure(tmp_path):
    out = tmp_path / "a" / "b"
    claim = run_files.OutFolder(out, force=False)
    assert out.is_dir() and (out / run_files.LOCK_NAME).read_text() == f"{os.getpid()}\nprism launch\n"
    with pytest.raises(run_files.OutError, match=rf"in use by another prism launch \(pid {os.getpid()}: prism launch\)"):
        run_files.OutFolder(out, force=False)
    claim.release(failed=True)
    assert not (tmp_path / "a").exists(), "a failed run left the folders it created"


def test_success_keeps_the_folder_and_drops_the_lock(tmp_path):
    out = tmp_path / "job"
    claim = run_files.OutFolder(out, force=False)
    (out / "raw").mkdir()
    claim.release(failed=False)
    assert sorted(p.name for p in out.iterdir()) == ["raw"]
    run_files.OutFolder(out, force=True).release(failed=False)  # the lock is free again
    assert list(out.iterdir()) == []


def test_an_existing_empty_folder_is_kept_after_a_failure(tmp_path):
    run_files.OutFolder(tmp_path, force=False).release(failed=True)
    assert tmp_path.is_dir()


def test_a_folder_with_files_is_refused_unless_force(tmp_path):
    out = tmp_path / "job"
    (out / "graph").mkdir(parents=True)
    (out / "prism.duckdb").write_text("old")
    with pytest.raises(run_files.OutError, match=r"not empty \(graph, prism.duckdb\).*--force"):
        run_files.OutFolder(out, force=False)
    assert sorted(p.name for p in out.iterdir()) == ["graph", "prism.duckdb"], "the refusal changed the folder"
    claim = run_files.OutFolder(out, force=True)
    assert [p.name for p in out.iterdir()] == [run_files.LOCK_NAME]
    claim.release(failed=False)


def test_dead_runs_staging_is_swept_under_the_lock(tmp_path):
    for name in (".raw.tmp-prism-1-0123abcd", ".payloads.tmp-prism-1-0123abcd", ".raw.old-0123"):
        (tmp_path / name).mkdir()
    run_files.OutFolder(tmp_path, force=False).release(failed=False)
    assert list(tmp_path.iterdir()) == []


def test_force_refuses_the_current_folder(tmp_path, monkeypatch):
    (tmp_path / "code.py").write_text("keep me")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(run_files.OutError, match="holds the current folder"):
        run_files.OutFolder(tmp_path, force=True)
    assert (tmp_path / "code.py").exists()


def test_launch_refuses_a_locked_or_used_folder_with_exit_2(tmp_path, capsys):
    prog = tmp_path / "prog.py"
    prog.write_text("print('ran')\n")
    out = tmp_path / "job"
    claim = run_files.OutFolder(out, force=False)
    try:
        assert launcher.main(["--nproc", "1", "--out", str(out), str(prog)]) == 2
        assert f"in use by another prism launch (pid {os.getpid()}: prism launch)" in capsys.readouterr().err
    finally:
        claim.release(failed=False)
    (out / "raw").mkdir()
    assert launcher.main(["--nproc", "1", "--out", str(out), str(prog)]) == 2
    assert "is not empty (raw)" in capsys.readouterr().err
    assert launcher.main(["--nproc", "1", "--force", str(prog)]) == 2
    assert "--force clears the --out folder: it needs --out" in capsys.readouterr().err


def test_checks_fail_before_out_is_created(tmp_path, capsys):
    out = tmp_path / "job"
    assert launcher.main(["--nproc", "2", "--devices", "1", "--out", str(out), "-m", "prism.workloads.moe_gpt"]) == 2
    assert "--devices sets the device slots that --mode capture shares" in capsys.readouterr().err
    assert launcher.main(["--nproc", "2", "--out", str(out), str(tmp_path / "missing.py")]) == 2
    assert not out.exists()
