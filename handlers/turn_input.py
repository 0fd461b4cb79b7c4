"""One turn's input, prepared once for every framework: what an adapter's `run(turn)` receives.

The recipe every adapter used to repeat (deadline, tools, history, system prompt, knowledge-base
search, citations) lives here, so the adapters only run their agent. The worker builds the input
with `build_turn_input` just before it calls `stream`, handing in its store (`handlers.store`):
the history rows, the knowledge bases, their search and the paid-call recorder come from there;
and its settings (`handlers.handler_settings.HandlerSettings`, derived from its runtime's): the
model, the deadline, the history budget, the vision models, the model endpoint and what tools
need come from those. `BaseAgentHandler.invoke` and `astream` build it the same way on the default
store and this process's settings (`PreparedTurnHandler.prepare`). No agent framework is imported
here, nor the database (the ruff bans of handlers/ruff.toml apply); nothing here reads the settings.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from chatq.errors import ConfigError
from chatq.masking import mask_secrets
from handlers.context import ToolContext
from handlers.deadline import Deadline
from handlers.errors import AgentInvocationError, HandlerError
from handlers.handler_settings import HandlerSettings, ModelEndpoint
from handlers.history import History, trim_history
from handlers.images import UserContent, model_accepts_images, user_content
from handlers.journal import Journal, Resumed
from handlers.knowledge import choose_citations, retrieval_step, start_invocation
from handlers.messages import AgentMessage, AgentSession, StreamEvent, StreamEventKind, ToolCall, Usage
from handlers.prompts import build_system_prompt
from handlers.store import TurnStore, default_store
from handlers.tool_registry import session_tool_names
from models.errors import NotAUserMessage

__all__ = ["Retrieval", "TurnInput", "build_turn_input"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Retrieval:
    """The first knowledge-base search of a turn, already run (and, being a paid tool, recorded)."""

    call: ToolCall
    """The `search_knowledge_base` call, `{"id", "name", "args": {"query"}}`, as if the model had made it."""
    output: str
    """What the search returned (the text the model reads)."""
    in_prompt: bool
    """True for a framework that calls no tools: `output` already closes `TurnInput.system_prompt`.
    False: the adapter puts `messages()` into the conversation before its first model call."""

    def messages(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The search as an assistant tool call and its tool result, in the neutral form of `TurnInput.history`."""
        call = {"id": self.call["id"], "name": self.call["name"], "args": dict(self.call.get("args") or {})}
        return (
            {"role": "assistant", "content": "", "tool_calls": [call], "tool_call_id": None},
            {"role": "tool", "content": self.output, "tool_calls": None, "tool_call_id": call["id"]},
        )

    def agent_messages(self) -> list[AgentMessage]:
        """The same two messages as the turn stores them (for an adapter that builds `AgentMessage`s itself)."""
        return [AgentMessage.from_dict(message) for message in self.messages()]

    def events(self) -> tuple[StreamEvent, StreamEvent]:
        """The `tool` events of the search (started, finished), which every adapter yields first."""
        tool = {"id": self.call["id"], "name": self.call["name"]}
        return (
            StreamEvent(kind=StreamEventKind.TOOL, tool={**tool, "status": "started"}),
            StreamEvent(kind=StreamEventKind.TOOL, tool={**tool, "status": "finished"}),
        )


