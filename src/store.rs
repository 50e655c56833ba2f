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

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{FromRow, Row};

use crate::language::Language;
use crate::llm::{Attempt, AttemptSink, SpentBudget};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Small typed ids, so that a user id, a chat id, a message id and a log id cannot be
/// passed for one another (`entries_last_hour(user, log)`, `claim(chat, message)`).
/// Stored as the plain integers of the schema (`sqlx(transparent)`).
macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, sqlx::Type,
        )]
        #[sqlx(transparent)]
        pub struct $name(pub i64);

        impl $name {
            /// The integer as stored.
            pub const fn get(self) -> i64 {
                self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.fmt(f)
            }
        }

        impl From<$name> for i64 {
            fn from(id: $name) -> i64 {
                id.0
            }
        }
    };
}

id_type!(
    /// A Telegram user id (`users.user_id`); a terminal user has one too.
    UserId
);
id_type!(
    /// A Telegram chat id (`day_logs.chat_id`, `users.chat_id`).
    ChatId
);
id_type!(
    /// A message id within its chat (`day_logs.message_id`); negative for terminal and
    /// imported entries.
    MessageId
);
id_type!(
    /// A day log (`day_logs.id`).
    LogId
);

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("DATABASE_URL must be a SQLite URL such as sqlite://data/daylog.db")]
    NotSqlite,
    #[error(
        "DATABASE_URL names no database file (empty or in-memory: the data would vanish at exit); use a path such as sqlite://data/daylog.db"
    )]
    NoFile,
    #[error(
        "DATABASE_URL opens the database read-only (mode=ro or immutable): no entry could ever be saved; remove that parameter"
    )]
    ReadOnly,
    #[error("DATABASE_URL is not a valid SQLite URL: {0}")]
    BadUrl(String),
    #[error("cannot create the database folder {path}: {source}")]
    CreateDir {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the database {path} does not exist (run `daylog migrate` first)")]
    Missing { path: String },
    #[error("cannot open the database {path}: {source}")]
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
}

impl StoreError {
    /// Another connection held the write lock for longer than `store.busy_timeout_ms`
    /// (a `sqlite3` shell left in a transaction, a backup), or the pool queue timed out:
    /// the same write can succeed a moment later.
    pub fn is_busy(&self) -> bool {
        match self {
            Self::Sql(sqlx::Error::Database(error)) => error
                .code()
                .and_then(|code| code.parse::<i32>().ok())
                // SQLITE_BUSY and SQLITE_LOCKED, with any extended code.
                .is_some_and(|code| matches!(code & 0xff, 5 | 6)),
            Self::Sql(sqlx::Error::PoolTimedOut) => true,
            _ => false,
        }
    }
}

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
    for wait in BUSY_RETRIES {
        match write().await {
            Err(error) if error.is_busy() => {
                tracing::warn!(%error, what, retry_in_ms = wait.as_millis() as u64, "database busy; trying again");
                tokio::time::sleep(wait).await;
            }
            done => return done,
        }
    }
    write().await
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

#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct User {
    pub user_id: UserId,
    pub chat_id: ChatId,
    pub username: Option<String>,
    /// `users.language`, read as a [`Language`] (an unknown code is English).
    #[sqlx(try_from = "String")]
    pub language: Language,
    pub timezone: String,
    pub created_at: String,
}

impl User {
    pub fn language(&self) -> Language {
        self.language
    }
}

/// What a handler knows about the sender of a message.
#[derive(Debug, Clone)]
pub struct NewUser<'a> {
    pub user_id: UserId,
    pub chat_id: ChatId,
    pub username: Option<&'a str>,
    /// Used only when the user is first seen; `/lang` changes it later.
    pub language: Language,
}

#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct DayLog {
    pub id: LogId,
    pub user_id: UserId,
    pub chat_id: ChatId,
    pub message_id: MessageId,
    pub text: String,
    pub created_at: String,
    pub status: LogStatus,
    pub analysis: Option<String>,
    pub metrics: Option<String>,
    pub attempts: i64,
    pub next_attempt_at: Option<String>,
    pub replied_at: Option<String>,
    /// The user's local day the entry belongs to (SPEC §10), `YYYY-MM-DD`.
    pub local_day: Option<String>,
}

#[derive(Debug, Clone)]
pub struct NewLog<'a> {
    pub user_id: UserId,
    pub chat_id: ChatId,
    pub message_id: MessageId,
    pub text: &'a str,
    /// The local day, fixed now; `None` falls back to the UTC date with the 4-hour rule.
    pub local_day: Option<jiff::civil::Date>,
}

/// A voice note to store (SPEC §11): the log starts with an empty text.
#[derive(Debug, Clone)]
pub struct NewVoiceLog<'a> {
    pub user_id: UserId,
    pub chat_id: ChatId,
    pub message_id: MessageId,
    /// Telegram's `file_id` (for `daylog chat`, the path of the file).
    pub file_id: &'a str,
    pub duration_s: Option<u32>,
    /// The local day, fixed now (SPEC §10); `None` falls back as for [`NewLog`].
    pub local_day: Option<jiff::civil::Date>,
}

/// One imported entry (SPEC §12), ready to store: `created_at` is UTC SQL text.
#[derive(Debug, Clone)]
pub struct NewImportLog<'a> {
    pub created_at: String,
    pub local_day: jiff::civil::Date,
    /// The wall-clock time the export gives (with `local_day`, what identifies the row).
    pub local_time: jiff::civil::Time,
    pub text: &'a str,
    /// The mood score the export named, `None` when the mood is defaulted.
    pub mood: Option<u8>,
    pub metrics_json: String,
}

/// What [`Store::import_logs`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ImportCounts {
    pub imported: u64,
    pub already: u64,
}

/// What the store knows of a voice log besides [`DayLog`] (`kind = 'voice'`).
#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct VoiceNote {
    pub file_id: String,
    pub duration_s: Option<i64>,
    /// When the transcript was shown to the user; `None` before.
    pub transcript_sent_at: Option<String>,
}

/// Where a log came from (`day_logs.source`, SPEC §7).
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

/// Whose unfinished logs a worker answers (SPEC §4.6): the daemon only Telegram's, a
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

/// Result of an idempotent insert.
#[derive(Debug, Clone, PartialEq)]
pub enum Inserted {
    /// The new row, as stored (so the caller does not read it back).
    New(Box<DayLog>),
    /// The same `(chat_id, message_id)` was stored before: a re-delivered update.
    Duplicate(LogId),
}

impl Inserted {
    pub fn id(&self) -> LogId {
        match self {
            Self::New(log) => log.id,
            Self::Duplicate(id) => *id,
        }
    }
}

pub use crate::day::DayMetrics;

/// A user's daily reminder (`reminders`).
#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct Reminder {
    pub user_id: UserId,
    pub local_time: String,
    pub enabled: bool,
    pub last_sent_day: Option<String>,
    pub next_due_at: Option<String>,
}

/// A reminder whose time has come, with what sending it needs to know of its user.
#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct DueReminder {
    pub user_id: UserId,
    pub chat_id: ChatId,
    #[sqlx(try_from = "String")]
    pub language: Language,
    pub timezone: String,
    pub local_time: String,
    pub last_sent_day: Option<String>,
    pub next_due_at: String,
}

/// The scheduler's query: due reminders, soonest first. Public so that tests and the
/// benchmark can check that it searches the `reminders_due` index.
pub const DUE_REMINDERS_SQL: &str =
    "SELECT r.user_id, u.chat_id, u.language, u.timezone, r.local_time,
            r.last_sent_day, r.next_due_at
     FROM reminders r JOIN users u ON u.user_id = r.user_id
     WHERE r.enabled = 1 AND r.next_due_at <= ?1
     ORDER BY r.next_due_at LIMIT ?2";

/// A weekly digest (`digests`, SPEC §10). `text` is `None` until it is written.
#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct Digest {
    pub id: i64,
    pub user_id: i64,
    pub chat_id: i64,
    /// Local day `YYYY-MM-DD`, the first of the 7 it covers.
    pub week_start: String,
    pub status: String,
    pub text: Option<String>,
    pub attempts: i64,
    pub created_at: String,
    /// The `/week` message that asked for it; `None` for the schedule or a terminal.
    pub message_id: Option<i64>,
}

const DIGEST_COLUMNS: &str =
    "id, user_id, chat_id, week_start, status, text, attempts, created_at, message_id";

/// A user whose Sunday digest is due, with what writing it needs to know.
#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct DueDigest {
    pub user_id: i64,
    pub chat_id: i64,
    pub timezone: String,
    /// The reminder's `HH:MM` when a reminder is on (the digest comes then).
    pub reminder_time: Option<String>,
    pub digest_next_at: String,
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
pub const DUE_DIGESTS_SQL: &str = "SELECT u.user_id, u.chat_id, u.timezone,
            CASE WHEN r.enabled = 1 THEN r.local_time END AS reminder_time, u.digest_next_at
     FROM users u LEFT JOIN reminders r ON r.user_id = u.user_id
     WHERE u.digest_enabled = 1 AND u.digest_next_at <= ?1
     ORDER BY u.digest_next_at LIMIT ?2";

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
const UNFINISHED_PENDING: &str =
    "status = 'pending' AND coalesce(next_attempt_at, '') <= datetime('now')";
