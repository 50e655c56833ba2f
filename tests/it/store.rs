//! The store against a real SQLite file: schema contract, idempotency, concurrency,
//! isolation between users.

#![expect(
    clippy::expect_used,
    reason = "helpers outside #[test] fns fail loudly by design"
)]

use std::time::Duration;

use daylog::domain::{ModelRef, Outcome as LogOutcome, Wait};
use daylog::language::Language;
use daylog::llm::{Attempt, AttemptSink, Outcome, Task};
use daylog::store::{self, FrontEnd, Inserted, LogStatus, NewLog, NewUser, Store, Unfinished};
use daylog::store::{ChatId, LogId, MessageId, UserId};

use crate::support;
use crate::support::postgres::{Backend, FreshDb, Raw, backends, on_each_backend};

struct TestDb {
    _db: FreshDb,
    url: String,
    store: Store,
}

/// A migrated store on SQLite (the tests not yet run on both backends).
async fn fresh() -> TestDb {
    fresh_on(Backend::Sqlite).await
}

/// A migrated store on `backend`, in a database of its own.
async fn fresh_on(backend: Backend) -> TestDb {
    let db = backend.fresh().await;
    let url = db.url.clone();
    let store = Store::open_and_migrate(&url, Duration::from_secs(5))
        .await
        .unwrap_or_else(|e| panic!("store opens on {backend}: {e}"));
    TestDb {
        _db: db,
        url,
        store,
    }
}

/// A migrated store on PostgreSQL, when the PostgreSQL suite runs here (`backends()`).
async fn fresh_postgres() -> Option<TestDb> {
    if backends().contains(&Backend::Postgres) {
        Some(fresh_on(Backend::Postgres).await)
    } else {
        None
    }
}

async fn user(store: &Store, user_id: i64) {
    store
        .upsert_user(&NewUser {
            user_id: UserId(user_id),
            username: Some("someone"),
            language: Language::En,
        })
        .await
        .expect("user");
}

/// Today in UTC (the tests' users keep the default zone).
fn today() -> jiff::civil::Date {
    jiff::Timestamp::now()
        .to_zoned_datetime(jiff::tz::TimeZone::UTC)
        .date()
}

fn days_ago(days: i64) -> jiff::civil::Date {
    today()
        .checked_sub(jiff::Span::new().days(days))
        .expect("date")
}

async fn log(store: &Store, user_id: i64, message_id: i64, text: &str) -> Inserted {
    store
        .insert_log(&NewLog {
            user_id: UserId(user_id),
            chat_id: ChatId(user_id),
            message_id: MessageId(message_id),
            text,
            local_day: Some(today()),
            written_at: None,
        })
        .await
        .expect("insert")
}

/// Stores an analysis of the log's current text.
async fn store_analysis(
    store: &Store,
    id: i64,
    analysis: &str,
    metrics: &str,
) -> Result<bool, store::StoreError> {
    let text = store.log(LogId(id)).await?.expect("log").text;
    store
        .record(LogId(id), &text, &support::analysed(analysis, metrics))
        .await
}

#[tokio::test]
async fn schema_matches_the_public_contract_column_by_column() {
    for backend in backends() {
        schema_matches_the_public_contract_on(backend).await;
    }
}

async fn schema_matches_the_public_contract_on(backend: Backend) {
    let db = fresh_on(backend).await;
    let store = &db.store;
    let expect = |cols: &[&str]| cols.iter().map(|c| (*c).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        store.columns("users").await.expect("users"),
        expect(&[
            "user_id",
            "chat_id",
            "username",
            "language",
            "timezone",
            "created_at",
            // 20261201000010: the Sunday digest, off by default.
            "digest_enabled",
            "digest_next_at",
            // 20261203000021: whether the user chose their zone (`/tz`).
            "timezone_chosen"
        ])
    );
    assert_eq!(
        store.columns("day_logs").await.expect("day_logs"),
        expect(&[
            "id",
            "user_id",
            "chat_id",
            "message_id",
            "text",
            "created_at",
            "status",
            "analysis",
            "metrics",
            "attempts",
            "next_attempt_at",
            "replied_at",
            // Added by the second migration: the non-defaulted metrics as columns.
            "mood",
            "stress",
            "energy",
            "productivity",
            "sleep_hours",
            // 20261201000003: where the log came from.
            "source",
            // 20261201000004: the local day the entry belongs to.
            "local_day",
            // 20261201000009: voice notes.
            "kind",
            "file_id",
            "duration_s",
            "transcript_sent_at",
            // 20261201000011: an imported entry's wall-clock time.
            "import_time",
            // 20261201000014: the last edit that changed the text (max_age counts from it),
            // and why a pending log waits for its next try.
            "edited_at",
            "waiting_for",
            // 20261201000019: when the user wrote it (Telegram's message date).
            "written_at",
            // 20261203000021: the user's zone then, whose clock /history shows.
            "written_zone",
            // 20261203000022: an imported entry's mood name, part of its key.
            "import_mood",
        ])
    );
    assert_eq!(
        store.columns("reminders").await.expect("reminders"),
        expect(&[
            "user_id",
            "local_time",
            "enabled",
            "last_sent_day",
            "next_due_at"
        ])
    );
    assert_eq!(
        store.columns("digests").await.expect("digests"),
        expect(&[
            "id",
            "user_id",
            "chat_id",
            "week_start",
            "status",
            "text",
            "front_end",
            "message_id",
            "attempts",
            "next_attempt_at",
            "created_at",
            "sent_at",
            // 20261203000024: the week's entries the text was written from.
            "written_from"
        ])
    );
    assert_eq!(
        store.columns("llm_calls").await.expect("llm_calls"),
        expect(&[
            "id",
            "day_log_id",
            "task",
            "provider",
            "model",
            "key_index",
            "attempt",
            "http_status",
            "outcome",
            "latency_ms",
            "wait_ms",
            "error",
            "created_at",
            "digest_id"
        ])
    );
    assert_eq!(
        store.columns("daily_metrics").await.expect("view"),
        expect(&[
            "user_id",
            "day",
            "mood",
            "stress",
            "energy",
            "productivity",
            "sleep_hours",
            "logs"
        ])
    );
}

on_each_backend! {
    /// Times are stored as plain UTC text on both backends; SQLite's file (and its
    /// folder) is created.
    async fn the_file_and_its_folder_are_created_and_times_are_plain_utc_text(db: TestDb) {
    user(&db.store, 1).await;
    let id = log(&db.store, 1, 10, "a calm day").await.id();
    let stored = db.store.log(id).await.expect("read").expect("row");
    assert_eq!(stored.status, LogStatus::Pending);
    let raw_db = Raw::connect(&db.url).await;
    let raw: String = raw_db
        .value(&format!("SELECT created_at FROM day_logs WHERE id = {}", id.get()))
        .await;
    raw_db.close().await;
    assert_eq!(raw.len(), "YYYY-MM-DD HH:MM:SS".len());
    assert_eq!(daylog::time::sql_timestamp(stored.created_at), raw);
    if !db.store.is_postgres() {
        let path = daylog::config::database_path(&db.url).expect("a file URL");
        assert!(path.exists());
    }
    }
}

on_each_backend! {
    async fn metrics_are_read_back_parsed_and_a_malformed_object_as_none(db: TestDb) {
    user(&db.store, 1).await;
    let good = log(&db.store, 1, 10, "a calm day").await.id();
    let bad = log(&db.store, 1, 11, "a strange row").await.id();
    let metrics = r#"{"mood":4,"stress":2,"energy":3,"productivity":5,"sleep_hours":7.5}"#;
    assert!(
        store_analysis(&db.store, good.get(), "fine", metrics)
            .await
            .expect("store")
    );
    assert!(
        store_analysis(&db.store, bad.get(), "odd", "{}")
            .await
            .expect("store")
    );
    // The store writes only metrics objects: a malformed one is a hand edit.
    let writer = Raw::connect(&db.url).await;
    writer.exec(&format!("UPDATE day_logs SET metrics = '[1]' WHERE id = {}", bad.get())).await;
    writer.close().await;

    let stored = db.store.log(good).await.expect("read").expect("row");
    let parsed = stored.metrics.expect("parsed metrics");
    assert_eq!(
        (parsed.mood(), parsed.stress(), parsed.sleep_hours()),
        (4, 2, Some(7.5))
    );
    let stored = db.store.log(bad).await.expect("read").expect("row");
    assert_eq!(stored.status, LogStatus::Analyzed);
    assert_eq!(stored.metrics, None);
    }
}

on_each_backend! {
    async fn a_log_whose_created_at_is_not_a_timestamp_stays_readable(db: TestDb) {
    user(&db.store, 1).await;
    let id = log(&db.store, 1, 10, "a calm day").await.id();
    let writer = Raw::connect(&db.url).await;
    writer.exec(&format!("UPDATE day_logs SET created_at = 'yesterday' WHERE id = {}", id.get())).await;
    writer.close().await;
    let stored = db.store.log(id).await.expect("read").expect("row");
    assert_eq!(stored.created_at, jiff::Timestamp::UNIX_EPOCH);
    assert_eq!(stored.text, "a calm day");
    }
}

on_each_backend! {
    /// Every stored moment a caller sees is a `Timestamp`, parsed once in the store: the
    /// canonical text, another spelling of a moment (a hand edit) as that moment, and text
    /// that is no moment as the epoch, the row still readable.
    async fn stored_moments_are_read_as_timestamps_whatever_their_spelling(db: TestDb) {
    user(&db.store, 1).await;
    let id = log(&db.store, 1, 10, "a calm day").await.id();
    let writer = Raw::connect(&db.url).await;
    writer.exec(&format!("UPDATE day_logs SET next_attempt_at = '2026-12-01T21:00:00.5Z',
             replied_at = 'later' WHERE id = {}", id.get())).await;
    writer.exec("UPDATE users SET created_at = '2026-11-30 08:00:00' WHERE user_id = 1").await;
    user(&db.store, 2).await;
    writer.exec("UPDATE users SET created_at = 'long ago', timezone = 'Mars/Olympus' WHERE user_id = 2").await;
    writer.exec("INSERT INTO reminders (user_id, local_time, enabled, last_sent_day, next_due_at)
         VALUES (1, '21:00', 1, '2026-11-30', '2026-12-01 21:00:00'),
                (2, 'nine', 1, 'monday', 'soon')").await;
    writer.close().await;
    let at = |text: &str| -> jiff::Timestamp { text.parse().expect("moment") };

    let stored = db.store.log(id).await.expect("read").expect("row");
    assert_eq!(stored.next_attempt_at, Some(at("2026-12-01T21:00:00.5Z")));
    assert_eq!(stored.replied_at, Some(jiff::Timestamp::UNIX_EPOCH));
    let first = db.store.user(UserId(1)).await.expect("read").expect("user");
    assert_eq!(first.created_at, at("2026-11-30T08:00:00Z"));
    let second = db.store.user(UserId(2)).await.expect("read").expect("user");
    assert_eq!(second.created_at, jiff::Timestamp::UNIX_EPOCH);
    assert_eq!(second.timezone.name(), "UTC", "the default zone");

    let good = db
        .store
        .reminder(UserId(1))
        .await
        .expect("read")
        .expect("row");
    assert_eq!(good.local_time, daylog::time::LocalTime::parse("21:00"));
    assert_eq!(good.last_sent_day, Some("2026-11-30".parse().expect("day")));
    assert_eq!(good.next_due_at, Some(at("2026-12-01T21:00:00Z")));
    let bad = db
        .store
        .reminder(UserId(2))
        .await
        .expect("read")
        .expect("row");
    assert_eq!((bad.local_time, bad.last_sent_day), (None, None));
    assert_eq!(bad.next_due_at, Some(jiff::Timestamp::UNIX_EPOCH));
    }
}

on_each_backend! {
    async fn a_redelivered_message_is_stored_once(db: TestDb) {
    user(&db.store, 1).await;
    let first = log(&db.store, 1, 10, "first delivery").await;
    let again = log(&db.store, 1, 10, "second delivery").await;
    assert!(matches!(first, Inserted::New(_)));
    assert_eq!(again, Inserted::Duplicate(first.id()));
    assert_eq!(
        db.store
            .history(UserId(1), 10)
            .await
            .expect("history")
            .len(),
        1
    );
    let stored = db.store.log(first.id()).await.expect("read").expect("row");
    assert_eq!(stored.text, "first delivery");
    }
}

on_each_backend! {
    async fn two_hundred_concurrent_inserts_all_succeed(db: TestDb) {
    for u in 1..=10 {
        user(&db.store, u).await;
    }
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let store = db.store.clone();
            tokio::spawn(async move {
                let text = format!("entry {i}");
                store
                    .insert_log(&NewLog {
                        user_id: UserId(1 + i % 10),
                        chat_id: ChatId(1 + i % 10),
                        message_id: MessageId(i),
                        text: &text,
                        local_day: None,
                        written_at: None,
                    })
                    .await
            })
        })
        .collect();
    for task in tasks {
        let result = task.await.expect("task ran");
        assert!(result.is_ok(), "insert failed: {result:?}");
    }
    let raw = Raw::connect(&db.url).await;
    let total: i64 = raw.value("SELECT count(*) FROM day_logs").await;
    assert_eq!(total, 200);
    }
}

on_each_backend! {
    async fn one_user_never_sees_another_users_rows(db: TestDb) {
    user(&db.store, 1).await;
    user(&db.store, 2).await;
    let mine = log(&db.store, 1, 1, "mine").await.id();
    let theirs = log(&db.store, 2, 1, "theirs").await.id();
    store_analysis(
        &db.store,
        mine.get(),
        "ok",
        r#"{"mood":4,"summary":"mine","defaulted":[]}"#,
    )
    .await
    .expect("mark");
    store_analysis(
        &db.store,
        theirs.get(),
        "ok",
        r#"{"mood":1,"summary":"theirs","defaulted":[]}"#,
    )
    .await
    .expect("mark");

    let history = db.store.history(UserId(1), 10).await.expect("history");
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].text, "mine");
    let export = db.store.export(UserId(2)).await.expect("export");
    assert!(export.iter().all(|l| l.user_id == UserId(2)));
    let days = db
        .store
        .daily_metrics(UserId(1), days_ago(6))
        .await
        .expect("days");
    assert_eq!(days.len(), 1);
    assert_eq!(days[0].mood, Some(4.0));
    let summaries = db
        .store
        .recent_summaries(UserId(1), LogId(i64::MAX), 3)
        .await
        .expect("summaries");
    assert_eq!(summaries, ["mine"]);
    }
}

