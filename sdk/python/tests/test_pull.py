"""PullImage from an OCI image layout made here with the standard library:
progress events, the image's OCI config fields, sandboxes of it, layer reuse,
verification, errors and the synchronous twin."""

from __future__ import annotations

import asyncio
import os
import shutil
from typing import Iterator, List

import pytest

import warren
from ocilayout import Built, busybox_layout


@pytest.fixture
def layout(tmp_path: "os.PathLike[str]") -> Built:
    if shutil.which("busybox") is None:
        pytest.skip("busybox is not installed")
    # the directory's base name and the tag make the default image name
    return busybox_layout(os.path.join(os.fspath(tmp_path), "ocilay"), extra_files={"etc/motd": b"pulled\n"})


@pytest.fixture
def image_names(request: pytest.FixtureRequest) -> Iterator[List[str]]:
    names: List[str] = []
    yield names
    addr = request.getfixturevalue("addr")

    async def clean() -> None:
        async with warren.AsyncWarren(addr) as c:
            for n in names:
                try:
                    await c.remove_image(n, missing_ok=True)
                except warren.ConflictError:
                    pass

    asyncio.run(clean())


def _check_events(events: List[warren.PullEvent], image: warren.Image) -> None:
    assert events, "no progress events"
    phases = [e.phase for e in events]
    assert phases[0] == "resolve" and phases[-1] == "done"
    assert "layer" in phases and "record" in phases
    assert phases.index("record") > max(i for i, p in enumerate(phases) if p == "layer")
    last = events[-1]
    assert last.done and last.image == image and last.layers == len(image.layers)
    assert not any(e.done for e in events[:-1])
    for e in events:
        if e.phase == "layer":
            assert e.layers == 1 and e.layer == 0
            assert e.status in ("waiting", "downloading", "converting", "exists", "done")
            assert e.current >= 0 and e.total >= 0
            if e.total:
                assert e.fraction is not None and 0.0 <= e.fraction <= 1.0


async def test_pull_oci_layout_with_progress_callback(
    w: warren.AsyncWarren, layout: Built, image_names: List[str]
) -> None:
    image_names.append("py-pulled")
    events: List[warren.PullEvent] = []
    img = await w.pull_image("oci:" + layout.path, "py-pulled", progress=events.append)
    assert isinstance(img, warren.Image) and img.name == "py-pulled"
    _check_events(events, img)
    statuses = [e.status for e in events if e.phase == "layer"]
    assert statuses[0] == "waiting" and statuses[-1] == "done"
    assert "downloading" in statuses or "converting" in statuses
    assert any(e.digest == layout.layer_digests[0] for e in events if e.phase == "layer")

    # the record carries the OCI config
    assert img.diff_ids == tuple(layout.diff_ids) and len(img.layers) == 1
    assert img.source.startswith("oci:" + layout.path) and img.source.endswith(layout.manifest_digest)
    assert img.env == ("PATH=/bin", "OCI_GREETING=from-the-config")
    assert img.env_dict["OCI_GREETING"] == "from-the-config"
    assert img.cmd == ("/bin/sh",) and img.entrypoint == ()
    assert img.working_dir == "/work" and img.user == "0"
    assert img.platform.startswith("linux/")
    assert img.size_bytes > 0 and img.created_at is not None
    assert await w.get_image("py-pulled") == img

    # a sandbox of it: the config's env and working dir apply, create's env wins
    async with w.create("py-pulled", env={"MINE": "1", "PATH": "/bin"}) as sb:
        r = await sb.exec("echo $OCI_GREETING $MINE; pwd; cat /etc/motd; readlink /bin/sh", check=True)
        assert r.text == "from-the-config 1\n/work\npulled\nbusybox\n"

    res = await w.verify_image("py-pulled")
    assert [v.digest for v in res] == list(img.layers) and all(v.ok for v in res)
    stats = await w.image_stats("py-pulled")
    assert [s.diff_id for s in stats] == list(img.diff_ids) and stats[0].format == "erofs"

    # an async progress callback works too
    seen: List[str] = []

    async def on_event(ev: warren.PullEvent) -> None:
        await asyncio.sleep(0)
        seen.append(ev.phase)

    again = await w.pull_image("oci:" + layout.path, "py-pulled", progress=on_event)
    assert again.id == img.id and seen[-1] == "done"


