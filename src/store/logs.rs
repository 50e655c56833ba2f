//! Day logs: storing, editing, voice notes, history, export, import, daily metrics,
//! `/search` and the year in pixels.

use sqlx::FromRow;

use super::cluster::update_fence_holds;
use super::updates::{MARK_HANDLED, MARK_HANDLED_7_8_SQLITE, UpdateKey, WriteTx};
use super::word_forms::{self, Forms};
use super::{
    ChatId, DayLog, LEAST, LOG_COLUMNS, LogId, MessageId, NOW, Source, Sql, Store, StoreError,
    UserId, in_write_tx, listed_date, on_db, retry_busy, returned, stored_date, stored_moment,
};
use crate::time::sql_timestamp;

/// The entry an insert returned, or — a duplicate, the insert returned nothing — the id
/// of the entry already stored for the same message.
macro_rules! new_or_stored {
    ($returned:expr, $conn:expr, $log:expr) => {
        match $returned {
            Some(row) => Inserted::New(Box::new(row)),
            None => Inserted::Duplicate(
                sqlx::query_scalar(
                    "SELECT id FROM day_logs WHERE chat_id = $1 AND message_id = $2",
                )
                .bind($log.chat_id)
                .bind($log.message_id)
                .fetch_one($conn)
                .await?,
            ),
        }
    };
}

/// Stores a text entry on `$conn` (a transaction, or a writer connection in autocommit)
/// of `$pool`'s backend, or finds the one stored for the same message before. A macro,
/// so that one text serves both backends' connection types.
macro_rules! insert_log_on {
    ($pool:ident, $conn:expr, $log:expr) => {{
        let log: &NewLog<'_> = $log;
        let inserted: Vec<DayLog> = sqlx::query_as(&format!(
            "INSERT INTO day_logs (user_id, chat_id, message_id, text, next_attempt_at,
                 local_day, written_at, written_zone)
             VALUES ($1, $2, $3, $4, {now}, $5, $6, {WRITTEN_ZONE})
             ON CONFLICT (chat_id, message_id) DO NOTHING
             RETURNING {LOG_COLUMNS}",
            now = NOW.on($pool)
        ))
        .bind(log.user_id)
        .bind(log.chat_id)
        .bind(log.message_id)
        .bind(log.text)
        .bind(log.local_day.map(|day| day.to_string()))
        .bind(log.written_at.map(sql_timestamp))
        .fetch_all(&mut *$conn)
        .await?;
        new_or_stored!(returned(inserted), &mut *$conn, log)
    }};
}

/// An entry's insert and its update's mark in one transaction, sent to SQLite as one
/// text (`BEGIN IMMEDIATE`, the insert, the mark, `COMMIT`): one round trip to the
/// connection's thread where a transaction of separate statements takes four. A
/// duplicate (the insert returns nothing) reads the stored entry's id after the commit.
async fn insert_log_marked_sqlite(
    pool: &sqlx::SqlitePool,
    log: &NewLog<'_>,
    key: UpdateKey,
) -> Result<Inserted, StoreError> {
    static TEXT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "BEGIN IMMEDIATE;
             INSERT INTO day_logs (user_id, chat_id, message_id, text, next_attempt_at,
                 local_day, written_at, written_zone)
             VALUES ($1, $2, $3, $4, {now}, $5, $6, {WRITTEN_ZONE})
             ON CONFLICT (chat_id, message_id) DO NOTHING
             RETURNING {LOG_COLUMNS};
             {MARK_HANDLED_7_8_SQLITE};
             COMMIT",
            now = NOW.sqlite
        )
    });
    let mut tx = WriteTx::folded(pool).await?;
    let work = async {
        let conn = tx.conn()?;
        let inserted: Vec<DayLog> = sqlx::query_as(TEXT.as_str())
            .bind(log.user_id)
            .bind(log.chat_id)
            .bind(log.message_id)
            .bind(log.text)
            .bind(log.local_day.map(|day| day.to_string()))
            .bind(log.written_at.map(sql_timestamp))
            .bind(key.bot_id)
            .bind(key.update_id)
            .fetch_all(&mut *conn)
            .await?;
        Ok(new_or_stored!(returned(inserted), &mut *conn, log))
    }
    .await;
    tx.finish_folded(work).await
}

/// An entry's insert and its update's mark on PostgreSQL as one statement, committed
/// on its own (one round trip where `BEGIN`, the fence's check, the insert, the mark and
/// `COMMIT` take five). Under a chat's lease (`fence`) the lease's row is read `FOR
/// SHARE` first, as [`super::cluster::FENCE_HOLDS`] does: the insert and the mark are
/// written only while the lease is still this instance's, and a take-over waits for
/// the commit; else nothing is written and the answer is [`StoreError::Fenced`]. The
/// statement returns after its commit (with the server's `synchronous_commit`, on by
/// default: durably). A duplicate returns the stored entry's id, read in the same
/// statement (or, if another insert of the same message committed meanwhile, after).
async fn insert_log_marked_postgres(
    pool: &super::PgConns,
    log: &NewLog<'_>,
    key: UpdateKey,
    fence: Option<super::Fence>,
) -> Result<Inserted, StoreError> {
    use sqlx::Row as _;
    static TEXT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "WITH fence AS MATERIALIZED (
                 SELECT 1 FROM chat_leases
                  WHERE chat_id = $9 AND holder = $10 AND generation = $11
                  FOR SHARE),
             go AS MATERIALIZED (SELECT (NOT $12::BOOLEAN OR EXISTS (SELECT 1 FROM fence)) AS held),
             ins AS (
                 INSERT INTO day_logs (user_id, chat_id, message_id, text, next_attempt_at,
                     local_day, written_at, written_zone)
                 SELECT $1, $2, $3, $4, {now}, $5, $6, {WRITTEN_ZONE} FROM go WHERE go.held
                 ON CONFLICT (chat_id, message_id) DO NOTHING
                 RETURNING {LOG_COLUMNS}),
             mark AS (
                 UPDATE updates SET handled_at = {now}
                  WHERE bot_id = $7 AND update_id = $8 AND handled_at IS NULL
                    AND (SELECT held FROM go))
             SELECT (SELECT held FROM go) AS held,
                    (SELECT id FROM day_logs WHERE chat_id = $2 AND message_id = $3) AS stored,
                    ins.*
               FROM (SELECT 1) AS one LEFT JOIN ins ON true",
            now = NOW.postgres
        )
    });
    let rows = sqlx::query(TEXT.as_str())
        .bind(log.user_id)
        .bind(log.chat_id)
        .bind(log.message_id)
        .bind(log.text)
        .bind(log.local_day.map(|day| day.to_string()))
        .bind(log.written_at.map(sql_timestamp))
        .bind(key.bot_id)
        .bind(key.update_id)
        .bind(fence.map_or(0, |f| f.chat_id))
        .bind(fence.map_or(0, |f| f.holder.0))
        .bind(fence.map_or(0, |f| f.generation))
        .bind(fence.is_some())
        // All rows, so that the call returns only once the statement committed.
        .fetch_all(pool)
        .await?;
    let Some(row) = rows.first() else {
        return Err(StoreError::Sql(sqlx::Error::RowNotFound));
    };
    if !row.try_get::<bool, _>("held")? {
        return Err(StoreError::Fenced {
            chat_id: fence.map_or(0, |f| f.chat_id),
        });
    }
    if row.try_get::<Option<LogId>, _>("id")?.is_some() {
        return Ok(Inserted::New(Box::new(DayLog::from_row(row)?)));
    }
    if let Some(stored) = row.try_get::<Option<LogId>, _>("stored")? {
        return Ok(Inserted::Duplicate(stored));
    }
    Ok(new_or_stored!(None::<DayLog>, pool, log))
}

