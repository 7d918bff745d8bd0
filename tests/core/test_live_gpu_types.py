"""GPU types on the live side, pure: the product -> type map of the contract, the goodput
record kept per type in ``status.goodput`` (rows written before types still read), its
rows reaching the allocator as per-type profile samples, and the plan carrying each
node's type to the allocator and the type of its answer to the generation."""

from dataclasses import replace

import pytest

from rlsched.core.allocation import Allocation
from rlsched.core.batch import BatchBounds
from rlsched.core.contract import gpu_type_of, parse_gpu_types, products_of_type
from rlsched.core.goodput import JobObservations
from rlsched.core.live_allocation import (LiveAllocation, LiveTarget, observations_from_status,
                                          observations_to_status)

from .views import view

B = BatchBounds(128, 1024, 16, 256)


class Fixed:
    """An allocator whose answer the test writes down (``type_aware`` as given)."""

    name = "fixed"
    clairvoyant = False

    def __init__(self, answer, type_aware=False):
        self.answer, self.type_aware, self.seen = answer, type_aware, None

    def allocate(self, jobs, nodes, now, queues=None):
        self.seen = (list(jobs), list(nodes))
        return self.answer

    def order(self, jobs):
        return sorted(jobs, key=lambda j: (j.submit_time, j.id))


def test_the_product_map_parses_json_or_a_mapping_and_names_a_bad_entry():
    table = parse_gpu_types('{"Tesla-T4": "aws", "NVIDIA-A100-SXM4-40GB": "dgx-ext", "Tesla-T4-SHARED": "aws"}')
    assert table == {"Tesla-T4": "aws", "NVIDIA-A100-SXM4-40GB": "dgx-ext", "Tesla-T4-SHARED": "aws"}
    assert parse_gpu_types({"A10": "a10"}) == {"A10": "a10"}
    assert parse_gpu_types("") == {} and parse_gpu_types(None) == {}
    with pytest.raises(ValueError, match="--gpu-types: not a JSON object"):
        parse_gpu_types("{Tesla-T4: aws}", "--gpu-types")
    with pytest.raises(ValueError, match="expected an object"):
        parse_gpu_types('["Tesla-T4"]')
    with pytest.raises(ValueError, match="product 'Tesla T4'"):  # GFD writes no spaces: a typo
        parse_gpu_types({"Tesla T4": "aws"})
    with pytest.raises(ValueError, match="type '' "):
        parse_gpu_types({"Tesla-T4": ""})
    with pytest.raises(ValueError, match="type 'Tesla-T4' .* is also a product mapped to 'aws'"):
        parse_gpu_types({"Tesla-T4": "aws", "T4-x": "Tesla-T4"})


def test_a_nodes_type_is_its_products_entry_else_the_product_and_pods_match_all_its_products():
    table = {"Tesla-T4": "aws", "Tesla-T4-SHARED": "aws", "NVIDIA-A100-SXM4-40GB": "dgx-ext"}
    assert gpu_type_of("Tesla-T4", table) == "aws"
    assert gpu_type_of("NVIDIA-H100-80GB-HBM3", table) == "NVIDIA-H100-80GB-HBM3"  # unmapped: its own type
    assert gpu_type_of(None, table) == "" and gpu_type_of("unknown", table) == ""  # no GFD label
    assert products_of_type("aws", table) == ("Tesla-T4", "Tesla-T4-SHARED", "aws")
    assert products_of_type("NVIDIA-H100-80GB-HBM3", table) == ("NVIDIA-H100-80GB-HBM3",)
    # every product whose nodes are of a type is matched by that type's affinity, and no other
    for p in ("Tesla-T4", "Tesla-T4-SHARED", "NVIDIA-A100-SXM4-40GB", "aws", "H100"):
        for t in ("aws", "dgx-ext", "H100"):
            assert (p in products_of_type(t, table)) == (gpu_type_of(p, table) == t), (p, t)


def test_the_goodput_record_keeps_shapes_per_type_and_reads_rows_written_before_types():
    obs = (JobObservations(B).record(2, 1, 256, 0.4, "aws").record(2, 1, 256, 0.1, "dgx-ext")
           .record(4, 1, 512, 0.15, "dgx-ext"))
    assert obs.gpu_type == "dgx-ext" and obs.observations() == ((2, 1, 128.0, 0, 0.1), (4, 1, 128.0, 0, 0.15))
    st = observations_to_status(obs, "2026-01-01T00:00:00Z")
    assert st["gpuType"] == "dgx-ext"
    assert sorted(r[6] for r in st["shapes"]) == ["aws", "dgx-ext", "dgx-ext"]
    back, last = observations_from_status(st, B)
    assert back.shapes == obs.shapes and back.fitted == obs.fitted and back.gpu_type == "dgx-ext"
    assert last == "2026-01-01T00:00:00Z"
    # the same shape on two types is two rows; a report folds into its own type's row
    again = back.record(2, 1, 256, 0.5, "aws")
    assert [(r.gpu_type, r.reports) for r in again.shapes if r.workers == 2] == [("aws", 2), ("dgx-ext", 1)]
    # a record written before types (six per row, no gpuType) reads as it did: no type
    old = {"shapes": [[2, 1, 256, 0, 0.2, 3], [4, 2, 512, 0, 0.25, 1, 7]], "gradSqr": 1.0, "gradVar": 2.0}
    back, _ = observations_from_status(old, B)
    assert [(r.workers, r.gpu_type, r.reports) for r in back.shapes] == [(2, "", 3)]  # a non-text type: left out
    assert back.gpu_type == "" and back.fitted == ((2, 1, 128.0, 0, 0.2),)
    assert observations_to_status(back, None) == {"shapes": [[2, 1, 256, 0, 0.2, 3]], "gradSqr": 1.0, "gradVar": 2.0}


