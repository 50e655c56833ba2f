//! How long a Daylio import of 10 000 rows takes (issue 12's goal: ≤ 2 s), measured on a
//! fresh SQLite file with the real parser and the real store, in a release build:
//!
//! ```sh
//! cargo run --release --example import10k
//! ```
//!
//! Prints the time to parse the file, to store every row (one transaction), and to
//! import the same file again (every row already there). One run, no loop: run it a
//! few times by hand and take the median.

#![expect(clippy::print_stdout, reason = "a benchmark reports on stdout")]
#![expect(
    clippy::expect_used,
    reason = "a benchmark's fixture failing is a setup bug: panicking with a message is the point"
)]

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use daylog::import;
use daylog::language::Language;
use daylog::store::UserId;
use daylog::store::{NewUser, Store};
use daylog::time::UserZone;

const ROWS: usize = 10_000;
const USER: i64 = 7;

/// A Daylio export of `rows` entries, newest first, about three a day, with notes,
/// activities, both clocks and a few moods of both languages.
fn export(rows: usize) -> String {
    let moods = ["rad", "Good", "meh", "bad", "awful", "хорошо", "так себе"];
    let mut csv = String::from("full_date,date,weekday,time,mood,activities,note_title,note\n");
    let start = jiff::civil::Date::new(2016, 1, 1).expect("date");
    for i in (0..rows).rev() {
        let day = start
            .checked_add(jiff::Span::new().days(i64::try_from(i / 3).expect("small")))
            .expect("day");
        let time = match i % 3 {
            0 => "8:02 am".to_owned(),
            1 => "14:30".to_owned(),
            _ => format!("{}:{:02} pm", 9, i % 60),
        };
        let _ = writeln!(
            csv,
            "{day},\"{}\",{},{time},{},\"work | Friends | reading\",\"Title {i}\",\"Day {i}: a walk, \"\"quotes\"\" and\na second line about the day\"",
            day.strftime("%B %-d"),
            day.strftime("%A"),
            moods[i % moods.len()],
        );
    }
    csv
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let dir = tempfile::tempdir().expect("dir");
        let url = format!("sqlite://{}/daylog.db", dir.path().display());
        let store = Store::open_and_migrate(&url, Duration::from_secs(5))
            .await
            .expect("store");
        store
            .upsert_user(&NewUser {
                user_id: UserId(USER),
                username: None,
                language: Language::En,
            })
            .await
            .expect("user");
        let zone = UserZone::parse("Europe/Moscow").expect("zone");
        let csv = export(ROWS);

        let started = Instant::now();
        let parsed = import::parse(csv.as_bytes()).expect("parses");
        let logs = import::to_store(&parsed.rows, &zone);
        let parse = started.elapsed();
        let started = Instant::now();
        let first = store
            .import_logs(UserId(USER), &logs)
            .await
            .expect("stores");
        let stored = started.elapsed();
        let started = Instant::now();
        let parsed = import::parse(csv.as_bytes()).expect("parses");
        let logs = import::to_store(&parsed.rows, &zone);
        let again = store.import_logs(UserId(USER), &logs).await.expect("again");
        let second = started.elapsed();
        assert_eq!((first.imported, again.already), (ROWS as u64, ROWS as u64));
        println!(
            "{ROWS} rows ({} KB): parse {parse:.2?}, store {stored:.2?}, total {:.2?}; \
             the same file again (all already there): {second:.2?}",
            csv.len() / 1024,
            parse + stored,
        );
        store.close().await;
    });
}