/// The zone an entry is written in (`day_logs.written_zone`): the user's zone as stored
/// now, if they chose it (NULL while they have the default zone), read in the insert
/// itself; `$1` is the user id in every statement that uses it.
const WRITTEN_ZONE: &str =
    "(SELECT timezone FROM users WHERE user_id = $1 AND timezone_chosen = 1)";

#[derive(Debug, Clone)]
pub struct NewLog<'a> {
    pub user_id: UserId,
    pub chat_id: ChatId,
    pub message_id: MessageId,
    pub text: &'a str,
    /// The local day, fixed now; `None` falls back to the UTC date with the 4-hour rule.
    pub local_day: Option<jiff::civil::Date>,
    /// Telegram's message date ([`DayLog::written_at`]); `None`: now.
    pub written_at: Option<jiff::Timestamp>,
}

/// A voice note to store (docs/behaviour.md, Voice notes): the log starts with an empty text.
#[derive(Debug, Clone)]
pub struct NewVoiceLog<'a> {
    pub user_id: UserId,
    pub chat_id: ChatId,
    pub message_id: MessageId,
    /// Telegram's `file_id` (for `daylog chat`, the path of the file).
    pub file_id: &'a str,
    pub duration_s: Option<u32>,
    /// The local day, fixed now (docs/behaviour.md, Time zones and rhythm); `None` falls back as for [`NewLog`].
    pub local_day: Option<jiff::civil::Date>,
    /// As for [`NewLog`].
    pub written_at: Option<jiff::Timestamp>,
}

/// One imported entry (docs/behaviour.md, Search and Import), ready to store.
#[derive(Debug, Clone)]
pub struct NewImportLog<'a> {
    pub created_at: jiff::Timestamp,
    pub local_day: jiff::civil::Date,
    /// The wall-clock time the export gives (with `local_day`, what identifies the row).
    pub local_time: jiff::civil::Time,
    pub text: &'a str,
    /// The mood score the export named, `None` when the mood is defaulted.
    pub mood: Option<u8>,
    /// The mood's name, part of what identifies the row (`import_mood`).
    pub mood_name: &'a str,
    pub metrics_json: String,
}

/// What [`Store::import_logs`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ImportCounts {
    pub imported: u64,
    pub already: u64,
    /// Of `already`, those whose moment moved: imported before in another zone.
    pub retimed: u64,
}

/// What the store knows of a voice log besides [`DayLog`] (`kind = 'voice'`).
#[derive(Debug, Clone, PartialEq)]
pub struct VoiceNote {
    pub file_id: String,
    pub duration_s: Option<i64>,
    /// When the transcript was shown to the user; `None` before (read as
    /// [`DayLog::created_at`] is).
    pub transcript_sent_at: Option<jiff::Timestamp>,
}

/// The columns of [`VoiceNote`] as SQLite holds them.
#[derive(FromRow)]
struct VoiceNoteRow {
    file_id: String,
    duration_s: Option<i64>,
    transcript_sent_at: Option<String>,
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

pub use crate::day::{DayMetrics, DayMood};

/// A [`DayMetrics`] as the `daily_metrics` view holds it: the day as text.
#[derive(FromRow)]
struct DayMetricsRow {
    day: String,
    mood: Option<f64>,
    stress: Option<f64>,
    energy: Option<f64>,
    productivity: Option<f64>,
    sleep_hours: Option<f64>,
    logs: i64,
}

impl DayMetricsRow {
    /// The day of `user_id`; `None` (logged) for a day that is no date, which no chart
    /// or prompt could place.
    fn read(self, user_id: UserId) -> Option<DayMetrics> {
        Some(DayMetrics {
            day: listed_date("daily_metrics", user_id, None, "day", &self.day)?,
            mood: self.mood,
            stress: self.stress,
            energy: self.energy,
            productivity: self.productivity,
            sleep_hours: self.sleep_hours,
            logs: self.logs,
        })
    }
}

/// A [`DayMood`] as the `daily_metrics` view holds it.
#[derive(FromRow)]
struct DayMoodRow {
    day: String,
    mood: Option<f64>,
}

impl DayMoodRow {
    /// As [`DayMetricsRow::read`]: a day that is no date gets no square.
    fn read(self, user_id: UserId) -> Option<DayMood> {
        Some(DayMood {
            day: listed_date("daily_metrics", user_id, None, "day", &self.day)?,
            mood: self.mood,
        })
    }
}

/// `/history`: a user's last `$2` logs, newest first. Public so that tests can check
/// its query plan (it must search the `day_logs_user_created` index).
pub const HISTORY_SQL: &str = concat!(
    "SELECT ",
    log_columns!(),
    " FROM day_logs WHERE user_id = $1 ORDER BY created_at DESC, id DESC LIMIT $2"
);

/// `/stats` and the analysis context: per-day averages of a user from `$2` days ago on.
/// Public so that tests can check its query plan.
/// `$2` is the first local day (`YYYY-MM-DD`) of the period.
pub const DAILY_METRICS_SQL: &str = "SELECT day, mood, stress, energy, productivity, sleep_hours, logs FROM daily_metrics \
     WHERE user_id = $1 AND day >= $2 ORDER BY day";

// ---- what an analysis reads before it asks ----

/// What an analysis reads about its author before it asks, and its answer's streak note
/// after: [`Store::recent_use`], [`Store::daily_metrics`], [`Store::recent_summaries`]
/// and [`Store::entry_days`], read by one statement ([`Store::before_analysis`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BeforeAnalysis {
    /// [`Store::recent_use`]; `None` when it was not asked for.
    pub recent_use: Option<i64>,
    /// [`Store::daily_metrics`] from the first day asked for, oldest first.
    pub days: Vec<DayMetrics>,
    /// [`Store::recent_summaries`], newest first.
    pub summaries: Vec<String>,
    /// [`Store::entry_days`], newest first.
    pub entry_days: Vec<jiff::civil::Date>,
}

/// One row of [`Store::before_analysis`]'s statement: `part` says which read it
/// answers (0 the hourly count in `logs`, 1 a day of `daily_metrics`, 2 a summary with
/// its log's `created_at` in `day` and id in `logs`, 3 a day with an entry).
#[derive(FromRow)]
struct BeforeAnalysisRow {
    part: i64,
    day: Option<String>,
    mood: Option<f64>,
    stress: Option<f64>,
    energy: Option<f64>,
    productivity: Option<f64>,
    sleep_hours: Option<f64>,
    logs: Option<i64>,
    summary: Option<String>,
}

/// [`Store::before_analysis`]'s statement for one dialect: `$1` the user, `$2` the log,
/// `$3` the first local day of the metrics, `$4` how many summaries, `$5` whether the
/// hourly count is wanted; `recent_use` is [`RECENT_USE`]'s text, `summary` the dialect's
/// expression of a stored summary. Each read keeps its own plan (the same indexes as
/// alone); the rows of all four come back together, told apart by `part`.
fn before_analysis_sql(recent_use: &str, summary: &str) -> String {
    format!(
        "WITH RECURSIVE days(day) AS (
             SELECT max(local_day) FROM day_logs WHERE user_id = $1
             UNION ALL
             SELECT (SELECT max(local_day) FROM day_logs
                     WHERE user_id = $1 AND local_day < days.day)
             FROM days WHERE days.day IS NOT NULL
         )
         SELECT CAST(1 AS BIGINT) AS part, day, mood, stress, energy, productivity,
                sleep_hours, logs, CAST(NULL AS TEXT) AS summary
         FROM daily_metrics WHERE user_id = $1 AND day >= $3
         UNION ALL
         SELECT CAST(2 AS BIGINT), created_at, NULL, NULL, NULL, NULL, NULL, id, summary
         FROM (SELECT created_at, id, {summary} AS summary FROM day_logs
               WHERE user_id = $1 AND id < $2 AND metrics IS NOT NULL
                 AND coalesce({summary}, '') <> ''
               ORDER BY created_at DESC, id DESC LIMIT $4) AS recent
         UNION ALL
         SELECT CAST(3 AS BIGINT), day, NULL, NULL, NULL, NULL, NULL, NULL, NULL
         FROM days WHERE day IS NOT NULL
         UNION ALL
         SELECT CAST(0 AS BIGINT), NULL, NULL, NULL, NULL, NULL, NULL, ({recent_use}), NULL
         WHERE $5"
    )
}

