"""Files: read, write, list, stat, mkdir, remove, and tar uploads/downloads."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

import warren
from conftest import IMAGE


async def test_write_read_append(w: warren.AsyncWarren) -> None:
    async with w.create(IMAGE) as sb:
        await sb.write_file("/tmp/a.txt", "hello ")
        await sb.write_file("/tmp/a.txt", b"world\n", append=True)
        assert await sb.read_text("/tmp/a.txt") == "hello world\n"
        assert await sb.read_file("/tmp/a.txt", offset=6) == b"world\n"
        assert await sb.read_file("/tmp/a.txt", offset=6, length=3) == b"wor"
        assert await sb.read_file("/tmp/a.txt", length=100) == b"hello world\n"
        assert (await sb.exec("cat /tmp/a.txt")).text == "hello world\n"

        await sb.write_file("/tmp/x.sh", "echo run", mode=0o755)
        st = await sb.stat("/tmp/x.sh")
        assert st.mode == 0o755 and st.type == "file" and st.size == 8 and not st.is_dir
        assert (await sb.exec("/tmp/x.sh")).text == "run\n"

        with pytest.raises(warren.NotFoundError):
            await sb.write_file("/no/such/dir/f", "x")
        await sb.write_file("/no/such/dir/f", "x", make_parents=True)
        assert await sb.read_text("/no/such/dir/f") == "x"
        with pytest.raises(warren.NotFoundError):
            await sb.read_file("/missing")
        with pytest.raises(warren.InvalidError):
            await sb.write_file("/tmp/m", "x", mode=0o170000)


async def test_large_file_round_trip(w: warren.AsyncWarren) -> None:
    async with w.create(IMAGE) as sb:
        data = os.urandom(1 << 20) * 40  # 40 MiB: sent as a tar stream
        await sb.write_file("/tmp/big/blob", data, make_parents=True, mode=0o600)
        st = await sb.stat("/tmp/big/blob")
        assert st.size == len(data) and st.mode == 0o600
        assert await sb.read_file("/tmp/big/blob") == data
        assert await sb.read_file("/tmp/big/blob", offset=len(data) - 10) == data[-10:]


async def test_list_stat_mkdir_remove(w: warren.AsyncWarren) -> None:
    async with w.create(IMAGE) as sb:
        await sb.mkdir("/work")
        with pytest.raises(warren.ConflictError):
            await sb.mkdir("/work")
        await sb.mkdir("/work", parents=True)  # like mkdir -p: fine
        await sb.mkdir("/work/a/b/c", parents=True, mode=0o700)
        with pytest.raises(warren.NotFoundError):
            await sb.mkdir("/x/y")
        assert (await sb.stat("/work/a/b/c")).mode == 0o700
        await sb.write_file("/work/f.txt", "f")
        await sb.exec("ln -s f.txt /work/link")
        files = {f.name: f for f in await sb.list_files("/work")}
        assert set(files) == {"a", "f.txt", "link"}
        assert files["a"].is_dir and files["a"].type == "dir"
        assert files["link"].is_symlink and files["link"].link_target == "f.txt"
        assert files["f.txt"].path == "/work/f.txt" and files["f.txt"].mtime is not None
        assert await sb.exists("/work/f.txt") and not await sb.exists("/work/nope")

        await sb.remove("/work/f.txt")
        assert not await sb.exists("/work/f.txt")
        with pytest.raises(warren.NotFoundError):
            await sb.remove("/work/f.txt")
        await sb.remove("/work/f.txt", missing_ok=True)
        with pytest.raises(warren.WarrenError):
            await sb.remove("/work/a")  # not empty
        await sb.remove("/work/a", recursive=True)
        assert {f.name for f in await sb.list_files("/work")} == {"link"}


async def test_upload_download_directories(w: warren.AsyncWarren, tmp_path: "os.PathLike[str]") -> None:
    src = os.path.join(os.fspath(tmp_path), "src")
    os.makedirs(os.path.join(src, "pkg", "sub"))
    with open(os.path.join(src, "README"), "w") as f:
        f.write("readme\n")
    with open(os.path.join(src, "pkg", "sub", "mod.sh"), "w") as f:
        f.write("echo mod\n")
    os.chmod(os.path.join(src, "pkg", "sub", "mod.sh"), 0o755)
    os.symlink("sub/mod.sh", os.path.join(src, "pkg", "link"))

    async with w.create(IMAGE) as sb:
        await sb.upload(src, "/work/project")
        assert (await sb.exec("cat /work/project/README; /work/project/pkg/link")).text == "readme\nmod\n"
        single = os.path.join(os.fspath(tmp_path), "single.txt")
        with open(single, "w") as f:
            f.write("one file\n")
        await sb.upload(single, "/work/files")
        assert await sb.read_text("/work/files/single.txt") == "one file\n"

        await sb.exec("echo generated > /work/project/pkg/out.txt")
        dst = os.path.join(os.fspath(tmp_path), "dst")
        await sb.download("/work/project", dst)
        with open(os.path.join(dst, "pkg", "out.txt")) as f:
            assert f.read() == "generated\n"
        assert os.readlink(os.path.join(dst, "pkg", "link")) == "sub/mod.sh"
        assert os.stat(os.path.join(dst, "pkg", "sub", "mod.sh")).st_mode & 0o777 == 0o755

        await sb.download("/work/files/single.txt", dst)
        with open(os.path.join(dst, "single.txt")) as f:
            assert f.read() == "one file\n"

        raw = await sb.download_tar("/work/project/pkg")
        with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
            names = set(tf.getnames())
        assert {"sub/mod.sh", "out.txt", "link"} <= names

        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tf:
            ti = tarfile.TarInfo("from-bytes.txt")
            ti.size = 3
            tf.addfile(ti, io.BytesIO(b"abc"))
        await sb.upload_tar(buf.getvalue(), "/work/t")
        assert await sb.read_text("/work/t/from-bytes.txt") == "abc"
        buf.seek(0)
        await sb.upload_tar(buf, "/work/t2")  # a file object
        assert await sb.read_text("/work/t2/from-bytes.txt") == "abc"

        with pytest.raises(warren.NotFoundError):
            await sb.download_tar("/no/such/path")


async def test_watch_dir(w: warren.AsyncWarren) -> None:
    """watch_dir follows what the sandbox does in a directory (recursive
    into one made later) and ends when the directory is removed."""
    import asyncio

    async with w.create(IMAGE) as sb:
        await sb.mkdir("/tmp/w")
        async with sb.watch_dir("/tmp/w", recursive=True) as watch:
            assert watch.path == "/tmp/w"
            await sb.exec("echo a > /tmp/w/f && mkdir -p /tmp/w/d/e && echo b > /tmp/w/d/e/g && rm /tmp/w/f")
            want = {("f", "create"), ("f", "write"), ("f", "remove"), ("d", "create"), ("d/e/g", "create")}
            seen = set()

            async def until_seen() -> None:
                async for ev in watch:
                    seen.add((ev.path, ev.type))
                    if want <= seen:
                        return

            await asyncio.wait_for(until_seen(), 60)
            await sb.exec("rm -rf /tmp/w")
            await asyncio.wait_for(watch.wait(), 60)  # the directory went: the watch ends


def test_watch_dir_sync_and_stats(sw: warren.Warren) -> None:
    """The synchronous watch_dir, and stats of a running sandbox."""
    with sw.create(IMAGE) as sb:
        with sb.watch_dir("/tmp") as watch:
            sb.exec("touch /tmp/sync")
            for ev in watch:
                if ev.path == "sync" and ev.type == "create":
                    break
        st = sb.stats()
        assert st.cpu_count >= 1 and st.cpu_usage_ns > 0
        assert 0 < st.memory_bytes <= st.memory_limit_bytes
        assert 0 < st.disk_used_bytes <= st.disk_bytes
        # The memory's kinds: the sandbox's processes hold some anonymous
        # memory, and the kernel some of its own for them.
        assert 0 < st.memory_anon_bytes <= st.memory_bytes
        assert 0 < st.memory_kernel_bytes <= st.memory_bytes
