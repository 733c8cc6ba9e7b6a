"""The hostile-tree extractor (warren._archive.extract) on crafted tars, no
daemon: what a sandbox could put in a download's tar stream that a sandbox
cannot easily make itself (names repeated, hard links out, xattrs, owners,
30,000 levels)."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
import tarfile
from typing import Any, List, Optional, Tuple

import pytest

import warren
from warren import _archive

Entry = Tuple[Any, ...]


def _tar(entries: List[Entry], pax: Optional[dict] = None) -> io.BytesIO:
    """A tar of (name, type[, data-or-linkname[, mode]]) entries."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for e in entries:
            ti = tarfile.TarInfo(e[0])
            ti.type = e[1]
            data = b""
            if ti.type == tarfile.REGTYPE:
                data = e[2] if len(e) > 2 else b"x"
                ti.size = len(data)
                ti.mode = e[3] if len(e) > 3 else 0o644
            elif ti.type in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                ti.linkname = e[2]
            elif ti.type == tarfile.DIRTYPE:
                ti.mode = e[2] if len(e) > 2 else 0o755
            if pax:
                ti.pax_headers = dict(pax)
            tf.addfile(ti, io.BytesIO(data))
    buf.seek(0)
    return buf


F, D, L, H, FIFO = tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE


@pytest.fixture
def base(tmp_path: Any) -> str:
    """A directory holding a host SECRET next to the destinations."""
    b = os.fspath(tmp_path)
    with open(os.path.join(b, "SECRET"), "w") as f:
        f.write("host secret\n")
    return b


def _listing(root: str) -> List[str]:
    out = []
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            out.append(os.path.relpath(os.path.join(d, n), root))
    return sorted(out)


def _refused(tar: io.BytesIO, dest: str, **kw: Any) -> warren.InvalidError:
    with pytest.raises(warren.InvalidError) as ei:
        _archive.extract(tar, dest, **kw)
    return ei.value


def test_links_that_could_leave_the_destination_are_refused(base: str) -> None:
    """Issue 18 case 1 and its variants: a symlink whose target could lead
    out of the destination is refused whatever order the entries come in,
    and the partial tree goes."""
    dest = os.path.join(base, "dest")
    cases = [
        # case 1 as the daemon's tar has it: the link first, b -> . later
        [("answer.txt", L, "b/c/../../SECRET"), ("b", L, "."), ("c", D)],
        # a chain through a directory that appears later in the archive
        [("l1", L, "d/l2"), ("d", D), ("d/l2", L, "../../SECRET")],
        [("x", L, "../SECRET")],
        [("abs", L, "/etc/passwd")],
        [("a", D), ("a/up", L, "../../dest2/f")],  # dest vs dest2: a prefix of the name
        [("ok", F, b"fine"), ("a/b", D), ("a/b/up", L, "./../.././../SECRET")],
    ]
    os.makedirs(os.path.join(base, "dest2"))
    with open(os.path.join(base, "dest2", "f"), "w") as f:
        f.write("next door\n")
    for entries in cases:
        e = _refused(_tar(entries), dest)
        assert "symlink" in str(e) and "outside the destination" in str(e), e
        assert not os.path.lexists(dest), entries
    assert open(os.path.join(base, "dest2", "f")).read() == "next door\n"

    # Links that stay inside are kept as links, never followed.
    st = _archive.extract(
        _tar([("a/b", D), ("a/b/up", L, "../../top"), ("top", F, b"t"), ("a/rel", L, "b/up"), ("dot", L, ".")]), dest
    )
    assert st.symlinks == 3 and st.files == 1
    assert os.readlink(os.path.join(dest, "a/b/up")) == "../../top"
    assert open(os.path.join(dest, "a/rel")).read() == "t"


def test_symlink_loop_is_kept_as_links(base: str) -> None:
    dest = os.path.join(base, "dest")
    st = _archive.extract(_tar([("a", L, "b"), ("b", L, "a"), ("d", D), ("d/self", L, "self")]), dest)
    assert st.symlinks == 3
    assert os.readlink(os.path.join(dest, "a")) == "b"
    with pytest.raises(OSError) as ei:
        open(os.path.join(dest, "a"))
    assert ei.value.errno == errno.ELOOP


