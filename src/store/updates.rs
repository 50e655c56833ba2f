//! The update inbox (`updates`): every Telegram update committed before it is
//! acknowledged, de-duplicated on `(bot_id, update_id)`, handled from here, and pruned.
//! Dead letters (what came with the webhook's secret but is no update) are kept beside
//! them with a negative id of their own.

use sqlx::pool::PoolConnection;
use sqlx::{FromRow, Sqlite, SqliteConnection, SqlitePool};

use super::{LEAST, Sql, Store, StoreError, in_write_tx, on_db, retry_busy, returned};
use crate::time::sql_timestamp;

/// The failures after which an update is given up (`dead = 1`).
pub const UPDATE_MAX_FAILURES: i64 = 5;

/// An inbox row's key: the bot and Telegram's update id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UpdateKey {
    pub bot_id: i64,
    pub update_id: i64,
}

/// An update to commit to the inbox.
#[derive(Debug, Clone)]
pub struct NewUpdate<'a> {
    pub update_id: i64,
    pub chat_id: Option<i64>,
    pub user_id: Option<i64>,
    /// The update's JSON as it came.
    pub payload: &'a str,
}

/// A dead letter to commit (see [`Store::insert_dead_letter`]).
#[derive(Debug, Clone)]
pub struct DeadLetter<'a> {
    /// The update's own id, when it has one (an update of an unknown shape).
    pub own_id: Option<i64>,
    /// The chat and sender its raw JSON names, if any: `/delete` erases by sender.
    pub chat_id: Option<i64>,
    pub user_id: Option<i64>,
    /// The body as it came.
    pub payload: &'a str,
    /// What was wrong (a fixed word).
    pub error: &'a str,
}

/// An update not handled yet and not dead, as the handling loop reads it.
#[derive(Debug, Clone, FromRow)]
pub struct InboxUpdate {
    pub update_id: i64,
    pub chat_id: Option<i64>,
    pub user_id: Option<i64>,
    /// `None` only if a hand edit removed it; such a row is marked handled — or when
    /// `held` (the caller holds it, [`Store::unhandled_updates_holding`]).
    pub payload: Option<String>,
    /// The payload was left out: the caller said it holds it.
    pub held: bool,
    pub failures: i64,
    /// Not before this may it be tried again (`None`: at once).
    #[sqlx(try_from = "Option<String>")]
    pub next_try_at: NextTry,
}

/// `updates.next_try_at`, parsed (text that is no moment: now).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NextTry(pub Option<jiff::Timestamp>);

#[expect(
    clippy::infallible_try_from,
    reason = "sqlx reads a column through `try_from`; text that is no moment is `now`"
)]
impl TryFrom<Option<String>> for NextTry {
    type Error = std::convert::Infallible;
    fn try_from(text: Option<String>) -> Result<Self, Self::Error> {
        Ok(Self(
            text.as_deref().and_then(crate::time::parse_sql_timestamp),
        ))
    }
}

/// A waiting row of one chat as [`Store::unhandled_updates_of_chat`] reads it: its
/// place, failures and retry time, not its payload.
#[derive(Debug, Clone, PartialEq, Eq, FromRow)]
pub struct ChatUpdate {
    pub update_id: i64,
    pub failures: i64,
    #[sqlx(try_from = "Option<String>")]
    pub next_try_at: NextTry,
}

/// What a failed try of an update did to its row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateFailure {
    /// Tried again at its `next_try_at`; this many failures so far.
    Retry(i64),
    /// The last failure allowed: the row is dead, its chat moves on.
    Dead,
}

/// What [`Store::prune_updates`] removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pruned {
    pub payloads: u64,
    pub rows: u64,
}

/// How many rows wait and how many died (the gauges).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InboxCounts {
    pub unhandled: u64,
    pub dead: u64,
}

/// Sets `handled_at` of a row (`$1` the bot, `$2` the update id) once, inside a
/// caller's transaction too: an entry's update is handled in the same transaction as
/// its `day_logs` write.
pub(super) const MARK_HANDLED: Sql = Sql {
    sqlite: "UPDATE updates SET handled_at = datetime('now')
             WHERE bot_id = $1 AND update_id = $2 AND handled_at IS NULL",
    postgres: "UPDATE updates SET handled_at = daylog_utc(now())
               WHERE bot_id = $1 AND update_id = $2 AND handled_at IS NULL",
};

