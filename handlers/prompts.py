"""System-prompt assembly shared by every agent framework.

Every handler asks this module for its system prompt, so sessions behave the same whatever their
`agent_framework`: the same persona default, tool rules, knowledge-base policy and error handling.
The builder is a pure function of its arguments: no I/O, no clock, the same text for the same input
(which also keeps the prompt prefix stable for providers that cache it).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["DEFAULT_PERSONA", "build_system_prompt"]

DEFAULT_PERSONA = (
    "You are a helpful, accurate assistant. Answer clearly and concisely, in the language the user "
    "writes in. If you are not sure of something, say so instead of guessing."
)
"""The persona used when the session has no system prompt of its own."""

_TOOLS_INTRO = (
    "You can call these tools: {names}. Call a tool when it gives a more reliable answer than you "
    "can; otherwise answer directly. Use only the tools listed here, with the arguments they declare."
)

# Rules for built-in tools; tools without a rule still get the general rules above.
_TOOL_RULES: dict[str, str] = {
    "calculator": (
        "For any arithmetic, call the calculator tool (argument `expression`, e.g. `6*7`) rather "
        "than computing in your head, and report the number it returns."
    ),
    "current_time": "For the current date or time, call the current_time tool; never guess it.",
}

_NO_TOOLS = "No tools are available in this conversation: answer from the conversation and your own knowledge."

_KB_ATTACHED = (
    "Knowledge bases attached to this conversation: {names}. For every question, search the "
    "knowledge base first, before answering from your own knowledge. Base your answer on what the "
    "search returns and cite the sources you used (document title or id) after the statements they "
    "support. If the search finds nothing relevant, say so, then answer from general knowledge and "
    "say that you did."
)

_KB_SEARCHED = (
    "Knowledge bases attached to this conversation: {names}. The knowledge base has already been "
    "searched for the user's latest message; the results are at the end of these instructions. Base "
    "your answer on them and cite the sources you used (document title or id) after the statements "
    "they support. If they contain nothing relevant, say so, then answer from general knowledge and "
    "say that you did."
)

_KB_RESULTS = "Knowledge base search results for the user's latest message:\n\n{results}"

_KB_NONE = "No knowledge base is attached to this conversation: do not call the search tool."

_TOOL_ERRORS = (
    "If a tool returns an error message instead of a result, do not invent a result. Fix the "
    "arguments and try again or try another way; if that is not possible, explain the problem to "
    "the user in plain words."
)

_HISTORY_OMITTED = "Earlier parts of this conversation were omitted to fit the context window. Summary: {summary}"


def _one_line(text: str) -> str:
    """Collapse whitespace so names and summaries cannot break the prompt's structure."""
    return " ".join(text.split())


def _names(values: Sequence[str]) -> list[str]:
    """Distinct, non-empty, sorted: the prompt must not depend on the caller's ordering."""
    return sorted({_one_line(v) for v in values if v and v.strip()})


def build_system_prompt(
    session: object,
    *,
    tools: Sequence[str] = (),
    history_summary: str | None = None,
    knowledge_bases: Sequence[str] = (),
    knowledge_results: str | None = None,
) -> str:
    """The full system prompt for one invocation on `session`.

    `session` is anything with an optional `system_prompt` attribute (an `AgentSession`). Its own
    prompt comes first, then chatq's shared policy: a default persona when the session has none,
    tool rules, the knowledge-base policy (stated definitively either way), tool error handling,
    and, when `history_summary` is given, a note that earlier conversation was left out.

    `knowledge_results` is for frameworks that call no tools (`none`): the handler searched the
    knowledge bases itself, so the policy says the search was done and the results close the prompt.
    """
    sections: list[str] = []
    own = getattr(session, "system_prompt", None)
    own = own.strip() if isinstance(own, str) else ""
    sections.append(own or DEFAULT_PERSONA)

    tool_names = _names(tools)
    if tool_names:
        sections.append(_TOOLS_INTRO.format(names=", ".join(tool_names)))
        sections.extend(_TOOL_RULES[name] for name in tool_names if name in _TOOL_RULES)

    kb_names = _names(knowledge_bases)
    if not tool_names and not kb_names:
        sections.append(_NO_TOOLS)
    searched = bool(kb_names) and knowledge_results is not None
    if searched:
        sections.append(_KB_SEARCHED.format(names=", ".join(kb_names)))
    elif kb_names:
        sections.append(_KB_ATTACHED.format(names=", ".join(kb_names)))
    else:
        sections.append(_KB_NONE)

    if tool_names or (kb_names and not searched):
        sections.append(_TOOL_ERRORS)

    if history_summary is not None and history_summary.strip():
        sections.append(_HISTORY_OMITTED.format(summary=_one_line(history_summary)))

    if searched:
        sections.append(_KB_RESULTS.format(results=(knowledge_results or "").strip()))

    return "\n\n".join(sections)
