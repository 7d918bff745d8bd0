"""Guarded priorities (issue 26, item 2), against the real control plane with the
priority-guard ValidatingAdmissionPolicy the chart ships
(``deploy/helm/rlsched/files/policies/priority-guard.yaml``, installed here).

Before the policy anyone who may create a TrainingJob could give it class ``highest``
(the only class that preempts) or raise its priority with the
``rlsched.dev/priority-requests`` annotation. Now either needs the RBAC verb
``raise-priority`` on the job's TrainingQueue (by name), asked of the API server's
authorizer with the requesting user's own identity: here a ServiceAccount ``alice``
with a real token, allowed by RBAC to create and update TrainingJobs of its namespace.
"""

from __future__ import annotations

import contextlib
import json

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rlsched.core.contract import ANNOTATION_PRIORITY_REQUESTS as REQUESTS
from rlsched.core.contract import API_VERSION, KIND, QUEUE_PLURAL, VERB_RAISE_PRIORITY
from rlsched.core.contract import GROUP as G
from rlsched.core.contract import PLURAL as P
from rlsched.core.contract import VERSION as V

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(300)]

USER = "alice"
MERGE = "application/merge-patch+json"


@pytest.fixture(scope="module")
def guard(kapi, crd):
    """The priority-guard policy and its binding, installed (idempotent: create or
    replace) for this module and removed after it, so no other module runs under it."""
    from rlsched.operator.main import install_trainer_policy, priority_policy_path

    done = [d.split("/", 1) for d in install_trainer_policy(kapi.client, priority_policy_path())]
    assert [k for k, _ in done] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    api = client.AdmissionregistrationV1Api(kapi.client)
    # the API server type-checked every expression against the CRD's schema
    status = api.read_validating_admission_policy(done[0][1]).status
    assert not (status.type_checking and status.type_checking.expression_warnings), status.type_checking
    yield done
    for kind, name in reversed(done):
        delete = (api.delete_validating_admission_policy_binding if kind.endswith("Binding")
                  else api.delete_validating_admission_policy)
        with contextlib.suppress(ApiException):
            delete(name)


def _body(name: str, klass: str = "normal", queue: str | None = None, requests: str | None = None) -> dict:
    spec = {"minWorkers": 1, "maxWorkers": 1, "gpusPerWorker": 1, "priority": {"class": klass, "value": 0},
            "template": {"spec": {"containers": [{"name": "train", "image": "registry.example/rlsched/trainer:test"}]}}}
    if queue is not None:
        spec["queueName"] = queue
    meta = {"name": name}
    if requests is not None:
        meta["annotations"] = {REQUESTS: requests}
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": spec}


@pytest.fixture
def alice(kapi, ns, guard, wait_until):
    """``CustomObjectsApi`` of the ServiceAccount ``alice`` of ``ns`` (a real token),
    whose Role allows create/get/update/patch/delete of trainingjobs there and nothing
    on trainingqueues; returned once the policy is in force for it."""
    rbac = kapi.rbac
    kapi.core.create_namespaced_service_account(ns, {"metadata": {"name": USER}})
    rbac.create_namespaced_role(ns, {
        "metadata": {"name": "trainingjob-editor"},
        "rules": [{"apiGroups": [G], "resources": [P], "verbs": ["create", "get", "update", "patch", "delete"]}]})
    rbac.create_namespaced_role_binding(ns, {
        "metadata": {"name": "alice-trainingjob-editor"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "trainingjob-editor"},
        "subjects": [{"kind": "ServiceAccount", "name": USER, "namespace": ns}]})
    api = kapi.token_client(ns, USER)  # alice's real token
    custom = client.CustomObjectsApi(api)

    def in_force():
        """A dry run of a highest job is denied by the policy (not by RBAC, which lets
        alice create jobs): the admission plugin has loaded it, and RBAC alice's Role."""
        try:
            custom.create_namespaced_custom_object(G, V, ns, P, _body("probe", "highest", "team-a"), dry_run="All")
        except ApiException as exc:
            return exc.status == 403 and VERB_RAISE_PRIORITY in _message(exc)
        return False

    wait_until(in_force, 30, "the priority-guard policy in force for alice")
    yield custom
    api.close()


