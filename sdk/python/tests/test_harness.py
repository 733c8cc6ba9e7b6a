"""Harness sandboxes: a harness's route (its /dev/warren.sock, reached here
through the same socket on the host) creates and drives the harness's own
sandboxes only; everything else is PermissionDeniedError; the cap is
ExhaustedError; deleting the harness deletes its children."""

from __future__ import annotations

import os

import pytest

import warren
from conftest import IMAGE


def route_addr(daemon, sid: str) -> str:
    return "unix://" + os.path.join(daemon.run_dir, "devfs", sid, "warren.sock")


async def test_harness_route_is_scoped(w: warren.AsyncWarren, daemon) -> None:
    other = await w.create(IMAGE)
    h = await w.create(IMAGE, harness=True, max_children=1)
    try:
        assert h.info.harness and h.info.max_children == 1
        assert h.info.env["WARREN_ADDR"] == "unix:///dev/warren.sock"
        async with warren.AsyncWarren(route_addr(daemon, h.id)) as hw:
            kid = await hw.create(IMAGE)
            assert kid.info.parent == h.id
            r = await kid.exec("echo from-harness")
            assert r.ok and r.stdout == b"from-harness\n", r
            assert [s.id for s in await hw.list()] == [kid.id]
            with pytest.raises(warren.PermissionDeniedError):
                await hw.get(other.id)
            with pytest.raises(warren.PermissionDeniedError):
                await hw.sandbox(other.id).exec("true")
            with pytest.raises(warren.PermissionDeniedError):
                await hw.list_images()
            with pytest.raises(warren.PermissionDeniedError):
                await hw.create(IMAGE, harness=True)
            with pytest.raises(warren.ExhaustedError):
                await hw.create(IMAGE)
        # The trainer drives the child too, and sees whose it is.
        assert (await w.get(kid.id)).info.parent == h.id
        assert (await w.sandbox(kid.id).exec("echo from-trainer")).stdout == b"from-trainer\n"
    finally:
        await h.delete()
        await other.delete()
    with pytest.raises(warren.NotFoundError):
        await w.get(kid.id)
