"""rlsched: learned scheduling for distributed deep-learning training on Kubernetes.

Subpackages: ``rlsched.core`` (cluster model and policies), ``rlsched.sim``
(discrete-event simulator), ``rlsched.extender`` (kube-scheduler extender),
``rlsched.operator`` (TrainingJob operator), ``rlsched.models`` (policy training).
"""

import os as _os

__version__ = "0.1.0"

# `operator/` has no __init__.py so that `import operator` run from the repository
# root keeps giving the standard library; that makes `rlsched.operator` a namespace
# portion. An installed wheel lays it out under rlsched/ and needs nothing more, but
# setuptools' editable finder only resolves namespace portions found on sys.path, so
# in a source checkout the repository root is added to this package's search path.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if not _os.path.isdir(_os.path.join(_os.path.dirname(__file__), "operator")) and _os.path.isfile(
    _os.path.join(_root, "operator", "__main__.py")
):
    __path__.append(_root)  # type: ignore[name-defined]  # noqa: F821
