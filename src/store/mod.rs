//! The store: SQLite through sqlx, and the only place in daylog that talks SQL.
//!
//! Writes go through a pool of exactly one connection, so concurrent handlers queue in
//! the pool instead of racing for SQLite's write lock (no `SQLITE_BUSY` under load);
//! reads use a separate pool, which WAL lets run beside the writer. Every query that
//! serves a user filters by that user's id.
//!
//! A write succeeds only when it committed: statements are read to their end (see
//! `returned`), so a commit that fails (a full disk) is an error the caller reports,
//! never a row handed back for a write that was rolled back. `store.max_size_mb` caps
//! the file on every connection the store opens.
//!
//! Rows come back parsed, once, here (a private `…Row` type read into the public one):
//! moments as `jiff::Timestamp` (through `crate::time::parse_sql_timestamp`), local days
//! as `jiff::civil::Date`, daily times as `LocalTime`, zones as `UserZone`, statuses as
//! enums; writes take those types and format them with the one formatter
//! (`crate::time::sql_timestamp`). A stored value that does not parse (a hand edit) is
//! never an error: it is logged with its row's id, never its text, and read as the
//! fallback its field documents; a row that means nothing without its local day (a
//! day of `daily_metrics` or the year, an activity's day, a summary of the week, a
//! streak's day) is left out instead, with the same warning. The schedulers' due
//! times ([`DueAt`]) keep the text they were read from as the key of the update that
//! moves them on.
//!
//! One file per concern, each an `impl Store` block with its row types: `users`,
//! `logs` (entries, history, export, import, daily metrics, search, the year),
//! `unfinished` (the worker's states and queries), `calls` (the call recorder,
//! refusals, spent budgets), `reminders`, `digests`, `read_only` (`daylog sql`'s
//! connection). This file holds what they share: opening and migrating, the errors,
//! the one retry policy for writes. The typed ids are `crate::domain`'s, re-exported.
//! Every public item is re-exported here, so callers name `crate::store::X` whatever file it lives in.

use std::str::FromStr;
use std::time::Duration;

use sqlx::FromRow;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use crate::config::{DatabaseUrlError, database_path};
use crate::domain::Metrics;

/// SQLite's migrations: the files directly in `migrations/` (the macro skips folders).
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");
/// PostgreSQL's: `migrations/postgres/`, the same versions from the consolidated first one.
static PG_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

