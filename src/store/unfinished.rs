//! The worker's side of a log: the analysis outcome and reply states, and the queries
//! for what is still unfinished (pending logs due a try, answers not yet sent).

use std::time::Duration;

use std::borrow::Cow;

use super::{
    DayLog, Fence, FrontEnd, LOG_COLUMNS, LogId, LogStatus, NOW, Sql, Store, StoreError,
    in_write_tx, on_db, retry_busy,
};
use crate::domain::Outcome;

/// What a write under a chat's lease adds to its `WHERE`: the lease is still the chat's
/// (`$C` chat, `$H` holder, `$G` generation: see [`still_held`]). On PostgreSQL it locks
/// the lease's row until the write commits, so a take-over waits for the write rather
/// than slipping in between the check and the commit.
const STILL_HELD: Sql = Sql {
    sqlite: "EXISTS (SELECT 1 FROM chat_leases
                     WHERE chat_id = $C AND holder = $H AND generation = $G)",
    postgres: "EXISTS (SELECT 1 FROM chat_leases
                       WHERE chat_id = $C AND holder = $H AND generation = $G FOR SHARE)",
};

/// `sql` itself, or — under a lease — `sql AND` [`STILL_HELD`] with the lease bound from
/// `$first` on.
fn fenced<'a, P: super::Backend>(
    sql: &'a str,
    fence: Option<&Fence>,
    first: usize,
    pool: &P,
) -> Cow<'a, str> {
    if fence.is_none() {
        return Cow::Borrowed(sql);
    }
    let held = STILL_HELD
        .on(pool)
        .replace("$C", &format!("${first}"))
        .replace("$H", &format!("${}", first + 1))
        .replace("$G", &format!("${}", first + 2));
    Cow::Owned(format!("{sql} AND {held}"))
}

/// Records of answers that went out ([`Store::mark_replied_all`]) of which at least one
/// was sent under a chat's lease (`$1`: a JSON array of `{id, chat, holder,
/// generation}`, the last three null without a lease). PostgreSQL's one statement sets
/// `replied_at` of those whose lease is still their chat's and returns their ids;
/// SQLite (whose single daemon never has a lease taken over) reads them first, in the
/// same transaction. PostgreSQL updates the logs by their ids through the primary key
/// (`= ANY(ARRAY(…))`): `IN (SELECT …)` was planned as a hash join over a scan of every
/// log while the planner took the answers for 50 and the table for a few thousand rows.
const ANSWERED: &str =
    "SELECT CAST(json_extract(a.value, '$.id') AS INTEGER) FROM json_each($1) AS a
     WHERE json_extract(a.value, '$.holder') IS NULL
        OR EXISTS (SELECT 1 FROM chat_leases AS l
                   WHERE l.chat_id = json_extract(a.value, '$.chat')
                     AND l.holder = json_extract(a.value, '$.holder')
                     AND l.generation = json_extract(a.value, '$.generation'))";
/// The record of answers sent on PostgreSQL, in one statement (see [`ANSWERED`]).
pub const MARK_ANSWERED_POSTGRES_SQL: &str = "WITH answered AS (
         SELECT id, chat, holder, generation
         FROM json_to_recordset(CAST($1 AS json))
             AS a(id BIGINT, chat BIGINT, holder BIGINT, generation BIGINT)),
     held AS (
         SELECT a.id FROM answered AS a
         WHERE a.holder IS NULL
            OR EXISTS (SELECT 1 FROM chat_leases AS l
                       WHERE l.chat_id = a.chat AND l.holder = a.holder
                         AND l.generation = a.generation
                       FOR SHARE)),
     marked AS (
         UPDATE day_logs SET replied_at = daylog_utc(now())
         WHERE id = ANY(ARRAY(SELECT id FROM held)) AND status <> 'pending')
     SELECT id FROM held";

/// What the worker has to finish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unfinished {
    /// Pending and due: run the analysis again.
    Analyse,
    /// Analysed (or blocked/failed) but the reply never went out: send it.
    Reply,
}

impl Unfinished {
    fn classify(log: DayLog) -> (Self, DayLog) {
        let kind = if log.status == LogStatus::Pending {
            Self::Analyse
        } else {
            Self::Reply
        };
        (kind, log)
    }
}

