"""The operator serving the goodput allocator (``--allocator goodput``) on a real API
server, kube-scheduler and kwok nodes, with the fake trainer reporting step times and
gradient statistics from the measured cifar10 profile: a job starts on several workers
in one decision at the batch the allocator chose (in its pods' worker contract), its
reports become the goodput record the allocator reads, and a second job is started by
shrinking the first (shrink-to-admit), each change a new generation."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRACES = Path(os.environ.get("RLSCHED_DATA_DIR") or REPO.parent / "shared" / "data") / "pollux-osdi21" / "traces"

pytestmark = [pytest.mark.k8s,
              pytest.mark.skipif(not TRACES.is_dir(), reason=f"measured profiles not found at {TRACES} (../shared/data)")]


def _batch_env(pod) -> int | None:
    env = {e.name: e.value for c in pod.spec.containers for e in (c.env or [])}
    v = env.get("RLSCHED_GLOBAL_BATCH_SIZE")
    return int(v) if v else None


def test_goodput_allocator_starts_wide_models_reports_and_shrinks_to_admit(extender, fake_trainer, kapi, ns, tj,
                                                                          run_operator, wait_until):
    from rlsched.sim.measured import load_applications

    app = load_applications(TRACES, ("cifar10",))["cifar10"]
    lim = app.bounds
    batch = dict(batchSize=lim.init_batch, maxBatchSize=lim.largest,
                 localBatchSize={"max": lim.largest_local})
    with fake_trainer(ns, application=app, epoch_s=0.5) as th:
        # a short restart delay: the test lives seconds, not the hours the 30 s default weighs against
        with run_operator(ns, allocator="goodput@restart_delay=1"):
            tj(ns, "first", 1, 32, **batch)
            th.start()
            wait_until(lambda: kapi.phase(ns, "first") == "Running", 90, "first running")
            st = kapi.status(ns, "first")
            w0, b0 = st["targetWorkers"], st.get("batchSize")
            assert w0 >= 2, st  # several workers in one decision, never grown one at a time
            assert b0 is not None and lim.init_batch <= b0 <= lim.largest
            pods = kapi.pods(ns, "first")
            assert {_batch_env(p) for p in pods} == {b0} and len(pods) == w0
            # its reports become the record the allocator reads: the shape it runs on
            wait_until(lambda: (kapi.status(ns, "first").get("goodput") or {}).get("shapes"), 60, "goodput record")
            shapes = kapi.status(ns, "first")["goodput"]["shapes"]
            assert any(s[0] >= 2 and s[4] > 0 for s in shapes), shapes
            assert "gradSqr" in kapi.status(ns, "first")["goodput"]

            # the cluster (32 GPUs) cannot hold both at these sizes unless the first shrinks
            held = kapi.status(ns, "first")["targetWorkers"]
            tj(ns, "second", 32 - held + 1, 32, **batch)
            wait_until(lambda: kapi.phase(ns, "second") == "Running", 120, "second running")
            a, b = kapi.status(ns, "first"), kapi.status(ns, "second")
            assert a["targetWorkers"] < held and a["targetWorkers"] + b["targetWorkers"] <= 32, (a, b)
            assert a["phase"] == "Running" and a["restartGeneration"] >= 1
            downs = [e.message for e in kapi.events(ns, "first", "ScaledDown")]
            assert downs and f"workers {held} -> " in " ".join(downs), downs
            assert a["attainedGpuSeconds"] > 0
            pods = kapi.pods(ns, "second")
            assert {_batch_env(p) for p in pods} == {b.get("batchSize")}