pub use crate::domain::{ChatId, DigestId, LogId, MessageId, UserId};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// `DATABASE_URL` names no file the store could keep entries in.
    #[error(transparent)]
    Url(#[from] DatabaseUrlError),
    #[error("cannot create the database folder {path} (DATABASE_URL): {source}")]
    CreateDir {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the database {path} does not exist (run `daylog migrate` first)")]
    Missing { path: String },
    #[error(
        "cannot open the database {path} (DATABASE_URL){}: {source}",
        cant_open_hint(source)
    )]
    Open {
        path: String,
        #[source]
        source: sqlx::Error,
    },
    #[error(
        "the database was written by a newer daylog (schema version {found}, this build knows up to {known}); upgrade daylog"
    )]
    NewerSchema { found: i64, known: i64 },
    #[error("the database schema is not up to date (run `daylog migrate`)")]
    NotMigrated,
    #[error(
        "migration {version} applied to the database differs from this build's (its file was changed after it ran); `daylog run` and `daylog migrate` refuse such a database"
    )]
    MigrationChanged { version: i64 },
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("database error: {0}")]
    Sql(#[from] sqlx::Error),
    /// A store operation that has no PostgreSQL version yet (issue 33 is under way;
    /// `DATABASE_URL` still refuses `postgres://` outside the tests).
    #[error("{0} is not available on PostgreSQL yet")]
    NotOnPostgres(&'static str),
    /// The commit returned but could not be synced to disk: not promised as kept.
    #[error("cannot sync the database to disk: {0}")]
    Sync(#[source] std::io::Error),
    /// A write under a chat's lease found the lease taken over by another instance:
    /// nothing was written (the new holder does the work).
    #[error("chat {chat_id}'s lease was taken over by another instance")]
    Fenced { chat_id: i64 },
    /// `daylog backup` could not write, sync or read back its copy (which is removed).
    #[error("the backup {path} could not be made: {message}")]
    Backup { path: String, message: String },
}

impl StoreError {
    /// Another connection held the write lock for longer than `store.busy_timeout_ms`
    /// (a `sqlite3` shell left in a transaction, a backup), or the pool queue timed out:
    /// the same write can succeed a moment later.
    pub fn is_busy(&self) -> bool {
        match self {
            // PostgreSQL: a serialization failure, a deadlock, a lock not available.
            Self::Sql(sqlx::Error::Database(error))
                if error
                    .code()
                    .is_some_and(|code| matches!(&*code, "40001" | "40P01" | "55P03")) =>
            {
                true
            }
            // PostgreSQL: two terminals (or imports) of one chat took the same next
            // negative message id in the same moment (SQLite's writer lock orders them;
            // PostgreSQL's snapshots do not): the later one takes the next id.
            Self::Sql(sqlx::Error::Database(error))
                if matches!(
                    error.constraint(),
                    Some("day_logs_chat_id_message_id_key")
                        // Two dead letters without an id of their own took the same
                        // next negative id: the later one takes the next.
                        | Some("updates_bot_id_update_id_key")
                ) =>
            {
                true
            }
            Self::Sql(sqlx::Error::Database(error)) => error
                .code()
                .and_then(|code| code.parse::<i32>().ok())
                // SQLITE_BUSY and SQLITE_LOCKED, with any extended code.
                .is_some_and(|code| matches!(code & 0xff, 5 | 6)),
            Self::Sql(sqlx::Error::PoolTimedOut) => true,
            _ => false,
        }
    }

    /// The connection the statement went to was gone (PostgreSQL: the server ended
    /// it — a restart, `pg_terminate_backend`, an idle timeout — or the socket broke):
    /// the pool drops that connection, and the same write on another one can succeed.
    fn is_connection_lost(&self) -> bool {
        match self {
            Self::Sql(sqlx::Error::Io(_)) => true,
            // admin_shutdown, crash_shutdown, cannot_connect_now.
            Self::Sql(sqlx::Error::Database(error)) => error
                .code()
                .is_some_and(|code| matches!(&*code, "57P01" | "57P02" | "57P03")),
            _ => false,
        }
    }
}

/// How many times in a row a write is sent again at once on another connection after
/// its connection was found gone: the pool's size (every pooled connection may have
/// been cut at once) and one more.
const LOST_RETRIES: usize = POSTGRES_CONNECTIONS as usize + 1;

/// The PostgreSQL pool's size.
const POSTGRES_CONNECTIONS: u32 = 8;

/// A pooled PostgreSQL connection idle for this long is pinged before its next use.
const PING_IDLE: Duration = Duration::from_secs(1);

/// Pauses before the extra tries of a write that found the database busy. SQLite
/// already waited `busy_timeout` inside each try; these give a lock held longer than
/// that a few more chances, so an entry is not refused ("send it again") or answered
/// twice (a reply not recorded as sent) because of someone else's transaction.
const BUSY_RETRIES: [Duration; 4] = [
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
];

/// Runs an idempotent write, trying again while the database is busy. Every write of
/// the store goes through it (one retry policy); a transaction is retried whole.
async fn retry_busy<T, F, Fut>(what: &'static str, mut write: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut lost = 0;
    for wait in BUSY_RETRIES {
        let mut done = write().await;
        while lost < LOST_RETRIES
            && let Err(error) = &done
            && error.is_connection_lost()
        {
            lost += 1;
            tracing::info!(%error, what, "the database connection was gone; trying again on another");
            done = write().await;
        }
        match done {
            Err(error) if error.is_busy() => {
                tracing::warn!(%error, what, retry_in_ms = wait.as_millis() as u64, "database busy; trying again");
                tokio::time::sleep(wait).await;
            }
            done => return done,
        }
    }
    write().await
}

impl Store {
    /// Runs a write that is about to be promised (an entry stored, an edit, an import,
    /// a deletion, a setting said done) and returns once its commit is on disk, not
    /// only in the WAL ([`durable`]).
    async fn durably<T>(
        &self,
        write: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let written = write.await?;
        if let Some(durable) = &self.durable {
            durable.after_commit().await.map_err(|error| {
                tracing::error!(%error, "a commit could not be synced to disk");
                StoreError::Sync(error)
            })?;
        }
        Ok(written)
    }
}

/// When a scheduler row (a reminder, a user's Sunday digest) is due, as the store read
/// it: the moment callers decide with, and, private, the stored text itself as the key
/// of the compare-and-set that moves the row on. The key is what the row held, not a
/// formatting of the moment, so a row whose text is another spelling of a moment (a
/// hand edit, fractional seconds) or no moment at all still matches, and moves on once;
/// callers never see or parse the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueAt {
    at: jiff::Timestamp,
    stored: String,
}

impl DueAt {
    /// A due row's stored text, read at `now`: text that is no moment is due now (with
    /// a warning naming the row, never its text), as the scheduler's query returned it.
    fn read(stored: String, now: jiff::Timestamp, user_id: UserId, column: &'static str) -> Self {
        let at = crate::time::parse_sql_timestamp(&stored).unwrap_or_else(|| {
            tracing::warn!(
                user_id = user_id.get(),
                column,
                "stored due time is not a moment; treated as due now"
            );
            now
        });
        Self { at, stored }
    }

    /// The moment the row is due.
    pub fn at(&self) -> jiff::Timestamp {
        self.at
    }

    /// Whether the row holds the moment as the store writes moments (nothing to
    /// rewrite when it is not due yet).
    pub fn is_canonical(&self) -> bool {
        crate::time::sql_timestamp(self.at) == self.stored
    }

    /// The compare-and-set key: exactly the text that was read.
    fn key(&self) -> &str {
        &self.stored
    }
}

/// The schedulers' due queries ([`DUE_REMINDERS_SQL`], [`DUE_DIGESTS_SQL`]) with their
/// five parameters bound for `now`: `$1` now, `$2` the limit; `$3`, `$4` the text of
/// `now`'s UTC day spelt with a `T` (`YYYY-MM-DDT` up to `YYYY-MM-DDU`), a band no
/// canonical moment is in; `$5` a week and a day from `now`. No due time the scheduler
/// writes is that far (a digest's is the next Sunday), so text at or after it is a hand
/// edit, read every tick: no moment (due now), or a moment that far.
fn due_query<'q, DB, O>(
    sql: &'q str,
    now: jiff::Timestamp,
    limit: i64,
) -> sqlx::query::QueryAs<'q, DB, O, <DB as sqlx::Database>::Arguments<'q>>
where
    DB: sqlx::Database,
    O: for<'r> FromRow<'r, DB::Row>,
    String: for<'e> sqlx::Encode<'e, DB> + sqlx::Type<DB>,
    i64: for<'e> sqlx::Encode<'e, DB> + sqlx::Type<DB>,
{
    let day = now.strftime("%Y-%m-%d");
    let far = now
        .checked_add(jiff::SignedDuration::from_hours(8 * 24))
        .unwrap_or(jiff::Timestamp::MAX);
    sqlx::query_as(sql)
        .bind(crate::time::sql_timestamp(now))
        .bind(limit)
        .bind(format!("{day}T"))
        .bind(format!("{day}U"))
        .bind(crate::time::sql_timestamp(far))
}

/// A stored moment of a row (`created_at`, `replied_at`, …): what
/// [`crate::time::parse_sql_timestamp`] reads, and for text that is no moment the Unix
/// epoch, with a warning naming the row and column (never the text), so that the row
/// stays readable.
fn stored_moment(
    table: &'static str,
    id: i64,
    column: &'static str,
    text: &str,
) -> jiff::Timestamp {
    crate::time::parse_sql_timestamp(text).unwrap_or_else(|| {
        tracing::warn!(
            table,
            id,
            column,
            "stored time is not a moment; read as the epoch"
        );
        jiff::Timestamp::UNIX_EPOCH
    })
}

/// A stored local day (`YYYY-MM-DD`); `None`, with a warning naming the row and column,
/// for text that is no date.
fn stored_date(
    table: &'static str,
    id: i64,
    column: &'static str,
    text: &str,
) -> Option<jiff::civil::Date> {
    let date = text.parse().ok();
    if date.is_none() {
        tracing::warn!(table, id, column, "stored day is not a date; read as none");
    }
    date
}

/// A stored local day of a row that means nothing without it (a day of the charts and
/// the prompts, a streak's day, a day's activity, a summary of the week): `None`, with a
/// warning naming the table, user, row (where it has an id) and column, never the text,
/// for text that is no date; the caller leaves the row out.
fn listed_date(
    table: &'static str,
    user_id: UserId,
    id: Option<i64>,
    column: &'static str,
    text: &str,
) -> Option<jiff::civil::Date> {
    let date = text.parse().ok();
    if date.is_none() {
        tracing::warn!(
            table,
            user_id = user_id.get(),
            id,
            column,
            "stored day is not a date; the row is left out"
        );
    }
    date
}

