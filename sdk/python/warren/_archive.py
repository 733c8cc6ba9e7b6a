"""Tar helpers for uploads, and the hostile-tree extractor for downloads.

Uploads: archives are built into a spooled temporary file (in memory up to a
few MiB, then on disk) so that a retried upload can send the same bytes.

Downloads: everything a sandbox wrote is hostile (names, links, modes, sizes,
depth). :func:`extract` writes a tar stream into a local directory without
ever following a symlink: every path is walked one component at a time with
``O_NOFOLLOW|O_DIRECTORY`` relative to the destination's fd, and entries are
created with fd-relative calls, so no name the archive made can send a later
entry elsewhere. Its rules (the same as the Go extractor's, see
docs/SECURITY.md):

- names are relative, without ``..``; an entry whose parent is a symlink (or
  a file) is refused (InvalidError);
- symlinks are created as links, never followed, and only with a target that
  cannot leave the destination: relative, every ``..`` first, and no more of
  them than the link's depth (a link in ``a/b/`` may start with ``../../``).
  Each link checked that way can only climb to real directories below the
  destination, whatever the other links are, so the check needs no second
  pass (issue 18 case 1: ``x -> b/c/../../SECRET`` with ``b -> .``);
- hard links only to regular files this extraction created;
- no owners, xattrs or ACLs; permission bits masked with 0o755 (setuid,
  setgid, sticky and group/other write dropped) unless ``preserve``;
- devices, FIFOs, sockets and unknown types are skipped and counted;
- holes are kept: all-zero 4 KiB blocks are seeked over, then ftruncate;
- budgets: ``max_bytes`` of regular-file content (apparent size) and
  ``max_entries`` entries, ExhaustedError beyond;
- on any error, what the extraction created is removed (files it replaced
  are gone: a download overwrites names that exist in the destination);
- a bounded number of fds whatever the depth (paths far beyond PATH_MAX).

The extractor reads any file-like object; :class:`Pipe` feeds it from an
HTTP response while it downloads, so no archive is held whole in memory."""

from __future__ import annotations

import asyncio
import base64
import collections
import errno
import io
import os
import stat as _stat
import tarfile
import tempfile
import threading
import urllib.parse
from typing import IO, Any, AsyncIterator, Callable, Deque, Dict, List, Optional, Sequence, Set, Tuple, TypeVar, Union

from ._types import DownloadStats
from .errors import ConflictError, ExhaustedError, InvalidError, WarrenError

__all__ = [
    "build_tar",
    "single_file_tar",
    "iter_file",
    "extract",
    "safe_extract",
    "remove_tree",
    "Pipe",
    "HoleWriter",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_ENTRIES",
    "SPOOL_MAX",
]

SPOOL_MAX = 8 << 20
CHUNK = 1 << 20

#: Extraction budgets (the same defaults as the Go extractor's).
DEFAULT_MAX_BYTES = 1 << 30
DEFAULT_MAX_ENTRIES = 1_000_000

# Holes: a 4 KiB block of zeros is not written (the file system block size
# of ext4, xfs and tmpfs on x86-64).
_BLOCK = 4096
_ZERO_BLOCK = bytes(_BLOCK)
_ZERO_CHUNK = bytes(CHUNK)
# Directory fds kept open along the current path: enough for the usual
# back-and-forth of a depth-first archive; deeper moves reopen (down from
# the root or up through ".."), so 30,000 levels need no more fds than 3.
_FD_WINDOW = 32
# Bytes a download may have in flight between the HTTP reader and the
# extracting thread.
_PIPE_CAPACITY = 8 << 20

_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_O_NEWFILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

PathLike = Union[str, "os.PathLike[str]"]
T = TypeVar("T")


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


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


def exhausted(what: str, limit: str, value: int, detail: str) -> ExhaustedError:
    """The client-side budget error: says which limit and how to raise it."""
    e = ExhaustedError(
        f"{what}: {detail}, more than {limit}={value:,}; pass a larger {limit}= (or {limit}=None for no limit) "
        f"if you trust this much from the sandbox",
        category="exhausted",
    )
    e.limit = limit
    return e


def _refuse(what: str, name: str, why: str) -> InvalidError:
    return InvalidError(f"{what}: refusing archive entry {_show(name)}: {why}", category="invalid")


def _show(name: str) -> str:
    return repr(name if len(name) <= 200 else name[:90] + "..." + name[-90:])