/// A pending log whose next try is due.
const UNFINISHED_PENDING: &str = "status = 'pending' AND coalesce(next_attempt_at, '') <= {now}";

/// See [`Store::defer_to_free_slot`]: `?1` the log, `?2` its user, `?3` the limit less
/// one. The entries that count are the user's of the last hour (through
/// `day_logs_user_created`) and those of any age still waiting for their slot (through
/// `day_logs_deferred`), each at the moment of its analysis: its slot, or when it was
/// stored. Returns the seconds the log now waits.
pub const DEFER_TO_FREE_SLOT_SQL: &str = DEFER_TO_FREE_SLOT.sqlite;

/// [`DEFER_TO_FREE_SLOT_SQL`] on both backends.
const DEFER_TO_FREE_SLOT: Sql = Sql {
    sqlite: "UPDATE day_logs SET waiting_for = 'deferred',
         next_attempt_at = coalesce(
             (SELECT datetime(moment, '+1 hour') FROM (
                  SELECT e.created_at AS moment FROM day_logs e
                  WHERE e.user_id = ?2 AND e.id < ?1
                    AND e.created_at >= datetime('now', '-1 hour')
                    AND NOT (e.status = 'pending' AND e.waiting_for IS 'deferred')
                  UNION ALL
                  SELECT w.next_attempt_at FROM day_logs w
                  WHERE w.user_id = ?2 AND w.id < ?1
                    AND w.status = 'pending' AND w.waiting_for = 'deferred')
              ORDER BY moment DESC LIMIT 1 OFFSET ?3),
             datetime('now', '+1 hour'))
     WHERE id = ?1 AND status = 'pending'
     RETURNING max(0, unixepoch(next_attempt_at) - unixepoch('now'))",
    postgres: "UPDATE day_logs SET waiting_for = 'deferred',
         next_attempt_at = coalesce(
             (SELECT daylog_utc(daylog_moment(moment) + interval '1 hour') FROM (
                  SELECT e.created_at AS moment FROM day_logs e
                  WHERE e.user_id = $2 AND e.id < $1
                    AND e.created_at >= daylog_utc(now() - interval '1 hour')
                    AND NOT (e.status = 'pending'
                             AND e.waiting_for IS NOT DISTINCT FROM 'deferred')
                  UNION ALL
                  SELECT w.next_attempt_at FROM day_logs w
                  WHERE w.user_id = $2 AND w.id < $1
                    AND w.status = 'pending' AND w.waiting_for = 'deferred') AS counted
              ORDER BY moment DESC LIMIT 1 OFFSET $3),
             daylog_utc(now() + interval '1 hour'))
     WHERE id = $1 AND status = 'pending'
     RETURNING CAST(greatest(0, floor(extract(epoch FROM daylog_moment(next_attempt_at)))
                                - floor(extract(epoch FROM now()))) AS BIGINT)",
};

/// A decided log whose answer has not gone out and is not waiting for a delivery retry
/// (read through the `day_logs_unreplied` index, which holds only such rows).
pub const UNFINISHED_REPLY: &str =
    "status IN ('analyzed', 'blocked', 'failed') AND replied_at IS NULL
     AND (next_attempt_at IS NULL OR next_attempt_at <= datetime('now'))";

/// [`UNFINISHED_REPLY`] with the moment of the statement left as `{now}` ([`NOW`]).
const UNFINISHED_REPLY_AT: &str =
    "status IN ('analyzed', 'blocked', 'failed') AND replied_at IS NULL
     AND (next_attempt_at IS NULL OR next_attempt_at <= {now})";

/// A `{now}` of one of the conditions above, spelt for `pool`'s backend.
fn at_now<P: super::Backend>(condition: &str, pool: &P) -> String {
    condition.replace("{now}", NOW.on(pool))
}

/// A condition that makes a write of progress (what a round decided about a log)
/// commit without waiting for the disk, as SQLite's `synchronous = NORMAL` commits it
/// ([`super::durable`]): on PostgreSQL the transaction's `synchronous_commit` is off,
/// so the commit returns before the server's WAL flush, and the next commit that does
/// wait (an entry, the record of a reply sent) flushes it too, as the server's WAL
/// writer does within a fraction of a second. Only a crash of the server (or of the
/// machine) in between forgets it, and then the log is analysed again — it was not
/// answered yet, or that answer's record, which waits for the flush, was forgotten as
/// well, the window the promise allows. Nothing on SQLite.
const PROGRESS: Sql = Sql {
    sqlite: "",
    postgres: " AND set_config('synchronous_commit', 'off', true) = 'off'",
};