/// A stored daily time (`HH:MM`); `None`, with a warning naming the row and column, for
/// text that is not one.
fn stored_local_time(
    table: &'static str,
    id: i64,
    column: &'static str,
    text: &str,
) -> Option<crate::time::LocalTime> {
    let time = crate::time::LocalTime::from_stored(text);
    if time.is_none() {
        tracing::warn!(
            table,
            id,
            column,
            "stored time of day is not HH:MM; read as none"
        );
    }
    time
}

/// Lifecycle of a day log (`day_logs.status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type)]
#[sqlx(type_name = "TEXT", rename_all = "lowercase")]
pub enum LogStatus {
    Pending,
    Analyzed,
    Blocked,
    Failed,
}

impl LogStatus {
    /// The stored value, as in the schema's CHECK constraint.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Analyzed => "analyzed",
            Self::Blocked => "blocked",
            Self::Failed => "failed",
        }
    }
}
/// One stored entry, parsed at the boundary: `created_at` and `metrics` are read back
/// once here (see [`DayLogRow`]).
#[derive(Debug, Clone, PartialEq)]
pub struct DayLog {
    pub id: LogId,
    pub user_id: UserId,
    pub chat_id: ChatId,
    pub message_id: MessageId,
    pub text: String,
    /// When the entry was received (stored as UTC `YYYY-MM-DD HH:MM:SS`, docs/operations.md, Your data in plain SQL). A
    /// stored text that is not such a moment reads as the Unix epoch, with a warning,
    /// so the row stays readable.
    pub created_at: jiff::Timestamp,
    pub status: LogStatus,
    pub analysis: Option<String>,
    /// `None` when nothing is stored yet, or when the stored text is not a metrics
    /// object (a warning is logged; callers treat it as no metrics).
    pub metrics: Option<Metrics>,
    pub attempts: i64,
    /// When the worker looks at it next (read as [`DayLog::created_at`] is).
    pub next_attempt_at: Option<jiff::Timestamp>,
    /// When its final reply was sent (read as [`DayLog::created_at`] is).
    pub replied_at: Option<jiff::Timestamp>,
    /// The user's local day the entry belongs to (docs/behaviour.md, Time zones and rhythm); `None` for entries stored
    /// before local days, or (with a warning) when the stored text is no date.
    pub local_day: Option<jiff::civil::Date>,
    /// When an edit last changed its text; `None`: never (read as
    /// [`DayLog::created_at`] is).
    pub edited_at: Option<jiff::Timestamp>,
    /// When the user wrote it: Telegram's message date, for every Telegram entry;
    /// `None` for the others (read as [`DayLog::created_at`] is). See
    /// [`DayLog::written`].
    pub written_at: Option<jiff::Timestamp>,
    /// The user's zone when it was written, as `users.timezone` had it; `None` for
    /// entries stored before the column and users who never set one. See
    /// [`DayLog::written_in`].
    pub written_zone: Option<String>,
}

impl DayLog {
    /// The zone the entry was written in, else `now` (the user's zone today): the one
    /// whose clock shows the hour the user saw. A stored name that is no zone (a hand
    /// edit) reads as `now`.
    pub fn written_in<'a>(
        &self,
        now: &'a crate::time::UserZone,
    ) -> std::borrow::Cow<'a, crate::time::UserZone> {
        match self
            .written_zone
            .as_deref()
            .and_then(crate::time::UserZone::from_stored)
        {
            Some(zone) if zone != *now => std::borrow::Cow::Owned(zone),
            _ => std::borrow::Cow::Borrowed(now),
        }
    }

    /// When the user wrote the entry: Telegram's message date, or when it was stored
    /// where there is none (the terminal, imports, entries stored before the column).
    /// After a downtime the two differ by as long as daylog was away.
    pub fn written(&self) -> jiff::Timestamp {
        self.written_at.unwrap_or(self.created_at)
    }

    /// The final outcome stored for the log, to answer from (the worker's resend);
    /// `None` while it is pending. A give-up stores no reason: it reads as
    /// [`Failure::GaveUp`](crate::domain::Failure::GaveUp).
    pub fn outcome(&self) -> Option<crate::domain::Outcome> {
        use crate::domain::{Failure, Outcome};
        Some(match self.status {
            LogStatus::Pending => return None,
            LogStatus::Analyzed => Outcome::Analysed {
                analysis: self.analysis.clone().unwrap_or_default(),
                metrics: self.metrics.clone().unwrap_or_else(Metrics::defaults),
            },
            LogStatus::Blocked => Outcome::Blocked {
                metrics: self.metrics.clone(),
            },
            LogStatus::Failed => Outcome::Failed(Failure::GaveUp),
        })
    }
}

/// A `day_logs` row as SQLite holds it, before [`DayLog`] parses its columns.
#[derive(FromRow)]
struct DayLogRow {
    id: LogId,
    user_id: UserId,
    chat_id: ChatId,
    message_id: MessageId,
    text: String,
    created_at: String,
    status: LogStatus,
    analysis: Option<String>,
    metrics: Option<String>,
    attempts: i64,
    next_attempt_at: Option<String>,
    replied_at: Option<String>,
    local_day: Option<String>,
    edited_at: Option<String>,
    written_at: Option<String>,
    written_zone: Option<String>,
}

impl From<DayLogRow> for DayLog {
    fn from(row: DayLogRow) -> Self {
        let metrics = row.metrics.as_deref().and_then(|text| {
            let parsed = Metrics::from_stored_json(text);
            if parsed.is_none() {
                tracing::warn!(
                    log_id = row.id.get(),
                    "stored metrics are not a metrics object; read as none"
                );
            }
            parsed
        });
        let moment = |column, text: &str| stored_moment("day_logs", row.id.get(), column, text);
        let created_at = moment("created_at", &row.created_at);
        let next_attempt_at = row
            .next_attempt_at
            .as_deref()
            .map(|text| moment("next_attempt_at", text));
        let replied_at = row
            .replied_at
            .as_deref()
            .map(|text| moment("replied_at", text));
        let edited_at = row
            .edited_at
            .as_deref()
            .map(|text| moment("edited_at", text));
        let written_at = row
            .written_at
            .as_deref()
            .map(|text| moment("written_at", text));
        Self {
            id: row.id,
            user_id: row.user_id,
            chat_id: row.chat_id,
            message_id: row.message_id,
            text: row.text,
            created_at,
            status: row.status,
            analysis: row.analysis,
            metrics,
            attempts: row.attempts,
            next_attempt_at,
            replied_at,
            local_day: row
                .local_day
                .and_then(|text| stored_date("day_logs", row.id.get(), "local_day", &text)),
            edited_at,
            written_at,
            written_zone: row.written_zone,
        }
    }
}