/// A decided log whose answer has not gone out and is not waiting for a delivery retry.
const UNFINISHED_REPLY: &str = "status IN ('analyzed', 'blocked', 'failed') AND replied_at IS NULL
     AND (next_attempt_at IS NULL OR next_attempt_at <= datetime('now'))";

/// The columns of [`DayLog`], for queries that read whole logs.
macro_rules! log_columns {
    () => {
        "id, user_id, chat_id, message_id, text, created_at, status, analysis, metrics, \
         attempts, next_attempt_at, replied_at, local_day"
    };
}
const LOG_COLUMNS: &str = log_columns!();

/// `/history`: a user's last `?2` logs, newest first. Public so that tests can check
/// its query plan (it must search the `day_logs_user_created` index).
pub const HISTORY_SQL: &str = concat!(
    "SELECT ",
    log_columns!(),
    " FROM day_logs WHERE user_id = ?1 ORDER BY created_at DESC, id DESC LIMIT ?2"
);

/// `/stats` and the analysis context: per-day averages of a user from `?2` days ago on.
/// Public so that tests can check its query plan.
/// `?2` is the first local day (`YYYY-MM-DD`) of the period.
pub const DAILY_METRICS_SQL: &str = "SELECT day, mood, stress, energy, productivity, sleep_hours, logs FROM daily_metrics \
     WHERE user_id = ?1 AND day >= ?2 ORDER BY day";

/// The shared handle on the database. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    read: SqlitePool,
    write: SqlitePool,
    calls: CallRecorder,
    /// `users.timezone` of a user seen for the first time (`journal.default_timezone`).
    default_timezone: std::sync::Arc<str>,
}