on_each_backend! {
    async fn daily_metrics_ignore_defaulted_values(db: TestDb) {
    user(&db.store, 1).await;
    let a = log(&db.store, 1, 1, "a").await.id();
    let b = log(&db.store, 1, 2, "b").await.id();
    store_analysis(
        &db.store,
        a.get(),
        "x",
        r#"{"mood":5,"stress":2,"sleep_hours":7.0,"defaulted":[]}"#,
    )
    .await
    .expect("a");
    store_analysis(
        &db.store,
        b.get(),
        "x",
        r#"{"mood":3,"stress":4,"sleep_hours":null,"defaulted":["mood","sleep_hours"]}"#,
    )
    .await
    .expect("b");
    let days = db
        .store
        .daily_metrics(UserId(1), today())
        .await
        .expect("days");
    assert_eq!(days.len(), 1);
    assert_eq!(
        days[0].mood,
        Some(5.0),
        "the defaulted 3 is not averaged in"
    );
    assert_eq!(days[0].stress, Some(3.0));
    assert_eq!(days[0].sleep_hours, Some(7.0));
    assert_eq!(days[0].logs, 2);
    }
}

/// A first attempt of `task` on mistral that answered in 5 ms.
fn answered(task: Task) -> Attempt {
    Attempt {
        task,
        provider: "mistral".into(),
        model: "m".into(),
        key_index: Some(0),
        attempt: 1,
        http_status: Some(200),
        outcome: Outcome::Ok,
        latency_ms: 5,
        wait_ms: 0,
        error: None,
    }
}

on_each_backend! {
    /// Calls recorded together are written together, each column as it was given:
    /// NULLs, a digest's call, an error text with quotes and non-Latin letters.
    async fn calls_recorded_at_once_are_stored_each_as_given(db: TestDb) {
    user(&db.store, 1).await;
    let entry = log(&db.store, 1, 1, "a day").await.id();
    let week: jiff::civil::Date = "2026-11-30".parse().expect("date");
    let (digest, _) = db
        .store
        .insert_digest(UserId(1), ChatId(1), week, FrontEnd::Telegram, None)
        .await
        .expect("digest");
    let timeout = Attempt {
        key_index: None,
        attempt: 2,
        http_status: None,
        outcome: Outcome::Timeout,
        latency_ms: 30_000,
        wait_ms: 1_500,
        error: Some("нет ответа: 'timed out' \"after\" 30 s".to_owned()),
        ..answered(Task::Analysis)
    };
    db.store.call_sink(Some(entry)).record(timeout);
    db.store.call_sink(Some(entry)).record(answered(Task::Metrics));
    db.store.digest_call_sink(digest.id).record(answered(Task::Digest));
    db.store.call_sink(None).record(answered(Task::Transcription));
    db.store.flush_calls().await;

    type Row = (
        Option<i64>,
        Option<i64>,
        String,
        Option<i64>,
        i64,
        Option<i64>,
        String,
        i64,
        i64,
        Option<String>,
    );
    let rows: Vec<Row> = Raw::connect(&db.url)
        .await
        .rows(
            "SELECT day_log_id, digest_id, task, key_index, attempt, http_status, outcome,
                    latency_ms, wait_ms, error
             FROM llm_calls ORDER BY id",
        )
        .await;
    let (log_id, digest_id) = (Some(entry.get()), Some(digest.id.get()));
    let ok = |task: &str| (task.to_owned(), Some(0), 1, Some(200), "ok".to_owned(), 5, 0, None);
    let expected: Vec<Row> = [
        (
            log_id,
            None,
            (
                "analysis".to_owned(),
                None,
                2,
                None,
                "timeout".to_owned(),
                30_000,
                1_500,
                Some("нет ответа: 'timed out' \"after\" 30 s".to_owned()),
            ),
        ),
        (log_id, None, ok("metrics")),
        (None, digest_id, ok("digest")),
        (None, None, ok("transcription")),
    ]
    .into_iter()
    .map(|(l, d, (task, key, attempt, status, outcome, latency, wait, error))| {
        (l, d, task, key, attempt, status, outcome, latency, wait, error)
    })
    .collect();
    assert_eq!(rows, expected);
    }
}

on_each_backend! {
    /// A restart learns its hedging from the answers of analyses and metrics only: a
    /// digest's or a transcript's latency is that of its week or its recording.
    async fn restart_latencies_are_those_of_analyses_and_metrics(db: TestDb) {
    for (task, latency_ms) in [
        (Task::Analysis, 200),
        (Task::Digest, 9000),
        (Task::Metrics, 300),
        (Task::Transcription, 7000),
    ] {
        let attempt = Attempt {
            latency_ms,
            ..answered(task)
        };
        db.store.record_call(None, &attempt).await.expect("call");
    }

    let latencies: Vec<u64> = db
        .store
        .recent_latencies()
        .await
        .expect("latencies")
        .iter()
        .map(|sample| u64::try_from(sample.latency.as_millis()).expect("small"))
        .collect();

    assert_eq!(latencies, [200, 300]);
    }
}

on_each_backend! {
    async fn delete_removes_every_row_of_that_user_only(db: TestDb) {
    user(&db.store, 1).await;
    user(&db.store, 2).await;
    let mine = log(&db.store, 1, 1, "mine").await.id();
    log(&db.store, 2, 1, "theirs").await;
    let attempt = answered(Task::Analysis);
    db.store
        .record_call(Some(mine), &attempt)
        .await
        .expect("call");

    assert_eq!(db.store.delete_user(UserId(1)).await.expect("delete"), 1);

    assert!(db.store.user(UserId(1)).await.expect("user").is_none());
    assert!(
        db.store
            .history(UserId(1), 10)
            .await
            .expect("history")
            .is_empty()
    );
    db.store.flush_calls().await;
    let calls: i64 = Raw::connect(&db.url)
        .await
        .value("SELECT count(*) FROM llm_calls")
        .await;
    assert_eq!(calls, 0, "the user's LLM calls go with the logs");
    assert_eq!(
        db.store.history(UserId(2), 10).await.expect("other").len(),
        1
    );
    }
}

on_each_backend! {
    /// After an outage only the logs whose analysis failed are made due at once: those
    /// waiting for a budget, a transcription or the hourly limit keep their time.
    async fn retry_pending_now_brings_forward_only_the_logs_a_failure_put_on_the_schedule(db: TestDb) {
    user(&db.store, 1).await;
    let hour = Duration::from_secs(3600);
    let failed = log(&db.store, 1, 1, "failed").await.id();
    let budget = log(&db.store, 1, 2, "budget").await.id();
    let voice = log(&db.store, 1, 3, "voice").await.id();
    let limited = log(&db.store, 1, 4, "limited").await.id();
    for (id, text, why) in [
        (failed, "failed", Wait::Provider),
        (budget, "budget", Wait::Budget),
        (voice, "voice", Wait::Transcription { refused: false }),
    ] {
        assert!(
            db.store
                .record(id, text, &support::waiting(why, hour))
                .await
                .expect("retry")
        );
    }
    db.store.postpone(limited, hour).await.expect("postpone");

    assert_eq!(db.store.retry_pending_now().await.expect("resume"), 1);

    let due: Vec<LogId> = db
        .store
        .unfinished(FrontEnd::Telegram, 10)
        .await
        .expect("unfinished")
        .into_iter()
        .map(|(_, log)| log.id)
        .collect();
    assert_eq!(due, [failed]);
    assert_eq!(
        db.store.retry_pending_now().await.expect("resume"),
        0,
        "made due once"
    );
    }
}

/// The hourly limit keeps holding after the first hour of a burst: with a
/// limit of 2, an hour and a minute after ten entries, six of them still wait for
/// their slots (in one, two and three hours). A new entry is over the limit although
/// no entry of the last hour was analysed, and it queues behind them: an hour after
/// the slot of the entry two places before it, the ninth's.
#[tokio::test]
async fn entries_still_waiting_for_their_slot_keep_the_hourly_limit() {
    let db = fresh().await;
    user(&db.store, 1).await;
    let mut ids = Vec::new();
    for i in 1..=10 {
        ids.push(log(&db.store, 1, i, &format!("entry {i}")).await.id());
    }
    let writer = sqlx::SqlitePool::connect(&db.url).await.expect("writer");
    sqlx::query("UPDATE day_logs SET created_at = datetime('now', '-61 minutes')")
        .execute(&writer)
        .await
        .expect("an hour ago");
    // Entries 1–4 analysed (1–2 at once, 3–4 by the worker at their slot); 5–10 wait.
    for (i, id) in ids.iter().enumerate() {
        let (status, slot) = match i {
            0..=3 => ("analyzed", None),
            4 | 5 => ("pending", Some("+59 minutes")),
            6 | 7 => ("pending", Some("+119 minutes")),
            _ => ("pending", Some("+179 minutes")),
        };
        sqlx::query(
            "UPDATE day_logs SET status = ?2,
                 next_attempt_at = CASE WHEN ?3 IS NULL THEN NULL ELSE datetime('now', ?3) END,
                 waiting_for = CASE WHEN ?3 IS NULL THEN NULL ELSE 'deferred' END
             WHERE id = ?1",
        )
        .bind(id)
        .bind(status)
        .bind(slot)
        .execute(&writer)
        .await
        .expect("state");
    }
    writer.close().await;

    let Inserted::New(eleventh) = log(&db.store, 1, 11, "entry 11").await else {
        panic!("a new entry");
    };
    assert_eq!(
        db.store
            .recent_use(UserId(1), eleventh.id)
            .await
            .expect("count"),
        6,
        "the six still waiting count"
    );
    let wait = db
        .store
        .defer_to_free_slot(&eleventh, 2)
        .await
        .expect("defer");
    let minutes = wait.as_secs() / 60;
    assert!((238..=239).contains(&minutes), "{minutes} minutes");
}

on_each_backend! {
    async fn unfinished_finds_due_pending_and_unreplied_logs(db: TestDb) {
    user(&db.store, 1).await;
    let pending = log(&db.store, 1, 1, "pending").await.id();
    let later = log(&db.store, 1, 2, "later").await.id();
    let analysed = log(&db.store, 1, 3, "analysed, not replied").await.id();
    let done = log(&db.store, 1, 4, "done").await.id();
    db.store
        .record(
            later,
            "later",
            &support::waiting(Wait::Provider, Duration::from_secs(3600)),
        )
        .await
        .expect("retry");
    store_analysis(&db.store, analysed.get(), "x", "{}")
        .await
        .expect("analysed");
    store_analysis(&db.store, done.get(), "x", "{}")
        .await
        .expect("done");
    db.store.mark_replied(done).await.expect("replied");

    let work = db
        .store
        .unfinished(FrontEnd::Telegram, 100)
        .await
        .expect("unfinished");
    let ids: Vec<(Unfinished, LogId)> = work.iter().map(|(k, l)| (*k, l.id)).collect();
    assert_eq!(
        ids,
        [
            (Unfinished::Analyse, pending),
            (Unfinished::Reply, analysed)
        ]
    );
    }
}

