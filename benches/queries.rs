//! `/stats` and `/history` on one user with 100 000 logs (goal: ≤ 50 ms each).
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
use daylog::journal::Journal;
use daylog::llm::Llm;
use daylog::store::Store;
use sqlx::SqlitePool;

const LOGS: i64 = 100_000;
const USER: i64 = 77;

/// The same fixture as `tests/faults.rs`: one log every 7 minutes back from now.
async fn fill_logs(db_url: &str, n: i64) {
    let pool = SqlitePool::connect(db_url).await.expect("writer");
    let mut tx = pool.begin().await.expect("tx");
    sqlx::query("INSERT INTO users (user_id, chat_id) VALUES (77, 77), (78, 78)")
        .execute(&mut *tx)
        .await
        .expect("users");
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
         INSERT INTO day_logs (user_id, chat_id, message_id, text, created_at, status,
                               analysis, metrics, attempts, replied_at)
         SELECT CASE WHEN i % 250 = 0 THEN 78 ELSE 77 END,
                CASE WHEN i % 250 = 0 THEN 78 ELSE 77 END,
                i,
                'Day log number ' || i || ': worked, ran, slept.',
                datetime('now', '-' || (i * 7) || ' minutes'),
                'analyzed',
                'An analysis of log ' || i || '.',
                json_object('mood', 1 + i % 5, 'stress', 1 + (i * 3) % 5,
                            'energy', 1 + (i * 7) % 5, 'productivity', 1 + (i * 11) % 5,
                            'sleep_hours', 4.0 + (i % 50) / 10.0,
                            'activities', json_array('run', 'work'),
                            'emotions', json_array('calm'),
                            'summary', 'Summary of day ' || i,
                            'defaulted', CASE WHEN i % 10 = 0 THEN json_array('sleep_hours')
                                              ELSE json_array() END),
                1,
                datetime('now')
         FROM n",
    )
    .bind(n)
    .execute(&mut *tx)
    .await
    .expect("fill");
    tx.commit().await.expect("commit");
    pool.close().await;
}

fn queries(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let env: HashMap<String, String> = [("DATABASE_URL".to_owned(), db.clone())].into();
    let settings = Arc::new(Settings::load_from(&env).expect("settings"));
    let (store, journal) = runtime.block_on(async {
        let store = Store::open_and_migrate(&db, settings.store.busy_timeout())
            .await
            .expect("store");
        fill_logs(&db, LOGS).await;
        let client = daylog::http_client().expect("client");
        let llm = Arc::new(Llm::with_client(&settings, client).expect("llm"));
        let journal = Journal::new(Arc::clone(&settings), store.clone(), llm);
        (store, journal)
    });

    let mut group = c.benchmark_group("100k_logs");
    for days in [30u32, 365] {
        group.bench_function(format!("store_daily_metrics_{days}"), |b| {
            b.iter(|| runtime.block_on(store.daily_metrics(black_box(USER), days)))
        });
        group.bench_function(format!("command_stats_{days}"), |b| {
            b.iter(|| {
                runtime.block_on(commands::respond(
                    &journal,
                    black_box(USER),
                    Command::Stats(days.to_string()),
                ))
            })
        });
    }
    group.bench_function("store_history_10", |b| {
        b.iter(|| runtime.block_on(store.history(black_box(USER), 10)))
    });
    group.bench_function("command_history_10", |b| {
        b.iter(|| {
            runtime.block_on(commands::respond(
                &journal,
                black_box(USER),
                Command::History("10".into()),
            ))
        })
    });
    group.finish();
    runtime.block_on(store.close());
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = queries
}
criterion_main!(benches);