/// The file behind a `sqlite:` URL, percent-decoded the way sqlx opens it (so every
/// command finds the same file). An empty path (`sqlite://`, which SQLite turns into a
/// temporary database) and in-memory databases are refused: entries in them would be
/// gone at exit.
pub fn database_path(url: &str) -> Result<PathBuf, StoreError> {
    let rest = url.strip_prefix("sqlite:").ok_or(StoreError::NotSqlite)?;
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let (path, params) = rest.split_once('?').unwrap_or((rest, ""));
    let in_memory = url::form_urlencoded::parse(params.as_bytes()).any(|(key, value)| {
        (key == "mode" && value == "memory") || (key == "vfs" && value == "memdb")
    });
    if path.trim().is_empty() || path == ":memory:" || in_memory {
        return Err(StoreError::NoFile);
    }
    // Every write would fail: each entry refused ("send it again") for ever.
    let read_only = url::form_urlencoded::parse(params.as_bytes()).any(|(key, value)| {
        (key == "mode" && value == "ro")
            || (key == "immutable" && !matches!(&*value, "0" | "false" | "no" | "off"))
    });
    if read_only {
        return Err(StoreError::ReadOnly);
    }
    let options =
        SqliteConnectOptions::from_str(url).map_err(|e| StoreError::BadUrl(e.to_string()))?;
    // sqlx opens with SQLITE_OPEN_URI: a decoded name such as `file::memory:` or
    // `file:x.db?mode=memory` is an in-memory database too.
    let name = options.get_filename().to_string_lossy();
    if name.starts_with("file:")
        && [":memory:", "mode=memory", "vfs=memdb"]
            .iter()
            .any(|word| name.contains(word))
    {
        return Err(StoreError::NoFile);
    }
    Ok(options.get_filename().to_path_buf())
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
        let file = database_path(url)?;
        let display = file.display().to_string();
        if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
                path: dir.display().to_string(),
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
        let calls = CallRecorder::spawn(write.clone());
        Ok(Self {
            read,
            write,
            calls,
            default_timezone: std::sync::Arc::from("UTC"),
        })
    }

    /// The same store, giving users seen for the first time this zone.
    pub fn with_default_timezone(mut self, zone: &crate::time::UserZone) -> Self {
        self.default_timezone = std::sync::Arc::from(zone.name());
        self
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
        self.check_not_newer().await?;
        MIGRATOR.run(&self.write).await?;
        Ok(())
    }

    /// Whether every migration this build knows has been applied.
    pub async fn is_migrated(&self) -> Result<bool, StoreError> {
        let applied = self.applied_versions().await?;
        Ok(MIGRATOR.iter().all(|m| applied.contains(&m.version)))
    }

    /// The checks `sqlx::migrate` makes before it runs anything: an applied migration
    /// whose checksum is not this build's, or one that failed part-way, makes `daylog
    /// run` refuse to start, so `doctor` must not call such a database migrated.
    async fn check_checksums(&self) -> Result<(), StoreError> {
        if self.applied_versions().await?.is_empty() {
            return Ok(());
        }
        let applied: Vec<(i64, bool, Vec<u8>)> = sqlx::query_as(
            "SELECT version, success, checksum FROM _sqlx_migrations ORDER BY version",
        )
        .fetch_all(&self.read)
        .await?;
        for (version, success, checksum) in applied {
            if !success {
                // A migration that failed part-way: `migrate` refuses to go on as well.
                return Err(StoreError::Migrate(sqlx::migrate::MigrateError::Dirty(
                    version,
                )));
            }
            if let Some(known) = MIGRATOR.iter().find(|m| m.version == version)
                && *known.checksum != *checksum
            {
                return Err(StoreError::MigrationChanged { version });
            }
        }
        Ok(())
    }

    async fn applied_versions(&self) -> Result<Vec<i64>, StoreError> {
        let exists: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
        )
        .fetch_one(&self.read)
        .await?;
        if exists == 0 {
            return Ok(Vec::new());
        }
        Ok(
            sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success = 1")
                .fetch_all(&self.read)
                .await?,
        )
    }

    async fn check_not_newer(&self) -> Result<(), StoreError> {
        let known = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
        let found = self
            .applied_versions()
            .await?
            .into_iter()
            .max()
            .unwrap_or(0);
        if found > known {
            return Err(StoreError::NewerSchema { found, known });
        }
        Ok(())
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
        self.write.close().await;
        self.read.close().await;
    }

    // ---- users ----

    /// Creates the user or refreshes its chat and username; keeps a chosen language.
    pub async fn upsert_user(&self, user: &NewUser<'_>) -> Result<User, StoreError> {
        retry_busy("upsert_user", || async {
            let rows = sqlx::query_as::<_, User>(
                "INSERT INTO users (user_id, chat_id, username, language, timezone)
                 VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (user_id) DO UPDATE SET chat_id = excluded.chat_id,
                 username = excluded.username
             RETURNING user_id, chat_id, username, language, timezone, created_at",
            )
            .bind(user.user_id)
            .bind(user.chat_id)
            .bind(user.username)
            .bind(user.language.code())
            .bind(&*self.default_timezone)
            .fetch_all(&self.write)
            .await?;
            returned(rows).ok_or(StoreError::Sql(sqlx::Error::RowNotFound))
        })
        .await
    }

    pub async fn user(&self, user_id: UserId) -> Result<Option<User>, StoreError> {
        Ok(sqlx::query_as::<_, User>(
            "SELECT user_id, chat_id, username, language, timezone, created_at
             FROM users WHERE user_id = ?1",
        )
        .bind(user_id)
        .fetch_optional(&self.read)
        .await?)
    }

    pub async fn set_language(
        &self,
        user_id: UserId,
        language: Language,
    ) -> Result<(), StoreError> {
        retry_busy("set_language", || async {
            let done = sqlx::query("UPDATE users SET language = ?2 WHERE user_id = ?1")
                .bind(user_id)
                .bind(language.code())
                .execute(&self.write)
                .await?;
            if done.rows_affected() == 0 {
                // No such user (its insert failed, e.g. on a full disk): nothing was
                // saved, so the caller must not say that the language is set.
                return Err(StoreError::Sql(sqlx::Error::RowNotFound));
            }
            Ok(())
        })
        .await
    }

    /// `/tz`: the user's zone from now on (entries already stored keep their day).
    pub async fn set_timezone(
        &self,
        user_id: UserId,
        zone: &crate::time::UserZone,
    ) -> Result<(), StoreError> {
        retry_busy("set_timezone", || async {
            sqlx::query("UPDATE users SET timezone = ?2 WHERE user_id = ?1")
                .bind(user_id)
                .bind(zone.name())
                .execute(&self.write)
                .await?;
            Ok(())
        })
        .await
    }

    /// Removes the user and, by cascade, every log and LLM call of theirs. Returns how
    /// many logs went.
    pub async fn delete_user(&self, user_id: UserId) -> Result<u64, StoreError> {
        retry_busy("delete_user", || async {
            let mut tx = self.write.begin().await?;
            let logs = sqlx::query("DELETE FROM day_logs WHERE user_id = ?1")
                .bind(user_id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            sqlx::query("DELETE FROM users WHERE user_id = ?1")
                .bind(user_id)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(logs)
        })
        .await
    }

    // ---- day logs ----

    /// Stores a log as pending, or finds the one stored for the same message before.
    pub async fn insert_log(&self, log: &NewLog<'_>) -> Result<Inserted, StoreError> {
        retry_busy("insert_log", || async {
            // One statement, so no transaction: the hot path is a single round trip.
            let inserted: Vec<DayLog> = sqlx::query_as(&format!(
                "INSERT INTO day_logs (user_id, chat_id, message_id, text, next_attempt_at, local_day)
                 VALUES (?1, ?2, ?3, ?4, datetime('now'), ?5)
                 ON CONFLICT (chat_id, message_id) DO NOTHING
                 RETURNING {LOG_COLUMNS}"
            ))
            .bind(log.user_id)
            .bind(log.chat_id)
            .bind(log.message_id)
            .bind(log.text)
            .bind(log.local_day.map(|day| day.to_string()))
            .fetch_all(&self.write)
            .await?;
            Ok(match returned(inserted) {
                Some(row) => Inserted::New(Box::new(row)),
                None => Inserted::Duplicate(
                    sqlx::query_scalar(
                        "SELECT id FROM day_logs WHERE chat_id = ?1 AND message_id = ?2",
                    )
                    .bind(log.chat_id)
                    .bind(log.message_id)
                    .fetch_one(&self.write)
                    .await?,
                ),
            })
        })
        .await
    }

    pub async fn log(&self, id: LogId) -> Result<Option<DayLog>, StoreError> {
        Ok(sqlx::query_as::<_, DayLog>(&format!(
            "SELECT {LOG_COLUMNS} FROM day_logs WHERE id = ?1"
        ))
        .bind(id)
        .fetch_optional(&self.read)
        .await?)
    }

    /// An edited message: new text, and the log goes back to pending to be analysed again.
    /// Returns the updated log, or `None` when the message was never stored or its text
    /// did not change (an edit of formatting only).
    pub async fn update_text(
        &self,
        chat_id: ChatId,
        message_id: MessageId,
        text: &str,
    ) -> Result<Option<DayLog>, StoreError> {
        retry_busy("update_text", || async {
            let rows: Vec<DayLog> = sqlx::query_as(&format!(
                "UPDATE day_logs SET text = ?3, status = 'pending', analysis = NULL, metrics = NULL,
                     attempts = 0, next_attempt_at = datetime('now'), replied_at = NULL
                 WHERE chat_id = ?1 AND message_id = ?2 AND text <> ?3
                 RETURNING {LOG_COLUMNS}"
            ))
            .bind(chat_id)
            .bind(message_id)
            .bind(text)
            .fetch_all(&self.write)
            .await?;
            Ok(returned(rows))
        })
        .await
    }

    /// Stores a line typed in `daylog chat` by `user_id` (its own chat) as a pending log
    /// with `source = 'chat'`. Its message id is the chat's lowest so far minus one,
    /// chosen inside the insert: Telegram's ids are positive, so they never meet, and the
    /// statement runs under SQLite's write lock, so two terminals on one database never
    /// take the same id (a number read before the insert could already be taken).
    pub async fn insert_chat_log(
        &self,
        user_id: UserId,
        text: &str,
        local_day: Option<jiff::civil::Date>,
    ) -> Result<DayLog, StoreError> {
        retry_busy("insert_chat_log", || async {
            // Every row is read (there is one), so the statement runs to its end and a
            // failure to commit is this call's error, not lost in a reset.
            let mut rows: Vec<DayLog> = sqlx::query_as(&format!(
                "INSERT INTO day_logs (user_id, chat_id, message_id, text, next_attempt_at, source,
                     local_day)
                 SELECT ?1, ?1, min(coalesce(min(message_id), 0), 0) - 1, ?2, datetime('now'), ?3, ?4
                 FROM day_logs WHERE chat_id = ?1
                 RETURNING {LOG_COLUMNS}"
            ))
            .bind(user_id)
            .bind(text)
            .bind(Source::Chat.as_str())
            .bind(local_day.map(|day| day.to_string()))
            .fetch_all(&self.write)
            .await?;
            rows.pop().ok_or(StoreError::Sql(sqlx::Error::RowNotFound))
        })
        .await
    }

    /// Stores imported entries (SPEC §12) in one transaction: analysed, replied, with
    /// `source = 'import'`. They take `chat_id = user_id` and negative message ids from the
    /// same `min - 1` sequence as [`Store::insert_chat_log`], so they never meet a Telegram
    /// id (always positive) nor a terminal one. An entry with the same local day,
    /// wall-clock time, mood and text as an imported one already stored is counted as
    /// already there, whatever the user's zone was then or is now (`import_time`).
    pub async fn import_logs(
        &self,
        user_id: UserId,
        logs: &[NewImportLog<'_>],
    ) -> Result<ImportCounts, StoreError> {
        retry_busy("import_logs", || async {
            let mut counts = ImportCounts::default();
            let mut tx = self.write.begin().await?;
            for log in logs {
                let day = log.local_day.to_string();
                let time = log.local_time.strftime("%H:%M").to_string();
                // A row imported before `import_time` existed has none: it is the same
                // row when its UTC time is (it was imported in the zone of this import),
                // and it gets its wall-clock time now.
                let found: Option<(i64, bool)> = sqlx::query_as(
                    "SELECT id, import_time IS NULL FROM day_logs
                     WHERE user_id = ?1 AND source = 'import' AND local_day = ?2
                       AND (import_time = ?3 OR (import_time IS NULL AND created_at = ?4))
                       AND text = ?5 AND mood IS ?6
                     LIMIT 1",
                )
                .bind(user_id)
                .bind(&day)
                .bind(&time)
                .bind(&log.created_at)
                .bind(log.text)
                .bind(log.mood)
                .fetch_optional(&mut *tx)
                .await?;
                if let Some((id, legacy)) = found {
                    if legacy {
                        sqlx::query("UPDATE day_logs SET import_time = ?2 WHERE id = ?1")
                            .bind(id)
                            .bind(&time)
                            .execute(&mut *tx)
                            .await?;
                    }
                    counts.already += 1;
                    continue;
                }
                // The metrics go in with the row: the insert trigger of the metric
                // columns sets them again as an update, so the columns and the day's
                // activities follow as for an analysed entry, in the same statement.
                let inserted = sqlx::query(
                    "INSERT INTO day_logs (user_id, chat_id, message_id, text, created_at, status,
                         replied_at, source, local_day, import_time, metrics)
                     SELECT ?1, ?1, min(coalesce(min(message_id), 0), 0) - 1, ?2, ?3, 'analyzed',
                         datetime('now'), 'import', ?4, ?5, ?6
                     FROM day_logs WHERE chat_id = ?1",
                )
                .bind(user_id)
                .bind(log.text)
                .bind(&log.created_at)
                .bind(&day)
                .bind(&time)
                .bind(&log.metrics_json)
                .execute(&mut *tx)
                .await?;
                if inserted.rows_affected() != 1 {
                    return Err(StoreError::Sql(sqlx::Error::RowNotFound));
                }
                counts.imported += 1;
            }
            tx.commit().await?;
            Ok(counts)
        })
        .await
    }

    /// Stores a voice note as a pending log with an empty text (`kind = 'voice'`), or
    /// finds the one stored for the same message before.
    pub async fn insert_voice_log(&self, log: &NewVoiceLog<'_>) -> Result<Inserted, StoreError> {
        retry_busy("insert_voice_log", || async {
            // Every row is read, so a failure to commit is this call's error.
            let mut rows: Vec<DayLog> = sqlx::query_as(&format!(
                "INSERT INTO day_logs (user_id, chat_id, message_id, text, next_attempt_at,
                     kind, file_id, duration_s, local_day)
                 VALUES (?1, ?2, ?3, '', datetime('now'), 'voice', ?4, ?5, ?6)
                 ON CONFLICT (chat_id, message_id) DO NOTHING
                 RETURNING {LOG_COLUMNS}"
            ))
            .bind(log.user_id)
            .bind(log.chat_id)
            .bind(log.message_id)
            .bind(log.file_id)
            .bind(log.duration_s)
            .bind(log.local_day.map(|day| day.to_string()))
            .fetch_all(&self.write)
            .await?;
            Ok(match rows.pop() {
                Some(row) => Inserted::New(Box::new(row)),
                None => Inserted::Duplicate(
                    sqlx::query_scalar(
                        "SELECT id FROM day_logs WHERE chat_id = ?1 AND message_id = ?2",
                    )
                    .bind(log.chat_id)
                    .bind(log.message_id)
                    .fetch_one(&self.write)
                    .await?,
                ),
            })
        })
        .await
    }

    /// Stores a voice note given to `daylog chat` (`source = 'chat'`), numbered like
    /// [`Store::insert_chat_log`]; `file` is the path it is read again from.
    pub async fn insert_chat_voice_log(
        &self,
        user_id: UserId,
        file: &str,
        duration_s: Option<u32>,
        local_day: Option<jiff::civil::Date>,
    ) -> Result<DayLog, StoreError> {
        retry_busy("insert_chat_voice_log", || async {
            let mut rows: Vec<DayLog> = sqlx::query_as(&format!(
                "INSERT INTO day_logs (user_id, chat_id, message_id, text, next_attempt_at, source,
                     kind, file_id, duration_s, local_day)
                 SELECT ?1, ?1, min(coalesce(min(message_id), 0), 0) - 1, '', datetime('now'), ?2,
                     'voice', ?3, ?4, ?5
                 FROM day_logs WHERE chat_id = ?1
                 RETURNING {LOG_COLUMNS}"
            ))
            .bind(user_id)
            .bind(Source::Chat.as_str())
            .bind(file)
            .bind(duration_s)
            .bind(local_day.map(|day| day.to_string()))
            .fetch_all(&self.write)
            .await?;
            rows.pop().ok_or(StoreError::Sql(sqlx::Error::RowNotFound))
        })
        .await
    }

    /// The voice part of a log, read fresh; `None` for a text log.
    pub async fn voice_note(&self, id: LogId) -> Result<Option<VoiceNote>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT file_id, duration_s, transcript_sent_at FROM day_logs
             WHERE id = ?1 AND kind = 'voice' AND file_id IS NOT NULL",
        )
        .bind(id)
        .fetch_optional(&self.write)
        .await?)
    }

    /// Stores a voice note's transcript as its text, only if it has none yet and is
    /// still pending (a second transcription never overwrites the first). The log as
    /// stored, or `None` when nothing changed.
    pub async fn store_transcript(
        &self,
        id: LogId,
        transcript: &str,
    ) -> Result<Option<DayLog>, StoreError> {
        retry_busy("store_transcript", || async {
            let mut rows: Vec<DayLog> = sqlx::query_as(&format!(
                "UPDATE day_logs SET text = ?2
                 WHERE id = ?1 AND kind = 'voice' AND text = '' AND status = 'pending'
                 RETURNING {LOG_COLUMNS}"
            ))
            .bind(id)
            .bind(transcript)
            .fetch_all(&self.write)
            .await?;
            Ok(rows.pop())
        })
        .await
    }

    /// The transcript reached the user (or never can): it is not shown again.
    pub async fn mark_transcript_sent(&self, id: LogId) -> Result<(), StoreError> {
        retry_busy("mark_transcript_sent", || async {
            sqlx::query(
                "UPDATE day_logs SET transcript_sent_at = datetime('now')
                 WHERE id = ?1 AND transcript_sent_at IS NULL",
            )
            .bind(id)
            .execute(&self.write)
            .await?;
            Ok(())
        })
        .await
    }

    /// Stores the analysis of `analysed_text`. Returns `false`, changing nothing, when the
    /// log's text is no longer that text (edited meanwhile) or it is no longer pending.
    pub async fn mark_analyzed(
        &self,
        id: LogId,
        analysed_text: &str,
        analysis: &str,
        metrics_json: &str,
    ) -> Result<bool, StoreError> {
        retry_busy("mark_analyzed", || async {
            let done = sqlx::query(
                "UPDATE day_logs SET status = 'analyzed', analysis = ?3, metrics = ?4,
                     attempts = attempts + 1, next_attempt_at = NULL, replied_at = NULL
                 WHERE id = ?1 AND text = ?2 AND status = 'pending'",
            )
            .bind(id)
            .bind(analysed_text)
            .bind(analysis)
            .bind(metrics_json)
            .execute(&self.write)
            .await?;
            Ok(done.rows_affected() == 1)
        })
        .await
    }

    /// The analysis of `analysed_text` failed for now: try again after `retry_in`.
    /// `false` when the log changed meanwhile (see [`Store::mark_analyzed`]).
    pub async fn mark_retry(
        &self,
        id: LogId,
        analysed_text: &str,
        retry_in: Duration,
    ) -> Result<bool, StoreError> {
        retry_busy("mark_retry", || async {
            let done = sqlx::query(
                "UPDATE day_logs SET attempts = attempts + 1,
                     next_attempt_at = datetime('now', '+' || ?3 || ' seconds')
                 WHERE id = ?1 AND text = ?2 AND status = 'pending'",
            )
            .bind(id)
            .bind(analysed_text)
            .bind(retry_in.as_secs_f64())
            .execute(&self.write)
            .await?;
            Ok(done.rows_affected() == 1)
        })
        .await
    }

    /// Postpones a pending log without counting an attempt (the per-user hourly limit).
    pub async fn defer(&self, id: LogId, retry_in: Duration) -> Result<(), StoreError> {
        self.schedule(
            "defer",
            "UPDATE day_logs SET next_attempt_at = datetime('now', '+' || ?2 || ' seconds')
             WHERE id = ?1 AND status = 'pending'",
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
            "UPDATE day_logs SET next_attempt_at = datetime('now', '+' || ?2 || ' seconds')
             WHERE id = ?1 AND status <> 'pending' AND replied_at IS NULL",
            id,
            retry_in,
        )
        .await
    }

    /// Runs one of the `next_attempt_at` updates above (`?1` the id, `?2` seconds).
    async fn schedule(
        &self,
        what: &'static str,
        sql: &'static str,
        id: LogId,
        retry_in: Duration,
    ) -> Result<(), StoreError> {
        retry_busy(what, || async {
            sqlx::query(sql)
                .bind(id)
                .bind(retry_in.as_secs_f64())
                .execute(&self.write)
                .await?;
            Ok(())
        })
        .await
    }

    /// A content-policy refusal of `analysed_text`: never retried. Metrics may still have
    /// been extracted. `false` when the log changed meanwhile.
    pub async fn mark_blocked(
        &self,
        id: LogId,
        analysed_text: &str,
        metrics_json: Option<&str>,
    ) -> Result<bool, StoreError> {
        retry_busy("mark_blocked", || async {
            let done = sqlx::query(
                "UPDATE day_logs SET status = 'blocked', metrics = coalesce(?3, metrics),
                     attempts = attempts + 1, next_attempt_at = NULL, replied_at = NULL
                 WHERE id = ?1 AND text = ?2 AND status = 'pending'",
            )
            .bind(id)
            .bind(analysed_text)
            .bind(metrics_json)
            .execute(&self.write)
            .await?;
            Ok(done.rows_affected() == 1)
        })
        .await
    }

    /// Given up on `text` after `worker.max_age_hours`. `false` when the log changed
    /// meanwhile (an edit: it is pending again, with a fresh text).
    pub async fn mark_failed(&self, id: LogId, text: &str) -> Result<bool, StoreError> {
        retry_busy("mark_failed", || async {
            let done = sqlx::query(
                "UPDATE day_logs SET status = 'failed', next_attempt_at = NULL, replied_at = NULL
                 WHERE id = ?1 AND text = ?2 AND status = 'pending'",
            )
            .bind(id)
            .bind(text)
            .execute(&self.write)
            .await?;
            Ok(done.rows_affected() == 1)
        })
        .await
    }

    /// The final answer for this log reached the user. A log that went back to pending
    /// meanwhile (edited) is left alone: its new answer is still owed.
    pub async fn mark_replied(&self, id: LogId) -> Result<(), StoreError> {
        retry_busy("mark_replied", || async {
            sqlx::query(
                "UPDATE day_logs SET replied_at = datetime('now')
                 WHERE id = ?1 AND status <> 'pending'",
            )
            .bind(id)
            .execute(&self.write)
            .await?;
            Ok(())
        })
        .await
    }

    /// Logs the worker of `front_end` must finish: pending ones whose retry is due, and
    /// any that were decided (analysed, blocked, failed) but whose answer never went out
    /// (and is not waiting for a delivery retry). Only that front end's own logs (SPEC
    /// §4.6). Oldest first.
    pub async fn unfinished(
        &self,
        front_end: FrontEnd,
        limit: i64,
    ) -> Result<Vec<(Unfinished, DayLog)>, StoreError> {
        const OWN: &str = "source = ?2 AND (?3 IS NULL OR user_id = ?3)";
        let rows = sqlx::query_as::<_, DayLog>(&format!(
            "SELECT {LOG_COLUMNS} FROM day_logs WHERE {UNFINISHED_PENDING} AND {OWN}
             UNION ALL
             SELECT {LOG_COLUMNS} FROM day_logs WHERE {UNFINISHED_REPLY} AND {OWN}
             ORDER BY id LIMIT ?1"
        ))
        .bind(limit)
        .bind(front_end.source().as_str())
        .bind(front_end.user_id())
        .fetch_all(&self.read)
        .await?;
        Ok(rows.into_iter().map(Unfinished::classify).collect())
    }

    /// The same test as [`Store::unfinished`] for one log, read fresh through the writer:
    /// what is left to do on it now, if anything (another task may have finished it).
    pub async fn unfinished_one(
        &self,
        id: LogId,
    ) -> Result<Option<(Unfinished, DayLog)>, StoreError> {
        let log = sqlx::query_as::<_, DayLog>(&format!(
            "SELECT {LOG_COLUMNS} FROM day_logs
             WHERE id = ?1 AND (({UNFINISHED_PENDING}) OR ({UNFINISHED_REPLY}))"
        ))
        .bind(id)
        .fetch_optional(&self.write)
        .await?;
        Ok(log.map(Unfinished::classify))
    }

    /// Seconds since the log was stored.
    pub async fn log_age(&self, id: LogId) -> Result<Option<Duration>, StoreError> {
        let secs: Option<f64> = sqlx::query_scalar(
            "SELECT (julianday('now') - julianday(created_at)) * 86400.0 FROM day_logs WHERE id = ?1",
        )
        .bind(id)
        .fetch_optional(&self.read)
        .await?;
        Ok(secs.map(|s| Duration::from_secs_f64(s.max(0.0))))
    }

    /// Entries the user stored in the hour before log `id` (for the per-user limit on
    /// analyses: entries beyond it are saved and analysed later).
    pub async fn entries_last_hour(&self, user_id: UserId, id: LogId) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM day_logs
             WHERE user_id = ?1 AND id < ?2 AND created_at >= datetime('now', '-1 hour')",
        )
        .bind(user_id)
        .bind(id)
        .fetch_one(&self.read)
        .await?)
    }

    /// The user's last `limit` logs, newest first.
    pub async fn history(&self, user_id: UserId, limit: i64) -> Result<Vec<DayLog>, StoreError> {
        Ok(sqlx::query_as::<_, DayLog>(HISTORY_SQL)
            .bind(user_id)
            .bind(limit)
            .fetch_all(&self.read)
            .await?)
    }

    /// Every log of the user, oldest first (for `/export`).
    pub async fn export(&self, user_id: UserId) -> Result<Vec<DayLog>, StoreError> {
        Ok(sqlx::query_as::<_, DayLog>(&format!(
            "SELECT {LOG_COLUMNS} FROM day_logs WHERE user_id = ?1 ORDER BY created_at, id"
        ))
        .bind(user_id)
        .fetch_all(&self.read)
        .await?)
    }

    /// Per-local-day averages from local day `first` on, oldest first.
    pub async fn daily_metrics(
        &self,
        user_id: UserId,
        first: jiff::civil::Date,
    ) -> Result<Vec<DayMetrics>, StoreError> {
        Ok(sqlx::query_as::<_, DayMetrics>(DAILY_METRICS_SQL)
            .bind(user_id)
            .bind(first.to_string())
            .fetch_all(&self.read)
            .await?)
    }

    /// Every local day on which the user wrote something, newest first (streaks). Reads
    /// the `day_logs_user_day` index only.
    pub async fn entry_days(&self, user_id: UserId) -> Result<Vec<String>, StoreError> {
        // One index seek per day (a loose index scan), not one step per entry: a year
        // of a busy journal is ~365 seeks instead of tens of thousands of index rows.
        Ok(sqlx::query_scalar(
            "WITH RECURSIVE days(day) AS (
                 SELECT max(local_day) FROM day_logs WHERE user_id = ?1
                 UNION ALL
                 SELECT (SELECT max(local_day) FROM day_logs
                         WHERE user_id = ?1 AND local_day < days.day)
                 FROM days WHERE days.day IS NOT NULL
             )
             SELECT day FROM days WHERE day IS NOT NULL",
        )
        .bind(user_id)
        .fetch_all(&self.read)
        .await?)
    }

    /// The distinct activities of each local day from `first` on (what goes with good
    /// days, SPEC §10), from `day_activities`.
    pub async fn day_activities(
        &self,
        user_id: UserId,
        first: jiff::civil::Date,
    ) -> Result<Vec<(String, String)>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT local_day, activity FROM day_activities
             WHERE user_id = ?1 AND local_day >= ?2",
        )
        .bind(user_id)
        .bind(first.to_string())
        .fetch_all(&self.read)
        .await?)
    }

    /// Whether the user has an entry for local day `day`.
    pub async fn has_entry_on(
        &self,
        user_id: UserId,
        day: jiff::civil::Date,
    ) -> Result<bool, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM day_logs WHERE user_id = ?1 AND local_day = ?2)",
        )
        .bind(user_id)
        .bind(day.to_string())
        .fetch_one(&self.read)
        .await?)
    }

    /// Summaries (from stored metrics) of the user's last `limit` analysed logs before
    /// `before_id`, newest first, skipping empty ones.
    pub async fn recent_summaries(
        &self,
        user_id: UserId,
        before_id: LogId,
        limit: i64,
    ) -> Result<Vec<String>, StoreError> {
        // Newest first through (user_id, created_at), so SQLite stops after `limit` hits
        // instead of reading the user's whole history.
        Ok(sqlx::query_scalar(
            "SELECT json_extract(metrics, '$.summary') FROM day_logs
             WHERE user_id = ?1 AND id < ?2 AND metrics IS NOT NULL
               AND coalesce(json_extract(metrics, '$.summary'), '') <> ''
             ORDER BY created_at DESC, id DESC LIMIT ?3",
        )
        .bind(user_id)
        .bind(before_id)
        .bind(limit)
        .fetch_all(&self.read)
        .await?)
    }

    // ---- Content-policy refusals (SPEC §5) ----

    /// The models (provider, model) that refused this log's current text on content
    /// policy: they are never asked about it again.
    pub async fn refusals(&self, day_log_id: LogId) -> Result<Vec<(String, String)>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT provider, model FROM llm_refusals WHERE day_log_id = ?1
             ORDER BY created_at, provider, model",
        )
        .bind(day_log_id)
        .fetch_all(&self.read)
        .await?)
    }

    /// Remembers that these models refused `analysed_text` of this log. Nothing is
    /// stored when the log's text has changed meanwhile (an edit is a new question).
    pub async fn record_refusals(
        &self,
        day_log_id: LogId,
        analysed_text: &str,
        refused: &[(String, String)],
    ) -> Result<(), StoreError> {
        for (provider, model) in refused {
            retry_busy("record_refusals", || async {
                sqlx::query(
                    "INSERT INTO llm_refusals (day_log_id, provider, model)
                     SELECT id, ?2, ?3 FROM day_logs WHERE id = ?1 AND text = ?4
                     ON CONFLICT DO NOTHING",
                )
                .bind(day_log_id)
                .bind(provider)
                .bind(model)
                .bind(analysed_text)
                .execute(&self.write)
                .await?;
                Ok(())
            })
            .await?;
        }
        Ok(())
    }

    // ---- Spent daily budgets (SPEC §5) ----

    /// Stores daily budgets spent until their reset; rows already over are pruned.
    pub async fn save_spent_budgets(&self, spent: &[SpentBudget]) -> Result<(), StoreError> {
        for s in spent {
            let until = unix_secs(s.until);
            let key_index = s
                .key_index
                .and_then(|i| i64::try_from(i).ok())
                .unwrap_or(-1);
            retry_busy("save_spent_budgets", || async {
                sqlx::query(
                    "INSERT INTO llm_budgets (provider, scope, key_index, spent_until, reason)
                     VALUES (?1, ?2, ?3, datetime(?4, 'unixepoch'), 'per-day quota')
                     ON CONFLICT (provider, scope, key_index) DO UPDATE SET
                         spent_until = excluded.spent_until, reason = excluded.reason,
                         updated_at = datetime('now')",
                )
                .bind(&s.provider)
                .bind(&s.scope)
                .bind(key_index)
                .bind(until)
                .execute(&self.write)
                .await?;
                Ok(())
            })
            .await?;
        }
        retry_busy("prune_budgets", || async {
            sqlx::query("DELETE FROM llm_budgets WHERE spent_until <= datetime('now')")
                .execute(&self.write)
                .await?;
            Ok(())
        })
        .await
    }

    /// The daily budgets stored as spent and not yet reset.
    pub async fn spent_budgets(&self) -> Result<Vec<SpentBudget>, StoreError> {
        let rows: Vec<(String, String, i64, i64)> = sqlx::query_as(
            "SELECT provider, scope, key_index, CAST(strftime('%s', spent_until) AS INTEGER)
             FROM llm_budgets WHERE spent_until > datetime('now')
             ORDER BY provider, scope, key_index",
        )
        .fetch_all(&self.read)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(provider, scope, key_index, until)| SpentBudget {
                provider,
                scope,
                key_index: usize::try_from(key_index).ok(),
                until: std::time::SystemTime::UNIX_EPOCH
                    + Duration::from_secs(u64::try_from(until).unwrap_or(0)),
            })
            .collect())
    }

    // ---- reminders ----

    pub async fn reminder(&self, user_id: UserId) -> Result<Option<Reminder>, StoreError> {
        Ok(sqlx::query_as::<_, Reminder>(
            "SELECT user_id, local_time, enabled, last_sent_day, next_due_at
             FROM reminders WHERE user_id = ?1",
        )
        .bind(user_id)
        .fetch_optional(&self.read)
        .await?)
    }

    /// `/remind HH:MM`: on, at that time, next due at `next_due_at`. The day of the last
    /// reminder is kept, so a new time cannot bring a second reminder the same day.
    pub async fn set_reminder(
        &self,
        user_id: UserId,
        local_time: &str,
        next_due_at: &str,
    ) -> Result<(), StoreError> {
        retry_busy("set_reminder", || async {
            sqlx::query(
                "INSERT INTO reminders (user_id, local_time, enabled, next_due_at)
                 VALUES (?1, ?2, 1, ?3)
                 ON CONFLICT (user_id) DO UPDATE SET local_time = excluded.local_time,
                     enabled = 1, next_due_at = excluded.next_due_at",
            )
            .bind(user_id)
            .bind(local_time)
            .bind(next_due_at)
            .execute(&self.write)
            .await?;
            Ok(())
        })
        .await
    }

    /// `/remind off`, or Telegram said the user blocked the bot.
    pub async fn disable_reminder(&self, user_id: UserId) -> Result<(), StoreError> {
        retry_busy("disable_reminder", || async {
            sqlx::query("UPDATE reminders SET enabled = 0, next_due_at = NULL WHERE user_id = ?1")
                .bind(user_id)
                .execute(&self.write)
                .await?;
            Ok(())
        })
        .await
    }

    /// A new zone: the reminder (if on) is next due at `next_due_at`.
    pub async fn reschedule_reminder(
        &self,
        user_id: UserId,
        next_due_at: &str,
    ) -> Result<(), StoreError> {
        retry_busy("reschedule_reminder", || async {
            sqlx::query("UPDATE reminders SET next_due_at = ?2 WHERE user_id = ?1 AND enabled = 1")
                .bind(user_id)
                .bind(next_due_at)
                .execute(&self.write)
                .await?;
            Ok(())
        })
        .await
    }

    /// Reminders due at `now` (UTC `YYYY-MM-DD HH:MM:SS`), soonest first.
    pub async fn due_reminders(
        &self,
        now: &str,
        limit: i64,
    ) -> Result<Vec<DueReminder>, StoreError> {
        Ok(sqlx::query_as::<_, DueReminder>(DUE_REMINDERS_SQL)
            .bind(now)
            .bind(limit)
            .fetch_all(&self.read)
            .await?)
    }

    /// Moves a due reminder on to `next_due_at`, recording `sent_day` as sent when
    /// given — in one statement, before anything is sent, so that two ticks (or a
    /// restart) can never both send it. `false` when someone else moved it first.
    pub async fn advance_reminder(
        &self,
        user_id: UserId,
        due_at: &str,
        sent_day: Option<&str>,
        next_due_at: &str,
    ) -> Result<bool, StoreError> {
        retry_busy("advance_reminder", || async {
            let done = sqlx::query(
                "UPDATE reminders SET next_due_at = ?4, last_sent_day = coalesce(?3, last_sent_day)
                 WHERE user_id = ?1 AND enabled = 1 AND next_due_at = ?2
                   AND (?3 IS NULL OR coalesce(last_sent_day, '') <> ?3)",
            )
            .bind(user_id)
            .bind(due_at)
            .bind(sent_day)
            .bind(next_due_at)
            .execute(&self.write)
            .await?;
            Ok(done.rows_affected() == 1)
        })
        .await
    }

    /// Undoes [`Store::advance_reminder`] after a delivery that failed for a passing
    /// reason, so the next tick tries again (within `reminders.max_late_minutes`).
    pub async fn restore_reminder(
        &self,
        user_id: UserId,
        due_at: &str,
        last_sent_day: Option<&str>,
        advanced_to: &str,
    ) -> Result<(), StoreError> {
        retry_busy("restore_reminder", || async {
            sqlx::query(
                "UPDATE reminders SET next_due_at = ?2, last_sent_day = ?3
                 WHERE user_id = ?1 AND enabled = 1 AND next_due_at = ?4",
            )
            .bind(user_id)
            .bind(due_at)
            .bind(last_sent_day)
            .bind(advanced_to)
            .execute(&self.write)
            .await?;
            Ok(())
        })
        .await
    }

    // ---- weekly digests (SPEC §10) ----

    /// Whether the user's Sunday digest is on (`false` for a user not stored).
    pub async fn digest_enabled(&self, user_id: i64) -> Result<bool, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT digest_enabled FROM users WHERE user_id = ?1")
                .bind(user_id)
                .fetch_optional(&self.read)
                .await?
                .unwrap_or(false),
        )
    }

    /// `/digest on` (next due at `next_at`) or `/digest off` (`None`). An error when
    /// the user is not stored, so that nothing says "on" that is not.
    pub async fn set_digest(&self, user_id: i64, next_at: Option<&str>) -> Result<(), StoreError> {
        retry_busy("set_digest", || async {
            let done = sqlx::query(
                "UPDATE users SET digest_enabled = ?2 IS NOT NULL, digest_next_at = ?2
                 WHERE user_id = ?1",
            )
            .bind(user_id)
            .bind(next_at)
            .execute(&self.write)
            .await?;
            if done.rows_affected() == 0 {
                return Err(StoreError::Sql(sqlx::Error::RowNotFound));
            }
            Ok(())
        })
        .await
    }

    /// A new zone or reminder time: the Sunday digest (if on) is next due at `next_at`,
    /// unless it is already due at `now` (UTC text): that one is left to the scheduler,
    /// which sends it and moves on with the new settings, rather than skipped.
    pub async fn reschedule_digest(
        &self,
        user_id: i64,
        next_at: &str,
        now: &str,
    ) -> Result<(), StoreError> {
        retry_busy("reschedule_digest", || async {
            sqlx::query(
                "UPDATE users SET digest_next_at = ?2
                 WHERE user_id = ?1 AND digest_enabled = 1
                   AND (digest_next_at IS NULL OR digest_next_at > ?3)",
            )
            .bind(user_id)
            .bind(next_at)
            .bind(now)
            .execute(&self.write)
            .await?;
            Ok(())
        })
        .await
    }

    /// Users whose Sunday digest is due at `now` (UTC text), soonest first.
    pub async fn due_digest_users(
        &self,
        now: &str,
        limit: i64,
    ) -> Result<Vec<DueDigest>, StoreError> {
        Ok(sqlx::query_as::<_, DueDigest>(DUE_DIGESTS_SQL)
            .bind(now)
            .bind(limit)
            .fetch_all(&self.read)
            .await?)
    }

    /// How many entries the user has on the local days `first..=last`.
    pub async fn entries_between(
        &self,
        user_id: i64,
        first: jiff::civil::Date,
        last: jiff::civil::Date,
    ) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM day_logs WHERE user_id = ?1 AND local_day BETWEEN ?2 AND ?3",
        )
        .bind(user_id)
        .bind(first.to_string())
        .bind(last.to_string())
        .fetch_one(&self.read)
        .await?)
    }

    /// (local day, summary) of the user's analysed entries on `first..=last`, oldest
    /// first, at most `limit`, empty summaries left out.
    pub async fn summaries_between(
        &self,
        user_id: i64,
        first: jiff::civil::Date,
        last: jiff::civil::Date,
        limit: i64,
    ) -> Result<Vec<(String, String)>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT local_day, json_extract(metrics, '$.summary') FROM day_logs
             WHERE user_id = ?1 AND local_day BETWEEN ?2 AND ?3 AND metrics IS NOT NULL
               AND coalesce(json_extract(metrics, '$.summary'), '') <> ''
             ORDER BY local_day, created_at, id LIMIT ?4",
        )
        .bind(user_id)
        .bind(first.to_string())
        .bind(last.to_string())
        .bind(limit)
        .fetch_all(&self.read)
        .await?)
    }

    /// Stores the digest of `week_start` as pending, or finds the one stored before
    /// (`UNIQUE (user_id, week_start)`); `true` when this call stored it.
    pub async fn insert_digest(
        &self,
        user_id: i64,
        chat_id: i64,
        week_start: jiff::civil::Date,
        front_end: FrontEnd,
        message_id: Option<i64>,
    ) -> Result<(Digest, bool), StoreError> {
        let inserted = retry_busy("insert_digest", || async {
            let rows: Vec<Digest> = sqlx::query_as(&format!(
                "INSERT INTO digests (user_id, chat_id, week_start, front_end, message_id,
                     next_attempt_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, datetime('now'))
                 ON CONFLICT (user_id, week_start) DO NOTHING
                 RETURNING {DIGEST_COLUMNS}"
            ))
            .bind(user_id)
            .bind(chat_id)
            .bind(week_start.to_string())
            .bind(front_end.source().as_str())
            .bind(message_id)
            .fetch_all(&self.write)
            .await?;
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

    /// The user's digest of `week_start`, if one is stored (read through the writer).
    pub async fn digest_of_week(
        &self,
        user_id: i64,
        week_start: jiff::civil::Date,
    ) -> Result<Option<Digest>, StoreError> {
        Ok(sqlx::query_as(&format!(
            "SELECT {DIGEST_COLUMNS} FROM digests WHERE user_id = ?1 AND week_start = ?2"
        ))
        .bind(user_id)
        .bind(week_start.to_string())
        .fetch_optional(&self.write)
        .await?)
    }

    /// The scheduler's step for one due user: moves `digest_next_at` from `due_at` to
    /// `next_at` and, when `create` is given, stores that week's digest as pending — in
    /// one transaction, so a digest is decided exactly once however many ticks or
    /// restarts look at the same moment.
    pub async fn advance_digest(
        &self,
        user_id: i64,
        due_at: &str,
        next_at: &str,
        create: Option<(i64, jiff::civil::Date)>,
    ) -> Result<DigestAdvance, StoreError> {
        retry_busy("advance_digest", || async {
            let mut tx = self.write.begin().await?;
            let moved = sqlx::query(
                "UPDATE users SET digest_next_at = ?3
                 WHERE user_id = ?1 AND digest_enabled = 1 AND digest_next_at = ?2",
            )
            .bind(user_id)
            .bind(due_at)
            .bind(next_at)
            .execute(&mut *tx)
            .await?;
            if moved.rows_affected() == 0 {
                tx.rollback().await?;
                return Ok(DigestAdvance::Lost);
            }
            let mut created = None;
            if let Some((chat_id, week_start)) = create {
                let rows: Vec<Digest> = sqlx::query_as(&format!(
                    "INSERT INTO digests (user_id, chat_id, week_start, front_end, next_attempt_at)
                     VALUES (?1, ?2, ?3, 'telegram', datetime('now'))
                     ON CONFLICT (user_id, week_start) DO NOTHING
                     RETURNING {DIGEST_COLUMNS}"
                ))
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
        .await
    }

    /// One digest if it is still pending and due, read fresh through the writer (the
    /// worker's check after claiming it: someone may have finished it meanwhile).
    pub async fn due_digest(&self, id: i64) -> Result<Option<Digest>, StoreError> {
        Ok(sqlx::query_as(&format!(
            "SELECT {DIGEST_COLUMNS} FROM digests
             WHERE id = ?1 AND status = 'pending' AND next_attempt_at <= datetime('now')"
        ))
        .bind(id)
        .fetch_optional(&self.write)
        .await?)
    }

    /// Pending digests stored longer ago than `max_age` are given up (`failed`), as
    /// logs are after `worker.max_age_hours`. Returns how many.
    pub async fn fail_old_digests(&self, max_age: Duration) -> Result<u64, StoreError> {
        retry_busy("fail_old_digests", || async {
            let done = sqlx::query(
                "UPDATE digests SET status = 'failed'
                 WHERE status = 'pending'
                   AND created_at < datetime('now', '-' || ?1 || ' seconds')",
            )
            .bind(max_age.as_secs_f64())
            .execute(&self.write)
            .await?;
            Ok(done.rows_affected())
        })
        .await
    }

    /// Pending digests of `front_end` whose next attempt is due, oldest first.
    pub async fn due_digests(
        &self,
        front_end: FrontEnd,
        limit: i64,
    ) -> Result<Vec<Digest>, StoreError> {
        Ok(sqlx::query_as(&format!(
            "SELECT {DIGEST_COLUMNS} FROM digests
             WHERE status = 'pending' AND next_attempt_at <= datetime('now')
               AND front_end = ?2 AND (?3 IS NULL OR user_id = ?3)
             ORDER BY id LIMIT ?1"
        ))
        .bind(limit)
        .bind(front_end.source().as_str())
        .bind(front_end.user_id())
        .fetch_all(&self.read)
        .await?)
    }

    /// The digest's text, written; stored before anything is sent. `false` when it
    /// already had one (it is never written twice).
    pub async fn store_digest_text(&self, id: i64, text: &str) -> Result<bool, StoreError> {
        retry_busy("store_digest_text", || async {
            let done = sqlx::query(
                "UPDATE digests SET text = ?2
                 WHERE id = ?1 AND status = 'pending' AND text IS NULL",
            )
            .bind(id)
            .bind(text)
            .execute(&self.write)
            .await?;
            Ok(done.rows_affected() == 1)
        })
        .await
    }

    /// Writing or sending failed for now: the worker tries again after `retry_in`.
    pub async fn digest_retry(&self, id: i64, retry_in: Duration) -> Result<(), StoreError> {
        retry_busy("digest_retry", || async {
            sqlx::query(
                "UPDATE digests SET attempts = attempts + 1,
                     next_attempt_at = datetime('now', '+' || ?2 || ' seconds')
                 WHERE id = ?1 AND status = 'pending'",
            )
            .bind(id)
            .bind(retry_in.as_secs_f64())
            .execute(&self.write)
            .await?;
            Ok(())
        })
        .await
    }

    /// The digest reached the user.
    pub async fn mark_digest_sent(&self, id: i64) -> Result<(), StoreError> {
        self.finish_digest("mark_digest_sent", id, "sent").await
    }

    /// The digest can never be delivered (the user blocked the bot, a provider refused
    /// it, or it waited longer than `worker.max_age_hours`).
    pub async fn mark_digest_failed(&self, id: i64) -> Result<(), StoreError> {
        self.finish_digest("mark_digest_failed", id, "failed").await
    }

    async fn finish_digest(
        &self,
        what: &'static str,
        id: i64,
        status: &'static str,
    ) -> Result<(), StoreError> {
        retry_busy(what, || async {
            sqlx::query(
                "UPDATE digests SET status = ?2,
                     sent_at = CASE WHEN ?2 = 'sent' THEN datetime('now') END
                 WHERE id = ?1 AND status = 'pending'",
            )
            .bind(id)
            .bind(status)
            .execute(&self.write)
            .await?;
            Ok(())
        })
        .await
    }

    // ---- LLM calls ----

    pub async fn record_call(
        &self,
        day_log_id: Option<LogId>,
        attempt: &Attempt,
    ) -> Result<(), StoreError> {
        insert_calls(&self.write, &[(day_log_id, attempt.clone())]).await
    }

    /// A sink for the cascade that records each attempt against one log. Recording runs
    /// in the background so the cascade never waits on the database.
    pub fn call_sink(&self, day_log_id: Option<LogId>) -> CallSink {
        CallSink {
            calls: self.calls.clone(),
            day_log_id,
        }
    }

    /// Waits until every LLM call recorded so far through a [`CallSink`] is written.
    pub async fn flush_calls(&self) {
        self.calls.flush().await;
    }

    /// The connection pool for read-only ad-hoc queries by the owner (`daylog sql` opens
    /// its own read-only connection instead).
    pub fn read_pool(&self) -> &SqlitePool {
        &self.read
    }
}

// ---- search (`/search`) and the year in pixels (`/year`) ----

/// Most entries one `/search` answers with.
pub const SEARCH_LIMIT: i64 = 5;

/// Around matched words, FTS5's `snippet()` puts these private-use characters, which
/// [`SearchHit::snippet`] turns into marked runs. An entry that itself contains them
/// only gets its own words marked oddly: they are dropped from what is shown, and the
/// text is escaped when rendered whatever it contains.
const MATCH_START: char = '\u{E000}';
const MATCH_END: char = '\u{E001}';
/// What FTS5's `snippet()` puts where it cut the text; shown as `…`.
const ELLIPSIS: char = '\u{E002}';

/// How many of the user's newest entries that contain every word `/search` ranks. A
/// journal rarely has this many for a real query, so the ranking is exact; a word in
/// every entry of a huge history (100 000 of them) costs this many bm25 scores, not
/// 100 000 (see BENCHMARKS.md).
pub const SEARCH_CANDIDATES: i64 = 1000;

/// `/search`: the user's entries that contain every word of the FTS5 query `?2` (built
/// by [`fts_query`]): of the newest `?6` of them, the best `?5` (bm25; ties newest
/// first), each with a snippet of about 16 words whose matches are wrapped in `?3`…`?4`
/// and cuts marked `?7`; the snippet is of the folded text ([`fold_for_search`]), and the
/// entry's own `text` comes along to put its letters back ([`SearchHit::snippet`]).
/// The snippet is made for those few only, by a second lookup of the index by rowid
/// (`CROSS JOIN` keeps SQLite from scanning every match again to join them).
/// The `day` line is the one place that says which day a found entry belongs to.
/// Public so that tests can check its query plan.
pub const SEARCH_SQL: &str = "WITH candidates AS (
         SELECT d.id, d.created_at, bm25(day_logs_fts) AS score
         FROM day_logs_fts JOIN day_logs d ON d.id = day_logs_fts.rowid
         WHERE day_logs_fts MATCH ?2 AND d.user_id = ?1
         ORDER BY day_logs_fts.rowid DESC LIMIT ?6),
     best AS (
         SELECT id, created_at, score FROM candidates
         ORDER BY score, created_at DESC, id DESC LIMIT ?5)
     SELECT d.id,
         coalesce(d.local_day, date(d.created_at)) AS day,
         snippet(day_logs_fts, 0, ?3, ?4, ?7, 16) AS snippet,
         d.text AS text
     FROM best
     CROSS JOIN day_logs d ON d.id = best.id
     CROSS JOIN day_logs_fts ON day_logs_fts.rowid = best.id
     WHERE day_logs_fts MATCH ?2 AND d.user_id = ?1
     ORDER BY best.score, best.created_at DESC, best.id DESC";

/// `/year`: the average mood of each day of the user's year `?2..=?3`, from the
/// `daily_metrics` view (whose `mood` skips defaulted values). Public for query plans.
pub const YEAR_MOODS_SQL: &str = "SELECT day, mood FROM daily_metrics \
     WHERE user_id = ?1 AND day >= ?2 AND day <= ?3 ORDER BY day";

/// The FTS5 query for what a user typed: every whitespace-separated word becomes an
/// FTS5 string (`"…"`, inner quotes doubled), and strings side by side must all match.
/// So `NEAR`, `OR`, `*`, `-`, `:`, `^`, parentheses and quotes are only ever text to
/// look for, never query syntax. Control characters separate words, as they do for the
/// `unicode61` tokenizer (and a NUL would otherwise end the query early). `None` when
/// there is no word at all. Words are folded as the index is ([`fold_for_search`]).
pub fn fts_query(words: &str) -> Option<String> {
    let quoted: Vec<String> = words
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|word| !word.is_empty())
        .map(|word| format!("\"{}\"", fold_for_search(word).replace('"', "\"\"")))
        .collect();
    (!quoted.is_empty()).then(|| quoted.join(" "))
}

/// What the search index holds of a text, and what a query is folded to: `ё` as `е`
/// and `Ё` as `Е` (Russian writes both for one word, and unicode61's
/// `remove_diacritics` leaves Cyrillic alone). The same fold as the triggers of
/// `migrations/20261201000012_search_fold.sql`; one letter for one letter, so the words
/// of a text stay where they were and snippets show the text as written.
pub fn fold_for_search(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            'ё' => 'е',
            'Ё' => 'Е',
            c => c,
        })
        .collect()
}

