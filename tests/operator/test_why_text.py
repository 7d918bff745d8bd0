"""``rlsched why``'s text from what the operator wrote (operator/why.py)."""

from rlsched.operator.why import EVENTS_SHOWN, explain


def body(**status):
    return {"metadata": {"name": "j", "namespace": "ns"},
            "spec": {"minWorkers": 2, "maxWorkers": 4, "gpusPerWorker": 8, "priority": {"class": "urgent"}},
            "status": status}


def test_a_waiting_job_shows_its_place_and_reason():
    text = explain(body(phase="Queued", queue="normal",
                        waiting={"position": 3, "reason": "BehindHead", "message": "behind ns/a"}))
    assert text.splitlines()[0] == "ns/j: Queued"
    assert "2..4 workers x 8 GPUs, class urgent" in text
    assert "position 3 in the service order, queue normal" in text and "BehindHead: behind ns/a" in text


def test_running_unfittable_unknown_and_events():
    assert "running   2 of 3 workers, global batch 512" in explain(
        body(phase="Running", workers=2, targetWorkers=3, batchSize=512))
    assert "no place in the service order" in explain(
        body(phase="Queued", waiting={"position": 0, "reason": "Unfittable", "message": "40 > 32"}))
    assert "no reason recorded yet" in explain(body(phase="Queued"))
    assert "(not seen by the operator yet)" in explain(body())
    evs = [{"reason": f"R{i}", "message": "m", "time": float(i)} for i in range(EVENTS_SHOWN + 3)]
    text = explain(body(phase="Queued"), evs[::-1])
    shown = [ln.strip().split(":")[0] for ln in text.splitlines() if ln.startswith("    ")]
    assert shown == [f"R{i}" for i in range(3, EVENTS_SHOWN + 3)]  # the newest, oldest first
