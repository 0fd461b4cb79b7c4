"""The turn runtime: what a worker runs, by role. `intake` (the tasks, the guarded Redis intake, dead
letters, bindings), `delivery` (the runner and relay, the process's shared parts), `policy` (the retry
policy, the shared model limits, the provider slot), `observers` (the lifecycle hooks and their
registry), `recovery` (leases, the sweeper and its timer, terminal repair), `webhooks` (delivery
attempts). The turn's transitions are in `worker.store`; sending messages is `worker.dispatch`.
It never imports `worker.ops` (`worker.wiring` joins them).

Nothing is re-exported: import the module that holds what you need.
"""

__all__: list[str] = []
