//! `/import` through the real dispatcher and a fake Telegram (docs/behaviour.md, "Import"): a document
//! captioned `/import`, or sent right after `/import`, is fetched with `getFile` and the
//! download, and imported; any other document is not for the journal.

#![expect(
    clippy::unwrap_used,
    reason = "helpers outside #[test] fns fail loudly by design"
)]

use crate::support;

use daylog::language::Language;
use daylog::texts::Texts;
use serde_json::{Value, json};
use support::App;
use support::telegram::text_update;

const USER: i64 = 41;
const EXPORT: &str = "full_date,date,weekday,time,mood,activities,note_title,note\n\
    2025-03-02,March 2,Sunday,8:02 pm,rad,friends | cinema,,\"A film, finally\"\n\
    2025-03-01,March 1,Saturday,21:14,плохо,,Rain,\"wet\nand \"\"grey\"\"\"\n\
    oops,,,21:14,rad,,,x\n";

fn document_update(message_id: i64, file_id: &str, caption: Option<&str>) -> Value {
    let mut message = json!({
        "message_id": message_id,
        "date": 1_764_460_800,
        "chat": {"id": USER, "type": "private", "first_name": "Test"},
        "from": {"id": USER, "is_bot": false, "first_name": "Test", "language_code": "en"},
        "document": {"file_id": file_id, "file_unique_id": format!("u-{file_id}"),
                     "file_name": "daylio_export.csv", "mime_type": "text/csv",
                     "file_size": EXPORT.len()},
    });
    if let Some(caption) = caption {
        message["caption"] = json!(caption);
    }
    json!({ "message": message })
}

async fn imported(app: &App) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM day_logs WHERE user_id = ?1 AND source = 'import'")
        .bind(USER)
        .fetch_one(app.store.read_pool().unwrap())
        .await
        .unwrap()
}

#[tokio::test]
async fn a_daylio_document_is_downloaded_and_imported_once() {
    let app = App::spawn().await;
    app.telegram
        .add_file("csv-1", "documents/file_1.csv", EXPORT.as_bytes());
    let texts = Texts(Language::En);

    // Without the caption and without /import before it, a document is not an entry.
    app.telegram.push_update(document_update(1, "csv-1", None));
    let sent = app.telegram.wait_sent(USER, 1).await;
    assert_eq!(sent[0].text(), texts.only_text());
    assert_eq!(imported(&app).await, 0);

    app.telegram
        .push_update(document_update(2, "csv-1", Some("/import")));
    let sent = app.telegram.wait_sent(USER, 2).await;
    let in_utc = texts.import_zone("UTC", 0);
    assert_eq!(
        sent[1].text(),
        format!("{} {in_utc}", texts.import_done(2, 0, 1, Some(5)))
    );
    assert_eq!(imported(&app).await, 2);
    assert_eq!(app.telegram.downloads(), vec!["documents/file_1.csv"]);

    // `/import`, then the file without a caption: nothing new.
    app.telegram.push_update(text_update(USER, 3, "/import"));
    let sent = app.telegram.wait_sent(USER, 3).await;
    assert_eq!(sent[2].text(), texts.import_usage());
    app.telegram.push_update(document_update(4, "csv-1", None));
    let sent = app.telegram.wait_sent(USER, 4).await;
    assert_eq!(
        sent[3].text(),
        format!("{} {in_utc}", texts.import_done(0, 2, 1, Some(5)))
    );
    assert_eq!(imported(&app).await, 2);
    // No AI call was made for imported entries.
    let llm_calls: i64 = sqlx::query_scalar("SELECT count(*) FROM llm_calls")
        .fetch_one(app.store.read_pool().expect("a SQLite store"))
        .await
        .unwrap();
    assert_eq!(llm_calls, 0);
}

/// An import's update is handled only once its rows are committed (or it stored
/// nothing): while the file is still coming, a crash must leave it in the inbox for the
/// next start, as importing the same file again is safe. Other chats' updates are
/// taken meanwhile.
#[tokio::test]
async fn an_import_is_not_handled_before_its_rows_are_stored() {
    const OTHER: i64 = 42;
    let app = App::spawn().await;
    app.telegram
        .add_file("csv-1", "documents/file_1.csv", EXPORT.as_bytes());
    app.telegram.hang("GetFile");
    let import = app
        .telegram
        .push_update(document_update(1, "csv-1", Some("/import")));
    support::wait_until(
        "the import's getFile to hang",
        std::time::Duration::from_secs(20),
        || async { app.telegram.hung().iter().any(|m| m == "GetFile") },
    )
    .await;
    app.telegram.push_update(text_update(OTHER, 1, "/help"));
    app.telegram.wait_sent(OTHER, 1).await;
    assert_eq!(imported(&app).await, 0);
    // Telegram may forget it: it is in the inbox, and not handled before its rows are.
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM updates WHERE update_id = ?1 AND handled_at IS NULL AND dead = 0",
    )
    .bind(import)
    .fetch_one(app.store.read_pool().expect("a SQLite store"))
    .await
    .expect("inbox");
    assert_eq!(
        waiting, 1,
        "the import waits in the inbox until its rows commit"
    );
}

/// Daylio's backup file (`.daylio`, a zip) sent as a document with the caption
/// `/import`: every mood comes in with its level, custom ones too.
#[tokio::test]
async fn a_daylio_backup_document_is_imported_with_every_mood() {
    let app = App::spawn().await;
    let backup = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/daylio/custom_moods.daylio"),
    )
    .unwrap();
    app.telegram
        .add_file("backup-1", "documents/file_2.daylio", &backup);
    let mut update = document_update(1, "backup-1", Some("/import"));
    update["message"]["document"]["file_name"] = json!("Daylio_backup.daylio");
    update["message"]["document"]["mime_type"] = json!("application/octet-stream");
    update["message"]["document"]["file_size"] = json!(backup.len());
    app.telegram.push_update(update);

    let sent = app.telegram.wait_sent(USER, 1).await;

    let texts = Texts(Language::En);
    assert_eq!(
        sent[0].text(),
        format!(
            "{} {}",
            texts.import_done(4, 0, 0, None),
            texts.import_zone("UTC", 0)
        )
    );
    let moods: Vec<i64> = sqlx::query_scalar(
        "SELECT CAST(mood AS INTEGER) FROM day_logs WHERE user_id = ?1 ORDER BY mood",
    )
    .bind(USER)
    .fetch_all(app.store.read_pool().expect("a SQLite store"))
    .await
    .unwrap();
    assert_eq!(moods, [2, 3, 3, 4]);
}
