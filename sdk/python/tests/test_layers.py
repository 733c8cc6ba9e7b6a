"""Named layers: build (upload and by path), stack on images, list, remove,
commit a sandbox, image stats and verification."""

from __future__ import annotations

import asyncio
import gzip
import io
import os
import tarfile
from typing import Dict, Iterator, List

import pytest

import warren
from conftest import IMAGE


def _tree(base: str, files: Dict[str, str]) -> str:
    os.makedirs(base, exist_ok=True)
    for rel, content in files.items():
        p = os.path.join(base, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(content)
    return base


def _tar(files: Dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, content in files.items():
            data = content.encode()
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            ti.mode = 0o644
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def layer_names(request: pytest.FixtureRequest) -> Iterator[List[str]]:
    """Layer names for this test; whatever is left of them is removed after it."""
    names: List[str] = []
    yield names
    addr = request.getfixturevalue("addr")

    async def clean() -> None:
        async with warren.AsyncWarren(addr) as c:
            for n in names:
                try:
                    await c.remove_layer(n, missing_ok=True)
                except warren.ConflictError:
                    pass  # a leaked sandbox still uses it; the leak check reports that

    asyncio.run(clean())


async def test_create_with_layers_higher_shadows_lower(
    w: warren.AsyncWarren, tmp_path: "os.PathLike[str]", layer_names: List[str]
) -> None:
    lower_name, upper_name = "py-lay-lower", "py-lay-upper"
    layer_names += [lower_name, upper_name]
    src = _tree(os.path.join(os.fspath(tmp_path), "lower"), {
        "data/a": "from lower\n",
        "data/b": "b of lower\n",
        "data/only-lower": "kept\n",
    })
    lower = await w.build_layer(lower_name, src)  # a local directory: tarred and uploaded
    assert lower.name == lower_name and lower.digest.startswith("sha256:") and lower.diff_id.startswith("sha256:")
    assert lower.files >= 3 and lower.size_bytes == len("from lower\nb of lower\nkept\n")
    assert lower.blob_size_bytes > 0 and lower.created_at is not None
    # tar bytes, with a whiteout: ".wh.b" hides data/b of the layers below
    upper = await w.build_layer(upper_name, _tar({"data/a": "from upper\n", "data/.wh.b": ""}))
    assert upper.name == upper_name and upper.digest != lower.digest

    async with w.create(IMAGE, layers=[lower_name, upper_name]) as sb:
        assert sb.info.layers == (lower_name, upper_name) and sb.layers == sb.info.layers
        assert (await sb.refresh()).layers == (lower_name, upper_name)
        assert await sb.read_text("/data/a") == "from upper\n"  # the higher layer wins
        assert not await sb.exists("/data/b")  # hidden by the whiteout
        assert await sb.read_text("/data/only-lower") == "kept\n"
        assert (await sb.exec("echo still busybox")).text == "still busybox\n"  # the image is below

    # the order matters: now the lower layer is on top, and the whiteout
    # (in the bottom layer) has nothing below it to hide
    async with w.create(IMAGE, layers=[upper_name, lower_name]) as sb:
        assert await sb.read_text("/data/a") == "from lower\n"
        assert await sb.read_text("/data/b") == "b of lower\n"

    # a stored layer digest works as well
    async with w.create(IMAGE, layers=[lower.digest]) as sb:
        assert await sb.read_text("/data/a") == "from lower\n"

    # other upload sources: a gzipped tarball file and a file object
    gz_path = os.path.join(os.fspath(tmp_path), "upper.tar.gz")
    with open(gz_path, "wb") as f:
        f.write(gzip.compress(_tar({"data/a": "gz\n"})))
    layer_names.append("py-lay-gz")
    assert (await w.build_layer("py-lay-gz", gz_path)).files >= 1
    with open(gz_path, "rb") as fobj:
        assert (await w.build_layer("py-lay-gz", fobj)).name == "py-lay-gz"  # replaces it
    async with w.create(IMAGE, layers=["py-lay-gz"]) as sb:
        assert await sb.read_text("/data/a") == "gz\n"

    with pytest.raises(warren.NotFoundError):
        await w.create(IMAGE, layers=["py-lay-no-such-layer"])
    with pytest.raises(TypeError):
        await w.create(IMAGE, layers=lower_name)  # a str is a sequence, but not of names


async def test_build_by_path_list_and_remove(
    w: warren.AsyncWarren, tmp_path: "os.PathLike[str]", layer_names: List[str]
) -> None:
    name = "py-lay-listed"
    layer_names += [name, "py-lay-by-path"]
    src = _tree(os.path.join(os.fspath(tmp_path), "tree"), {"etc/tool.conf": "x=1\n", "opt/tool/bin/run": "#!/bin/sh\n"})
    uploaded = await w.build_layer(name, src)
    by_path = await w.build_layer("py-lay-by-path", path=src)  # read by the daemon
    assert by_path.files == uploaded.files and by_path.size_bytes == uploaded.size_bytes

    listed = {x.name: x for x in await w.list_layers()}
    assert listed[name] == uploaded and listed["py-lay-by-path"] == by_path
    assert IMAGE not in listed  # layers and images are apart

    async with w.create(IMAGE, layers=[name]) as sb:
        assert await sb.read_text("/etc/tool.conf") == "x=1\n"
        with pytest.raises(warren.ConflictError) as ei:
            await w.remove_layer(name)  # in use
        assert sb.id in str(ei.value)
        assert name in {x.name for x in await w.list_layers()}
    await w.remove_layer(name)
    assert name not in {x.name for x in await w.list_layers()}
    with pytest.raises(warren.NotFoundError):
        await w.remove_layer(name)
    await w.remove_layer(name, missing_ok=True)
    with pytest.raises(warren.NotFoundError):
        await w.create(IMAGE, layers=[name])

    # names may hold "/" and ":"
    layer_names.append("py-lay/nested:1")
    nested = await w.build_layer("py-lay/nested:1", _tar({"n": "nested\n"}))
    assert nested.name == "py-lay/nested:1"
    async with w.create(IMAGE, layers=["py-lay/nested:1"]) as sb:
        assert await sb.read_text("/n") == "nested\n"
    await w.remove_layer("py-lay/nested:1")

    with pytest.raises(ValueError):
        await w.build_layer("py-lay-x")  # neither source nor path
    with pytest.raises(ValueError):
        await w.build_layer("py-lay-x", src, path=src)
    with pytest.raises(warren.InvalidError):
        await w.build_layer("py-lay-x", path="relative/dir")
    with pytest.raises(warren.NotFoundError):
        await w.build_layer("py-lay-x", path="/nonexistent/dir")
    with pytest.raises(warren.InvalidError):
        await w.build_layer("Bad Name!", src)
    with pytest.raises(warren.InvalidError):
        await w.build_layer("py-lay-x?y=1", src)  # not the layer "py-lay-x" with a query
    with pytest.raises(warren.WarrenError):
        await w.build_layer("py-lay-x", b"this is not a tar archive" * 100)
    assert "py-lay-x" not in {x.name for x in await w.list_layers()}


async def test_commit_round_trip(w: warren.AsyncWarren, tmp_path: "os.PathLike[str]", layer_names: List[str]) -> None:
    layer_names += ["py-commit-base", "py-commit-1"]
    await w.build_layer("py-commit-base", _tree(os.path.join(os.fspath(tmp_path), "b"), {
        "ws/keep": "keep\n",
        "ws/edit": "old\n",
        "ws/drop": "drop me\n",
        "ws/gone/x": "x\n",
    }))
    async with w.create(IMAGE, layers=["py-commit-base"]) as sb:
        assert await sb.exists("/etc/group")  # of the image
        await sb.write_file("/ws/edit", "new\n")
        await sb.write_file("/ws/added/deep/file", "added\n", make_parents=True)
        await sb.remove("/ws/drop")  # a file of the layer below
        await sb.remove("/ws/gone", recursive=True)  # a directory of the layer below
        await sb.remove("/etc/group")  # a file of the image
        (await sb.exec("echo made-by-exec > /ws/exec.txt; chmod 0750 /ws/exec.txt", check=True))
        p = await sb.start("sleep 300")

        layer = await sb.commit("py-commit-1")
        assert layer.name == "py-commit-1" and layer.digest.startswith("sha256:")
        assert layer.files >= 3 and layer.size_bytes >= len("new\nadded\nmade-by-exec\n")
        assert (await p.refresh()).running  # frozen during the commit, resumed after it
        assert (await sb.exec("echo alive")).text == "alive\n"
        assert "py-commit-1" in {x.name for x in await w.list_layers()}

        # the same stack plus the committed layer sees the same tree
        async with w.create(sb.info.image, layers=[*sb.layers, layer.name]) as sb2:
            assert sb2.layers == ("py-commit-base", "py-commit-1")
            assert await sb2.read_text("/ws/keep") == "keep\n"
            assert await sb2.read_text("/ws/edit") == "new\n"
            assert await sb2.read_text("/ws/added/deep/file") == "added\n"
            assert await sb2.read_text("/ws/exec.txt") == "made-by-exec\n"
            assert (await sb2.stat("/ws/exec.txt")).mode & 0o777 == 0o750
            assert not await sb2.exists("/ws/drop")
            assert not await sb2.exists("/ws/gone")
            assert not await sb2.exists("/etc/group")
            assert await sb2.exists("/etc/hostname")
            with pytest.raises(warren.ConflictError):
                await w.remove_layer("py-commit-1")  # sb2 uses it
            # the new sandbox's own changes stay its own
            await sb2.write_file("/ws/keep", "changed in sb2\n")
        assert await sb.read_text("/ws/keep") == "keep\n"

        # committing again replaces the layer; by id through the client
        await sb.write_file("/ws/second", "2\n")
        again = await w.commit_sandbox(sb.id, "py-commit-1")
        assert again.digest != layer.digest
    async with w.create(IMAGE, layers=["py-commit-base", "py-commit-1"]) as sb3:
        assert await sb3.read_text("/ws/second") == "2\n"
    await w.remove_layer("py-commit-1")

    with pytest.raises(warren.NotFoundError):
        await w.sandbox("py-no-such-sandbox").commit("py-commit-x")
    async with w.create(IMAGE) as sb:
        await sb.write_file("/tmp/.wh.sneaky", "")
        with pytest.raises(warren.InvalidError):
            await sb.commit("py-commit-x")  # ".wh." marks whiteouts
        with pytest.raises(warren.InvalidError):
            await sb.commit("Bad Name!")
        with pytest.raises(ValueError):
            await sb.commit("")
    assert "py-commit-x" not in {x.name for x in await w.list_layers()}


async def test_image_stats_and_verify(w: warren.AsyncWarren, tmp_path: "os.PathLike[str]", layer_names: List[str]) -> None:
    layer_names.append("py-stats")
    nl = await w.build_layer("py-stats", _tree(os.path.join(os.fspath(tmp_path), "s"), {"f": "x" * 10000}))
    img = await w.get_image(IMAGE)

    def sane(st: warren.LayerStat) -> None:
        assert st.digest.startswith("sha256:")
        assert st.format in ("erofs", "dir")
        assert st.size > 0 and 0 <= st.resident <= st.size
        assert 0.0 <= st.resident_fraction <= 1.0
        assert st.files > 0 and st.refs >= 0
        if st.refs:
            assert st.mounted

    stats = await w.image_stats(IMAGE)
    assert [s.digest for s in stats] == list(img.layers)
    for st in stats:
        sane(st)
        assert st.owner == IMAGE
        if st.format == "erofs":
            assert st.diff_id.startswith("sha256:")

    async with w.create(IMAGE, layers=["py-stats"]) as sb:
        await sb.exec("cat /f /bin/busybox > /dev/null", check=True)
        both = await w.image_stats([IMAGE, "layer:py-stats"])
        assert [s.owner for s in both] == [IMAGE] * len(img.layers) + ["layer:py-stats"]
        for st in both:
            sane(st)
            assert st.mounted and st.refs >= 1  # this sandbox uses them
        mine = both[-1]
        assert mine.digest == nl.digest and mine.diff_id == nl.diff_id and mine.files == nl.files
        assert mine.size == nl.blob_size_bytes and mine.resident > 0  # the sandbox read /f

    everything = await w.image_stats()
    owners = {s.owner for s in everything}
    assert IMAGE in owners and "layer:py-stats" in owners
    for st in everything:
        sane(st)
    with pytest.raises(warren.NotFoundError):
        await w.image_stats("py-no-such-image")
    with pytest.raises(warren.NotFoundError):
        await w.image_stats("layer:py-no-such-layer")

    res = await w.verify_image(IMAGE)
    assert [v.digest for v in res] == list(img.layers)
    assert all(v.ok and not v.error and v.owner == IMAGE for v in res)
    res = await w.verify_image(["layer:py-stats"])
    assert [(v.digest, v.owner, v.ok) for v in res] == [(nl.digest, "layer:py-stats", True)]
    every = await w.verify_image()
    assert {nl.digest, *img.layers} <= {v.digest for v in every}
    assert all(v.ok and v.owner == "" for v in every)
    with pytest.raises(warren.NotFoundError):
        await w.verify_image("py-no-such-image")


def test_sync_layers_and_commit(sw: warren.Warren, tmp_path: "os.PathLike[str]", layer_names: List[str]) -> None:
    layer_names += ["py-sync-lower", "py-sync-commit"]
    lower = sw.build_layer("py-sync-lower", _tree(os.path.join(os.fspath(tmp_path), "l"), {"w/a": "1\n"}))
    assert isinstance(lower, warren.Layer)
    assert "py-sync-lower" in {x.name for x in sw.list_layers()}
    with sw.create(IMAGE, layers=["py-sync-lower"]) as sb:
        assert sb.layers == ("py-sync-lower",)
        sb.write_file("/w/a", "2\n")
        sb.remove("/etc/group")
        c = sb.commit("py-sync-commit")
        assert c.name == "py-sync-commit"
        with pytest.raises(warren.ConflictError):
            sw.remove_layer("py-sync-lower")
        st = sw.image_stats(["layer:py-sync-lower"])
        assert len(st) == 1 and st[0].refs >= 1
    with sw.create(IMAGE, layers=["py-sync-lower", "py-sync-commit"]) as sb:
        assert sb.read_text("/w/a") == "2\n" and not sb.exists("/etc/group")
    assert all(v.ok for v in sw.verify_image(["layer:py-sync-commit", IMAGE]))
    sw.remove_layer("py-sync-commit")
    sw.remove_layer("py-sync-lower")
    sw.remove_layer("py-sync-lower", missing_ok=True)


async def test_commit_strips_setuid_unless_keep_setuid(w: warren.AsyncWarren, layer_names: List[str]) -> None:
    """What a sandbox wrote is untrusted: a committed setuid file loses the
    bit by default (and the layer says so); keep_setuid keeps it."""
    layer_names += ["py-suid-stripped", "py-suid-kept"]
    async with w.create(IMAGE) as sb:
        await sb.exec("mkdir /ws && echo x > /ws/s && chmod 4755 /ws/s", check=True)
        stripped = await sb.commit("py-suid-stripped")
        assert not stripped.setuid_kept and stripped.setuid_stripped >= 1
        kept = await sb.commit("py-suid-kept", keep_setuid=True)
        assert kept.setuid_kept and kept.setuid_stripped == 0
    for name, mode in (("py-suid-stripped", 0o755), ("py-suid-kept", 0o4755)):
        async with w.create(IMAGE, layers=[name]) as sb:
            assert (await sb.stat("/ws/s")).mode & 0o7777 == mode, name
