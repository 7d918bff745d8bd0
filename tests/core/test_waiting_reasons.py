"""Why a job waits (issue 26 item 4), read off the admission plan: position in the
service order after this cycle's admissions, reason code and numbers, on a case small
enough to compute by hand."""

from rlsched.core import ClusterState, Topology, make_ordering
from rlsched.core.planning import Admission, TrainingSpec, waiting_reasons


def entry(key, workers, t):
    return TrainingSpec(min_workers=workers, max_workers=workers).view(key, submit_time=t, workers=workers,
                                                                       priority=0.0)


def test_reasons_and_positions_with_and_without_backfill():
    # one node of 8 GPUs, 6 held: 2 free. FIFO: A (4 GPUs) heads the queue, B (1), C (16: never), D (4)
    state = ClusterState(Topology.uniform(1, gpus_per_node=8, racks=1, blocks=1))
    state.allocate(0, 6)
    waiting = [entry("A", 4, 0.0), entry("B", 1, 1.0), entry("C", 16, 2.0), entry("D", 4, 3.0)]
    plan = Admission(make_ordering("fifo"), backfill=False).plan(waiting, [], state)
    why = waiting_reasons(plan, waiting, backfill=False, free_gpus=2)
    assert {k: (w.position, w.reason) for k, w in why.items()} == \
        {"A": (1, "NoRoom"), "B": (2, "BehindHead"), "C": (0, "Unfittable"), "D": (3, "BehindHead")}
    assert "the 2 free GPUs" in why["A"].message and "behind A" in why["B"].message
    plan = Admission(make_ordering("fifo"), backfill=True).plan(waiting, [], state)
    why = waiting_reasons(plan, waiting, backfill=True, free_gpus=2)
    assert plan.admit == ["B"]  # backfilled past A
    assert {k: (w.position, w.reason) for k, w in why.items()} == \
        {"A": (1, "NoRoom"), "C": (0, "Unfittable"), "D": (2, "NoRoom")}
    assert why["A"].to_status() == {"position": 1, "reason": "NoRoom", "message": why["A"].message}
