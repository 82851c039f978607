"""ours (issue 43): which addresses the pod may fetch from for a caller. An address that is not
globally routable (private, loopback, link-local with the cloud metadata service
169.254.169.254, shared, reserved, unspecified, multicast; IPv4 inside IPv6 by its IPv4) is
refused unless --fetch-allow lists a network that holds it (an operator who serves media or
MCP servers internally)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
FETCH_DEADLINE_S = 10.0
"""A fetch's whole time (llama-server's download timeout, there per operation)."""
MAX_REDIRECTS = 5


class AddressRefused(Exception):
    """A target whose address the policy refuses (nothing was sent to it)."""


def parse_networks(entries: list[str]) -> tuple[IPNetwork, ...]:
    """--fetch-allow's entries: networks (`10.0.0.0/8`) or addresses (ValueError: not one)."""
    networks = []
    for entry in (e.strip() for e in entries):
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(f"--fetch-allow: not an address or network: {entry}") from None
    return tuple(networks)


def unwrapped(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 one carries (mapped `::ffff:a.b.c.d`, NAT64), else itself."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def is_public(address: IPAddress) -> bool:
    address = unwrapped(address)
    return address.is_global and not address.is_multicast


@dataclass(frozen=True)
class FetchPolicy:
    allow: tuple[IPNetwork, ...] = ()
    deadline_s: float = FETCH_DEADLINE_S
    max_redirects: int = MAX_REDIRECTS

    @classmethod
    def from_flags(cls, allow: list[str]) -> FetchPolicy:
        return cls(parse_networks(allow))

    def permits(self, address: IPAddress) -> bool:
        if is_public(address):
            return True
        return any(a in network for a in {address, unwrapped(address)} for network in self.allow
                   if a.version == network.version)

    def check(self, host: str, addresses: list[str]) -> str:
        """The address to connect to: the first of `addresses` (what `host` resolved to), all
        of which must be permitted (AddressRefused)."""
        if not addresses:
            raise AddressRefused(f"{host} has no address")
        for text in addresses:
            address = ipaddress.ip_address(text.split("%")[0])
            if not self.permits(address):
                raise AddressRefused(f"{host} resolves to {address}, which is not a public "
                                     "address (--fetch-allow lists none that holds it)")
        return addresses[0]
