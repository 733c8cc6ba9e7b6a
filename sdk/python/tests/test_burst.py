"""A burst of creates from one client: the daemon takes them all at once."""

from __future__ import annotations

import asyncio
import resource
import time
from typing import Dict, List

import pytest

import warren
from conftest import IMAGE

N = 1000


def _raise_nofile(want: int) -> None:
    # Every create in flight holds one connection (HTTP/1.1): 1,000 of them
    # need more descriptors than the usual soft limit of 1,024.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard) if hard != resource.RLIM_INFINITY else want, hard))


@pytest.mark.timeout_s(120)
async def test_1000_simultaneous_creates_from_one_client(addr: str, labels: Dict[str, str]) -> None:
    _raise_nofile(N + 1024)
    # One connection per create, so that all N reach the daemon at once
    # rather than queueing in the client's pool.
    async with warren.AsyncWarren(addr, labels=labels, max_connections=N) as w:
        t0 = time.monotonic()
        res: List[object] = await asyncio.gather(*(w.create(IMAGE) for _ in range(N)), return_exceptions=True)
        took = time.monotonic() - t0
        failed = [r for r in res if isinstance(r, BaseException)]
        made = [r for r in res if isinstance(r, warren.AsyncSandbox)]
        try:
            assert not failed, f"{len(failed)} of {N} creates failed in {took:.1f}s; first: {failed[0]!r}"
            assert len({sb.id for sb in made}) == N
            # They work: a few run a command.
            outs = await asyncio.gather(*(sb.exec(["echo", "ok"]) for sb in made[:: N // 10]))
            assert all(o.text == "ok\n" for o in outs)
            print(f"{N} simultaneous creates: {took:.1f}s")
        finally:
            t1 = time.monotonic()
            dels = await asyncio.gather(*(w.delete(sb.id, missing_ok=True) for sb in made), return_exceptions=True)
            bad = [d for d in dels if isinstance(d, BaseException)]
            print(f"{len(made)} simultaneous deletes: {time.monotonic() - t1:.1f}s")
        assert not bad, f"{len(bad)} deletes failed; first: {bad[0]!r}"