/// [`MARK_HANDLED`] on SQLite with the key in `$7` and `$8`: the mark that follows an
/// entry's insert (which binds `$1`–`$6`) in one call to the connection (see
/// [`WriteTx::folded`]).
pub(super) const MARK_HANDLED_7_8_SQLITE: &str = "UPDATE updates SET handled_at = datetime('now')
     WHERE bot_id = $7 AND update_id = $8 AND handled_at IS NULL";

/// Commits one update unless its key is there already.
const INSERT_UPDATE: &str = "INSERT INTO updates (bot_id, update_id, chat_id, user_id, payload)
     VALUES ($1, $2, $3, $4, $5)
     ON CONFLICT (bot_id, update_id) DO NOTHING";

/// The most updates committed by one multi-row statement (a `getUpdates` batch holds
/// at most 100); a larger batch is committed row by row in one transaction.
const INSERT_ROWS_MAX: usize = 100;

/// [`INSERT_UPDATE`] for `rows` updates in one statement: the bot in `$1`, each row's
/// id, chat, sender and payload in the next four; it returns the ids it inserted.
fn insert_rows_text(rows: usize) -> String {
    let values: Vec<String> = (0..rows)
        .map(|row| {
            let first = 2 + row * 4;
            format!(
                "($1, ${first}, ${}, ${}, ${})",
                first + 1,
                first + 2,
                first + 3
            )
        })
        .collect();
    format!(
        "INSERT INTO updates (bot_id, update_id, chat_id, user_id, payload) VALUES {}
         ON CONFLICT (bot_id, update_id) DO NOTHING RETURNING update_id",
        values.join(", ")
    )
}

/// Whether each update, in order, is new: its id among those `inserted` (the first of
/// an id given twice in one batch; the second is a duplicate).
fn fresh_in_order(updates: &[NewUpdate<'_>], inserted: Vec<i64>) -> Vec<bool> {
    let mut inserted: std::collections::HashSet<i64> = inserted.into_iter().collect();
    updates
        .iter()
        .map(|update| inserted.remove(&update.update_id))
        .collect()
}

/// `/delete`: inside the erasure's transaction, the payloads of user `$1`'s rows handled
/// or dead go (the bare ids stay, so a re-delivery is still a duplicate). Rows still to
/// be handled keep theirs: they wait behind the press in its chat, written after it —
/// the user's new words, or a second tap.
pub(super) const ERASE_PAYLOADS: Sql = Sql::both(
    "UPDATE updates SET payload = NULL
     WHERE user_id = $1 AND payload IS NOT NULL AND (handled_at IS NOT NULL OR dead = 1)",
);

/// `/delete`: the button press that asked for it (`$1` the bot, `$2` the update id) is
/// erased and marked handled in the deletion's transaction — a crash after the commit
/// cannot leave it to be handled again without its payload.
pub(super) const ERASE_PRESS: Sql = Sql {
    sqlite: "UPDATE updates SET payload = NULL, handled_at = coalesce(handled_at, datetime('now'))
             WHERE bot_id = $1 AND update_id = $2",
    postgres: "UPDATE updates SET payload = NULL,
                   handled_at = coalesce(handled_at, daylog_utc(now()))
               WHERE bot_id = $1 AND update_id = $2",
};

/// A transaction on the writer connection that never outlives a failure. A COMMIT that
/// fails on a full disk can leave SQLite's transaction open; the connection would then
/// keep every later "commit" inside it, visible to itself and to nobody else. So a
/// failed transaction is rolled back by hand, and a connection that cannot even roll
/// back (or a transaction dropped half-way, its task cancelled) is closed, and the pool
/// opens a fresh one.
pub(super) struct WriteTx(Option<PoolConnection<Sqlite>>);

impl WriteTx {
    pub(super) async fn begin(pool: &SqlitePool) -> Result<Self, StoreError> {
        let mut conn = pool.acquire().await?;
        if let Err(error) = sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await {
            drop(conn.detach());
            return Err(error.into());
        }
        Ok(Self(Some(conn)))
    }

    /// A writer connection for a transaction written out in one text, `BEGIN IMMEDIATE;
    /// …; COMMIT`, and so sent to SQLite's connection thread in one call instead of one
    /// per statement (each call is a round trip to that thread, the largest part of an
    /// entry's CPU). SQLite only: PostgreSQL takes one statement per call. End it with
    /// [`WriteTx::finish_folded`]; dropped half-way, the connection is closed, as above.
    pub(super) async fn folded(pool: &SqlitePool) -> Result<Self, StoreError> {
        Ok(Self(Some(pool.acquire().await?)))
    }

    /// Ends a [`WriteTx::folded`]: its text committed when `work` succeeded; otherwise
    /// whatever of it ran is rolled back (the connection closed when that fails too: the
    /// text may have failed at its `BEGIN`, with nothing to roll back, or may have left
    /// a transaction SQLite cannot end).
    pub(super) async fn finish_folded<T>(
        mut self,
        work: Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let Some(mut conn) = self.0.take() else {
            return Err(StoreError::Sql(sqlx::Error::PoolClosed));
        };
        if work.is_err() && sqlx::query("ROLLBACK").execute(&mut *conn).await.is_err() {
            drop(conn.detach());
        }
        work
    }

    pub(super) fn conn(&mut self) -> Result<&mut SqliteConnection, StoreError> {
        self.0
            .as_deref_mut()
            .ok_or(StoreError::Sql(sqlx::Error::PoolClosed))
    }

    /// Commits `work`'s statements when it succeeded; rolls them back otherwise.
    pub(super) async fn finish<T>(mut self, work: Result<T, StoreError>) -> Result<T, StoreError> {
        let Some(mut conn) = self.0.take() else {
            return Err(StoreError::Sql(sqlx::Error::PoolClosed));
        };
        let outcome = match work {
            Ok(value) => match sqlx::query("COMMIT").execute(&mut *conn).await {
                Ok(_) => return Ok(value),
                Err(error) => Err(error.into()),
            },
            Err(error) => Err(error),
        };
        if sqlx::query("ROLLBACK").execute(&mut *conn).await.is_err() {
            // Rolled back by SQLite itself already, or the connection is in no state to
            // say: a fresh one is certain.
            drop(conn.detach());
        }
        outcome
    }
}

impl Drop for WriteTx {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            drop(conn.detach());
        }
    }
}

