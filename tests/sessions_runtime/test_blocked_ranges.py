"""Where notebooks' connections are never forwarded: every private range by default, a setting to change the
list (a lab or an overlay the portal needs), cloud metadata and the notebooks' own subnet blocked whatever it
says, and a bad value refused naming the setting. The firewall's rules are made from the list."""

from __future__ import annotations

import pytest

from sessions.runtime import network
from sessions.runtime.firewall import chains_for, inbound_rules, outbound_rules, published_rules


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


def test_a_swarm_hosts_fence_lets_the_hub_through_before_the_blocked_ranges_and_only_its_proxy_in() -> None:
    user = network.parse("gpu-portal", "10.88.0.0/24", True, 8081)
    bridge = network.host_bridge(user, "http://10.77.0.1:8081/")
    chains = chains_for(bridge)
    out = outbound_rules(bridge, chains.outbound, ["192.0.2.53"])
    hub = out.index(f"-A {chains.outbound} -p tcp -d 10.77.0.1 --dport 8081 -j RETURN")
    assert hub < out.index(f"-A {chains.outbound} -d 10.0.0.0/8 -j REJECT --reject-with icmp-admin-prohibited")
    assert bridge.bridge == "docker0" and bridge.blocked == user.blocked
    assert f"-A {chains.published} -s 10.77.0.1 -j RETURN" in published_rules(bridge, chains.published)
    assert not any("--dport 8081 -j ACCEPT" in rule for rule in inbound_rules(bridge, chains.inbound))


@pytest.mark.parametrize("url", ["", "hub:8081", "http://hub-host:8081", "http://10.77.0.1", "http://10.77.0.300:1"])
def test_a_swarm_hosts_fence_refuses_a_hub_address_it_cannot_write_a_rule_for(url: str) -> None:
    user = network.parse("gpu-portal", "10.88.0.0/24", True, 8081)
    with pytest.raises(network.NetworkSpecError, match="PORTAL_HUB_BIND_URL"):
        network.host_bridge(user, url)
