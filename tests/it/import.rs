//! The Daylio import (docs/behaviour.md, "Import") against a real SQLite file: a generated export of a few
//! hundred rows in Daylio's format (English and Russian mood names, both clocks, empty
//! activities, multi-line notes, quoted commas and quotes) comes in once, not twice,
//! and counts in streaks, search and the daily metrics like any analysed entry.

#![expect(
    clippy::expect_used,
    reason = "test helpers outside #[test] fns: a failure is a test failure"
)]

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

use daylog::commands::{self, Command};
use daylog::config::Settings;
use daylog::import::{self, ImportError, ImportFailure, Report};
use daylog::journal::Journal;
use daylog::language::Language;
use daylog::store::{NewUser, UserId};
use jiff::civil::Date;

const ME: UserId = UserId(7);
const DAYS: i64 = 300;

struct Db {
    _dir: tempfile::TempDir,
    url: String,
    journal: Arc<Journal>,
}

async fn fresh() -> Db {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}/daylog.db", dir.path().display());
    let env: HashMap<String, String> = [("DATABASE_URL".to_owned(), url.clone())].into();
    let settings = Settings::load_from(&env).expect("settings");
    let app = daylog::app::App::build(settings).await.expect("app");
    app.store()
        .upsert_user(&NewUser {
            user_id: ME,
            username: None,
            language: Language::En,
        })
        .await
        .expect("user");
    let journal = Arc::clone(app.journal());
    commands::respond(
        journal.store(),
        journal.users(),
        ME,
        Command::Tz("Europe/Moscow".into()),
    )
    .await
    .expect("tz");
    Db {
        _dir: dir,
        url,
        journal,
    }
}

const MOODS: [(&str, Option<u8>); 8] = [
    ("rad", Some(5)),
    ("Good", Some(4)),
    ("MEH", Some(3)),
    ("bad", Some(2)),
    ("awful", Some(1)),
    ("хорошо", Some(4)),
    ("так себе", Some(3)),
    ("sleepy", None),
];

fn quote(field: &str) -> String {
    format!("\"{}\"", field.replace('"', "\"\""))
}

/// Daylio's newer export, newest first as Daylio writes it: one row per day from
/// 2025-01-01 for `days` days, a second row on every tenth day, and one row with a date
/// that does not parse on line 3. Returns the file and how many rows are readable.
fn export(days: i64) -> (String, usize) {
    let mut csv = String::from("full_date,date,weekday,time,mood,activities,note_title,note\n");
    let _ = writeln!(csv, "2025-13-45,Nope 45,Someday,21:14,rad,,,broken");
    let start = Date::new(2025, 1, 1).expect("date");
    let mut readable = 0;
    for i in (0..days).rev() {
        let day = start.checked_add(jiff::Span::new().days(i)).expect("day");
        let (mood, _) = MOODS[usize::try_from(i).expect("small") % MOODS.len()];
        let time = if i % 2 == 0 { "21:14" } else { "8:02 pm" };
        let activities = match i % 3 {
            0 => String::new(),
            1 => " Friends | READING|work ".to_owned(),
            _ => "sport".to_owned(),
        };
        let note = format!("Day {i}, with \"quotes\", commas\nand a second line");
        let _ = writeln!(
            csv,
            "{day},{},{},{time},{mood},{},{},{}",
            quote(&day.strftime("%B %-d").to_string()),
            day.strftime("%A"),
            quote(&activities),
            quote(if i % 4 == 0 { "" } else { "Title" }),
            quote(&note),
        );
        readable += 1;
        if i % 10 == 0 {
            let _ = writeln!(
                csv,
                "{day},,,7:05 am,awful,,,{}",
                quote(&format!("morning{i}"))
            );
            readable += 1;
        }
    }
    (csv, readable)
}

async fn rows(db: &Db) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM day_logs WHERE user_id = ?1")
        .bind(ME)
        .fetch_one(db.journal.store().read_pool().expect("a SQLite store"))
        .await
        .expect("count")
}