impl Store {
    /// Records what a round decided about `analysed_text` ([`Outcome`]), in one
    /// statement. Returns `false`, changing nothing, when the log's text is no longer
    /// that text (edited meanwhile) or it is no longer pending: a result is stored only
    /// for the text it was made from.
    ///
    /// An analysis or a refusal counts an attempt and waits for its reply; a wait
    /// counts an attempt and sets the next try (metrics that came are kept with the
    /// pending log); a give-up counts none.
    pub async fn record(
        &self,
        id: LogId,
        analysed_text: &str,
        outcome: &Outcome,
    ) -> Result<bool, StoreError> {
        self.record_under(id, analysed_text, outcome, None).await
    }

    /// [`Store::record`] under a chat's lease (among instances): also `false`, changing
    /// nothing, when `fence` is no longer the chat's lease (another instance took the
    /// chat over, and answers the log). The check is inside the one statement.
    pub async fn record_under(
        &self,
        id: LogId,
        analysed_text: &str,
        outcome: &Outcome,
        fence: Option<&Fence>,
    ) -> Result<bool, StoreError> {
        const DECIDED: Sql = Sql::both(
            "UPDATE day_logs SET status = $3,
                 analysis = coalesce($4, analysis), metrics = coalesce($5, metrics),
                 attempts = attempts + 1, next_attempt_at = NULL, replied_at = NULL
             WHERE id = $1 AND text = $2 AND status = 'pending'",
        );
        const WAITING: Sql = Sql {
            sqlite: "UPDATE day_logs SET attempts = attempts + 1,
                 next_attempt_at = datetime('now', '+' || $3 || ' seconds'), waiting_for = $4,
                 metrics = coalesce($5, metrics)
             WHERE id = $1 AND text = $2 AND status = 'pending'",
            postgres: "UPDATE day_logs SET attempts = attempts + 1,
                 next_attempt_at = daylog_utc(now() + make_interval(secs => $3)),
                 waiting_for = $4, metrics = coalesce($5, metrics)
             WHERE id = $1 AND text = $2 AND status = 'pending'",
        };
        const FAILED: Sql = Sql::both(
            "UPDATE day_logs SET status = 'failed', next_attempt_at = NULL, replied_at = NULL
             WHERE id = $1 AND text = $2 AND status = 'pending'",
        );
        let what = match outcome {
            Outcome::Analysed { .. } => "record analysed",
            Outcome::Blocked { .. } => "record blocked",
            Outcome::Waiting { .. } => "record waiting",
            Outcome::Failed(_) => "record failed",
        };
        // The statement and its first bind after the outcome's own.
        let (sql, first) = match outcome {
            Outcome::Analysed { .. } | Outcome::Blocked { .. } => (DECIDED, 6),
            Outcome::Waiting { .. } => (WAITING, 6),
            Outcome::Failed(_) => (FAILED, 3),
        };
        retry_busy(what, || async {
            let done = on_db!(self, write, |pool| {
                let text = format!("{}{}", sql.on(pool), PROGRESS.on(pool));
                let text = fenced(&text, fence, first, pool);
                let query = sqlx::query(&text).bind(id).bind(analysed_text);
                let query = match outcome {
                    Outcome::Analysed { analysis, metrics } => query
                        .bind(LogStatus::Analyzed.as_str())
                        .bind(analysis.as_str())
                        .bind(metrics.to_json()),
                    Outcome::Blocked { metrics } => query
                        .bind(LogStatus::Blocked.as_str())
                        .bind(None::<&str>)
                        .bind(metrics.as_ref().map(crate::domain::Metrics::to_json)),
                    Outcome::Waiting {
                        wait,
                        retry_in,
                        metrics,
                    } => query
                        .bind(retry_in.as_secs_f64())
                        .bind(wait.column())
                        .bind(metrics.as_ref().map(crate::domain::Metrics::to_json)),
                    Outcome::Failed(_) => query,
                };
                let query = match fence {
                    Some(fence) => query
                        .bind(fence.chat_id)
                        .bind(fence.holder.0)
                        .bind(fence.generation),
                    None => query,
                };
                query.execute(pool).await?.rows_affected()
            });
            Ok(done == 1)
        })
        .await
    }