/// A run of a search snippet: matched words or the text between them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnippetRun {
    pub text: String,
    pub matched: bool,
}

/// One entry found by [`Store::search`].
#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct SearchHit {
    pub id: LogId,
    /// `YYYY-MM-DD`, the day the entry belongs to.
    pub day: String,
    /// FTS5's snippet of the folded text, with the private match marks; read it
    /// through [`Self::snippet`].
    #[sqlx(rename = "snippet")]
    raw_snippet: String,
    /// The entry as written, whose letters the snippet shows.
    text: String,
}

impl SearchHit {
    /// The raw snippet with the letters of the entry as written: the fold swaps `ё` and
    /// `е` (both two bytes in UTF-8), so the folded snippet's text is found in the folded
    /// entry at the offset where the original has it. Should it not be found (an entry
    /// that itself contains the private marks), the folded snippet is shown.
    fn unfolded_snippet(&self) -> String {
        let marks = [MATCH_START, MATCH_END, ELLIPSIS];
        let body: String = self
            .raw_snippet
            .chars()
            .filter(|c| !marks.contains(c))
            .collect();
        let original = fold_for_search(&self.text)
            .find(&body)
            .and_then(|start| self.text.get(start..start + body.len()));
        let mut letters = original.unwrap_or(&body).chars();
        self.raw_snippet
            .chars()
            .map(|c| {
                if marks.contains(&c) {
                    c
                } else {
                    letters.next().unwrap_or(c)
                }
            })
            .collect()
    }

