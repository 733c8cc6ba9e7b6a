"""The TCP listener: bearer tokens and compressed responses."""

from __future__ import annotations

from typing import Any, Dict

import pytest

import warren
from conftest import IMAGE, TOKEN


async def test_tcp_with_token(daemon: Any, labels: Dict[str, str], addr: str) -> None:
    async with warren.AsyncWarren(daemon.tcp_addr, token=TOKEN, labels=labels) as w:
        assert "container" in (await w.version()).backends
        async with w.create(IMAGE) as sb:
            r = await sb.exec("yes hello | head -c 300000")  # large enough to be gzipped
            assert len(r.stdout) == 300000 and r.stdout.startswith(b"hello\nhello\n")
            st = sb.exec_stream("echo streamed")
            assert (await st.wait()).stdout == b"streamed\n"
            await sb.write_file("/f", "x")
            assert await sb.download_tar("/f")


async def test_tcp_token_is_required(daemon: Any) -> None:
    for token in (None, "wrong-token"):
        async with warren.AsyncWarren(daemon.tcp_addr, token=token or "") as w:
            with pytest.raises(warren.UnauthenticatedError) as ei:
                await w.version()
            assert ei.value.category == "unauthenticated"
            with pytest.raises(warren.UnauthenticatedError):
                await w.sandbox("x").download_tar("/")  # plain HTTP endpoints too
            assert await w.health()  # the health check needs no token
