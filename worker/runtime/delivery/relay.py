"""Running the session's handler on a claimed turn: its input prepared, its stream relayed to consumers.

chatq's adapters (`handlers.prepared.PreparedTurnHandler`) stream the prepared turn on this thread;
a plain handler (written to `handlers.base.BaseAgentHandler` alone) streams the message as sent, or
answers it with `invoke` when it has no `stream`, on a thread of its own (`handlers.plain_run`).
The stream runs under the lease's abort signal, so a cancel, a lost lease or the worker's shutdown
closes the model request instead of waiting for its next chunk; between chunks `check_lease` turns
those into the exceptions the runner handles. Text and tool events go to the turn's stream and to
the lifecycle hooks; a refusal by the model service before any text is back-pressure
(`ProviderBusy`), after text an ordinary agent failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from handlers.abort import abortable
from handlers.base import AgentMessage, BaseAgentHandler, SessionInfo, StreamEvent, StreamEventKind, Usage
from handlers.errors import AgentInvocationError, ProviderBusy
from handlers.journal import Journal
from handlers.plain_run import plain_events
from handlers.prepared import PreparedTurnHandler
from worker.errors import HandBack, LeaseLost, TurnCancelled
from worker.events import EventType, TextCoalescer, TurnEvents
from worker.runtime.delivery.process import Runtime
from worker.runtime.delivery.replies import validate_reply
from worker.runtime.observers import hooks
from worker.runtime.observers.hooks import Facts
from worker.runtime.recovery.leases import TurnLease, handing_back
from worker.store import claims

__all__ = ["check_lease", "handler_session", "run_handler"]


def handler_session(session: claims.ClaimedSession) -> SessionInfo:
    """The handler's view of a claimed turn's session (the store returns its own type)."""
    return SessionInfo(
        id=session.id,
        agent_framework=session.agent_framework,
        model=session.model,
        system_prompt=session.system_prompt,
        metadata_=dict(session.metadata),
        knowledge_bases=session.knowledge_bases,
    )


def run_handler(
    claim: claims.Claim,
    events: TurnEvents,
    lease: TurnLease,
    *,
    runtime: Runtime,
    started: float | None = None,
    journal: Journal | None = None,
) -> tuple[list[AgentMessage], Usage]:
    """Stream the session's handler on the turn, relaying text and tool events.

    chatq's adapters (`PreparedTurnHandler`) get the turn's input prepared and run on this thread,
    with the turn's `journal` (`handlers.journal`: they resume after its finished steps and record
    new ones); a plain handler gets the message as sent and runs on a thread of its own
    (`handlers.plain_run`), and starts over in every attempt.
    """
    from handlers import get_agent_handler

    registry = runtime.hooks
    session = handler_session(claim.session)
    handler = get_agent_handler(session)
    source = _source(handler, session, claim, lease, runtime, journal)
    coalescer = TextCoalescer(events, claim.attempt, runtime.settings.text_coalesce_ms / 1000.0)
    relay = _Relay(Facts.of_claim(claim, runtime.settings), claim, events, lease, coalescer, registry, started)
    stream: Iterator[StreamEvent] | None = None
    try:
        # Under the lease's abort signal: a cancel, a lost lease or shutdown closes the model
        # request the handler waits on (handlers/abort.py) instead of waiting for its next chunk.
        with abortable(lease.abort):
            stream = iter(source())
            relay.run(stream)
    except ProviderBusy as exc:
        check_lease(lease)
        if relay.streamed:
            # Text reached consumers: not back-pressure any more, the ordinary retry-once rule applies.
            raise AgentInvocationError(exc.message) from exc
        raise
    except Exception:
        # An aborted request fails as a connection error: report the cancel (lost lease,
        # hand-back) it was, not an agent failure.
        check_lease(lease)
        raise
    finally:
        coalescer.flush()
        close = getattr(stream, "close", None)
        if close is not None:
            close()
    final = relay.final
    if final is None:
        raise AgentInvocationError("the agent stream ended without a final reply")
    check_lease(lease)
    return validate_reply(final.response, final.usage)


def _source(
    handler: BaseAgentHandler,
    session: SessionInfo,
    claim: claims.Claim,
    lease: TurnLease,
    runtime: Runtime,
    journal: Journal | None = None,
) -> Callable[[], Iterator[StreamEvent]]:
    """How to start the handler's event stream: prepared here for an adapter, as sent for a plain handler."""
    if isinstance(handler, PreparedTurnHandler):
        from handlers.turn_input import build_turn_input
        from worker.runtime.delivery.claimed_store import ClaimedTurnStore

        # The store hands the turn its data (history rows, the newest as the claim read them, knowledge
        # bases, their search, the paid-call recorder), the runtime its settings; a database error
        # raised from the store comes back here unchanged for the runner to classify.
        turn = build_turn_input(
            session,
            claim.content,
            images=claim.images,
            reply_to=claim.reply_to,
            calls_tools=handler.calls_tools,
            settings=runtime.handler_settings,
            store=ClaimedTurnStore(claim),
            journal=journal,
        )
        return lambda: handler.stream_turn(turn)
    images = list(claim.images) if claim.images else None
    return lambda: plain_events(
        handler,
        claim.content,
        images=images,
        reply_to=claim.reply_to,
        timeout=runtime.settings.turn_timeout,
        check=lambda: check_lease(lease),
    )


class _Relay:
    """Relays the handler's text and tool events to consumers and hooks; keeps its final event."""

    def __init__(
        self,
        facts: Facts,
        claim: claims.Claim,
        events: TurnEvents,
        lease: TurnLease,
        coalescer: TextCoalescer,
        registry: hooks.HookRegistry,
        started: float | None,
    ) -> None:
        self.facts, self.claim, self.events, self.lease, self.coalescer = facts, claim, events, lease, coalescer
        self.registry, self.started = registry, started
        self.final: StreamEvent | None = None
        self.streamed = False
        """Whether any text reached consumers (after that, a refusal is no longer back-pressure)."""

    def run(self, stream: Iterator[StreamEvent]) -> None:
        claim, first_text = self.claim, True
        for event in stream:
            check_lease(self.lease)
            if event.kind == StreamEventKind.TEXT:
                self.streamed = self.streamed or bool(event.text)
                if first_text and event.text and self.started is not None:
                    first_text = False
                    seconds = time.monotonic() - self.started
                    self.registry.first_text(hooks.FirstText(turn=self.facts, seconds=seconds))
                self.coalescer.add(event.text)
            elif event.kind == StreamEventKind.TOOL and event.tool is not None:
                self.coalescer.flush()
                tool = {key: event.tool.get(key) for key in ("id", "name", "status")}
                self.events.publish(EventType.TOOL, claim.attempt, tool=tool)
                call = hooks.ToolCall(turn=self.facts, name=tool["name"], call_id=tool["id"], status=tool["status"])
                self.registry.tool(call)
            elif event.kind == StreamEventKind.FINAL:
                self.final = event


def check_lease(lease: TurnLease) -> None:
    """Stop between chunks if the turn was cancelled, taken over, or the worker is shutting down."""
    if lease.lost.is_set():
        raise LeaseLost
    if lease.cancelled.is_set():
        raise TurnCancelled
    if handing_back():
        raise HandBack
