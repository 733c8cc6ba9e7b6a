"""The default hardening as the SDK shows it: no_new_privs and the seccomp
filter, and allow_setuid turning no_new_privs off."""

from __future__ import annotations

import warren
from conftest import IMAGE

STATUS = "grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status"


async def test_no_new_privs_by_default_and_allow_setuid(w: warren.AsyncWarren) -> None:
    async with w.create(IMAGE) as sb:
        assert not sb.info.allow_setuid
        assert (await sb.exec(STATUS)).text == "NoNewPrivs:\t1\nSeccomp:\t2\n"
    async with w.create(IMAGE, allow_setuid=True) as sb:
        assert sb.info.allow_setuid
        assert (await sb.exec(STATUS)).text == "NoNewPrivs:\t0\nSeccomp:\t2\n"