@dataclass(frozen=True, kw_only=True)
class TurnInput:
    """Everything an adapter needs for one invocation: state in, persistence already done.

    Built once per invocation (an attempt of a turn); an adapter converts it to its framework's
    messages and runs its agent, and never reads Postgres or the settings for it.
    """

    session: AgentSession
    """The session (`id`, `agent_framework`, `model`, `system_prompt`, `metadata_`), for logs and ids."""
    model: str
    """The model to call: the session's, or this process's default (`CHATQ_MODEL`) when it names none."""
    user_message: str
    """The user's new message, as sent."""
    images: tuple[str, ...]
    """Image references sent with it (URLs, data: URLs or bare base64), non-empty ones only."""
    user_content: UserContent
    """The user message for the model, OpenAI chat format: the text, or text and `image_url` parts when
    the model takes images (else the text with a note that images were left out)."""
    reply_to: int | None
    """The user message this turn answers again (regenerate/edit); the history stops before it."""
    history: tuple[dict[str, Any], ...]
    """Earlier conversation within `CHATQ_HISTORY_TOKENS`, oldest first, as neutral dicts
    `{"role", "content", "tool_calls", "tool_call_id"}` (tool calls `[{"id", "name", "args"}]`)."""
    history_omitted: int
    """How many earlier messages were left out to fit the budget (the prompt summarises them)."""
    system_prompt: str
    """chatq's system prompt: the session's own, the tool rules, the knowledge-base policy, error handling."""
    tools: tuple[str, ...]
    """Registry tools to bind (`handlers.tool_registry.get_tool(name)`): the session's `metadata["tools"]` or the
    defaults, plus `search_knowledge_base` exactly when knowledge bases are attached. Empty for a
    framework that calls no tools. Run each call with `run_tool(name, args, context=turn.tool_context.for_call(id))`."""
    knowledge_bases: tuple[str, ...]
    """Names of the attached knowledge bases; empty: none (do not search)."""
    retrieval: Retrieval | None
    """The retrieval policy applied: with knowledge bases, the first search of the question, already
    run (see `Retrieval.in_prompt` for where it goes); None without knowledge bases."""
    tool_context: ToolContext
    """This invocation as its tools see it (session, knowledge bases, turn, hits found so far)."""
    deadline: Deadline
    """The turn timeout (`CHATQ_TURN_TIMEOUT`), started when the input was built: `remaining()` for request
    timeouts, `check()` between chunks and steps."""
    endpoint: ModelEndpoint
    """The OpenAI-compatible server to build the model client for: base URL, key, request timeout
    (`handlers.chat_models.models.get_chat_model(turn.model, turn.endpoint)`); `endpoint.unavailable(model)`
    says why a model cannot run on it."""
    resumed: Resumed = dataclasses.field(default_factory=Resumed)
    """What earlier attempts of the turn finished (`handlers.journal`): the adapter continues after
    `resumed.messages` (the conversation is history, the user message, then those), runs the open
    round's `resumed.pending` calls first, and returns only what it produces itself; the template
    puts the finished messages and usage in front. Empty for a first attempt or without a journal."""
    journal: Journal | None = None
    """Where the adapter records each assistant message that calls tools (`record_model_step`); tool
    calls are recorded by `run_tool`. None: nothing is recorded."""

    def record_model_step(self, message: AgentMessage, usage: Usage) -> None:
        """Record an assistant message that calls tools, right after the model returned it, before any
        of its tools runs (no-op without a journal)."""
        if self.journal is not None and message.tool_calls:
            self.journal.model_step(message, usage)

    @property
    def timeout(self) -> float:
        """The turn timeout in seconds (for `invocation_error(exc, timeout=...)`)."""
        return self.deadline.seconds

    def final_event(self, messages: Sequence[AgentMessage], usage: Usage) -> StreamEvent:
        """The one `final` event: `messages` with the citations of the last (knowledge bases only) and `usage`."""
        produced = list(messages)
        if produced:
            citations = choose_citations(self.tool_context, produced[-1].content)
            if citations:
                produced[-1] = dataclasses.replace(produced[-1], citations=citations)
        return StreamEvent(kind=StreamEventKind.FINAL, response=produced, usage=dict(usage))