impl<'r, R: sqlx::Row> FromRow<'r, R> for DayLog
where
    DayLogRow: FromRow<'r, R>,
{
    fn from_row(row: &'r R) -> Result<Self, sqlx::Error> {
        DayLogRow::from_row(row).map(Self::from)
    }
}

/// Where a log came from (`day_logs.source`, docs/operations.md, Your data in plain SQL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Telegram,
    /// A line typed in `daylog chat`.
    Chat,
    Import,
}

impl Source {
    /// The stored value, as in the schema's CHECK constraint.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Telegram => "telegram",
            Self::Chat => "chat",
            Self::Import => "import",
        }
    }
}

/// Whose unfinished logs a worker answers (docs/behaviour.md, The life of an entry): the daemon only Telegram's, a
/// terminal only its own user's, so no front end answers another's entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrontEnd {
    Telegram,
    Terminal { user_id: UserId },
}

impl FrontEnd {
    fn source(self) -> Source {
        match self {
            Self::Telegram => Source::Telegram,
            Self::Terminal { .. } => Source::Chat,
        }
    }

    fn user_id(self) -> Option<UserId> {
        match self {
            Self::Telegram => None,
            Self::Terminal { user_id } => Some(user_id),
        }
    }
}

/// The columns of [`DayLog`], for queries that read whole logs.
macro_rules! log_columns {
    () => {
        "id, user_id, chat_id, message_id, text, created_at, status, analysis, metrics, \
         attempts, next_attempt_at, replied_at, local_day, edited_at, written_at, written_zone"
    };
}
const LOG_COLUMNS: &str = log_columns!();

mod calls;
mod cluster;
mod digests;
mod durable;
mod logs;
mod pg_conns;
mod read_only;
mod reminders;
mod search;
mod shared;
mod unfinished;
mod updates;
mod users;
mod webapp;
mod word_forms;

use calls::CallRecorder;
pub use calls::CallSink;
pub use cluster::{Fence, InstanceId, InstanceRow, NewInstance, PollingLock};
pub use digests::{DUE_DIGESTS_SQL, Digest, DigestAdvance, DigestClaim, DigestStatus, DueDigest};
pub use logs::{
    BEFORE_ANALYSIS_POSTGRES, BeforeAnalysis, DAILY_METRICS_SQL, DayMetrics, DayMood, HISTORY_SQL,
    ImportCounts, Inserted, NewImportLog, NewLog, NewVoiceLog, RECENT_USE_POSTGRES_SQL,
    RECENT_USE_SQL, SEARCH_CANDIDATES, SEARCH_CANDIDATES_POSTGRES_SQL, SEARCH_LIMIT,
    SEARCH_MAX_FORMS, SEARCH_SQL, SearchHit, SnippetRun, VoiceNote, YEAR_MOODS_SQL,
    fold_for_search, fts_query, fts_query_with,
};
pub use pg_conns::{PgConn, PgConns, PgHold, PgTx};
pub use read_only::{Backup, backup, open_postgres_for_sql, open_read_only, read_only_options};
pub use reminders::{DUE_REMINDERS_SQL, DueReminder, Reminder};
pub use unfinished::{
    DEFER_TO_FREE_SLOT_SQL, MARK_ANSWERED_POSTGRES_SQL, UNFINISHED_REPLY, Unfinished,
};
pub use updates::{
    ChatUpdate, DeadLetter, InboxCounts, InboxUpdate, NewUpdate, NextTry, Pruned,
    UPDATE_MAX_FAILURES, UpdateFailure, UpdateKey,
};
pub use users::{NewUser, User};
pub use webapp::NEXT_PAGE_SQL as ENTRIES_NEXT_PAGE_SQL;

/// The shared handle on the database. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    db: Db,
    calls: CallRecorder,
    /// Where a promised commit waits for the disk ([`durable`]); `None` on PostgreSQL,
    /// whose commit returns once it is on the server's disk.
    durable: Option<std::sync::Arc<durable::WalSync>>,
    /// `users.timezone` of a user seen for the first time (`journal.default_timezone`),
    /// and the zone of one whose stored zone names none.
    default_zone: crate::time::UserZone,
    /// The chat leases the updates being handled now are handled under (PostgreSQL,
    /// several instances): an entry's write for one of them checks its lease in its
    /// transaction ([`cluster`]).
    fences: cluster::UpdateFences,
}

/// The database behind a [`Store`]: the one narrow type the journal sees has one of
/// these inside. Queries are written once where the SQL can be shared ([`Sql`]) and run
/// through [`on_db!`], which compiles the same Rust for each backend.
#[derive(Clone, Debug)]
enum Db {
    /// One writer connection (writers queue in the pool, never on SQLite's lock) and
    /// up to four readers beside it (WAL).
    Sqlite(SqliteDb),
    /// One set of connections for reads and writes: the server serialises what must
    /// be. Handed out by the store itself ([`pg_conns`]), not lent by sqlx's pool for
    /// each statement.
    Postgres(PgConns),
}

#[derive(Clone, Debug)]
struct SqliteDb {
    read: SqlitePool,
    write: SqlitePool,
}

/// A statement's text per backend: `Sql::both` where one text serves both (placeholders
/// `$1`…, which SQLite's driver binds by number too), else one per dialect.
///
/// Never mix `?N` and `$N` in one SQLite statement: SQLite numbers a `$1` as a *named*
/// parameter, one past the largest index seen so far in the text, which can be the
/// index of a later `?N` — both then bind the value of `$1`.
#[derive(Debug, Clone, Copy)]
struct Sql {
    sqlite: &'static str,
    postgres: &'static str,
}

impl Sql {
    const fn both(text: &'static str) -> Self {
        Self {
            sqlite: text,
            postgres: text,
        }
    }

    /// The text for the backend of `pool`.
    fn on<P: Backend>(&self, _pool: &P) -> &'static str {
        P::Db::text(self)
    }
}