def test_entries_under_a_symlink_are_refused(base: str) -> None:
    """An entry whose parent is a symlink is never written through it,
    even when the link points inside."""
    dest = os.path.join(base, "dest")
    os.makedirs(os.path.join(base, "victim"))
    for entries in (
        [("sub", D), ("l", L, "sub"), ("l/f", F)],
        [("b", L, "."), ("b/b/f", F)],
        [("f", F), ("f/g", F)],  # a file as a parent
    ):
        e = _refused(_tar(entries), dest)
        assert "under" in str(e), e
        assert not os.path.lexists(dest)


def test_repeated_names_replace_earlier_entries(base: str) -> None:
    """A name repeated as file then symlink (and back) ends as the last
    entry; nothing is written through the replaced link; a directory is
    never replaced by a file."""
    dest = os.path.join(base, "dest")
    st = _archive.extract(
        _tar([("t", F, b"target"), ("x", F, b"first"), ("x", L, "t"), ("y", L, "t"), ("y", F, b"second"), ("z", F), ("z", D)]),
        dest,
    )
    assert os.readlink(os.path.join(dest, "x")) == "t"
    assert not os.path.islink(os.path.join(dest, "y")) and open(os.path.join(dest, "y")).read() == "second"
    assert open(os.path.join(dest, "t")).read() == "target"  # not written through y
    assert os.path.isdir(os.path.join(dest, "z")) and st.entries == 7
    with pytest.raises(warren.ConflictError) as ei:
        _archive.extract(_tar([("d", D), ("d/keep", F), ("d", F, b"over")]), os.path.join(base, "dest3"))
    assert "directory of that name" in str(ei.value)


def test_hard_links_only_to_files_of_the_same_archive(base: str) -> None:
    dest = os.path.join(base, "dest")
    os.makedirs(dest)
    with open(os.path.join(dest, "preexisting"), "w") as f:
        f.write("mine\n")
    for entries in (
        [("h", H, "../SECRET")],
        [("h", H, "/etc/passwd")],
        [("h", H, "preexisting")],  # in the destination, but not from this archive
        [("f", F), ("l", L, "f"), ("h", H, "l")],  # a symlink, not a file
        [("sub", D), ("sub/f", F), ("d", L, "sub"), ("h", H, "d/f")],  # through a link
        [("h", H, "missing")],
    ):
        with pytest.raises(warren.InvalidError):
            _archive.extract(_tar(entries), dest)
        assert _listing(dest) == ["preexisting"], entries
    st = _archive.extract(_tar([("d", D), ("d/f", F, b"data"), ("h", H, "d/f")]), dest)
    assert st.hardlinks == 1
    assert os.stat(os.path.join(dest, "h")).st_ino == os.stat(os.path.join(dest, "d/f")).st_ino
    assert open(os.path.join(base, "SECRET")).read() == "host secret\n"