/// [`before_analysis_sql`] on SQLite.
static BEFORE_ANALYSIS_SQLITE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    before_analysis_sql(RECENT_USE.sqlite, "json_extract(metrics, '$.summary')")
});

/// [`before_analysis_sql`] on PostgreSQL. Public for query plans.
pub static BEFORE_ANALYSIS_POSTGRES: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    before_analysis_sql(RECENT_USE.postgres, "(daylog_json(metrics) ->> 'summary')")
});

impl BeforeAnalysis {
    /// The rows of [`Store::before_analysis`]'s statement, each into its read; what
    /// each read alone sorts by is sorted here (a `UNION ALL` promises no order). A
    /// stored day that is no date is left out, with a warning naming the user.
    fn from_rows(user_id: UserId, rows: Vec<BeforeAnalysisRow>) -> Self {
        let mut read = Self::default();
        let mut summaries: Vec<(String, i64, String)> = Vec::new();
        for row in rows {
            match (row.part, row.day) {
                (0, _) => read.recent_use = Some(row.logs.unwrap_or(0)),
                (1, Some(day)) => read.days.extend(
                    DayMetricsRow {
                        day,
                        mood: row.mood,
                        stress: row.stress,
                        energy: row.energy,
                        productivity: row.productivity,
                        sleep_hours: row.sleep_hours,
                        logs: row.logs.unwrap_or(0),
                    }
                    .read(user_id),
                ),
                (2, Some(created_at)) => summaries.push((
                    created_at,
                    row.logs.unwrap_or(0),
                    row.summary.unwrap_or_default(),
                )),
                (3, Some(day)) => read.entry_days.extend(listed_date(
                    "day_logs",
                    user_id,
                    None,
                    "local_day",
                    &day,
                )),
                _ => {}
            }
        }
        read.days.sort_by_key(|metrics| metrics.day);
        summaries.sort_by(|a, b| (&b.0, b.1).cmp(&(&a.0, a.1)));
        read.summaries = summaries.into_iter().map(|(_, _, text)| text).collect();
        read.entry_days.sort_unstable_by(|a, b| b.cmp(a));
        read
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

/// `/search`: the user's entries that contain every word of the FTS5 query `$2` (built
/// by [`fts_query`]): of the newest `$6` of them, the best `$5` (bm25; ties newest
/// first), each with a snippet of about 16 words whose matches are wrapped in `$3`…`$4`
/// and cuts marked `$7`; the snippet is of the folded text ([`fold_for_search`]), and the
/// entry's own `text` comes along to put its letters back ([`SearchHit::snippet`]).
/// The snippet is made for those few only, by a second lookup of the index by rowid
/// (`CROSS JOIN` keeps SQLite from scanning every match again to join them).
/// The `day` line is the one place that says which day a found entry belongs to.
/// Public so that tests can check its query plan.
pub const SEARCH_SQL: &str = "WITH candidates AS (
         SELECT d.id, d.created_at, bm25(day_logs_fts) AS score
         FROM day_logs_fts JOIN day_logs d ON d.id = day_logs_fts.rowid
         WHERE day_logs_fts MATCH $2 AND d.user_id = $1
         ORDER BY day_logs_fts.rowid DESC LIMIT $6),
     best AS (
         SELECT id, created_at, score, count(*) OVER () AS matched FROM candidates
         ORDER BY score, created_at DESC, id DESC LIMIT $5)
     SELECT d.id,
         coalesce(d.local_day, date(d.created_at)) AS day,
         snippet(day_logs_fts, 0, $3, $4, $7, 16) AS snippet,
         d.text AS text,
         best.matched AS matched
     FROM best
     CROSS JOIN day_logs d ON d.id = best.id
     CROSS JOIN day_logs_fts ON day_logs_fts.rowid = best.id
     WHERE day_logs_fts MATCH $2 AND d.user_id = $1
     ORDER BY best.score, best.created_at DESC, best.id DESC";

/// See [`Store::recent_use`]. The analyses counted are those of the user's logs
/// written or edited in the last hour (each found through an index: the user's own
/// recent logs, never every user's calls); one answered late from an older entry is
/// the worker's, which the limit does not hold to. Older entries still waiting for
/// their slot under the limit count too (through `day_logs_deferred`): a new entry
/// queues behind them. Public for query plans.
pub const RECENT_USE_SQL: &str = RECENT_USE.sqlite;

/// [`RECENT_USE_SQL`] on both backends.
const RECENT_USE: Sql = Sql {
    sqlite: "SELECT max(
     (SELECT count(*) FROM day_logs
      WHERE user_id = $1 AND id < $2 AND created_at >= datetime('now', '-1 hour')
        AND NOT (status = 'pending' AND waiting_for IS 'deferred'))
     + (SELECT count(*) FROM day_logs
        WHERE user_id = $1 AND id < $2 AND status = 'pending' AND waiting_for = 'deferred'),
     (SELECT count(*) FROM llm_calls
      WHERE task = 'analysis' AND outcome = 'ok'
        AND created_at >= datetime('now', '-1 hour')
        AND day_log_id IN (
            SELECT id FROM day_logs
            WHERE user_id = $1 AND created_at >= datetime('now', '-1 hour')
            UNION
            SELECT id FROM day_logs
            WHERE user_id = $1 AND edited_at >= datetime('now', '-1 hour'))))",
    // The calls are counted log by log (`llm_calls_day_log` for each of the user's
    // recent logs): as `day_log_id IN (…)`, PostgreSQL's planner may read every call
    // of the last hour instead, over and over — 90 ms an analysis on a busy journal
    // whose statistics were not gathered yet.
    postgres: "SELECT greatest(
     (SELECT count(*) FROM day_logs
      WHERE user_id = $1 AND id < $2 AND created_at >= daylog_utc(now() - interval '1 hour')
        AND NOT (status = 'pending' AND waiting_for IS NOT DISTINCT FROM 'deferred'))
     + (SELECT count(*) FROM day_logs
        WHERE user_id = $1 AND id < $2 AND status = 'pending' AND waiting_for = 'deferred'),
     (SELECT coalesce(sum(
          (SELECT count(*) FROM llm_calls
            WHERE day_log_id = recent.id AND task = 'analysis' AND outcome = 'ok'
              AND created_at >= daylog_utc(now() - interval '1 hour'))), 0)::BIGINT
        FROM (SELECT id FROM day_logs
              WHERE user_id = $1 AND created_at >= daylog_utc(now() - interval '1 hour')
              UNION
              SELECT id FROM day_logs
              WHERE user_id = $1 AND edited_at >= daylog_utc(now() - interval '1 hour'))
             AS recent))",
};

