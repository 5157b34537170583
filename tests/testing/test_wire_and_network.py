"""The simulator's messages round-trip and refuse damage; the network is seeded and faithful."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mycelia.errors import DecodeError, StorageError
from mycelia.proto import Clock, EntityId
from mycelia.retrieval import WriteBatch
from mycelia.testing import Faults, FaultyStorage
from mycelia.testing.network import INTRUDER, Network, VirtualClock
from mycelia.testing.strategies import clocks, entity_ids, event_ids, events
from mycelia.testing.trace import Trace
from mycelia.testing.wire import Digest, Push, Want, decode, encode

messages = st.one_of(
    st.lists(events(), max_size=4).map(lambda e: Push(tuple(e))),
    st.lists(event_ids(), max_size=4).map(lambda i: Want(tuple(sorted(i)))),
    st.builds(
        Digest,
        st.lists(st.tuples(entity_ids(), clocks(min_size=1, max_size=3)), max_size=3).map(tuple),
        st.booleans(),
    ),
)


@given(msg=messages)
def test_every_message_round_trips_through_its_bytes(msg: Push | Want | Digest) -> None:
    assert decode(encode(msg)) == msg


@given(msg=messages, data=st.data())
def test_a_truncated_message_is_always_refused(
    msg: Push | Want | Digest, data: st.DataObject
) -> None:
    raw = encode(msg)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(DecodeError):
        decode(raw[:cut])


def test_a_digest_entry_without_a_head_is_refused() -> None:
    headless = encode(Digest(((EntityId(bytes(32)), Clock([])),), True))
    with pytest.raises(DecodeError):
        decode(headless)


def _network(seed: int, faults: Faults) -> tuple[Network, Trace]:
    trace = Trace(keep=True)
    return Network(VirtualClock(), random.Random(seed), faults, trace), trace


def test_the_same_seed_draws_the_same_fates() -> None:
    fates = []
    for _ in range(2):
        network, trace = _network(4, Faults.all())
        for i in range(200):
            network.send(i % 3, (i + 1) % 3, bytes([i % 256]) * 10)
        fates.append(trace.digest)
    assert fates[0] == fates[1]


def test_delays_reorder_and_partitions_cut_both_at_send_and_in_flight() -> None:
    network, _ = _network(1, Faults(max_delay=5))
    for i in range(20):
        network.send(0, 1, bytes([i]))
    network.partition([1])
    network.send(0, 1, b"cut")
    network.send(INTRUDER, 1, b"intruders are never cut")
    assert network.counts["cut"] == 1
    assert network.cut(0, 1)
    assert not network.cut(INTRUDER, 1)
    network.heal()
    network.clock.advance(10)
    order = []
    while (env := network.pop_due()) is not None:
        order.append(env.payload)
    assert len(order) == 21
    assert order[:20] != [bytes([i]) for i in range(20)], "no reordering at max_delay=5"


async def test_faulty_storage_refuses_a_whole_batch_and_changes_nothing() -> None:
    storage = FaultyStorage()
    storage.arm()
    with pytest.raises(StorageError):
        await storage.write(WriteBatch(meta=(("k", b"v"),)))
    assert await storage.get_meta("k") is None
    await storage.write(WriteBatch(meta=(("k", b"v"),)))
    assert await storage.get_meta("k") == b"v"
    assert storage.failed == 1
