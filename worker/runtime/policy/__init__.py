"""When and how much: the retry policy, every model's shared limits (and their Redis scripts), a turn's provider slot.

Nothing is re-exported: import the module that holds what you need.
"""

__all__: list[str] = []
