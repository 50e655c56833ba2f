//! Several instances on one database: each `daylog run` records itself in `instances`
//! and beats there, and a chat is handled and answered by the one instance holding its
//! row in `chat_leases`.
//!
//! A lease is *taken* when it is free, expired, or already this instance's; a take by
//! another instance than the last holder raises `generation`. Every write made under a
//! lease checks, in its own statement or transaction, that the chat's row still names
//! this holder and this generation ([`Fence`]): once another instance took the chat
//! over, the old holder's writes change nothing. The check is on the generation, not on
//! the clock: a lease that ran out while nobody took it over still writes (nobody else
//! did the work), which keeps a slow renewal from losing work.
//!
//! Moments are the database's clock (never an instance's): `expires_at` is UTC text
//! with milliseconds, compared as text; `last_seen` the store's usual UTC text.
//!
//! The polling singleton on PostgreSQL is a session advisory lock held on a connection
//! of its own ([`PollingLock`]): the server drops it when the process's connection
//! closes, however the process ended.

use std::time::Duration;

use sqlx::{Connection as _, PgConnection};

use super::{Db, NOW, Sql, Store, StoreError, on_db, retry_busy, returned};

/// An `instances.id`: one process start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InstanceId(pub i64);

/// What an instance records about itself when it starts.
#[derive(Debug, Clone)]
pub struct NewInstance<'a> {
    pub version: &'a str,
    pub host: &'a str,
    pub pid: i64,
    /// `"polling"` or `"webhook"`.
    pub mode: &'a str,
}

/// A chat's lease as its holder took it: what every write under it checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fence {
    pub chat_id: i64,
    pub holder: InstanceId,
    pub generation: i64,
}

/// One row of `instances`, for operators and tests.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct InstanceRow {
    pub id: i64,
    pub started_at: String,
    pub last_seen: String,
    pub version: String,
    pub host: String,
    pub pid: i64,
    pub mode: String,
    pub stopped_at: Option<String>,
}

/// The moment a lease taken now ends (`$3`: the lease in seconds, a real number).
const TAKE_LEASE: Sql = Sql {
    sqlite: "INSERT INTO chat_leases (chat_id, holder, generation, expires_at)
             VALUES ($1, $2, 1, strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || $3 || ' seconds'))
             ON CONFLICT (chat_id) DO UPDATE SET
                 generation = CASE WHEN chat_leases.holder = excluded.holder
                                   THEN chat_leases.generation
                                   ELSE chat_leases.generation + 1 END,
                 holder = excluded.holder,
                 expires_at = excluded.expires_at
             WHERE chat_leases.holder = excluded.holder
                OR chat_leases.expires_at <= strftime('%Y-%m-%d %H:%M:%f', 'now')
             RETURNING generation",
    postgres: "INSERT INTO chat_leases (chat_id, holder, generation, expires_at)
               VALUES ($1, $2, 1, daylog_utc_ms(now() + make_interval(secs => $3)))
               ON CONFLICT (chat_id) DO UPDATE SET
                   generation = CASE WHEN chat_leases.holder = excluded.holder
                                     THEN chat_leases.generation
                                     ELSE chat_leases.generation + 1 END,
                   holder = excluded.holder,
                   expires_at = excluded.expires_at
               WHERE chat_leases.holder = excluded.holder
                  OR chat_leases.expires_at <= daylog_utc_ms(now())
               RETURNING generation",
};

/// The leases of holder `$1` still in its hand (`$3`: their chat ids, a JSON array)
/// run `$2` seconds from now; the leases it still holds. A lease it gave up is not
/// among them, so it stays given up.
const RENEW_ALL: Sql = Sql {
    sqlite: "UPDATE chat_leases
             SET expires_at = strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || $2 || ' seconds')
             WHERE holder = $1 AND chat_id IN (SELECT value FROM json_each($3))
             RETURNING chat_id, generation",
    postgres: "UPDATE chat_leases
               SET expires_at = daylog_utc_ms(now() + make_interval(secs => $2))
               WHERE holder = $1
                 AND chat_id = ANY(ARRAY(SELECT value::bigint
                                         FROM json_array_elements_text($3::json)))
               RETURNING chat_id, generation",
};