@pytest.fixture
def grant(kapi, ns):
    """``grant(*queues)`` binds alice a ClusterRole with verb raise-priority on those
    trainingqueues (all of them when none is named); removed after the test."""
    made = []

    def _grant(*queues: str) -> None:
        name = f"{ns}-raise-priority-{len(made)}"
        rule = {"apiGroups": [G], "resources": [QUEUE_PLURAL], "verbs": [VERB_RAISE_PRIORITY]}
        if queues:
            rule["resourceNames"] = list(queues)
        kapi.rbac.create_cluster_role({"metadata": {"name": name}, "rules": [rule]})
        made.append(name)
        kapi.rbac.create_cluster_role_binding({
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": USER, "namespace": ns}]})

    yield _grant
    for name in made:
        with contextlib.suppress(ApiException):
            kapi.rbac.delete_cluster_role_binding(name)
        with contextlib.suppress(ApiException):
            kapi.rbac.delete_cluster_role(name)


def _message(exc: ApiException) -> str:
    try:
        return json.loads(exc.body).get("message", "")
    except (TypeError, ValueError):
        return str(exc.body)


def _create(custom, ns, body, dry_run=None):
    return custom.create_namespaced_custom_object(G, V, ns, P, body, dry_run=dry_run)


def _patch(custom, ns, name, patch, dry_run=None):
    return custom.patch_namespaced_custom_object(G, V, ns, P, name, patch, dry_run=dry_run, _content_type=MERGE)


def _denied(fn, *args, **kw) -> str:
    """The message of the 403 the policy answers ``fn(*args)`` with."""
    with pytest.raises(ApiException) as exc:
        fn(*args, **kw)
    assert exc.value.status == 403, (exc.value.status, exc.value.body)
    msg = _message(exc.value)
    assert "ValidatingAdmissionPolicy" in msg and "priority-guard" in msg, msg
    return msg


def _exists(kapi, ns, name) -> bool:
    try:
        kapi.get(ns, name)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def test_without_raise_priority_only_normal_and_urgent_jobs(kapi, ns, alice):
    # (1) what every user may do: normal and urgent jobs, with or without a queue; the
    # request counter at "0" asks for nothing
    _create(alice, ns, _body("plain"))
    _create(alice, ns, _body("urgent", "urgent", "team-a"))
    _create(alice, ns, _body("zero", queue="team-a", requests="0"))
    assert all(_exists(kapi, ns, n) for n in ("plain", "urgent", "zero"))

    # (2) class highest in queue team-a: 403, the message names the queue, the verb, the
    # user and the ClusterRole to ask for
    msg = _denied(_create, alice, ns, _body("boss", "highest", "team-a"))
    assert "spec.priority.class: highest" in msg and "needs the RBAC verb raise-priority" in msg, msg
    assert "TrainingQueue team-a" in msg and "resourceNames: [team-a]" in msg, msg
    assert f"system:serviceaccount:{ns}:{USER}" in msg and "ClusterRoleBinding" in msg, msg
    assert not _exists(kapi, ns, "boss")
    # without a queue: the verb on all queues
    msg = _denied(_create, alice, ns, _body("boss", "highest"))
    assert "all trainingqueues.rlsched.dev" in msg and "resourceNames" not in msg, msg

    # (3) the priority-request annotation: 403 as well, on create ...
    msg = _denied(_create, alice, ns, _body("eager", queue="team-a", requests="5"))
    assert f'annotation {REQUESTS}: "5"' in msg and "TrainingQueue team-a" in msg, msg
    assert not _exists(kapi, ns, "eager")
    # ... and on update: raising it, adding it, and on a class raised to highest
    msg = _denied(_patch, alice, ns, "zero", {"metadata": {"annotations": {REQUESTS: "10"}}})
    assert f'annotation {REQUESTS}: "10"' in msg, msg
    _denied(_patch, alice, ns, "plain", {"metadata": {"annotations": {REQUESTS: "1"}}})
    msg = _denied(_patch, alice, ns, "urgent", {"spec": {"priority": {"class": "highest"}}})
    assert "spec.priority.class: highest" in msg and "TrainingQueue team-a" in msg, msg
    assert kapi.get(ns, "urgent")["spec"]["priority"]["class"] == "urgent"
    assert REQUESTS not in (kapi.get(ns, "plain")["metadata"].get("annotations") or {})

    # updates that raise nothing pass: other annotations, labels, the value inside the
    # class, the queue of a normal job
    _patch(alice, ns, "zero", {"metadata": {"labels": {"team": "a"}, "annotations": {"note": "x"}},
                               "spec": {"priority": {"value": 3}, "queueName": "team-b"}})
    assert kapi.get(ns, "zero")["spec"]["queueName"] == "team-b"

    # a job the admin made highest (or annotated): alice's unrelated edits pass, since the
    # class and the counter stay as they are; moving it to another queue does not
    _create(kapi.custom, ns, _body("vip", "highest", "team-a", requests="7"))
    _patch(alice, ns, "vip", {"metadata": {"labels": {"edited-by": USER}}, "spec": {"priority": {"value": 1}}})
    msg = _denied(_patch, alice, ns, "vip", {"spec": {"queueName": "team-b"}})
    assert "spec.priority.class: highest" in msg and f"annotation {REQUESTS}" in msg, msg
    assert "TrainingQueue team-b" in msg, msg
    # nor does withdrawing the requests (any change of the counter needs the verb)
    _denied(_patch, alice, ns, "vip", {"metadata": {"annotations": {REQUESTS: None}}})
    vip = kapi.get(ns, "vip")
    assert (vip["spec"]["queueName"], vip["metadata"]["annotations"][REQUESTS]) == ("team-a", "7")

    # the status subresource is not matched (the admin writes it; alice may not by RBAC)
    kapi.custom.patch_namespaced_custom_object_status(G, V, ns, P, "plain", {"status": {"message": "x"}})


def _allowed(api, ns, body) -> bool:
    """Whether the API server would let ``api`` create ``body`` now (a server-side dry
    run; RBAC grants reach the authorizer after a moment)."""
    try:
        _create(api, ns, body, dry_run="All")
    except ApiException as exc:
        if exc.status == 403:
            return False
        raise
    return True


def test_raise_priority_on_one_queue_allows_that_queue_only(kapi, ns, alice, grant, wait_until):
    # (4) alice gets verb raise-priority on the TrainingQueue team-a (which need not exist)
    grant("team-a")
    wait_until(lambda: _allowed(alice, ns, _body("boss", "highest", "team-a")), 30,
               "RBAC to let alice raise-priority team-a")
    _create(alice, ns, _body("boss", "highest", "team-a"))
    assert kapi.get(ns, "boss")["spec"]["priority"]["class"] == "highest"
    _create(alice, ns, _body("eager", queue="team-a", requests="5"))

    # team-b and "all queues" are still out of reach
    msg = _denied(_create, alice, ns, _body("boss-b", "highest", "team-b"))
    assert "TrainingQueue team-b" in msg and "resourceNames: [team-b]" in msg, msg
    _denied(_create, alice, ns, _body("boss-any", "highest"))
    _denied(_create, alice, ns, _body("eager-b", queue="team-b", requests="5"))

    # updates: raising a normal team-b job's counter or class is denied; in team-a allowed
    _create(alice, ns, _body("job-b", queue="team-b"))
    msg = _denied(_patch, alice, ns, "job-b", {"metadata": {"annotations": {REQUESTS: "3"}}})
    assert f'annotation {REQUESTS}: "3"' in msg and "TrainingQueue team-b" in msg, msg
    _denied(_patch, alice, ns, "job-b", {"spec": {"priority": {"class": "highest"}}})
    assert REQUESTS not in (kapi.get(ns, "job-b")["metadata"].get("annotations") or {})
    _patch(alice, ns, "eager", {"metadata": {"annotations": {REQUESTS: "9"}}})
    _patch(alice, ns, "job-b", {"spec": {"queueName": "team-a"}})
    _patch(alice, ns, "job-b", {"spec": {"priority": {"class": "highest"}}})
    assert kapi.get(ns, "job-b")["spec"]["priority"]["class"] == "highest"
    # a highest job cannot be moved out of the queue alice may raise-priority
    _denied(_patch, alice, ns, "boss", {"spec": {"queueName": "team-b"}})
    # nor can one with requests (other than "0")
    _denied(_patch, alice, ns, "eager", {"spec": {"queueName": "team-b"}})
    assert kapi.get(ns, "eager")["spec"]["queueName"] == "team-a"


def test_raise_priority_on_all_queues_covers_jobs_without_a_queue(kapi, ns, alice, grant, wait_until):
    grant()
    wait_until(lambda: _allowed(alice, ns, _body("boss", "highest")), 30,
               "RBAC to let alice raise-priority every queue")
    _create(alice, ns, _body("boss", "highest"))
    _create(alice, ns, _body("boss-b", "highest", "team-b", requests="4"))
    assert _exists(kapi, ns, "boss") and _exists(kapi, ns, "boss-b")


def test_admin_is_allowed_everything(kapi, ns, guard):
    # (5) the admin has every verb, raise-priority on every queue included
    for name, queue in (("a-highest", "team-a"), ("b-highest", "team-b"), ("no-queue", None)):
        _create(kapi.custom, ns, _body(name, "highest", queue, requests="20"))
    _create(kapi.custom, ns, _body("normal", queue="team-b"))
    _patch(kapi.custom, ns, "normal", {"metadata": {"annotations": {REQUESTS: "30"}},
                                       "spec": {"priority": {"class": "highest"}, "queueName": "team-c"}})
    got = kapi.get(ns, "normal")
    assert (got["spec"]["priority"]["class"], got["metadata"]["annotations"][REQUESTS]) == ("highest", "30")