def test_no_owners_xattrs_or_acls_and_modes_masked(base: str) -> None:
    dest = os.path.join(base, "dest")
    pax = {
        "SCHILY.xattr.user.planted": "x",
        "SCHILY.xattr.system.posix_acl_default": "\x02\x00\x00\x00",
        "SCHILY.xattr.security.capability": "cap",
        "uid": "1234",
        "gid": "1234",
    }
    tar = _tar([("d", D, 0o3777), ("d/suid", F, b"#!/bin/sh\n", 0o6777), ("ro", D, 0o555), ("ro/f", F, b"r", 0o444)], pax)
    _archive.extract(tar, dest)
    # directories keep owner rwx (the tree can be removed), as in the Go extractor
    for rel, want in (("d", 0o755), ("d/suid", 0o755), ("ro", 0o755), ("ro/f", 0o444)):
        p = os.path.join(dest, rel)
        st = os.lstat(p)
        assert st.st_mode & 0o7777 == want, (rel, oct(st.st_mode))
        assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())
        assert os.listxattr(p, follow_symlinks=False) == []

    dest2 = os.path.join(base, "dest2")
    tar.seek(0)
    st = _archive.extract(tar, dest2, preserve=True, xattr_allow=["user."])
    assert os.stat(os.path.join(dest2, "d/suid")).st_mode & 0o7777 == 0o6777
    assert os.stat(os.path.join(dest2, "d")).st_mode & 0o7777 == 0o3777
    assert os.stat(os.path.join(dest2, "ro")).st_mode & 0o7777 == 0o555
    assert os.getxattr(os.path.join(dest2, "d/suid"), "user.planted") == b"x"
    assert os.listxattr(os.path.join(dest2, "d/suid")) == ["user.planted"]
    assert st.xattrs_dropped == 4 * 2  # the ACL and the capability of each entry


def test_destination_through_a_symlink_is_refused(base: str) -> None:
    """Case 3's shape: a later download into a path through a link (here
    one an earlier download kept with symlinks_as_is) writes nowhere."""
    dl = os.path.join(base, "dl")
    _archive.extract(_tar([("out", L, os.path.join(base, "victim"))]), dl, symlinks_as_is=True)
    os.makedirs(os.path.join(base, "victim"))
    e = _refused(_tar([("report.txt", F, b"over")]), os.path.join(dl, "out"))
    assert "symlink" in str(e) and "realpath" in str(e)
    assert os.listdir(os.path.join(base, "victim")) == []
    _archive.extract(_tar([("report.txt", F, b"ok")]), os.path.realpath(os.path.join(dl, "out")))


def test_devices_and_fifos_are_skipped(base: str) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, kind in (("fifo", tarfile.FIFOTYPE), ("null", tarfile.CHRTYPE), ("sda", tarfile.BLKTYPE)):
            ti = tarfile.TarInfo(name)
            ti.type = kind
            ti.devmajor, ti.devminor = 1, 3
            tf.addfile(ti)
    buf.seek(0)
    dest = os.path.join(base, "dest")
    st = _archive.extract(buf, dest)
    assert st.skipped == 3 and _listing(dest) == []


def test_holes_are_kept(base: str) -> None:
    size = 64 << 20
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        ti = tarfile.TarInfo("sparse")
        ti.size = size
        body = bytearray(size)
        body[40 << 20 : (40 << 20) + 5] = b"hello"
        tf.addfile(ti, io.BytesIO(bytes(body)))
    buf.seek(0)
    dest = os.path.join(base, "dest")
    _archive.extract(buf, dest)
    p = os.path.join(dest, "sparse")
    st = os.stat(p)
    assert st.st_size == size and st.st_blocks * 512 <= 64 << 10, st.st_blocks
    with open(p, "rb") as f:
        f.seek(40 << 20)
        assert f.read(5) == b"hello"


def test_budgets_remove_the_partial_tree(base: str) -> None:
    """Exceeding max_bytes or max_entries raises ExhaustedError naming the
    limit; what the extraction made goes, what was there stays."""
    dest = os.path.join(base, "dest")
    os.makedirs(os.path.join(dest, "old"))
    with open(os.path.join(dest, "old", "keep"), "w") as f:
        f.write("keep\n")
    entries = [("a", D), ("a/b/c", F, b"x" * 600), ("old/new", F, b"y" * 300), ("top", F, b"z" * 200)]
    with pytest.raises(warren.ExhaustedError) as ei:
        _archive.extract(_tar(entries), dest, max_bytes=1000)
    assert ei.value.limit == "max_bytes" and "max_bytes=1,000" in str(ei.value)
    assert _listing(dest) == ["old", "old/keep"]
    with pytest.raises(warren.ExhaustedError) as ei:
        _archive.extract(_tar(entries), dest, max_entries=3)
    assert ei.value.limit == "max_entries" and "max_entries=" in str(ei.value)
    assert _listing(dest) == ["old", "old/keep"]
    st = _archive.extract(_tar(entries), dest, max_bytes=1100, max_entries=4)
    assert (st.entries, st.files, st.file_bytes) == (4, 3, 1100)
    st = _archive.extract(_tar(entries), os.path.join(base, "free"), max_bytes=None, max_entries=None)
    assert st.files == 3


