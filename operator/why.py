"""``rlsched why JOB``: where a TrainingJob stands and why it is not running.

It reads what the operator wrote — ``status.waiting`` (place in the service order,
reason, the cycle's numbers), the phase, service and team queues and conditions — and the job's latest
Events, and prints them; it decides nothing itself."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

__all__ = ["explain", "run_why"]

#: Events shown, newest last
EVENTS_SHOWN = 5


def explain(body: Mapping[str, Any], events: Sequence[Mapping[str, Any]] = ()) -> str:
    """The text ``rlsched why`` prints for the TrainingJob ``body`` (a dict as the API
    serves it) and its Events (dicts with ``reason``, ``message``, ``time``)."""
    md, spec, st = body.get("metadata") or {}, body.get("spec") or {}, body.get("status") or {}
    name = f"{md.get('namespace', '')}/{md.get('name', '')}"
    phase = st.get("phase") or "(not seen by the operator yet)"
    lines = [f"{name}: {phase}"]
    gang = f"{spec.get('minWorkers')}..{spec.get('maxWorkers')} workers x {spec.get('gpusPerWorker', 1)} GPUs"
    lines.append(f"  asks      {gang}, class {((spec.get('priority') or {}).get('class')) or 'normal'}"
                 + (", suspended" if spec.get("suspend") else ""))
    team = st.get("queueName") or spec.get("queueName")
    if team:
        lines.append(f"  team      queue {team} (kubectl get trainingqueue {team})")
    w = st.get("waiting")
    if phase in ("Starting", "Running"):
        lines.append(f"  running   {st.get('workers', 0)} of {st.get('targetWorkers', '?')} workers"
                     + (f", global batch {st['batchSize']}" if st.get("batchSize") else ""))
    elif isinstance(w, Mapping) and phase == "Queued":
        pos = w.get("position")
        where = f"position {pos} in the service order" if pos else "no place in the service order"
        lines.append(f"  waiting   {where}, queue {st.get('queue') or '-'}")
        lines.append(f"  why       {w.get('reason')}: {w.get('message')}")
    elif phase == "Queued":
        lines.append("  waiting   (no reason recorded yet: the operator writes it at its next cycle)")
    if st.get("reason"):
        lines.append(f"  ended     {st['reason']}: {st.get('message', '')}")
    for c in st.get("conditions") or []:
        if c.get("status") != "True" or c.get("type") in ("Suspended", "Restarting", "Failed"):
            lines.append(f"  condition {c.get('type')}={c.get('status')} {c.get('reason', '')}: {c.get('message', '')}")
    evs = sorted(events, key=lambda e: e.get("time") or 0)[-EVENTS_SHOWN:]
    if evs:
        lines.append("  events")
        lines += [f"    {e.get('reason')}: {e.get('message')}" for e in evs]
    return "\n".join(lines)


def run_why(job: str, namespace: str | None, kubeconfig: str | None) -> int:
    """Read the job and its Events and print :func:`explain`; 1 when it is not found."""
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    from rlsched.core.contract import ANNOTATION_EVENT_TIME, GROUP, KIND, PLURAL, VERSION

    config.load_kube_config(config_file=kubeconfig)
    if namespace is None:
        _, ctx = config.list_kube_config_contexts(config_file=kubeconfig)
        namespace = (ctx.get("context") or {}).get("namespace") or "default"
    api = client.ApiClient()
    try:
        body = client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job)
        evs = client.CoreV1Api(api).list_namespaced_event(namespace, field_selector=f"involvedObject.name={job}").items
    except ApiException as exc:
        if exc.status == 404:
            print(f"rlsched why: no TrainingJob {namespace}/{job}")
            return 1
        raise
    finally:
        api.close()
    events = [{"reason": e.reason, "message": e.message,
               "time": float((e.metadata.annotations or {}).get(ANNOTATION_EVENT_TIME) or 0.0)}
              for e in evs if e.involved_object.kind == KIND]
    print(explain(body, events))
    return 0
