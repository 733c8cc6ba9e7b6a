"""Images: list, get, import by path, upload, remove."""

from __future__ import annotations

import io
import os
import shutil
import tarfile

import pytest

import warren
from conftest import IMAGE


def _rootfs(base: str) -> str:
    """A minimal root filesystem: the host's static busybox as /bin/sh."""
    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("busybox is not installed")
    root = os.path.join(base, "rootfs")
    os.makedirs(os.path.join(root, "bin"))
    os.makedirs(os.path.join(root, "tmp"))
    shutil.copy2(os.path.realpath(busybox), os.path.join(root, "bin", "busybox"))
    for name in ("sh", "echo", "cat"):
        os.symlink("busybox", os.path.join(root, "bin", name))
    with open(os.path.join(root, "marker"), "w") as f:
        f.write("tiny\n")
    return root


async def test_list_and_get(w: warren.AsyncWarren) -> None:
    imgs = {i.name: i for i in await w.list_images()}
    assert IMAGE in imgs
    img = await w.get_image(IMAGE)
    assert img == imgs[IMAGE]
    assert img.id.startswith("sha256:") and img.layers and img.size_bytes > 0 and img.created_at is not None
    with pytest.raises(warren.NotFoundError):
        await w.get_image("no-such-image")


async def test_import_upload_remove(w: warren.AsyncWarren, tmp_path: "os.PathLike[str]") -> None:
    root = _rootfs(os.fspath(tmp_path))
    names = ["py-img-path", "py-img-dir", "py-img-tar", "py-img-file"]
    try:
        by_path = await w.import_image(names[0], root)  # read by the daemon
        assert by_path.name == names[0]
        by_dir = await w.upload_image(names[1], root)  # tarred and uploaded by the client
        assert by_dir.name == names[1] and by_dir.size_bytes > 0

        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tf:
            tf.add(root, arcname=".")
        by_tar = await w.upload_image(names[2], buf.getvalue())
        assert by_tar.name == names[2]
        tar_path = os.path.join(os.fspath(tmp_path), "rootfs.tar.gz")
        with open(tar_path, "wb") as f:
            f.write(buf.getvalue())
        by_file = await w.upload_image(names[3], tar_path)
        assert by_file.name == names[3]

        assert set(names) <= {i.name for i in await w.list_images()}
        for name in names:
            async with w.create(name) as sb:
                r = await sb.exec("cat /marker")
                assert r.text == "tiny\n", (name, r)

        async with w.create(names[0]):
            with pytest.raises(warren.ConflictError):
                await w.remove_image(names[0])  # in use
        await w.remove_image(names[0])
        with pytest.raises(warren.NotFoundError):
            await w.get_image(names[0])
        with pytest.raises(warren.NotFoundError):
            await w.remove_image(names[0])
        await w.remove_image(names[0], missing_ok=True)
        with pytest.raises(warren.WarrenError):
            await w.upload_image("py-img-bad", b"this is not a tar archive" * 100)
        with pytest.raises(warren.InvalidError):
            await w.import_image("py-img-bad", "relative/path")
    finally:
        for name in names + ["py-img-bad"]:
            await w.remove_image(name, missing_ok=True)
