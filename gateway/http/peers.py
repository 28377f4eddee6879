"""Who a request comes from: the connection's peer address, or, behind a proxy the config trusts
(``server.trusted_proxies``), the address that proxy saw.

``X-Forwarded-For`` is anyone's to write: it is read only when the peer is a trusted proxy, and then
from the right, where each trusted proxy appended the address it saw; the right-most address that is
not itself a trusted proxy is the client. Whatever a client put further left is never believed (with
an empty list, the default, the header is not read at all). uvicorn's own reading of the header is
off (``gateway.cli``): it believes any ``X-Forwarded-For`` from loopback.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from starlette.types import Scope

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_SHOWN = 64
"""An address from a header is cut to this length (it goes into logs and the lockout table)."""


def network(cidr: str) -> Network:
    """``cidr`` as a network (a bare address is a network of one); ValueError when it is neither."""
    return ipaddress.ip_network(cidr.strip(), strict=False)


class TrustedProxies:
    def __init__(self, cidrs: Sequence[str]) -> None:
        self.cidrs = cidrs
        self.networks = tuple(network(c) for c in cidrs)

    def trusted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip in net for net in self.networks)

    def client(self, scope: Scope) -> str:
        """The address of the request's client, as far as the trusted proxies let the gateway know it."""
        peer = scope.get("client")
        address = str(peer[0]) if peer else "unknown"
        if not self.networks or not self.trusted(address):
            return address
        hops: list[str] = [
            hop.strip()
            for key, value in scope["headers"]
            if key == b"x-forwarded-for"
            for hop in value.decode("latin-1").split(",")
        ]
        for hop in reversed(hops):
            if hop and not self.trusted(hop):
                return hop[:_SHOWN]
            address = hop[:_SHOWN] or address  # trusted all the way: the left-most the proxies named
        return address
