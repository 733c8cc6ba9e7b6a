"""Tar helpers for uploads and downloads of directory trees.

Archives are built into a spooled temporary file (in memory up to a few MiB,
then on disk) so that a retried upload can send the same bytes again.
Downloads are extracted with a strict filter: no absolute names, no ``..``,
no links that point outside the destination, no device nodes."""

from __future__ import annotations

import io
import os
import posixpath
import tarfile
import tempfile
from typing import IO, AsyncIterator, BinaryIO, Optional, Union

__all__ = ["build_tar", "single_file_tar", "safe_extract", "iter_file", "SPOOL_MAX"]

SPOOL_MAX = 8 << 20
CHUNK = 1 << 20

PathLike = Union[str, "os.PathLike[str]"]


def build_tar(src: PathLike) -> IO[bytes]:
    """Archive ``src``: a directory's contents (names relative to it) or a
    single file (under its base name). Returns a file positioned at 0."""
    src = os.fspath(src)
    out = tempfile.SpooledTemporaryFile(max_size=SPOOL_MAX)
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tf:
        if os.path.isdir(src):
            for name in sorted(os.listdir(src)):
                tf.add(os.path.join(src, name), arcname=name, recursive=True)
        else:
            tf.add(src, arcname=os.path.basename(src), recursive=False)
    out.seek(0)
    return out


def single_file_tar(name: str, data: bytes, mode: int) -> bytes:
    """A tar holding one regular file."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        ti = tarfile.TarInfo(name)
        ti.size = len(data)
        ti.mode = mode
        tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


async def iter_file(f: IO[bytes]) -> AsyncIterator[bytes]:
    """Yield a file's content from its start in chunks (a retry-safe body)."""
    f.seek(0)
    while True:
        chunk = f.read(CHUNK)
        if not chunk:
            return
        yield chunk


def _inside(base: str, target: str) -> bool:
    base = os.path.realpath(base)
    target = os.path.realpath(target)
    return target == base or target.startswith(base + os.sep)


def safe_extract(f: IO[bytes], dest: PathLike) -> None:
    """Extract the tar ``f`` into ``dest`` (created if needed), refusing
    entries that would land outside it."""
    dest = os.fspath(dest)
    os.makedirs(dest, exist_ok=True)
    f.seek(0)
    with tarfile.open(fileobj=f, mode="r:*") as tf:
        members = []
        for m in tf:
            name = m.name
            norm = posixpath.normpath(name)
            if norm in (".", ""):
                continue  # the root directory entry "./"
            if name.startswith("/") or norm == ".." or norm.startswith("../"):
                raise ValueError(f"refusing tar entry outside the destination: {name!r}")
            if m.isdev() or m.isfifo():
                continue
            target = os.path.join(dest, norm)
            if not _inside(dest, os.path.dirname(target)):
                raise ValueError(f"refusing tar entry outside the destination: {name!r}")
            if m.issym():
                link = m.linkname
                resolved = os.path.join(os.path.dirname(target), link)
                if link.startswith("/") or not _inside(dest, resolved):
                    raise ValueError(f"refusing symlink that points outside the destination: {name!r} -> {link!r}")
            if m.islnk():
                ln = posixpath.normpath(m.linkname)
                if m.linkname.startswith("/") or ln == ".." or ln.startswith("../"):
                    raise ValueError(f"refusing hard link outside the destination: {name!r} -> {m.linkname!r}")
            m.name = norm
            members.append(m)
        _extract(tf, dest, members)


def _extract(tf: tarfile.TarFile, dest: str, members: list) -> None:  # type: ignore[type-arg]
    data_filter = getattr(tarfile, "data_filter", None)
    if data_filter is not None:
        tf.extractall(dest, members=members, filter="data")
    else:  # Python without tar filters (older 3.9/3.10 patch releases)
        tf.extractall(dest, members=members)


def open_spool() -> IO[bytes]:
    return tempfile.SpooledTemporaryFile(max_size=SPOOL_MAX)


def as_binary(data: Union[bytes, bytearray, memoryview, BinaryIO]) -> Optional[bytes]:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    return None
