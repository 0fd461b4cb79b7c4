"""Read-only views for `chatq show` and `chatq usage`; the gateway answers for a turn with `turn_report` too."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from models.db import session_scope
from models.tables import (
    ChatMessage,
    ChatSession,
    DeliveryEvent,
    PaidToolCall,
    Turn,
    TurnStep,
    UsageRollup,
    WebhookDelivery,
)
from worker.errors import BatchNotFound, SessionNotFound, TurnNotFound
from worker.history import message_dict, turn_dict
from worker.payload import parse_uuid

COST_DECIMALS = 8
WORKER_DEFAULT = "(worker default)"
"""How `chatq usage` shows sessions that name no model (NULL: each worker's default model)."""


def turn_report(turn_id: uuid.UUID | str, *, tenant: str | None = None) -> dict[str, Any]:
    """A turn with its messages in order (the user's first), as `chatq show --json` prints it, with
    its `tenant`: its session's, since a turn has none of its own.

    `tenant`: TurnNotFound unless the turn's session is that tenant's (None: any turn).
    """
    turn_uuid = parse_uuid(str(turn_id), "turn_id")
    with session_scope() as db:
        query = (
            select(Turn, ChatSession.tenant)
            .join(ChatSession, ChatSession.id == Turn.session_id)
            .where(Turn.id == turn_uuid)
        )
        if tenant is not None:
            query = query.where(ChatSession.tenant == tenant)
        found = db.execute(query).one_or_none()
        if found is None:
            raise TurnNotFound(f"turn {turn_uuid} does not exist")
        turn, owner = found
        messages = db.execute(
            select(ChatMessage).where(ChatMessage.turn_id == turn_uuid).order_by(ChatMessage.position)
        ).scalars()
        webhook = _webhook_report(db, turn)
        steps = [
            _step_dict(step)
            for step in db.execute(
                select(TurnStep).where(TurnStep.turn_id == turn_uuid).order_by(TurnStep.seq)
            ).scalars()
        ]
        stored = turn_dict(turn, [message_dict(row) for row in messages])
        return {
            # Beside its session: whose the turn is.
            "id": stored["id"],
            "session_id": stored["session_id"],
            "tenant": owner,
            **stored,
            "steps": steps,
            "webhook": webhook,
            # A delayed turn's user message (`{"content", "images"}`), stored as a message when it is due.
            "pending_input": turn.pending_input,
        }


def _step_dict(step: TurnStep) -> dict[str, Any]:
    """One journal entry as `chatq show --json` prints it: what it records and the attempt that did it."""
    return {
        "seq": step.seq,
        "kind": step.kind.value,
        "attempt": step.attempt,
        "call_id": step.call_id,
        "tool_name": step.tool_name,
    }


def _webhook_report(db: Session, turn: Turn) -> dict[str, Any] | None:
    """The turn's webhook and the delivery of its end (None: neither the turn nor its session has one).

    A pause's deliveries are not shown here (docs/contract.md, "Webhooks")."""
    delivery = db.execute(
        select(WebhookDelivery).where(WebhookDelivery.turn_id == turn.id, WebhookDelivery.event == DeliveryEvent.ENDED)
    ).scalar_one_or_none()
    if delivery is None:
        url = (
            turn.webhook_url
            or db.execute(select(ChatSession.webhook_url).where(ChatSession.id == turn.session_id)).scalar_one_or_none()
        )
        if url is None:
            return None
        # Not ended yet: the delivery is recorded when it ends.
        return {
            "url": url,
            "delivery_id": None,
            "status": None,
            "attempts": 0,
            "last_status_code": None,
            "last_error": None,
            "last_attempt_at": None,
            "delivered_at": None,
        }
    return {
        "url": delivery.url,
        "delivery_id": str(delivery.id),
        "status": delivery.status.value,
        "attempts": delivery.attempts,
        "last_status_code": delivery.last_status_code,
        "last_error": delivery.last_error,
        "last_attempt_at": delivery.last_attempt_at.isoformat() if delivery.last_attempt_at else None,
        "delivered_at": delivery.delivered_at.isoformat() if delivery.delivered_at else None,
    }


def usage_report(
    session_id: uuid.UUID | str | None = None,
    *,
    batch: str | None = None,
    prices: str | None = None,
    tenant: str | None = None,
) -> dict[str, Any]:
    """Token usage and costs, overall, for one session, one batch or one tenant, per model and tool.

    `tenant`: only the sessions of that tenant (with what is kept of its deleted sessions); a
    tenant with no sessions has zeros (tenants are not registered anywhere).

    Keys: `session_id`, `batch`, `turns`, `prompt_tokens`, `completion_tokens`, `total_tokens`,
    `by_model` (each with `estimated_cost`), `tool_calls`, `tool_cost`, `by_tool` (`tool`, `calls`,
    `units`, `cost`), `token_cost`, `estimated_cost` (token_cost + tool_cost), `unpriced_models`
    and `currency`. Tool costs are what each paid call cost when it was made; token costs are
    estimated now from `prices`, `CHATQ_PRICES` as configured (the CLI hands its settings' in; None:
    no price table; see `handlers.accounting`); a model without a price there
    has `estimated_cost` None and is listed in `unpriced_models`. Sessions that name no model (the
    worker's default) are one row with `model` None, unpriced. When no model used has a price,
    `token_cost` is None, and so is `estimated_cost` unless paid tools were called.
    SessionNotFound for an unknown session, BatchNotFound for a batch without sessions.
    """
    from handlers.accounting import load_prices

    table = load_prices(prices)
    with session_scope() as db:
        query = (
            select(
                ChatSession.model,
                func.count(Turn.id),
                func.coalesce(func.sum(Turn.prompt_tokens), 0),
                func.coalesce(func.sum(Turn.completion_tokens), 0),
                func.coalesce(func.sum(Turn.total_tokens), 0),
            )
            .join(ChatSession, ChatSession.id == Turn.session_id)
            .group_by(ChatSession.model)
            .order_by(ChatSession.model)
        )
        tools = (
            select(
                PaidToolCall.tool_name,
                func.count(PaidToolCall.id),
                func.coalesce(func.sum(PaidToolCall.units), 0),
                func.coalesce(func.sum(PaidToolCall.cost), 0),
            )
            .group_by(PaidToolCall.tool_name)
            .order_by(PaidToolCall.tool_name)
        )
        session_uuid = None
        if session_id is not None:
            session_uuid = parse_uuid(str(session_id), "session")
            if db.get(ChatSession, session_uuid) is None:
                raise SessionNotFound(f"session {session_uuid} does not exist")
            query = query.where(Turn.session_id == session_uuid)
            tools = tools.where(PaidToolCall.session_id == session_uuid)
        if batch is not None:
            # Containment, so the metadata's GIN index answers (`chatq batch` stores {"batch": ID}).
            exists = select(ChatSession.id).where(ChatSession.metadata_.contains({"batch": batch})).limit(1)
            if db.execute(exists).first() is None:
                raise BatchNotFound(f"batch {batch!r} does not exist (no session belongs to it)")
            in_batch = ChatSession.metadata_["batch"].astext == batch
            query = query.where(in_batch)
            tools = tools.join(ChatSession, ChatSession.id == PaidToolCall.session_id).where(in_batch)
        if tenant is not None:
            query = query.where(ChatSession.tenant == tenant)
            tools = tools.where(PaidToolCall.session_id.in_(select(ChatSession.id).where(ChatSession.tenant == tenant)))
        by_model: list[dict[str, Any]] = []
        token_cost = Decimal(0)
        unpriced: list[str] = []
        model_rows: list[tuple[Any, ...]] = [tuple(row) for row in db.execute(query).all()]
        tool_rows: list[tuple[Any, ...]] = [tuple(row) for row in db.execute(tools).all()]
        if session_uuid is None and batch is None:
            # Deleted sessions' usage lives on, aggregated, in usage_rollups: it counts in the totals.
            model_rows = _merged(model_rows, db.execute(_rolled_up_tokens(tenant)).all())
            tool_rows = _merged(tool_rows, db.execute(_rolled_up_tools(tenant)).all())
        for model, n, p, c, t in model_rows:
            # NULL: sessions on the worker's default model, which this process cannot know to price.
            cost = None if model is None else table.token_cost(model, int(p), int(c))
            if cost is None:
                unpriced.append(model or WORKER_DEFAULT)
            else:
                token_cost += cost
            by_model.append(
                {
                    "model": model,
                    "turns": int(n),
                    "prompt_tokens": int(p),
                    "completion_tokens": int(c),
                    "total_tokens": int(t),
                    "estimated_cost": _money(cost),
                }
            )
        by_tool = [
            {"tool": name, "calls": int(n), "units": int(units), "cost": _money(Decimal(cost))}
            for name, n, units, cost in tool_rows
        ]
    keys = ("turns", "prompt_tokens", "completion_tokens", "total_tokens")
    totals = {key: sum(int(row[key]) for row in by_model) for key in keys}
    tool_cost = sum((Decimal(str(row["cost"])) for row in by_tool), Decimal(0))
    # Nothing priced is no price, not a cost of zero (a model with a price of 0, like echo, is priced).
    priced = any(row["estimated_cost"] is not None for row in by_model) or not by_model
    estimated = None if not priced and not by_tool else token_cost + tool_cost
    return {
        "session_id": str(session_uuid) if session_uuid else None,
        **totals,
        "by_model": by_model,
        "batch": batch,
        "tenant": tenant,
        "tool_calls": sum(row["calls"] for row in by_tool),
        "tool_cost": _money(tool_cost),
        "by_tool": by_tool,
        "token_cost": _money(token_cost if priced else None),
        "estimated_cost": _money(estimated),
        "unpriced_models": unpriced,
        "currency": table.currency,
    }


def _rolled_up_tokens(tenant: str | None = None) -> Any:
    query = (
        select(
            UsageRollup.model,
            func.sum(UsageRollup.turns),
            func.sum(UsageRollup.prompt_tokens),
            func.sum(UsageRollup.completion_tokens),
            func.sum(UsageRollup.total_tokens),
        )
        .where(UsageRollup.tool_name.is_(None))
        .group_by(UsageRollup.model)
    )
    return query if tenant is None else query.where(UsageRollup.tenant == tenant)


def _rolled_up_tools(tenant: str | None = None) -> Any:
    query = (
        select(
            UsageRollup.tool_name,
            func.sum(UsageRollup.tool_calls),
            func.sum(UsageRollup.tool_units),
            func.sum(UsageRollup.tool_cost),
        )
        .where(UsageRollup.tool_name.is_not(None))
        .group_by(UsageRollup.tool_name)
    )
    return query if tenant is None else query.where(UsageRollup.tenant == tenant)


def _merged(rows: list[tuple[Any, ...]], more: Any) -> list[tuple[Any, ...]]:
    """Rows keyed by their first column with `more` added column by column (new keys last)."""
    totals: dict[Any, list[Any]] = {row[0]: list(row[1:]) for row in rows}
    for key, *values in more:
        current = totals.setdefault(key, [0] * len(values))
        totals[key] = [a + (b or 0) for a, b in zip(current, values, strict=True)]
    return [(key, *values) for key, values in totals.items()]


def _money(value: Decimal | None) -> float | None:
    return None if value is None else float(round(value, COST_DECIMALS))


def format_usage(report: dict[str, Any]) -> list[str]:
    """The lines `chatq usage` prints for a `usage_report`: tokens and estimated cost per model, tool costs, totals."""
    currency = report.get("currency") or ""

    def money(value: float | None) -> str:
        return "-" if value is None else f"{value:.6f}"

    lines = [f"{'model':<32} {'turns':>8} {'prompt':>12} {'completion':>12} {'total':>12} {'cost ' + currency:>14}"]
    for row in report["by_model"]:
        lines.append(
            f"{row['model'] or WORKER_DEFAULT:<32} {row['turns']:>8} {row['prompt_tokens']:>12} "
            f"{row['completion_tokens']:>12} {row['total_tokens']:>12} {money(row.get('estimated_cost')):>14}"
        )
    lines.append(
        f"{'all':<32} {report['turns']:>8} {report['prompt_tokens']:>12} "
        f"{report['completion_tokens']:>12} {report['total_tokens']:>12} {money(report.get('token_cost')):>14}"
    )
    if report.get("by_tool"):
        lines.append("")
        lines.append(f"{'paid tool':<32} {'calls':>8} {'units':>12} {'cost ' + currency:>14}")
        for row in report["by_tool"]:
            lines.append(f"{row['tool']:<32} {row['calls']:>8} {row['units']:>12} {money(row['cost']):>14}")
    lines.append("")
    unpriced = report.get("unpriced_models")
    if report.get("estimated_cost") is None:
        lines.append(f"estimated cost: none, no price for: {', '.join(unpriced or [])} (set CHATQ_PRICES)")
        return lines
    partial = " for the priced part only" if unpriced else ""
    lines.append(f"estimated cost: {money(report.get('estimated_cost'))} {currency}{partial}".rstrip())
    if unpriced:
        lines.append(f"no price for: {', '.join(unpriced)} (set CHATQ_PRICES)")
    return lines