    /// The part of the entry around the matches, as runs of matched and other text.
    pub fn snippet(&self) -> Vec<SnippetRun> {
        let mut runs: Vec<SnippetRun> = Vec::new();
        let mut matched = false;
        let mut current = String::new();
        let close = |text: &mut String, matched: bool, runs: &mut Vec<SnippetRun>| {
            if !text.is_empty() {
                runs.push(SnippetRun {
                    text: std::mem::take(text),
                    matched,
                });
            }
        };
        for c in self.unfolded_snippet().chars() {
            match c {
                ELLIPSIS => current.push('…'),
                MATCH_START => {
                    close(&mut current, matched, &mut runs);
                    matched = true;
                }
                MATCH_END => {
                    close(&mut current, matched, &mut runs);
                    matched = false;
                }
                c => current.push(c),
            }
        }
        close(&mut current, matched, &mut runs);
        runs
    }
}

/// One day of the year in pixels: `day` is `YYYY-MM-DD`, `mood` the average of the
/// day's moods that were not defaulted (`None` when every one was, or no metrics yet).
#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct DayMood {
    pub day: String,
    pub mood: Option<f64>,
}

impl Store {
    /// Up to [`SEARCH_LIMIT`] of the user's entries that contain every word of `words`
    /// (what the user typed, never FTS5 syntax: see [`fts_query`]), best matches first.
    /// No words at all finds nothing.
    pub async fn search(&self, user_id: UserId, words: &str) -> Result<Vec<SearchHit>, StoreError> {
        let Some(query) = fts_query(words) else {
            return Ok(Vec::new());
        };
        Ok(sqlx::query_as::<_, SearchHit>(SEARCH_SQL)
            .bind(user_id)
            .bind(query)
            .bind(MATCH_START.to_string())
            .bind(MATCH_END.to_string())
            .bind(SEARCH_LIMIT)
            .bind(SEARCH_CANDIDATES)
            .bind(ELLIPSIS.to_string())
            .fetch_all(&self.read)
            .await?)
    }

