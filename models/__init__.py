"""rlsched.models: PyTorch training of the learned policies and their export for serving.

One file per algorithm (:mod:`.das`, :mod:`.a2c`, :mod:`.dqn`, :mod:`.hierrl`,
:mod:`.rlpto`, :mod:`.lsp`, :mod:`.growth`), each importing only the shared base
(:mod:`.base`, :mod:`.rollout`, :mod:`.runs`, :mod:`.scheduling`, :mod:`.ppo`,
:mod:`.export`); importing this package does not import torch. The command line is
:mod:`.cli`. Layout: docs/training.md, docs/design-notes.md.
"""
