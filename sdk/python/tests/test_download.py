"""What comes out of a sandbox is hostile (issue 18), through the real
daemon: download, download_tar(_to), read_file and its streaming variants
against trees an agent with root inside the sandbox made."""

from __future__ import annotations

import asyncio
import io
import os
import tarfile
import shutil
import tempfile
import time
import tracemalloc
from typing import Any, Iterator, List

import pytest

import warren
from conftest import IMAGE


def _host_secret(base: str) -> str:
    p = os.path.join(base, "SECRET")
    with open(p, "w") as f:
        f.write("host secret\n")
    return p


def _listing(root: str) -> List[str]:
    out = []
    for d, dirs, files in os.walk(root):
        out += [os.path.relpath(os.path.join(d, n), root) for n in dirs + files]
    return sorted(out)


async def test_download_symlink_escape_case1_is_refused(w: warren.AsyncWarren, tmp_path: Any) -> None:
    """Issue 18 case 1, exactly: answer.txt -> b/c/../../SECRET with b -> .
    made a downloaded answer.txt read the host's SECRET next to dest. The
    download is refused and leaves nothing behind."""
    base = os.fspath(tmp_path)
    _host_secret(base)
    dest = os.path.join(base, "dest")
    async with w.create(IMAGE) as sb:
        await sb.exec("mkdir /o && cd /o && ln -s b/c/../../SECRET answer.txt && ln -s . b && mkdir c", check=True)
        with pytest.raises(warren.InvalidError) as ei:
            await sb.download("/o", dest)
        assert "answer.txt" in str(ei.value) and "outside the destination" in str(ei.value)
        assert not os.path.lexists(dest)
        # Into an existing directory: it stays, with nothing added.
        os.makedirs(dest)
        with pytest.raises(warren.InvalidError):
            await sb.download("/o", dest)
        assert os.listdir(dest) == []


async def test_download_hostile_tree_variants(w: warren.AsyncWarren, tmp_path: Any) -> None:
    """Symlink chains through a directory that appears later, links out of
    the destination into a neighbour whose name it prefixes (dest vs
    dest2), a loop, a FIFO, setuid and world-writable modes."""
    base = os.fspath(tmp_path)
    _host_secret(base)
    os.makedirs(os.path.join(base, "dest2"))
    with open(os.path.join(base, "dest2", "f"), "w") as f:
        f.write("next door\n")
    dest = os.path.join(base, "dest")
    async with w.create(IMAGE) as sb:
        await sb.exec(
            "set -e; mkdir -p /chain /prefix /ok/sub && cd /chain && ln -s d/l2 l1 && mkdir d && ln -s ../../SECRET d/l2;"
            "cd /prefix && ln -s ../dest2/f x;"
            "cd /ok && ln -s a b && ln -s b a && mkfifo pipe && echo data > sub/f && ln -s sub/f rel &&"
            " chmod 4777 sub/f && chmod 1777 sub && touch plain",
            check=True,
        )
        for remote in ("/chain", "/prefix"):
            with pytest.raises(warren.InvalidError):
                await sb.download(remote, dest)
            assert not os.path.lexists(dest)
        assert open(os.path.join(base, "dest2", "f")).read() == "next door\n"

        st = await sb.download("/ok", dest)
        assert (st.symlinks, st.skipped, st.files) == (3, 1, 2), st
        assert sorted(os.listdir(dest)) == ["a", "b", "plain", "rel", "sub"]  # no FIFO
        assert os.readlink(os.path.join(dest, "a")) == "b"
        with pytest.raises(OSError):
            open(os.path.join(dest, "a"))  # a loop: ELOOP, nothing read
        assert open(os.path.join(dest, "rel")).read() == "data\n"
        assert os.stat(os.path.join(dest, "sub", "f")).st_mode & 0o7777 == 0o755
        assert os.stat(os.path.join(dest, "sub")).st_mode & 0o7777 == 0o755

        keep = os.path.join(base, "keep")
        await sb.download("/ok", keep, preserve=True)
        assert os.stat(os.path.join(keep, "sub", "f")).st_mode & 0o7777 == 0o4777


@pytest.fixture
def fast_tmp(tmp_path: Any) -> Iterator[str]:
    """A scratch directory on tmpfs when there is one: the tests below
    check the extractor, not the inode allocator of the CI's ext4 without
    a journal (100,000 creates: 12 s there, 1.3 s on tmpfs)."""
    if not os.path.isdir("/dev/shm"):
        yield os.fspath(tmp_path)
        return
    d = tempfile.mkdtemp(prefix="warren-dl-", dir="/dev/shm")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.timeout_s(240)