    /// A provider answered again: every pending log whose analysis is waiting out the
    /// retry schedule after a failure ([`Waiting::Provider`]) is due now, so the worker
    /// answers what an outage left behind at once rather than up to
    /// `worker.retry_max_ms` later. Logs waiting for a budget, a transcription or the
    /// hourly limit keep their time. Returns how many.
    pub async fn retry_pending_now(&self) -> Result<u64, StoreError> {
        retry_busy("retry_pending_now", || async {
            Ok(on_db!(self, write, |pool| {
                sqlx::query(&format!(
                    "UPDATE day_logs SET next_attempt_at = {now}
                     WHERE status = 'pending' AND next_attempt_at > {now}
                       AND waiting_for = 'provider'",
                    now = NOW.on(pool)
                ))
                .execute(pool)
                .await?
                .rows_affected()
            }))
        })
        .await
    }

    /// Postpones a pending log over the per-user hourly limit of `limit` analyses,
    /// without counting an attempt, to when the limit has room for it: an hour after the
    /// analysis of the user's entry `limit` places before it (when it was stored, or its
    /// own slot when it waits too, however old), so that a burst beyond the limit drains
    /// `limit` entries an hour, oldest first, instead of all coming back an hour later
    /// at once. With no such entry (the limit was reached by edits' analyses), an hour
    /// from now. Returns how long the log waits.
    pub async fn defer_to_free_slot(
        &self,
        log: &DayLog,
        limit: u32,
    ) -> Result<Duration, StoreError> {
        retry_busy("defer_to_free_slot", || async {
            let rows: Vec<i64> = on_db!(self, write, |pool| {
                sqlx::query_scalar(DEFER_TO_FREE_SLOT.on(pool))
                    .bind(log.id)
                    .bind(log.user_id)
                    .bind(i64::from(limit.max(1)) - 1)
                    .fetch_all(pool)
                    .await?
            });
            Ok(Duration::from_secs(
                rows.first()
                    .map_or(3600, |&s| u64::try_from(s).unwrap_or(0)),
            ))
        })
        .await
    }

    /// Postpones a pending log without counting an attempt: a voice note's transcript
    /// that could not be shown yet (`waiting_for = 'delivery'`).
    pub async fn postpone(&self, id: LogId, retry_in: Duration) -> Result<(), StoreError> {
        self.schedule(
            "postpone",
            "UPDATE day_logs SET next_attempt_at = {later}, waiting_for = 'delivery'
             WHERE id = $1 AND status = 'pending'",
            id,
            retry_in,
        )
        .await
    }

    /// The answer could not be delivered for now (Telegram unreachable): the worker
    /// tries again after `retry_in` instead of on every poll.
    pub async fn delay_reply(&self, id: LogId, retry_in: Duration) -> Result<(), StoreError> {
        self.schedule(
            "delay_reply",
            "UPDATE day_logs SET next_attempt_at = {later}
             WHERE id = $1 AND status <> 'pending' AND replied_at IS NULL",
            id,
            retry_in,
        )
        .await
    }

    /// Runs one of the `next_attempt_at` updates above (`$1` the id, `{later}` the
    /// moment `$2` seconds from now).
    async fn schedule(
        &self,
        what: &'static str,
        sql: &'static str,
        id: LogId,
        retry_in: Duration,
    ) -> Result<(), StoreError> {
        const LATER: Sql = Sql {
            sqlite: "datetime('now', '+' || $2 || ' seconds')",
            postgres: "daylog_utc(now() + make_interval(secs => $2))",
        };
        retry_busy(what, || async {
            on_db!(self, write, |pool| {
                sqlx::query(&sql.replace("{later}", LATER.on(pool)))
                    .bind(id)
                    .bind(retry_in.as_secs_f64())
                    .execute(pool)
                    .await?
                    .rows_affected()
            });
            Ok(())
        })
        .await
    }