/// Renews one lease (`$1` chat, `$2` holder, `$3` generation) for `$4` seconds.
const RENEW_ONE: Sql = Sql {
    sqlite: "UPDATE chat_leases
             SET expires_at = strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || $4 || ' seconds')
             WHERE chat_id = $1 AND holder = $2 AND generation = $3",
    postgres: "UPDATE chat_leases
               SET expires_at = daylog_utc_ms(now() + make_interval(secs => $4))
               WHERE chat_id = $1 AND holder = $2 AND generation = $3",
};

/// Gives a lease up (it expires now; the row and its generation stay, so the next
/// holder's take raises it).
const RELEASE_ONE: Sql = Sql {
    sqlite: "UPDATE chat_leases SET expires_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
             WHERE chat_id = $1 AND holder = $2 AND generation = $3",
    postgres: "UPDATE chat_leases SET expires_at = daylog_utc_ms(now())
               WHERE chat_id = $1 AND holder = $2 AND generation = $3",
};

const RELEASE_ALL: Sql = Sql {
    sqlite: "UPDATE chat_leases SET expires_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
             WHERE holder = $1",
    postgres: "UPDATE chat_leases SET expires_at = daylog_utc_ms(now()) WHERE holder = $1",
};

/// Whether a lease (`$1` chat, `$2` holder, `$3` generation) is still the chat's: a
/// transaction's writes under it check this first ([`fence_holds!`]).
///
/// On PostgreSQL the check locks the lease row (`FOR SHARE`) until the transaction
/// ends: a take-over (its `ON CONFLICT DO UPDATE`) then waits for the fenced writes to
/// commit rather than slipping in between the check and the commit. SQLite's write
/// transaction (`BEGIN IMMEDIATE`) already keeps every other writer out.
pub(super) const FENCE_HOLDS: Sql = Sql {
    sqlite: "SELECT count(*) FROM chat_leases
             WHERE chat_id = $1 AND holder = $2 AND generation = $3",
    postgres: "SELECT count(*) FROM (SELECT 1 FROM chat_leases
                                     WHERE chat_id = $1 AND holder = $2 AND generation = $3
                                     FOR SHARE) AS held",
};

/// [`super::updates::MARK_HANDLED`] under a lease (`$3` chat, `$4` holder, `$5`
/// generation): sets `handled_at` once, and touches the row only while the lease is
/// still the chat's — one affected row means the fence held.
pub(super) const FENCED_MARK_HANDLED: Sql = Sql {
    sqlite: "UPDATE updates SET handled_at = coalesce(handled_at, datetime('now'))
             WHERE bot_id = $1 AND update_id = $2
               AND EXISTS (SELECT 1 FROM chat_leases
                           WHERE chat_id = $3 AND holder = $4 AND generation = $5)",
    postgres: "UPDATE updates SET handled_at = coalesce(handled_at, daylog_utc(now()))
               WHERE bot_id = $1 AND update_id = $2
                 AND EXISTS (SELECT 1 FROM chat_leases
                             WHERE chat_id = $3 AND holder = $4 AND generation = $5
                             FOR SHARE)",
};

/// Inside a write transaction (`in_write_tx!`): ends it with [`StoreError::Fenced`]
/// (rolled back) unless `$fence` is still its chat's lease.
macro_rules! fence_holds {
    ($pool:expr, $conn:expr, $fence:expr) => {{
        let fence: &crate::store::Fence = $fence;
        let held: i64 = sqlx::query_scalar(crate::store::cluster::FENCE_HOLDS.on($pool))
            .bind(fence.chat_id)
            .bind(fence.holder.0)
            .bind(fence.generation)
            .fetch_one(&mut *$conn)
            .await?;
        if held == 0 {
            return Err(StoreError::Fenced {
                chat_id: fence.chat_id,
            });
        }
    }};
}

