"""Builders shared by the operator's tests (as fixtures: tests import no helper module)."""

from __future__ import annotations

import contextlib
import time
import uuid

import pytest

from rlsched.core.contract import (ANNOTATION_EVENT_TIME, API_VERSION, FINALIZER_WORKER_EXIT, GROUP, KIND, LABEL_JOB,
                                   PLURAL, QUEUE_PLURAL, VERSION)


# ------------------------------------------------------------------ control-plane fixtures


@pytest.fixture(scope="module")
def kapi(kube_cluster):
    """Admin ``kubernetes`` API clients: ``kapi.core``, ``kapi.custom``, ``kapi.client``;
    and the reads every test makes of a TrainingJob: ``kapi.get(ns, name)``,
    ``kapi.status`` (``{}`` once it is gone), ``kapi.phase``, ``kapi.condition(ns, name,
    type)``, ``kapi.events(ns, name, reason=None)`` in the order they were posted, and
    ``kapi.pods(ns, job=None, terminating=False)``: the worker pods of one job (or of
    every job), those being deleted left out unless ``terminating``; and
    ``kapi.token_client(ns, account)``: a client holding a ServiceAccount's real token."""
    from types import SimpleNamespace

    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = kube_cluster.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)

    def get(ns, name):
        return custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)

    def status(ns, name):
        try:
            return get(ns, name).get("status") or {}
        except ApiException as exc:
            if exc.status == 404:
                return {}
            raise

    def condition(ns, name, ctype):
        return next((c for c in status(ns, name).get("conditions") or [] if c["type"] == ctype), None)

    def events(ns, name, reason=None):
        evs = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
        evs = [e for e in evs if reason is None or e.reason == reason]
        return sorted(evs, key=lambda e: float((e.metadata.annotations or {}).get(ANNOTATION_EVENT_TIME, "0")))

    def token_client(ns, account):
        """An API client holding a real token of the ServiceAccount ``account`` of
        ``ns`` (TokenRequest, 10 minutes), as a user or a pod would hold it."""
        tok = core.create_namespaced_service_account_token(
            account, ns, {"spec": {"audiences": [], "expirationSeconds": 600}}).status.token
        conf = client.Configuration()
        adm = api.configuration
        conf.host, conf.ssl_ca_cert, conf.verify_ssl = adm.host, adm.ssl_ca_cert, adm.verify_ssl
        conf.api_key = {"authorization": f"Bearer {tok}"}
        return client.ApiClient(conf)

    def pods(ns, job=None, terminating=False):
        sel = f"{LABEL_JOB}={job}" if job else LABEL_JOB
        items = core.list_namespaced_pod(ns, label_selector=sel).items
        return items if terminating else [p for p in items if p.metadata.deletion_timestamp is None]

    yield SimpleNamespace(client=api, core=core, custom=custom,
                          ext=client.ApiextensionsV1Api(api), rbac=client.RbacAuthorizationV1Api(api),
                          get=get, status=status, phase=lambda ns, name: status(ns, name).get("phase"),
                          condition=condition, events=events, pods=pods, token_client=token_client)
    api.close()


@pytest.fixture(scope="module")
def crd(kapi):
    """Install the TrainingJob and TrainingQueue CRDs (idempotent) and wait until it is Established; and the
    trainer-status admission policy the chart installs beside it."""
    import yaml

    from rlsched.operator.main import crd_path, install_crd, install_trainer_policy, queue_crd_path

    install_crd(kapi.client)
    install_crd(kapi.client, queue_crd_path())
    install_trainer_policy(kapi.client)
    _wait_for_crd_storage(kapi)
    return yaml.safe_load(crd_path().read_text())


def _wait_for_crd_storage(kapi, timeout_s: float = 60.0) -> None:
    """Until both custom resources answer a list: an Established CRD's storage may still
    be (re)initializing (429) or not yet served (404) for a moment, longer under load."""
    from kubernetes.client.exceptions import ApiException

    deadline = time.monotonic() + timeout_s
    for plural in (PLURAL, QUEUE_PLURAL):
        while True:
            try:
                kapi.custom.list_cluster_custom_object(GROUP, VERSION, plural, limit=1)
                break
            except ApiException as exc:
                if exc.status not in (404, 429, 503) or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


