"""What enters a worker: the thin Celery tasks, the guarded Redis intake (intake, broker),
the dead letters and the queue bindings.

Nothing is re-exported: import the module that holds what you need.
"""

__all__: list[str] = []