/// The moment a statement runs, as the store spells moments (SQLite's
/// `datetime('now')`), for statements assembled with `format!`.
const NOW: Sql = Sql {
    sqlite: "datetime('now')",
    postgres: "daylog_utc(now())",
};

/// The smaller of two values: SQLite's two-argument `min`, PostgreSQL's `least`.
const LEAST: Sql = Sql {
    sqlite: "min",
    postgres: "least",
};

/// Picks a backend's text out of a [`Sql`].
trait Dialect: sqlx::Database {
    fn text(sql: &Sql) -> &'static str;
}

impl Dialect for sqlx::Sqlite {
    fn text(sql: &Sql) -> &'static str {
        sql.sqlite
    }
}

impl Dialect for sqlx::Postgres {
    fn text(sql: &Sql) -> &'static str {
        sql.postgres
    }
}

/// What [`on_db!`] hands its body as `pool`, and so what picks a statement's text
/// ([`Sql::on`]): SQLite's pools, PostgreSQL's [`PgConns`].
trait Backend {
    type Db: Dialect;
}

impl<DB: Dialect> Backend for sqlx::Pool<DB> {
    type Db = DB;
}

impl Backend for PgConns {
    type Db = sqlx::Postgres;
}

/// Runs `$body` once per backend with `$pool` the backend's pool: on SQLite the `read`
/// or `write` one as asked, on PostgreSQL its [`PgConns`]. The body is written once and
/// compiled for both (binds, fetch and row reading are the same Rust).
macro_rules! on_db {
    ($store:expr, $side:ident, |$pool:ident| $body:expr) => {
        on_db!(@db &$store.db, $side, |$pool| $body)
    };
    (@db $db:expr, $side:ident, |$pool:ident| $body:expr) => {
        match $db {
            crate::store::Db::Sqlite(sqlite) => {
                let $pool = &sqlite.$side;
                $body
            }
            crate::store::Db::Postgres(pg) => {
                let $pool = pg;
                $body
            }
        }
    };
}
use on_db;

/// Runs `$body` inside a write transaction, once per backend, with `$pool` the writer
/// pool (for [`Sql::on`]) and `$conn` the transaction's connection: committed when the
/// body returns `Ok`, rolled back otherwise. On SQLite through [`updates::WriteTx`]
/// (`BEGIN IMMEDIATE`, a connection that cannot roll back is closed); on PostgreSQL a
/// plain transaction ([`pg_conns::PgTx`]): rolled back on an error, its connection closed
/// (and so the transaction rolled back by the server) when dropped half-way.
macro_rules! in_write_tx {
    ($store:expr, |$pool:ident, $conn:ident| $body:expr) => {
        match &$store.db {
            crate::store::Db::Sqlite(sqlite) => {
                let $pool = &sqlite.write;
                let mut tx = crate::store::updates::WriteTx::begin($pool).await?;
                let work: Result<_, StoreError> = async {
                    let $conn = tx.conn()?;
                    $body
                }
                .await;
                tx.finish(work).await
            }
            crate::store::Db::Postgres(pg) => {
                let $pool = pg;
                let mut tx = $pool.begin().await?;
                let work: Result<_, StoreError> = async {
                    let $conn: &mut crate::store::PgConn = &mut tx;
                    $body
                }
                .await;
                match work {
                    Ok(value) => {
                        tx.commit().await?;
                        Ok(value)
                    }
                    Err(error) => {
                        // A connection that cannot roll back is closed as `tx` drops.
                        if !error.is_connection_lost() {
                            let _ = tx.rollback().await;
                        }
                        Err(error)
                    }
                }
            }
        }
    };
}
use in_write_tx;

impl Store {
    /// The SQLite pools, for an operation not ported to PostgreSQL yet.
    fn sqlite(&self, what: &'static str) -> Result<&SqliteDb, StoreError> {
        match &self.db {
            Db::Sqlite(sqlite) => Ok(sqlite),
            Db::Postgres(_) => Err(StoreError::NotOnPostgres(what)),
        }
    }

    /// Whether this store is on PostgreSQL.
    pub fn is_postgres(&self) -> bool {
        matches!(self.db, Db::Postgres(_))
    }
}

/// The connect options of a PostgreSQL URL, and how messages name that database (its
/// name and host: the URL is a secret).
fn postgres_options(url: &str) -> Result<(PgConnectOptions, String), StoreError> {
    let options = PgConnectOptions::from_str(url).map_err(|source| StoreError::Open {
        path: redacted_url(url),
        source,
    })?;
    let shown = format!(
        "{} on {}",
        options.get_database().unwrap_or("(default database)"),
        options.get_host()
    );
    Ok((options, shown))
}

/// What each of the store's PostgreSQL connections sets first: a statement with
/// parameters is planned once for all its values (a generic plan). PostgreSQL plans a
/// prepared statement for its values five times on every connection before it
/// settles on that one plan (and keeps planning at every run a statement whose one
/// plan it estimates costlier); the read before an analysis takes 1–3 ms to plan,
/// more than it takes to run. The store's statements are written for one plan (no
/// `$n IS NULL OR …` where the value picks the index, orders an index has), and these
/// are the plans PostgreSQL settles on by itself (the tests read them: `generic_plan`
/// in tests/it/store.rs). The exception asks for its own ([`CUSTOM_PLAN`]). Sent after
/// connecting, not as a startup option, which connection poolers such as PgBouncer
/// refuse. `daylog sql` keeps the server's setting.
const GENERIC_PLANS: &str = "SET plan_cache_mode = force_generic_plan";

/// Inside a transaction: its statements are planned for the values they are given.
/// `/search`'s read of the word index needs it: whether a user's entries are best read
/// newest first or through the word index depends on how many hold the words, and the
/// one plan for all words read every entry with a common word (130 ms against 0.1 ms
/// on 100 000 entries); PostgreSQL itself settles on that plan after five searches.
const CUSTOM_PLAN: &str = "SET LOCAL plan_cache_mode = force_custom_plan";

/// Whether `url` names a PostgreSQL database (`postgres://` or `postgresql://`).
pub fn is_postgres_url(url: &str) -> bool {
    crate::config::is_postgres_url(url)
}

/// How the store's connections are set up: `[store]` in the settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub busy_timeout: Duration,
    /// `PRAGMA max_page_count` from this many bytes, on every connection.
    pub max_size_bytes: Option<u64>,
}

impl Limits {
    /// No quota: what tests and tools that only read use.
    pub fn busy_timeout(busy_timeout: Duration) -> Self {
        Self {
            busy_timeout,
            max_size_bytes: None,
        }
    }
}

