"""Webhook deliveries: one attempt of a delivery (the task's logic, the `WebhookHooks` hook) and the signed POST.

Nothing is re-exported: import the module that holds what you need.
"""

__all__: list[str] = []
