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


async def test_user_namespace(w: warren.AsyncWarren) -> None:
    """user_namespace=True: root inside is an unprivileged host id, which
    the sandbox's info reports; files the SDK writes are root's inside."""
    async with w.create(IMAGE, user_namespace=True) as sb:
        assert sb.info.user_namespace
        base = sb.info.user_id_base
        assert base > 0
        fields = (await sb.exec("cat /proc/self/uid_map")).text.split()
        assert fields == ["0", str(base), "65536"]
        await sb.write_file("/from-sdk", b"x")
        assert (await sb.exec("stat -c %u:%g /from-sdk")).text == "0:0\n"
    async with w.create(IMAGE, user_namespace=False) as sb:
        assert not sb.info.user_namespace
        assert (await sb.exec("cat /proc/self/uid_map")).text.split() == ["0", "0", "4294967295"]
