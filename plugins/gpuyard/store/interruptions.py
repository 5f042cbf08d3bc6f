"""Each node's interruption record (domain/interruptions.py), kept in the transaction that ends an
attempt and read by the heartbeat for the automatic checkpoint interval: a read of the attempt's
own nodes' rows, never a scan of past attempts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from sqlalchemy import Connection, select
from sqlalchemy.dialects import postgresql, sqlite

from gpuyard.domain.interruptions import NodeRecord, ended_attempt, gang_mtbi_s, node_rate
from gpuyard.store.tables import node_interruptions


def records(conn: Connection, nodes: Iterable[str], *, for_update: bool = False) -> dict[str, NodeRecord]:
    query = select(node_interruptions).where(node_interruptions.c.node.in_(sorted(set(nodes))))
    rows = conn.execute(query.with_for_update() if for_update else query)
    return {r.node: NodeRecord(r.run_s, r.interruptions, r.updated_at) for r in rows}


def record_ended(conn: Connection, nodes: Iterable[str], *, ran_s: float, lost: bool, at: datetime) -> None:
    """An attempt on `nodes` ended at `at` after running `ran_s` (LOST when `lost`)."""
    names = sorted(set(nodes))
    if not names:
        return
    updated = ended_attempt(records(conn, names, for_update=True), names, ran_s, lost, at)
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    for node, record in updated.items():
        values = {"run_s": record.run_s, "interruptions": record.interruptions, "updated_at": record.at}
        statement = dialect.insert(node_interruptions).values(node=node, **values)
        # A node's first row may be written by two transactions at once: the later one wins.
        conn.execute(statement.on_conflict_do_update(index_elements=["node"], set_=values))


def attempt_mtbi_s(conn: Connection, priors: Mapping[str, float], now: datetime) -> float:
    """Mean time between interruptions of an attempt on the nodes of `priors` (each node's expected
    MTBI before any history)."""
    known = records(conn, priors)
    return gang_mtbi_s(node_rate(known.get(node), prior, now) for node, prior in priors.items())
