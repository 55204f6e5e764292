"""inet and cidr, rendered from the binary form exactly as network_out prints them."""

from __future__ import annotations

import pyarrow as pa

from airflow_provider_pglogical.decoding.values.codec import Codec
from airflow_provider_pglogical.exceptions import DecodeError

PGSQL_AF_INET = 2  # AF_INET + 0 on Linux (utils/inet.h)
PGSQL_AF_INET6 = 3  # AF_INET + 1


def _ipv6_text(addr: bytes) -> str:
    """BIND's inet_net_ntop_ipv6 as PostgreSQL ships it: longest zero run (≥2 words) as '::',
    and a trailing dotted quad for IPv4-compatible/-mapped addresses."""
    words = [addr[i] << 8 | addr[i + 1] for i in range(0, 16, 2)]
    best_base, best_len, cur_base, cur_len = -1, 0, -1, 0
    for i, w in enumerate(words):
        if w == 0:
            if cur_base == -1:
                cur_base, cur_len = i, 1
            else:
                cur_len += 1
        elif cur_base != -1:
            if best_base == -1 or cur_len > best_len:
                best_base, best_len = cur_base, cur_len
            cur_base = -1
    if cur_base != -1 and (best_base == -1 or cur_len > best_len):
        best_base, best_len = cur_base, cur_len
    if best_base != -1 and best_len < 2:
        best_base = -1
    out: list[str] = []
    i = 0
    while i < 8:
        if best_base != -1 and best_base <= i < best_base + best_len:
            if i == best_base:
                out.append(":")
            i += 1
            continue
        if i != 0:
            out.append(":")
        if i == 6 and best_base == 0 and (best_len == 6 or (best_len == 5 and words[5] == 0xFFFF)):
            out.append(".".join(str(b) for b in addr[12:]))
            break
        out.append(f"{words[i]:x}")
        i += 1
    if best_base != -1 and best_base + best_len == 8:
        out.append(":")
    return "".join(out)


class InetCodec(Codec):
    """inet/cidr as network_out's text: '/bits' shown for cidr always, for inet unless a host address."""

    arrow_type = pa.string()

    def __init__(self, is_cidr: bool) -> None:
        self.is_cidr = is_cidr
        self.name = "cidr" if is_cidr else "inet"

    def from_binary(self, raw: bytes) -> str:
        if len(raw) < 4:
            raise DecodeError(f"truncated {self.name} binary value")
        family, bits, _is_cidr, nb = raw[0], raw[1], raw[2], raw[3]
        size = {PGSQL_AF_INET: 4, PGSQL_AF_INET6: 16}.get(family)
        if size is None or nb != size or len(raw) != 4 + nb or bits > 8 * size:
            raise DecodeError(f"invalid {self.name} binary value")
        addr = raw[4:]
        text = ".".join(str(b) for b in addr) if size == 4 else _ipv6_text(addr)
        if self.is_cidr or bits != 8 * size:
            text += f"/{bits}"
        return text

    def from_text(self, text: str) -> str:
        return text
