"""Getting turns back: lease renewal, the sweeper and its timer, the terminal-event repair.

Nothing is re-exported: import the module that holds what you need.
"""

__all__: list[str] = []
