"""rlsched.models: PyTorch training of the learned policies and their export for serving.

One file per algorithm, each importing only the shared base below (modules are imported
on demand; importing this package does not import torch):

- algorithms: :mod:`~rlsched.models.das` (DAS, MAPPO), :mod:`~rlsched.models.a2c`,
  :mod:`~rlsched.models.dqn`, :mod:`~rlsched.models.hierrl`,
  :mod:`~rlsched.models.rlpto` (RLPTO elastic scaling, PPO) and
  :mod:`~rlsched.models.lsp` (GRU task-volume forecaster)
- the base: :mod:`~rlsched.models.base` (seeding, CSV logs and learning curves,
  evaluation tables), :mod:`~rlsched.models.rollout` (the one rollout pool, optional
  Ray engine), :mod:`~rlsched.models.runs` (run directories ``out/train/<run>/`` and
  promotion into ``core/weights/``), :mod:`~rlsched.models.scheduling` (what the
  cluster-scheduling agents DAS, A2C, DQN and HierRL share), :mod:`~rlsched.models.ppo`
  (GAE, returns, PPO losses and update) and :mod:`~rlsched.models.export` (safetensors +
  JSON export read by ``rlsched.core.nn``)
- :mod:`~rlsched.models.cli` — ``rlsched train <algo>``, ``rlsched eval <algo>`` and
  ``rlsched models promote RUN``
"""
