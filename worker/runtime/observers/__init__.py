"""The lifecycle hooks, the hook points outside a turn, the process's registry, and the clean-up
hook after deleted sessions.

Nothing is re-exported: import the module that holds what you need.
"""

__all__: list[str] = []