impl From<&crate::config::StoreSettings> for Limits {
    fn from(settings: &crate::config::StoreSettings) -> Self {
        Self {
            busy_timeout: settings.busy_timeout(),
            max_size_bytes: settings.max_size_bytes(),
        }
    }
}

fn parse_options(url: &str) -> Result<SqliteConnectOptions, StoreError> {
    SqliteConnectOptions::from_str(url).map_err(|source| StoreError::Open {
        path: url.to_owned(),
        source,
    })
}

fn connect_options(url: &str, limits: Limits) -> Result<SqliteConnectOptions, StoreError> {
    Ok(parse_options(url)?
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .foreign_keys(true)
        .busy_timeout(limits.busy_timeout))
}

/// Pool options that apply the size quota to each connection as it opens: SQLite keeps
/// `max_page_count` per connection, and the page size is the file's own, so it is
/// computed after connecting. A write that would grow the file past it fails with
/// `SQLITE_FULL`, exactly like a full disk.
fn pool_options(limits: Limits) -> SqlitePoolOptions {
    let options = SqlitePoolOptions::new().test_before_acquire(false);
    let Some(bytes) = limits.max_size_bytes else {
        return options;
    };
    options.after_connect(move |conn, _meta| {
        Box::pin(async move {
            let page_size: i64 = sqlx::query_scalar("PRAGMA page_size")
                .fetch_one(&mut *conn)
                .await?;
            let pages = (bytes / page_size.max(512) as u64).clamp(1, u64::from(u32::MAX - 1));
            sqlx::query(&format!("PRAGMA max_page_count = {pages}"))
                .execute(&mut *conn)
                .await?;
            Ok(())
        })
    })
}

/// SQLite's "unable to open database file" (`SQLITE_CANTOPEN`, 14) and "attempt to write
/// a readonly database" (`SQLITE_READONLY`, 8, with any extended code) say nothing of
/// why; most often the folder or the file is not writable by the user daylog runs as (a
/// Docker volume owned by root, a file created with sudo).
fn cant_open_hint(source: &sqlx::Error) -> &'static str {
    let cant_open = source
        .as_database_error()
        .and_then(|e| e.code())
        .and_then(|code| code.parse::<i32>().ok())
        .is_some_and(|code| code == 14 || code & 0xff == 8);
    if cant_open {
        "; check that this user can write to the file and to its folder"
    } else {
        ""
    }
}

/// The row of an `INSERT/UPDATE … RETURNING` statement, read to the statement's end.
/// Never `fetch_one`/`fetch_optional` for a write: sqlx stops stepping after the first
/// row and resets the statement, and in autocommit mode the commit happens at that
/// reset, whose error (a full disk, an I/O error) sqlx drops. The row would come back
/// while the write was rolled back: an entry answered "saved" and lost.
fn returned<T>(rows: Vec<T>) -> Option<T> {
    rows.into_iter().next()
}

impl Store {
    /// Opens (creating the file and its folder when missing) without migrating.
    pub async fn open(url: &str, busy_timeout: Duration) -> Result<Self, StoreError> {
        Self::open_with(url, Limits::busy_timeout(busy_timeout)).await
    }