#[tokio::test]
async fn an_export_comes_in_once_and_counts_like_any_entry() {
    let db = fresh().await;
    let (csv, readable) = export(DAYS);
    let readable = u64::try_from(readable).expect("small");

    let first = import::import_bytes(db.journal.store(), db.journal.users(), ME, csv.as_bytes())
        .await
        .expect("imports");
    assert_eq!(
        first,
        Report {
            imported: readable,
            already: 0,
            unreadable: 1,
            first_unreadable_line: Some(2),
            zone: "Europe/Moscow".into(),
            retimed: 0,
            unknown_moods: vec!["sleepy".into()],
        }
    );
    let again = import::import_bytes(db.journal.store(), db.journal.users(), ME, csv.as_bytes())
        .await
        .expect("imports again");
    assert_eq!((again.imported, again.already), (0, readable));
    assert_eq!(rows(&db).await, i64::try_from(readable).expect("small"));

    // Every row is analysed, replied, imported, and numbered apart from Telegram's ids.
    let odd: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM day_logs WHERE status <> 'analyzed' OR replied_at IS NULL
             OR source <> 'import' OR message_id >= 0 OR chat_id <> user_id",
    )
    .fetch_one(db.journal.store().read_pool().expect("a SQLite store"))
    .await
    .expect("odd rows");
    assert_eq!(odd, 0);
    // A terminal entry after the import still gets a fresh id.
    db.journal
        .store()
        .insert_chat_log(ME, "typed", None)
        .await
        .expect("terminal entry after an import");

    // 2025-01-11 (i = 10): 21:14 in Moscow is 18:14 UTC; the note title and note joined.
    let (created, text, metrics): (String, String, String) = sqlx::query_as(
        "SELECT created_at, text, metrics FROM day_logs
         WHERE local_day = '2025-01-11' AND text LIKE 'Title%'",
    )
    .fetch_one(db.journal.store().read_pool().expect("a SQLite store"))
    .await
    .expect("one row");
    assert_eq!(created, "2025-01-11 18:14:00");
    assert_eq!(
        text,
        "Title\nDay 10, with \"quotes\", commas\nand a second line"
    );
    let metrics = daylog::domain::Metrics::from_stored_json(&metrics).expect("json");
    assert_eq!(metrics.mood(), 3, "i = 10 is MOODS[2], MEH");
    assert_eq!(metrics.activities(), ["friends", "reading", "work"]);

    // Streaks, search and the daily metrics see the imported days.
    let streaks = db.journal.users().streaks(ME).await.expect("streaks");
    assert_eq!(i64::from(streaks.longest), DAYS);
    let hits = db
        .journal
        .store()
        .search(ME, "morning20")
        .await
        .expect("search");
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].day, Some(Date::new(2025, 1, 21).expect("date")));
    let daily = db
        .journal
        .store()
        .daily_metrics(ME, Date::new(2025, 1, 1).expect("date"))
        .await
        .expect("daily");
    // The terminal entry above is of today, outside the export's 2025.
    let imported_days = daily.iter().filter(|m| m.day.year() == 2025).count();
    assert_eq!(imported_days, usize::try_from(DAYS).expect("small"));
    let day = |d: &str| {
        let d: Date = d.parse().expect("date");
        daily.iter().find(|m| m.day == d).expect("day listed")
    };
    // i = 7: "sleepy" is no Daylio mood, so the mood is defaulted and skipped.
    assert_eq!(day("2025-01-08").mood, None);
    // i = 0: "rad" at night and "awful" in the morning.
    assert_eq!(day("2025-01-01").mood, Some(3.0));
    assert_eq!(day("2025-01-01").logs, 2);
    let activity_days: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM day_activities WHERE user_id = ?1 AND activity = 'reading'",
    )
    .bind(ME)
    .fetch_one(db.journal.store().read_pool().expect("a SQLite store"))
    .await
    .expect("activities");
    assert_eq!(activity_days, DAYS / 3);
}

#[tokio::test]
async fn the_same_day_and_text_with_another_mood_is_another_row() {
    let db = fresh().await;
    let header = "full_date,date,weekday,time,mood,activities,note_title,note\n";
    let one = format!("{header}2025-02-01,February 1,Saturday,21:14,rad,,,same\n");
    let other = format!("{header}2025-02-01,February 1,Saturday,21:14,bad,,,same\n");
    let first = import::import_bytes(db.journal.store(), db.journal.users(), ME, one.as_bytes())
        .await
        .expect("one");
    let second = import::import_bytes(db.journal.store(), db.journal.users(), ME, other.as_bytes())
        .await
        .expect("two");
    assert_eq!((first.imported, second.imported, second.already), (1, 1, 0));
}

