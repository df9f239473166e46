"""The project's own chaos soak: the delivery contract checked under a stream of faults.

Writers (``soak.writer``) commit, roll back and hold transactions open on a fresh PostgreSQL
table; several ``afdb run soak/app.py`` processes poll it with their state on Azurite; a seeded
fault driver (``soak.run``) kills and freezes pollers, restarts and freezes Azurite and
terminates database sessions, while a monitor samples the checkpoint and the lease. After a clean
drain the checker (``soak.check``) reads every process's fsynced evidence and says whether any
committed row version was lost, the checkpoint or the fence went backwards, a handler ran under a
stale fence, or something was delivered that no writer committed.

``make soak SECONDS=1800`` runs it; ``python -m soak --help`` lists the knobs. See
docs/guarantees.md (The chaos soak).
"""
