"""CPU QoS classes through the SDK: create with a class, change it with
update(qos=...), and the sync client's view of it."""

from __future__ import annotations

import pytest

import warren

from conftest import IMAGE



async def test_qos_class_at_create_and_update(w: warren.AsyncWarren) -> None:
    """A sandbox is best-effort unless asked; update(qos=...) changes the
    class of a running one, and a pinning without ls is invalid."""
    async with w.create(IMAGE) as be, w.create(IMAGE, qos="ls", qos_cpus=[0]) as ls:
        assert be.info.qos == "be" and be.info.qos_cpus == ()
        assert ls.info.qos == "ls" and ls.info.qos_cpus == (0,)
        r = await ls.exec("grep Cpus_allowed_list /proc/self/status")
        assert r.stdout.split(b":")[1].strip() == b"0", r
        info = await be.update(qos="ls")
        assert info.qos == "ls" and (await be.refresh()).qos == "ls"
        info = await w.update_sandbox(ls.id, qos="be")
        assert info.qos == "be" and info.qos_cpus == ()
        with pytest.raises(warren.InvalidError):
            await be.update(qos="be", qos_cpus=[0])
        with pytest.raises(warren.InvalidError):
            await be.update(qos="gold")
        assert (await be.refresh()).qos == "ls"