/// [`RECENT_USE_SQL`] on PostgreSQL. Public for query plans.
pub const RECENT_USE_POSTGRES_SQL: &str = RECENT_USE.postgres;

/// `/year`: the average mood of each day of the user's year `$2..=$3`, from the
/// `daily_metrics` view (whose `mood` skips defaulted values). Public for query plans.
pub const YEAR_MOODS_SQL: &str = "SELECT day, mood FROM daily_metrics \
     WHERE user_id = $1 AND day >= $2 AND day <= $3 ORDER BY day";

/// The FTS5 query for what a user typed. Every word must match, in one of its forms:
///
/// - Words are split at whitespace and control characters (as the `unicode61`
///   tokenizer splits them; a NUL would otherwise end the query early) and folded as
///   the index is ([`fold_for_search`]).
/// - Each word is an FTS5 string (`"…"`, inner quotes doubled), and so is every form
///   made of it: `NEAR`, `OR`, `*`, `-`, `:`, `^`, parentheses and quotes are only ever
///   text to look for, never query syntax. The words are joined by `AND` (FTS5 takes no
///   group beside a string without it).
/// - Its forms come from its Snowball stem (`store/word_forms.rs` says more): the
///   Russian stemmer for a word of Russian letters only, the English one for ASCII
///   letters only, none for anything else (digits, a mix, other scripts, diacritics).
///   - A stem of 4 letters or more is a prefix: `друзья` → `("друзья" OR "друз"*)`,
///     which finds "друзьями"; `walked` → `("walked" OR "walk"*)`. An English stem
///     whose last `i` was a `y` is a prefix with its `y` too: `cities` →
///     `("cities" OR "citi"* OR "city"*)`, which finds "city".
///   - A stem of 3 letters would find unrelated words as a prefix ("кот"* finds
///     "который"), so it is listed with the endings of its language instead: `кот` →
///     `("кот" OR "кот" OR "кота" OR … OR "котом" OR …)`, `бег` → … `"бегал"` …, `run`
///     → … `"runs"` … `"running"` ….
///   - A shorter stem (`еще` → "ещ", `она` → "он"), or none: the word only, `"еще"`.
/// - An entry with the word as typed ranks above one with another form only: it matches
///   the word and a form too (bm25 adds the two), which is why the word stays in the
///   list even when it is one of the listed forms.
/// - A word typed twice (in any case, with `ё` or `е`) is looked for once. Past
///   [`SEARCH_MAX_FORMS`] forms in one query, the words that follow are looked for as typed.
/// - A word with nothing for the tokenizer to find (no letter, digit or private-use
///   character: a lone `-`, `*`, `"`) is left out: after an `AND` its empty string
///   would match nothing, where strings side by side used to skip it. `None` when no
///   word is left.
pub fn fts_query(words: &str) -> Option<String> {
    fts_query_with(words, |_| None)
}

/// [`fts_query`], where a stem searched as a prefix may instead be the list of the
/// index's words that begin with it (`listed(stem)`, `None` to keep the prefix): FTS5
/// reads an OR of words lazily, newest first, where a prefix makes it read the whole
/// doclist of every word it covers first. Every listed word is an FTS5 string, and
/// counts against [`SEARCH_MAX_FORMS`] (past it, the prefix).
pub fn fts_query_with(
    words: &str,
    listed: impl FnMut(&str) -> Option<Vec<String>>,
) -> Option<String> {
    let clauses: Vec<String> = query_clauses(words, listed)
        .iter()
        .map(|clause| {
            let parts: Vec<String> = clause
                .iter()
                .map(|alternative| match alternative {
                    Alternative::Word(word) => fts_string(word),
                    Alternative::Prefix(stem) => format!("{}*", fts_string(stem)),
                })
                .collect();
            match parts.as_slice() {
                [one] => one.clone(),
                _ => format!("({})", parts.join(" OR ")),
            }
        })
        .collect();
    (!clauses.is_empty()).then(|| clauses.join(" AND "))
}

/// One thing a word of a query may match: a word (its tokens side by side) or every
/// token that begins with a stem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Alternative {
    Word(String),
    Prefix(String),
}

/// The query of [`fts_query_with`] before it is written in an engine's syntax: one
/// clause per word (each must match), each the alternatives it matches, the word as
/// typed first. Folded, but not yet split into tokens.
pub(super) fn query_clauses(
    words: &str,
    mut listed: impl FnMut(&str) -> Option<Vec<String>>,
) -> Vec<Vec<Alternative>> {
    let mut seen = std::collections::HashSet::new();
    let mut forms_left = SEARCH_MAX_FORMS;
    words
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|word| word.chars().any(is_token_char))
        .map(fold_for_search)
        .filter(|folded| seen.insert(folded.to_lowercase()))
        .map(|folded| {
            // "друзья," and "(walked" have forms too: the tokenizer drops the marks.
            let forms = word_forms::forms(folded.trim_matches(|c: char| !is_token_char(c)));
            let mut clause = vec![Alternative::Word(folded)];
            match forms {
                Forms::Prefix(stems) if forms_left >= stems.len() => {
                    for stem in &stems {
                        match listed(stem) {
                            // Room for the prefix is kept, should the list not fit.
                            Some(found) if forms_left > found.len() => {
                                forms_left -= found.len();
                                clause.extend(found.into_iter().map(Alternative::Word));
                            }
                            _ => {
                                forms_left -= 1;
                                clause.push(Alternative::Prefix(stem.clone()));
                            }
                        }
                    }
                }
                Forms::Listed(forms) if forms_left >= forms.len() => {
                    forms_left -= forms.len();
                    clause.extend(forms.into_iter().map(Alternative::Word));
                }
                _ => {}
            }
            clause
        })
        .collect()
}

/// Most words of the index one prefix stem is listed as ([`fts_query_with`]); a stem
/// that begins more words (of any user's entries) stays a prefix.
pub const SEARCH_MAX_LISTED: i64 = 32;

/// Most forms one query looks for besides its words ([`fts_query`]): bm25 scores every
/// string of the query for every candidate entry, and a message of a thousand short
/// Russian words, each with its 123 forms, would be a query of 123 000 strings (over a
/// minute of work, measured in a debug build). Eight short Russian words, 50 short
/// English ones or a thousand longer words get all their forms.
pub const SEARCH_MAX_FORMS: usize = 1000;

/// Whether the `unicode61` tokenizer keeps `c` in a token rather than splitting at it:
/// its token characters are the letters, numbers and private-use characters (Unicode
/// categories L*, N* and Co), which Rust's `char` tells as near as it can.
pub(super) fn is_token_char(c: char) -> bool {
    c.is_alphanumeric()
        || matches!(c, '\u{E000}'..='\u{F8FF}' | '\u{F0000}'..='\u{FFFFD}' | '\u{100000}'..='\u{10FFFD}')
}