def build_turn_input(
    session: AgentSession,
    user_message: str,
    *,
    images: Sequence[str] | None = None,
    reply_to: int | None = None,
    calls_tools: bool = True,
    settings: HandlerSettings,
    store: TurnStore | None = None,
    journal: Journal | None = None,
) -> TurnInput:
    """Prepare one invocation on `session`: deadline, tools, history, system prompt, first search.

    `calls_tools` is the adapter's `BaseAgentHandler.calls_tools`: False binds no tools and puts a
    knowledge-base search at the end of the system prompt instead of into the conversation.
    `settings` (the worker's, derived from its runtime's) give the model of a session that names
    none, the turn timeout, the history budget, the vision models, the model endpoint and the tool
    settings the `ToolContext` carries.
    `store` (default: `handlers.store.default_store()`) hands in the session's data. `journal` (the
    worker's, `handlers.journal`) is read once here: with finished steps the invocation resumes
    after them (the first search is among them, not made again); a framework that calls no tools
    records nothing.

    Fails as an adapter would: a HandlerError (an unknown tool, a `reply_to` of another session) as
    is; an error of the store or of the configuration unchanged (the worker classifies it: retries
    the delivery, or fails the turn); anything else as AgentInvocationError.
    """
    deadline = Deadline(settings.turn_timeout)
    store = default_store() if store is None else store
    # The store's reads come first and outside the net below: their errors are the worker's to judge.
    # History before any search: a `reply_to` of another session fails before a paid search is made.
    tool_context = start_invocation(session, store, settings.tools)
    history = _history(store, tool_context, session, reply_to, user_message, settings.history_tokens)
    journal = journal if calls_tools else None
    resumed = Resumed.of(journal.done) if journal is not None else Resumed()
    if journal is not None:
        tool_context = dataclasses.replace(tool_context, journal=journal, resumed=resumed)
        # The reply's citations are chosen from every search of the turn, finished ones included.
        tool_context.retrieved.add(resumed.hits)
    try:
        built = _build(
            session,
            user_message,
            images,
            reply_to,
            calls_tools,
            settings,
            deadline,
            tool_context,
            history,
            resumed.steps > 0,
        )
        return dataclasses.replace(built, resumed=resumed, journal=journal)
    except (HandlerError, ConfigError):
        raise
    except Exception as exc:
        logger.warning(
            "session %s: preparing the turn failed: %s: %s",
            session.id,
            type(exc).__name__,
            mask_secrets(str(exc))[:500],
            exc_info=True,
        )
        raise AgentInvocationError(f"The agent failed ({type(exc).__name__}).") from exc


def _history(
    store: TurnStore, context: ToolContext, session: AgentSession, reply_to: int | None, text: str, budget: int
) -> History:
    """The session's history rows from the store, cut to the budget (`handlers.history.trim_history`)."""
    if context.session_id is None:
        raise HandlerError(f"session id {session.id!r} is not a UUID")
    try:
        with store.history(context.session_id, reply_to) as pages:
            return trim_history(pages, text, budget_tokens=budget)
    except NotAUserMessage as exc:
        raise HandlerError(exc.message) from None


def _build(
    session: AgentSession,
    text: str,
    images: Sequence[str] | None,
    reply_to: int | None,
    calls_tools: bool,
    settings: HandlerSettings,
    deadline: Deadline,
    tool_context: ToolContext,
    history: History,
    resuming: bool,
) -> TurnInput:
    model = settings.session_model(session.model)
    knowledge_bases = tool_context.knowledge_bases
    tools = session_tool_names((session.metadata_ or {}).get("tools"), knowledge_bases) if calls_tools else ()
    retrieval: Retrieval | None = None
    if knowledge_bases and not resuming:
        # The first step of every question is a search with the user's message.
        call, output = retrieval_step(tool_context, text)
        retrieval = Retrieval(call=call, output=output, in_prompt=not calls_tools)
    prompt = build_system_prompt(
        session,
        tools=tools,
        history_summary=history.summary,
        knowledge_bases=knowledge_bases,
        knowledge_results=retrieval.output if retrieval is not None and retrieval.in_prompt else None,
    )
    refs = tuple(i for i in images or () if isinstance(i, str) and i.strip())
    return TurnInput(
        session=session,
        model=model,
        user_message=text,
        images=refs,
        user_content=user_content(text, refs, accepts_images=model_accepts_images(model, settings.vision_models)),
        reply_to=reply_to,
        history=tuple(history.messages),
        history_omitted=history.omitted,
        system_prompt=prompt,
        tools=tuple(tools),
        knowledge_bases=tuple(knowledge_bases),
        retrieval=retrieval,
        tool_context=tool_context,
        deadline=deadline,
        endpoint=settings.endpoint,
    )
