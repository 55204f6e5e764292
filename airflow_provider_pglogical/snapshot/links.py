"""Tables linked by foreign keys: the sets a snapshot publishes at one LSN and a target loads together."""

from __future__ import annotations

from collections.abc import Collection, Sequence


def linked_components(tables: Sequence[str], links: Collection[tuple[str, str]]) -> list[tuple[str, ...]]:
    """``tables`` split into the sets linked by ``links`` (either way, transitively), each in ``tables``' order;
    the sets come in the order of their first table. A table linked to none is a set of its own."""
    parent = {t: t for t in tables}

    def root(t: str) -> str:
        while parent[t] != t:
            parent[t] = parent[parent[t]]
            t = parent[t]
        return t

    for a, b in links:
        if a in parent and b in parent:
            parent[root(a)] = root(b)
    out: dict[str, list[str]] = {}
    for t in tables:
        out.setdefault(root(t), []).append(t)
    return [tuple(c) for c in out.values()]
