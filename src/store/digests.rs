//! Weekly digests (`digests`, docs/behaviour.md, Time zones and rhythm).

use std::time::Duration;

use jiff::Timestamp;
use sqlx::FromRow;

use crate::time::{LocalTime, UserZone, sql_timestamp};

use super::{
    ChatId, DigestId, DueAt, FrontEnd, MessageId, NOW, Sql, Store, StoreError, UserId, listed_date,
    on_db, retry_busy, returned, stored_date, stored_local_time, stored_moment,
};

/// A moment `$N` seconds from the statement's (`{later}`), or before it (`{ago}`).
const LATER: Sql = Sql {
    sqlite: "datetime('now', '+' || $2 || ' seconds')",
    postgres: "daylog_utc(now() + make_interval(secs => $2))",
};
const AGO: Sql = Sql {
    sqlite: "datetime('now', '-' || $1 || ' seconds')",
    postgres: "daylog_utc(now() - make_interval(secs => $1))",
};
/// SQLite's `IS` between values that may be NULL.
const IS: Sql = Sql {
    sqlite: "IS",
    postgres: "IS NOT DISTINCT FROM",
};

/// `sql` with `{now}`, `{later}`, `{ago}` and `{is}` spelt for `pool`'s backend.
fn spelt<P: super::Backend>(sql: &str, pool: &P) -> String {
    sql.replace("{now}", NOW.on(pool))
        .replace("{later}", LATER.on(pool))
        .replace("{ago}", AGO.on(pool))
        .replace("{is}", IS.on(pool))
        .replace("{summary}", SUMMARY.on(pool))
}

/// An entry's stored summary, from its metrics JSON.
const SUMMARY: Sql = Sql {
    sqlite: "json_extract(metrics, '$.summary')",
    postgres: "(daylog_json(metrics) ->> 'summary')",
};

/// How much of an entry's text stands in for a summary it does not have yet (a stored
/// summary is at most 200 characters too).
const TEXT_STAND_IN_CHARS: i64 = 200;

/// A weekly digest (`digests`, docs/behaviour.md, Time zones and rhythm). `text` is `None` until it is written.
#[derive(Debug, Clone, PartialEq)]
pub struct Digest {
    pub id: DigestId,
    pub user_id: UserId,
    pub chat_id: ChatId,
    /// The first local day of the 7 it covers; `None` when the stored text is no date (a
    /// hand edit; a warning is logged): such a digest cannot be written.
    pub week_start: Option<jiff::civil::Date>,
    pub status: DigestStatus,
    pub text: Option<String>,
    pub attempts: i64,
    /// When it was stored (read as [`super::DayLog::created_at`] is).
    pub created_at: Timestamp,
    /// The `/week` message that asked for it; `None` for the schedule or a terminal.
    pub message_id: Option<MessageId>,
    /// The week's entries its text was written from ([`Store::week_entries_mark`]);
    /// `None` before it is written, and for a digest written before this was kept.
    pub written_from: Option<String>,
}

/// Lifecycle of a digest (`digests.status`, docs/behaviour.md, Time zones and rhythm).
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type)]
#[sqlx(type_name = "TEXT", rename_all = "lowercase")]
pub enum DigestStatus {
    /// Decided and not delivered yet (written once `text` is set).
    Pending,
    Sent,
    Failed,
}

impl DigestStatus {
    /// The stored value, as in the schema's CHECK constraint.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Sent => "sent",
            Self::Failed => "failed",
        }
    }
}

/// A `digests` row as SQLite holds it, before [`Digest`] parses its columns.
#[derive(FromRow)]
struct DigestRow {
    id: DigestId,
    user_id: UserId,
    chat_id: ChatId,
    week_start: String,
    status: DigestStatus,
    text: Option<String>,
    attempts: i64,
    created_at: String,
    message_id: Option<MessageId>,
    written_from: Option<String>,
}