/// Inside an entry's write transaction for inbox update `$key`: when that update is
/// handled under a chat's lease ([`Store::fence_update`]), ends the transaction with
/// [`StoreError::Fenced`] unless the lease is still the chat's.
macro_rules! update_fence_holds {
    ($store:expr, $pool:expr, $conn:expr, $key:expr) => {{
        if let Some(fence) = $store.update_fence($key) {
            crate::store::cluster::fence_holds!($pool, $conn, &fence);
        }
    }};
}
pub(super) use {fence_holds, update_fence_holds};

/// The leases updates are handled under, by update (see [`Store::fence_update`]).
#[derive(Debug, Clone, Default)]
pub(super) struct UpdateFences(
    std::sync::Arc<std::sync::Mutex<std::collections::HashMap<super::UpdateKey, Fence>>>,
);

impl UpdateFences {
    fn map(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<super::UpdateKey, Fence>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// `instances` rows whose heartbeat is recent: not stopped, seen within `$1` seconds.
const ALIVE: Sql = Sql {
    sqlite: "SELECT count(*) FROM instances
             WHERE stopped_at IS NULL AND last_seen >= datetime('now', '-' || $1 || ' seconds')",
    postgres: "SELECT count(*) FROM instances
               WHERE stopped_at IS NULL
                 AND last_seen >= daylog_utc(now() - make_interval(secs => $1))",
};

/// A lease in seconds, as the statements bind it.
fn seconds(lease: Duration) -> f64 {
    lease.as_secs_f64()
}

impl Store {
    /// Records a process start; its id holds the leases it takes.
    pub async fn register_instance(&self, new: &NewInstance<'_>) -> Result<InstanceId, StoreError> {
        let rows: Vec<i64> = retry_busy("register_instance", || async {
            Ok(on_db!(self, write, |pool| {
                sqlx::query_scalar(
                    "INSERT INTO instances (version, host, pid, mode)
                     VALUES ($1, $2, $3, $4) RETURNING id",
                )
                .bind(new.version)
                .bind(new.host)
                .bind(new.pid)
                .bind(new.mode)
                .fetch_all(pool)
                .await?
            }))
        })
        .await?;
        returned(rows)
            .map(InstanceId)
            .ok_or(StoreError::Sql(sqlx::Error::RowNotFound))
    }

    /// The heartbeat: `last_seen` now, and the leases of `instance` on the chats it
    /// has in hand (`chats`) renewed for `lease`. Returns the leases it still holds
    /// (one taken over is not among them; one given up is neither renewed nor among
    /// them).
    pub async fn heartbeat(
        &self,
        instance: InstanceId,
        lease: Duration,
        chats: &[i64],
    ) -> Result<Vec<Fence>, StoreError> {
        let chats = serde_json::to_string(chats).unwrap_or_else(|_| "[]".to_owned());
        let rows: Vec<(i64, i64)> = retry_busy("heartbeat", || async {
            Ok(on_db!(self, write, |pool| {
                sqlx::query(&format!(
                    "UPDATE instances SET last_seen = {now} WHERE id = $1",
                    now = NOW.on(pool)
                ))
                .bind(instance.0)
                .execute(pool)
                .await?;
                sqlx::query_as(RENEW_ALL.on(pool))
                    .bind(instance.0)
                    .bind(seconds(lease))
                    .bind(&chats)
                    .fetch_all(pool)
                    .await?
            }))
        })
        .await?;
        Ok(rows
            .into_iter()
            .map(|(chat_id, generation)| Fence {
                chat_id,
                holder: instance,
                generation,
            })
            .collect())
    }

    /// A clean stop: `stopped_at` set and every lease of `instance` given up, so other
    /// instances take its chats at once rather than after the lease.
    pub async fn instance_stopped(&self, instance: InstanceId) -> Result<(), StoreError> {
        retry_busy("instance_stopped", || async {
            on_db!(self, write, |pool| {
                sqlx::query(RELEASE_ALL.on(pool))
                    .bind(instance.0)
                    .execute(pool)
                    .await?;
                sqlx::query(&format!(
                    "UPDATE instances SET stopped_at = {now}, last_seen = {now} WHERE id = $1",
                    now = NOW.on(pool)
                ))
                .bind(instance.0)
                .execute(pool)
                .await?;
            });
            Ok(())
        })
        .await
    }

    /// Every lease of another holder given up: for the one daemon of a SQLite file
    /// (its lock file proves every other holder gone), so a restart after a crash does
    /// not wait for the dead one's leases to run out.
    pub async fn release_others(&self, instance: InstanceId) -> Result<(), StoreError> {
        const RELEASE_OTHERS: Sql = Sql {
            sqlite: "UPDATE chat_leases SET expires_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
                     WHERE holder <> $1 AND expires_at > strftime('%Y-%m-%d %H:%M:%f', 'now')",
            postgres: "UPDATE chat_leases SET expires_at = daylog_utc_ms(now())
                       WHERE holder <> $1 AND expires_at > daylog_utc_ms(now())",
        };
        retry_busy("release_others", || async {
            on_db!(self, write, |pool| {
                sqlx::query(RELEASE_OTHERS.on(pool))
                    .bind(instance.0)
                    .execute(pool)
                    .await?;
            });
            Ok(())
        })
        .await
    }

    /// Deletes the run-out leases an earlier version took for updates without a chat
    /// (one row per such update, on made-up keys below `i64::MIN / 2`, which no
    /// Telegram chat has); such updates take no lease now.
    pub async fn forget_chatless_leases(&self) -> Result<u64, StoreError> {
        const FORGET: Sql = Sql {
            sqlite: "DELETE FROM chat_leases
                     WHERE chat_id <= $1 AND expires_at <= strftime('%Y-%m-%d %H:%M:%f', 'now')",
            postgres: "DELETE FROM chat_leases
                       WHERE chat_id <= $1 AND expires_at <= daylog_utc_ms(now())",
        };
        retry_busy("forget_chatless_leases", || async {
            Ok(on_db!(self, write, |pool| {
                sqlx::query(FORGET.on(pool))
                    .bind(i64::MIN / 2)
                    .execute(pool)
                    .await?
                    .rows_affected()
            }))
        })
        .await
    }

    /// How many instances are alive: not stopped, and seen within `lease`.
    pub async fn alive_instances(&self, lease: Duration) -> Result<u64, StoreError> {
        let count: i64 = on_db!(self, read, |pool| {
            sqlx::query_scalar(ALIVE.on(pool))
                .bind(seconds(lease).ceil())
                .fetch_one(pool)
                .await?
        });
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// Every `instances` row, oldest first.
    pub async fn instances(&self) -> Result<Vec<InstanceRow>, StoreError> {
        Ok(on_db!(self, read, |pool| {
            sqlx::query_as(
                "SELECT id, started_at, last_seen, version, host, pid, mode, stopped_at
                 FROM instances ORDER BY id",
            )
            .fetch_all(pool)
            .await?
        }))
    }

    /// Takes chat `chat_id`'s lease for `instance` for `lease`: when nobody holds it,
    /// its holder's time ran out, or `instance` holds it already (then it is renewed,
    /// same generation). `None` while another instance holds it.
    pub async fn take_chat_lease(
        &self,
        chat_id: i64,
        instance: InstanceId,
        lease: Duration,
    ) -> Result<Option<Fence>, StoreError> {
        let rows: Vec<i64> = retry_busy("take_chat_lease", || async {
            Ok(on_db!(self, write, |pool| {
                sqlx::query_scalar(TAKE_LEASE.on(pool))
                    .bind(chat_id)
                    .bind(instance.0)
                    .bind(seconds(lease))
                    .fetch_all(pool)
                    .await?
            }))
        })
        .await?;
        Ok(returned(rows).map(|generation| Fence {
            chat_id,
            holder: instance,
            generation,
        }))
    }

    /// How long chat `chat_id`'s lease still runs, by the database's clock (zero when
    /// it ran out); `None` when the chat has no lease row.
    pub async fn chat_lease_left(&self, chat_id: i64) -> Result<Option<Duration>, StoreError> {
        const LEFT: Sql = Sql {
            sqlite: "SELECT (julianday(expires_at) - julianday('now')) * 86400.0
                     FROM chat_leases WHERE chat_id = $1",
            postgres: "SELECT EXTRACT(EPOCH FROM (expires_at::timestamp
                                                  - (now() AT TIME ZONE 'UTC')))::float8
                       FROM chat_leases WHERE chat_id = $1",
        };
        let left: Option<Option<f64>> = on_db!(self, read, |pool| {
            sqlx::query_scalar(LEFT.on(pool))
                .bind(chat_id)
                .fetch_optional(pool)
                .await?
        });
        Ok(left.map(|secs| {
            Duration::try_from_secs_f64(secs.unwrap_or(0.0).max(0.0)).unwrap_or(Duration::ZERO)
        }))
    }

    /// Renews one lease for `lease`; `false` when it was taken over (the holder stops
    /// working on the chat).
    pub async fn renew_chat_lease(
        &self,
        fence: &Fence,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        retry_busy("renew_chat_lease", || async {
            Ok(on_db!(self, write, |pool| {
                sqlx::query(RENEW_ONE.on(pool))
                    .bind(fence.chat_id)
                    .bind(fence.holder.0)
                    .bind(fence.generation)
                    .bind(seconds(lease))
                    .execute(pool)
                    .await?
                    .rows_affected()
                    == 1
            }))
        })
        .await
    }

    /// Gives a lease up (its chat's work here is done); nothing when it was taken over.
    pub async fn release_chat_lease(&self, fence: &Fence) -> Result<(), StoreError> {
        retry_busy("release_chat_lease", || async {
            on_db!(self, write, |pool| {
                sqlx::query(RELEASE_ONE.on(pool))
                    .bind(fence.chat_id)
                    .bind(fence.holder.0)
                    .bind(fence.generation)
                    .execute(pool)
                    .await?;
            });
            Ok(())
        })
        .await
    }

    /// The statement a write transaction under a lease runs first (binds: chat, holder,
    /// generation; one row, a count): for tests that hold such a transaction open.
    #[doc(hidden)]
    pub fn fence_check_statement(&self) -> &'static str {
        match &self.db {
            Db::Sqlite(_) => FENCE_HOLDS.sqlite,
            Db::Postgres(_) => FENCE_HOLDS.postgres,
        }
    }

