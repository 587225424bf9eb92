"""Bulk data between ranks through shared memory files (not through a store).

A contribution is one file: an 8-byte header length, a pickled header (the tensors' dtypes and shapes and
any op metadata), then the tensors' bytes. Files live in a per-run folder on /dev/shm; the coordinator
deletes them once every reader is done. The same bytes, stored by content hash, are the payloads that
later modes replay.
"""

from __future__ import annotations

import errno
import hashlib
import os
import pickle
import struct
from pathlib import Path

import torch

_LEN = struct.Struct("<Q")


def encode(tensors: list[torch.Tensor], meta: dict | None = None) -> bytes:
    """One contribution as bytes (tensors are copied to host memory if needed)."""
    host = [t.detach().contiguous().cpu() for t in tensors]
    header = pickle.dumps({"meta": meta or {}, "tensors": [(t.dtype, tuple(t.shape)) for t in host]})
    parts = [_LEN.pack(len(header)), header]
    parts += [t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"" for t in host]
    return b"".join(parts)


def decode(data: bytes | bytearray) -> tuple[dict, list[torch.Tensor]]:
    (hlen,) = _LEN.unpack_from(data, 0)
    header = pickle.loads(memoryview(data)[_LEN.size:_LEN.size + hlen])
    offset = _LEN.size + hlen
    tensors = []
    buf = data if isinstance(data, bytearray) else bytearray(data)
    for dtype, shape in header["tensors"]:
        numel = 1
        for s in shape:
            numel *= s
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if nbytes:
            t = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=offset).view(dtype).reshape(shape)
        else:
            t = torch.empty(shape, dtype=dtype)
        tensors.append(t)
        offset += nbytes
    return header["meta"], tensors


class ShmFull(OSError):
    """The shared-memory folder is full: the message names it, its size, and the fix."""


def write(path: Path | str, data: bytes) -> None:
    """Write a whole file, visible under its name only once complete. A full file system (/dev/shm's size
    is a mount option) raises `ShmFull` naming the limit and the fix, and leaves no partial file.

    `path` may be a string: a capture rank writes its files under names made per op, and a `pathlib.Path` interns
    each name (`sys.intern`: on CPython 3.12.0-3.12.4 interned strings are immortal, so every name a rank ever
    made would stay; on any version the interpreter's table of interned strings grows, and a forked rank that
    grows it copies the whole table, MiBs). So the temporary's name is made as a string too."""
    path = os.fspath(path)
    tmp = f"{path}.{os.getpid()}.tmp"  # two writers of one name never share a temporary
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        folder = Path(path).parent
        try:
            st = os.statvfs(folder)
            size = f" (size {st.f_blocks * st.f_frsize / 2**20:.0f} MiB)"
        except OSError:
            size = ""
        raise ShmFull(exc.errno, f"{folder.parent}{size} is full: a capture moves every collective's data through "
                      f"it ({len(data)} bytes could not be written). Enlarge it (`mount -o remount,size=8G "
                      f"{folder.parent}`, or docker's --shm-size) or capture fewer ranks") from None


def read(path: Path | str) -> tuple[dict, list[torch.Tensor]]:
    with open(path, "rb") as f:
        data = bytearray(os.fstat(f.fileno()).st_size)
        f.readinto(data)
    return decode(data)


def content_hash(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class PayloadStore:
    """Content-addressed payload files: `<dir>/<hash[:2]>/<hash>.bin`, each distinct content once."""

    def __init__(self, folder: Path) -> None:
        self.dir = Path(folder)
        self._root = str(self.dir)

    def put(self, data: bytes) -> str:
        # names as strings: a Path would intern each content's name in every capture rank (`write`)
        digest = content_hash(data)
        folder = f"{self._root}/{digest[:2]}"
        path = f"{folder}/{digest}.bin"
        if not os.path.exists(path):
            os.makedirs(folder, exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        return digest

    def get(self, digest: str) -> tuple[dict, list[torch.Tensor]]:
        return decode(read_payload(self.dir / digest[:2] / f"{digest}.bin"))


class CorruptPayload(ValueError):
    """A payload file whose bytes do not hash to its name (flipped or truncated): the message names the file
    and the fix."""


_verified: set[str] = set()  # payload files of this process whose content matched their name once


def read_payload(path: Path | str) -> bytearray:
    """The bytes of a content-addressed payload `<hash>.bin`, checked against the hash in its name the first
    time this process reads the file (a later read of the same file is not hashed again). Raises
    `CorruptPayload` naming the file and the fix; FileNotFoundError when it is missing."""
    path = str(path)
    with open(path, "rb") as f:
        data = bytearray(os.fstat(f.fileno()).st_size)
        f.readinto(data)
    if path not in _verified:
        expected = os.path.basename(path).split(".", 1)[0]
        if content_hash(data) != expected:
            raise CorruptPayload(
                f"{path}: corrupt payload ({len(data)} bytes whose content does not match the hash in its "
                "name: bytes flipped or the file truncated); the capture's payloads are damaged: capture "
                "again (re-run the capture stage, or `prism launch --mode capture --out CAPDIR ...`)")
        _verified.add(path)
    return data