impl From<DigestRow> for Digest {
    fn from(row: DigestRow) -> Self {
        Self {
            created_at: stored_moment("digests", row.id.get(), "created_at", &row.created_at),
            id: row.id,
            user_id: row.user_id,
            chat_id: row.chat_id,
            week_start: stored_date("digests", row.id.get(), "week_start", &row.week_start),
            status: row.status,
            text: row.text,
            attempts: row.attempts,
            message_id: row.message_id,
            written_from: row.written_from,
        }
    }
}

/// A digest claimed to be written and sent: on PostgreSQL the `next_attempt_at` the
/// claim wrote (another instance's claim, after this one ran out, writes a later one),
/// which the writes made under the claim check. Empty on SQLite, where one instance
/// runs and its claims are in memory: nothing to check.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DigestClaim(Option<String>);

/// A digest as its claim returned it, with the moment the claim wrote.
#[derive(FromRow)]
struct ClaimedRow {
    #[sqlx(flatten)]
    row: DigestRow,
    next_attempt_at: String,
}

impl<'r, R: sqlx::Row> FromRow<'r, R> for Digest
where
    DigestRow: FromRow<'r, R>,
{
    fn from_row(row: &'r R) -> Result<Self, sqlx::Error> {
        DigestRow::from_row(row).map(Self::from)
    }
}

const DIGEST_COLUMNS: &str = "id, user_id, chat_id, week_start, status, text, attempts, created_at,
     message_id, written_from";

/// A user whose Sunday digest is due, with what writing it needs to know.
#[derive(Debug, Clone, PartialEq)]
pub struct DueDigest {
    pub user_id: UserId,
    pub chat_id: ChatId,
    pub timezone: UserZone,
    /// The reminder's time when a reminder is on (the digest comes then); `None` also
    /// when the stored time is not `HH:MM` (a warning is logged).
    pub reminder_time: Option<LocalTime>,
    /// When it was due; also the key that [`Store::advance_digest`] moves it on by.
    pub digest_next_at: DueAt,
}

/// The fingerprint of a week's entries, `(id, text)` in id order: their count and a
/// 64-bit FNV-1a hash of them (stable across builds and versions, unlike `std`'s hasher,
/// since it is stored).
fn entries_mark(entries: &[(i64, String)]) -> String {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET;
    for (id, text) in entries {
        let length = u64::try_from(text.len()).unwrap_or(u64::MAX);
        for byte in id
            .to_le_bytes()
            .into_iter()
            .chain(length.to_le_bytes())
            .chain(text.bytes())
        {
            hash = (hash ^ u64::from(byte)).wrapping_mul(PRIME);
        }
    }
    format!("{}:{hash:016x}", entries.len())
}

/// A row of [`DUE_DIGESTS_SQL`], before [`DueDigest`] parses it.
#[derive(FromRow)]
struct DueDigestRow {
    user_id: UserId,
    chat_id: ChatId,
    timezone: String,
    reminder_time: Option<String>,
    digest_next_at: String,
}

impl DueDigestRow {
    fn read(self, store: &Store, now: Timestamp) -> DueDigest {
        DueDigest {
            digest_next_at: DueAt::read(
                self.digest_next_at,
                now,
                self.user_id,
                "users.digest_next_at",
            ),
            timezone: store.stored_zone(self.user_id, &self.timezone),
            reminder_time: self.reminder_time.and_then(|text| {
                stored_local_time("reminders", self.user_id.get(), "local_time", &text)
            }),
            user_id: self.user_id,
            chat_id: self.chat_id,
        }
    }
}

/// What [`Store::advance_digest`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum DigestAdvance {
    /// Another tick (or process) moved this user's digest on first.
    Lost,
    /// Moved on; `created` is the digest this call stored (`None` when none was asked
    /// for, or the week already had one, e.g. from a `/week` that Sunday).
    Moved { created: Option<Digest> },
}

