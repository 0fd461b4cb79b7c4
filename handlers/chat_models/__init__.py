"""LangChain pieces shared by the LangChain-based adapters (`langgraph`, `none`).

Importing this package imports nothing from LangChain; import the submodules you need.
"""
