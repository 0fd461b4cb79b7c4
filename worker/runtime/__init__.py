"""The turn runtime: what a worker runs. The tasks and the runner, leases, the sweeper and its
timer, the lifecycle hooks and the retry policy, and the guarded Redis intake (broker, intake,
dead letters, bindings, sent-markers, dispatch). The turn's transitions are in `worker.store`.

Nothing is re-exported: import the module that holds what you need.
"""

__all__: list[str] = []
