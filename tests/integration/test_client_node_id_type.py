"""A node id that is not an int is told it must be a node id (``docs/client.md``,
"Cluster membership").

Found by a tester: ``add_node(1.0, ...)``, ``remove_node(True)`` and
``transfer_leader(2.5)`` said "node_id must be an int (milliseconds or a count)",
the sentence of a delay or a count.
"""

from __future__ import annotations

import pytest
from broker_process import BrokerProcess
from tests.backends import on_both_backends

from futureq.client import open_client
from futureq.state.commands import MAX_NODE_ID

SAYS = rf"^node_id must be a node id \(an int from 1 to {MAX_NODE_ID}\)"


@on_both_backends
async def test_a_float_or_bool_node_id_is_told_what_a_node_id_is(broker: BrokerProcess) -> None:
    async with open_client(broker.client_address) as client:
        for node_id in (1.0, True):
            with pytest.raises(TypeError, match=SAYS + r", got (float|bool)$"):
                await client.add_node(node_id, "127.0.0.1:1", "127.0.0.1:2")  # type: ignore[arg-type]
            with pytest.raises(TypeError, match=SAYS + r", got (float|bool)$"):
                await client.remove_node(node_id)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match=SAYS + r" or None, got (float|bool)$"):
                await client.transfer_leader(node_id)  # type: ignore[arg-type]