on_each_backend! {
    async fn an_edit_sends_the_log_back_to_pending(db: TestDb) {
    user(&db.store, 1).await;
    let id = log(&db.store, 1, 7, "typo").await.id();
    store_analysis(&db.store, id.get(), "x", "{}")
        .await
        .expect("analysed");
    db.store.mark_replied(id).await.expect("replied");

    let edited = db
        .store
        .update_text(ChatId(1), MessageId(7), "fixed")
        .await
        .expect("update");
    assert_eq!(edited.map(|l| l.id), Some(id));
    let stored = db.store.log(id).await.expect("read").expect("row");
    assert_eq!(stored.text, "fixed");
    assert_eq!(stored.status, LogStatus::Pending);
    assert_eq!(stored.replied_at, None);
    assert_eq!(
        db.store
            .update_text(ChatId(1), MessageId(999), "never stored")
            .await
            .expect("ok"),
        None
    );
    }
}

/// SQLite only: SQLite's query plans (`EXPLAIN QUERY PLAN`).
#[tokio::test]
async fn the_hot_queries_use_their_indexes() {
    let db = fresh().await;
    let plan = |sql: &str| {
        let pool = db.store.read_pool().expect("a SQLite store").clone();
        let sql = sql.to_owned();
        async move {
            let rows: Vec<(i64, i64, i64, String)> =
                sqlx::query_as(&format!("EXPLAIN QUERY PLAN {sql}"))
                    .fetch_all(&pool)
                    .await
                    .expect("plan");
            rows.into_iter().map(|r| r.3).collect::<Vec<_>>().join("\n")
        }
    };
    let history =
        plan("SELECT * FROM day_logs WHERE user_id = 1 ORDER BY created_at DESC, id DESC LIMIT 10")
            .await;
    assert!(history.contains("day_logs_user_created"), "{history}");
    let stats = plan("SELECT * FROM daily_metrics WHERE user_id = 1 AND day >= '2026-01-01'").await;
    assert!(stats.contains("day_logs_user_day"), "{stats}");
    let due = plan(
        "SELECT id FROM day_logs WHERE status = 'pending' AND next_attempt_at <= datetime('now')",
    )
    .await;
    assert!(due.contains("day_logs_status_next"), "{due}");
    // The worker's "answer never sent" half reads only the rows still owed a reply, not
    // every analysed log of the history.
    let unreplied = plan(&format!(
        "SELECT id FROM day_logs WHERE {}",
        daylog::store::UNFINISHED_REPLY
    ))
    .await;
    assert!(unreplied.contains("day_logs_unreplied"), "{unreplied}");
    let reminders = plan(
        "SELECT r.user_id FROM reminders r JOIN users u ON u.user_id = r.user_id
         WHERE r.enabled = 1 AND r.next_due_at <= '2026-12-01 21:00:00'
         ORDER BY r.next_due_at LIMIT 1000",
    )
    .await;
    assert!(reminders.contains("reminders_due"), "{reminders}");
    assert!(!reminders.contains("SCAN r"), "{reminders}");
    // The scheduler's own queries, every half (due, no moment at all, today's `T`) searched.
    for (sql, index, scan) in [
        (daylog::store::DUE_REMINDERS_SQL, "reminders_due", "SCAN r"),
        (daylog::store::DUE_DIGESTS_SQL, "users_digest_due", "SCAN u"),
    ] {
        let sql = sql
            .replace("?1", "'2026-12-01 21:00:00'")
            .replace("?2", "1000")
            .replace("?3", "'2026-12-01T'")
            .replace("?4", "'2026-12-01U'")
            .replace("?5", "'2026-12-09 21:00:00'");
        let due = plan(sql.leak()).await;
        assert_eq!(due.matches(index).count(), 3, "{due}");
        assert!(!due.contains(scan), "{due}");
        assert!(!due.contains("TEMP B-TREE"), "{due}");
    }
}

on_each_backend! {
    async fn an_entry_keeps_the_local_day_it_was_stored_with(db: TestDb) {
    user(&db.store, 1).await;
    let day: jiff::civil::Date = "2026-11-30".parse().expect("day");
    let id = db
        .store
        .insert_log(&NewLog {
            user_id: UserId(1),
            chat_id: ChatId(1),
            message_id: MessageId(1),
            text: "late evening",
            local_day: Some(day),
            written_at: None,
        })
        .await
        .expect("insert")
        .id();
    let zone = daylog::time::UserZone::parse("Asia/Tokyo").expect("zone");
    db.store.set_timezone(UserId(1), &zone).await.expect("tz");
    db.store
        .update_text(ChatId(1), MessageId(1), "edited")
        .await
        .expect("edit");
    let stored = db.store.log(id).await.expect("read").expect("row");
    assert_eq!(
        stored.local_day,
        Some(day),
        "neither /tz nor an edit moves it"
    );
    let user = db.store.user(UserId(1)).await.expect("read").expect("user");
    assert_eq!(user.timezone.name(), "Asia/Tokyo");
    }
}

on_each_backend! {
    async fn a_row_inserted_without_a_local_day_gets_the_utc_day_with_the_four_hour_rule(db: TestDb) {
    user(&db.store, 1).await;
    // A script's own connection, as `sqlite3` would be.
    let raw = Raw::connect(&db.url).await;
    raw.exec(
        "INSERT INTO day_logs (user_id, chat_id, message_id, text, created_at)
         VALUES (1, 1, 1, 'night', '2026-12-01 03:30:00'), (1, 1, 2, 'morning', '2026-12-01 04:00:00')",
    )
    .await;
    let days: Vec<(String,)> = raw
        .rows("SELECT local_day FROM day_logs ORDER BY message_id")
        .await;
    assert_eq!(days, [("2026-11-30".to_owned(),), ("2026-12-01".to_owned(),)]);
    }
}

on_each_backend! {
    async fn results_of_an_old_text_are_not_stored_over_an_edit(db: TestDb) {
    user(&db.store, 1).await;
    let id = log(&db.store, 1, 7, "first text").await.id();
    db.store
        .update_text(ChatId(1), MessageId(7), "edited text")
        .await
        .expect("edit");

    let stored = db
        .store
        .record(
            id,
            "first text",
            &support::analysed("analysis of the old text", "{}"),
        )
        .await
        .expect("query");

    assert!(!stored, "the analysis of the old text is refused");
    let row = db.store.log(id).await.expect("read").expect("row");
    assert_eq!(row.status, LogStatus::Pending);
    assert_eq!(row.analysis, None);
    assert!(
        !db.store
            .record(
                id,
                "first text",
                &support::waiting(Wait::Provider, Duration::from_secs(1))
            )
            .await
            .expect("q")
    );
    assert!(
        !db.store
            .record(id, "first text", &LogOutcome::Blocked { metrics: None })
            .await
            .expect("q")
    );
    assert!(
        db.store
            .record(id, "edited text", &support::analysed("ok", "{}"))
            .await
            .expect("q")
    );
    }
}

on_each_backend! {
    async fn metric_columns_follow_the_metrics_json(db: TestDb) {
    user(&db.store, 1).await;
    let id = log(&db.store, 1, 1, "a").await.id();
    store_analysis(
        &db.store,
        id.get(),
        "x",
        r#"{"mood":4,"stress":2,"energy":3,"productivity":5,"sleep_hours":null,"defaulted":["energy","sleep_hours"]}"#,
    )
    .await
    .expect("analysed");
    type Columns = (
        Option<f64>,
        Option<f64>,
        Option<f64>,
        Option<f64>,
        Option<f64>,
    );
    let row: Columns = Raw::connect(&db.url)
        .await
        .rows(&format!(
            "SELECT mood, stress, energy, productivity, sleep_hours FROM day_logs WHERE id = {}",
            id.get()
        ))
        .await
        .pop()
        .expect("row");
    assert_eq!(row, (Some(4.0), Some(2.0), None, Some(5.0), None));
    }
}

on_each_backend! {
    async fn an_answer_sent_for_an_old_text_does_not_mark_the_edited_log_answered(db: TestDb) {
    user(&db.store, 1).await;
    let id = log(&db.store, 1, 7, "text A").await.id();
    // The worker stores the analysis of A and starts sending it…
    assert!(
        db.store
            .record(id, "text A", &support::analysed("about A", "{}"))
            .await
            .expect("q")
    );
    // …the user edits the message meanwhile…
    db.store
        .update_text(ChatId(1), MessageId(7), "text B")
        .await
        .expect("edit");
    // …and the send of A's answer completes.
    db.store.mark_replied(id).await.expect("q");

    let row = db.store.log(id).await.expect("read").expect("row");
    assert_eq!(row.replied_at, None, "B's answer is still owed");
    let work = db
        .store
        .unfinished(FrontEnd::Telegram, 10)
        .await
        .expect("unfinished");
    assert_eq!(work.len(), 1, "the worker will analyse B");
    }
}

on_each_backend! {
    async fn an_edit_that_keeps_the_text_changes_nothing(db: TestDb) {
    user(&db.store, 1).await;
    let id = log(&db.store, 1, 7, "same").await.id();
    assert!(
        db.store
            .record(id, "same", &support::analysed("x", "{}"))
            .await
            .expect("q")
    );
    db.store.mark_replied(id).await.expect("q");

    let edited = db
        .store
        .update_text(ChatId(1), MessageId(7), "same")
        .await
        .expect("q");

    assert!(edited.is_none());
    let row = db.store.log(id).await.expect("read").expect("row");
    assert_eq!(row.status, LogStatus::Analyzed);
    assert!(row.replied_at.is_some());
    }
}

on_each_backend! {
    async fn terminal_entries_take_negative_ids_that_telegram_never_meets(db: TestDb) {
    user(&db.store, 1).await;

    let first = db
        .store
        .insert_chat_log(UserId(1), "typed one", None)
        .await
        .expect("one");
    let second = db
        .store
        .insert_chat_log(UserId(1), "typed two", None)
        .await
        .expect("two");
    let telegram = log(&db.store, 1, 1, "from the phone").await;

    assert_eq!(
        (first.message_id, second.message_id),
        (MessageId(-1), MessageId(-2))
    );
    assert!(matches!(telegram, Inserted::New(_)), "{telegram:?}");
    let sources: Vec<(i64, String)> = Raw::connect(&db.url)
        .await
        .rows("SELECT message_id, source FROM day_logs ORDER BY id")
        .await;
    assert_eq!(
        sources,
        [
            (-1, "chat".to_owned()),
            (-2, "chat".to_owned()),
            (1, "telegram".to_owned())
        ]
    );
    }
}

on_each_backend! {
    async fn concurrent_terminal_inserts_on_two_handles_never_share_an_id(db: TestDb) {
    user(&db.store, 1).await;
    let other = Store::open(&db.url, Duration::from_secs(5))
        .await
        .expect("second handle");

    let inserts = (0..40).map(|i| {
        let store = if i % 2 == 0 {
            db.store.clone()
        } else {
            other.clone()
        };
        async move {
            store
                .insert_chat_log(UserId(1), &format!("line {i}"), None)
                .await
        }
    });
    let logs = futures::future::join_all(inserts).await;

    let mut ids: Vec<i64> = logs
        .into_iter()
        .map(|log| log.expect("stored").message_id.get())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (-40..=-1).collect::<Vec<_>>());
    }
}

on_each_backend! {
    async fn each_front_end_finds_only_its_own_unfinished_logs(db: TestDb) {
    user(&db.store, 1).await;
    user(&db.store, 2).await;
    let telegram = log(&db.store, 1, 5, "from Telegram").await.id();
    let mine = db
        .store
        .insert_chat_log(UserId(1), "terminal of 1", None)
        .await
        .expect("1")
        .id;
    let theirs = db
        .store
        .insert_chat_log(UserId(2), "terminal of 2", None)
        .await
        .expect("2")
        .id;

    let found = |front_end| {
        let store = db.store.clone();
        async move {
            let work = store.unfinished(front_end, 100).await.expect("unfinished");
            work.into_iter().map(|(_, log)| log.id).collect::<Vec<_>>()
        }
    };

    assert_eq!(found(FrontEnd::Telegram).await, [telegram]);
    assert_eq!(
        found(FrontEnd::Terminal { user_id: UserId(1) }).await,
        [mine]
    );
    assert_eq!(
        found(FrontEnd::Terminal { user_id: UserId(2) }).await,
        [theirs]
    );
    }
}