/// The same export after a `/tz` change: every row is the one stored before (same
/// local date, time, mood and text), and its moment is read again in the new zone (a
/// first import before `/tz` is put right by sending the file again).
#[tokio::test]
async fn a_zone_change_between_two_imports_imports_nothing_twice() {
    let db = fresh().await;
    let (csv, readable) = export(40);
    let readable = u64::try_from(readable).expect("small");
    let first = import::import_bytes(db.journal.store(), db.journal.users(), ME, csv.as_bytes())
        .await
        .expect("imports");
    assert_eq!(first.imported, readable);
    for zone in ["America/New_York", "UTC+05:30"] {
        commands::respond(
            db.journal.store(),
            db.journal.users(),
            ME,
            Command::Tz(zone.into()),
        )
        .await
        .expect("tz");
        let again =
            import::import_bytes(db.journal.store(), db.journal.users(), ME, csv.as_bytes())
                .await
                .expect("imports again");
        assert_eq!((again.imported, again.already), (0, readable), "in {zone}");
        assert_eq!(again.retimed, readable, "in {zone}");
        assert_eq!(again.zone, zone);
    }
    assert_eq!(rows(&db).await, i64::try_from(readable).expect("small"));
    // Read in UTC+05:30 now: 2025-01-01 21:14 there is 15:44 UTC.
    let pool = sqlx::SqlitePool::connect(&db.url).await.expect("pool");
    let moments: Vec<String> = sqlx::query_scalar(
        "SELECT created_at FROM day_logs WHERE local_day = '2025-01-01' AND import_time = '21:14'",
    )
    .fetch_all(&pool)
    .await
    .expect("read");
    assert!(!moments.is_empty());
    assert!(
        moments.iter().all(|m| m == "2025-01-01 15:44:00"),
        "{moments:?}"
    );
    // /history shows them at the export's own 21:14, on the clock of the zone they were
    // read in again.
    let history = commands::respond(
        db.journal.store(),
        db.journal.users(),
        ME,
        Command::History("50".into()),
    )
    .await
    .expect("history");
    let shown = format!("{history:?}");
    assert!(shown.contains("21:14"), "{shown}");
    assert!(!shown.contains("America/New_York"), "{shown}");
    // The same zone again moves nothing.
    let same = import::import_bytes(db.journal.store(), db.journal.users(), ME, csv.as_bytes())
        .await
        .expect("imports again");
    assert_eq!(same.retimed, 0);
    // A row of another time on a known day is still new.
    let header = "full_date,date,weekday,time,mood,activities,note_title,note\n";
    let later = format!("{header}2025-01-01,January 1,Wednesday,23:59,awful,,,morning0\n");
    let one = import::import_bytes(db.journal.store(), db.journal.users(), ME, later.as_bytes())
        .await
        .expect("one more");
    assert_eq!((one.imported, one.already), (1, 0));
}

/// A row imported before `import_time` existed (NULL) is recognised by its UTC time in
/// the zone it was imported in, and remembered by its wall-clock time from then on.
#[tokio::test]
async fn rows_imported_before_the_import_key_are_recognised_and_keyed() {
    let db = fresh().await;
    let (csv, readable) = export(12);
    let readable = u64::try_from(readable).expect("small");
    import::import_bytes(db.journal.store(), db.journal.users(), ME, csv.as_bytes())
        .await
        .expect("imports");
    // What the rows of an older daylog look like: no wall-clock time.
    let raw = sqlx::SqlitePool::connect(&db.url).await.expect("raw pool");
    sqlx::query("UPDATE day_logs SET import_time = NULL")
        .execute(&raw)
        .await
        .expect("forget the key");
    raw.close().await;
    let same_zone =
        import::import_bytes(db.journal.store(), db.journal.users(), ME, csv.as_bytes())
            .await
            .expect("again in the same zone");
    assert_eq!((same_zone.imported, same_zone.already), (0, readable));
    commands::respond(
        db.journal.store(),
        db.journal.users(),
        ME,
        Command::Tz("Asia/Tokyo".into()),
    )
    .await
    .expect("tz");
    let other_zone =
        import::import_bytes(db.journal.store(), db.journal.users(), ME, csv.as_bytes())
            .await
            .expect("again in another zone");
    assert_eq!((other_zone.imported, other_zone.already), (0, readable));
}

#[tokio::test]
async fn bad_files_import_nothing() {
    let db = fresh().await;
    let not_daylio = "date,mood\n2025-01-01,rad\n";
    let bad_dates = "full_date,date,weekday,time,mood,activities,note_title,note\n\
                     yesterday,,,21:14,rad,,,x\nsoon,,,noon,rad,,,y\n";
    let too_big = vec![b'x'; import::MAX_FILE_BYTES + 1];
    for (bytes, why) in [
        (not_daylio.as_bytes(), ImportError::WrongHeader),
        (b"\xff\xfe\x00garbage".as_slice(), ImportError::NotUtf8),
        (bad_dates.as_bytes(), ImportError::NoReadableRow),
        (too_big.as_slice(), ImportError::TooLarge),
    ] {
        match import::import_bytes(db.journal.store(), db.journal.users(), ME, bytes).await {
            Err(ImportFailure::File(got)) => assert_eq!(got, why),
            other => panic!("expected {why:?}, got {other:?}"),
        }
    }
    assert_eq!(rows(&db).await, 0);
}