/// The digest scheduler's query: due users, soonest first, through `users_digest_due`.
/// As in [`super::DUE_REMINDERS_SQL`], the second half takes the rows whose text sorts
/// beyond any due time written (`$5`), text that cannot be a moment, so that they are
/// due now instead of never, and the third today's rows
/// spelt with a `T`, so that they come at their moment and not after midnight.
pub const DUE_DIGESTS_SQL: &str = "SELECT u.user_id, u.chat_id, u.timezone,
            CASE WHEN r.enabled = 1 THEN r.local_time END AS reminder_time, u.digest_next_at
     FROM users u LEFT JOIN reminders r ON r.user_id = u.user_id
     WHERE u.digest_enabled = 1 AND u.digest_next_at <= $1
     UNION ALL
     SELECT u.user_id, u.chat_id, u.timezone,
            CASE WHEN r.enabled = 1 THEN r.local_time END AS reminder_time, u.digest_next_at
     FROM users u LEFT JOIN reminders r ON r.user_id = u.user_id
     WHERE u.digest_enabled = 1 AND u.digest_next_at >= $5
     UNION ALL
     SELECT u.user_id, u.chat_id, u.timezone,
            CASE WHEN r.enabled = 1 THEN r.local_time END AS reminder_time, u.digest_next_at
     FROM users u LEFT JOIN reminders r ON r.user_id = u.user_id
     WHERE u.digest_enabled = 1 AND u.digest_next_at >= $3 AND u.digest_next_at < $4
     ORDER BY digest_next_at LIMIT $2";

impl Store {
    // ---- weekly digests (docs/behaviour.md, Time zones and rhythm) ----

    /// Whether the user's Sunday digest is on (`false` for a user not stored).
    pub async fn digest_enabled(&self, user_id: UserId) -> Result<bool, StoreError> {
        Ok(on_db!(self, read, |pool| {
            sqlx::query_scalar("SELECT digest_enabled = 1 FROM users WHERE user_id = $1")
                .bind(user_id)
                .fetch_optional(pool)
                .await?
        })
        .unwrap_or(false))
    }

    /// `/digest on` (next due at `next_at`) or `/digest off` (`None`). An error when
    /// the user is not stored, so that nothing says "on" that is not.
    pub async fn set_digest(
        &self,
        user_id: UserId,
        next_at: Option<Timestamp>,
    ) -> Result<(), StoreError> {
        let next_at = next_at.map(sql_timestamp);
        self.durably(retry_busy("set_digest", || async {
            let done = on_db!(self, write, |pool| {
                sqlx::query(
                    "UPDATE users SET digest_enabled = CASE WHEN $2 IS NULL THEN 0 ELSE 1 END,
                     digest_next_at = $2
                 WHERE user_id = $1",
                )
                .bind(user_id)
                .bind(&next_at)
                .execute(pool)
                .await?
                .rows_affected()
            });
            if done == 0 {
                return Err(StoreError::Sql(sqlx::Error::RowNotFound));
            }
            Ok(())
        }))
        .await
    }

    /// A new zone or reminder time: the Sunday digest (if on) is next due at `next_at`,
    /// unless it is already due at `now`, or still due before `keep_before` (the start
    /// of `next_at`'s local day: an earlier Sunday's digest, not sent yet). Those are
    /// left to the scheduler, which sends them and moves on with the new settings,
    /// rather than skipped.
    pub async fn reschedule_digest(
        &self,
        user_id: UserId,
        next_at: Timestamp,
        now: Timestamp,
        keep_before: Timestamp,
    ) -> Result<(), StoreError> {
        let next_at = sql_timestamp(next_at);
        let now = sql_timestamp(now);
        let keep_before = sql_timestamp(keep_before);
        retry_busy("reschedule_digest", || async {
            on_db!(self, write, |pool| {
                sqlx::query(
                    "UPDATE users SET digest_next_at = $2
                 WHERE user_id = $1 AND digest_enabled = 1
                   AND (digest_next_at IS NULL
                        OR (digest_next_at > $3 AND digest_next_at >= $4))",
                )
                .bind(user_id)
                .bind(&next_at)
                .bind(&now)
                .bind(&keep_before)
                .execute(pool)
                .await?
                .rows_affected()
            });
            Ok(())
        })
        .await
    }