on_each_backend! {
    async fn day_activities_follow_the_metrics_of_the_day_through_edits(db: TestDb) {
    user(&db.store, 1).await;
    let a = log(&db.store, 1, 1, "ran").await.id();
    let b = log(&db.store, 1, 2, "worked").await.id();
    store_analysis(
        &db.store,
        a.get(),
        "x",
        r#"{"activities":["run"],"defaulted":[]}"#,
    )
    .await
    .expect("a");
    store_analysis(
        &db.store,
        b.get(),
        "x",
        r#"{"activities":["work","run"],"defaulted":[]}"#,
    )
    .await
    .expect("b");
    let day = today();
    let names = |rows: Vec<(jiff::civil::Date, String)>| {
        assert!(rows.iter().all(|(on, _)| *on == day), "{rows:?}");
        rows.into_iter().map(|r| r.1).collect::<Vec<_>>()
    };
    assert_eq!(
        names(db.store.day_activities(UserId(1), day).await.expect("read")),
        ["run", "work"]
    );

    // An edit of the second entry drops its metrics; `run` stays through the first.
    db.store
        .update_text(ChatId(1), MessageId(2), "rested")
        .await
        .expect("edit");
    assert_eq!(
        names(db.store.day_activities(UserId(1), day).await.expect("read")),
        ["run"]
    );
    store_analysis(
        &db.store,
        b.get(),
        "x",
        r#"{"activities":["swim"],"defaulted":[]}"#,
    )
    .await
    .expect("b again");
    assert_eq!(
        names(db.store.day_activities(UserId(1), day).await.expect("read")),
        ["run", "swim"]
    );

    db.store.delete_user(UserId(1)).await.expect("delete");
    assert!(
        db.store
            .day_activities(UserId(1), day)
            .await
            .expect("read")
            .is_empty()
    );
    }
}

on_each_backend! {
    /// Metrics written by hand, by a statement over several entries at once and
    /// without a "defaulted" list (daylog always writes one), still make the metric
    /// columns and the day's activities, as on either backend.
    async fn metrics_written_by_hand_make_the_columns_and_activities(db: TestDb) {
    user(&db.store, 1).await;
    log(&db.store, 1, 1, "ran").await;
    log(&db.store, 1, 2, "worked").await;
    let raw = Raw::connect(&db.url).await;
    raw.exec(
        r#"UPDATE day_logs SET metrics = CASE message_id
               WHEN 1 THEN '{"mood": 4, "activities": ["run"]}'
               ELSE '{"mood": 2, "stress": 5, "activities": ["work", "run"]}' END
           WHERE user_id = 1"#,
    )
    .await;
    let day = today();
    let days = db.store.daily_metrics(UserId(1), day).await.expect("read");
    assert_eq!(days.len(), 1, "{days:?}");
    assert_eq!((days[0].mood, days[0].stress), (Some(3.0), Some(5.0)));
    let activities = |rows: Vec<(jiff::civil::Date, String)>| {
        rows.into_iter().map(|r| r.1).collect::<Vec<_>>()
    };
    assert_eq!(
        activities(db.store.day_activities(UserId(1), day).await.expect("read")),
        ["run", "work"]
    );
    // Both again at once, one of them without its activities now.
    raw.exec(
        r#"UPDATE day_logs SET metrics = CASE message_id
               WHEN 1 THEN '{"mood": 5, "activities": ["swim"]}'
               ELSE '{"mood": 1}' END
           WHERE user_id = 1"#,
    )
    .await;
    let days = db.store.daily_metrics(UserId(1), day).await.expect("read");
    assert_eq!((days[0].mood, days[0].stress), (Some(3.0), None));
    assert_eq!(
        activities(db.store.day_activities(UserId(1), day).await.expect("read")),
        ["swim"]
    );
    }
}

/// `/lang` and `/delete` wait out a lock held longer than `busy_timeout` (a `sqlite3`
/// shell left in a transaction) like every other write, instead of failing at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn language_and_delete_retry_a_busy_database_like_every_write() {
    use sqlx::Connection as _;
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}/daylog.db", dir.path().display());
    let store = Store::open_and_migrate(&url, Duration::from_millis(100))
        .await
        .expect("store opens");
    user(&store, 1).await;
    user(&store, 2).await;
    log(&store, 2, 1, "to be deleted").await;
    let mut locker = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("second connection");
    sqlx::query("BEGIN EXCLUSIVE")
        .execute(&mut locker)
        .await
        .expect("lock");
    sqlx::query("INSERT INTO users (user_id, chat_id) VALUES (99, 99)")
        .execute(&mut locker)
        .await
        .expect("write under the lock");

    let language = tokio::spawn({
        let store = store.clone();
        async move { store.set_language(UserId(1), Language::Ru).await }
    });
    let delete = tokio::spawn({
        let store = store.clone();
        async move { store.delete_user(UserId(2)).await }
    });
    // Longer than busy_timeout, well within the retries.
    tokio::time::sleep(Duration::from_millis(600)).await;
    sqlx::query("COMMIT")
        .execute(&mut locker)
        .await
        .expect("unlock");

    language.await.expect("task").expect("language set");
    assert_eq!(delete.await.expect("task").expect("deleted"), 1);
    assert_eq!(
        store
            .user(UserId(1))
            .await
            .expect("read")
            .expect("user")
            .language,
        Language::Ru
    );
    assert!(store.user(UserId(2)).await.expect("read").is_none());
}

on_each_backend! {
    /// The store hands out `users.language` as a `Language`: a code written by hand (or
    /// by an older daylog) that is not one of ours reads as English, never an error.
    async fn a_users_language_comes_back_as_a_language(db: TestDb) {
    user(&db.store, 1).await;
    db.store
        .set_language(UserId(1), Language::Ru)
        .await
        .expect("ru");
    let stored = db.store.user(UserId(1)).await.expect("read").expect("user");
    assert_eq!(stored.language, Language::Ru);

    let raw = Raw::connect(&db.url).await;
    raw.exec("UPDATE users SET language = 'de-AT' WHERE user_id = 1")
        .await;
    raw.close().await;
    let stored = db.store.user(UserId(1)).await.expect("read").expect("user");
    assert_eq!(stored.language, Language::En);
    }
}

on_each_backend! {
    /// `/delete` removes the user's digests too.
    async fn delete_user_removes_that_users_digests_and_no_other(db: TestDb) {
    user(&db.store, 1).await;
    user(&db.store, 2).await;
    let week: jiff::civil::Date = "2026-11-30".parse().expect("date");
    for id in [1, 2] {
        let (digest, _) = db
            .store
            .insert_digest(UserId(id), ChatId(id), week, FrontEnd::Telegram, None)
            .await
            .expect("digest");
        // Its attempt, whose error text may quote the week back.
        db.store.digest_call_sink(digest.id).record(Attempt {
            http_status: Some(400),
            outcome: Outcome::BadRequest,
            error: Some(format!("the week of user {id} quoted back")),
            ..answered(Task::Digest)
        });
    }
    db.store.flush_calls().await;
    let raw = Raw::connect(&db.url).await;
    let digest_calls = |user: i64| {
        let raw = &raw;
        async move {
            raw.value::<i64>(&format!(
                "SELECT count(*) FROM llm_calls c JOIN digests d ON d.id = c.digest_id
                  WHERE d.user_id = {user} AND c.task = 'digest'"
            ))
            .await
        }
    };
    assert_eq!(digest_calls(1).await, 1);

    db.store.delete_user(UserId(1)).await.expect("/delete");

    let quoted: i64 = raw
        .value("SELECT count(*) FROM llm_calls WHERE error LIKE '%user 1 quoted%'")
        .await;
    assert_eq!(quoted, 0, "the digest's calls went with it");
    assert_eq!(digest_calls(2).await, 1);

    assert_eq!(
        db.store
            .digest_of_week(UserId(1), week)
            .await
            .expect("read"),
        None
    );
    assert!(
        db.store
            .digest_of_week(UserId(2), week)
            .await
            .expect("read")
            .is_some()
    );
    raw.close().await;
    }
}

/// A digest is read with its week as a date, its status as an enum and its stored time
/// as a moment; a week that is no date is `None` (the worker gives such a digest up).
#[tokio::test]
async fn digests_are_read_typed_and_a_week_that_is_no_date_as_none() {
    let db = fresh().await;
    user(&db.store, 1).await;
    let week: jiff::civil::Date = "2026-11-30".parse().expect("day");
    let (digest, created) = db
        .store
        .insert_digest(UserId(1), ChatId(1), week, FrontEnd::Telegram, None)
        .await
        .expect("insert");
    assert!(created);
    assert_eq!(digest.week_start, Some(week));
    assert_eq!(digest.status, store::DigestStatus::Pending);
    assert_eq!(
        daylog::time::sql_timestamp(digest.created_at).len(),
        "YYYY-MM-DD HH:MM:SS".len()
    );
    assert_ne!(digest.created_at, jiff::Timestamp::UNIX_EPOCH);
    db.store.mark_digest_sent(digest.id).await.expect("sent");
    let sent = db
        .store
        .digest_of_week(UserId(1), week)
        .await
        .expect("read")
        .expect("row");
    assert_eq!(sent.status, store::DigestStatus::Sent);

    let (other, _) = db
        .store
        .insert_digest(
            UserId(1),
            ChatId(1),
            "2026-12-07".parse().expect("day"),
            FrontEnd::Telegram,
            None,
        )
        .await
        .expect("insert");
    let writer = sqlx::SqlitePool::connect(&db.url).await.expect("writer");
    sqlx::query("UPDATE digests SET week_start = 'someday' WHERE id = ?1")
        .bind(other.id)
        .execute(&writer)
        .await
        .expect("hand edit");
    writer.close().await;
    let due = db
        .store
        .due_digests(FrontEnd::Telegram, 10)
        .await
        .expect("due");
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].id, other.id);
    assert_eq!(due[0].week_start, None);
}

/// Local days come back as dates: a log's day is `None` and the streak's days leave it
/// out when the stored text is no date (a hand edit), the row still readable.
#[tokio::test]
async fn a_local_day_that_is_no_date_is_read_as_none_and_left_out_of_the_days() {
    let db = fresh().await;
    user(&db.store, 1).await;
    let good = log(&db.store, 1, 10, "a calm day").await.id();
    let bad = log(&db.store, 1, 11, "another").await.id();
    let writer = sqlx::SqlitePool::connect(&db.url).await.expect("writer");
    sqlx::query("UPDATE day_logs SET local_day = 'junk' WHERE id = ?1")
        .bind(bad)
        .execute(&writer)
        .await
        .expect("hand edit");
    writer.close().await;

    let stored = db.store.log(good).await.expect("read").expect("row");
    assert_eq!(stored.local_day, Some(today()));
    let stored = db.store.log(bad).await.expect("read").expect("row");
    assert_eq!((stored.local_day, stored.text.as_str()), (None, "another"));
    assert_eq!(
        db.store.entry_days(UserId(1)).await.expect("days"),
        vec![today()]
    );
}

/// The days of the charts, the prompts and the digest are dates: a stored local day that
/// is no date (a hand edit, here text that sorts inside every range asked for) leaves its
/// row out of the day's metrics, the year, the activities and the week's summaries,
/// while the same entry is still found by `/search`, without a day.
#[tokio::test]
async fn a_local_day_that_is_no_date_is_left_out_of_the_days_and_found_without_one() {
    let db = fresh().await;
    user(&db.store, 1).await;
    let day: jiff::civil::Date = "2026-06-14".parse().expect("day");
    let mut ids = Vec::new();
    for (message_id, text) in [(1, "a long walk"), (2, "another walk")] {
        let inserted = db
            .store
            .insert_log(&NewLog {
                user_id: UserId(1),
                chat_id: ChatId(1),
                message_id: MessageId(message_id),
                text,
                local_day: Some(day),
                written_at: None,
            })
            .await
            .expect("insert");
        ids.push(inserted.id());
    }
    let (good, bad) = (ids[0], ids[1]);
    let writer = sqlx::SqlitePool::connect(&db.url).await.expect("writer");
    sqlx::query("UPDATE day_logs SET local_day = '2026-06-14 (edited)' WHERE id = ?1")
        .bind(bad)
        .execute(&writer)
        .await
        .expect("hand edit");
    writer.close().await;
    for (id, mood) in [(good, 4), (bad, 1)] {
        let metrics = format!(
            r#"{{"mood":{mood},"activities":["walk"],"summary":"walked {mood}","defaulted":[]}}"#
        );
        assert!(
            store_analysis(&db.store, id.get(), "ok", &metrics)
                .await
                .expect("mark")
        );
    }
    let first: jiff::civil::Date = "2026-01-01".parse().expect("day");
    let last: jiff::civil::Date = "2026-06-20".parse().expect("day");
    let logs = crate::support::llm::LogCapture::this_thread();

    let days = db
        .store
        .daily_metrics(UserId(1), first)
        .await
        .expect("days");
    let year = db.store.year_moods(UserId(1), 2026).await.expect("year");
    let activities = db
        .store
        .day_activities(UserId(1), first)
        .await
        .expect("activities");
    let summaries = db
        .store
        .summaries_between(UserId(1), first, last, 10)
        .await
        .expect("summaries");
    let mut hits = db.store.search(UserId(1), "walk").await.expect("search");
    hits.sort_by_key(|hit| hit.id);

    assert_eq!(
        days.iter()
            .map(|d| (d.day, d.mood, d.logs))
            .collect::<Vec<_>>(),
        [(day, Some(4.0), 1)]
    );
    assert_eq!(
        year.iter().map(|d| (d.day, d.mood)).collect::<Vec<_>>(),
        [(day, Some(4.0))]
    );
    assert_eq!(activities, [(day, "walk".to_owned())]);
    assert_eq!(summaries, [(day, "walked 4".to_owned())]);
    assert_eq!(
        hits.iter().map(|h| (h.id, h.day)).collect::<Vec<_>>(),
        [(good, Some(day)), (bad, None)]
    );
    let logs = logs.text();
    for (table, column) in [
        ("daily_metrics", "day"),
        ("day_activities", "local_day"),
        ("day_logs", "local_day"),
    ] {
        assert!(
            logs.contains(&format!("table=\"{table}\""))
                && logs.contains(&format!("column=\"{column}\"")),
            "{table}.{column}: {logs}"
        );
    }
    assert_eq!(
        logs.matches("stored day is not a date").count(),
        5,
        "metrics, year, activities, summary, hit: {logs}"
    );
    assert!(logs.contains(&format!("id={}", bad.get())), "{logs}");
    assert!(!logs.contains("edited"), "never the stored text: {logs}");
}

