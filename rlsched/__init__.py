"""rlsched: learned scheduling for distributed deep-learning training on Kubernetes.

Subpackages: ``rlsched.core`` (cluster model and policies), ``rlsched.sim``
(discrete-event simulator), ``rlsched.extender`` (kube-scheduler extender),
``rlsched.operator`` (TrainingJob operator), ``rlsched.models`` (policy training);
``rlsched_dev`` (local control plane, demo, fake trainer) is a separate distribution.
"""

__version__ = "0.1.0"
