"""rlsched_dev: the dev tooling of rlsched, shipped apart from the serving package.

Its own distribution (``rlsched-dev``, ``dev/pyproject.toml``; the ``dev`` extra of
``rlsched``) and its own top-level package: neither the rlsched wheel nor the serving
images carry it, and nothing in ``rlsched`` imports it (the ``rlsched`` command lists
its subcommands when it is installed).

Modules:

- :mod:`~rlsched_dev.cluster` — a real Kubernetes control plane as local processes
  (``rlsched cluster up|down|status``), supervised as a kubelet would (components that
  exit are restarted), and the ``kube_env`` of the integration tests;
- :mod:`~rlsched_dev.demo` — the live demo (``rlsched demo up|down``);
- :mod:`~rlsched_dev.fake_trainer` — progress for TrainingJobs on kwok nodes
  (``rlsched fake-trainer``);
- :mod:`~rlsched_dev.nodes` — topology building: kwok GPU nodes from a core Topology;
- :mod:`~rlsched_dev.kwok` — the kwok controller and its Stages (``kwok-stages.yaml``);
- :mod:`~rlsched_dev.node_agent` — a test-only kubelet: runs the pods bound to one or
  two of its own nodes as local processes (``rlsched node-agent``, ``NodeAgent``);
- :mod:`~rlsched_dev.proc` — process start/stop (process groups), waiting, log tail;
- :mod:`~rlsched_dev.probe` — the HTTP health/readiness probe;
- :mod:`~rlsched_dev.tools` — where the binaries are found (tools cache, ``PATH``);
- :mod:`~rlsched_dev.pki` — certificates and the admin kubeconfig.
"""