/// Text as an FTS5 string: in double quotes, its own quotes doubled.
fn fts_string(text: &str) -> String {
    format!("\"{}\"", text.replace('"', "\"\""))
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
#[derive(Debug, Clone, PartialEq)]
pub struct SearchHit {
    pub id: LogId,
    /// The day the entry belongs to; `None` when the stored day is no date (logged):
    /// the entry is still found, shown without its day.
    pub day: Option<jiff::civil::Date>,
    /// FTS5's snippet of the folded text, with the private match marks; read it
    /// through [`Self::snippet`].
    raw_snippet: String,
    /// The entry as written, whose letters the snippet shows.
    text: String,
    /// How many of the user's entries the search matched, shown or not (counted among
    /// the newest [`SEARCH_CANDIDATES`] matches, so at most that many).
    pub matched: i64,
}

/// A [`SearchHit`] as [`SEARCH_SQL`] returns it: the day as text.
#[derive(FromRow)]
struct SearchHitRow {
    id: LogId,
    day: String,
    snippet: String,
    text: String,
    matched: i64,
}

impl From<SearchHitRow> for SearchHit {
    fn from(row: SearchHitRow) -> Self {
        Self {
            day: stored_date("day_logs", row.id.get(), "local_day", &row.day),
            id: row.id,
            raw_snippet: row.snippet,
            text: row.text,
            matched: row.matched,
        }
    }
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

impl Store {
    // ---- day logs ----

    /// Stores a log as pending, or finds the one stored for the same message before.
    pub async fn insert_log(&self, log: &NewLog<'_>) -> Result<Inserted, StoreError> {
        self.insert_log_for(log, None).await
    }

    /// [`Store::insert_log`] for the inbox's update `update`, which is marked handled in
    /// the same transaction (a duplicate too: the entry is there either way).
    pub async fn insert_log_for(
        &self,
        log: &NewLog<'_>,
        update: Option<UpdateKey>,
    ) -> Result<Inserted, StoreError> {
        self.durably(retry_busy("insert_log", || async {
            let Some(key) = update else {
                // One statement, so no transaction: a single round trip.
                return Ok(on_db!(self, write, |pool| {
                    let mut conn = pool.acquire().await?;
                    insert_log_on!(pool, conn, log)
                }));
            };
            match &self.db {
                super::Db::Sqlite(sqlite) => {
                    insert_log_marked_sqlite(&sqlite.write, log, key).await
                }
                super::Db::Postgres(pg) => {
                    insert_log_marked_postgres(pg, log, key, self.update_fence(key)).await
                }
            }
        }))
        .await
    }

    /// [`Store::log`] through the writer: what the last commit left, even where a read
    /// connection could still see an older snapshot (on a full disk, the WAL index of a
    /// reader may not follow). For the entry an analysis is about to start on.
    pub async fn log_as_written(&self, id: LogId) -> Result<Option<DayLog>, StoreError> {
        Ok(on_db!(self, write, |pool| {
            sqlx::query_as::<_, DayLog>(&format!(
                "SELECT {LOG_COLUMNS} FROM day_logs WHERE id = $1"
            ))
            .bind(id)
            .fetch_optional(pool)
            .await?
        }))
    }

    pub async fn log(&self, id: LogId) -> Result<Option<DayLog>, StoreError> {
        Ok(on_db!(self, read, |pool| {
            sqlx::query_as::<_, DayLog>(&format!(
                "SELECT {LOG_COLUMNS} FROM day_logs WHERE id = $1"
            ))
            .bind(id)
            .fetch_optional(pool)
            .await?
        }))
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
        self.update_text_for(chat_id, message_id, text, None).await
    }

    /// [`Store::update_text`] for the inbox's update `update`, marked handled in the
    /// same transaction when the edit changed a stored entry (otherwise the caller goes
    /// on to store it as new, or to nothing).
    pub async fn update_text_for(
        &self,
        chat_id: ChatId,
        message_id: MessageId,
        text: &str,
        update: Option<UpdateKey>,
    ) -> Result<Option<DayLog>, StoreError> {
        self.durably(retry_busy("update_text", || async {
            in_write_tx!(self, |pool, conn| {
                let rows: Vec<DayLog> = sqlx::query_as(&format!(
                    "UPDATE day_logs SET text = $3, status = 'pending', analysis = NULL,
                         metrics = NULL, attempts = 0, next_attempt_at = {now}, replied_at = NULL,
                         edited_at = {now}, waiting_for = NULL
                     WHERE chat_id = $1 AND message_id = $2 AND text <> $3
                     RETURNING {LOG_COLUMNS}",
                    now = NOW.on(pool)
                ))
                .bind(chat_id)
                .bind(message_id)
                .bind(text)
                .fetch_all(&mut *conn)
                .await?;
                let updated = returned(rows);
                if let (Some(key), Some(_)) = (update, &updated) {
                    update_fence_holds!(self, pool, conn, key);
                    sqlx::query(MARK_HANDLED.on(pool))
                        .bind(key.bot_id)
                        .bind(key.update_id)
                        .execute(&mut *conn)
                        .await?;
                }
                Ok(updated)
            })
        }))
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
        self.durably(retry_busy("insert_chat_log", || async {
            // Every row is read (there is one), so the statement runs to its end and a
            // failure to commit is this call's error, not lost in a reset.
            let mut rows: Vec<DayLog> = on_db!(self, write, |pool| {
                sqlx::query_as(&format!(
                    "INSERT INTO day_logs (user_id, chat_id, message_id, text, next_attempt_at,
                         source, local_day, written_zone)
                     SELECT $1, $1, {least}(coalesce(min(message_id), 0), 0) - 1, $2, {now}, $3, $4,
                         {WRITTEN_ZONE}
                     FROM day_logs WHERE chat_id = $1
                     RETURNING {LOG_COLUMNS}",
                    least = LEAST.on(pool),
                    now = NOW.on(pool)
                ))
                .bind(user_id)
                .bind(text)
                .bind(Source::Chat.as_str())
                .bind(local_day.map(|day| day.to_string()))
                .fetch_all(pool)
                .await?
            });
            rows.pop().ok_or(StoreError::Sql(sqlx::Error::RowNotFound))
        }))
        .await
    }

    /// Stores imported entries (docs/behaviour.md, Search and Import) in one transaction: analysed, replied, with
    /// `source = 'import'`. They take `chat_id = user_id` and negative message ids from the
    /// same `min - 1` sequence as [`Store::insert_chat_log`], so they never meet a Telegram
    /// id (always positive) nor a terminal one. An entry with the same local day,
    /// wall-clock time, mood and text as an imported one already stored is counted as
    /// already there, whatever the user's zone was then or is now (`import_time`); its
    /// moment is read again in this import's zone (a first import before `/tz` put every
    /// time in the default zone, and sending the file again after `/tz` puts it right).
    pub async fn import_logs(
        &self,
        user_id: UserId,
        logs: &[NewImportLog<'_>],
    ) -> Result<ImportCounts, StoreError> {
        /// The stored row an imported one is again, if any (see below).
        const FOUND: Sql = Sql {
            sqlite: "SELECT id, import_time IS NULL OR import_mood IS NULL,
                         created_at IS NOT $4, mood IS NULL AND $6 IS NOT NULL
                     FROM day_logs
                     WHERE user_id = $1 AND source = 'import' AND local_day = $2
                       AND (import_time = $3 OR (import_time IS NULL AND created_at = $4))
                       AND text = $5
                       AND (import_mood = $7 OR (import_mood IS NULL AND mood IS $6))
                     ORDER BY import_mood IS NULL
                     LIMIT 1",
            postgres: "SELECT id, import_time IS NULL OR import_mood IS NULL,
                         created_at IS DISTINCT FROM $4, mood IS NULL AND $6 IS NOT NULL
                     FROM day_logs
                     WHERE user_id = $1 AND source = 'import' AND local_day = $2
                       AND (import_time = $3 OR (import_time IS NULL AND created_at = $4))
                       AND text = $5
                       AND (import_mood = $7 OR (import_mood IS NULL AND mood IS NOT DISTINCT FROM $6))
                     ORDER BY import_mood IS NULL
                     LIMIT 1",
        };
        self.durably(retry_busy("import_logs", || async {
            let mut counts = ImportCounts::default();
            on_db!(self, write, |pool| {
                let mut tx = pool.begin().await?;
                for log in logs {
                    let created_at = sql_timestamp(log.created_at);
                    let day = log.local_day.to_string();
                    let time = log.local_time.strftime("%H:%M").to_string();
                    // A row imported before `import_time` existed has none: it is the same
                    // row when its UTC time is (it was imported in the zone of this import),
                    // and it gets its wall-clock time now.
                    // The mood is keyed by its name (`import_mood`): two custom moods at one
                    // minute are two rows, and a backup sent after the CSV finds the CSV's
                    // row of a custom mood and gives it its level. A row stored before the
                    // name was kept is found by its score, and gets the name now.
                    let found: Option<(i64, bool, bool, bool)> = sqlx::query_as(FOUND.on(pool))
                        .bind(user_id)
                        .bind(&day)
                        .bind(&time)
                        .bind(&created_at)
                        .bind(log.text)
                        .bind(log.mood.map(i64::from))
                        .bind(log.mood_name)
                        .fetch_optional(&mut *tx)
                        .await?;
                    if let Some((id, legacy, moved, leveled)) = found {
                        // Read again in this import's zone, and keyed by its wall-clock time.
                        if moved || legacy {
                            sqlx::query(&format!(
                                "UPDATE day_logs SET created_at = $3, import_time = $4,
                                 import_mood = $5, written_zone = {WRITTEN_ZONE}
                             WHERE id = $2"
                            ))
                            .bind(user_id)
                            .bind(id)
                            .bind(&created_at)
                            .bind(&time)
                            .bind(log.mood_name)
                            .execute(&mut *tx)
                            .await?;
                        }
                        // A mood whose level this file gives (a backup) and the stored row
                        // lacked: its metrics, and with them the mood, are this file's.
                        if leveled {
                            sqlx::query("UPDATE day_logs SET metrics = $2 WHERE id = $1")
                                .bind(id)
                                .bind(&log.metrics_json)
                                .execute(&mut *tx)
                                .await?;
                        }
                        if moved {
                            counts.retimed += 1;
                        }
                        counts.already += 1;
                        continue;
                    }
                    // The metrics go in with the row: the insert trigger of the metric
                    // columns sets them again as an update, so the columns and the day's
                    // activities follow as for an analysed entry, in the same statement.
                    let inserted = sqlx::query(&format!(
                    "INSERT INTO day_logs (user_id, chat_id, message_id, text, created_at, status,
                         replied_at, source, local_day, import_time, metrics, written_zone,
                         import_mood)
                     SELECT $1, $1, {least}(coalesce(min(message_id), 0), 0) - 1, $2, $3,
                         'analyzed', {now}, 'import', $4, $5, $6, {WRITTEN_ZONE}, $7
                     FROM day_logs WHERE chat_id = $1",
                    least = LEAST.on(pool),
                    now = NOW.on(pool)
                ))
                    .bind(user_id)
                    .bind(log.text)
                    .bind(&created_at)
                    .bind(&day)
                    .bind(&time)
                    .bind(&log.metrics_json)
                    .bind(log.mood_name)
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
        }))
        .await
    }

    /// Stores a voice note as a pending log with an empty text (`kind = 'voice'`), or
    /// finds the one stored for the same message before.
    pub async fn insert_voice_log(&self, log: &NewVoiceLog<'_>) -> Result<Inserted, StoreError> {
        self.insert_voice_log_for(log, None).await
    }

    /// [`Store::insert_voice_log`] for the inbox's update `update`, marked handled in the
    /// same transaction.
    pub async fn insert_voice_log_for(
        &self,
        log: &NewVoiceLog<'_>,
        update: Option<UpdateKey>,
    ) -> Result<Inserted, StoreError> {
        self.durably(retry_busy("insert_voice_log", || async {
            in_write_tx!(self, |pool, conn| {
                // Every row is read, so a failure to commit is this call's error.
                let mut rows: Vec<DayLog> = sqlx::query_as(&format!(
                    "INSERT INTO day_logs (user_id, chat_id, message_id, text, next_attempt_at,
                     kind, file_id, duration_s, local_day, written_at, written_zone)
                 VALUES ($1, $2, $3, '', {now}, 'voice', $4, $5, $6, $7, {WRITTEN_ZONE})
                 ON CONFLICT (chat_id, message_id) DO NOTHING
                 RETURNING {LOG_COLUMNS}",
                    now = NOW.on(pool)
                ))
                .bind(log.user_id)
                .bind(log.chat_id)
                .bind(log.message_id)
                .bind(log.file_id)
                .bind(log.duration_s.map(i64::from))
                .bind(log.local_day.map(|day| day.to_string()))
                .bind(log.written_at.map(sql_timestamp))
                .fetch_all(&mut *conn)
                .await?;
                let inserted = new_or_stored!(rows.pop(), &mut *conn, log);
                if let Some(key) = update {
                    update_fence_holds!(self, pool, conn, key);
                    sqlx::query(MARK_HANDLED.on(pool))
                        .bind(key.bot_id)
                        .bind(key.update_id)
                        .execute(&mut *conn)
                        .await?;
                }
                Ok(inserted)
            })
        }))
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
        self.durably(retry_busy("insert_chat_voice_log", || async {
            let mut rows: Vec<DayLog> = on_db!(self, write, |pool| {
                sqlx::query_as(&format!(
                "INSERT INTO day_logs (user_id, chat_id, message_id, text, next_attempt_at, source,
                     kind, file_id, duration_s, local_day, written_zone)
                 SELECT $1, $1, {least}(coalesce(min(message_id), 0), 0) - 1, '', {now}, $2,
                     'voice', $3, $4, $5, {WRITTEN_ZONE}
                 FROM day_logs WHERE chat_id = $1
                 RETURNING {LOG_COLUMNS}",
                least = LEAST.on(pool),
                now = NOW.on(pool)
            ))
                .bind(user_id)
                .bind(Source::Chat.as_str())
                .bind(file)
                .bind(duration_s.map(i64::from))
                .bind(local_day.map(|day| day.to_string()))
                .fetch_all(pool)
                .await?
            });
            rows.pop().ok_or(StoreError::Sql(sqlx::Error::RowNotFound))
        }))
        .await
    }

    /// The voice part of a log, read fresh; `None` for a text log.
    pub async fn voice_note(&self, id: LogId) -> Result<Option<VoiceNote>, StoreError> {
        let row: Option<VoiceNoteRow> = on_db!(self, write, |pool| {
            sqlx::query_as(
                "SELECT file_id, duration_s, transcript_sent_at FROM day_logs
             WHERE id = $1 AND kind = 'voice' AND file_id IS NOT NULL",
            )
            .bind(id)
            .fetch_optional(pool)
            .await?
        });
        Ok(row.map(|row| VoiceNote {
            file_id: row.file_id,
            duration_s: row.duration_s,
            transcript_sent_at: row
                .transcript_sent_at
                .as_deref()
                .map(|text| stored_moment("day_logs", id.get(), "transcript_sent_at", text)),
        }))
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
            let mut rows: Vec<DayLog> = on_db!(self, write, |pool| {
                sqlx::query_as(&format!(
                    "UPDATE day_logs SET text = $2
                 WHERE id = $1 AND kind = 'voice' AND text = '' AND status = 'pending'
                 RETURNING {LOG_COLUMNS}"
                ))
                .bind(id)
                .bind(transcript)
                .fetch_all(pool)
                .await?
            });
            Ok(rows.pop())
        })
        .await
    }

    /// The transcript reached the user (or never can): it is not shown again.
    pub async fn mark_transcript_sent(&self, id: LogId) -> Result<(), StoreError> {
        retry_busy("mark_transcript_sent", || async {
            on_db!(self, write, |pool| {
                sqlx::query(&format!(
                    "UPDATE day_logs SET transcript_sent_at = {now}
                     WHERE id = $1 AND transcript_sent_at IS NULL",
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

    /// The larger of two counts of the last hour, for the per-user limit on analyses
    /// (docs/behaviour.md, What arrives), in one statement: the entries the user stored before log `id` (a
    /// burst not analysed yet, with the older ones still waiting for their slot), and
    /// the analyses their entries of that hour were given (answers stored as `ok` in
    /// `llm_calls`: an entry edited thirty times is thirty).
    pub async fn recent_use(&self, user_id: UserId, id: LogId) -> Result<i64, StoreError> {
        Ok(on_db!(self, read, |pool| {
            sqlx::query_scalar(RECENT_USE.on(pool))
                .bind(user_id)
                .bind(id)
                .fetch_one(pool)
                .await?
        }))
    }

    /// The user's last `limit` logs, newest first.
    pub async fn history(&self, user_id: UserId, limit: i64) -> Result<Vec<DayLog>, StoreError> {
        Ok(on_db!(self, read, |pool| {
            sqlx::query_as::<_, DayLog>(HISTORY_SQL)
                .bind(user_id)
                .bind(limit)
                .fetch_all(pool)
                .await?
        }))
    }

    /// Every log of the user, oldest first (for `/export`).
    pub async fn export(&self, user_id: UserId) -> Result<Vec<DayLog>, StoreError> {
        Ok(on_db!(self, read, |pool| {
            sqlx::query_as::<_, DayLog>(&format!(
                "SELECT {LOG_COLUMNS} FROM day_logs WHERE user_id = $1 ORDER BY created_at, id"
            ))
            .bind(user_id)
            .fetch_all(pool)
            .await?
        }))
    }

    /// Per-local-day averages from local day `first` on, oldest first. A stored day
    /// that is no date is left out, with a warning naming the user.
    pub async fn daily_metrics(
        &self,
        user_id: UserId,
        first: jiff::civil::Date,
    ) -> Result<Vec<DayMetrics>, StoreError> {
        let rows = on_db!(self, read, |pool| {
            sqlx::query_as::<_, DayMetricsRow>(DAILY_METRICS_SQL)
                .bind(user_id)
                .bind(first.to_string())
                .fetch_all(pool)
                .await?
        });
        Ok(rows
            .into_iter()
            .filter_map(|row| row.read(user_id))
            .collect())
    }

    /// Every local day on which the user wrote something, newest first (streaks). Reads
    /// the `day_logs_user_day` index only.
    /// A stored day that is no date is left out, with a warning naming the user.
    pub async fn entry_days(&self, user_id: UserId) -> Result<Vec<jiff::civil::Date>, StoreError> {
        // One index seek per day (a loose index scan), not one step per entry: a year
        // of a busy journal is ~365 seeks instead of tens of thousands of index rows.
        let days: Vec<String> = on_db!(self, read, |pool| {
            sqlx::query_scalar(
                "WITH RECURSIVE days(day) AS (
                 SELECT max(local_day) FROM day_logs WHERE user_id = $1
                 UNION ALL
                 SELECT (SELECT max(local_day) FROM day_logs
                         WHERE user_id = $1 AND local_day < days.day)
                 FROM days WHERE days.day IS NOT NULL
             )
             SELECT day FROM days WHERE day IS NOT NULL",
            )
            .bind(user_id)
            .fetch_all(pool)
            .await?
        });
        Ok(days
            .iter()
            .filter_map(|text| listed_date("day_logs", user_id, None, "local_day", text))
            .collect())
    }

    /// The distinct (local day, activity) of each local day from `first` on (what goes
    /// with good days, docs/behaviour.md, Time zones and rhythm), from `day_activities`. A stored day that is no date is
    /// left out, with a warning naming the user.
    pub async fn day_activities(
        &self,
        user_id: UserId,
        first: jiff::civil::Date,
    ) -> Result<Vec<(jiff::civil::Date, String)>, StoreError> {
        let rows: Vec<(String, String)> = on_db!(self, read, |pool| {
            sqlx::query_as(
                "SELECT local_day, activity FROM day_activities
             WHERE user_id = $1 AND local_day >= $2",
            )
            .bind(user_id)
            .bind(first.to_string())
            .fetch_all(pool)
            .await?
        });
        Ok(rows
            .into_iter()
            .filter_map(|(day, activity)| {
                let day = listed_date("day_activities", user_id, None, "local_day", &day)?;
                Some((day, activity))
            })
            .collect())
    }

    /// Whether the user has an entry for local day `day`.
    pub async fn has_entry_on(
        &self,
        user_id: UserId,
        day: jiff::civil::Date,
    ) -> Result<bool, StoreError> {
        Ok(on_db!(self, read, |pool| {
            sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM day_logs WHERE user_id = $1 AND local_day = $2)",
            )
            .bind(user_id)
            .bind(day.to_string())
            .fetch_one(pool)
            .await?
        }))
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
        const SUMMARIES: Sql = Sql {
            sqlite: "SELECT json_extract(metrics, '$.summary') FROM day_logs
             WHERE user_id = $1 AND id < $2 AND metrics IS NOT NULL
               AND coalesce(json_extract(metrics, '$.summary'), '') <> ''
             ORDER BY created_at DESC, id DESC LIMIT $3",
            postgres: "SELECT daylog_json(metrics) ->> 'summary' FROM day_logs
             WHERE user_id = $1 AND id < $2 AND metrics IS NOT NULL
               AND coalesce(daylog_json(metrics) ->> 'summary', '') <> ''
             ORDER BY created_at DESC, id DESC LIMIT $3",
        };
        Ok(on_db!(self, read, |pool| {
            sqlx::query_scalar(SUMMARIES.on(pool))
                .bind(user_id)
                .bind(before_id)
                .bind(limit)
                .fetch_all(pool)
                .await?
        }))
    }

    /// What an analysis of log `id` reads before it asks, in one statement where it
    /// took four (each a round trip, and on PostgreSQL the server's work per statement
    /// is most of an entry's cost): the hourly count of [`Store::recent_use`] when
    /// `count_use`, the [`Store::daily_metrics`] from local day `first`, the last
    /// `summaries` of [`Store::recent_summaries`] before the log, and the days of
    /// [`Store::entry_days`] (the answer's streak note).
    pub async fn before_analysis(
        &self,
        user_id: UserId,
        id: LogId,
        first: jiff::civil::Date,
        summaries: i64,
        count_use: bool,
    ) -> Result<BeforeAnalysis, StoreError> {
        let text: &str = if self.pg_pool().is_some() {
            &BEFORE_ANALYSIS_POSTGRES
        } else {
            &BEFORE_ANALYSIS_SQLITE
        };
        let rows: Vec<BeforeAnalysisRow> = on_db!(self, read, |pool| {
            sqlx::query_as(text)
                .bind(user_id)
                .bind(id)
                .bind(first.to_string())
                .bind(summaries)
                .bind(count_use)
                .fetch_all(pool)
                .await?
        });
        Ok(BeforeAnalysis::from_rows(user_id, rows))
    }

    /// Up to [`SEARCH_LIMIT`] of the user's entries that contain every word of `words`
    /// in one of its forms (what the user typed, never FTS5 syntax: see [`fts_query`]),
    /// best matches first.
    /// No words at all finds nothing.
    pub async fn search(&self, user_id: UserId, words: &str) -> Result<Vec<SearchHit>, StoreError> {
        if let Some(pg) = self.pg_pool() {
            return search_postgres(pg, user_id, words).await;
        }
        // The stems searched as prefixes, then the index's words of each (a few).
        let mut stems = Vec::new();
        if fts_query_with(words, |stem| {
            stems.push(stem.to_owned());
            None
        })
        .is_none()
        {
            return Ok(Vec::new());
        }
        let mut found = std::collections::HashMap::new();
        for stem in stems {
            let words: Vec<String> = sqlx::query_scalar(
                "SELECT term FROM day_logs_fts_vocab WHERE term >= $1 AND term < $2
                 ORDER BY term LIMIT $3",
            )
            .bind(&stem)
            .bind(format!("{stem}\u{10FFFF}"))
            .bind(SEARCH_MAX_LISTED + 1)
            .fetch_all(&self.sqlite("search")?.read)
            .await?;
            if words.len() <= SEARCH_MAX_LISTED as usize {
                found.insert(stem, words);
            }
        }
        let Some(query) = fts_query_with(words, |stem| found.get(stem).cloned()) else {
            return Ok(Vec::new());
        };
        let rows = sqlx::query_as::<_, SearchHitRow>(SEARCH_SQL)
            .bind(user_id)
            .bind(query)
            .bind(MATCH_START.to_string())
            .bind(MATCH_END.to_string())
            .bind(SEARCH_LIMIT)
            .bind(SEARCH_CANDIDATES)
            .bind(ELLIPSIS.to_string())
            .fetch_all(&self.sqlite("search")?.read)
            .await?;
        Ok(rows.into_iter().map(SearchHit::from).collect())
    }

    /// The average mood of every day of `year` that has entries, oldest first. A
    /// stored day that is no date is left out, with a warning naming the user.
    pub async fn year_moods(&self, user_id: UserId, year: i32) -> Result<Vec<DayMood>, StoreError> {
        let rows = on_db!(self, read, |pool| {
            sqlx::query_as::<_, DayMoodRow>(YEAR_MOODS_SQL)
                .bind(user_id)
                .bind(format!("{year:04}-01-01"))
                .bind(format!("{year:04}-12-31"))
                .fetch_all(pool)
                .await?
        });
        Ok(rows
            .into_iter()
            .filter_map(|row| row.read(user_id))
            .collect())
    }
}

/// A candidate of [`search_postgres`]: a matching entry of the user's.
#[derive(FromRow)]
struct PgCandidate {
    id: LogId,
    created_at: String,
    day: String,
    text: String,
}

/// The newest `$3` of user `$1`'s entries whose indexed words match tsquery `$2`.
/// Public for query plans.
pub const SEARCH_CANDIDATES_POSTGRES_SQL: &str =
    "SELECT d.id, d.created_at, coalesce(d.local_day, left(d.created_at, 10), '') AS day,
         d.text
     FROM day_logs_fts s JOIN day_logs d ON d.id = s.id
     WHERE s.user_id = $1 AND d.user_id = $1 AND s.words @@ $2::tsquery
     ORDER BY s.id DESC LIMIT $3";

/// [`Store::search`] on PostgreSQL (`store/search.rs` says how): the user's entries not
/// indexed yet get their words first; then the newest [`SEARCH_CANDIDATES`] matches of
/// the index, ranked and cut into snippets here as FTS5 ranks and cuts them.
async fn search_postgres(
    pg: &super::PgConns,
    user_id: UserId,
    words: &str,
) -> Result<Vec<SearchHit>, StoreError> {
    use super::search;
    let Some(clauses) = search::phrases(&query_clauses(words, |_| None)) else {
        return Ok(Vec::new());
    };
    if clauses.is_empty() {
        return Ok(Vec::new());
    }
    index_postgres(pg, user_id).await?;
    // Planned for these words (`super::CUSTOM_PLAN`): a word in most entries is found
    // newest first along the index's order, a rare one through the word index.
    let mut tx = pg.begin().await?;
    sqlx::query(super::CUSTOM_PLAN).execute(&mut *tx).await?;
    let candidates: Vec<PgCandidate> = sqlx::query_as(SEARCH_CANDIDATES_POSTGRES_SQL)
        .bind(user_id)
        .bind(search::tsquery(&clauses))
        .bind(SEARCH_CANDIDATES)
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    let phrases: Vec<&search::Phrase> = clauses.iter().flatten().collect();
    let queries: Vec<String> = phrases.iter().map(|phrase| phrase.tsquery()).collect();
    let (rows, tokens, hits): (i64, i64, Vec<i64>) = sqlx::query_as(
        "SELECT count(words), coalesce(sum(length), 0)::BIGINT,
             ARRAY(SELECT (SELECT count(*) FROM day_logs_fts WHERE words @@ q::tsquery)
                   FROM unnest($1::text[]) WITH ORDINALITY AS u(q, n) ORDER BY n)
         FROM day_logs_fts",
    )
    .bind(&queries)
    .fetch_one(pg)
    .await?;
    let corpus = search::Corpus { rows, tokens, hits };
    let matched = i64::try_from(candidates.len()).unwrap_or(i64::MAX);
    let mut scored: Vec<(f64, PgCandidate)> = candidates
        .into_iter()
        .map(|candidate| {
            let row: Vec<String> = search::tokens(&fold_for_search(&candidate.text))
                .into_iter()
                .map(|(_, token)| token)
                .collect();
            (search::bm25(&phrases, &corpus, &row), candidate)
        })
        .collect();
    scored.sort_by(|(a, x), (b, y)| {
        a.total_cmp(b)
            .then_with(|| y.created_at.cmp(&x.created_at))
            .then_with(|| y.id.get().cmp(&x.id.get()))
    });
    scored.truncate(usize::try_from(SEARCH_LIMIT).unwrap_or(0));
    Ok(scored
        .into_iter()
        .map(|(_, candidate)| {
            let snippet = search::snippet(
                &fold_for_search(&candidate.text),
                &phrases,
                (MATCH_START, MATCH_END, ELLIPSIS),
            );
            SearchHit::from(SearchHitRow {
                id: candidate.id,
                day: candidate.day,
                snippet,
                text: candidate.text,
                matched,
            })
        })
        .collect())
}

/// The words of the user's entries that have none yet (new or edited since), as the
/// store tokenises them; an entry edited meanwhile keeps none until the next search.
async fn index_postgres(pg: &super::PgConns, user_id: UserId) -> Result<(), StoreError> {
    let unindexed: Vec<(i64, String)> = sqlx::query_as(
        "SELECT s.id, d.text FROM day_logs_fts s JOIN day_logs d ON d.id = s.id
         WHERE s.user_id = $1 AND s.words IS NULL",
    )
    .bind(user_id)
    .fetch_all(pg)
    .await?;
    if unindexed.is_empty() {
        return Ok(());
    }
    let mut ids = Vec::new();
    let mut texts = Vec::new();
    let mut vectors = Vec::new();
    let mut lengths = Vec::new();
    for (id, text) in unindexed {
        let (vector, length) = super::search::tsvector(&fold_for_search(&text));
        ids.push(id);
        vectors.push(vector);
        lengths.push(length);
        texts.push(text);
    }
    sqlx::query(
        "UPDATE day_logs_fts s SET words = u.words::tsvector, length = u.length
         FROM unnest($1::BIGINT[], $2::text[], $3::text[], $4::BIGINT[]) AS u(id, text, words, length),
             day_logs d
         WHERE s.id = u.id AND d.id = u.id AND d.text = u.text",
    )
    .bind(&ids)
    .bind(&texts)
    .bind(&vectors)
    .bind(&lengths)
    .execute(pg)
    .await?;
    Ok(())
}
