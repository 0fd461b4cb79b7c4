"""The statements behind `worker.store.claims`, each one transition of a turn's status (or its
bookkeeping), and the one read-only query that says why a claim took nothing; only
`worker.store.claims` executes them, as procrastinate keeps each job transition in one SQL function
its manager calls.

The turn-order rule (`worker.store.turns.runs_next_sql`) is composed into them as it is into every
other query about which turn a session runs next. Each is one statement, atomic on its own.

Every statement that ends a turn (succeeded, failed or cancelled) also records its webhook's
`ended` delivery (`end_delivery_sql`), so a turn that ended with a webhook always has it, whatever
happens to the process after the commit (the sweep sends a delivery whose message was lost).
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Uuid, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from worker.store.turns import UNFINISHED_SQL, next_runnable_sql, poison_sql, runs_next_sql

HISTORY_HEAD = 16
"""History rows the claim statement reads (the newest): the first page `handlers.history` asks for."""


def end_delivery_sql(ended: str, *, where: str = "true") -> str:
    """The insert of the `ended` webhook delivery of each turn `ended` returns (its `id`), where `where`
    holds of that row: the turn's webhook, else its session's; none without one, and none twice.

    For a data-modifying CTE beside the statement that ends the turns, or a statement of its own
    after it in the same transaction. The delivery comes after the turn's pauses' (`ordinal`), due
    now; its body is fixed at its first attempt (`worker.runtime.webhooks.deliveries`)."""
    return f"""
    INSERT INTO webhook_deliveries (id, turn_id, event, ordinal, url, status, attempts, next_attempt_at)
    SELECT gen_random_uuid(), t.id, 'ended',
           1 + coalesce((SELECT max(d.ordinal) FROM webhook_deliveries d WHERE d.turn_id = t.id), 0),
           coalesce(t.webhook_url, s.webhook_url), 'pending', 0, clock_timestamp()
    FROM {ended} e
    JOIN turns t ON t.id = e.id
    JOIN chat_sessions s ON s.id = t.session_id
    WHERE ({where}) AND coalesce(t.webhook_url, s.webhook_url) IS NOT NULL
    ON CONFLICT DO NOTHING
    """  # noqa: S608 (composed of constant SQL)


FAST_CLAIM = text(
    f"""
    WITH relaxed AS (
        -- This statement's commit does not wait for the WAL flush (see `claim_turn`).
        SELECT set_config('synchronous_commit', 'off', true) AS synchronous_commit
    ),
    locked AS (
        SELECT s.id, s.agent_framework, s.model, s.system_prompt, s.metadata, s.webhook_url, s.tenant
        FROM chat_sessions s
        WHERE s.id = (SELECT session_id FROM turns WHERE id = :turn_id)
        FOR NO KEY UPDATE
    ),
    claimed AS (
        UPDATE turns t
        SET status = 'running',
            attempts = t.attempts + 1,
            deliveries = t.deliveries + 1,
            lease_token = :token,
            lease_expires_at = clock_timestamp() + make_interval(secs => :lease_seconds),
            worker = :worker,
            started_at = coalesce(t.started_at, clock_timestamp())
        FROM locked
        WHERE t.id = :turn_id
          AND t.session_id = locked.id
          AND t.session_id = coalesce(CAST(:session_id AS uuid), t.session_id)
          AND t.status = 'queued'
          AND NOT t.cancel_requested
          AND NOT {poison_sql("t")}
          AND {runs_next_sql("t")}
        RETURNING t.id, t.session_id, t.position, t.attempts, t.deliveries, t.reply_to, t.queue, t.webhook_url
    )
    SELECT claimed.*, locked.agent_framework, locked.model, locked.system_prompt, locked.metadata, locked.tenant,
           coalesce(claimed.webhook_url, locked.webhook_url) IS NOT NULL AS has_webhook,
           m.content, m.images,
           -- Whether an earlier attempt left steps: the journal is read only then (`resume.open_journal`).
           EXISTS (SELECT 1 FROM turn_steps st WHERE st.turn_id = claimed.id) AS has_steps,
           -- The history's newest rows, as `models.history`'s first page reads them (one round trip
           -- less per turn, `worker.runtime.delivery.claimed_store`); none for a reply_to turn.
           CASE WHEN claimed.reply_to IS NULL THEN (
               SELECT coalesce(json_agg(h ORDER BY h.position DESC), '[]')
               FROM (
                   SELECT hm.position, hm.turn_id, hm.role, hm.content, hm.tool_calls, hm.tool_call_id
                   FROM chat_messages hm JOIN turns ht ON ht.id = hm.turn_id
                   WHERE hm.session_id = claimed.session_id AND ht.status = 'succeeded'
                   ORDER BY hm.position DESC LIMIT {HISTORY_HEAD}
               ) h
           ) END AS history_head,
           ARRAY(
               SELECT kb.name FROM session_knowledge_bases skb
               JOIN knowledge_bases kb ON kb.id = skb.knowledge_base_id
               WHERE skb.session_id = claimed.session_id
                 -- Only the session's own tenant's (`models.knowledge.same_tenant`).
                 AND kb.tenant IS NOT DISTINCT FROM locked.tenant
               ORDER BY kb.name
           ) AS knowledge_bases
    FROM claimed
    JOIN locked ON true
    JOIN relaxed ON true
    JOIN chat_messages m ON m.turn_id = claimed.id AND m.role = 'user'
    """  # noqa: S608 (composed of constant SQL)
).bindparams(bindparam("session_id", value=None))  # no session given: any session


COMPLETE = text(
    f"""
    WITH prior AS (
        -- Turns of a session end in position order, so the last succeeded one before this turn
        -- holds the session's totals so far (NULL only if an older chatq stored it: counted then).
        SELECT history_turns, history_messages FROM turns
        WHERE session_id = :session_id AND status = 'succeeded' AND position < :position
        ORDER BY position DESC LIMIT 1
    ),
    done AS (
        UPDATE turns
        SET status = 'succeeded', prompt_tokens = :prompt_tokens, completion_tokens = :completion_tokens,
            total_tokens = :total_tokens, error = NULL, lease_token = NULL, lease_expires_at = NULL,
            finished_at = clock_timestamp(),
            -- the prior turn's totals, or a count when it has none (also 0 when there is no prior)
            history_turns = 1 + coalesce(
                (SELECT history_turns FROM prior),
                (SELECT count(*) FROM turns p
                 WHERE p.session_id = :session_id AND p.status = 'succeeded' AND p.position < :position)
            ),
            -- this turn's own messages: those stored before it ran (its user message) and the reply
            history_messages = (SELECT count(*) FROM chat_messages WHERE turn_id = :turn_id)
                + jsonb_array_length(:messages)
                + coalesce(
                    (SELECT history_messages FROM prior),
                    (SELECT count(*) FROM chat_messages m JOIN turns p ON p.id = m.turn_id
                     WHERE p.session_id = :session_id AND p.status = 'succeeded' AND p.position < :position)
                )
        WHERE id = :turn_id AND status = 'running' AND lease_token = :token
        RETURNING id, session_id, position
    ),
    hooked AS ({end_delivery_sql("done")}),
    stored AS (
        INSERT INTO chat_messages (session_id, turn_id, position, role, content, tool_calls, tool_call_id, citations)
        SELECT done.session_id, done.id, done.position * :stride + m.offset, m.role, m.content,
               m.tool_calls, m.tool_call_id, m.citations
        FROM done, jsonb_to_recordset(:messages)
            AS m("offset" int, role text, content text, tool_calls jsonb, tool_call_id text, citations jsonb)
    ),
    following AS (
        -- next_in's statement; this statement's snapshot still sees the turn above as running,
        -- so the rule counts it as finished.
        {next_runnable_sql(besides=":turn_id", when="EXISTS (SELECT 1 FROM done)")}
    )
    SELECT EXISTS (SELECT 1 FROM done) AS stored, following.*
    FROM (SELECT 1) AS one LEFT JOIN following ON true
    """  # noqa: S608 (composed of constant SQL)
).bindparams(bindparam("messages", type_=JSONB))


INSERT_TURN = text(
    """
    WITH taken AS (
        -- Not for a turn id that exists: outside a transaction the position could not be given back.
        UPDATE chat_sessions SET next_turn_position = next_turn_position + 1, last_active_at = now()
        WHERE id = :session_id AND NOT EXISTS (SELECT 1 FROM turns WHERE id = :turn_id)
          -- A producer that names a tenant stores only into that tenant's session (`check_tenant` says why not).
          AND (CAST(:tenant AS text) IS NULL OR tenant = CAST(:tenant AS text))
        -- The session's tenant too, from the row it updates anyway (the sender counts batch turns by tenant).
        RETURNING next_turn_position - 1 AS position, tenant
    ),
    turn AS (
        INSERT INTO turns (id, session_id, position, status, queue, reply_to)
        SELECT :turn_id, :session_id, taken.position, 'queued', :queue, :reply_to FROM taken
        ON CONFLICT (id) DO NOTHING
        RETURNING id, position
    ),
    message AS (
        INSERT INTO chat_messages (session_id, turn_id, position, role, content, images)
        SELECT :session_id, turn.id, turn.position * :stride, 'user', :content, :images FROM turn
    )
    SELECT (SELECT position FROM turn) AS position, (SELECT tenant FROM taken) AS tenant
    """
).bindparams(bindparam("images", type_=JSONB), bindparam("reply_to", type_=BigInteger), bindparam("tenant", value=None))


INSERT_DELAYED = text(
    """
    -- A turn to run from :run_at on: no position and no user message yet (its input waits in
    -- `pending_input`), so it holds no place in its session's order until RELEASE_DUE.
    INSERT INTO turns (id, session_id, position, status, queue, reply_to, webhook_url, run_at, pending_input)
    SELECT :turn_id, s.id, NULL, 'delayed', :queue, :reply_to, :webhook_url, :run_at, :pending_input
    FROM chat_sessions s
    WHERE s.id = :session_id AND (CAST(:tenant AS text) IS NULL OR s.tenant = CAST(:tenant AS text))
    ON CONFLICT (id) DO NOTHING
    RETURNING id
    """
).bindparams(
    bindparam("pending_input", type_=JSONB), bindparam("reply_to", type_=BigInteger), bindparam("tenant", value=None)
)


RELEASE_DUE = text(
    """
    -- Delayed turns due at :now (NULL: the statement's start, `now()`: stable, so the partial index
    -- ix_turns_run_at bounds the scan, which is one index page when nothing is due) move to `queued`, each with its
    -- session's next position (so it is in order from its due time) and its user message stored.
    -- Any number of workers run this at once: each takes the sessions of the earliest due turns
    -- whose row no one holds (SKIP LOCKED: it never waits on a submit, cancel, deletion or another
    -- release) and releases all their due turns, in due order, so each turn is released once and a
    -- session's turns never overtake each other. A turn another release queued since this
    -- statement's snapshot no longer matches once locked (read committed re-checks it).
    WITH sessions AS (
        SELECT s.id FROM chat_sessions s
        WHERE s.id IN (
            SELECT t.session_id FROM turns t
            WHERE t.status = 'delayed' AND t.run_at <= coalesce(CAST(:now AS timestamptz), now())
            ORDER BY t.run_at
            LIMIT :limit
        )
        FOR NO KEY UPDATE OF s SKIP LOCKED
    ),
    due AS (
        SELECT t.id, t.session_id, t.run_at, t.pending_input
        FROM turns t
        WHERE t.session_id IN (SELECT id FROM sessions)
          AND t.status = 'delayed' AND t.run_at <= coalesce(CAST(:now AS timestamptz), now())
        FOR UPDATE OF t SKIP LOCKED
    ),
    counted AS (SELECT session_id, count(*) AS n FROM due GROUP BY session_id),
    taken AS (
        UPDATE chat_sessions s SET next_turn_position = s.next_turn_position + c.n
        FROM counted c WHERE s.id = c.session_id
        RETURNING s.id, s.next_turn_position - c.n AS first, s.tenant
    ),
    placed AS (
        SELECT d.id, d.pending_input,
               taken.first + row_number() OVER (PARTITION BY d.session_id ORDER BY d.run_at, d.id) - 1 AS position
        FROM due d JOIN taken ON taken.id = d.session_id
    ),
    released AS (
        UPDATE turns t
        SET status = 'queued', position = placed.position, pending_input = NULL, enqueued_at = clock_timestamp()
        FROM placed
        WHERE t.id = placed.id
        RETURNING t.id, t.session_id, t.position, t.queue, t.reply_to,
                  placed.pending_input ->> 'content' AS content, placed.pending_input -> 'images' AS images
    ),
    message AS (
        INSERT INTO chat_messages (session_id, turn_id, position, role, content, images)
        SELECT r.session_id, r.id, r.position * :stride, 'user', r.content,
               CASE WHEN jsonb_typeof(r.images) = 'array' THEN r.images END
        FROM released r
    )
    -- With the session's tenant, from the row it updated: a tenant's batch turn counts as waiting for it.
    SELECT r.id, r.session_id, r.position, r.queue, r.reply_to, r.content, r.images, taken.tenant
    FROM released r JOIN taken ON taken.id = r.session_id
    ORDER BY r.session_id, r.position
    """
).bindparams(bindparam("now", value=None))


RECORD_STOPS = text(
    """
    UPDATE turns t
    SET stopped_worker = t.worker,
        stopped_at = t.lease_expires_at,
        lone_crashes = t.lone_crashes + CASE WHEN EXISTS (
            -- Another turn whose lease on the same worker stopped being renewed at the same moment:
            -- still running with it, or already moved on (its stop recorded).
            SELECT 1 FROM turns o
            WHERE o.id <> t.id
              AND ((o.status = 'running' AND o.worker = t.worker
                    AND o.lease_expires_at BETWEEN t.lease_expires_at - make_interval(secs => :window)
                                               AND t.lease_expires_at + make_interval(secs => :window))
                   OR (o.stopped_worker = t.worker
                       AND o.stopped_at BETWEEN t.lease_expires_at - make_interval(secs => :window)
                                            AND t.lease_expires_at + make_interval(secs => :window)))
        ) THEN 0 ELSE 1 END,
        crash_hosts = CASE WHEN h.host = ANY(t.crash_hosts) THEN t.crash_hosts ELSE t.crash_hosts || h.host END
    FROM (
        -- A Celery node name is `name@host`; a name without `@` is taken as its own host.
        SELECT id, substring(coalesce(worker, '') FROM position('@' IN coalesce(worker, '')) + 1) AS host
        FROM turns WHERE id = ANY(:turn_ids)
    ) h
    -- Only a lease that ran out: one renewed or taken over meanwhile is no stop.
    WHERE t.id = h.id AND t.status = 'running' AND t.lease_expires_at < now()
    """
).bindparams(bindparam("turn_ids", type_=ARRAY(Uuid)))


FINISH_DELIVERY = text(
    f"""
    -- `finish_turn`'s, after its update in the same transaction.
    WITH ended AS (SELECT CAST(:turn_id AS uuid) AS id)
    {end_delivery_sql("ended")}
    """
)


CANCEL = text(
    f"""
    -- A queued, delayed or paused turn ends now; a running one is asked to stop (its worker ends it,
    -- `finish_turn`). A delayed one keeps no position and gets no user message: nothing else is stored.
    WITH changed AS (
        UPDATE turns
        SET cancel_requested = true,
            status = CASE WHEN status IN ('queued', 'delayed', 'awaiting_approval') THEN 'cancelled'
                          ELSE status END,
            finished_at = CASE WHEN status IN ('queued', 'delayed', 'awaiting_approval') THEN now()
                               ELSE finished_at END,
            pending_input = NULL
        WHERE id = ANY(:turn_ids) AND (status {UNFINISHED_SQL} OR status = 'delayed')
        RETURNING id, status
    ),
    hooked AS ({end_delivery_sql("changed", where="e.status = 'cancelled'")})
    SELECT id, status FROM changed
    """  # noqa: S608 (composed of constant SQL)
).bindparams(bindparam("turn_ids", type_=ARRAY(Uuid)))


CANCEL_AT_CLAIM = text(
    f"""
    -- A claim found a cancel pending on a queued turn (asked while it ran; its worker stopped and
    -- the turn was taken over): it ends cancelled instead of running.
    WITH done AS (
        UPDATE turns t
        SET status = 'cancelled', finished_at = clock_timestamp(), lease_token = NULL, lease_expires_at = NULL
        WHERE t.id = :turn_id AND t.status = 'queued' AND t.cancel_requested AND {runs_next_sql("t")}
        RETURNING t.id, t.attempts
    ),
    hooked AS ({end_delivery_sql("done")})
    SELECT attempts FROM done
    """  # noqa: S608 (composed of constant SQL)
)


POISON_AT_CLAIM = text(
    f"""
    -- A claim found a poison turn (`worker.store.turns.poison_reason`, given as :error for the counts
    -- it was decided on): it ends failed instead of running.
    WITH done AS (
        UPDATE turns t
        SET status = 'failed', error = :error, finished_at = clock_timestamp(), lease_token = NULL,
            lease_expires_at = NULL
        WHERE t.id = :turn_id AND t.status = 'queued' AND NOT t.cancel_requested AND {runs_next_sql("t")}
          AND {poison_sql("t")}
          AND t.deliveries = :deliveries AND t.lone_crashes = :lone_crashes AND cardinality(t.crash_hosts) = :hosts
        RETURNING t.id, t.attempts
    ),
    hooked AS ({end_delivery_sql("done")})
    SELECT attempts FROM done
    """  # noqa: S608 (composed of constant SQL)
)


WHY_NOT_CLAIMED = text(
    f"""
    -- Read only: why FAST_CLAIM took nothing, the cases in the order they are decided. A running
    -- turn whose lease is out ('stopped') is taken over (RECORD_STOPS, RELEASE) and claimed again;
    -- 'cancel_pending' and 'poison' end it (CANCEL_AT_CLAIM, POISON_AT_CLAIM); 'runnable' is a
    -- turn that changed since the claim statement's snapshot (claimed again).
    SELECT CASE
               WHEN t.session_id <> coalesce(CAST(:session_id AS uuid), t.session_id) THEN 'conflict'
               WHEN NOT (t.status {UNFINISHED_SQL}) THEN 'finished'
               WHEN t.status = 'awaiting_approval' THEN 'paused'
               WHEN t.status = 'running' AND (t.lease_expires_at IS NULL OR t.lease_expires_at >= clock_timestamp())
                   THEN 'busy'
               WHEN NOT {runs_next_sql("t")} THEN 'blocked'
               WHEN t.status = 'running' THEN 'stopped'
               WHEN t.cancel_requested THEN 'cancel_pending'
               WHEN {poison_sql("t")} THEN 'poison'
               ELSE 'runnable'
           END AS why,
           t.session_id, t.deliveries, t.lone_crashes, t.crash_hosts,
           CAST(extract(epoch FROM t.lease_expires_at - clock_timestamp()) AS float8) AS lease_left
    FROM turns t
    WHERE t.id = :turn_id
    """  # noqa: S608 (composed of constant SQL)
).bindparams(bindparam("session_id", value=None))  # no session given: any session


ENSURE_TURN = text(
    f"""
    -- A delivered message whose turn the claim statement did not take (`claims.claim_message`): a
    -- turn that arrived only as a task message (a raw producer's) is stored, with its session made
    -- with the defaults when nobody created it (unless it was deleted: a message left in Redis) and
    -- its user message; for a turn that exists nothing is written and WHY_NOT_CLAIMED's row says
    -- why the claim took nothing. One statement, one round trip either way. INSERT_TURN's UPDATE
    -- cannot see a session this statement creates, so a new session takes position 0 here. A message
    -- naming a tenant gives it to the session it creates, and stores into an existing one only if
    -- that is the tenant's (`check_tenant` says why not).
    WITH fresh AS (
        INSERT INTO chat_sessions (id, agent_framework, model, metadata, next_turn_position, tenant)
        SELECT :session_id, 'langgraph', NULL, '{{}}'::jsonb, 1, CAST(:tenant AS text)
        WHERE NOT EXISTS (SELECT 1 FROM turns WHERE id = :turn_id)
          -- A new session holds no message to reply to.
          AND CAST(:reply_to AS bigint) IS NULL
          -- Visible to this statement: a session being deleted meanwhile is left alone (the
          -- UPDATE below then finds it gone, and the caller looks again).
          AND NOT EXISTS (SELECT 1 FROM chat_sessions WHERE id = :session_id)
          AND NOT EXISTS (SELECT 1 FROM deleted_sessions WHERE digest = :digest)
        ON CONFLICT (id) DO NOTHING
        RETURNING 0 AS position
    ),
    taken AS (
        UPDATE chat_sessions SET next_turn_position = next_turn_position + 1, last_active_at = now()
        WHERE id = :session_id AND NOT EXISTS (SELECT 1 FROM turns WHERE id = :turn_id)
          AND (CAST(:tenant AS text) IS NULL OR tenant = CAST(:tenant AS text))
          AND (CAST(:reply_to AS bigint) IS NULL OR EXISTS (
              SELECT 1 FROM chat_messages r WHERE r.id = :reply_to AND r.session_id = :session_id AND r.role = 'user'
          ))
        RETURNING next_turn_position - 1 AS position
    ),
    turn AS (
        INSERT INTO turns (id, session_id, position, status, queue, reply_to)
        SELECT :turn_id, :session_id, place.position, 'queued', :queue, :reply_to
        FROM (SELECT position FROM fresh UNION ALL SELECT position FROM taken) AS place
        ON CONFLICT (id) DO NOTHING
        RETURNING id, position
    ),
    message AS (
        INSERT INTO chat_messages (session_id, turn_id, position, role, content, images)
        SELECT :session_id, turn.id, turn.position * :stride, 'user', :content, :images FROM turn
    ),
    why AS ({WHY_NOT_CLAIMED.text})
    SELECT (SELECT position FROM turn) AS position, why.*
    FROM (SELECT 1) AS one LEFT JOIN why ON true
    """  # noqa: S608 (composed of constant SQL)
).bindparams(bindparam("images", type_=JSONB), bindparam("reply_to", type_=BigInteger), bindparam("tenant", value=None))


RELEASE = text(
    """
    -- Expired leases back to the queue (their stops already recorded), so a re-sent message claims them.
    UPDATE turns SET status = 'queued', lease_token = NULL, lease_expires_at = NULL, enqueued_at = now()
    WHERE id = ANY(:turn_ids) AND status = 'running' AND lease_expires_at < now()
    RETURNING id
    """
).bindparams(bindparam("turn_ids", type_=ARRAY(Uuid)))


PAUSE = text(
    f"""
    -- A running turn whose tool calls wait for a person (`handlers.approvals`): it keeps its place in
    -- the session but gives up its lease, its attempt (the invocation neither failed nor finished)
    -- and its crash counts. A cancel asked while it ran ends it instead.
    WITH done AS (
        UPDATE turns t
        SET status = CASE WHEN t.cancel_requested THEN 'cancelled' ELSE 'awaiting_approval' END,
            approval_until = CASE WHEN t.cancel_requested THEN NULL
                                  ELSE clock_timestamp() + make_interval(secs => :seconds) END,
            finished_at = CASE WHEN t.cancel_requested THEN clock_timestamp() ELSE t.finished_at END,
            lease_token = NULL, lease_expires_at = NULL, attempts = t.attempts - 1,
            deliveries = 0, lone_crashes = 0, crash_hosts = '{{}}'
        WHERE t.id = :turn_id AND t.status = 'running' AND t.lease_token = :token
        RETURNING t.id, t.status, CAST(extract(epoch FROM t.approval_until) AS float8) AS until
    ),
    hooked AS ({end_delivery_sql("done", where="e.status = 'cancelled'")})
    SELECT status, until FROM done
    """  # noqa: S608 (composed of constant SQL)
)


LOCK_PAUSED = text(
    """
    -- Read under the turn's row lock: a decision and the sweep's deadline take turns.
    SELECT t.status, t.session_id, t.attempts, t.approval_until < clock_timestamp() AS expired
    FROM turns t JOIN chat_sessions s ON s.id = t.session_id
    WHERE t.id = :turn_id AND (CAST(:tenant AS text) IS NULL OR s.tenant = :tenant)
    FOR UPDATE OF t
    """
).bindparams(bindparam("tenant", value=None))


RECORD_DECISION = text(
    """
    INSERT INTO turn_steps (turn_id, seq, kind, attempt, call_id, tool_name, message)
    SELECT :turn_id, coalesce(max(seq), 0) + 1, 'approval_decided', :attempt, :call_id, :tool_name, :message
    FROM turn_steps WHERE turn_id = :turn_id
    """
).bindparams(bindparam("message", type_=JSONB))


RESUME_DECIDED = text(
    """
    -- The round's last decision is made: the paused turn is queued again (still its session's head).
    UPDATE turns SET status = 'queued', approval_until = NULL, enqueued_at = clock_timestamp()
    WHERE id = :turn_id AND status = 'awaiting_approval'
    RETURNING id
    """
)


EXPIRED_APPROVALS = text(
    """
    SELECT id FROM turns
    WHERE status = 'awaiting_approval' AND approval_until < clock_timestamp()
    ORDER BY approval_until LIMIT :limit
    """
)
