"""One delivery of a turn: the runner, the handler's relay, the reply check, and the process's shared parts.

Nothing is re-exported: import the module that holds what you need.
"""

__all__: list[str] = []