    /// Users whose Sunday digest is due at `now`, soonest first (see [`DUE_DIGESTS_SQL`]).
    pub async fn due_digest_users(
        &self,
        now: Timestamp,
        limit: i64,
    ) -> Result<Vec<DueDigest>, StoreError> {
        let rows: Vec<DueDigestRow> = on_db!(self, read, |pool| {
            super::due_query(DUE_DIGESTS_SQL, now, limit)
                .fetch_all(pool)
                .await?
        });
        Ok(rows.into_iter().map(|row| row.read(self, now)).collect())
    }

    /// How many entries the user has on the local days `first..=last`.
    pub async fn entries_between(
        &self,
        user_id: UserId,
        first: jiff::civil::Date,
        last: jiff::civil::Date,
    ) -> Result<i64, StoreError> {
        Ok(on_db!(self, read, |pool| {
            sqlx::query_scalar(
                "SELECT count(*) FROM day_logs WHERE user_id = $1 AND local_day BETWEEN $2 AND $3",
            )
            .bind(user_id)
            .bind(first.to_string())
            .bind(last.to_string())
            .fetch_one(pool)
            .await?
        }))
    }

    /// A fingerprint of the user's entries on the local days `first..=last`: their count
    /// and a hash of their ids and texts, so that an entry created, edited or removed
    /// changes it. Stored with a digest's text ([`Store::store_digest_text`]) and
    /// compared when the week is asked for again. With it, the number of those entries
    /// (what [`Store::entries_between`] counts), read in the same query.
    pub async fn week_entries_mark(
        &self,
        user_id: UserId,
        first: jiff::civil::Date,
        last: jiff::civil::Date,
    ) -> Result<(String, i64), StoreError> {
        let rows: Vec<(i64, String)> = on_db!(self, read, |pool| {
            sqlx::query_as(
                "SELECT id, text FROM day_logs
             WHERE user_id = $1 AND local_day BETWEEN $2 AND $3 ORDER BY id",
            )
            .bind(user_id)
            .bind(first.to_string())
            .bind(last.to_string())
            .fetch_all(pool)
            .await?
        });
        let count = i64::try_from(rows.len()).unwrap_or(i64::MAX);
        Ok((entries_mark(&rows), count))
    }

