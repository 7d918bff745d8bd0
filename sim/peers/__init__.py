"""The peers' allocation policies, run side by side in our engine
(:class:`rlsched.core.allocation.Allocator`): the released Pollux policy through a
bridge process (:mod:`rlsched.sim.peers.pollux`)."""
