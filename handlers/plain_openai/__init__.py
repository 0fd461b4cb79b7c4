"""The `plain_openai` framework: a reactive tool loop written directly on the `openai` SDK.

It is the worked example of docs/handlers.md ("Adding a new framework"): no LangChain, no
LangGraph, only the contract of `handlers.base` and the shared modules. Importing this package
imports nothing from `openai`; `handlers.get_agent_handler` imports `handlers.plain_openai.handler`
when a session needs it.
"""
