"""The `langgraph` framework: a reactive agent loop (agent node <-> tool node) on LangGraph.

Importing this package imports nothing from LangGraph; `handlers.get_agent_handler` imports
`handlers.langgraph.handler` when a session needs it.
"""