/// SQLite only (as the next): a SQLite migration of rows an older schema held.
/// Migration 13: a user whose chat on record is a group (one message there, before the
/// bot kept the private chat) has it put back to the private one, and so has a Sunday
/// digest for them still to be delivered; a `/week` asked in the group stays there.
#[tokio::test]
async fn the_private_chat_migration_moves_group_chats_back_to_the_users_own() {
    // Arrange: the schema just before it.
    let (_dir, url) = crate::support::database_before(
        "20261201000013",
        &[
            "INSERT INTO users (user_id, chat_id) VALUES (12, -100), (13, 13)",
            "INSERT INTO digests (user_id, chat_id, week_start, message_id)
             VALUES (12, -100, '2026-11-25', NULL), (12, -100, '2026-11-18', 7)",
        ],
    )
    .await;

    // Act
    let store = Store::open_and_migrate(&url, Duration::from_secs(5))
        .await
        .expect("migrates");

    // Assert
    let users: Vec<(i64, i64)> =
        sqlx::query_as("SELECT user_id, chat_id FROM users ORDER BY user_id")
            .fetch_all(store.read_pool().expect("a SQLite store"))
            .await
            .expect("users");
    assert_eq!(users, [(12, 12), (13, 13)]);
    let digests: Vec<(String, i64)> =
        sqlx::query_as("SELECT week_start, chat_id FROM digests ORDER BY week_start")
            .fetch_all(store.read_pool().expect("a SQLite store"))
            .await
            .expect("digests");
    assert_eq!(
        digests,
        [
            ("2026-11-18".to_owned(), -100),
            ("2026-11-25".to_owned(), 12)
        ]
    );
}

/// Migration 14: an entry an earlier version left waiting for a retry is taken as
/// waiting after a failed analysis, so the first answer after the upgrade brings it
/// forward; one that never failed is not.
#[tokio::test]
async fn entries_waiting_before_the_upgrade_are_resumed_by_the_first_answer_after_it() {
    let (_dir, url) = crate::support::database_before(
        "20261201000014",
        &[
            "INSERT INTO users (user_id, chat_id) VALUES (1, 1)",
            "INSERT INTO day_logs (user_id, chat_id, message_id, text, attempts, next_attempt_at)
             VALUES (1, 1, 1, 'failed twice', 2, datetime('now', '+1 hour')),
                    (1, 1, 2, 'never tried', 0, datetime('now'))",
        ],
    )
    .await;

    let store = Store::open_and_migrate(&url, Duration::from_secs(5))
        .await
        .expect("migrates");

    assert_eq!(store.retry_pending_now().await.expect("resume"), 1);
    let waiting: Vec<(i64, Option<String>)> =
        sqlx::query_as("SELECT message_id, waiting_for FROM day_logs ORDER BY message_id")
            .fetch_all(store.read_pool().expect("a SQLite store"))
            .await
            .expect("rows");
    assert_eq!(waiting, [(1, Some("provider".to_owned())), (2, None)]);
}