    /// (local day, summary) of the user's entries on `first..=last`, oldest first, at
    /// most `limit`, every day of them represented. An entry without a summary yet (still pending when the digest is
    /// due, or given up on) stands in with the start of its text, so that a week written
    /// during an outage is not looked back on without its last days. The text of an
    /// entry a model refused (`blocked`, or pending with a refusal on record while
    /// another step may still answer) never stands in, as it would get the digest
    /// refused too (its summary, where the metrics gave one, does); an empty entry (a
    /// voice note not yet transcribed) is left out. An entry whose stored day is
    /// no date (text that sorts between two dates) is left out too, with a warning
    /// naming it: the digest could not say which day it was.
    pub async fn summaries_between(
        &self,
        user_id: UserId,
        first: jiff::civil::Date,
        last: jiff::civil::Date,
        limit: i64,
    ) -> Result<Vec<(jiff::civil::Date, String)>, StoreError> {
        // A week of more than `limit` entries keeps every day: each day's first entry,
        // then each day's second, and so on (not the oldest `limit`, which left a busy
        // week's digest without its weekend), shown in order.
        let mut rows: Vec<(i64, String, String, i64)> = on_db!(self, read, |pool| {
            sqlx::query_as(&spelt("SELECT id, local_day, line, nth FROM (
                 SELECT id, local_day, line,
                        row_number() OVER (PARTITION BY local_day ORDER BY created_at, id) AS nth
                 FROM (
                     SELECT id, local_day, created_at,
                            coalesce(nullif(trim({summary}), ''),
                                     CASE WHEN status <> 'blocked' AND NOT EXISTS (
                                              SELECT 1 FROM llm_refusals r
                                              WHERE r.day_log_id = day_logs.id)
                                          THEN substr(trim(text), 1, CAST($5 AS INTEGER)) END) AS line
                     FROM day_logs
                     WHERE user_id = $1 AND local_day BETWEEN $2 AND $3) AS lines
                 WHERE coalesce(line, '') <> '') AS numbered
             ORDER BY nth, local_day LIMIT $4", pool))
        .bind(user_id)
        .bind(first.to_string())
        .bind(last.to_string())
        .bind(limit)
        .bind(TEXT_STAND_IN_CHARS)
        .fetch_all(pool).await?
        });
        rows.sort_by(|a, b| (&a.1, a.3).cmp(&(&b.1, b.3)));
        Ok(rows
            .into_iter()
            .filter_map(|(id, day, summary, _)| {
                let day = listed_date("day_logs", user_id, Some(id), "local_day", &day)?;
                Some((day, summary))
            })
            .collect())
    }

    /// Stores the digest of `week_start` as pending, or finds the one stored before
    /// (`UNIQUE (user_id, week_start)`); `true` when this call stored it.
    pub async fn insert_digest(
        &self,
        user_id: UserId,
        chat_id: ChatId,
        week_start: jiff::civil::Date,
        front_end: FrontEnd,
        message_id: Option<MessageId>,
    ) -> Result<(Digest, bool), StoreError> {
        let inserted = retry_busy("insert_digest", || async {
            let rows: Vec<Digest> = on_db!(self, write, |pool| {
                sqlx::query_as(&spelt(
                    &format!(
                        "INSERT INTO digests (user_id, chat_id, week_start, front_end, message_id,
                     next_attempt_at)
                 VALUES ($1, $2, $3, $4, $5, {{now}})
                 ON CONFLICT (user_id, week_start) DO NOTHING
                 RETURNING {DIGEST_COLUMNS}"
                    ),
                    pool,
                ))
                .bind(user_id)
                .bind(chat_id)
                .bind(week_start.to_string())
                .bind(front_end.source().as_str())
                .bind(message_id)
                .fetch_all(pool)
                .await?
            });
            Ok(returned(rows))
        })
        .await?;
        if let Some(digest) = inserted {
            return Ok((digest, true));
        }
        let stored = self
            .digest_of_week(user_id, week_start)
            .await?
            .ok_or(StoreError::Sql(sqlx::Error::RowNotFound))?;
        Ok((stored, false))
    }

    /// A written digest asked for again by `message_id` after its week's entries changed:
    /// the same row goes back to pending, its text, `sent_at` and tries cleared, to be
    /// written again and sent to `chat_id` (stored first, as a new one is, and aged by
    /// `worker.max_age_hours` from now). `None` when
    /// it is no longer the digest read (someone renewed or finished it meanwhile).
    pub async fn renew_digest(
        &self,
        digest: &Digest,
        chat_id: ChatId,
        front_end: FrontEnd,
        message_id: Option<MessageId>,
    ) -> Result<Option<Digest>, StoreError> {
        retry_busy("renew_digest", || async {
            let rows: Vec<Digest> = on_db!(self, write, |pool| {
                sqlx::query_as(&spelt(
                    &format!(
                        "UPDATE digests SET status = 'pending', text = NULL, written_from = NULL,
                     sent_at = NULL, attempts = 0, next_attempt_at = {{now}},
                     created_at = {{now}},
                     chat_id = $2, front_end = $3, message_id = $4
                 WHERE id = $1 AND status = $5 AND text IS NOT NULL
                   AND written_from {{is}} $6
                 RETURNING {DIGEST_COLUMNS}"
                    ),
                    pool,
                ))
                .bind(digest.id)
                .bind(chat_id)
                .bind(front_end.source().as_str())
                .bind(message_id)
                .bind(digest.status.as_str())
                .bind(&digest.written_from)
                .fetch_all(pool)
                .await?
            });
            Ok(returned(rows))
        })
        .await
    }