impl Store {
    /// Commits updates to the inbox in one transaction, durably. Returns, in order,
    /// whether each one is new (`false`: already there, not to be handled again).
    pub async fn insert_updates(
        &self,
        bot_id: i64,
        updates: &[NewUpdate<'_>],
    ) -> Result<Vec<bool>, StoreError> {
        if updates.is_empty() {
            return Ok(Vec::new());
        }
        if let [update] = updates {
            // One statement: no transaction around it (a webhook's request, a quiet poll).
            return self
                .durably(retry_busy("insert_update", || async {
                    let inserted = on_db!(self, write, |pool| {
                        sqlx::query(INSERT_UPDATE)
                            .bind(bot_id)
                            .bind(update.update_id)
                            .bind(update.chat_id)
                            .bind(update.user_id)
                            .bind(update.payload)
                            .execute(pool)
                            .await?
                            .rows_affected()
                    });
                    Ok(vec![inserted > 0])
                }))
                .await;
        }
        if updates.len() <= INSERT_ROWS_MAX {
            // One statement for the batch: whole or not at all, no transaction around it.
            let text = insert_rows_text(updates.len());
            return self
                .durably(retry_busy("insert_updates", || async {
                    let inserted: Vec<i64> = on_db!(self, write, |pool| {
                        let mut query = sqlx::query_scalar(&text).bind(bot_id);
                        for update in updates {
                            query = query
                                .bind(update.update_id)
                                .bind(update.chat_id)
                                .bind(update.user_id)
                                .bind(update.payload);
                        }
                        query.fetch_all(pool).await?
                    });
                    Ok(fresh_in_order(updates, inserted))
                }))
                .await;
        }
        self.durably(retry_busy("insert_updates", || async {
            in_write_tx!(self, |_pool, conn| {
                let mut fresh = Vec::with_capacity(updates.len());
                for update in updates {
                    let inserted = sqlx::query(INSERT_UPDATE)
                        .bind(bot_id)
                        .bind(update.update_id)
                        .bind(update.chat_id)
                        .bind(update.user_id)
                        .bind(update.payload)
                        .execute(&mut *conn)
                        .await?
                        .rows_affected();
                    fresh.push(inserted > 0);
                }
                Ok(fresh)
            })
        }))
        .await
    }

    /// Commits a dead letter, durably: `dead = 1`, its text in `payload`, `error` the
    /// kind of what was wrong, with the chat and sender its JSON names. With an id of
    /// its own (`Some`, an update of an unknown shape) it takes that id (`None` when
    /// that id is already there); without, the lowest id of the bot so far minus one
    /// (at most -1), chosen inside the insert, so it never takes an id Telegram could
    /// send. Returns the id it was kept under.
    pub async fn insert_dead_letter(
        &self,
        bot_id: i64,
        letter: &DeadLetter<'_>,
    ) -> Result<Option<i64>, StoreError> {
        self.durably(retry_busy("insert_dead_letter", || async {
            let rows: Vec<i64> = on_db!(self, write, |pool| match letter.own_id {
                Some(id) => {
                    sqlx::query_scalar(
                        "INSERT INTO updates
                             (bot_id, update_id, payload, dead, error, chat_id, user_id)
                         VALUES ($1, $2, $3, 1, $4, $5, $6)
                         ON CONFLICT (bot_id, update_id) DO NOTHING
                         RETURNING update_id",
                    )
                    .bind(bot_id)
                    .bind(id)
                    .bind(letter.payload)
                    .bind(letter.error)
                    .bind(letter.chat_id)
                    .bind(letter.user_id)
                    .fetch_all(pool)
                    .await?
                }
                None => {
                    // Two at once on PostgreSQL can take the same id: the loser's unique
                    // violation is "busy" (`StoreError::is_busy`) and its retry takes the
                    // next one. SQLite's writer lock orders them.
                    sqlx::query_scalar(&format!(
                        "INSERT INTO updates
                             (bot_id, update_id, payload, dead, error, chat_id, user_id)
                         SELECT $1, {least}(coalesce(min(update_id), 0), 0) - 1, $2, 1, $3, $4, $5
                         FROM updates WHERE bot_id = $1
                         RETURNING update_id",
                        least = LEAST.on(pool)
                    ))
                    .bind(bot_id)
                    .bind(letter.payload)
                    .bind(letter.error)
                    .bind(letter.chat_id)
                    .bind(letter.user_id)
                    .fetch_all(pool)
                    .await?
                }
            });
            Ok(returned(rows))
        }))
        .await
    }

    /// The bot's updates not handled and not dead, by chat and then `update_id` — the
    /// order they are handled in: at most `per_chat` of each chat (only its first while
    /// that one waits for its retry), the first of every chat before any chat's second,
    /// at most `limit` in all — so one chat with a long queue never keeps the others
    /// out. An update with no chat is a chat of its own.
    pub async fn unhandled_updates(
        &self,
        bot_id: i64,
        per_chat: i64,
        limit: i64,
    ) -> Result<Vec<InboxUpdate>, StoreError> {
        self.unhandled_updates_holding(bot_id, per_chat, limit, &[])
            .await
    }

    /// [`Store::unhandled_updates`] without the payloads of the updates in `held`
    /// (`InboxUpdate::held`): the handling loop holds them already, and under a burst it
    /// reads the table again and again while most of its rows wait in its memory.
    pub async fn unhandled_updates_holding(
        &self,
        bot_id: i64,
        per_chat: i64,
        limit: i64,
        held: &[i64],
    ) -> Result<Vec<InboxUpdate>, StoreError> {
        // One text per backend: SQLite's julianday against PostgreSQL's daylog_moment
        // (NULL for text that is no moment: not waiting), and NULL chats first on both;
        // `held` is a JSON array of ids on both.
        const UNHANDLED: Sql = Sql {
            sqlite:
                "SELECT update_id, chat_id, user_id, payload, held, failures, next_try_at FROM (
                 SELECT * FROM (
                     SELECT update_id, chat_id, user_id, failures, next_try_at,
                         CASE WHEN held THEN NULL ELSE payload END AS payload, held,
                         row_number() OVER lane AS nth,
                         coalesce(julianday(first_value(next_try_at) OVER lane)
                                  > julianday('now'), 0) AS waiting
                     FROM (SELECT *, update_id IN (SELECT value FROM json_each($4)) AS held
                           FROM updates WHERE bot_id = $1 AND handled_at IS NULL AND dead = 0)
                     WINDOW lane AS (PARTITION BY chat_id IS NULL, coalesce(chat_id, update_id)
                                     ORDER BY update_id)
                 ) AS lanes
                 WHERE nth <= CASE WHEN waiting THEN 1 ELSE $2 END
                 ORDER BY nth, chat_id, update_id LIMIT $3
             ) AS fetched
             ORDER BY chat_id, update_id",
            postgres:
                "SELECT update_id, chat_id, user_id, payload, held, failures, next_try_at FROM (
                 SELECT * FROM (
                     SELECT update_id, chat_id, user_id, failures, next_try_at,
                         CASE WHEN held THEN NULL ELSE payload END AS payload, held,
                         row_number() OVER lane AS nth,
                         coalesce(daylog_moment(first_value(next_try_at) OVER lane)
                                  > now(), false) AS waiting
                     FROM (SELECT *, update_id IN (
                                  SELECT CAST(value AS BIGINT)
                                  FROM json_array_elements_text(CAST($4 AS json))) AS held
                           FROM updates WHERE bot_id = $1 AND handled_at IS NULL AND dead = 0)
                          AS unhandled
                     WINDOW lane AS (PARTITION BY chat_id IS NULL, coalesce(chat_id, update_id)
                                     ORDER BY update_id)
                 ) AS lanes
                 WHERE nth <= CASE WHEN waiting THEN 1 ELSE $2 END
                 ORDER BY nth, chat_id NULLS FIRST, update_id LIMIT $3
             ) AS fetched
             ORDER BY chat_id NULLS FIRST, update_id",
        };
        let held = serde_json::to_string(held).unwrap_or_else(|_| "[]".to_owned());
        Ok(on_db!(self, write, |pool| {
            sqlx::query_as::<_, InboxUpdate>(UNHANDLED.on(pool))
                .bind(bot_id)
                .bind(per_chat)
                .bind(limit)
                .bind(&held)
                // The writer's view: a read connection may see a snapshot from before
                // the last `handled_at` (on a full disk the WAL index cannot grow for
                // it), and the loop would hand a handled update over again.
                .fetch_all(pool)
                .await?
        }))
    }

    /// A chat's first `limit` updates not handled and not dead, in order, without their
    /// payloads — through `updates_unhandled`, a few rows: whether the handling loop's
    /// memory of one chat is in step with the table, without reading every chat's rows.
    pub async fn unhandled_updates_of_chat(
        &self,
        bot_id: i64,
        chat_id: i64,
        limit: i64,
    ) -> Result<Vec<ChatUpdate>, StoreError> {
        Ok(on_db!(self, write, |pool| {
            sqlx::query_as::<_, ChatUpdate>(
                "SELECT update_id, failures, next_try_at FROM updates
                 WHERE bot_id = $1 AND chat_id = $2 AND handled_at IS NULL AND dead = 0
                 ORDER BY update_id LIMIT $3",
            )
            .bind(bot_id)
            .bind(chat_id)
            .bind(limit)
            .fetch_all(pool)
            .await?
        }))
    }

    /// Marks an update handled (once: a row handled already keeps its moment).
    pub async fn mark_update_handled(&self, key: UpdateKey) -> Result<(), StoreError> {
        retry_busy("mark_update_handled", || async {
            on_db!(self, write, |pool| {
                sqlx::query(MARK_HANDLED.on(pool))
                    .bind(key.bot_id)
                    .bind(key.update_id)
                    .execute(pool)
                    .await?;
            });
            Ok(())
        })
        .await
    }

    /// Records a failed try of an update: its count goes up, `error` (a fixed word)
    /// says what kind of failure, and it is tried again at `next_try_at` — unless this
    /// was failure [`UPDATE_MAX_FAILURES`]: then the row is dead, with an `error` event.
    pub async fn record_update_failure(
        &self,
        key: UpdateKey,
        error: &str,
        next_try_at: jiff::Timestamp,
    ) -> Result<UpdateFailure, StoreError> {
        let rows: Vec<(i64, i64)> = retry_busy("record_update_failure", || async {
            Ok(on_db!(self, write, |pool| {
                sqlx::query_as(
                    "UPDATE updates SET failures = failures + 1, error = $3, next_try_at = $4,
                         dead = CASE WHEN failures + 1 >= $5 THEN 1 ELSE dead END
                     WHERE bot_id = $1 AND update_id = $2
                     RETURNING failures, dead",
                )
                .bind(key.bot_id)
                .bind(key.update_id)
                .bind(error)
                .bind(sql_timestamp(next_try_at))
                .bind(UPDATE_MAX_FAILURES)
                .fetch_all(pool)
                .await?
            }))
        })
        .await?;
        match returned(rows) {
            Some((failures, dead)) if dead != 0 => {
                tracing::error!(
                    bot_id = key.bot_id,
                    update_id = key.update_id,
                    failures,
                    error,
                    "an update failed every try; it is marked dead and its chat moves on"
                );
                Ok(UpdateFailure::Dead)
            }
            Some((failures, _)) => Ok(UpdateFailure::Retry(failures)),
            None => Ok(UpdateFailure::Dead), // the row is gone (pruned by hand)
        }
    }

    /// Retention at `now`: the payload of a row handled or dead for a day is dropped,
    /// and a handled or dead row received 7 days ago goes. Rows still to be handled stay.
    pub async fn prune_updates(&self, now: jiff::Timestamp) -> Result<Pruned, StoreError> {
        let day_ago = sql_timestamp(now - jiff::SignedDuration::from_hours(24));
        let week_ago = sql_timestamp(now - jiff::SignedDuration::from_hours(24 * 7));
        retry_busy("prune_updates", || async {
            // Two statements, each whole on its own: a crash between them only leaves
            // the payloads for the next prune.
            Ok(on_db!(self, write, |pool| {
                let rows = sqlx::query(
                    "DELETE FROM updates
                     WHERE (handled_at IS NOT NULL OR dead = 1) AND received_at < $1",
                )
                .bind(&week_ago)
                .execute(pool)
                .await?
                .rows_affected();
                let payloads = sqlx::query(
                    "UPDATE updates SET payload = NULL
                     WHERE payload IS NOT NULL
                       AND ((handled_at IS NOT NULL AND handled_at < $1)
                            OR (dead = 1 AND received_at < $1))",
                )
                .bind(&day_ago)
                .execute(pool)
                .await?
                .rows_affected();
                Pruned { payloads, rows }
            }))
        })
        .await
    }

    /// Rows waiting to be handled and rows dead, of every bot (the gauges).
    pub async fn inbox_counts(&self) -> Result<InboxCounts, StoreError> {
        // Read to its end (`fetch_all`), so no read transaction stays open behind it.
        let rows: Vec<(i64, i64)> = on_db!(self, read, |pool| {
            sqlx::query_as(
                "SELECT coalesce(sum(CASE WHEN handled_at IS NULL AND dead = 0 THEN 1 ELSE 0 END), 0),
                     coalesce(sum(CASE WHEN dead = 1 THEN 1 ELSE 0 END), 0)
                 FROM updates",
            )
            .fetch_all(pool)
            .await?
        });
        let (unhandled, dead) = returned(rows).unwrap_or_default();
        Ok(InboxCounts {
            unhandled: u64::try_from(unhandled).unwrap_or(0),
            dead: u64::try_from(dead).unwrap_or(0),
        })
    }
}

