from rlsched.operator.status import parse_time
from rlsched.operator.handlers import leader_of

NOW = parse_time("2026-01-01T00:01:00Z")


def test_highest_priority_live_peer_leads():
    peers = {
        "a": {"priority": 0, "lifetime": 60, "lastseen": "2026-01-01T00:00:30+00:00"},
        "b": {"priority": 10, "lifetime": 60, "lastseen": "2026-01-01T00:00:30.123456+00:00"},
        "dead": {"priority": 99, "lifetime": 30, "lastseen": "2026-01-01T00:00:00+00:00"},
    }
    assert leader_of(peers, NOW) == "b"
    del peers["b"]
    assert leader_of(peers, NOW) == "a"


def test_tie_goes_to_lowest_identity_and_empty_is_none():
    peers = {x: {"priority": 1, "lifetime": 60, "lastseen": "2026-01-01T00:00:59Z"} for x in ("z", "m")}
    assert leader_of(peers, NOW) == "m"
    assert leader_of({}, NOW) is None
    assert leader_of({"x": {"priority": 1, "lifetime": 1, "lastseen": "2026-01-01T00:00:00Z"}}, NOW) is None
