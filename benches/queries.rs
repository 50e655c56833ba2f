//! `/stats` and `/history` on one user with 100 000 logs (goal: ≤ 50 ms each), `/search`
//! on the same logs (goal: ≤ 20 ms), and one tick of the reminder scheduler with 100 000
//! users who have reminders (goal: ≤ 10 ms), and the worker's poll for unfinished logs
//! among the 100 000, with and without the partial index of migration 16.
//!
//! `cargo bench --bench queries`. Each query is timed twice: the store call alone, and
//! the whole command as a user gets it (`/stats` includes drawing the PNG chart).

// A benchmark's fixture failing is a setup bug: panicking with a message is the point.
#![expect(clippy::expect_used)]

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use daylog::commands::{self, Command};
use daylog::config::Settings;
use daylog::frontend::{Messenger, Response, SendError, Target};
use daylog::store::{FrontEnd, UserId};

const LOGS: i64 = 100_000;
const USER: i64 = 77;

#[path = "../tests/it/support/fill.rs"]
mod fill;
use fill::fill_logs;

fn queries(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let env: HashMap<String, String> = [("DATABASE_URL".to_owned(), db.clone())].into();
    let settings = Settings::load_from(&env).expect("settings");
    let (store, journal) = runtime.block_on(async {
        let app = daylog::app::App::build(settings).await.expect("app");
        fill_logs(&db, LOGS).await;
        (app.store().clone(), Arc::clone(app.journal()))
    });

    let mut group = c.benchmark_group("100k_logs");
    for days in [30u32, 365] {
        // The fill's users keep the default zone and day start.
        let first = daylog::time::UserZone::utc()
            .local_day(jiff::Timestamp::now(), 4)
            .checked_sub(jiff::Span::new().days(i64::from(days) - 1))
            .expect("first day");
        group.bench_function(format!("store_daily_metrics_{days}"), |b| {
            b.iter(|| runtime.block_on(store.daily_metrics(black_box(UserId(USER)), first)))
        });
        group.bench_function(format!("command_stats_{days}"), |b| {
            b.iter(|| {
                runtime.block_on(commands::respond(
                    journal.store(),
                    journal.users(),
                    black_box(UserId(USER)),
                    Command::Stats(days.to_string()),
                ))
            })
        });
    }
    group.bench_function("store_history_10", |b| {
        b.iter(|| runtime.block_on(store.history(black_box(UserId(USER)), 10)))
    });
    group.bench_function("command_history_10", |b| {
        b.iter(|| {
            runtime.block_on(commands::respond(
                journal.store(),
                journal.users(),
                black_box(UserId(USER)),
                Command::History("10".into()),
            ))
        })
    });
    group.bench_function("store_streaks", |b| {
        b.iter(|| runtime.block_on(journal.users().streaks(black_box(UserId(USER)))))
    });
    // Every fill text is "Day log number <i>: worked, ran, slept.": "number 4242" is
    // two words of which one is in a single entry (the usual search), "worked" is in
    // all 100 000 (the worst case: every entry is ranked to find the best five).
    for (name, words) in [("rare", "number 4242"), ("every_entry", "worked")] {
        group.bench_function(format!("store_search_{name}"), |b| {
            b.iter(|| runtime.block_on(store.search(black_box(UserId(USER)), words)))
        });
        // The same search with every stem as an FTS5 prefix, as before the stems were
        // listed as the index's words (migration 23): the before of the same run.
        let prefixes = daylog::store::fts_query(words).expect("words");
        group.bench_function(format!("store_search_{name}_as_prefixes"), |b| {
            b.iter(|| {
                runtime.block_on(
                    sqlx::query(daylog::store::SEARCH_SQL)
                        .bind(black_box(USER))
                        .bind(&prefixes)
                        .bind("\u{E000}")
                        .bind("\u{E001}")
                        .bind(daylog::store::SEARCH_LIMIT)
                        .bind(daylog::store::SEARCH_CANDIDATES)
                        .bind("\u{E002}")
                        .fetch_all(store.read_pool().expect("a SQLite store")),
                )
            })
        });
        group.bench_function(format!("command_search_{name}"), |b| {
            b.iter(|| {
                runtime.block_on(commands::respond(
                    journal.store(),
                    journal.users(),
                    black_box(UserId(USER)),
                    Command::Search(words.into()),
                ))
            })
        });
    }
    // The worker's poll (every `worker.poll_interval_ms`, and at each wake-up): the logs
    // still pending or still owed a reply, here none among the 100 000. Then the same
    // poll without migration 16's partial index, the plan every poll had before it.
    group.bench_function("store_worker_poll", |b| {
        b.iter(|| runtime.block_on(store.unfinished(FrontEnd::Telegram, black_box(50))))
    });
    runtime.block_on(async {
        let writer = sqlx::SqlitePool::connect(&db).await.expect("writer");
        sqlx::query("DROP INDEX day_logs_unreplied")
            .execute(&writer)
            .await
            .expect("drop the index");
        writer.close().await;
    });
    group.bench_function("store_worker_poll_without_index_16", |b| {
        b.iter(|| runtime.block_on(store.unfinished(FrontEnd::Telegram, black_box(50))))
    });
    group.finish();

    // 100 000 users with a reminder each, due times spread evenly over the next 24
    // hours: a tick finds the few due since the last one, through the index.
    runtime.block_on(fill_reminders(&db, 100_000));
    let journal = Arc::new(journal);
    let messenger = Arc::new(Discard);
    let mut group = c.benchmark_group("100k_reminders");
    group.bench_function("store_due_reminders", |b| {
        b.iter(|| runtime.block_on(store.due_reminders(jiff::Timestamp::now(), 1000)))
    });
    // The first iteration sends what is due; later ones are the steady state of a
    // tick every poll interval (a handful or none due).
    group.bench_function("scheduler_tick", |b| {
        b.iter(|| {
            runtime.block_on(daylog::reminders::tick(
                journal.store(),
                journal.users(),
                journal.settings(),
                &messenger,
            ))
        })
    });
    group.finish();
    runtime.block_on(store.close());
}

/// A messenger that delivers nowhere (the tick's own cost is measured).
struct Discard;

impl Messenger for Discard {
    async fn send(&self, _target: Target, _responses: Vec<Response>) -> Result<(), SendError> {
        Ok(())
    }
    async fn typing(&self, _chat_id: daylog::domain::ChatId) {}
}

/// `n` users (ids from 1 000 000) with a reminder, next due every 24 h / n from now.
async fn fill_reminders(db_url: &str, n: i64) {
    let pool = sqlx::SqlitePool::connect(db_url).await.expect("writer");
    let mut tx = pool.begin().await.expect("tx");
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
         INSERT INTO users (user_id, chat_id, timezone) SELECT 1000000 + i, 1000000 + i,
             CASE i % 3 WHEN 0 THEN 'UTC' WHEN 1 THEN 'Europe/Moscow' ELSE 'America/Los_Angeles' END
         FROM n",
    )
    .bind(n)
    .execute(&mut *tx)
    .await
    .expect("users");
    sqlx::query(
        "INSERT INTO reminders (user_id, local_time, enabled, next_due_at)
         SELECT user_id, '21:00', 1,
                datetime('now', '+' || ((user_id - 1000000) * 86400.0 / ?1) || ' seconds')
         FROM users WHERE user_id > 1000000",
    )
    .bind(n)
    .execute(&mut *tx)
    .await
    .expect("reminders");
    tx.commit().await.expect("commit");
    pool.close().await;
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = queries
}
criterion_main!(benches);
