"""create(rlimits=...): the resource limits of a sandbox's processes."""

from __future__ import annotations

import resource

import pytest

import warren
from conftest import IMAGE


def _limits(text: str) -> dict:
    """Soft and hard of a few rows of /proc/self/limits."""
    rows = {"Max open files": "nofile", "Max core file size": "core", "Max stack size": "stack"}
    out = {}
    for line in text.splitlines():
        for row, name in rows.items():
            if line.startswith(row + " "):
                soft, hard = line[len(row) :].split()[:2]
                out[name] = tuple(-1 if v == "unlimited" else int(v) for v in (soft, hard))
    return out


async def test_rlimits_default_and_requested(w: warren.AsyncWarren) -> None:
    # The daemon's own hard limit caps every default (the daemon inherits this test's).
    nofile_hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    async with w.create(IMAGE) as sb:
        got = sb.info.rlimit("nofile")
        assert got == warren.Rlimit("nofile", 1024, min(524288, nofile_hard))
        assert sb.info.rlimit("stack") is not None and sb.info.rlimit("stack").soft == 8 << 20
        assert len(sb.info.rlimits) == 16
        seen = _limits((await sb.exec("cat /proc/self/limits")).text)
        assert seen["nofile"] == (got.soft, got.hard)

    async with w.create(IMAGE, rlimits={"nofile": (64, 128), "core": warren.Rlimit.UNLIMITED}) as sb:
        assert sb.info.rlimit("nofile") == warren.Rlimit("nofile", 64, 128)
        assert sb.info.rlimit("core") == warren.Rlimit("core", -1, -1)
        seen = _limits((await sb.exec("cat /proc/self/limits")).text)
        assert seen["nofile"] == (64, 128) and seen["core"] == (-1, -1)
        info = await sb.refresh()
        assert info.rlimit("nofile") == warren.Rlimit("nofile", 64, 128)

    async with w.create(IMAGE, rlimits=[warren.Rlimit("stack", 4 << 20, 16 << 20)]) as sb:
        assert (await sb.exec("ulimit -s")).text == "4096\n"


async def test_rlimits_refused(w: warren.AsyncWarren) -> None:
    nofile_hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    with pytest.raises(warren.InvalidError, match="unknown rlimit"):
        await w.create(IMAGE, rlimits={"files": 10})
    with pytest.raises(warren.InvalidError, match="soft limit 10 above the hard limit 5"):
        await w.create(IMAGE, rlimits={"nofile": (10, 5)})
    with pytest.raises(warren.InvalidError, match="CAP_SYS_RESOURCE"):
        await w.create(IMAGE, rlimits={"nofile": (1024, nofile_hard + 1)})
    # Shapes the client refuses before sending.
    with pytest.raises(TypeError):
        await w.create(IMAGE, rlimits={"nofile": "1024"})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        await w.create(IMAGE, rlimits="nofile=1024")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        await w.create(IMAGE, rlimits={"nofile": (-2, 10)})


def test_rlimits_sync(sw: warren.Warren) -> None:
    with sw.create(IMAGE, rlimits={"nofile": 256}) as sb:
        assert sb.info.rlimit("nofile") == warren.Rlimit("nofile", 256, 256)
        assert sb.exec("ulimit -n").text == "256\n"