async def test_pull_iterate_events_and_reuse_layers(
    w: warren.AsyncWarren, layout: Built, image_names: List[str]
) -> None:
    image_names += ["py-pull-first", "ocilay:v1"]
    first = await w.pull_image("oci:" + layout.path, "py-pull-first")

    # iterate over the events; no name: derived from the layout and tag
    events: List[warren.PullEvent] = []
    async with w.pull_image("oci:" + layout.path + ":" + layout.tag, platform="linux/" + first.platform.split("/")[1]) as pull:
        async for ev in pull:
            events.append(ev)
    assert pull.image is not None and pull.image.name == "ocilay:v1"
    _check_events(events, pull.image)
    # the layer was stored by the first pull: not converted again
    assert [e.status for e in events if e.phase == "layer"][-1] == "exists"
    assert "downloading" not in [e.status for e in events]
    assert pull.image.layers == first.layers and pull.image.id == first.id
    assert {"py-pull-first", "ocilay:v1"} <= {i.name for i in await w.list_images()}
    async for _ in pull:  # a finished pull yields nothing more
        raise AssertionError("event after the end")

    # the stream alias is the same thing without a callback
    st = w.pull_image_stream("oci:" + layout.path, "py-pull-first")
    assert (await st).name == "py-pull-first"

    # leaving early closes the request; the client is fine afterwards
    async with w.pull_image("oci:" + layout.path, "py-pull-first") as pull2:
        async for ev in pull2:
            assert ev.phase == "resolve"
            break
    assert (await w.version()).version is not None


async def test_pull_errors(w: warren.AsyncWarren, layout: Built, tmp_path: "os.PathLike[str]") -> None:
    with pytest.raises(warren.NotFoundError):
        await w.pull_image("oci:/nonexistent/layout", "py-pull-bad")
    with pytest.raises(warren.NotFoundError):
        await w.pull_image("oci:" + layout.path + ":no-such-tag", "py-pull-bad")
    not_a_layout = os.path.join(os.fspath(tmp_path), "empty")
    os.makedirs(not_a_layout)
    with pytest.raises(warren.InvalidError):
        await w.pull_image("oci:" + not_a_layout, "py-pull-bad")
    with pytest.raises(warren.InvalidError):
        await w.pull_image("oci:" + layout.path, "Bad Name!")
    with pytest.raises(warren.InvalidError):
        await w.pull_image("oci:" + layout.path, "py-pull-bad", platform="not/a/plat/form/really")
    with pytest.raises(ValueError):
        w.pull_image("")
    with pytest.raises(warren.NotFoundError):
        await w.get_image("py-pull-bad")  # failed pulls leave no image


def test_sync_pull(sw: warren.Warren, layout: Built, image_names: List[str]) -> None:
    image_names.append("py-sync-pulled")
    import threading

    threads: List[int] = []
    phases: List[str] = []

    def progress(ev: warren.PullEvent) -> None:
        threads.append(threading.get_ident())
        phases.append(ev.phase)

    img = sw.pull_image("oci:" + layout.path, "py-sync-pulled", progress=progress)
    assert img.name == "py-sync-pulled" and img.working_dir == "/work"
    assert phases[0] == "resolve" and phases[-1] == "done"
    assert set(threads) == {threading.get_ident()}  # called in the caller's thread

    with sw.pull_image_stream("oci:" + layout.path, "py-sync-pulled") as st:
        events = list(st)
    assert st.image is not None and events[-1].image == st.image
    assert st.wait() == st.image
    with sw.create("py-sync-pulled") as sb:
        assert sb.exec("pwd; echo $OCI_GREETING").text == "/work\nfrom-the-config\n"
    assert all(v.ok for v in sw.verify_image("py-sync-pulled"))
