"""A sandbox's own /etc/hosts, /etc/hostname and resolv.conf, and keep_etc."""

from __future__ import annotations

import pytest

import warren
from conftest import IMAGE


async def test_own_etc_files(w: warren.AsyncWarren) -> None:
    async with w.create(IMAGE, hostname="web.test") as sb:
        assert sb.info.hostname == "web.test" and not sb.info.keep_etc
        hosts = (await sb.exec("cat /etc/hosts")).text
        assert "127.0.0.1\tlocalhost\n" in hosts and "::1\tlocalhost" in hosts
        assert "127.0.1.1\tweb.test web\n" in hosts
        assert (await sb.exec("cat /etc/hostname")).text == "web.test\n"
        assert "nameserver" not in (await sb.exec("cat /etc/resolv.conf")).text


async def test_keep_etc_and_bad_hostname(w: warren.AsyncWarren) -> None:
    async with w.create(IMAGE, keep_etc=True) as sb:
        assert sb.info.keep_etc
        # The busybox image's own (image build busybox writes "warren").
        assert (await sb.exec("cat /etc/hostname")).text == "warren\n"
    with pytest.raises(warren.InvalidError, match="invalid hostname"):
        await w.create(IMAGE, hostname="under_score")