on_each_backend! {
    /// A digest due while entries are still waiting for an answer (an outage on Sunday
    /// evening) looks back on them too: their text stands in for the summary they do not
    /// have yet. A refused entry's text never does (it would get the digest refused), its
    /// summary does, also while it waits for another step; a voice note not transcribed
    /// yet (no text) is left out.
    async fn a_weeks_summaries_take_the_text_of_entries_not_analysed_yet(db: TestDb) {
    user(&db.store, 1).await;
    let analysed = log(&db.store, 1, 1, "a long walk").await.id();
    log(&db.store, 1, 2, "  a very long day at work  ").await;
    let refused = log(&db.store, 1, 3, "something the model refused")
        .await
        .id();
    let refused_with_summary = log(&db.store, 1, 4, "refused, but summarised").await.id();
    log(&db.store, 1, 5, "").await;
    log(&db.store, 1, 6, &"x".repeat(500)).await;
    // Pending, as another step may still answer, but one model refused it already.
    let refused_pending = log(&db.store, 1, 7, "refused once, still pending")
        .await
        .id();
    db.store
        .record_refusals(
            refused_pending,
            "refused once, still pending",
            &[ModelRef::new("gemini", "flash")],
        )
        .await
        .expect("refusal");
    let metrics = |summary: &str| {
        format!(r#"{{"mood":3,"activities":[],"summary":"{summary}","defaulted":[]}}"#)
    };
    assert!(
        store_analysis(&db.store, analysed.get(), "ok", &metrics("walked"))
            .await
            .expect("analysed")
    );
    assert!(
        db.store
            .record(
                refused,
                "something the model refused",
                &LogOutcome::Blocked { metrics: None },
            )
            .await
            .expect("blocked")
    );
    assert!(
        db.store
            .record(
                refused_with_summary,
                "refused, but summarised",
                &LogOutcome::Blocked {
                    metrics: Some(support::stored_metrics(&metrics("a hard day"))),
                },
            )
            .await
            .expect("blocked")
    );

    let summaries = db
        .store
        .summaries_between(UserId(1), days_ago(6), today(), 10)
        .await
        .expect("summaries");

    let lines: Vec<&str> = summaries.iter().map(|(_, line)| line.as_str()).collect();
    assert_eq!(
        lines,
        [
            "walked",
            "a very long day at work",
            "a hard day",
            "x".repeat(200).as_str()
        ]
    );
    }
}

/// A week of more entries than a digest is written from keeps every day: each day's
/// first entry, then each day's second, in order (not the oldest few, which left a busy
/// week's digest without its last days).
#[tokio::test]
async fn a_busy_weeks_summaries_keep_every_day() {
    let db = fresh().await;
    user(&db.store, 1).await;
    for n in 1..=5 {
        let id = log(&db.store, 1, n, &format!("Monday {n}")).await.id();
        let writer = sqlx::SqlitePool::connect(&db.url).await.expect("writer");
        sqlx::query("UPDATE day_logs SET local_day = ?2 WHERE id = ?1")
            .bind(id)
            .bind(days_ago(6).to_string())
            .execute(&writer)
            .await
            .expect("an earlier day");
        writer.close().await;
    }
    log(&db.store, 1, 6, "Sunday").await;

    let summaries = db
        .store
        .summaries_between(UserId(1), days_ago(6), today(), 3)
        .await
        .expect("summaries");

    let lines: Vec<&str> = summaries.iter().map(|(_, line)| line.as_str()).collect();
    assert_eq!(lines, ["Monday 1", "Monday 2", "Sunday"]);
}

on_each_backend! {
    /// The store's own guard of a reminder: it is sent at most once per local day, whoever
    /// asks. A tick that finds the reminder due again on a day it was already sent (a second
    /// instance, a scheduler that decided from a stale read) cannot move it on as sent.
    async fn a_reminder_is_moved_on_as_sent_at_most_once_per_local_day(db: TestDb) {
    user(&db.store, 1).await;
    let at = |text: &str| -> jiff::Timestamp { text.parse().expect("moment") };
    let day = |text: &str| -> jiff::civil::Date { text.parse().expect("day") };
    let now = at("2026-12-01T21:05:00Z");
    let time = daylog::time::LocalTime::parse("21:00").expect("time");
    db.store
        .set_reminder(UserId(1), time, at("2026-12-01T21:00:00Z"), now)
        .await
        .expect("set");
    let due = |now| {
        let store = db.store.clone();
        async move {
            let mut due = store.due_reminders(now, 10).await.expect("due");
            assert_eq!(due.len(), 1, "the reminder is due");
            due.remove(0)
        }
    };

    let first = due(now).await;
    let sent = db
        .store
        .advance_reminder(
            UserId(1),
            &first.next_due_at,
            Some(day("2026-12-01")),
            at("2026-12-02T21:00:00Z"),
        )
        .await
        .expect("advance");
    assert!(sent, "the first send of the day");

    // Due again the same day (a hand edit stands for a second scheduler's stale view).
    let writer = Raw::connect(&db.url).await;
    writer
        .exec("UPDATE reminders SET next_due_at = '2026-12-01 21:30:00' WHERE user_id = 1")
        .await;
    writer.close().await;
    let again = due(at("2026-12-01T21:35:00Z")).await;
    assert_eq!(again.last_sent_day, Some(day("2026-12-01")));
    let twice = db
        .store
        .advance_reminder(
            UserId(1),
            &again.next_due_at,
            Some(day("2026-12-01")),
            at("2026-12-02T21:00:00Z"),
        )
        .await
        .expect("advance");
    assert!(!twice, "a second send on the same local day");
    let kept = db
        .store
        .reminder(UserId(1))
        .await
        .expect("read")
        .expect("row");
    assert_eq!(
        kept.next_due_at,
        Some(at("2026-12-01T21:30:00Z")),
        "not moved on"
    );

    // The next local day it is sent again; a skip (no day sent) always moves it on.
    let next_day = db
        .store
        .advance_reminder(
            UserId(1),
            &again.next_due_at,
            Some(day("2026-12-02")),
            at("2026-12-02T21:00:00Z"),
        )
        .await
        .expect("advance");
    assert!(next_day, "another local day");
    let kept = db
        .store
        .reminder(UserId(1))
        .await
        .expect("read")
        .expect("row");
    assert_eq!(kept.last_sent_day, Some(day("2026-12-02")));
    }
}

on_each_backend! {
    /// A digest's whole life in the store — scheduled, due, written, sent, asked again
    /// after a new entry, given up when too old — reads and moves the same on both
    /// backends.
    async fn a_digest_goes_through_its_life_the_same_on_both_backends(db: TestDb) {
        use daylog::store::{DigestAdvance, DigestStatus};
        let store = &db.store;
        user(store, 1).await;
        let at = |text: &str| -> jiff::Timestamp { text.parse().expect("moment") };
        let week = days_ago(6);
        store
            .set_digest(UserId(1), Some(at("2026-12-06T19:00:00Z")))
            .await
            .expect("on");
        assert!(store.digest_enabled(UserId(1)).await.expect("read"));
        let due = store
            .due_digest_users(at("2026-12-06T19:05:00Z"), 10)
            .await
            .expect("due users");
        assert_eq!(due.len(), 1);
        let advanced = store
            .advance_digest(
                UserId(1),
                &due[0].digest_next_at,
                at("2026-12-13T19:00:00Z"),
                Some((ChatId(1), week)),
            )
            .await
            .expect("advance");
        let DigestAdvance::Moved {
            created: Some(digest),
        } = advanced
        else {
            panic!("a digest is created: {advanced:?}")
        };
        let lost = store
            .advance_digest(
                UserId(1),
                &due[0].digest_next_at,
                at("2026-12-13T19:00:00Z"),
                None,
            )
            .await
            .expect("advance again");
        assert_eq!(lost, DigestAdvance::Lost, "moved on once");

        let pending = store
            .due_digests(FrontEnd::Telegram, 10)
            .await
            .expect("due digests");
        assert_eq!(pending.iter().map(|d| d.id).collect::<Vec<_>>(), [digest.id]);
        assert!(store.due_digest(digest.id).await.expect("due").is_some());
        store
            .digest_retry(digest.id, Duration::from_secs(3600))
            .await
            .expect("retry later");
        assert!(store.due_digest(digest.id).await.expect("due").is_none());
        log(store, 1, 1, "a walk").await;
        let (mark, count) = store
            .week_entries_mark(UserId(1), week, today())
            .await
            .expect("mark");
        assert_eq!(count, 1);
        assert_eq!(
            store
                .entries_between(UserId(1), week, today())
                .await
                .expect("count"),
            1
        );
        assert!(
            store
                .store_digest_text(digest.id, "A calm week.", &mark)
                .await
                .expect("text")
        );
        store.mark_digest_sent(digest.id).await.expect("sent");
        let sent = store
            .digest_of_week(UserId(1), week)
            .await
            .expect("read")
            .expect("row");
        assert_eq!(sent.status, DigestStatus::Sent);
        assert_eq!(sent.text.as_deref(), Some("A calm week."));

        let (again, created) = store
            .insert_digest(UserId(1), ChatId(1), week, FrontEnd::Telegram, None)
            .await
            .expect("asked again");
        assert!(!created, "a week is one row");
        let renewed = store
            .renew_digest(&again, ChatId(1), FrontEnd::Telegram, Some(MessageId(9)))
            .await
            .expect("renew")
            .expect("renewed");
        assert_eq!(renewed.status, DigestStatus::Pending);
        assert_eq!((renewed.text, renewed.written_from), (None, None));
        assert!(
            store
                .renew_digest(&again, ChatId(1), FrontEnd::Telegram, None)
                .await
                .expect("renew twice")
                .is_none(),
            "renewed once from what was read"
        );

        let failed = store
            .fail_old_digests(FrontEnd::Telegram, Duration::ZERO)
            .await
            .expect("fail old");
        assert!(failed.is_empty() || failed[0].id == digest.id);
        store.mark_digest_failed(digest.id).await.expect("failed");
        let kept = store
            .digest_of_week(UserId(1), week)
            .await
            .expect("read")
            .expect("row");
        assert_ne!(kept.status, DigestStatus::Pending);
    }
}

on_each_backend! {
    /// Voice notes and imports: stored, transcribed once, shown once, numbered among
    /// the terminal's negative ids, an import counted once — the same on both backends.
    async fn voice_notes_and_imports_are_stored_the_same_on_both_backends(db: TestDb) {
        use daylog::store::{NewImportLog, NewVoiceLog};
        let store = &db.store;
        user(store, 1).await;
        let voice = store
            .insert_voice_log(&NewVoiceLog {
                user_id: UserId(1),
                chat_id: ChatId(1),
                message_id: MessageId(5),
                file_id: "file-5",
                duration_s: Some(12),
                local_day: Some(today()),
                written_at: None,
            })
            .await
            .expect("voice");
        let again = store
            .insert_voice_log(&NewVoiceLog {
                user_id: UserId(1),
                chat_id: ChatId(1),
                message_id: MessageId(5),
                file_id: "file-5",
                duration_s: Some(12),
                local_day: Some(today()),
                written_at: None,
            })
            .await
            .expect("voice again");
        assert_eq!(again, Inserted::Duplicate(voice.id()));
        let note = store
            .voice_note(voice.id())
            .await
            .expect("read")
            .expect("a voice note");
        assert_eq!((note.file_id.as_str(), note.duration_s), ("file-5", Some(12)));
        assert!(note.transcript_sent_at.is_none());
        let stored = store
            .store_transcript(voice.id(), "spoken words")
            .await
            .expect("transcript")
            .expect("stored");
        assert_eq!(stored.text, "spoken words");
        assert!(
            store
                .store_transcript(voice.id(), "other words")
                .await
                .expect("again")
                .is_none(),
            "a second transcription never overwrites the first"
        );
        store.mark_transcript_sent(voice.id()).await.expect("shown");
        let note = store.voice_note(voice.id()).await.expect("read").expect("note");
        assert!(note.transcript_sent_at.is_some());

        let typed = store
            .insert_chat_voice_log(UserId(1), "/tmp/note.ogg", Some(3), None)
            .await
            .expect("terminal voice");
        assert_eq!(typed.message_id, MessageId(-1));

        let rows = [NewImportLog {
            created_at: "2026-11-01T08:00:00Z".parse().expect("moment"),
            local_day: "2026-11-01".parse().expect("day"),
            local_time: jiff::civil::time(11, 0, 0, 0),
            text: "imported",
            mood: Some(4),
            mood_name: "good",
            metrics_json: r#"{"mood":4,"activities":["walk"]}"#.to_owned(),
        }];
        let first = store.import_logs(UserId(1), &rows).await.expect("import");
        let second = store.import_logs(UserId(1), &rows).await.expect("import again");
        assert_eq!((first.imported, first.already), (1, 0));
        assert_eq!((second.imported, second.already), (0, 1));
        let activities = store
            .day_activities(UserId(1), "2026-11-01".parse().expect("day"))
            .await
            .expect("activities");
        assert_eq!(
            activities,
            [("2026-11-01".parse().expect("day"), "walk".to_owned())]
        );
    }
}

on_each_backend! {
    /// The year in pixels and the streaks read the `daily_metrics` view and the local
    /// days the same on both backends: a day's mood is the average of its moods that
    /// were not defaulted, another user's and another year's days stay out.
    async fn the_year_and_the_entry_days_read_the_same_on_both_backends(db: TestDb) {
        let store = &db.store;
        user(store, 1).await;
        user(store, 2).await;
        let metrics = |mood: u8, defaulted: &[&str]| {
            serde_json::json!({
                "mood": mood, "stress": 3, "energy": 3, "productivity": 3,
                "sleep_hours": null, "activities": [], "emotions": [], "summary": "",
                "defaulted": defaulted,
            })
            .to_string()
        };
        let raw = Raw::connect(&db.url).await;
        let on = |user_id: i64, message_id: i64, day: &'static str, json: String| {
            let store = store.clone();
            let raw = &raw;
            async move {
                let id = log(&store, user_id, message_id, "An entry.").await.id();
                assert!(
                    store_analysis(&store, id.get(), "An analysis.", &json)
                        .await
                        .expect("analysed")
                );
                raw.exec(&format!(
                    "UPDATE day_logs SET created_at = '{day} 12:00:00', local_day = '{day}' \
                     WHERE id = {}",
                    id.get()
                ))
                .await;
            }
        };
        on(1, 1, "2025-03-10", metrics(5, &[])).await;
        on(1, 2, "2025-03-11", metrics(3, &["mood"])).await;
        on(1, 3, "2025-03-12", metrics(3, &["mood"])).await;
        on(1, 4, "2025-03-12", metrics(1, &["sleep_hours"])).await;
        on(1, 5, "2024-03-13", metrics(5, &[])).await;
        on(2, 1, "2025-03-13", metrics(5, &[])).await;

        let day = |text: &str| -> jiff::civil::Date { text.parse().expect("day") };
        let year = store.year_moods(UserId(1), 2025).await.expect("year");
        let moods: Vec<(jiff::civil::Date, Option<f64>)> =
            year.iter().map(|d| (d.day, d.mood)).collect();
        assert_eq!(
            moods,
            [
                (day("2025-03-10"), Some(5.0)),
                (day("2025-03-11"), None),
                (day("2025-03-12"), Some(1.0)),
            ]
        );
        let days = store
            .daily_metrics(UserId(1), day("2025-03-11"))
            .await
            .expect("days");
        assert_eq!(
            days.iter().map(|d| (d.day, d.logs)).collect::<Vec<_>>(),
            [(day("2025-03-11"), 1), (day("2025-03-12"), 2)]
        );
        assert_eq!(
            store.entry_days(UserId(1)).await.expect("streak days"),
            [
                day("2025-03-12"),
                day("2025-03-11"),
                day("2025-03-10"),
                day("2024-03-13")
            ]
        );
        assert!(
            store
                .has_entry_on(UserId(1), day("2025-03-11"))
                .await
                .expect("has")
        );
        assert!(
            !store
                .has_entry_on(UserId(1), day("2025-03-13"))
                .await
                .expect("has")
        );
    }
}

on_each_backend! {
    /// What an analysis reads before it asks, in one statement, is what the four reads
    /// it replaces give alone: the hourly count (only when asked for), the days of
    /// metrics from the first day, the summaries before the log newest first (an
    /// imported entry's older `created_at` orders it, not its higher id), the days with
    /// an entry newest first; another user's rows stay out.
    async fn the_read_before_an_analysis_is_the_four_reads_it_replaces(db: TestDb) {
        let store = &db.store;
        user(store, 1).await;
        user(store, 2).await;
        let raw = Raw::connect(&db.url).await;
        let metrics = |mood: u8, summary: &str| {
            serde_json::json!({
                "mood": mood, "stress": 3, "energy": 3, "productivity": 3,
                "sleep_hours": 7.5, "activities": [], "emotions": [], "summary": summary,
                "defaulted": [],
            })
            .to_string()
        };
        let mut ids = Vec::new();
        for (user_id, message_id, day, created, summary) in [
            (1, 1, "2025-03-08", "2025-03-08 09:00:00", "first"),
            (1, 2, "2025-03-10", "2025-03-10 09:00:00", "second"),
            (1, 3, "2025-03-12", "2025-03-12 09:00:00", ""),
            (1, 4, "2025-03-12", "2025-03-12 10:00:00", "fourth"),
            (1, 5, "2025-03-09", "2025-03-09 09:00:00", "imported, older"),
            (2, 1, "2025-03-12", "2025-03-12 11:00:00", "another user's"),
        ] {
            let id = log(store, user_id, message_id, "An entry.").await.id();
            assert!(
                store_analysis(store, id.get(), "An analysis.", &metrics(4, summary))
                    .await
                    .expect("analysed")
            );
            raw.exec(&format!(
                "UPDATE day_logs SET created_at = '{created}', local_day = '{day}' \
                 WHERE id = {}",
                id.get()
            ))
            .await;
            ids.push(id);
        }
        let pending = log(store, 1, 6, "Today's entry.").await.id();
        let day = |text: &str| -> jiff::civil::Date { text.parse().expect("day") };
        let first = day("2025-03-09");

        let before = store
            .before_analysis(UserId(1), pending, first, 3, true)
            .await
            .expect("read");
        let alone = daylog::store::BeforeAnalysis {
            recent_use: Some(
                store
                    .recent_use(UserId(1), pending)
                    .await
                    .expect("recent use"),
            ),
            days: store.daily_metrics(UserId(1), first).await.expect("days"),
            summaries: store
                .recent_summaries(UserId(1), pending, 3)
                .await
                .expect("summaries"),
            entry_days: store.entry_days(UserId(1)).await.expect("entry days"),
        };
        assert_eq!(before, alone);
        assert_eq!(before.summaries, ["fourth", "second", "imported, older"]);
        assert_eq!(
            before.days.iter().map(|d| (d.day, d.logs)).collect::<Vec<_>>(),
            [
                (day("2025-03-09"), 1),
                (day("2025-03-10"), 1),
                (day("2025-03-12"), 2),
                (today(), 1)
            ]
        );
        assert_eq!(before.days[2].sleep_hours, Some(7.5));
        assert_eq!(before.entry_days.len(), 5, "{:?}", before.entry_days);

        let without = store
            .before_analysis(UserId(1), pending, first, 3, false)
            .await
            .expect("read");
        assert_eq!(without.recent_use, None);
        assert_eq!(without.days, alone.days);

        let earlier = store
            .before_analysis(UserId(1), ids[3], first, 3, true)
            .await
            .expect("read");
        assert_eq!(earlier.summaries, ["second", "first"], "only logs before it");
    }
}

on_each_backend! {
    /// Answers sent at once are recorded by one statement: each decided log gets its
    /// `replied_at`, and one edited back to pending meanwhile is left owed, as
    /// `mark_replied` leaves it.
    async fn answers_recorded_together_leave_an_edited_log_owed(db: TestDb) {
        let store = &db.store;
        user(store, 1).await;
        let mut ids = Vec::new();
        for message_id in 1..=3 {
            let id = log(store, 1, message_id, "An entry.").await.id();
            ids.push(id);
        }
        for id in [ids[0], ids[2]] {
            assert!(
                store_analysis(store, id.get(), "An analysis.", "{}")
                    .await
                    .expect("analysed")
            );
        }
        let answers: Vec<(LogId, Option<daylog::store::Fence>)> =
            ids.iter().map(|id| (*id, None)).collect();
        assert_eq!(
            store.mark_replied_all(&answers).await.expect("recorded"),
            [],
            "no lease: none taken over"
        );
        let replied = |id: LogId| async move {
            store
                .log(id)
                .await
                .expect("read")
                .expect("log")
                .replied_at
                .is_some()
        };
        assert!(replied(ids[0]).await);
        assert!(!replied(ids[1]).await, "still pending: its answer is owed");
        assert!(replied(ids[2]).await);
    }
}