    /// The final answer for this log reached the user. A log that went back to pending
    /// meanwhile (edited) is left alone: its new answer is still owed.
    pub async fn mark_replied(&self, id: LogId) -> Result<(), StoreError> {
        retry_busy("mark_replied", || async {
            on_db!(self, write, |pool| {
                sqlx::query(&format!(
                    "UPDATE day_logs SET replied_at = {now} WHERE id = $1 AND status <> 'pending'",
                    now = NOW.on(pool)
                ))
                .bind(id)
                .execute(pool)
                .await?
                .rows_affected()
            });
            Ok(())
        })
        .await
    }

    /// [`Store::mark_replied`] for several answers in one statement (the journal's group
    /// commit of answers sent at once): one commit for all, on both backends. An answer
    /// sent under a chat's lease (its [`Fence`]) is recorded only while that lease is
    /// still the chat's, checked in the same statement; returns the logs whose lease was
    /// taken over (nothing written for them: their new holder answers them).
    pub async fn mark_replied_all(
        &self,
        answers: &[(LogId, Option<Fence>)],
    ) -> Result<Vec<LogId>, StoreError> {
        if answers.iter().all(|(_, fence)| fence.is_none()) {
            let ids: Vec<LogId> = answers.iter().map(|(id, _)| *id).collect();
            self.mark_replied_ids(&ids).await?;
            return Ok(Vec::new());
        }
        let list = serde_json::Value::from(
            answers
                .iter()
                .map(|(id, fence)| {
                    serde_json::json!({
                        "id": id.get(),
                        "chat": fence.map(|f| f.chat_id),
                        "holder": fence.map(|f| f.holder.0),
                        "generation": fence.map(|f| f.generation),
                    })
                })
                .collect::<Vec<_>>(),
        )
        .to_string();
        let held: Vec<i64> = retry_busy("mark_replied_under", || async {
            Ok(match &self.db {
                super::Db::Postgres(pool) => {
                    sqlx::query_scalar(MARK_ANSWERED_POSTGRES_SQL)
                        .bind(&list)
                        .fetch_all(pool)
                        .await?
                }
                super::Db::Sqlite(_) => in_write_tx!(self, |pool, conn| {
                    let held: Vec<i64> = sqlx::query_scalar(ANSWERED)
                        .bind(&list)
                        .fetch_all(&mut *conn)
                        .await?;
                    let ids = serde_json::to_string(&held).unwrap_or_else(|_| "[]".to_owned());
                    sqlx::query(
                        "UPDATE day_logs SET replied_at = datetime('now')
                         WHERE id IN (SELECT value FROM json_each($1)) AND status <> 'pending'",
                    )
                    .bind(ids)
                    .execute(&mut *conn)
                    .await?;
                    let _ = pool;
                    Ok(held)
                })?,
            })
        })
        .await?;
        Ok(answers
            .iter()
            .map(|(id, _)| *id)
            .filter(|id| !held.contains(&id.get()))
            .collect())
    }

    /// [`Store::mark_replied_all`] of answers sent under no lease.
    async fn mark_replied_ids(&self, ids: &[LogId]) -> Result<(), StoreError> {
        const ALL: Sql = Sql {
            sqlite: "UPDATE day_logs SET replied_at = datetime('now')
                     WHERE id IN (SELECT value FROM json_each($1)) AND status <> 'pending'",
            postgres: "UPDATE day_logs SET replied_at = daylog_utc(now())
                       WHERE id = ANY(ARRAY(SELECT CAST(value AS BIGINT)
                                            FROM json_array_elements_text(CAST($1 AS json))))
                         AND status <> 'pending'",
        };
        if let [id] = ids {
            return self.mark_replied(*id).await;
        }
        let list = serde_json::to_string(&ids.iter().map(|id| id.get()).collect::<Vec<i64>>())
            .unwrap_or_else(|_| "[]".to_owned());
        retry_busy("mark_replied_all", || async {
            on_db!(self, write, |pool| {
                sqlx::query(ALL.on(pool))
                    .bind(&list)
                    .execute(pool)
                    .await?
                    .rows_affected()
            });
            Ok(())
        })
        .await
    }