impl Store {
    /// Marks an update dead at once (its payload cannot be read as an update any more:
    /// trying it again cannot help), with an `error` event.
    pub async fn mark_update_dead(&self, key: UpdateKey, error: &str) -> Result<(), StoreError> {
        retry_busy("mark_update_dead", || async {
            on_db!(self, write, |pool| {
                sqlx::query(
                    "UPDATE updates SET dead = 1, error = $3, failures = failures + 1
                     WHERE bot_id = $1 AND update_id = $2",
                )
                .bind(key.bot_id)
                .bind(key.update_id)
                .bind(error)
                .execute(pool)
                .await?;
            });
            Ok(())
        })
        .await?;
        tracing::error!(
            bot_id = key.bot_id,
            update_id = key.update_id,
            error,
            "a stored update cannot be handled; it is marked dead and its chat moves on"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_batch_in_one_statement_says_which_of_its_updates_are_new() {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("updates.db").display());
        let store = Store::open_and_migrate(&url, std::time::Duration::from_secs(5))
            .await
            .expect("store");
        let row = |update_id, payload| NewUpdate {
            update_id,
            chat_id: Some(4),
            user_id: Some(4),
            payload,
        };
        let first = store.insert_updates(1, &[row(1, "{}")]).await.expect("one");
        assert_eq!(first, [true]);
        // Already there; new; new; the same id again in the batch.
        let batch = [
            row(1, "{}"),
            row(3, "{\"a\":3}"),
            row(2, "{}"),
            row(3, "{}"),
        ];
        let fresh = store.insert_updates(1, &batch).await.expect("batch");
        assert_eq!(fresh, [false, true, true, false]);
        let rows = store.unhandled_updates(1, 8, 100).await.expect("rows");
        let kept: Vec<(i64, Option<String>)> = rows
            .into_iter()
            .map(|row| (row.update_id, row.payload))
            .collect();
        assert_eq!(
            kept,
            [
                (1, Some("{}".to_owned())),
                (2, Some("{}".to_owned())),
                (3, Some("{\"a\":3}".to_owned()))
            ],
            "the first of an id given twice is the one kept"
        );
    }
}