/// On PostgreSQL an analysis is recorded without waiting for the server's WAL flush
/// (as SQLite records it without its `fdatasync`), and an entry still waits for it:
/// with the database's `synchronous_commit` on (the server's default), the WAL is
/// found flushed as far as it was written after each entry's insert, and not yet
/// after most analyses' records, which the next entry's commit flushes. On a server of
/// the test's own: the shared one's WAL moves with every other test's writes.
#[tokio::test]
async fn on_postgres_an_analysis_does_not_wait_for_the_wal_flush_and_an_entry_does() {
    let Some(db) = crate::support::cluster::OwnPostgres::for_test("the WAL flush test") else {
        return;
    };
    let raw = Raw::connect(&db.url).await;
    // The test servers turn it off for speed: on for this database, as a server
    // installed with its defaults runs.
    raw.exec(
        "DO $$ BEGIN
             EXECUTE format('ALTER DATABASE %I SET synchronous_commit = on', current_database());
         END $$",
    )
    .await;
    let store = Store::open_and_migrate(&db.url, Duration::from_secs(5))
        .await
        .expect("store opens");
    user(&store, 1).await;
    let flushed = "SELECT pg_current_wal_flush_lsn() >= pg_current_wal_insert_lsn()";
    let (mut entries_flushed, mut analyses_flushed) = (0, 0);
    for message in 0..20 {
        let text = format!("entry {message}");
        let Inserted::New(entry) = log(&store, 1, message, &text).await else {
            panic!("a new entry");
        };
        entries_flushed += i32::from(raw.value::<bool>(flushed).await);
        let recorded = store
            .record(entry.id, &text, &support::analysed("fine", "{}"))
            .await
            .expect("recorded");
        assert!(recorded);
        analyses_flushed += i32::from(raw.value::<bool>(flushed).await);
    }
    assert!(
        entries_flushed >= 18,
        "{entries_flushed} of 20 entries flushed"
    );
    assert!(
        analyses_flushed <= 10,
        "{analyses_flushed} of 20 analyses flushed"
    );
}

/// The plan the store's PostgreSQL connections run `sql` with: one plan for all
/// values, a generic plan (`plan_cache_mode = force_generic_plan`). `sql` prepared,
/// then explained for `args` (its parameters' values, as SQL).
async fn generic_plan(url: &str, sql: &str, args: &str) -> String {
    use sqlx::Connection as _;
    let mut conn = sqlx::PgConnection::connect(url)
        .await
        .expect("a connection");
    sqlx::raw_sql("SET plan_cache_mode = force_generic_plan")
        .execute(&mut conn)
        .await
        .expect("the store's plans");
    sqlx::raw_sql(&format!("PREPARE planned AS {sql}"))
        .execute(&mut conn)
        .await
        .expect("prepared");
    let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN EXECUTE planned({args})"))
        .fetch_all(&mut conn)
        .await
        .expect("a plan");
    plan.join("\n")
}

/// The store's PostgreSQL connections plan each statement once for all its values,
/// and `/search` plans its read of the word index for each search's words, however
/// often a connection ran it (after five runs PostgreSQL settles on one plan for every
/// word, which read all of a common word's entries), and only there.
#[tokio::test]
async fn on_postgres_statements_are_planned_once_and_searches_for_their_words() {
    let Some(db) = fresh_postgres().await else {
        return; // said once by `backends()`; CI=true fails there
    };
    user(&db.store, 1).await;
    let raw = Raw::connect(&db.url).await;
    raw.exec(
        "INSERT INTO day_logs (user_id, chat_id, message_id, text, status)
         SELECT 1, 1, n, 'worked today, number ' || n, 'analyzed'
           FROM generate_series(1, 3000) AS n",
    )
    .await;
    raw.exec("ANALYZE").await;
    for words in [
        "worked",
        "number 42",
        "today",
        "worked",
        "number",
        "42",
        "worked",
        "today",
    ] {
        assert!(
            !db.store
                .search(UserId(1), words)
                .await
                .expect("a search")
                .is_empty(),
            "{words}"
        );
    }
    // Every connection the store may have used, held at once.
    let conns = db.store.pg_pool().expect("a PostgreSQL store");
    let mut held = Vec::new();
    for _ in 0..7 {
        held.push(conns.acquire().await.expect("a connection"));
    }
    let (mut custom, mut generic) = (0_i64, 0_i64);
    for conn in &mut held {
        let mode: String = sqlx::query_scalar("SHOW plan_cache_mode")
            .fetch_one(&mut **conn)
            .await
            .expect("the setting");
        assert_eq!(
            mode, "force_generic_plan",
            "the search's setting stays in its transaction"
        );
        let plans: Option<(i64, i64)> = sqlx::query_as(
            "SELECT custom_plans, generic_plans FROM pg_prepared_statements
             WHERE statement = $1",
        )
        .bind(daylog::store::SEARCH_CANDIDATES_POSTGRES_SQL)
        .fetch_optional(&mut **conn)
        .await
        .expect("the plans");
        if let Some((c, g)) = plans {
            custom += c;
            generic += g;
        }
    }
    assert_eq!((custom, generic), (8, 0));
}

/// What an analysis reads on PostgreSQL takes the user's last summaries in the order
/// of `day_logs_user_created`, which ends with the id as the read's order does: it
/// stops at the last summary it keeps. Ending at `created_at`, it read every entry of
/// the latest second (a busy chat writes several in one), parsing each one's metrics,
/// and sorted them.
#[tokio::test]
async fn on_postgres_the_last_summaries_are_read_in_the_indexs_order() {
    let Some(db) = fresh_postgres().await else {
        return; // said once by `backends()`; CI=true fails there
    };
    let raw = Raw::connect(&db.url).await;
    raw.exec(
        "INSERT INTO users (user_id, chat_id, language)
         SELECT u, u, 'en' FROM generate_series(1, 20) AS u",
    )
    .await;
    raw.exec(
        "INSERT INTO day_logs (user_id, chat_id, message_id, text, status, metrics, created_at)
         SELECT 1 + n % 20, 1 + n % 20, n, 'a day', 'analyzed', '{\"summary\": \"fine\"}',
                '2026-12-01 20:00:' || lpad((n / 100)::text, 2, '0')
           FROM generate_series(1, 2000) AS n",
    )
    .await;
    raw.exec("ANALYZE").await;
    let plan = generic_plan(
        &db.url,
        &daylog::store::BEFORE_ANALYSIS_POSTGRES,
        "7, 9223372036854775807, '2026-11-30', 3, true",
    )
    .await;
    // The summaries' part: its node and the nodes under it (indented deeper).
    let mut lines = plan
        .lines()
        .skip_while(|line| !line.contains("Subquery Scan on recent"));
    let head = lines.next().unwrap_or_default();
    let depth = |line: &str| line.len() - line.trim_start().len();
    let summaries: Vec<&str> = std::iter::once(head)
        .chain(lines.take_while(|line| depth(line) > depth(head)))
        .collect();
    let summaries = summaries.join("\n");
    assert!(summaries.contains("day_logs_user_created"), "{plan}");
    assert!(!summaries.contains("Sort"), "{summaries}");
    let history = generic_plan(&db.url, daylog::store::HISTORY_SQL, "7, 10").await;
    assert!(history.contains("day_logs_user_created"), "{history}");
    assert!(!history.contains("Sort"), "{history}");
    // The Mini App's next page starts reading where the last one ended.
    let page = generic_plan(&db.url, daylog::store::ENTRIES_NEXT_PAGE_SQL, "7, 1007, 20").await;
    assert!(
        page.lines()
            .any(|line| line.contains("Index Cond") && line.contains("ROW(created_at, id) < ROW(")),
        "{page}"
    );
}

/// PostgreSQL's word index holds only entries that have words (a new entry has none
/// until its author's next search), and the search's reads of it still find it: a
/// `words @@ …` can only match a row that has words.
#[tokio::test]
async fn on_postgres_the_word_index_leaves_out_entries_without_words() {
    use sqlx::Connection as _;
    let Some(db) = fresh_postgres().await else {
        return; // said once by `backends()`; CI=true fails there
    };
    let raw = Raw::connect(&db.url).await;
    let definition: String = raw
        .value("SELECT indexdef FROM pg_indexes WHERE indexname = 'day_logs_fts_words'")
        .await;
    assert!(
        definition.ends_with("WHERE (words IS NOT NULL)"),
        "{definition}"
    );
    // The only index that can serve the search's `words @@ …` is this one.
    let mut conn = sqlx::PgConnection::connect(&db.url)
        .await
        .expect("a connection");
    sqlx::query("SET enable_seqscan = off")
        .execute(&mut conn)
        .await
        .expect("no table scans");
    let plan: Vec<String> =
        sqlx::query_scalar("EXPLAIN SELECT count(*) FROM day_logs_fts WHERE words @@ $1::tsquery")
            .bind("worked")
            .fetch_all(&mut conn)
            .await
            .expect("a plan");
    let plan = plan.join("\n");
    assert!(plan.contains("day_logs_fts_words"), "{plan}");
}

/// PostgreSQL records answers sent through the primary key of `day_logs`: with the
/// few answers of a batch taken for 50 (a JSON array's rows are not counted), `IN
/// (SELECT …)` was planned as a hash join over a scan of every log of a table of a few
/// thousand.
#[tokio::test]
async fn on_postgres_answers_are_recorded_through_the_logs_primary_key() {
    let Some(db) = fresh_postgres().await else {
        return; // said once by `backends()`; CI=true fails there
    };
    let raw = Raw::connect(&db.url).await;
    raw.exec("INSERT INTO users (user_id, chat_id, language) VALUES (1, 1, 'en')")
        .await;
    raw.exec(
        "INSERT INTO day_logs (user_id, chat_id, message_id, text, status)
         SELECT 1, 1, n, 'a day', 'analyzed' FROM generate_series(1, 2000) AS n",
    )
    .await;
    raw.exec("ANALYZE day_logs").await;
    let plan = generic_plan(
        &db.url,
        daylog::store::MARK_ANSWERED_POSTGRES_SQL,
        r#"'[{"id": 7, "chat": null, "holder": null, "generation": null}]'"#,
    )
    .await;
    assert!(!plan.contains("Seq Scan on day_logs"), "{plan}");
    assert!(plan.contains("day_logs_pkey"), "{plan}");
}