async def test_download_100000_files_and_entry_budget(w: warren.AsyncWarren, fast_tmp: str) -> None:
    """100,000 tiny files download, streamed; a max_entries below that is
    ExhaustedError and removes what it wrote."""
    base = fast_tmp
    async with w.create(IMAGE) as sb:
        t0 = time.monotonic()
        await sb.exec("mkdir -p /many && cd /many && seq 100000 | xargs touch", check=True, timeout=180)
        print(f"100,000 files made in the sandbox in {time.monotonic() - t0:.1f}s")
        dest = os.path.join(base, "many")
        t0 = time.monotonic()
        st = await sb.download("/many", dest)
        took = time.monotonic() - t0
        assert st.files == 100000 and len(os.listdir(dest)) == 100000, st
        print(f"100,000 files downloaded in {took:.1f}s")

        small = os.path.join(base, "small")
        with pytest.raises(warren.ExhaustedError) as ei:
            await sb.download("/many", small, max_entries=20000)
        assert ei.value.limit == "max_entries" and "max_entries=20,000" in str(ei.value)
        assert not os.path.lexists(small)


@pytest.mark.timeout_s(240)
async def test_download_sparse_3g_keeps_holes_and_byte_budget(w: warren.AsyncWarren, tmp_path: Any) -> None:
    """A 3 GB sparse file (nothing to the sandbox's disk) exceeds the
    default 1 GiB budget at once; allowed, it lands as a sparse file (on
    the test's real disk: holes are what is checked)."""
    base = os.fspath(tmp_path)
    async with w.create(IMAGE) as sb:
        await sb.exec(
            "mkdir /sp && echo small > /sp/a && truncate -s 3G /sp/big &&"
            " printf marker | dd of=/sp/big bs=1 seek=1073741824 conv=notrunc 2>/dev/null",
            check=True,
        )
        dest = os.path.join(base, "sp")
        t0 = time.monotonic()
        with pytest.raises(warren.ExhaustedError) as ei:
            await sb.download("/sp", dest)
        assert ei.value.limit == "max_bytes" and "max_bytes=1,073,741,824" in str(ei.value)
        assert time.monotonic() - t0 < 20  # refused from the header, not after 3 GB
        assert not os.path.lexists(dest)

        t0 = time.monotonic()
        st = await sb.download("/sp", dest, max_bytes=4 << 30)
        print(f"3 GB sparse file downloaded in {time.monotonic() - t0:.1f}s")
        big = os.stat(os.path.join(dest, "big"))
        assert st.file_bytes == (3 << 30) + 6 and big.st_size == 3 << 30
        assert big.st_blocks * 512 <= 1 << 20, big.st_blocks
        with open(os.path.join(dest, "big"), "rb") as f:
            f.seek(1 << 30)
            assert f.read(6) == b"marker"


async def test_read_file_cap_on_2g_sparse_file(w: warren.AsyncWarren, tmp_path: Any) -> None:
    """read_file of a 2 GiB sparse file took 4.2 GiB of client memory
    (issue 18 case 4): now it is ExhaustedError after one bounded call, and
    the streaming variants hold one chunk at a time."""
    async with w.create(IMAGE) as sb:
        await sb.exec("truncate -s 2G /big && printf tail | dd of=/big bs=1 seek=2147483644 conv=notrunc 2>/dev/null", check=True)
        tracemalloc.start()
        try:
            with pytest.raises(warren.ExhaustedError) as ei:
                await sb.read_file("/big")
            assert ei.value.limit == "max_bytes" and "2,147,483,648 bytes" in str(ei.value)
            assert tracemalloc.get_traced_memory()[1] < 64 << 20
            tracemalloc.reset_peak()

            n = 0
            async for chunk in sb.iter_file("/big", offset=(2 << 30) - (64 << 20)):
                n += len(chunk)
                last = chunk
            assert n == 64 << 20 and last.endswith(b"tail")
            out = os.path.join(os.fspath(tmp_path), "big")
            assert await sb.read_file_to("/big", out, offset=(2 << 30) - (32 << 20)) == 32 << 20
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 96 << 20, peak
        st = os.stat(out)
        assert st.st_size == 32 << 20 and st.st_blocks * 512 <= 64 << 10
        with pytest.raises(warren.ExhaustedError):
            await sb.read_file_to("/big", io.BytesIO(), max_bytes=1 << 20)
        assert await sb.read_file("/big", offset=(2 << 30) - 4, max_bytes=4) == b"tail"
        with pytest.raises(warren.ExhaustedError):
            await sb.read_file("/big", offset=(2 << 30) - 4, max_bytes=3)