def test_the_rows_reach_the_allocator_as_profile_samples_of_their_type():
    obs = JobObservations(B).record(2, 1, 256, 0.4, "aws").record(1, 1, 128, 0.1, "dgx-ext")
    a = LiveAllocation.alloc_job(view("ns/a", 0.0, 1, 4, placement=(0,), bounds=B, observations=obs), now=1.0)
    assert sorted((p.gpu_type, p.num_replicas, p.step_time) for p in a.profile) == [("aws", 2, 0.4),
                                                                                   ("dgx-ext", 1, 0.1)]


def test_each_nodes_type_reaches_the_allocator_and_a_one_type_answer_pins_the_generation():
    types = {0: "aws", 1: "aws", 2: "dgx-ext", 3: "dgx-ext"}
    jobs = [view("ns/t4", 0.0, 1, 4), view("ns/a100", 1.0, 1, 4), view("ns/both", 2.0, 1, 4)]
    answer = {"ns/t4": Allocation((0, 1)), "ns/a100": Allocation((2, 2, 3)), "ns/both": Allocation((1, 3))}
    live = LiveAllocation(Fixed(answer))
    plan = live.plan(jobs, {0: 4, 1: 4, 2: 8, 3: 8}, now=5.0, types=types)
    assert [n.gpu_type for n in live.allocator.seen[1]] == ["aws", "aws", "dgx-ext", "dgx-ext"]
    assert plan.start == {"ns/t4": LiveTarget(2, None, "aws"), "ns/a100": LiveTarget(3, None, "dgx-ext"),
                          "ns/both": LiveTarget(2, None, None)}  # across types: not pinned
    # no node with a type (no GFD label, or a cluster of one type): as before, no pin
    untyped = LiveAllocation(Fixed(answer))
    plan = untyped.plan(jobs, {0: 4, 1: 4, 2: 8, 3: 8}, now=5.0)
    assert {t.gpu_type for t in plan.start.values()} == {None}
    assert {n.gpu_type for n in untyped.allocator.seen[1]} == {""}


@pytest.mark.parametrize("type_aware", [True, False])
def test_a_move_to_another_type_at_the_same_size_is_a_new_generation_only_when_the_allocator_chose_it(type_aware):
    types = {0: "aws", 1: "dgx-ext"}
    running = view("ns/a", 0.0, 1, 4, placement=(0, 0))
    plan = LiveAllocation(Fixed({"ns/a": Allocation((1, 1))}, type_aware)).plan(
        [running], {0: 4, 1: 8}, now=5.0, types=types)
    assert plan.resize == ({"ns/a": LiveTarget(2, None, "dgx-ext")} if type_aware else {})
    stay = LiveAllocation(Fixed({"ns/a": Allocation((0, 0))}, type_aware)).plan(
        [running], {0: 4, 1: 8}, now=5.0, types=types)
    assert stay.resize == {} and stay.start == {} and stay.stop == []


def test_a_job_moves_to_a_faster_type_that_frees_up_only_with_the_seed_profile_it_declared():
    """The served goodput allocator on one T4-like and one A100-like node: a job that ran
    on the slow type alone has no model on the other type but what its seed profile says;
    with the seed (4x faster there) it moves when that type has room, without it stays."""
    from rlsched.core.allocation import ProfileSample

    types = {0: "aws", 1: "dgx-ext"}
    obs = JobObservations(B).record(2, 1, 128, 0.4, "aws")
    seed = (ProfileSample(1, 1, 64, 0.4, 0.0, gpu_type="aws"), ProfileSample(1, 1, 64, 0.1, 0.0, gpu_type="dgx-ext"))
    running = view("ns/a", 0.0, 1, 2, placement=(0, 0), batch_size=128, bounds=B, observations=obs,
                      start_time=10.0, restarts=0)
    assert LiveAllocation.alloc_job(replace(running, seed_profile=seed), now=1.0).seed_profile == seed

    def plan(job):
        return LiveAllocation.named("goodput@restart_delay=1").plan([job], {0: 4, 1: 8}, now=100.0, types=types)

    assert plan(running).resize == {} and plan(running).stop == []
    moved = plan(replace(running, seed_profile=seed))
    assert moved.resize == {"ns/a": LiveTarget(2, 128, "dgx-ext")}, moved


def test_the_stall_a_job_measured_live_weighs_its_move():
    """``JobView.restart_s`` (the operator's ``status.restartStall``) reaches the
    allocator: the same move to the faster type is made after a short measured stall and
    not after a long one."""
    from rlsched.core.allocation import ProfileSample

    types = {0: "aws", 1: "dgx-ext"}
    obs = JobObservations(B).record(2, 1, 128, 0.4, "aws")
    seed = (ProfileSample(1, 1, 64, 0.4, 0.0, gpu_type="aws"), ProfileSample(1, 1, 64, 0.1, 0.0, gpu_type="dgx-ext"))
    running = view("ns/a", 0.0, 1, 2, placement=(0, 0), batch_size=128, bounds=B, observations=obs,
                      start_time=10.0, restarts=0, seed_profile=seed)
    assert LiveAllocation.alloc_job(replace(running, restart_s=7.0), now=1.0).restart_s == 7.0

    def plan(job):
        return LiveAllocation.named("goodput").plan([job], {0: 4, 1: 8}, now=100.0, types=types)

    assert plan(replace(running, restart_s=5.0)).resize == {"ns/a": LiveTarget(2, 128, "dgx-ext")}
    assert plan(replace(running, restart_s=1e5)).resize == {}