/// A query PostgreSQL runs in parallel may still read the journal through the
/// functions that stand in for SQLite's (`daylog_json`, `daylog_moment`,
/// `daylog_default_day`): each catches a bad text in a subtransaction, which a parallel
/// plan refuses to start, so they keep such a query in one process. The planner's
/// costs are set here so that it plans a parallel scan of even a small table, as it
/// does of a large journal by itself. NULL, a bad text and a good one each read as
/// they did.
#[tokio::test]
async fn on_postgres_the_journal_functions_answer_in_a_query_planned_in_parallel() {
    use sqlx::Connection as _;
    let Some(db) = fresh_postgres().await else {
        return; // said once by `backends()`; CI=true fails there
    };
    let store = &db.store;
    user(store, 1).await;
    for (message, text) in ["first", "second", "third"].into_iter().enumerate() {
        let Inserted::New(entry) = log(store, 1, message as i64, text).await else {
            panic!("a new entry");
        };
        if message == 0 {
            let metrics = support::analysed("fine", r#"{"mood": 7, "summary": "a good day"}"#);
            assert!(
                store
                    .record(entry.id, text, &metrics)
                    .await
                    .expect("recorded")
            );
        }
    }
    // A hand edit leaves text that is no JSON; the third entry has no metrics (NULL).
    let raw = Raw::connect(&db.url).await;
    raw.exec("UPDATE day_logs SET metrics = 'not json' WHERE message_id = 1")
        .await;
    let mut conn = sqlx::PgConnection::connect(&db.url)
        .await
        .expect("a connection");
    for setting in [
        "SET parallel_setup_cost = 0",
        "SET parallel_tuple_cost = 0",
        "SET min_parallel_table_scan_size = 0",
        "SET max_parallel_workers_per_gather = 2",
    ] {
        sqlx::query(setting)
            .execute(&mut conn)
            .await
            .expect(setting);
    }
    // The planner does plan this table's scan in parallel.
    let plan: Vec<String> = sqlx::query_scalar("EXPLAIN SELECT count(*) FROM day_logs")
        .fetch_all(&mut conn)
        .await
        .expect("a plan");
    assert!(plan.join("\n").contains("Parallel"), "{plan:?}");
    let read: (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT count(daylog_json(metrics)),
                count(daylog_json(metrics) ->> 'summary'),
                count(daylog_moment(created_at)) + count(daylog_moment(text)),
                count(daylog_default_day(created_at))
         FROM day_logs",
    )
    .fetch_one(&mut conn)
    .await
    .expect("the functions answer under a parallel plan");
    // One JSON text of two that are not NULL; three moments, no text a moment; a day
    // for each entry.
    assert_eq!(read, (1, 1, 3, 3));
}

/// PostgreSQL's plan of the hourly limit's count reads the user's recent logs and then
/// each one's calls through `llm_calls_day_log`, never every call of the hour: on a
/// journal of 50 users busy in the last hour whose statistics were not gathered yet
/// (as right after a burst), `day_log_id IN (…)` was planned as a scan of `llm_calls`
/// joined with the user's logs, 90 ms an analysis in the load benchmark.
#[tokio::test]
async fn on_postgres_the_hourly_count_reads_the_users_calls_through_their_logs() {
    let Some(db) = fresh_postgres().await else {
        return; // said once by `backends()`; CI=true fails there
    };
    let raw = Raw::connect(&db.url).await;
    raw.exec("ALTER TABLE day_logs SET (autovacuum_enabled = false)")
        .await;
    raw.exec("ALTER TABLE llm_calls SET (autovacuum_enabled = false)")
        .await;
    raw.exec(
        "INSERT INTO users (user_id, chat_id, language)
         SELECT u, u, 'en' FROM generate_series(1, 50) AS u",
    )
    .await;
    raw.exec(
        "INSERT INTO day_logs (user_id, chat_id, message_id, text, status)
         SELECT 1 + n % 50, 1 + n % 50, n, 'a day', 'analyzed' FROM generate_series(1, 2000) AS n",
    )
    .await;
    raw.exec(
        "INSERT INTO llm_calls (day_log_id, task, provider, model, attempt, outcome)
         SELECT l.id, t.task, 'p', 'm', 1, 'ok'
           FROM day_logs AS l, (VALUES ('analysis'), ('metrics')) AS t(task)",
    )
    .await;
    // The user's logs are known to the planner (ANALYZE), the calls not yet.
    raw.exec("ANALYZE day_logs").await;
    let plan = generic_plan(
        &db.url,
        daylog::store::RECENT_USE_POSTGRES_SQL,
        "7, 9223372036854775807",
    )
    .await;
    assert!(!plan.contains("Seq Scan on llm_calls"), "{plan}");
    assert!(plan.contains("llm_calls_day_log"), "{plan}");
}

/// A hang guard, not a threshold: the statements it bounds take milliseconds when they
/// do not wait behind a cancelled one, and would wait forever when they did.
const HANG: Duration = Duration::from_secs(30);

/// A session of its own that holds locks for a test until it ends.
async fn lock_holder(url: &str, lock: &str) -> sqlx::PgConnection {
    use sqlx::Connection as _;
    let mut holder = sqlx::PgConnection::connect(url).await.expect("holder");
    sqlx::raw_sql("BEGIN")
        .execute(&mut holder)
        .await
        .expect("begin");
    sqlx::raw_sql(lock).execute(&mut holder).await.expect(lock);
    holder
}

/// Returns once a session of the test's database waits for a lock.
async fn lock_waited_for(watcher: &Raw) {
    support::wait_until("a statement waiting for the held lock", HANG, || async {
        watcher
            .value::<i64>(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .await
            > 0
    })
    .await;
}

/// PostgreSQL: a statement dropped while the server still runs it (a timeout, a
/// cancelled task) leaves its connection to sqlx, which reads the rest of its answer
/// before lending it again; the store's next statements never queue behind it on that
/// connection (src/store/pg_conns.rs). Given back as if it had completed, the
/// connection is the next statement's, which then waits as long as the lock is held.
#[tokio::test]
async fn on_postgres_a_cancelled_statement_does_not_hold_up_the_next() {
    // Arrange: a user and an entry; another session holds the user's row.
    let Some(db) = fresh_postgres().await else {
        return; // said once by `backends()`; CI=true fails there
    };
    user(&db.store, 1).await;
    log(&db.store, 1, 1, "Before the lock.").await;
    let mut holder = lock_holder(
        &db.url,
        "SELECT 1 FROM users WHERE user_id = 1 FOR NO KEY UPDATE",
    )
    .await;
    let watcher = Raw::connect(&db.url).await;

    // Act: a change of the user's language, dropped once the server shows it waiting
    // for the row; then more of the store's statements.
    tokio::select! {
        done = db.store.set_language(UserId(1), Language::Ru) => {
            panic!("the write went past a held row: {done:?}")
        }
        () = lock_waited_for(&watcher) => {}
    }
    let next = async {
        let other = log(&db.store, 1, 2, "Another entry.").await.id();
        db.store.log(other).await.expect("read").expect("stored")
    };
    let stored = tokio::time::timeout(HANG, next)
        .await
        .expect("the next statements queued behind the cancelled one");

    // Assert: they ran while the dropped one still waited; once the row is free the
    // store goes on as before.
    assert_eq!(stored.text, "Another entry.");
    lock_waited_for(&watcher).await;
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut holder)
        .await
        .expect("rollback");
    log(&db.store, 1, 3, "Once the row is free.").await;
    db.store
        .set_language(UserId(1), Language::En)
        .await
        .expect("language");
    let entries: i64 = watcher.value("SELECT count(*) FROM day_logs").await;
    assert_eq!(
        entries, 3,
        "every entry committed, seen from another session"
    );
    watcher.close().await;
}

/// PostgreSQL: a transaction dropped half-way (its task cancelled) closes its
/// connection, so the server rolls it back: what it wrote is gone, no session is left
/// inside it holding its rows, and no later statement of the store runs in it.
#[tokio::test]
async fn on_postgres_a_transaction_dropped_half_way_is_rolled_back() {
    // Arrange: an entry; another session holds the inbox so that an edit's second
    // statement (its update's mark) waits.
    let Some(db) = fresh_postgres().await else {
        return; // said once by `backends()`; CI=true fails there
    };
    user(&db.store, 1).await;
    let id = log(&db.store, 1, 1, "As first written.").await.id();
    let mut holder = lock_holder(&db.url, "LOCK TABLE updates IN SHARE MODE").await;
    let watcher = Raw::connect(&db.url).await;
    let key = store::UpdateKey {
        bot_id: 1,
        update_id: 1,
    };

    // Act: the edit (the entry's UPDATE, then the mark, in one transaction), dropped
    // while the mark waits; then the inbox is free again.
    tokio::select! {
        done = db.store.update_text_for(ChatId(1), MessageId(1), "Edited, then dropped.", Some(key)) => {
            panic!("the mark went past a held table: {done:?}")
        }
        () = lock_waited_for(&watcher) => {}
    }
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut holder)
        .await
        .expect("rollback");

    // Assert: nobody is left in a transaction, the edit is gone, and the next edit
    // commits (seen from another session).
    support::wait_until("no session left in a transaction", HANG, || async {
        watcher
            .value::<i64>(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND pid <> pg_backend_pid()
                   AND (state LIKE 'idle in transaction%' OR wait_event_type = 'Lock')",
            )
            .await
            == 0
    })
    .await;
    let text_sql = format!("SELECT text FROM day_logs WHERE id = {}", id.get());
    let text = || watcher.value::<String>(&text_sql);
    assert_eq!(text().await, "As first written.");
    let edited = db
        .store
        .update_text(ChatId(1), MessageId(1), "Edited again.")
        .await
        .expect("edit");
    assert!(edited.is_some(), "the text changed");
    assert_eq!(text().await, "Edited again.");
    watcher.close().await;
}

/// PostgreSQL: a burst of statements, far more than connections, opens no more than the
/// store's seven and gives up none half-opened: a statement waiting for a connection
/// does not drop the one sqlx is opening for it when another is given back meanwhile.
/// (Dropped, each was a server backend started for nothing; under the load benchmark's
/// burst, enough of them that the server refused connections.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_a_burst_opens_at_most_seven_connections() {
    // Arrange: users, and the database's count of sessions so far.
    let Some(db) = fresh_postgres().await else {
        return; // said once by `backends()`; CI=true fails there
    };
    for u in 1..=20 {
        user(&db.store, u).await;
    }
    let watcher = Raw::connect(&db.url).await;
    let sessions = || {
        watcher.value::<i64>(
            "SELECT sessions FROM pg_stat_database WHERE datname = current_database()",
        )
    };
    // Act: 400 entries at once, then the store closed (each backend's count of its
    // session is in the server's statistics once it has ended).
    let tasks: Vec<_> = (0..400)
        .map(|i| {
            let store = db.store.clone();
            tokio::spawn(async move { log(&store, 1 + i % 20, i, "An entry of a burst.").await })
        })
        .collect();
    for task in tasks {
        task.await.expect("stored");
    }
    db.store.close().await;
    support::wait_until("the store's sessions ended", HANG, || async {
        watcher
            .value::<i64>(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
            )
            .await
            == 0
    })
    .await;

    // Assert: the store's sessions, all of its life (a migration's and the first
    // statements' included), and the watcher's own, were few.
    let opened = sessions().await;
    assert!(
        opened <= 8 + 1,
        "{opened} sessions: the burst opened more connections than the store holds"
    );
    watcher.close().await;
}

/// PostgreSQL: the store hands its connections out first come, first served, as sqlx's
/// pool did. With all seven in use, one given back goes to the statement that waited
/// for it, not to the task that gave it back and at once asks again (which, under
/// steady load, could keep a waiter out until its acquire timeout).
#[tokio::test] // one thread: each task runs until it waits, in the order woken
async fn on_postgres_a_connection_given_back_goes_to_the_statement_waiting_for_it() {
    // Arrange: all of the store's seven connections in use, and a statement waiting.
    let Some(db) = fresh_postgres().await else {
        return; // said once by `backends()`; CI=true fails there
    };
    let conns = db.store.pg_pool().expect("a PostgreSQL store").clone();
    let mut in_use = Vec::new();
    for _ in 0..7 {
        in_use.push(conns.acquire().await.expect("a connection"));
    }
    let waiting = tokio::spawn({
        let conns = conns.clone();
        async move { conns.acquire().await.map(drop) }
    });
    tokio::task::yield_now().await; // the waiter runs until it waits

    // Act: one connection given back, and asked for again at once by its user.
    drop(in_use.pop());
    let again = futures::FutureExt::now_or_never(conns.acquire());

    // Assert: the waiter's turn came first.
    assert!(
        again.is_none(),
        "the connection went back to its user ahead of the statement waiting for it"
    );
    tokio::time::timeout(HANG, waiting)
        .await
        .expect("the waiter was served")
        .expect("the waiter ran")
        .expect("the waiter had a connection");
}

/// PostgreSQL: a `COMMIT` refused with an `ERROR` (here a key checked at the end of
/// the transaction) has ended its transaction, rolled back on the server, so the
/// store keeps its connection for the next statement instead of closing it.
#[tokio::test]
async fn on_postgres_a_refused_commit_keeps_its_connection() {
    // Arrange: a table whose key is checked at COMMIT, and the session of the
    // connection the transaction will run on.
    let Some(db) = fresh_postgres().await else {
        return; // said once by `backends()`; CI=true fails there
    };
    let raw = Raw::connect(&db.url).await;
    raw.exec("CREATE TABLE deferred_keys (id BIGINT PRIMARY KEY DEFERRABLE INITIALLY DEFERRED)")
        .await;
    let conns = db.store.pg_pool().expect("a PostgreSQL store");
    let mut hold = conns.acquire().await.expect("a connection");
    let session: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *hold)
        .await
        .expect("its session");

    // Act: the same key twice, refused at COMMIT; then the next statement.
    let mut tx = hold.begin().await.expect("begun");
    sqlx::query("INSERT INTO deferred_keys VALUES (1), (1)")
        .execute(&mut *tx)
        .await
        .expect("checked later");
    let refused = tx.commit().await;
    let mut next = conns.acquire().await.expect("a connection");
    let (next_session, rows): (i32, i64) =
        sqlx::query_as("SELECT pg_backend_pid(), (SELECT count(*) FROM deferred_keys)")
            .fetch_one(&mut *next)
            .await
            .expect("the next statement");

    // Assert: refused, rolled back, and the session kept.
    assert!(
        matches!(&refused, Err(sqlx::Error::Database(error)) if error.is_unique_violation()),
        "{refused:?}"
    );
    assert_eq!(rows, 0);
    assert_eq!(next_session, session, "the connection was closed");
    drop(next);
    raw.close().await;
}