    /// How many entries wait for their analysis (`status = 'pending'`), of every front
    /// end: the `daylog_entries_pending` gauge.
    pub async fn pending_count(&self) -> Result<u64, StoreError> {
        let count: i64 = on_db!(self, read, |pool| {
            sqlx::query_scalar("SELECT count(*) FROM day_logs WHERE status = 'pending'")
                .fetch_one(pool)
                .await?
        });
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// Logs the worker of `front_end` must finish: pending ones whose retry is due, and
    /// any that were decided (analysed, blocked, failed) but whose answer never went out
    /// (and is not waiting for a delivery retry). Only that front end's own logs (docs/behaviour.md,
    /// The worker). Oldest first.
    pub async fn unfinished(
        &self,
        front_end: FrontEnd,
        limit: i64,
    ) -> Result<Vec<(Unfinished, DayLog)>, StoreError> {
        self.unfinished_where(front_end, None, limit).await
    }

    /// [`Store::unfinished`] of one chat only, all of them: what a chat taken over from
    /// another instance has left to do.
    pub async fn unfinished_in_chat(
        &self,
        front_end: FrontEnd,
        chat_id: i64,
    ) -> Result<Vec<(Unfinished, DayLog)>, StoreError> {
        self.unfinished_where(front_end, Some(chat_id), i64::MAX)
            .await
    }

    async fn unfinished_where(
        &self,
        front_end: FrontEnd,
        chat_id: Option<i64>,
        limit: i64,
    ) -> Result<Vec<(Unfinished, DayLog)>, StoreError> {
        // One chat's says so outright: PostgreSQL's generic plan of `$4 IS NULL OR
        // chat_id = $4` cannot use the chat's index, and read every pending log.
        let chat = if chat_id.is_some() {
            "chat_id = $4"
        } else {
            "($4 IS NULL OR chat_id = $4)"
        };
        let own = format!("source = $2 AND ($3 IS NULL OR user_id = $3) AND {chat}");
        let rows = on_db!(self, read, |pool| {
            sqlx::query_as::<_, DayLog>(&format!(
                "SELECT {LOG_COLUMNS} FROM day_logs WHERE {pending} AND {own}
                 UNION ALL
                 SELECT {LOG_COLUMNS} FROM day_logs WHERE {reply} AND {own}
                 ORDER BY id LIMIT $1",
                pending = at_now(UNFINISHED_PENDING, pool),
                reply = at_now(UNFINISHED_REPLY_AT, pool),
            ))
            .bind(limit)
            .bind(front_end.source().as_str())
            .bind(front_end.user_id())
            .bind(chat_id)
            .fetch_all(pool)
            .await?
        });
        Ok(rows.into_iter().map(Unfinished::classify).collect())
    }

    /// The same test as [`Store::unfinished`] for one log, read fresh through the writer:
    /// what is left to do on it now, if anything (another task may have finished it).
    pub async fn unfinished_one(
        &self,
        id: LogId,
    ) -> Result<Option<(Unfinished, DayLog)>, StoreError> {
        let log = on_db!(self, write, |pool| {
            sqlx::query_as::<_, DayLog>(&format!(
                "SELECT {LOG_COLUMNS} FROM day_logs
                 WHERE id = $1 AND (({pending}) OR ({reply}))",
                pending = at_now(UNFINISHED_PENDING, pool),
                reply = at_now(UNFINISHED_REPLY_AT, pool),
            ))
            .bind(id)
            .fetch_optional(pool)
            .await?
        });
        Ok(log.map(Unfinished::classify))
    }

    /// How long the log's text has waited: since it was stored, or since the edit that
    /// last changed it.
    pub async fn log_age(&self, id: LogId) -> Result<Option<Duration>, StoreError> {
        const AGE: Sql = Sql {
            sqlite:
                "SELECT (julianday('now') - julianday(coalesce(edited_at, created_at))) * 86400.0
                     FROM day_logs WHERE id = $1",
            postgres: "SELECT CAST(extract(epoch FROM now()
                                   - daylog_moment(coalesce(edited_at, created_at)))
                                   AS DOUBLE PRECISION)
                       FROM day_logs WHERE id = $1",
        };
        let secs: Option<f64> = on_db!(self, read, |pool| {
            sqlx::query_scalar(AGE.on(pool))
                .bind(id)
                .fetch_optional(pool)
                .await?
        });
        Ok(secs.map(|s| Duration::from_secs_f64(s.max(0.0))))
    }
}
