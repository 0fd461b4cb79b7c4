"""The turn store: every transition of a turn's status (`claims`), their statements
(`transition_sql`), what they return (`claim_values`), and the read side of turn rows: the
turn-order rule, the next turn to send, the poison rule (`turns`).

Nothing is re-exported: import the module that holds what you need.
"""

__all__: list[str] = []
