"""rlsched.models: PyTorch training of the learned policies and their export for serving.

Modules (imported on demand; importing this package does not import torch):

- :mod:`~rlsched.models.cli` — ``rlsched train <algo>`` and ``rlsched eval <algo>``
- :mod:`~rlsched.models.ppo` — GAE, returns, clipped and adaptive-KL PPO losses
- :mod:`~rlsched.models.export` — safetensors + JSON export read by ``rlsched.core.nn``
- :mod:`~rlsched.models.rollout` — multi-process rollout workers (optional Ray mode)
- :mod:`~rlsched.models.rlpto` — RLPTO elastic-scaling agent (Lu et al., TPDS 2023)
- :mod:`~rlsched.models.lsp` — GRU task-volume forecaster for the operator
"""
