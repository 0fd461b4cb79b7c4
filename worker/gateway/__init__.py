"""The HTTP gateway (`chatq serve`): the producer API over HTTP, resumable Server-Sent Events, a chat page.

Importing this package imports nothing else: `worker.gateway.command` registers `chatq serve`
with the standard library only, and the app itself lives in `worker.gateway.app`.
"""
