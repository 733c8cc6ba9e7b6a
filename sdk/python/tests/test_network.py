"""Network policy through the SDK: the policy given at create (a
NetworkPolicy or the CLI's spelling) is the sandbox's, update changes it,
and a bad one is InvalidError naming the field. Traffic itself is tested
in Go (test/e2e/network_test.go) against test hosts in namespaces the
test makes; these tests send no packets."""

from __future__ import annotations

import pytest

import warren
from conftest import IMAGE


def test_parse_and_spell() -> None:
    p = warren.NetworkPolicy.parse("allow:10.1.0.0/16:443/tcp,192.0.2.1")
    assert p.mode == "allowlist"
    assert p.allow == (
        warren.NetworkRule(cidr="10.1.0.0/16", port=443, protocol="tcp"),
        warren.NetworkRule(cidr="192.0.2.1"),
    )
    assert str(p) == "allow:10.1.0.0/16:443/tcp,192.0.2.1"
    p = warren.NetworkPolicy.parse("allow:pypi.org:443/tcp,*.pythonhosted.org,10.0.0.1")
    assert p.allow == (
        warren.NetworkRule(host="pypi.org", port=443, protocol="tcp"),
        warren.NetworkRule(host="*.pythonhosted.org"),
        warren.NetworkRule(cidr="10.0.0.1"),
    )
    assert str(p) == "allow:pypi.org:443/tcp,*.pythonhosted.org,10.0.0.1"
    assert warren.NetworkPolicy.parse("open") == warren.NetworkPolicy(mode="open")
    with pytest.raises(ValueError):
        warren.NetworkPolicy.parse("closed")


async def test_network_policy_create_update(w: warren.AsyncWarren) -> None:
    async with w.create(IMAGE) as sb:
        assert sb.info.network.mode == "none" and sb.info.network_address == ""
    async with w.create(IMAGE, network="open") as sb:
        assert sb.info.network.mode == "open" and sb.info.network_address
        r = await sb.exec("cat /proc/net/dev")
        assert b"eth0" in r.stdout
        info = await sb.update(network=warren.NetworkPolicy(mode="allowlist", allow=(warren.NetworkRule("198.18.0.0/15", 80, "tcp"),)))
        assert str(info.network) == "allow:198.18.0.0/15:80/tcp"
        info = await sb.update(network=warren.NetworkPolicy(mode="allowlist", allow=(warren.NetworkRule(host="PyPI.org", port=443),)))
        assert info.network.allow == (warren.NetworkRule(host="pypi.org", port=443),)
        info = await sb.update(network="none")
        assert info.network.mode == "none" and info.network_address == ""
        r = await sb.exec("cat /proc/net/dev")
        assert b"eth0" not in r.stdout


async def test_network_group(w: warren.AsyncWarren) -> None:
    async with w.create(IMAGE, network=warren.NetworkPolicy(mode="none", group="py-team")) as sb:
        assert sb.info.network.group == "py-team" and sb.info.network_address
        info = await sb.update(network="open")
        assert info.network.mode == "open" and info.network.group == "py-team"
        with pytest.raises(warren.InvalidError, match="group"):
            await sb.update(network=warren.NetworkPolicy(mode="open", group="other"))


async def test_network_bad_policy_invalid(w: warren.AsyncWarren) -> None:
    for bad, field in (
        ("allow:10.0.0.0/33", "network.allow[0]: cidr"),
        ("allow:10.0.0.0/8:0", "network.allow[0]: port"),
        ("allow:10.0.0.0/8:70000", "network.allow[0]: port"),
        ("allow:ok.org,bad..name", "network.allow[1]: host"),
        ("allow:-bad.org:443/tcp", "network.allow[0]: host"),
        (warren.NetworkPolicy(mode="allowlist", allow=(warren.NetworkRule(host="a" * 64 + ".org"),)), "network.allow[0]: host"),
        (warren.NetworkPolicy(mode="closed"), "network.mode"),
    ):
        with pytest.raises(warren.InvalidError, match=field.replace("[", r"\[").replace("]", r"\]")):
            await w.create(IMAGE, network=bad)