    /// The average mood of every day of `year` that has entries, oldest first.
    pub async fn year_moods(&self, user_id: UserId, year: i32) -> Result<Vec<DayMood>, StoreError> {
        Ok(sqlx::query_as::<_, DayMood>(YEAR_MOODS_SQL)
            .bind(user_id)
            .bind(format!("{year:04}-01-01"))
            .bind(format!("{year:04}-12-31"))
            .fetch_all(&self.read)
            .await?)
    }
}

/// Records attempts of one log's cascade into `llm_calls`.
pub struct CallSink {
    calls: CallRecorder,
    day_log_id: Option<LogId>,
}

impl AttemptSink for CallSink {
    fn record(&self, attempt: Attempt) {
        self.calls.send(Recorded::Call(self.day_log_id, attempt));
    }
}

/// Most `llm_calls` rows written in one statement.
const CALL_BATCH: usize = 200;

enum Recorded {
    Call(Option<LogId>, Attempt),
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// Writes `llm_calls` in the background, many rows per statement: two or more calls per
/// log would otherwise be as many separate writes on the one writer connection.
#[derive(Clone, Debug)]
struct CallRecorder {
    queue: tokio::sync::mpsc::UnboundedSender<Recorded>,
}

impl CallRecorder {
    /// Starts the writer task; it ends when the last [`Store`] clone is dropped.
    fn spawn(write: SqlitePool) -> Self {
        let (queue, mut incoming) = tokio::sync::mpsc::unbounded_channel::<Recorded>();
        tokio::spawn(async move {
            while let Some(first) = incoming.recv().await {
                let mut batch = vec![first];
                while batch.len() < CALL_BATCH {
                    match incoming.try_recv() {
                        Ok(next) => batch.push(next),
                        Err(_) => break,
                    }
                }
                let mut calls = Vec::with_capacity(batch.len());
                let mut flushes = Vec::new();
                for item in batch {
                    match item {
                        Recorded::Call(log, attempt) => calls.push((log, attempt)),
                        Recorded::Flush(done) => flushes.push(done),
                    }
                }
                if !calls.is_empty() {
                    match insert_calls(&write, &calls).await {
                        Ok(()) => {}
                        Err(error) if error.is_busy() => {
                            // Locked for longer than every retry: these rows are lost,
                            // the logs they describe are not.
                            tracing::warn!(%error, rows = calls.len(), "could not record LLM calls");
                        }
                        // One bad row (its log deleted meanwhile) must not lose the others.
                        Err(_) => {
                            for call in &calls {
                                if let Err(error) =
                                    insert_calls(&write, std::slice::from_ref(call)).await
                                {
                                    tracing::warn!(%error, day_log_id = call.0.map(LogId::get), "could not record an LLM call");
                                }
                            }
                        }
                    }
                }
                for done in flushes {
                    let _ = done.send(());
                }
            }
        });
        Self { queue }
    }