    /// Opens with the configured limits (`[store]`) applied to every connection.
    pub async fn open_with(url: &str, limits: Limits) -> Result<Self, StoreError> {
        if is_postgres_url(url) {
            return Self::open_postgres(url, limits).await;
        }
        let file = database_path(url)?;
        // Absolute, so that an error says where (a relative URL is the working folder's).
        let shown = |path: &std::path::Path| {
            std::path::absolute(path)
                .unwrap_or_else(|_| path.to_owned())
                .display()
                .to_string()
        };
        let display = shown(&file);
        if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
                path: shown(dir),
                source,
            })?;
        }
        let options = connect_options(url, limits)?.create_if_missing(true);
        let open_err = |source| StoreError::Open {
            path: display.clone(),
            source,
        };
        // `test_before_acquire` pings a connection before every query: a round trip to
        // sqlx's per-connection thread that guards against dropped network connections,
        // which an embedded SQLite file does not have. Off, every query saves two thread
        // hand-offs (see BENCHMARKS.md); a broken connection still fails its query, and
        // sqlx still checks each connection when it goes back to the pool.
        let write = pool_options(limits)
            .max_connections(1)
            .connect_with(options)
            .await
            .map_err(open_err)?;
        let read_options = SqliteConnectOptions::from_str(url)
            .map_err(open_err)?
            .foreign_keys(true)
            .busy_timeout(limits.busy_timeout)
            .read_only(true);
        let read = pool_options(limits)
            .max_connections(4)
            .connect_with(read_options)
            .await
            .map_err(open_err)?;
        let calls = CallRecorder::spawn(Db::Sqlite(SqliteDb {
            read: read.clone(),
            write: write.clone(),
        }));
        Ok(Self {
            db: Db::Sqlite(SqliteDb { read, write }),
            calls,
            durable: Some(std::sync::Arc::new(durable::WalSync::for_database(file))),
            default_zone: crate::time::UserZone::utc(),
            fences: cluster::UpdateFences::default(),
        })
    }

    /// Opens a PostgreSQL database. The URL is a secret (it may hold a password): an
    /// error names the database by its host and name only.
    async fn open_postgres(url: &str, limits: Limits) -> Result<Self, StoreError> {
        let (options, shown) = postgres_options(url)?;
        // sqlx pings a connection before each use by default: a round trip per
        // statement, for the server and for this process. Only a connection idle for
        // [`PING_IDLE`] is pinged (the server or something between may have dropped
        // it meanwhile); one in steady use goes straight to its statement, and a write
        // that finds its connection gone anyway is sent again on another
        // ([`retry_busy`]).
        let pool = PgPoolOptions::new()
            .max_connections(POSTGRES_CONNECTIONS)
            .acquire_timeout(limits.busy_timeout.max(Duration::from_secs(5)))
            .test_before_acquire(false)
            .after_connect(|conn, _meta| {
                Box::pin(async move {
                    sqlx::Executor::execute(&mut *conn, GENERIC_PLANS).await?;
                    Ok(())
                })
            })
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= PING_IDLE {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
            .connect_with(options)
            .await
            .map_err(|source| StoreError::Open {
                path: shown,
                source,
            })?;
        let conns = PgConns::new(pool);
        let calls = CallRecorder::spawn(Db::Postgres(conns.clone()));
        Ok(Self {
            db: Db::Postgres(conns),
            calls,
            durable: None,
            default_zone: crate::time::UserZone::utc(),
            fences: cluster::UpdateFences::default(),
        })
    }

    /// The same store, giving users seen for the first time this zone (and those whose
    /// stored zone names none).
    pub fn with_default_timezone(mut self, zone: &crate::time::UserZone) -> Self {
        self.default_zone = zone.clone();
        self
    }

    /// A stored `users.timezone`: the zone it names in its canonical spelling, else
    /// (a hand edit) the default zone, with a warning naming the user.
    fn stored_zone(&self, user_id: UserId, text: &str) -> crate::time::UserZone {
        crate::time::UserZone::from_stored(text).unwrap_or_else(|| {
            tracing::warn!(
                user_id = user_id.get(),
                "users.timezone is not a valid zone; using the default"
            );
            self.default_zone.clone()
        })
    }

    /// Opens and brings the schema up to date. Refuses a database from a newer daylog.
    pub async fn open_and_migrate(url: &str, busy_timeout: Duration) -> Result<Self, StoreError> {
        Self::open_and_migrate_with(url, Limits::busy_timeout(busy_timeout)).await
    }

    /// [`Store::open_with`], then migrations.
    pub async fn open_and_migrate_with(url: &str, limits: Limits) -> Result<Self, StoreError> {
        let store = Self::open_with(url, limits).await?;
        store.migrate().await?;
        Ok(store)
    }

    pub async fn migrate(&self) -> Result<(), StoreError> {
        let tolerated = self.check_not_newer().await?;
        let migrator = self.migrator();
        // Migrations a newer build applied, all additive: this build runs beside them
        // (sqlx would otherwise refuse versions it does not know).
        let beside_newer;
        let migrator = if tolerated {
            beside_newer = sqlx::migrate::Migrator {
                migrations: std::borrow::Cow::Borrowed(&*migrator.migrations),
                ignore_missing: true,
                ..sqlx::migrate::Migrator::DEFAULT
            };
            &beside_newer
        } else {
            migrator
        };
        match &self.db {
            Db::Sqlite(sqlite) => migrator.run(&sqlite.write).await?,
            Db::Postgres(pg) => migrator.run(pg.sqlx_pool()).await?,
        }
        Ok(())
    }

    /// The migrations of this store's backend.
    fn migrator(&self) -> &'static sqlx::migrate::Migrator {
        match self.db {
            Db::Sqlite(_) => &MIGRATOR,
            Db::Postgres(_) => &PG_MIGRATOR,
        }
    }

    /// Whether every migration this build knows has been applied.
    pub async fn is_migrated(&self) -> Result<bool, StoreError> {
        let applied = self.applied_versions().await?;
        Ok(self.migrator().iter().all(|m| applied.contains(&m.version)))
    }

    /// The checks `sqlx::migrate` makes before it runs anything: an applied migration
    /// whose checksum is not this build's, or one that failed part-way, makes `daylog
    /// run` refuse to start, so `doctor` must not call such a database migrated.
    async fn check_checksums(&self) -> Result<(), StoreError> {
        if self.applied_versions().await?.is_empty() {
            return Ok(());
        }
        let applied: Vec<(i64, bool, Vec<u8>)> = on_db!(self, read, |pool| {
            sqlx::query_as(
                "SELECT version, success, checksum FROM _sqlx_migrations ORDER BY version",
            )
            .fetch_all(pool)
            .await?
        });
        for (version, success, checksum) in applied {
            if !success {
                // A migration that failed part-way: `migrate` refuses to go on as well.
                return Err(StoreError::Migrate(sqlx::migrate::MigrateError::Dirty(
                    version,
                )));
            }
            if let Some(known) = self.migrator().iter().find(|m| m.version == version)
                && *known.checksum != *checksum
            {
                return Err(StoreError::MigrationChanged { version });
            }
        }
        Ok(())
    }

    async fn applied_versions(&self) -> Result<Vec<i64>, StoreError> {
        const EXISTS: Sql = Sql {
            sqlite: "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
            postgres: "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema() AND tablename = '_sqlx_migrations'",
        };
        on_db!(self, read, |pool| {
            let exists: i64 = sqlx::query_scalar(EXISTS.on(pool)).fetch_one(pool).await?;
            if exists == 0 {
                return Ok(Vec::new());
            }
            Ok(
                sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
                    .fetch_all(pool)
                    .await?,
            )
        })
    }

    /// Refuses a schema a newer build migrated, unless every migration this build does
    /// not know is *additive* (its name ends in `_additive`: it only adds tables,
    /// columns with defaults or indexes, so this build's statements still mean what
    /// they meant): then the old build runs beside the new one during a rolling
    /// upgrade, and `true` says so (docs/operations.md, Upgrades).
    async fn check_not_newer(&self) -> Result<bool, StoreError> {
        let known = self.migrator().iter().map(|m| m.version).max().unwrap_or(0);
        let newer: Vec<(i64, String)> = self
            .applied_migrations()
            .await?
            .into_iter()
            .filter(|(version, _)| *version > known)
            .collect();
        let Some(found) = newer.iter().map(|(version, _)| *version).max() else {
            return Ok(false);
        };
        if newer
            .iter()
            .all(|(_, description)| is_additive(description))
        {
            tracing::info!(
                found,
                known,
                "the database has migrations of a newer daylog, all additive: this build runs beside it"
            );
            return Ok(true);
        }
        Err(StoreError::NewerSchema { found, known })
    }

    /// The applied migrations: version and description.
    async fn applied_migrations(&self) -> Result<Vec<(i64, String)>, StoreError> {
        if self.applied_versions().await?.is_empty() {
            return Ok(Vec::new());
        }
        Ok(on_db!(self, read, |pool| {
            sqlx::query_as("SELECT version, description FROM _sqlx_migrations WHERE success")
                .fetch_all(pool)
                .await?
        }))
    }

    /// Fails with a clear error unless the schema is current (for commands that do not
    /// migrate themselves).
    pub async fn ensure_migrated(&self) -> Result<(), StoreError> {
        self.check_not_newer().await?;
        self.check_checksums().await?;
        if self.is_migrated().await? {
            Ok(())
        } else {
            Err(StoreError::NotMigrated)
        }
    }

    pub async fn close(&self) {
        if tokio::time::timeout(Duration::from_secs(5), self.calls.flush())
            .await
            .is_err()
        {
            tracing::warn!("LLM calls still queued at shutdown were not recorded");
        }
        let sqlite = match &self.db {
            Db::Sqlite(sqlite) => sqlite,
            Db::Postgres(pg) => {
                pg.close().await;
                return;
            }
        };
        // After a clean exit the database file alone holds everything, so that copying
        // `daylog.db` (without its `-wal`) is a whole backup. SQLite folds the WAL back
        // into the file when its last connection closes, but only a connection that may
        // write can: the read-only pool goes first. The WAL is folded in explicitly too,
        // for when another process (a `daylog sql`, the daemon beside a `doctor`) still
        // has the file open, or a connection of this one is (sqlx does not always close
        // a read connection given back as its pool closes: 1 exit in 7 kept one, and
        // with it the whole `-wal`). TRUNCATE, which also empties the WAL once every
        // frame is in the file, with no busy wait: it never waits for a reader nor
        // holds up a writer of the other process, and does what PASSIVE does when it
        // cannot; what a reader still needs stays for its next one.
        sqlite.read.close().await;
        let folded: Result<(i64, i64, i64), sqlx::Error> = async {
            let mut conn = sqlite.write.acquire().await?;
            sqlx::query("PRAGMA busy_timeout = 0")
                .execute(&mut *conn)
                .await?;
            sqlx::query_as("PRAGMA wal_checkpoint(TRUNCATE)")
                .fetch_one(&mut *conn)
                .await
        }
        .await;
        match folded {
            Ok((_, log, done)) if log == done => {}
            Ok((_, log, done)) => tracing::debug!(
                frames = log,
                folded = done,
                "another process is reading the database: part of the WAL stays until it is done"
            ),
            Err(error) => {
                tracing::warn!(%error, "could not fold the WAL into the database file at exit; it is read again at the next start")
            }
        }
        sqlite.write.close().await;
    }

    /// The SQLite connection pool for read-only ad-hoc queries by the owner and the
    /// tests (`daylog sql` opens its own read-only connection instead); `None` on
    /// PostgreSQL.
    pub fn read_pool(&self) -> Option<&SqlitePool> {
        match &self.db {
            Db::Sqlite(sqlite) => Some(&sqlite.read),
            Db::Postgres(_) => None,
        }
    }

    /// The PostgreSQL connections, for the tests' ad-hoc queries; `None` on SQLite.
    pub fn pg_pool(&self) -> Option<&PgConns> {
        match &self.db {
            Db::Sqlite(_) => None,
            Db::Postgres(pg) => Some(pg),
        }
    }

    /// What SQLite's `quick_check` finds wrong with the file (its first finding), if
    /// anything: a damaged page that the migrations check alone never reads. Nothing
    /// on PostgreSQL, whose server checks its own pages.
    pub async fn damage(&self) -> Option<String> {
        match &self.db {
            Db::Sqlite(sqlite) => quick_check(&sqlite.read).await,
            Db::Postgres(_) => None,
        }
    }
}