    /// The user's digest of `week_start`, if one is stored (read through the writer).
    pub async fn digest_of_week(
        &self,
        user_id: UserId,
        week_start: jiff::civil::Date,
    ) -> Result<Option<Digest>, StoreError> {
        Ok(on_db!(self, write, |pool| {
            sqlx::query_as(&format!(
                "SELECT {DIGEST_COLUMNS} FROM digests WHERE user_id = $1 AND week_start = $2"
            ))
            .bind(user_id)
            .bind(week_start.to_string())
            .fetch_optional(pool)
            .await?
        }))
    }

    /// The scheduler's step for one due user: moves `digest_next_at` from `due_at` (the
    /// very text it was read with) to `next_at` and, when `create` is given, stores that
    /// week's digest as pending — in one transaction, so a digest is decided exactly
    /// once however many ticks or restarts look at the same moment. A `/week` of that
    /// week written but undeliverable in the group it was asked in does not stand in the
    /// way: it is taken for the private chat, its text as written.
    pub async fn advance_digest(
        &self,
        user_id: UserId,
        due_at: &DueAt,
        next_at: Timestamp,
        create: Option<(ChatId, jiff::civil::Date)>,
    ) -> Result<DigestAdvance, StoreError> {
        let next_at = sql_timestamp(next_at);
        retry_busy("advance_digest", || async {
            on_db!(self, write, |pool| {
            let mut tx = pool.begin().await?;
            let moved = sqlx::query(
                "UPDATE users SET digest_next_at = $3
                 WHERE user_id = $1 AND digest_enabled = 1 AND digest_next_at = $2",
            )
            .bind(user_id)
            .bind(due_at.key())
            .bind(&next_at)
            .execute(&mut *tx)
            .await?;
            if moved.rows_affected() == 0 {
                tx.rollback().await?;
                return Ok(DigestAdvance::Lost);
            }
            let mut created = None;
            if let Some((chat_id, week_start)) = create {
                let rows: Vec<Digest> = sqlx::query_as(&spelt(&format!("INSERT INTO digests (user_id, chat_id, week_start, front_end, next_attempt_at)
                     VALUES ($1, $2, $3, 'telegram', {{now}})
                     ON CONFLICT (user_id, week_start) DO UPDATE SET
                         chat_id = excluded.chat_id, status = 'pending', attempts = 0,
                         front_end = 'telegram', message_id = NULL,
                         next_attempt_at = excluded.next_attempt_at
                     WHERE digests.status = 'failed' AND digests.text IS NOT NULL
                       AND digests.chat_id <> digests.user_id
                     RETURNING {DIGEST_COLUMNS}"), pool))
                .bind(user_id)
                .bind(chat_id)
                .bind(week_start.to_string())
                .fetch_all(&mut *tx)
                .await?;
                created = returned(rows);
            }
            tx.commit().await?;
            Ok(DigestAdvance::Moved { created })
            })
        })
        .await
    }

    /// One digest if it is still pending and due, read fresh through the writer (the
    /// worker's check after claiming it: someone may have finished it meanwhile).
    pub async fn due_digest(&self, id: DigestId) -> Result<Option<Digest>, StoreError> {
        Ok(on_db!(self, write, |pool| {
            sqlx::query_as(&spelt(
                &format!(
                    "SELECT {DIGEST_COLUMNS} FROM digests
             WHERE id = $1 AND status = 'pending' AND next_attempt_at <= {{now}}"
                ),
                pool,
            ))
            .bind(id)
            .fetch_optional(pool)
            .await?
        }))
    }

    /// Claims one digest to write and send, if it is still pending and due: on
    /// PostgreSQL in one statement that moves its next attempt `hold` ahead, so that
    /// another instance's worker does not take it meanwhile (and takes it after `hold`
    /// if this one dies with it). On SQLite (one instance, whose claims are in memory)
    /// the same as [`Store::due_digest`].
    pub async fn claim_digest(
        &self,
        id: DigestId,
        hold: Duration,
    ) -> Result<Option<(Digest, DigestClaim)>, StoreError> {
        if !self.is_postgres() {
            let due = self.due_digest(id).await?;
            return Ok(due.map(|digest| (digest, DigestClaim::default())));
        }
        retry_busy("claim_digest", || async {
            let rows: Vec<ClaimedRow> = on_db!(self, write, |pool| {
                sqlx::query_as(&spelt(
                    &format!(
                        "UPDATE digests SET next_attempt_at = {{later}}
                 WHERE id = $1 AND status = 'pending' AND next_attempt_at <= {{now}}
                 RETURNING {DIGEST_COLUMNS}, next_attempt_at"
                    ),
                    pool,
                ))
                .bind(id)
                .bind(hold.as_secs_f64())
                .fetch_all(pool)
                .await?
            });
            Ok(returned(rows).map(|claimed| {
                (
                    Digest::from(claimed.row),
                    DigestClaim(Some(claimed.next_attempt_at)),
                )
            }))
        })
        .await
    }

    /// Whether `claim` still holds its digest (pending, and no other instance claimed
    /// it since), renewed for `hold` from now if so: checked right before the digest is
    /// sent, so that one whose claim ran out and was taken by another instance is sent
    /// by that one only. Always `true` for an empty claim (SQLite).
    pub async fn keep_digest_claim(
        &self,
        id: DigestId,
        claim: &mut DigestClaim,
        hold: Duration,
    ) -> Result<bool, StoreError> {
        let Some(held) = claim.0.clone() else {
            return Ok(true);
        };
        let renewed: Option<String> = retry_busy("keep_digest_claim", || async {
            let rows: Vec<String> = on_db!(self, write, |pool| {
                sqlx::query_scalar(&spelt(
                    "UPDATE digests SET next_attempt_at = {later}
                 WHERE id = $1 AND status = 'pending' AND next_attempt_at = $3
                 RETURNING next_attempt_at",
                    pool,
                ))
                .bind(id)
                .bind(hold.as_secs_f64())
                .bind(&held)
                .fetch_all(pool)
                .await?
            });
            Ok(returned(rows))
        })
        .await?;
        let kept = renewed.is_some();
        if let Some(renewed) = renewed {
            claim.0 = Some(renewed);
        }
        Ok(kept)
    }

    /// Gives up `front_end`'s digests pending longer than `max_age` and returns them, so
    /// that a user who asked for one and was told it would follow hears that it will not.
    pub async fn fail_old_digests(
        &self,
        front_end: FrontEnd,
        max_age: Duration,
    ) -> Result<Vec<Digest>, StoreError> {
        retry_busy("fail_old_digests", || async {
            // Read to the end: a RETURNING write commits at its statement's end.
            Ok(on_db!(self, write, |pool| {
                sqlx::query_as(&spelt(
                    &format!(
                        "UPDATE digests SET status = 'failed'
                 WHERE status = 'pending'
                   AND created_at < {{ago}}
                   AND front_end = $2 AND ($3 IS NULL OR user_id = $3)
                 RETURNING {DIGEST_COLUMNS}"
                    ),
                    pool,
                ))
                .bind(max_age.as_secs_f64())
                .bind(front_end.source().as_str())
                .bind(front_end.user_id())
                .fetch_all(pool)
                .await?
            }))
        })
        .await
    }

    /// Pending digests of `front_end` whose next attempt is due, oldest first.
    pub async fn due_digests(
        &self,
        front_end: FrontEnd,
        limit: i64,
    ) -> Result<Vec<Digest>, StoreError> {
        Ok(on_db!(self, read, |pool| {
            sqlx::query_as(&spelt(
                &format!(
                    "SELECT {DIGEST_COLUMNS} FROM digests
             WHERE status = 'pending' AND next_attempt_at <= {{now}}
               AND front_end = $2 AND ($3 IS NULL OR user_id = $3)
             ORDER BY id LIMIT $1"
                ),
                pool,
            ))
            .bind(limit)
            .bind(front_end.source().as_str())
            .bind(front_end.user_id())
            .fetch_all(pool)
            .await?
        }))
    }

    /// The digest's text, written from the week's entries `written_from` (their
    /// [`Store::week_entries_mark`]); stored before anything is sent. `false` when it
    /// already had one (it is never written twice).
    pub async fn store_digest_text(
        &self,
        id: DigestId,
        text: &str,
        written_from: &str,
    ) -> Result<bool, StoreError> {
        self.store_claimed_digest_text(id, text, written_from, &DigestClaim::default())
            .await
    }

    /// [`Store::store_digest_text`] under `claim`: `false`, nothing written, when the
    /// claim ran out and another instance claimed the digest since (that one writes
    /// and sends it).
    pub async fn store_claimed_digest_text(
        &self,
        id: DigestId,
        text: &str,
        written_from: &str,
        claim: &DigestClaim,
    ) -> Result<bool, StoreError> {
        retry_busy("store_digest_text", || async {
            let done = on_db!(self, write, |pool| {
                sqlx::query(
                    "UPDATE digests SET text = $2, written_from = $3
                 WHERE id = $1 AND status = 'pending' AND text IS NULL
                   AND (CAST($4 AS TEXT) IS NULL OR next_attempt_at = $4)",
                )
                .bind(id)
                .bind(text)
                .bind(written_from)
                .bind(claim.0.as_deref())
                .execute(pool)
                .await?
                .rows_affected()
            });
            Ok(done == 1)
        })
        .await
    }

    /// Writing or sending failed for now: the worker tries again after `retry_in`.
    pub async fn digest_retry(&self, id: DigestId, retry_in: Duration) -> Result<(), StoreError> {
        retry_busy("digest_retry", || async {
            on_db!(self, write, |pool| {
                sqlx::query(&spelt(
                    "UPDATE digests SET attempts = attempts + 1,
                     next_attempt_at = {later}
                 WHERE id = $1 AND status = 'pending'",
                    pool,
                ))
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

    /// The digest reached the user.
    pub async fn mark_digest_sent(&self, id: DigestId) -> Result<(), StoreError> {
        self.finish_digest("mark_digest_sent", id, DigestStatus::Sent)
            .await
    }

    /// The digest can never be delivered (the user blocked the bot, a provider refused
    /// it, or it waited longer than `worker.max_age_hours`).
    pub async fn mark_digest_failed(&self, id: DigestId) -> Result<(), StoreError> {
        self.finish_digest("mark_digest_failed", id, DigestStatus::Failed)
            .await
    }

    async fn finish_digest(
        &self,
        what: &'static str,
        id: DigestId,
        status: DigestStatus,
    ) -> Result<(), StoreError> {
        retry_busy(what, || async {
            on_db!(self, write, |pool| {
                sqlx::query(&spelt(
                    "UPDATE digests SET status = $2,
                     sent_at = CASE WHEN $2 = 'sent' THEN {now} END
                 WHERE id = $1 AND status = 'pending'",
                    pool,
                ))
                .bind(id)
                .bind(status.as_str())
                .execute(pool)
                .await?
                .rows_affected()
            });
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::entries_mark;

    #[test]
    fn a_weeks_mark_changes_with_an_entry_added_edited_or_removed() {
        let week = vec![(1, "Ran".to_owned()), (2, "Slept".to_owned())];
        let mark = entries_mark(&week);
        assert_eq!(mark, entries_mark(&week.clone()), "stable");
        assert!(mark.starts_with("2:"), "{mark}");
        let mut added = week.clone();
        added.push((3, "Read".to_owned()));
        let mut edited = week.clone();
        edited[1].1 = "Slept well".to_owned();
        let removed = vec![week[0].clone()];
        // The text moved between ids is another week too.
        let shifted = vec![(1, "RanS".to_owned()), (2, "lept".to_owned())];
        for other in [added, edited, removed, shifted] {
            assert_ne!(entries_mark(&other), mark, "{other:?}");
        }
        assert_eq!(entries_mark(&[]), "0:cbf29ce484222325");
    }
}