def test_not_a_tar_is_invalid(base: str) -> None:
    with pytest.raises(warren.InvalidError):
        _archive.extract(io.BytesIO(b"this is no tar archive at all" * 100), os.path.join(base, "dest"))
    assert not os.path.lexists(os.path.join(base, "dest"))


_DEEP = r"""
import io, os, resource, sys, tarfile
from warren import _archive
import warren

n, dest = int(sys.argv[1]), sys.argv[2]
deep = "/".join(["d"] * n)
half = "/".join(["d"] * (n // 2))
entries = [(deep + "/bottom", b"bottom"), (half + "/mid", b"mid"), (half + "/e/f", b"f"), ("d/top", b"top"),
           (deep + "/again", b"again"), (deep + "/link", None)]
if sys.argv[3] == "over":
    entries.append(("last", b"x" * 100))
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
    for name, data in entries:
        ti = tarfile.TarInfo(name)
        if data is None:
            ti.type, ti.linkname = tarfile.SYMTYPE, "../d/bottom"  # targets stop at PATH_MAX
            tf.addfile(ti)
        else:
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
buf.seek(0)
# One fd per level would need 30,000; the extractor must do with 64.
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
try:
    st = _archive.extract(buf, dest, max_bytes=60)
except warren.ExhaustedError:
    print("exhausted", os.path.lexists(dest))
    sys.exit(0)
fd = os.open(dest, os.O_RDONLY)
for _ in range(n):
    nfd = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
    os.close(fd)
    fd = nfd
print(st.files, st.symlinks, sorted(os.listdir(fd)))
"""


@pytest.mark.parametrize("over", ["fits", "over"])
def test_30000_levels_with_64_fds(over: str) -> None:
    """A 30,000-level tree (names of 60 KB, far beyond PATH_MAX) extracts
    with RLIMIT_NOFILE 64, and a budget error removes all of it. On tmpfs:
    what is checked is the fd count and the walk, not ext4's mkdir."""
    n = 30000
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    import tempfile

    top = tempfile.mkdtemp(prefix="warren-deep-", dir=shm)
    dest = os.path.join(top, "dest")
    try:
        r = subprocess.run([sys.executable, "-c", _DEEP, str(n), dest, over], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        if over == "over":
            assert r.stdout.split() == ["exhausted", "False"]
        else:
            assert r.stdout.strip() == "5 1 ['again', 'bottom', 'link']", r.stdout
    finally:
        subprocess.run(["rm", "-rf", top], check=False)


def test_remove_tree_any_depth(tmp_path: Any) -> None:
    """The rollback's remover: no recursion, no fd per level, no link
    followed (each level has a symlink to /)."""
    import tempfile

    top = tempfile.mkdtemp(prefix="warren-rm-", dir="/dev/shm" if os.path.isdir("/dev/shm") else os.fspath(tmp_path))
    os.mkdir(os.path.join(top, "d"))
    fd = os.open(top, os.O_RDONLY)
    try:
        cur = os.open("d", os.O_RDONLY, dir_fd=fd)
        for _ in range(3000):
            os.mkdir("d", dir_fd=cur)
            with open(os.open("f", os.O_WRONLY | os.O_CREAT, dir_fd=cur), "w"):
                pass
            os.symlink("/", "l", dir_fd=cur)
            nfd = os.open("d", os.O_RDONLY, dir_fd=cur)
            os.close(cur)
            cur = nfd
        os.close(cur)
        _archive.remove_tree(fd, "d")
        assert os.listdir(top) == []
    finally:
        os.close(fd)
        subprocess.run(["rm", "-rf", top], check=False)