    /// Whether `fence` is still its chat's lease (a read of the writer's view).
    pub async fn fence_holds(&self, fence: &Fence) -> Result<bool, StoreError> {
        let held: i64 = on_db!(self, write, |pool| {
            sqlx::query_scalar(FENCE_HOLDS.on(pool))
                .bind(fence.chat_id)
                .bind(fence.holder.0)
                .bind(fence.generation)
                .fetch_one(pool)
                .await?
        });
        Ok(held > 0)
    }

    /// Marks an update handled under its chat's lease, in one statement: `false`, and
    /// nothing written, when the lease was taken over (the new holder handles it).
    pub async fn mark_update_handled_fenced(
        &self,
        key: super::UpdateKey,
        fence: &Fence,
    ) -> Result<bool, StoreError> {
        retry_busy("mark_update_handled_fenced", || async {
            Ok(on_db!(self, write, |pool| {
                sqlx::query(FENCED_MARK_HANDLED.on(pool))
                    .bind(key.bot_id)
                    .bind(key.update_id)
                    .bind(fence.chat_id)
                    .bind(fence.holder.0)
                    .bind(fence.generation)
                    .execute(pool)
                    .await?
                    .rows_affected()
                    == 1
            }))
        })
        .await
    }

    /// The final answer of log `id` reached its user, recorded under its chat's lease:
    /// [`StoreError::Fenced`], nothing written, when the lease was taken over. One
    /// answer through the journal's group commit ([`Store::mark_replied_all`]).
    pub async fn mark_replied_fenced(
        &self,
        id: super::LogId,
        fence: &Fence,
    ) -> Result<(), StoreError> {
        let taken_over = self.mark_replied_all(&[(id, Some(*fence))]).await?;
        if taken_over.is_empty() {
            Ok(())
        } else {
            Err(StoreError::Fenced {
                chat_id: fence.chat_id,
            })
        }
    }