    fn send(&self, item: Recorded) {
        if self.queue.send(item).is_err() {
            tracing::warn!("the LLM call recorder has stopped; a call was not recorded");
        }
    }

    async fn flush(&self) {
        let (done, wait) = tokio::sync::oneshot::channel();
        self.send(Recorded::Flush(done));
        let _ = wait.await;
    }
}

async fn insert_calls(
    write: &SqlitePool,
    calls: &[(Option<LogId>, Attempt)],
) -> Result<(), StoreError> {
    retry_busy("record_calls", || async {
        let mut insert = sqlx::QueryBuilder::new(
            "INSERT INTO llm_calls (day_log_id, task, provider, model, key_index, attempt,
                 http_status, outcome, latency_ms, wait_ms, error) ",
        );
        insert.push_values(calls, |mut row, (log, attempt)| {
            row.push_bind(*log)
                .push_bind(attempt.task.as_str())
                .push_bind(attempt.provider.clone())
                .push_bind(attempt.model.clone())
                .push_bind(attempt.key_index.map(|i| i as i64))
                .push_bind(i64::from(attempt.attempt))
                .push_bind(attempt.http_status.map(i64::from))
                .push_bind(attempt.outcome.as_str())
                .push_bind(attempt.latency_ms as i64)
                .push_bind(attempt.wait_ms as i64)
                .push_bind(attempt.error.clone());
        });
        insert.build().execute(write).await?;
        Ok(())
    })
    .await
}