@pytest.fixture
def ns(kapi, crd, wait_until):
    """A fresh namespace; waits first until no worker pod of an earlier test holds GPUs."""
    from kubernetes import client

    wait_until(lambda: not kapi.core.list_pod_for_all_namespaces(label_selector=LABEL_JOB).items,
               60, "GPUs of earlier tests to be released")
    name = f"op-{uuid.uuid4().hex[:8]}"
    kapi.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    # shown by pytest only when the test failed
    for p in kapi.core.list_namespaced_pod(name).items:
        print("pod", p.metadata.name, p.status.phase, p.spec.node_name, p.metadata.deletion_timestamp)
    for e in kapi.core.list_namespaced_event(name).items:
        print("event", e.involved_object.kind, e.involved_object.name, e.reason, e.message)
    # delete jobs first so their pods go before the namespace does
    for tj in kapi.custom.list_namespaced_custom_object(GROUP, VERSION, name, PLURAL)["items"]:
        with contextlib.suppress(Exception):
            kapi.custom.delete_namespaced_custom_object(GROUP, VERSION, name, PLURAL,
                                                        tj["metadata"]["name"])
    kapi.core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    # the operator (stopped now) removes its finalizer once it has read a worker's exit;
    # let go of what it left, as an admin who uninstalled it would
    for p in kapi.core.list_namespaced_pod(name).items:
        if FINALIZER_WORKER_EXIT in (p.metadata.finalizers or []):
            with contextlib.suppress(Exception):
                kapi.core.patch_namespaced_pod(p.metadata.name, name, {"metadata": {"finalizers": [
                    f for f in p.metadata.finalizers if f != FINALIZER_WORKER_EXIT]}},
                    _content_type="application/merge-patch+json")
    kapi.core.delete_namespace(name)


@pytest.fixture
def run_operator(kube_cluster):
    """``with run_operator(ns, **config) as rt:`` runs the operator in-process (KopfRunner)."""
    from kopf.testing import KopfRunner

    from rlsched.operator.controller import OperatorConfig
    from rlsched.operator.handlers import OperatorRuntime, build_registry

    @contextlib.contextmanager
    def _run(namespace: str, **kw):
        defaults = dict(cycle_s=0.5, start_timeout_s=30.0, grace_period_s=1, metrics_port=0,
                        forecast_interval_s=0, patience=5)
        cfg = OperatorConfig(kubeconfig=str(kube_cluster.kubeconfig), namespace=namespace, **{**defaults, **kw})
        rt = OperatorRuntime(cfg)
        registry = build_registry(cfg, rt)
        with KopfRunner(["run", "--standalone", "--namespace", namespace], registry=registry, timeout=60) as runner:
            yield rt
        assert runner.exception is None, runner.exception

    return _run


@pytest.fixture
def fake_trainer(kube_cluster):
    """``with fake_trainer(ns, **kw) as th:`` the fake trainer of ``ns`` (FakeTrainer's
    keyword arguments, ``epoch_s`` 0.6 unless given) on a thread the test starts
    (``th.start()``); stopped, joined and closed on exit. ``th.trainer`` is the trainer."""
    import threading

    from rlsched_dev.fake_trainer import FakeTrainer

    @contextlib.contextmanager
    def _run(namespace: str, **kw):
        trainer = FakeTrainer(namespace, kubeconfig=str(kube_cluster.kubeconfig), **{"epoch_s": 0.6, **kw})
        stop = threading.Event()
        th = threading.Thread(target=trainer.run_until, args=(stop,), daemon=True)
        th.trainer = trainer
        try:
            yield th
        finally:
            stop.set()
            if th.is_alive():
                th.join(5)
            trainer.close()

    return _run


@pytest.fixture
def tj(kapi):
    """``tj(ns, name, min, max, gpus, klass="normal", value=0, **spec)`` creates a TrainingJob."""

    def _make(namespace, name, mn=1, mx=None, gpus=1, klass="normal", value=0, annotations=None, **spec):
        body = {
            "apiVersion": API_VERSION, "kind": KIND,
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {
                "minWorkers": mn, "maxWorkers": mn if mx is None else mx, "gpusPerWorker": gpus,
                "priority": {"class": klass, "value": value},
                "template": {"spec": {"containers": [{"name": "train", "image": "registry.example/rlsched/trainer:test"}]}},
                **spec,
            },
        }
        return kapi.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    return _make


@pytest.fixture(scope="module")
def extender(kube_cluster, tmp_path_factory, launch_extender):
    """``rlsched extender serve`` on the port the ``rlsched`` scheduler profile calls, so
    workers are placed by DAS (kube-scheduler counts ``nvidia.com/gpu`` itself either
    way: no node is ever overcommitted, with or without the extender)."""
    with launch_extender(kube_cluster, tmp_path_factory.mktemp("extender") / "extender.log") as url:
        yield url


@pytest.fixture
def offline_controller():
    """``offline_controller(**config)``: a Controller on an API client that is never
    called (no API server); ``ctl.run(coro)`` runs a coroutine on its loop; clients
    closed afterwards."""
    import asyncio

    from kubernetes_asyncio import client

    from rlsched.operator.controller import Controller, OperatorConfig
    from rlsched.operator.metrics import OperatorMetrics

    loop = asyncio.new_event_loop()
    apis = []

    def make(**kw) -> Controller:
        async def build():
            api = client.ApiClient()
            apis.append(api)
            return Controller(OperatorConfig(metrics_port=None, forecast_interval_s=0, **kw), api, OperatorMetrics())

        ctl = loop.run_until_complete(build())
        ctl.run = loop.run_until_complete
        return ctl

    yield make
    for api in apis:
        loop.run_until_complete(api.close())
    loop.close()