class LocalError(Exception):
    """Carries a local file system error (an OSError of the destination)
    through the transport, which would take an OSError for a broken
    connection and retry; the caller re-raises ``error``."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class StreamAborted(Exception):
    """The download feeding the extractor failed (raised in its thread)."""


# ---------------------------------------------------------------------------
# Names
# ---------------------------------------------------------------------------


def _clean(what: str, name: str) -> Optional[Tuple[str, str]]:
    """Split an archive name into (parent, base), both relative to the
    destination ("" for the destination itself); None for the root entry.
    Refuses absolute names, NUL bytes and ``..``. String operations only,
    so that a 60 KB name of a 30,000-level tree costs no Python loop."""
    if "\x00" in name:
        raise _refuse(what, name, "NUL byte in the name")
    if name.startswith("/"):
        raise _refuse(what, name, "absolute name")
    n = name.rstrip("/")
    while n.startswith("./"):
        n = n[2:].lstrip("/")
    if n in ("", "."):
        return None
    if "//" in n or "/./" in n or n.endswith("/."):
        n = "/".join(c for c in n.split("/") if c not in ("", "."))
    if n == ".." or n.startswith("../") or n.endswith("/..") or "/../" in n:
        raise _refuse(what, name, "'..' in the name")
    parent, _, base = n.rpartition("/")
    return parent, base


def _link_escapes(target: str, depth: int) -> Optional[str]:
    """Why a symlink at ``depth`` (components below the destination of the
    directory holding it) with ``target`` could lead outside, or None."""
    if not target:
        return "empty target"
    if "\x00" in target:
        return "NUL byte in the target"
    if target.startswith("/"):
        return "absolute target (it would name a host path)"
    t = target
    if "//" in t or "./" in t or t.endswith("/.") or t == ".":
        t = "/".join(c for c in t.split("/") if c not in ("", "."))
    ups = 0
    while t.startswith("../") or t == "..":
        ups += 1
        if ups > depth:
            return f"its target climbs {ups} levels from a directory {depth} below the destination"
        t = t[3:]
    if t == ".." or t.startswith("../") or t.endswith("/..") or "/../" in t:
        return "'..' after a name in the target (it would climb through whatever that name is)"
    return None


# ---------------------------------------------------------------------------
# Directories along one path, with a bounded number of fds
# ---------------------------------------------------------------------------


def _ident(st: os.stat_result) -> Tuple[int, int]:
    return (st.st_dev, st.st_ino)


class _Dirs:
    """The directory chain of the last entry's parent, below ``root``.

    Keeps the chain's names, each level's (dev, ino) and whether the
    extraction made it, but fds only for the deepest ``_FD_WINDOW`` levels
    (plus the root). Moving to another path shares the common prefix: down
    is one openat per new level, up is one openat("..") per level checked
    against the recorded (dev, ino), so a depth-first archive costs O(1)
    opens per entry at any depth."""

    def __init__(
        self,
        what: str,
        root_fd: int,
        on_mkdir: Callable[["_Dirs", str, int], None],
        made_ids: Optional[Set[Tuple[int, int]]] = None,
    ) -> None:
        self.what = what
        self.root = root_fd
        self.names: List[str] = []
        self.ids: List[Tuple[int, int]] = [_ident(os.fstat(root_fd))]
        self.ours: List[bool] = [False]  # the extraction made this level (and so all below)
        self.fds: Dict[int, int] = {0: root_fd}
        self.lo = 0  # lowest open non-root level (0: none)
        self.path = ""
        self._on_mkdir = on_mkdir
        # (dev, ino) of what the extraction made directly in directories it
        # did not make: re-entering one of those marks the level as ours
        self._made_ids = made_ids if made_ids is not None else set()

    @property
    def depth(self) -> int:
        return len(self.names)

    @property
    def top(self) -> int:
        return self.fds[len(self.names)]

    def close(self) -> None:
        for d, fd in list(self.fds.items()):
            if d != 0:
                os.close(fd)
        self.fds = {0: self.root}
        self.names, self.ids, self.ours = [], self.ids[:1], self.ours[:1]
        self.lo, self.path = 0, ""

    def go(self, p: str, create: bool = True) -> int:
        """The fd of directory ``p`` (a cleaned relative path, "" = root),
        creating missing levels when ``create``. Raises InvalidError when a
        level is a symlink or not a directory, FileNotFoundError when one
        is missing and not ``create``."""
        cur = self.path
        if p == cur:
            return self.top
        if not cur:
            keep, cut, rest = 0, 0, p
        elif len(p) > len(cur) and p.startswith(cur) and p[len(cur)] == "/":
            keep, cut, rest = len(self.names), len(cur), p[len(cur) + 1 :]
        else:
            keep, cut = self._common(p)
            rest = p[cut + 1 :] if cut else p
            if cut == len(p):
                rest = ""
        self._up(keep, cut)
        if rest:
            for name in rest.split("/"):
                self._down(name, create)
        return self.top

    def _common(self, p: str) -> Tuple[int, int]:
        """(levels, chars) of the longest common directory prefix of ``p``
        and the current path, by binary search on slices (C-speed)."""
        cur = self.path
        lo, hi = 0, min(len(p), len(cur))
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if p[:mid] == cur[:mid]:
                lo = mid
            else:
                hi = mid - 1
        n = lo
        if (n == len(p) or p[n] == "/") and (n == len(cur) or cur[n] == "/"):
            j = n
        else:
            j = cur.rfind("/", 0, n)
            if j < 0:
                return 0, 0
        return (cur.count("/", 0, j) + 1 if j > 0 else 0), max(j, 0)

    def _up(self, keep: int, cut: int) -> None:
        """Truncate the chain to its first ``keep`` levels (``cut`` chars)."""
        n = len(self.names)
        if keep == n:
            return
        if keep not in self.fds:
            if self.lo and self.lo - keep <= keep:
                # up through "..", one level at a time, from the lowest open one
                start, steps = self.fds[self.lo], [("..", d) for d in range(self.lo - 1, keep - 1, -1)]
            else:
                start, steps = self.root, [(self.names[d - 1], d) for d in range(1, keep + 1)]
            self.fds[keep] = self._walk(start, steps)
        for d in list(self.fds):
            if d > keep:
                os.close(self.fds.pop(d))
        del self.names[keep:], self.ids[keep + 1 :], self.ours[keep + 1 :]
        self.path = self.path[:cut]
        self.lo = keep

    def _walk(self, fd: int, steps: List[Tuple[str, int]]) -> int:
        """Open each (name, level) in turn from ``fd`` (which stays open),
        checking each level's (dev, ino); returns the last fd."""
        owned = False
        try:
            for name, d in steps:
                nfd = os.open(name, _O_DIR, dir_fd=fd)
                if owned:
                    os.close(fd)
                fd, owned = nfd, True
                if _ident(os.fstat(fd)) != self.ids[d]:
                    raise WarrenError(f"{self.what}: a directory of the destination moved during the extraction")
        except BaseException:
            if owned:
                os.close(fd)
            raise
        return fd

    def _down(self, name: str, create: bool) -> None:
        parent = self.top
        made = False
        try:
            fd = os.open(name, _O_DIR, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise
            os.mkdir(name, 0o700, dir_fd=parent)
            made = True
            fd = os.open(name, _O_DIR, dir_fd=parent)
            os.fchmod(fd, 0o755)
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            kind = "a symlink" if _stat.S_ISLNK(st.st_mode) else "not a directory"
            p = self.path + "/" + name if self.path else name
            raise InvalidError(
                f"{self.what}: refusing archive entries under {_show(p)}: it is {kind} "
                f"(entries are never written through links)",
                category="invalid",
            ) from None
        ident = _ident(os.fstat(fd))
        if made:
            self._on_mkdir(self, name, fd)
        d = len(self.names) + 1
        self.fds[d] = fd
        self.names.append(name)
        self.ids.append(ident)
        self.ours.append(made or self.ours[-1] or ident in self._made_ids)
        self.path = self.path + "/" + name if self.path else name
        if not self.lo:
            self.lo = d
        while d - self.lo >= _FD_WINDOW:
            os.close(self.fds.pop(self.lo))
            self.lo += 1


# ---------------------------------------------------------------------------
# Writing file content with holes
# ---------------------------------------------------------------------------


class HoleWriter:
    """Writes a file's content at ``fd`` from offset 0, seeking over
    all-zero 4 KiB blocks; :meth:`finish` sets the length (ftruncate), so a
    3 GB sparse file takes a few blocks of disk."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.off = 0

    def write(self, buf: bytes) -> None:
        n = len(buf)
        if n == CHUNK and buf == _ZERO_CHUNK:
            self.off += n
            return
        mv = memoryview(buf)
        start = -1
        for i in range(0, n, _BLOCK):
            blk = buf[i : i + _BLOCK]
            if blk == _ZERO_BLOCK[: len(blk)]:
                if start >= 0:
                    self._put(mv[start:i], self.off + start)
                    start = -1
            elif start < 0:
                start = i
        if start >= 0:
            self._put(mv[start:], self.off + start)
        self.off += n

    def _put(self, data: memoryview, off: int) -> None:
        while data:
            k = os.pwrite(self.fd, data, off)
            data, off = data[k:], off + k

    def finish(self) -> None:
        os.ftruncate(self.fd, self.off)


# ---------------------------------------------------------------------------
# The extractor
# ---------------------------------------------------------------------------


class _Extractor:
    def __init__(
        self,
        what: str,
        root_fd: int,
        *,
        max_bytes: Optional[int],
        max_entries: Optional[int],
        preserve: bool,
        symlinks_as_is: bool = False,
        xattr_allow: Sequence[str] = (),
    ) -> None:
        self.what = what
        self.root = root_fd
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.preserve = preserve
        self.mask = 0o7777 if preserve else 0o755
        self.symlinks_as_is = symlinks_as_is
        self.xattr_allow = tuple(xattr_allow)
        # What the extraction made directly in directories it did not make
        # (in creation order, for the rollback; everything below a directory
        # it made goes with that directory), and their (dev, ino).
        self.made: List[Tuple[str, str]] = []
        self.made_ids: Set[Tuple[int, int]] = set()
        self.dirs = _Dirs(what, root_fd, self._made_dir, self.made_ids)
        # Directories whose mode lacks u+rwx, set last so that their
        # entries can still be made (path, mode).
        self.late_modes: List[Tuple[str, int]] = []
        self.entries = self.files = self.dirs_n = self.symlinks = self.hardlinks = self.skipped = 0
        self.bytes = 0
        self.modes_masked = self.special_bits = self.xattrs_dropped = 0

    def stats(self) -> DownloadStats:
        return DownloadStats(
            entries=self.entries,
            files=self.files,
            dirs=self.dirs_n,
            symlinks=self.symlinks,
            hardlinks=self.hardlinks,
            skipped=self.skipped,
            file_bytes=self.bytes,
            modes_masked=self.modes_masked,
            special_bits=self.special_bits,
            xattrs_dropped=self.xattrs_dropped,
        )

    # -- bookkeeping ------------------------------------------------------

    def _made_dir(self, dirs: _Dirs, name: str, fd: int) -> None:
        self._record(name, os.fstat(fd))

    def _record(self, name: str, st: os.stat_result) -> None:
        """Note that ``name`` in the current directory was made by us."""
        if self.dirs.ours[-1]:
            return
        self.made.append((self.dirs.path, name))
        self.made_ids.add(_ident(st))

    def _ours_in_top(self, st: os.stat_result) -> bool:
        return self.dirs.ours[-1] or _ident(st) in self.made_ids

    # -- the walk ---------------------------------------------------------

    def run(self, tf: tarfile.TarFile) -> None:
        while True:
            m = tf.next()
            if m is None:
                return
            # TarFile keeps every member it read; a stream of a million
            # entries would keep a million TarInfos.
            tf.members = []  # type: ignore[attr-defined]
            self.entry(tf, m)

    def entry(self, tf: tarfile.TarFile, m: tarfile.TarInfo) -> None:
        self.entries += 1
        if self.max_entries is not None and self.entries > self.max_entries:
            raise exhausted(self.what, "max_entries", self.max_entries, "the archive has more entries")
        split = _clean(self.what, m.name)
        if split is None:
            if not m.isdir():
                raise _refuse(self.what, m.name, "it would replace the destination directory")
            return
        parent, base = split
        if m.islnk():
            self.hardlink(m, parent, base)
        elif m.isdir():
            self.dir(m, parent, base)
        elif m.issym():
            self.symlink(m, parent, base)
        elif m.isreg():
            self.file(tf, m, parent, base)
        else:  # devices, FIFOs, unknown types: never made on the host
            self.skipped += 1

    def _clear(self, fd: int, base: str, name: str) -> None:
        """Make room for a new entry: an existing non-directory of the
        same name is replaced; a directory never is."""
        st = os.stat(base, dir_fd=fd, follow_symlinks=False)
        if _stat.S_ISDIR(st.st_mode):
            raise ConflictError(
                f"{self.what}: refusing archive entry {_show(name)}: a directory of that name exists "
                "(a directory is never replaced by a non-directory)",
                category="conflict",
            )
        os.unlink(base, dir_fd=fd)

    def _create(self, fd: int, base: str, name: str, make: Callable[[], T]) -> T:
        try:
            return make()
        except FileExistsError:
            self._clear(fd, base, name)
            return make()

    def dir(self, m: tarfile.TarInfo, parent: str, base: str) -> None:
        fd = self.dirs.go(parent)
        made = True
        try:
            os.mkdir(base, 0o700, dir_fd=fd)
        except FileExistsError:
            st = os.stat(base, dir_fd=fd, follow_symlinks=False)
            if _stat.S_ISDIR(st.st_mode):
                made = False
            else:
                os.unlink(base, dir_fd=fd)
                os.mkdir(base, 0o700, dir_fd=fd)
        dfd = os.open(base, _O_DIR, dir_fd=fd)
        try:
            st = os.fstat(dfd)
            if made:
                self._record(base, st)
            if made or self._ours_in_top(st):  # a directory that was there keeps its mode
                mode = self._mode(m)
                if not self.preserve:
                    mode |= 0o700  # the owner can always remove the tree
                if mode & 0o700 == 0o700:
                    os.fchmod(dfd, mode)
                else:  # set last, so that its entries can still be made
                    self.late_modes.append((parent + "/" + base if parent else base, mode))
                self._xattrs(m, dfd)
        finally:
            os.close(dfd)
        self.dirs_n += 1

    def _mode(self, m: tarfile.TarInfo) -> int:
        mode = m.mode & 0o7777
        if mode & ~self.mask:
            self.modes_masked += 1
            if mode & 0o7000:
                self.special_bits += 1
        return mode & self.mask

    def _xattrs(self, m: tarfile.TarInfo, fd: int) -> None:
        """Apply the entry's xattrs whose names start with an allowed
        prefix; count the others (ACLs are system.posix_acl_* xattrs)."""
        for key, value in m.pax_headers.items():
            if key.startswith("SCHILY.xattr."):
                name, raw = key[len("SCHILY.xattr.") :], value.encode("utf-8", "surrogateescape")
            elif key.startswith("LIBARCHIVE.xattr."):
                name = urllib.parse.unquote(key[len("LIBARCHIVE.xattr.") :])
                try:
                    raw = base64.b64decode(value + "=" * (-len(value) % 4))
                except ValueError:
                    self.xattrs_dropped += 1
                    continue
            else:
                continue
            if not any(name.startswith(p) for p in self.xattr_allow):
                self.xattrs_dropped += 1
                continue
            try:
                os.setxattr(fd, name, raw)
            except OSError as e:
                if e.errno not in (errno.ENOTSUP, errno.EPERM, errno.EINVAL):
                    raise
                self.xattrs_dropped += 1  # the host file system takes no such name

    def symlink(self, m: tarfile.TarInfo, parent: str, base: str) -> None:
        fd = self.dirs.go(parent)
        why = _link_escapes(m.linkname, self.dirs.depth)
        if why is not None and not self.symlinks_as_is:
            raise _refuse(
                self.what, m.name,
                f"symlink to {_show(m.linkname)} could lead outside the destination: {why}; "
                "pass symlinks_as_is=True to keep such links (whoever opens files of the tree then follows them)",
            )
        if not m.linkname or "\x00" in m.linkname:
            raise _refuse(self.what, m.name, "symlink with an empty target or a NUL byte")
        self._create(fd, base, m.name, lambda: os.symlink(m.linkname, base, dir_fd=fd))
        self._record(base, os.stat(base, dir_fd=fd, follow_symlinks=False))
        try:
            os.utime(base, (m.mtime, m.mtime), dir_fd=fd, follow_symlinks=False)
        except (OverflowError, ValueError, NotImplementedError):
            pass
        self.symlinks += 1

    def hardlink(self, m: tarfile.TarInfo, parent: str, base: str) -> None:
        try:
            split = _clean(self.what, m.linkname)
        except InvalidError:
            split = None
        if split is None:
            raise _refuse(self.what, m.name, f"hard link to {_show(m.linkname)}, outside the destination")
        sparent, sbase = split
        not_ours = _refuse(self.what, m.name, f"hard link to {_show(m.linkname)}, not a file this archive created")
        try:
            sfd = os.dup(self.dirs.go(sparent, create=False))
        except FileNotFoundError:
            raise not_ours from None
        try:
            try:
                src = os.stat(sbase, dir_fd=sfd, follow_symlinks=False)
            except FileNotFoundError:
                raise not_ours from None
            if not _stat.S_ISREG(src.st_mode) or not self._ours_in_top(src):
                raise not_ours
            fd = self.dirs.go(parent)
            if (sparent, sbase) == (parent, base):
                return  # a link to itself: already there
            self._create(
                fd, base, m.name,
                lambda: os.link(sbase, base, src_dir_fd=sfd, dst_dir_fd=fd, follow_symlinks=False),
            )
            st = os.stat(base, dir_fd=fd, follow_symlinks=False)
            if _ident(st) != _ident(src):
                raise WarrenError(f"{self.what}: {_show(m.linkname)} changed while linking {_show(m.name)} to it")
            self._record(base, st)
        finally:
            os.close(sfd)
        self.hardlinks += 1

    def file(self, tf: tarfile.TarFile, m: tarfile.TarInfo, parent: str, base: str) -> None:
        if self.max_bytes is not None and self.bytes + m.size > self.max_bytes:
            raise exhausted(
                self.what, "max_bytes", self.max_bytes,
                f"file {_show(m.name)} of {m.size:,} bytes brings the files' content to {self.bytes + m.size:,} bytes",
            )
        fd = self.dirs.go(parent)
        ffd = self._create(fd, base, m.name, lambda: os.open(base, _O_NEWFILE, 0o600, dir_fd=fd))
        try:
            self._record(base, os.fstat(ffd))
            src = tf.extractfile(m)
            w = HoleWriter(ffd)
            if src is not None:
                while True:
                    buf = src.read(CHUNK)
                    if not buf:
                        break
                    w.write(buf)
            if w.off != m.size:
                raise tarfile.ReadError(f"{m.name}: {w.off} of {m.size} bytes")
            w.finish()
            os.fchmod(ffd, self._mode(m))
            self._xattrs(m, ffd)
            try:
                os.utime(ffd, (m.mtime, m.mtime))
            except (OverflowError, ValueError):
                pass  # a time the host cannot represent: keep "now"
        finally:
            os.close(ffd)
        self.bytes += m.size
        self.files += 1

    # -- the end ----------------------------------------------------------

    def finish(self) -> None:
        for p, mode in reversed(self.late_modes):
            os.fchmod(self.dirs.go(p, create=False), mode)

    def rollback(self) -> None:
        """Remove what the extraction made (best effort: the error that
        made us roll back is the one that matters)."""
        self.dirs.close()  # it may be mid-move after an error
        for parent, name in reversed(self.made):
            try:
                fd = self.dirs.go(parent, create=False)
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if _ident(st) not in self.made_ids:
                    continue  # replaced by something that is not ours
                if _stat.S_ISDIR(st.st_mode):
                    remove_tree(fd, name)
                else:
                    os.unlink(name, dir_fd=fd)
            except (OSError, WarrenError):
                pass


def remove_tree(parent_fd: int, name: str) -> None:
    """Remove ``name`` in ``parent_fd`` and everything below it without
    following symlinks, iteratively, with at most two directory fds open at
    any depth (up is openat(".."), checked against the (dev, ino) noted on
    the way down)."""
    st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    if not _stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=parent_fd)
        return
    names = [name]
    ids = [_ident(st)]
    fd = os.open(name, _O_DIR, dir_fd=parent_fd)
    try:
        while True:
            sub = None
            with os.scandir(fd) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        sub = e.name
                        break
                    try:
                        os.unlink(e.name, dir_fd=fd)
                    except FileNotFoundError:
                        pass
            if sub is not None:
                nfd = os.open(sub, _O_DIR, dir_fd=fd)
                os.close(fd)
                fd = nfd
                names.append(sub)
                ids.append(_ident(os.fstat(fd)))
                continue
            # fd is empty: go up and remove it.
            child = names.pop()
            ids.pop()
            if not names:
                os.close(fd)
                fd = -1
                os.rmdir(child, dir_fd=parent_fd)
                return
            up = os.open("..", _O_DIR, dir_fd=fd)
            os.close(fd)
            fd = up
            if _ident(os.fstat(fd)) != ids[-1]:
                raise OSError(errno.ESTALE, "a directory moved while it was being removed", names[-1])
            os.rmdir(child, dir_fd=fd)
    finally:
        if fd >= 0:
            os.close(fd)


def _open_dest(what: str, dest: str, create: bool = True) -> Tuple[int, Optional[Tuple[int, str]]]:
    """Open the destination directory, walking its path from "/" without
    following symlinks and making missing components (like the Go
    extractor: a download into a directory reached through a link, maybe
    one an earlier download made, is refused; pass a resolved path).
    Returns its fd and, if this made part of the path, (fd of the parent of
    the topmost directory made, its name) for the rollback."""
    p = os.path.abspath(dest)
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    made: Optional[Tuple[int, str]] = None
    done = ""
    try:
        for c in [c for c in p.split("/") if c]:
            try:
                nfd = os.open(c, _O_DIR, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(c, 0o755, dir_fd=fd)
                if made is None:
                    made = (os.dup(fd), c)
                nfd = os.open(c, _O_DIR, dir_fd=fd)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                kind = "a symlink" if os.path.islink(done + "/" + c) else "not a directory"
                raise InvalidError(
                    f"{what}: the destination {dest!r} goes through {done + '/' + c!r}, which is {kind}; "
                    "downloads never follow links: pass a resolved path (os.path.realpath) if you trust it",
                    category="invalid",
                ) from None
            os.close(fd)
            fd = nfd
            done += "/" + c
    except BaseException:
        os.close(fd)
        if made is not None:
            _remove_made(made)
        raise
    return fd, made


def open_local_file(what: str, path: PathLike) -> Tuple[int, Callable[[bool], None]]:
    """Open the local file ``path`` for writing (created or truncated)
    the way downloads resolve destinations: no symlink followed, neither
    in the directories leading to it nor as the file itself. Returns the
    fd and ``done(failed)``, to call once the fd is closed: it removes the
    file if the write failed and this call created it."""
    p = os.path.abspath(os.fspath(path))
    parent, name = os.path.split(p)
    dfd, _ = _open_dest(what, parent, create=False)
    try:
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
            created = True
        except FileExistsError:
            try:
                fd = os.open(name, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            except OSError as e:
                if e.errno != errno.ELOOP:
                    raise
                raise InvalidError(
                    f"{what}: the destination {os.fspath(path)!r} is a symlink; downloads never follow links: "
                    "pass a resolved path (os.path.realpath) if you trust it",
                    category="invalid",
                ) from None
            created = False
        ident = _ident(os.fstat(fd))
    except BaseException:
        os.close(dfd)
        raise

    def done(failed: bool) -> None:
        try:
            if failed and created and _ident(os.stat(name, dir_fd=dfd, follow_symlinks=False)) == ident:
                os.unlink(name, dir_fd=dfd)
        except OSError:
            pass
        finally:
            os.close(dfd)

    return fd, done


def _remove_made(made: Tuple[int, str]) -> None:
    pfd, name = made
    try:
        remove_tree(pfd, name)
    except OSError:
        pass
    finally:
        os.close(pfd)


def extract(
    src: Any,
    dest: PathLike,
    *,
    max_bytes: Optional[int] = DEFAULT_MAX_BYTES,
    max_entries: Optional[int] = DEFAULT_MAX_ENTRIES,
    preserve: bool = False,
    symlinks_as_is: bool = False,
    xattr_allow: Sequence[str] = (),
    what: str = "download",
) -> DownloadStats:
    """Extract the tar stream ``src`` (any object with ``read``; plain or
    compressed, read once, front to back) into the local directory ``dest``
    (created if missing), with the rules of this module's docstring. On any
    error what the extraction made is removed (``dest`` too if it made it)
    and the error raised: InvalidError for a refused entry, ExhaustedError
    for a budget, OSError for the local file system."""
    for limit, v in (("max_bytes", max_bytes), ("max_entries", max_entries)):
        if v is not None and v < 0:
            raise ValueError(f"{limit} must not be negative")
    dest = os.fspath(dest)
    root, made_top = _open_dest(what, dest)
    x = _Extractor(
        what, root, max_bytes=max_bytes, max_entries=max_entries, preserve=preserve,
        symlinks_as_is=symlinks_as_is, xattr_allow=xattr_allow,
    )
    ok = False
    try:
        try:
            with _open_tar(src) as tf:
                x.run(tf)
        except tarfile.TarError as e:
            raise InvalidError(f"{what}: the archive is not a valid tar stream: {e}", category="invalid") from e
        x.finish()
        ok = True
        return x.stats()
    finally:
        if not ok:
            x.rollback()
        x.dirs.close()
        os.close(root)
        if made_top is not None:
            if ok:
                os.close(made_top[0])
            else:
                _remove_made(made_top)


class _Forward:
    """A read-once stream that tarfile's random-access mode can use: tell,
    and seek forward (by reading). tarfile's stream mode copies its whole
    buffer on every read (a 512-byte header read of a 1 MiB buffer copies
    1 MiB: 100,000 small files took 44 s); this hands out slices."""

    def __init__(self, src: Any) -> None:
        self._src = src
        self._buf = b""
        self._off = 0
        self._pos = 0

    def tell(self) -> int:
        return self._pos

    def seekable(self) -> bool:
        return True

    def peek(self, n: int) -> bytes:
        while len(self._buf) - self._off < n:
            more = self._src.read(CHUNK)
            if not more:
                break
            self._buf = self._buf[self._off :] + more
            self._off = 0
        return self._buf[self._off : self._off + n]

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            parts = [self._buf[self._off :]]
            while True:
                more = self._src.read(CHUNK)
                if not more:
                    break
                parts.append(more)
            self._buf, self._off = b"", 0
            out = b"".join(parts)
            self._pos += len(out)
            return out
        avail = len(self._buf) - self._off
        if avail >= n:
            out = self._buf[self._off : self._off + n]
            self._off += n
        else:
            parts = [self._buf[self._off :]] if avail else []
            need = n - avail
            self._buf, self._off = b"", 0
            while need > 0:
                more = self._src.read(CHUNK)
                if not more:
                    break
                if len(more) > need:
                    parts.append(more[:need])
                    self._buf, self._off = more, need
                    need = 0
                else:
                    parts.append(more)
                    need -= len(more)
            out = parts[0] if len(parts) == 1 else b"".join(parts)
        self._pos += len(out)
        return out

    def seek(self, pos: int, whence: int = 0) -> int:
        if whence == 1:
            pos += self._pos
        elif whence != 0:
            raise io.UnsupportedOperation("seek from the end of a stream")
        if pos < self._pos:
            raise io.UnsupportedOperation(f"seek back in a stream (to {pos} from {self._pos})")
        while self._pos < pos:
            if not self.read(min(pos - self._pos, CHUNK)):
                break
        return self._pos


_COMPRESSED_MAGIC = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")


def _open_tar(src: Any) -> tarfile.TarFile:
    """A TarFile reading ``src`` once, front to back: plain tars through
    :class:`_Forward`, compressed ones in tarfile's stream mode."""
    fwd: Any = _Forward(src)
    if fwd.peek(6).startswith(_COMPRESSED_MAGIC):
        return tarfile.open(fileobj=fwd, mode="r|*")
    return tarfile.open(fileobj=fwd, mode="r:")


def safe_extract(f: IO[bytes], dest: PathLike, **opts: Any) -> DownloadStats:
    """Extract the tar file ``f`` from its start (see :func:`extract`)."""
    f.seek(0)
    return extract(f, dest, **opts)


# ---------------------------------------------------------------------------
# Streaming a download into the extractor
# ---------------------------------------------------------------------------


class Pipe:
    """A bounded byte queue from the event loop (:meth:`put`) to one reading
    thread (:meth:`read`, a file-like ``read`` for tarfile). ``put`` waits
    while ``capacity`` bytes are in flight and returns False once the reader
    stopped (it finished or failed), so a download never buffers more than
    the capacity and stops when the extractor does."""

    def __init__(self, loop: asyncio.AbstractEventLoop, capacity: int = _PIPE_CAPACITY) -> None:
        self._loop = loop
        self._cap = capacity
        self._cond = threading.Condition()
        self._chunks: Deque[bytes] = collections.deque()
        self._size = 0
        self._eof = False
        self._aborted = False
        self._reader_done = False
        self._space: Optional["asyncio.Future[None]"] = None

    # -- the event loop's side -------------------------------------------

    async def put(self, chunk: bytes) -> bool:
        while True:
            with self._cond:
                if self._reader_done:
                    return False
                if self._size < self._cap:
                    self._chunks.append(chunk)
                    self._size += len(chunk)
                    self._cond.notify()
                    return True
                fut = self._space = self._loop.create_future()
            await fut

    def close(self) -> None:
        """The stream ended (the reader sees EOF after the queued bytes)."""
        with self._cond:
            self._eof = True
            self._cond.notify()

    def abort(self) -> None:
        """The stream broke: the reader's next read raises StreamAborted."""
        with self._cond:
            self._aborted = True
            self._cond.notify()

    # -- the reading thread's side ---------------------------------------

    def read(self, n: int = -1) -> bytes:
        with self._cond:
            while not self._chunks and not self._eof and not self._aborted:
                self._cond.wait()
            if self._aborted:
                raise StreamAborted("the download broke")
            if not self._chunks:
                return b""
            chunk = self._chunks[0]
            if n < 0 or n >= len(chunk):
                self._chunks.popleft()
                out = chunk
            else:
                out, self._chunks[0] = chunk[:n], chunk[n:]
            self._size -= len(out)
            self._wake()
            return out

    def done_reading(self) -> None:
        with self._cond:
            self._reader_done = True
            self._chunks.clear()
            self._size = 0
            self._wake()

    def _wake(self) -> None:
        f = self._space
        if f is not None:
            self._space = None
            self._loop.call_soon_threadsafe(_resolve, f)


def _resolve(f: "asyncio.Future[None]") -> None:
    if not f.done():
        f.set_result(None)


async def run_fed(resp: Any, consume: Callable[[Pipe], T], chunk: int = CHUNK) -> T:
    """Run ``consume(pipe)`` in a thread of its own while the body of the
    aiohttp response ``resp`` is fed into the pipe; return its result. A
    broken download aborts the consumer (which cleans up) and is raised
    after it finished; a consumer error stops the download and is raised
    (an OSError wrapped in :class:`LocalError`, see there)."""
    loop = asyncio.get_running_loop()
    pipe = Pipe(loop)
    done: "asyncio.Future[T]" = loop.create_future()

    def main() -> None:
        try:
            try:
                r = consume(pipe)
            except OSError as e:
                raise LocalError(e) from e
        except BaseException as e:  # noqa: BLE001 - handed to the loop
            loop.call_soon_threadsafe(_fail, done, e)
        else:
            loop.call_soon_threadsafe(_succeed, done, r)
        finally:
            pipe.done_reading()

    # A thread of its own, not the loop's default executor: a download
    # waits on the network, and six of them would fill that executor.
    threading.Thread(target=main, name="warren-extract", daemon=True).start()
    try:
        async for data in resp.content.iter_chunked(chunk):
            if not await pipe.put(data):
                break
        pipe.close()
    except BaseException:
        pipe.abort()
        try:
            await asyncio.shield(done)
        except BaseException:  # noqa: BLE001 - the download's error wins
            pass
        raise
    return await done


def _fail(f: "asyncio.Future[Any]", e: BaseException) -> None:
    if not f.done():
        f.set_exception(e)


def _succeed(f: "asyncio.Future[Any]", r: Any) -> None:
    if not f.done():
        f.set_result(r)