/// What SQLite's `quick_check` finds wrong with the file behind `pool` (its first
/// finding, on one line), if anything.
async fn quick_check(pool: &SqlitePool) -> Option<String> {
    match sqlx::query_scalar::<_, String>("PRAGMA quick_check(1)")
        .fetch_all(pool)
        .await
    {
        Ok(found) if found.iter().all(|line| line == "ok") => None,
        Ok(found) => Some(found.join("; ").replace('\n', " ")),
        Err(error) => Some(error.to_string()),
    }
}

/// Whether a migration's description (sqlx's: the file name after the version, `_` read
/// as a space) marks it additive: old builds run beside it.
fn is_additive(description: &str) -> bool {
    description
        .rsplit([' ', '_'])
        .next()
        .is_some_and(|last| last.eq_ignore_ascii_case("additive"))
}

/// `url` with its password (and any query, which may hold one) left out, for messages.
pub fn redacted_url(url: &str) -> String {
    crate::config::redacted_url(url)
}

impl Store {
    /// Names of the columns of a table or view, in order (for schema checks).
    pub async fn columns(&self, table: &str) -> Result<Vec<String>, StoreError> {
        const COLUMNS: Sql = Sql {
            sqlite: "SELECT name FROM pragma_table_info($1) ORDER BY cid",
            postgres: "SELECT column_name::text FROM information_schema.columns
                       WHERE table_schema = current_schema() AND table_name = $1
                       ORDER BY ordinal_position",
        };
        Ok(on_db!(self, read, |pool| {
            sqlx::query_scalar(COLUMNS.on(pool))
                .bind(table)
                .fetch_all(pool)
                .await?
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::{MIGRATOR, PG_MIGRATOR, is_additive, redacted_url};

    #[test]
    fn a_migration_is_additive_only_when_its_name_says_so_last() {
        assert!(is_additive("instances additive"));
        assert!(is_additive("shared_budgets_additive"));
        assert!(!is_additive("additive budgets"));
        assert!(!is_additive("future"));
        assert!(!is_additive("nonadditive"));
        let ours = MIGRATOR
            .iter()
            .find(|m| m.version == 20261205000026)
            .map(|m| m.description.to_string());
        assert_eq!(ours.as_deref().map(is_additive), Some(true), "{ours:?}");
    }

    #[test]
    fn a_database_url_is_shown_without_its_password_or_parameters() {
        let shown = redacted_url("postgres://daylog:s3cret@db:5432/daylog?password=other");
        assert!(
            !shown.contains("s3cret") && !shown.contains("other"),
            "{shown}"
        );
        assert!(shown.contains("db:5432/daylog"), "{shown}");
        assert!(!redacted_url("postgres://x:%zz@").contains("%zz"));
    }

    /// PostgreSQL's first migration is the consolidated schema of every SQLite one up
    /// to its version; from there on each SQLite migration has a twin of the same
    /// version, so that "schema version N" is one schema on both backends. A new SQLite
    /// migration without its PostgreSQL twin fails here.
    #[test]
    fn postgres_migrations_follow_sqlites_version_for_version() {
        let pg: Vec<i64> = PG_MIGRATOR.iter().map(|m| m.version).collect();
        let first = pg.first().copied().unwrap_or(i64::MAX);
        let sqlite: Vec<i64> = MIGRATOR
            .iter()
            .map(|m| m.version)
            .filter(|version| *version >= first)
            .collect();
        assert_eq!(pg, sqlite);
        assert_eq!(
            MIGRATOR.iter().count(),
            std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
                .map(|dir| dir
                    .filter_map(Result::ok)
                    .filter(|entry| entry.path().is_file())
                    .count())
                .unwrap_or(0),
            "SQLite's migrations are exactly the files directly in migrations/"
        );
    }
}
