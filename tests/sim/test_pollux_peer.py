"""The released Pollux policy as a peer allocator (rlsched.sim.peers.pollux and the
bridge tools/pollux/pollux_bridge.py).

Two kinds of tests:

* the client's wire format and error paths, and the bridge's pure helpers: always run,
  no Pollux environment needed. Where a child process is needed to exercise the
  protocol's error handling, a tiny *protocol stub* (named so) plays the bridge; it
  never stands in for Pollux.
* the real bridge with the released adaptdl-sched 0.2.11: skipped, with the reason,
  when the optional environment is absent (``make pollux-env``).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import sys
import textwrap
from pathlib import Path

import pytest

from rlsched.core.contract import RESOURCE_GPU

from rlsched.core.allocation import (
    AllocationError,
    Allocator,
    AllocJob,
    AllocNode,
    Allocation,
    Oracle,
    ProfileSample,
)
from rlsched.core.batch import BatchBounds
from rlsched.sim.peers import pollux as peer
from rlsched.sim.peers.pollux import (
    BRIDGE,
    PeerError,
    PeerUnavailable,
    PolluxAllocator,
    allocations_of,
    pollux_available,
    request_of,
)

ROOT = Path(__file__).resolve().parents[2]

CIFAR = BatchBounds(128, 4096, 32, 1024)
BERT = BatchBounds(12, 384, 4, 12)
NCF = BatchBounds(256, 32768, 32, 32768)

#: throughput a job measured on one node at 1, 2 and 4 GPUs: compute ~linear in the
#: per-GPU batch, a small synchronisation cost (it scales well)
GOOD_PROFILE = (
    ProfileSample(1, 1, 128, 0.100, 0.0),
    ProfileSample(1, 1, 256, 0.180, 0.0),
    ProfileSample(1, 2, 128, 0.110, 0.010),
    ProfileSample(1, 4, 128, 0.115, 0.015),
)


def _job(jid="a", *, application="cifar10", bounds=CIFAR, allocation=(), profile=(), grad=(None, None),
         submit=0.0, age=600.0, max_replicas=64, oracle=None) -> AllocJob:
    return AllocJob(
        id=jid, submit_time=submit, application=application, age=age, attained_service=100.0, num_restarts=0,
        allocation=tuple(allocation), target_replicas=None, target_batch_size=None, min_replicas=0,
        max_replicas=max_replicas, bounds=bounds, grad_sqr=grad[0], grad_var=grad[1], profile=tuple(profile),
        oracle=oracle)


NODES2 = [AllocNode(0, 4), AllocNode(1, 4)]


# ---------------------------------------------------------------------------- wire format
def test_request_carries_what_a_live_scheduler_knows_and_no_oracle():
    j = _job(allocation=(0, 0), profile=GOOD_PROFILE, grad=(0.01, 1.0),
             oracle=Oracle(remaining_progress=10.0, progress_rate={1: 1.0}))
    req = request_of([j], NODES2, 600.0)
    json.dumps(req, allow_nan=False)  # plain JSON
    assert req["now"] == 600.0
    assert req["nodes"] == [{"index": 0, "gpus": 4}, {"index": 1, "gpus": 4}]
    (d,) = req["jobs"]
    assert "oracle" not in d
    assert d["id"] == "a" and d["allocation"] == [0, 0] and d["max_replicas"] == 64
    assert d["limits"] == {"init_batch_size": 128, "max_batch_size": 4096, "min_local_bsz": 32, "max_local_bsz": 1024}
    assert d["profile"][2] == [1, 2, 128, 0.110, 0.010]
    assert (d["grad_sqr"], d["grad_var"]) == (0.01, 1.0)
    assert d["fixed_batch_size"] is None


def test_request_pins_ncf_as_the_paper_did():
    req = request_of([_job("n", application="ncf", bounds=NCF), _job("c")], NODES2, 0.0)
    ncf, cifar = req["jobs"]
    assert (ncf["max_replicas"], ncf["fixed_batch_size"]) == (1, 32768)
    assert (cifar["max_replicas"], cifar["fixed_batch_size"]) == (64, None)
    none = request_of([_job("n", application="ncf", bounds=NCF)], NODES2, 0.0, pinned={})
    assert (none["jobs"][0]["max_replicas"], none["jobs"][0]["fixed_batch_size"]) == (64, None)


def test_request_rejects_numbers_json_cannot_carry():
    with pytest.raises(ValueError, match="job a: grad_var is nan"):
        request_of([_job(grad=(0.1, math.nan))], NODES2, 0.0)
    with pytest.raises(ValueError, match="job a: step_time is inf"):
        request_of([_job(profile=[ProfileSample(1, 1, 128, math.inf, 0.0)])], NODES2, 0.0)


def test_allocations_of_reads_a_reply_and_refuses_errors_and_garbage():
    ok = {"allocations": {"a": {"nodes": [0, 1], "atomic_bsz": 64, "accum_steps": 1}}, "info": {}}
    assert allocations_of(ok) == {"a": Allocation((0, 1), 64, 1)}
    with pytest.raises(PeerError, match="Pollux bridge: bad request: 'nodes' must be a list"):
        allocations_of({"error": "bad request: 'nodes' must be a list"})
    for bad in ([], {"info": {}}, {"allocations": {"a": {"nodes": [0], "atomic_bsz": 1.5, "accum_steps": 0}}},
                {"allocations": {"a": {"nodes": [True], "atomic_bsz": 1, "accum_steps": 0}}}):
        with pytest.raises(PeerError):
            allocations_of(bad)


# ---------------------------------------------------------------------------- environment absent
def test_missing_environment_is_peer_unavailable_with_the_make_target(tmp_path):
    nowhere = tmp_path / "no-venv" / "bin" / "python"
    ok, why = pollux_available(nowhere)
    assert not ok and "make pollux-env" in why and str(nowhere) in why
    pol = PolluxAllocator(nowhere)
    assert isinstance(pol, Allocator) and pol.name == "pollux" and pol.clairvoyant is False
    with pytest.raises(PeerUnavailable, match="make pollux-env"):
        pol.allocate([_job()], NODES2, 0.0)
    assert not pol.running


def test_default_python_follows_the_environment_variable(monkeypatch, tmp_path):
    monkeypatch.delenv(peer.PYTHON_ENV, raising=False)
    assert peer.default_python() == ROOT / ".venv-pollux" / "bin" / "python"
    monkeypatch.setenv(peer.PYTHON_ENV, str(tmp_path / "py"))
    assert peer.default_python() == tmp_path / "py"
    assert PolluxAllocator().python == tmp_path / "py"


def test_an_interpreter_without_the_release_is_peer_unavailable():
    """rlsched's own python (numpy 2, no adaptdl) runs the real bridge: it cannot import
    the packages and says so."""
    ok, why = pollux_available(sys.executable)
    assert not ok and "make pollux-env" in why
    with PolluxAllocator(sys.executable) as pol, pytest.raises(PeerUnavailable, match="do not import.*make pollux-env"):
        pol.allocate([_job()], NODES2, 0.0)


def test_cluster_mode_is_checked():
    with pytest.raises(ValueError, match="cluster must be one of"):
        PolluxAllocator(cluster="elastic")


# ---------------------------------------------------------------------------- protocol stubs
def _protocol_stub(tmp_path: Path, body: str, *, hello: bool = True) -> Path:
    """An executable that ignores its arguments and speaks the bridge's protocol as
    ``body`` says, after the bridge's greeting unless ``hello`` is false (a test double
    of the protocol, not of Pollux)."""
    path = tmp_path / "protocol_stub"
    path.write_text(f"#!{sys.executable}\nimport json, sys, time\n" + (HELLO if hello else "") + textwrap.dedent(body))
    path.chmod(0o755)
    return path


HELLO = 'print(json.dumps({"ready": True, "protocol": 1, "versions": {}}), flush=True)\n'


def test_protocol_stub_error_replies_raise_peer_error_and_the_bridge_keeps_serving(tmp_path):
    stub = _protocol_stub(tmp_path, """
        for line in sys.stdin:
            print(json.dumps({"error": "bad request: job a: missing 'age'"}), flush=True)
    """)
    with PolluxAllocator(stub) as pol:
        for _ in range(2):
            with pytest.raises(PeerError, match="missing 'age'"):
                pol.allocate([_job()], NODES2, 0.0)
            assert pol.running
        proc = pol._proc
    assert proc.poll() is not None and not pol.running  # closed with the block


def test_protocol_stub_that_dies_raises_peer_error_with_its_stderr(tmp_path):
    stub = _protocol_stub(tmp_path, """
        sys.stdin.readline()
        print("Traceback: the policy exploded", file=sys.stderr, flush=True)
        sys.exit(3)
    """)
    pol = PolluxAllocator(stub)
    with pytest.raises(PeerError, match=r"exited \(exit code 3\).*the policy exploded"):
        pol.allocate([_job()], NODES2, 0.0)
    assert not pol.running


def test_protocol_stub_that_fails_to_start_is_peer_unavailable(tmp_path):
    stub = _protocol_stub(tmp_path, """
        print(json.dumps({"error": "the Pollux packages do not import (No module named 'pymoo')"}), flush=True)
        sys.exit(2)
    """, hello=False)
    with pytest.raises(PeerUnavailable, match="No module named 'pymoo'"):
        PolluxAllocator(stub).allocate([_job()], NODES2, 0.0)


def test_protocol_stub_that_hangs_hits_the_timeout(tmp_path):
    stub = _protocol_stub(tmp_path, "time.sleep(60)\n")
    pol = PolluxAllocator(stub, timeout=0.5)
    with pytest.raises(PeerError, match="gave no reply within 0.5 s"):
        pol.allocate([_job()], NODES2, 0.0)
    assert not pol.running


def test_protocol_stub_allocation_is_checked_against_the_cluster(tmp_path):
    stub = _protocol_stub(tmp_path, """
        for line in sys.stdin:
            print(json.dumps({"allocations": {"a": {"nodes": [0, 0, 0, 0, 0], "atomic_bsz": 32, "accum_steps": 0}}}),
                  flush=True)
    """)
    with PolluxAllocator(stub) as pol, pytest.raises(AllocationError, match="node 0: 5 GPUs allocated"):
        pol.allocate([_job()], NODES2, 0.0)


def test_collecting_the_allocator_ends_its_bridge(tmp_path):
    import gc

    stub = _protocol_stub(tmp_path, "for line in sys.stdin: pass\n")
    pol = PolluxAllocator(stub)
    pol.start()
    proc = pol._proc
    del pol
    gc.collect()
    assert proc.poll() is not None


# ---------------------------------------------------------------------------- the bridge's own code
def _bridge_module():
    spec = importlib.util.spec_from_file_location("pollux_bridge_under_test", BRIDGE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # top level imports the standard library only
    return mod


def test_bridge_imports_nothing_of_rlsched():
    """It runs in another environment (numpy<1.24): rlsched must not be imported there."""
    for path in (ROOT / "tools" / "pollux").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not [n for n in names if n.split(".")[0] == "rlsched"], f"{path.name} imports {names}"


def test_bridge_batch_split_follows_the_accumulation_rule():
    b = _bridge_module()
    cifar = {"id": "c", "init_batch_size": 128, "max_batch_size": 4096, "min_local_bsz": 32, "max_local_bsz": 1024}
    ncf = {"id": "n", "init_batch_size": 256, "max_batch_size": 32768, "min_local_bsz": 32, "max_local_bsz": 32768}
    # one GPU above the initial batch: at least one accumulation step
    assert b.split_batch(32768, 1, ncf) == (16384, 1)
    assert b.split_batch(128, 1, cifar) == (128, 0)
    # 4096 over 3 GPUs: 1366 per GPU > 1024, so two micro-batches of 683
    assert b.split_batch(4096, 3, cifar) == (683, 1)
    # capped so the total stays within max_batch_size: 3 × 683 × 2 = 4098 > 4096
    assert b.cap_batch(683, 1, 3, cifar) == (682, 1)
    with pytest.raises(b.BadRequest, match="exceed max_batch_size"):
        b.cap_batch(32, 0, 5000, cifar)


def test_bridge_parses_and_refuses_requests():
    b = _bridge_module()
    req = request_of([_job(allocation=(1,), profile=GOOD_PROFILE + (ProfileSample(1, 1, 128, 0.5, 0.0),))],
                     NODES2, 60.0)
    resource, nodes, (job,) = b.parse_request(json.loads(json.dumps(req)))
    assert resource == RESOURCE_GPU and nodes == {0: 4, 1: 4}
    assert job["allocation"] == [1] and len(job["profile"]) == 4
    assert job["profile"][(1, 1, 128)] == (0.100, 0.0)  # a repeated configuration keeps its first sample
    bad = json.loads(json.dumps(req))
    bad["jobs"][0]["allocation"] = [7]
    with pytest.raises(b.BadRequest, match=r"allocation on unknown nodes \[7\]"):
        b.parse_request(bad)
    bad = json.loads(json.dumps(req))
    bad["jobs"][0]["profile"][0] = [1, 1, 128, 0.1, 0.2]
    with pytest.raises(b.BadRequest, match="need 0 <= sync_time < step_time"):
        b.parse_request(bad)
    with pytest.raises(b.BadRequest, match="duplicate job ids"):
        b.parse_request({"resource": RESOURCE_GPU, "nodes": req["nodes"], "jobs": [req["jobs"][0], req["jobs"][0]]})
    with pytest.raises(b.BadRequest, match="'resource' must name the GPU resource"):
        b.parse_request({"nodes": req["nodes"], "jobs": []})


# ---------------------------------------------------------------------------- the real Pollux
_AVAILABLE = pollux_available()
real = pytest.mark.skipif(not _AVAILABLE[0], reason=f"Pollux environment absent: {_AVAILABLE[1]}")


@pytest.fixture(scope="module")
def pollux():
    with PolluxAllocator(seed=0, timeout=300) as pol:
        yield pol


def _within_bounds(job: AllocJob, a: Allocation) -> None:
    lim = job.bounds
    assert lim.min_local_batch <= a.atomic_bsz <= lim.largest_local, (job.id, a)
    assert lim.init_batch <= a.batch_size <= lim.largest, (job.id, a)


@real
def test_pollux_two_jobs_on_two_nodes(pollux):
    """Two jobs on 2 nodes × 4 GPUs: a running job that profiled 1, 2 and 4 GPUs and
    scales well, and a new one with no measurement. Valid allocations (the client
    checks them), batch sizes within the applications' bounds, and the job that
    profiled well gets more than one GPU."""
    good = _job("good", allocation=(0, 0, 0, 0), profile=GOOD_PROFILE, grad=(0.01, 1.0))
    new = _job("new", application="bert", bounds=BERT, submit=100.0, age=500.0)
    out = pollux.allocate([good, new], NODES2, 600.0)
    assert pollux.versions["adaptdl-sched"] == "0.2.11" and pollux.versions["numpy"].startswith("1.23")
    assert set(out) <= {"good", "new"}
    assert out["good"].replicas > 1
    _within_bounds(good, out["good"])
    if "new" in out:  # no measurement yet: at most 1 GPU (2 × 0 profiled), batch max(init, min local × replicas)
        assert out["new"].replicas == 1 and out["new"].batch_size == 12
    assert sum(a.replicas for a in out.values()) <= 8


@real
def test_pollux_pins_ncf_and_keeps_serving_after_a_bad_request(pollux):
    reply = pollux.request({"now": 0, "resource": RESOURCE_GPU, "nodes": "two", "jobs": []})
    assert reply == {"error": "bad request: 'nodes' must be a list"}
    ncf = _job("ncf", application="ncf", bounds=NCF, allocation=(1,),
               profile=(ProfileSample(1, 1, 16384, 0.4, 0.0),), grad=(0.01, 1.0))
    good = _job("good", allocation=(0, 0), profile=GOOD_PROFILE, grad=(0.01, 1.0))
    out = pollux.allocate([ncf, good], NODES2, 660.0)
    assert pollux.running
    if "ncf" in out:
        assert out["ncf"].replicas == 1 and (out["ncf"].atomic_bsz, out["ncf"].accum_steps) == (16384, 1)
    assert out["good"].replicas > 1
    _within_bounds(good, out["good"])


@real
def test_pollux_as_the_released_allocator_calls_it():
    """cluster="autoscale": the node template is a real node; the reply is still a valid
    allocation of the real nodes."""
    good = _job("good", allocation=(0,), profile=GOOD_PROFILE, grad=(0.01, 1.0))
    with PolluxAllocator(seed=1, cluster="autoscale", timeout=300) as pol:
        out = pol.allocate([good], NODES2, 60.0)
        assert pol.last_info["desired_nodes"] >= 1
    assert set(out) <= {"good"}
    if out:
        _within_bounds(good, out["good"])