/// Not a threshold: prints how long 10 000 rows take, for the report.
#[tokio::test]
async fn ten_thousand_rows_timed() {
    let db = fresh().await;
    let (csv, readable) = export(9_091);
    let started = Instant::now();
    let report = import::import_bytes(db.journal.store(), db.journal.users(), ME, csv.as_bytes())
        .await
        .expect("imports");
    let first = started.elapsed();
    let started = Instant::now();
    let again = import::import_bytes(db.journal.store(), db.journal.users(), ME, csv.as_bytes())
        .await
        .expect("imports again");
    println!(
        "import of {readable} rows: {first:?}; again (all already there): {:?}",
        started.elapsed()
    );
    assert_eq!(report.imported, u64::try_from(readable).expect("small"));
    assert_eq!(again.imported, 0);
}

/// Activities come from the whole `|` list. A Daylio day with 14 ticked
/// activities keeps all 14 (an answer's limit of 10 guards against a model, not a
/// user's own records), in `day_activities` and read back from the entry.
#[tokio::test]
async fn every_activity_of_a_row_is_imported_past_the_tenth() {
    let db = fresh().await;
    let names: Vec<String> = (1..=14).map(|i| format!("Activity {i}")).collect();
    let csv = format!(
        "full_date,date,weekday,time,mood,activities,note_title,note\n\
         2025-03-01,March 1,Saturday,21:14,good,{},,a full day\n",
        quote(&names.join(" | "))
    );

    let report = import::import_bytes(db.journal.store(), db.journal.users(), ME, csv.as_bytes())
        .await
        .expect("imports");

    assert_eq!(report.imported, 1);
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM day_activities WHERE user_id = ?1")
        .bind(ME)
        .fetch_one(db.journal.store().read_pool().expect("a SQLite store"))
        .await
        .expect("count");
    assert_eq!(stored, 14);
    let logs = db.journal.store().history(ME, 1).await.expect("logs");
    let metrics = logs[0].metrics.as_ref().expect("metrics");
    assert_eq!(metrics.activities().len(), 14);
    assert_eq!(metrics.activities()[13], "activity 14");
}

/// A large file is stored a chunk at a time (so other users' writes go between), and a
/// write that fails part-way is said as it is: what came in, and that sending the file
/// again brings the rest without doubling the rest.
#[tokio::test]
async fn an_import_that_fails_part_way_says_what_came_in_and_a_resend_completes_it() {
    let db = fresh().await;
    let mut csv = String::from("full_date,date,weekday,time,mood,activities,note_title,note\n");
    let start = Date::new(2024, 1, 1).expect("date");
    for i in 0..1200 {
        let day = start.checked_add(jiff::Span::new().days(i)).expect("day");
        let _ = writeln!(csv, "{day},,,21:00,good,,,row {i}");
    }
    let writer = sqlx::SqlitePool::connect(&db.url).await.expect("writer");
    sqlx::query(
        "CREATE TRIGGER fail_row_700 BEFORE INSERT ON day_logs WHEN NEW.text = 'row 700'
         BEGIN SELECT RAISE(ABORT, 'the disk is full'); END",
    )
    .execute(&writer)
    .await
    .expect("trigger");

    let failed =
        import::import_bytes(db.journal.store(), db.journal.users(), ME, csv.as_bytes()).await;

    let Err(failure @ ImportFailure::Store { imported, .. }) = failed else {
        panic!("not a store failure: {failed:?}");
    };
    assert!(imported > 0 && imported < 1200, "{imported}");
    assert_eq!(rows(&db).await, i64::try_from(imported).expect("small"));
    let said = failure.sentence(Language::En);
    assert!(
        said.contains(&format!("{imported} entries came in")),
        "{said}"
    );

    sqlx::query("DROP TRIGGER fail_row_700")
        .execute(&writer)
        .await
        .expect("drop");
    let again = import::import_bytes(db.journal.store(), db.journal.users(), ME, csv.as_bytes())
        .await
        .expect("imports");
    assert_eq!(again.already, imported);
    assert_eq!(again.imported, 1200 - imported);
    assert_eq!(rows(&db).await, 1200);
}

