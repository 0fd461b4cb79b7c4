"""Operating a worker: Flower with authentication, Prometheus metrics, JSON logs, the Celery
signal handlers that wire them in, and freezing the start-up heap out of full GC passes.

Nothing is re-exported: import the module that holds what you need.
"""

__all__: list[str] = []