/// The connection of `daylog sql`: read-only at the file level (`mode=ro`) and at the
/// connection level (`PRAGMA query_only`). Each fence alone refuses every write; tests
/// take one away at a time to prove the other still holds.
pub fn read_only_options(
    url: &str,
    busy_timeout: Duration,
) -> Result<SqliteConnectOptions, StoreError> {
    Ok(parse_options(url)?
        .read_only(true)
        .create_if_missing(false)
        .busy_timeout(busy_timeout)
        .pragma("query_only", "ON"))
}

/// Opens a database for `daylog sql` with [`read_only_options`]. A missing file is an
/// error, never a new file.
pub async fn open_read_only(url: &str, limits: Limits) -> Result<SqlitePool, StoreError> {
    let path = database_path(url)?;
    if !Path::new(&path).exists() {
        return Err(StoreError::Missing {
            path: path.display().to_string(),
        });
    }
    let options = read_only_options(url, limits.busy_timeout)?;
    pool_options(limits)
        .max_connections(1)
        .connect_with(options)
        .await
        .map_err(|source| StoreError::Open {
            path: url.to_owned(),
            source,
        })
}

/// Names of the columns of a table or view, in order (for schema checks).
pub async fn columns(pool: &SqlitePool, table: &str) -> Result<Vec<String>, StoreError> {
    let rows = sqlx::query("SELECT name FROM pragma_table_info(?1) ORDER BY cid")
        .bind(table)
        .fetch_all(pool)
        .await?;
    Ok(rows.iter().map(|r| r.get::<String, _>(0)).collect())
}

fn unix_secs(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