    /// Update `key` is handled under `fence` (`Some`) from now on, or no longer
    /// (`None`): the entry writes that mark it handled check that lease first.
    pub fn fence_update(&self, key: super::UpdateKey, fence: Option<Fence>) {
        let mut map = self.fences.map();
        match fence {
            Some(fence) => map.insert(key, fence),
            None => map.remove(&key),
        };
    }

    /// The lease update `key` is handled under, if any.
    pub(super) fn update_fence(&self, key: super::UpdateKey) -> Option<Fence> {
        self.fences.map().get(&key).copied()
    }

    /// Tells every instance listening (PostgreSQL `LISTEN daylog_inbox`) that chat
    /// `chat_id` has updates this instance could not take (another holds its lease).
    /// Nothing on SQLite.
    pub async fn notify_inbox(&self, chat_id: i64) -> Result<(), StoreError> {
        if let Db::Postgres(pool) = &self.db {
            sqlx::query("SELECT pg_notify('daylog_inbox', $1)")
                .bind(chat_id.to_string())
                .execute(pool)
                .await?;
        }
        Ok(())
    }

    /// A listener of `daylog_inbox` (see [`Store::notify_inbox`]) on a connection of
    /// its own; `None` on SQLite.
    pub async fn inbox_listener(&self) -> Result<Option<sqlx::postgres::PgListener>, StoreError> {
        let Db::Postgres(pool) = &self.db else {
            return Ok(None);
        };
        let mut listener = sqlx::postgres::PgListener::connect_with(pool.sqlx_pool()).await?;
        listener.listen("daylog_inbox").await?;
        Ok(Some(listener))
    }

