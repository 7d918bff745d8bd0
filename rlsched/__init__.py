"""rlsched: learned scheduling for distributed deep-learning training on Kubernetes.

Subpackages: ``rlsched.core`` (cluster model and policies), ``rlsched.sim``
(discrete-event simulator), ``rlsched.extender`` (kube-scheduler extender),
``rlsched.operator`` (TrainingJob operator), ``rlsched.models`` (policy training);
each maps to a top-level folder (pyproject.toml). ``operator/`` has no __init__.py, so
``rlsched.operator`` is a namespace portion: the link ``rlsched/operator`` ->
``../operator`` gives a source checkout the layout of the installed wheel.
``rlsched_dev`` (local control plane, demo, fake trainer) is a separate distribution.
"""

__version__ = "0.1.0"
