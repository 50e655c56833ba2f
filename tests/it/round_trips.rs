//! What a text entry costs the store, counted in the real binary: every SQL statement is
//! a message to the SQLite connection's thread and back (plus the pool's ping when the
//! connection is released), the largest share of the bot's CPU per entry (BENCHMARKS.md,
//! "Where the CPU per entry goes"). sqlx logs each statement at `debug` under the target
//! `sqlx::query`; the bot logs JSON lines here, so they are counted exactly.

#![expect(
    clippy::expect_used,
    reason = "helpers outside #[test] fns fail loudly by design"
)]

use crate::support;

use std::time::Duration;

use support::telegram::text_update;
use support::{FakeTelegram, Providers, test_env};

/// The statements sqlx logged so far, by their summary (the statement's first words),
/// leaving out the call recorder's batched `INSERT INTO llm_calls`: it is written in the
/// background, several entries' calls at once under load, not on the entry's path; and
/// the inbox's gauges (`SELECT coalesce(sum(…`), counted every 5 s whatever comes.
/// A text of several statements sent in one call (an entry's transaction) is one call
/// to the connection's thread, and one line here.
fn statements(log: &std::path::Path) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|event| event["target"] == "sqlx::query")
        .map(|event| {
            event["fields"]["summary"]
                .as_str()
                .unwrap_or("?")
                .to_owned()
        })
        .filter(|summary| {
            !summary.starts_with("INSERT INTO llm_calls")
                && !summary.starts_with("SELECT coalesce(sum(")
        })
        .collect()
}

/// Waits until the log has been stored as replied and its two calls recorded, so every
/// statement the entry causes is in the log.
async fn wait_done(pool: &sqlx::SqlitePool, message_id: i64) {
    support::wait_until(
        "the entry to be answered, recorded and its calls written",
        Duration::from_secs(20),
        || async {
            let (replied, calls): (i64, i64) = sqlx::query_as(
                "SELECT (SELECT count(*) FROM day_logs
                         WHERE chat_id = 41 AND message_id = ?1 AND replied_at IS NOT NULL),
                        (SELECT count(*) FROM llm_calls c JOIN day_logs l ON l.id = c.day_log_id
                         WHERE l.chat_id = 41 AND l.message_id = ?1)",
            )
            .bind(message_id)
            .fetch_one(pool)
            .await
            .expect("poll");
            replied == 1 && calls >= 2
        },
    )
    .await;
}

#[tokio::test]
async fn a_text_entry_costs_the_store_at_most_six_calls() {
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    providers.healthy().await;
    let mut env = test_env(&db, &telegram, &providers);
    env.insert("RUST_LOG".to_owned(), "info,sqlx::query=debug".to_owned());
    env.insert("DAYLOG__LOG__FORMAT".to_owned(), "json".to_owned());
    // The worker and the reminder scheduler poll once at start, then not during the test.
    env.insert(
        "DAYLOG__WORKER__POLL_INTERVAL_MS".to_owned(),
        "3600000".to_owned(),
    );
    env.insert(
        "DAYLOG__REMINDERS__POLL_INTERVAL_MS".to_owned(),
        "3600000".to_owned(),
    );
    let log = support::bot_log_path(&env);
    let mut bot = support::spawn_daylog(&env, &log);
    telegram
        .wait_for("the bot to start", Duration::from_secs(30), |calls| {
            calls.iter().any(|c| c.method == "SetMyCommands")
        })
        .await;
    let pool = sqlx::SqlitePool::connect(&db).await.expect("db");

    // A first entry pays what is paid once per process (the spent daily budgets are
    // read before the first analysis) and per new user.
    telegram.push_update(text_update(41, 1, "A first day: a walk, some work."));
    telegram.wait_sent(41, 1).await;
    wait_done(&pool, 1).await;
    let before = statements(&log).len();

    telegram.push_update(text_update(41, 2, "A long run, a busy day, proud of it."));
    telegram.wait_sent(41, 2).await;
    wait_done(&pool, 2).await;
    let entry = statements(&log).split_off(before);
    pool.close().await;
    let _ = bot.kill();
    let _ = bot.wait();

    // The update inbox: the update's row (the intake hands the update itself to the
    // handling loop, which reads the table only after a start or a failure). Then
    // upsert_user, and insert_log with its update marked handled in one transaction
    // sent as one text (BEGIN IMMEDIATE, the insert, the mark, COMMIT); then one
    // statement for what the analysis and its answer read (the hourly count,
    // daily_metrics, the recent summaries, the streak's days: four before), then
    // mark_analyzed, then mark_replied. The user row the upsert returns gives the zone
    // and language for the rest; a log just inserted has no voice note and no refusals
    // to ask for; the reply is laid out from the decision just stored, not read back.
    // Before the inbox: 8; the inbox as first merged: 14; before the one read: 9.
    assert!(
        entry.len() <= 6,
        "{} statements for one text entry:\n{}",
        entry.len(),
        entry.join("\n")
    );
}
