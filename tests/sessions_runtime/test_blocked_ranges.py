"""Where notebooks' connections are never forwarded: every private range by default, a setting to change the
list (a lab or an overlay the portal needs), cloud metadata and the notebooks' own subnet blocked whatever it
says, and a bad value refused naming the setting. The firewall's rules are made from the list."""

from __future__ import annotations

import pytest

from sessions.runtime import network
from sessions.runtime.firewall import chains_for, outbound_rules


def blocked(text: str, subnet: str = "10.88.0.0/24") -> list[str]:
    return [str(block) for block in network.parse("gpu-portal", subnet, True, 8081, text).blocked]


def test_by_default_every_private_shared_and_special_range_is_blocked() -> None:
    assert blocked("") == list(network.DEFAULT_BLOCKED)
    assert network.from_environ({}).blocked == network.parse("gpu-portal", "10.88.0.0/24", True, 8081).blocked


def test_a_narrower_list_keeps_cloud_metadata_and_the_notebooks_own_subnet_blocked() -> None:
    assert blocked("192.168.0.0/16, 172.16.0.0/12") == [
        "192.168.0.0/16",
        "172.16.0.0/12",
        "169.254.0.0/16",
        "10.88.0.0/24",
    ]
    assert blocked("10.0.0.0/8,169.254.0.0/16") == ["10.0.0.0/8", "169.254.0.0/16"]  # both covered already


@pytest.mark.parametrize("text", ["10.0.0.0/33", "10.0.0.1/8", "a lab", "fd00::/8"])
def test_a_bad_range_is_refused_naming_the_setting(text: str) -> None:
    with pytest.raises(network.NetworkSpecError, match="PORTAL_NOTEBOOK_BLOCKED_RANGES must list IPv4 ranges"):
        blocked(text)


def test_the_firewall_refuses_exactly_the_listed_ranges() -> None:
    user_network = network.parse("gpu-portal", "10.88.0.0/24", True, 8081, "192.168.0.0/16")
    chain = chains_for(user_network).outbound
    refused = [rule.split()[3] for rule in outbound_rules(user_network, chain, []) if "REJECT" in rule]
    assert refused == ["192.168.0.0/16", "169.254.0.0/16", "10.88.0.0/24"]