    /// One polling instance per database: on PostgreSQL, a session advisory lock on a
    /// connection of its own, held until the returned lock is dropped or the process
    /// ends; `None` while another instance holds it. On SQLite the lock file beside the
    /// database already keeps a second daemon out: always granted.
    pub async fn try_polling_lock(&self) -> Result<Option<PollingLock>, StoreError> {
        let Db::Postgres(pool) = &self.db else {
            return Ok(Some(PollingLock(None)));
        };
        let Some(mut conn) = pool.acquire().await?.detach() else {
            return Err(StoreError::Sql(sqlx::Error::PoolClosed));
        };
        let held: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(POLLING_LOCK_KEY)
            .fetch_one(&mut conn)
            .await?;
        if held {
            Ok(Some(PollingLock(Some(conn))))
        } else {
            let _ = conn.close().await;
            Ok(None)
        }
    }
}

/// The advisory lock's key: "daylog" in ASCII.
const POLLING_LOCK_KEY: i64 = 0x6461_796c_6f67;

/// The polling singleton ([`Store::try_polling_lock`]): released when dropped (its
/// connection closes) or when the process ends.
#[derive(Debug)]
pub struct PollingLock(Option<PgConnection>);

impl PollingLock {
    /// Whether the lock is still held: its connection answers (a server restart ends
    /// the session, and with it the lock).
    pub async fn still_held(&mut self) -> bool {
        let Some(conn) = self.0.as_mut() else {
            return true;
        };
        conn.ping().await.is_ok()
    }
}