fn daylio_fixture(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/daylio")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// (mood name, mood) of the imported entries, oldest first.
async fn imported_moods(db: &Db) -> Vec<(Option<String>, Option<i64>)> {
    sqlx::query_as(
        "SELECT import_mood, CAST(mood AS INTEGER) FROM day_logs WHERE user_id = ?1 AND source = 'import'
         ORDER BY local_day, import_time, import_mood",
    )
    .bind(ME)
    .fetch_all(db.journal.store().read_pool().expect("a SQLite store"))
    .await
    .expect("rows")
}

/// Custom moods in a CSV: each is an entry of its own, even two at one minute with no
/// note; they come in without a mood, and the answer names them and points to the
/// backup file, whose levels the same entries then get — without being doubled.
#[tokio::test]
async fn custom_moods_in_a_csv_stay_apart_and_the_backup_gives_them_their_levels() {
    let db = fresh().await;

    let csv = import::import_bytes(
        db.journal.store(),
        db.journal.users(),
        ME,
        &daylio_fixture("custom_moods.csv"),
    )
    .await
    .expect("imports");
    assert_eq!((csv.imported, csv.already), (4, 0), "{csv:?}");
    assert_eq!(csv.unknown_moods, ["irritable", "tired", "ok"]);
    let said = csv.sentence(Language::En);
    assert!(
        said.contains("\"irritable\", \"tired\", \"ok\"") && said.contains(".daylio"),
        "{said}"
    );
    let none = |name: &str| (Some(name.to_owned()), None);
    let level = |name: &str, mood: i64| (Some(name.to_owned()), Some(mood));
    assert_eq!(
        imported_moods(&db).await,
        [
            level("good", 4),
            none("ok"),
            none("irritable"),
            none("tired")
        ]
    );

    let backup = import::import_bytes(
        db.journal.store(),
        db.journal.users(),
        ME,
        &daylio_fixture("custom_moods.daylio"),
    )
    .await
    .expect("imports the backup");
    assert_eq!((backup.imported, backup.already), (0, 4), "{backup:?}");
    assert!(backup.unknown_moods.is_empty());
    assert_eq!(
        imported_moods(&db).await,
        [
            level("good", 4),
            level("ok", 3),
            level("irritable", 2),
            level("tired", 3)
        ]
    );
    // Sent again, nothing changes.
    let again = import::import_bytes(
        db.journal.store(),
        db.journal.users(),
        ME,
        &daylio_fixture("custom_moods.daylio"),
    )
    .await
    .expect("again");
    assert_eq!((again.imported, again.already), (0, 4));
    assert_eq!(rows(&db).await, 4);
}

/// A backup on its own: every mood with its level, activities and notes.
#[tokio::test]
async fn a_backup_alone_brings_every_mood_and_activity() {
    let db = fresh().await;

    let report = import::import_bytes(
        db.journal.store(),
        db.journal.users(),
        ME,
        &daylio_fixture("custom_moods.daylio"),
    )
    .await
    .expect("imports");

    assert_eq!((report.imported, report.unreadable), (4, 0), "{report:?}");
    let level = |name: &str, mood: i64| (Some(name.to_owned()), Some(mood));
    assert_eq!(
        imported_moods(&db).await,
        [
            level("good", 4),
            level("ok", 3),
            level("irritable", 2),
            level("tired", 3)
        ]
    );
    let (text, activities): (String, String) = sqlx::query_as(
        "SELECT text, json_extract(metrics, '$.activities') FROM day_logs
         WHERE user_id = ?1 AND local_day = '2021-03-26'",
    )
    .bind(ME)
    .fetch_one(db.journal.store().read_pool().expect("a SQLite store"))
    .await
    .expect("row");
    assert_eq!(text, "Lunch\nSoup, then a walk");
    assert_eq!(activities, "[\"reading\"]");
}

/// A zip that is no backup, and one that would unpack without end, are each a sentence.
#[tokio::test]
async fn a_zip_that_is_no_backup_is_refused_with_a_sentence() {
    let db = fresh().await;
    let not_a_backup = b"PK\x03\x04 not really a zip".to_vec();

    let refused =
        import::import_bytes(db.journal.store(), db.journal.users(), ME, &not_a_backup).await;

    let Err(ImportFailure::File(why)) = refused else {
        panic!("{refused:?}")
    };
    assert_eq!(why, ImportError::NotBackup);
    assert!(why.sentence(Language::En).contains("not a Daylio backup"));
    assert_eq!(rows(&db).await, 0);
}