async def test_download_tar_cap_and_streaming(w: warren.AsyncWarren, tmp_path: Any) -> None:
    """download_tar holds at most max_bytes (sparse files travel expanded
    unless sparse=True); download_tar_to streams to disk."""
    base = os.fspath(tmp_path)
    async with w.create(IMAGE) as sb:
        await sb.exec("mkdir /t && truncate -s 300M /t/zeros && echo hi > /t/hi", check=True)
        with pytest.raises(warren.ExhaustedError) as ei:
            await sb.download_tar("/t")  # 300 MiB of zeros > 256 MiB
        assert ei.value.limit == "max_bytes"
        assert len(await sb.download_tar("/t/hi")) >= 1024

        out = os.path.join(base, "t.tar")
        n = await sb.download_tar_to("/t", out)
        assert n == os.path.getsize(out) and n > 300 << 20
        with tarfile.open(out) as tf:
            assert sorted(tf.getnames()) == [".", "hi", "zeros"]
        os.unlink(out)
        with pytest.raises(warren.ExhaustedError):
            await sb.download_tar_to("/t", out, max_bytes=1 << 20)
        assert not os.path.lexists(out)
        buf = io.BytesIO()
        assert await sb.download_tar_to("/t/hi", buf) == len(buf.getvalue())

        # Asked for, the 300 MiB of holes are a few blocks, and tarfile
        # reads the file whole.
        data = await sb.download_tar("/t", sparse=True)
        assert len(data) < 64 << 10, len(data)
        with tarfile.open(fileobj=io.BytesIO(data)) as tf:
            m = tf.getmember("zeros")
            assert m.size == 300 << 20
            f = tf.extractfile(m)
            assert f is not None and f.read(1 << 20) == bytes(1 << 20)
        assert await sb.download_tar_to("/t", out, sparse=True) < 64 << 10


async def test_iter_files_pages(w: warren.AsyncWarren) -> None:
    """list_files gathers every page, iter_files streams them; each entry
    once."""
    async with w.create(IMAGE) as sb:
        await sb.exec("mkdir /d && cd /d && i=0; while [ $i -lt 2500 ]; do : > f$i; i=$((i+1)); done", check=True)
        names = [f.name async for f in sb.iter_files("/d", page_size=1000)]
        assert len(names) == 2500 and len(set(names)) == 2500
        assert sorted(f.name for f in await sb.list_files("/d")) == sorted(names)
        files, token = await sb.list_files_page("/d", page_size=1000)
        assert len(files) == 1000 and token
        files2, token2 = await sb.list_files_page("/d", page_token=token, page_size=1000)
        assert len(files2) == 1000 and token2 and not {f.name for f in files} & {f.name for f in files2}


async def test_download_broken_stream_leaves_nothing(w: warren.AsyncWarren, tmp_path: Any) -> None:
    """A download cut mid-stream (client deadline) removes what it wrote.
    The tree takes seconds to extract: 30,000 files (a sparse file no
    longer does: only its data crosses)."""
    base = os.fspath(tmp_path)
    async with w.create(IMAGE) as sb:
        await sb.exec("mkdir /s && cd /s && seq 1 30000 | xargs touch && echo x > /s/a", check=True)
        dest = os.path.join(base, "cut")
        with pytest.raises(warren.TimeoutError):
            await sb.download("/s", dest, max_bytes=None, timeout=0.5)
        assert not os.path.lexists(dest)
        await asyncio.sleep(0)


def test_sync_twins_of_downloads_and_streams(sw: warren.Warren, tmp_path: Any) -> None:
    """The synchronous client has the same downloads, caps and iterators."""
    base = os.fspath(tmp_path)
    with sw.create(IMAGE) as sb:
        sb.exec("mkdir -p /o/d && echo hi > /o/d/f && ln -s d/f /o/l && ln -s /etc/passwd /o/abs && truncate -s 1M /o/z", check=True)
        with pytest.raises(warren.InvalidError):
            sb.download("/o", os.path.join(base, "a"))
        st = sb.download("/o", os.path.join(base, "b"), symlinks_as_is=True)
        assert st.symlinks == 2 and os.readlink(os.path.join(base, "b", "abs")) == "/etc/passwd"
        with pytest.raises(warren.ExhaustedError):
            sb.download("/o", os.path.join(base, "c"), max_bytes=1000, symlinks_as_is=True)
        assert not os.path.lexists(os.path.join(base, "c"))
        with pytest.raises(warren.ExhaustedError):
            sb.read_file("/o/z", max_bytes=1000)
        assert b"".join(sb.iter_file("/o/z", chunk_size=300_000)) == bytes(1 << 20)
        assert sb.read_file_to("/o/d/f", os.path.join(base, "f")) == 3
        assert [f.name for f in sb.iter_files("/o/d")] == ["f"]
        assert sb.download_tar_to("/o/d", os.path.join(base, "t.tar")) > 0
        with pytest.raises(warren.ExhaustedError):
            sb.download_tar("/o", max_bytes=4096)
