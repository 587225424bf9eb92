"""Payloads are checked against their content hash when read (issue 23: with one byte flipped in every
payload, a slice run and an emulation exited 0 printing inf/nan losses; a truncated one failed deep inside
torch with no file named). A damaged payload is named with the fix, the run exits non-zero and publishes
nothing."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import PROGRAMS, run_prism, run_together

pytestmark = pytest.mark.slow
FIX = "capture again"


def _damage(capture) -> list:
    """Every payload damaged: one byte flipped in every other file, the others truncated to half."""
    files = sorted((capture / "payloads").rglob("*.bin"))
    for i, path in enumerate(files):
        data = bytearray(path.read_bytes())
        if i % 2:
            data[-1] ^= 0x01  # the last tensor byte: the header still decodes, the values are wrong
        else:
            data = data[: len(data) // 2]
        path.write_bytes(bytes(data))
    return files


def test_a_damaged_payload_is_named_in_emulate_and_slice_runs(tmp_path, reduction_order_capture):
    shared, _ = reduction_order_capture
    job = tmp_path / "job"
    shutil.copytree(shared / "capture", job / "capture")
    damaged = {str(p) for p in _damage(job / "capture")}
    prog = str(PROGRAMS / "reduction_order.py")
    emu, sl = run_together(
        lambda: run_prism(["launch", "--nproc", "4", "--mode", "emulate", "--capture", str(job / "capture"),
                           "--sandbox", "1", "--devices", "1", "--out", str(job / "emu"), prog]),
        lambda: run_prism(["launch", "--nproc", "4", "--mode", "slice", "--capture", str(job / "capture"),
                           "--slice-ranks", "0,1", "--out", str(job / "slice"), prog]))
    for proc in (emu, sl):
        assert proc.returncode not in (0, 2), proc.stderr[-3000:]
        named = [line for line in proc.stderr.splitlines() if "corrupt payload" in line]
        assert named and any(path in named[0] for path in damaged) and FIX in named[0], proc.stderr[-3000:]
        assert "inf" not in proc.stdout and "nan" not in proc.stdout
    assert not (job / "emu" / "raw").exists() and not (job / "slice" / "raw").exists()
