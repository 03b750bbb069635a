"""The seed ranges every run keeps to (standard library only: ``gradlab train`` checks ``--seed``
before it starts anything).

A run seed ``s`` in ``[0, MAX_RUN_SEED]`` gives training lane ``i`` (at most 1,024 lanes) the seed
``s * 1024 + i``, below :data:`EVAL_SEED_OFFSET`; evaluation seeds start at the offset, so a
policy is never evaluated on an episode seed it trained on (``gradlab.envs.vector``).
"""

from __future__ import annotations

#: Evaluation seeds start here; training lane seeds are kept below it, so the two never overlap.
EVAL_SEED_OFFSET = 2**31
#: Largest run seed; with at most 1024 lanes, training seeds stay below EVAL_SEED_OFFSET.
MAX_RUN_SEED = 2**20
