//! `/stats` and `/history` on one user with 100 000 logs (goal: ≤ 50 ms each), and
//! `/search` on the same logs (goal: ≤ 20 ms).
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

const LOGS: i64 = 100_000;
const USER: i64 = 77;

#[path = "../tests/support/fill.rs"]
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
    // Every fill text is "Day log number <i>: worked, ran, slept.": "number 4242" is
    // two words of which one is in a single entry (the usual search), "worked" is in
    // all 100 000 (the worst case: every entry is ranked to find the best five).
    for (name, words) in [("rare", "number 4242"), ("every_entry", "worked")] {
        group.bench_function(format!("store_search_{name}"), |b| {
            b.iter(|| runtime.block_on(store.search(black_box(USER), words)))
        });
        group.bench_function(format!("command_search_{name}"), |b| {
            b.iter(|| {
                runtime.block_on(commands::respond(
                    &journal,
                    black_box(USER),
                    Command::Search(words.into()),
                ))
            })
        });
    }
    group.finish();
    runtime.block_on(store.close());
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = queries
}
criterion_main!(benches);
