"""rlsched_dev.nodes.watch_event_batches: a raw watch stream cut into decoded events."""

import orjson
from hypothesis import given
from hypothesis import strategies as st

from rlsched_dev.nodes import watch_event_batches


class Chunks:
    """What a urllib3 response's ``stream()`` yields: bytes cut anywhere."""

    def __init__(self, chunks):
        self.chunks = chunks

    def stream(self, amt=None, decode_content=True):
        yield from self.chunks


@given(st.lists(st.dictionaries(st.sampled_from(["type", "object"]), st.integers(-2**40, 2**40)), max_size=20),
       st.lists(st.integers(1, 50), max_size=30))
def test_events_come_out_whole_and_in_order_whatever_the_chunks(events, cuts):
    stream = b"".join(orjson.dumps(e) + b"\n" for e in events)
    chunks, at = [], 0
    for c in cuts:
        chunks.append(stream[at:at + c])
        at += c
    chunks.append(stream[at:])
    batches = list(watch_event_batches(Chunks(chunks)))
    assert len(batches) == len(chunks)
    assert [e for batch in batches for e in batch] == events
