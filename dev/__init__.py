"""rlsched.dev: the dev tooling, shipped apart from the serving package.

Its own distribution (``rlsched-dev``, ``dev/pyproject.toml``; the ``dev`` extra of
``rlsched``): neither the base wheel nor the serving images carry it, and nothing in
``rlsched`` imports it (the ``rlsched`` command lists its subcommands when it is
installed).

Modules:

- :mod:`~rlsched.dev.cluster` — a real Kubernetes control plane as local processes
  (``rlsched cluster up|down|status``) and the ``kube_env`` of the integration tests;
- :mod:`~rlsched.dev.demo` — the live demo (``rlsched demo up|down``);
- :mod:`~rlsched.dev.fake_trainer` — progress for TrainingJobs on kwok nodes
  (``rlsched fake-trainer``);
- :mod:`~rlsched.dev.nodes` — topology building: kwok GPU nodes from a core Topology;
- :mod:`~rlsched.dev.kwok` — the kwok controller and its Stages (``kwok-stages.yaml``);
- :mod:`~rlsched.dev.proc` — process start/stop (process groups), waiting, log tail;
- :mod:`~rlsched.dev.probe` — the HTTP health/readiness probe;
- :mod:`~rlsched.dev.tools` — where the binaries are found (tools cache, ``PATH``);
- :mod:`~rlsched.dev.pki` — certificates and the admin kubeconfig.
"""
