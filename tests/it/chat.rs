//! `daylog chat` in process: the conversation loop over a byte slice, against a real
//! store and fake providers. Nothing a line does may end the session or lose an entry;
//! terminal entries never collide with Telegram's messages.

#![expect(
    clippy::expect_used,
    reason = "helpers outside #[test] fns fail loudly by design"
)]

use crate::support;

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};

use daylog::config::Settings;
use daylog::journal::Journal;
use daylog::store::Store;
use daylog::terminal::{self, Terminal};
use daylog::texts::Texts;
use support::telegram::text_update;
use support::{ANALYSIS_TEXT, App, FakeTelegram, Providers, test_env};

/// What the terminal printed, shared with the test.
#[derive(Clone, Default)]
struct Screen(Arc<Mutex<Vec<u8>>>);

impl Screen {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("screen")).into_owned()
    }
}

impl Write for Screen {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("screen").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A terminal session's parts: the journal on a fresh database and fake providers.
struct Chat {
    journal: Arc<Journal>,
    store: Store,
    dir: tempfile::TempDir,
    _providers: Providers,
}

impl Chat {
    async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// Like [`Chat::start`]; `configure` may change the environment first.
    async fn start_with(configure: impl FnOnce(&mut HashMap<String, String>)) -> Self {
        support::init_test_tracing();
        let dir = tempfile::tempdir().expect("dir");
        let providers = Providers::start().await;
        providers.healthy().await;
        let telegram = FakeTelegram::start().await;
        let db = format!("sqlite://{}/daylog.db", dir.path().display());
        let mut env = test_env(&db, &telegram, &providers);
        configure(&mut env);
        let app = daylog::app::App::build(Settings::load_from(&env).expect("settings"))
            .await
            .expect("app");
        Self {
            journal: Arc::clone(app.journal()),
            store: app.store().clone(),
            dir,
            _providers: providers,
        }
    }

    /// Feeds `input` to a session of `user` whose files go to `files`; returns what
    /// it printed, after checking that the session ended well (at the end of input).
    async fn talk(&self, user: i64, files: std::path::PathBuf, input: &[u8]) -> String {
        let screen = Screen::default();
        let terminal = Arc::new(Terminal::new(Box::new(screen.clone()), files));
        let result = terminal::converse(
            Arc::clone(&self.journal),
            terminal,
            input,
            daylog::domain::UserId(user),
        )
        .await;
        let printed = screen.text();
        assert!(
            result.is_ok(),
            "the session ended early: {result:?}\n{printed}"
        );
        printed
    }

    async fn texts_of(&self, user: i64) -> Vec<String> {
        sqlx::query_scalar("SELECT text FROM day_logs WHERE user_id = ?1 ORDER BY id")
            .bind(user)
            .fetch_all(self.store.read_pool().expect("a SQLite store"))
            .await
            .expect("texts")
    }
}

/// A second application (a terminal) on the database of `env`.
async fn journal(env: &HashMap<String, String>) -> Arc<Journal> {
    let settings = Settings::load_from(env).expect("settings");
    let app = daylog::app::App::build(settings).await.expect("app");
    Arc::clone(app.journal())
}

fn english() -> Texts {
    Texts(daylog::language::Language::En)
}

/// From now on every insert of a day log fails, as on a full disk; users still update.
async fn refuse_new_logs(chat: &Chat) {
    use sqlx::Connection as _;
    let url = format!("sqlite://{}/daylog.db", chat.dir.path().display());
    let mut conn = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("connect");
    sqlx::query(
        "CREATE TRIGGER refuse_logs BEFORE INSERT ON day_logs
         BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",
    )
    .execute(&mut conn)
    .await
    .expect("trigger");
    conn.close().await.expect("close");
}

#[tokio::test]
async fn an_entry_that_cannot_be_saved_is_told_in_the_users_language() {
    let chat = Chat::start().await;
    let files = chat.dir.path().to_owned();
    chat.talk(
        1,
        files.clone(),
        b"/lang ru
",
    )
    .await;
    refuse_new_logs(&chat).await;

    let printed = chat.talk(1, files, "Тихий день.\n".as_bytes()).await;

    let russian = Texts(daylog::language::Language::Ru);
    assert!(printed.contains(russian.not_saved()), "{printed}");
    assert!(!printed.contains(english().not_saved()), "{printed}");
    assert!(chat.texts_of(1).await.is_empty());
}

#[tokio::test]
async fn lang_is_not_confirmed_when_the_user_could_not_be_stored() {
    use sqlx::Connection as _;
    let chat = Chat::start().await;
    let url = format!("sqlite://{}/daylog.db", chat.dir.path().display());
    let mut conn = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("connect");
    // A new user cannot be stored, as on a full disk.
    sqlx::query(
        "CREATE TRIGGER refuse_users BEFORE INSERT ON users
         BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END",
    )
    .execute(&mut conn)
    .await
    .expect("trigger");
    conn.close().await.expect("close");

    let printed = chat
        .talk(1, chat.dir.path().to_owned(), b"/lang ru\n")
        .await;

    let russian = Texts(daylog::language::Language::Ru);
    assert!(!printed.contains(russian.lang_set()), "{printed}");
    assert!(printed.contains(english().internal_error()), "{printed}");
}

#[tokio::test]
async fn with_no_key_at_all_the_entry_is_saved_and_the_terminal_says_what_to_set() {
    let chat = Chat::start_with(|env| {
        for key in ["MISTRAL_API_KEY", "GEMINI_API_KEY", "GROQ_API_KEY"] {
            env.remove(key);
        }
    })
    .await;

    let printed = chat
        .talk(1, chat.dir.path().to_owned(), b"A quiet day.\n")
        .await;

    assert!(
        printed.contains(&english().saved_no_provider("MISTRAL_API_KEY")),
        "{printed}"
    );
    assert!(!printed.contains(english().saved_pending()), "{printed}");
    assert_eq!(chat.texts_of(1).await, ["A quiet day."]);
    let status: String = sqlx::query_scalar("SELECT status FROM day_logs WHERE user_id = 1")
        .fetch_one(chat.store.read_pool().expect("a SQLite store"))
        .await
        .expect("status");
    assert_eq!(status, "pending", "kept for when a key is set");
}

#[tokio::test]
async fn invalid_utf8_is_replaced_said_once_and_the_session_goes_on() {
    let chat = Chat::start().await;

    let printed = chat
        .talk(
            1,
            chat.dir.path().to_owned(),
            b"A calm morning.\nBad \xff\xfe bytes, \xc3 twice.\nThe evening was fine.\n",
        )
        .await;

    let notice = english().invalid_bytes_replaced();
    assert_eq!(printed.matches(notice).count(), 1, "{printed}");
    assert_eq!(
        chat.texts_of(1).await,
        [
            "A calm morning.",
            "Bad \u{FFFD}\u{FFFD} bytes, \u{FFFD} twice.",
            "The evening was fine."
        ]
    );
    assert_eq!(printed.matches(ANALYSIS_TEXT).count(), 3, "{printed}");
}

#[tokio::test]
async fn a_file_that_cannot_be_written_is_said_and_the_session_goes_on() {
    let chat = Chat::start().await;
    // A folder that does not exist: no file can be written there, even as root.
    let nowhere = chat.dir.path().join("missing");

    let printed = chat
        .talk(
            1,
            nowhere.clone(),
            b"Ran 5 km.\n/stats\n/export\nAfter the export, still here.\n",
        )
        .await;

    for file in ["daylog-stats.png", "daylog-export.csv"] {
        let path = nowhere.join(file).display().to_string();
        assert!(
            printed.contains(&format!("Could not write the file {path}")),
            "{file}: {printed}"
        );
    }
    assert_eq!(
        chat.texts_of(1).await,
        ["Ran 5 km.", "After the export, still here."]
    );
    assert_eq!(printed.matches(ANALYSIS_TEXT).count(), 2, "{printed}");
}

/// What a user wrote (`daylog chat --user` with a Telegram user's id shows their
/// entries) never drives the operator's terminal: escape sequences are shown escaped.
#[tokio::test]
async fn escape_sequences_in_entries_are_shown_not_run() {
    let chat = Chat::start().await;

    let printed = chat
        .talk(
            1,
            chat.dir.path().to_owned(),
            b"A \x1b[31mred\x1b[0m day \x1b]0;title\x07\n/history\n",
        )
        .await;

    assert!(!printed.contains('\u{1b}'), "{printed:?}");
    assert!(!printed.contains('\u{7}'), "{printed:?}");
    assert!(printed.contains("A \\x1b[31mred\\x1b[0m day"), "{printed}");
    assert_eq!(
        chat.texts_of(1).await,
        ["A \u{1b}[31mred\u{1b}[0m day \u{1b}]0;title\u{7}"],
        "stored as written"
    );
}

#[tokio::test]
async fn a_failing_command_gets_a_sentence_and_the_session_goes_on() {
    let chat = Chat::start().await;
    // Every read fails from now on (writes use their own connection).
    chat.store
        .read_pool()
        .expect("a SQLite store")
        .close()
        .await;

    let printed = chat
        .talk(1, chat.dir.path().to_owned(), b"/history\n/help\n")
        .await;

    assert!(printed.contains(english().internal_error()), "{printed}");
    assert!(
        printed.contains("/export"),
        "help still answered: {printed}"
    );
}

#[tokio::test]
async fn after_delete_only_yes_confirms_and_another_line_is_still_an_entry() {
    let chat = Chat::start().await;
    let files = chat.dir.path().to_owned();

    // Arrange: one entry. Act: /delete, then a real entry instead of an answer.
    let printed = chat
        .talk(
            1,
            files.clone(),
            b"First entry.\n/delete\nI did not mean that; today was good.\n",
        )
        .await;

    assert!(
        printed.contains(english().delete_not_confirmed()),
        "{printed}"
    );
    assert_eq!(
        chat.texts_of(1).await,
        ["First entry.", "I did not mean that; today was good."],
        "nothing deleted, and the line journaled"
    );
    assert_eq!(printed.matches(ANALYSIS_TEXT).count(), 2, "{printed}");

    // "no" cancels without becoming an entry; "/history" after /delete runs.
    let printed = chat
        .talk(1, files.clone(), b"/delete\nno\n/delete\n/history\n")
        .await;
    assert!(printed.contains(english().delete_cancelled()), "{printed}");
    assert!(printed.contains("First entry."), "history ran: {printed}");
    assert_eq!(chat.texts_of(1).await.len(), 2);

    // "yes" deletes.
    chat.talk(1, files, b"/delete\nyes\n").await;
    assert!(chat.texts_of(1).await.is_empty());
}

#[tokio::test]
async fn a_terminal_entry_and_a_telegram_message_with_the_same_number_are_both_kept() {
    // Arrange: the daemon on a database, and a terminal for user 555 on the same one.
    let app = App::spawn().await;
    app.providers.healthy().await;
    let terminal_journal = journal(&app.env).await;
    let screen = Screen::default();
    let terminal = Arc::new(Terminal::new(
        Box::new(screen.clone()),
        app.dir.path().to_owned(),
    ));

    // Act: an entry typed in the terminal, then user 555's first Telegram message.
    terminal::converse(
        terminal_journal,
        terminal,
        &b"Typed in the terminal.\n"[..],
        daylog::domain::UserId(555),
    )
    .await
    .expect("session");
    app.telegram
        .push_update(text_update(555, 1, "Sent from the phone."));

    // Assert: both stored, each answered on its own front end.
    let sent = app.telegram.wait_sent(555, 1).await;
    assert!(sent[0].text().contains(ANALYSIS_TEXT), "{}", sent[0].text());
    assert_eq!(sent[0].reply_to(), Some(1));
    assert!(screen.text().contains(ANALYSIS_TEXT), "{}", screen.text());
    let rows: Vec<(i64, String, String)> = sqlx::query_as(
        "SELECT message_id, source, text FROM day_logs WHERE chat_id = 555 ORDER BY id",
    )
    .fetch_all(app.store.read_pool().expect("a SQLite store"))
    .await
    .expect("rows");
    assert_eq!(
        rows,
        [
            (-1, "chat".to_owned(), "Typed in the terminal.".to_owned()),
            (1, "telegram".to_owned(), "Sent from the phone.".to_owned()),
        ]
    );
    app.stop().await;
}

#[tokio::test]
async fn import_reads_a_daylio_export_from_a_path_once() {
    let chat = Chat::start().await;
    let path = chat.dir.path().join("daylio.csv");
    std::fs::write(
        &path,
        "year,date,weekday,time,mood,activities,note\n2024,May 1,Wednesday,8:02 am,Rad,work,\"Old, \"\"format\"\"\"\n",
    )
    .expect("export written");
    let input = format!(
        "/import {p}\n/import {p}\n/import {p}.missing\nTyped after.\n",
        p = path.display()
    );
    let printed = chat
        .talk(61, chat.dir.path().to_owned(), input.as_bytes())
        .await;
    assert!(
        printed.contains(&english().import_done(1, 0, 0, None)),
        "{printed}"
    );
    assert!(
        printed.contains(&english().import_done(0, 1, 0, None)),
        "{printed}"
    );
    assert!(
        printed.contains(&english().import_file_unreadable(&format!("{}.missing", path.display()))),
        "{printed}"
    );
    assert_eq!(chat.texts_of(61).await, ["Old, \"format\"", "Typed after."]);
}

/// A bare `/import` in the terminal says how to give a path (not Telegram's "send the
/// file"), and `/lang ru`'s delete question takes «да/нет».
#[tokio::test]
async fn terminal_usage_sentences_are_the_terminals_and_in_the_users_language() {
    let chat = Chat::start().await;
    let printed = chat
        .talk(
            62,
            chat.dir.path().to_owned(),
            b"/import\n/lang ru\n/delete\nno\n",
        )
        .await;
    assert!(printed.contains(english().import_path_usage()), "{printed}");
    assert!(!printed.contains(english().import_usage()), "{printed}");
    let ru = Texts(daylog::language::Language::Ru);
    assert!(
        printed.contains(&format!("{} (да/нет)", ru.delete_confirm())),
        "{printed}"
    );
    assert!(chat.texts_of(62).await.is_empty());
}

/// `/help` in the terminal says how its `/import` works (a file path, not Telegram's
/// document with a caption) and lists its `/voice`.
#[tokio::test]
async fn help_in_the_terminal_says_import_takes_a_path() {
    let chat = Chat::start().await;
    let printed = chat
        .talk(63, chat.dir.path().to_owned(), b"/help\n/lang ru\n/help\n")
        .await;
    assert!(
        printed.contains(&format!(
            "/import — {}",
            english().help_import_in_terminal()
        )),
        "{printed}"
    );
    assert!(printed.contains("/import path/to/file.csv"), "{printed}");
    assert!(printed.contains("/voice path/to/note.ogg"), "{printed}");
    assert!(!printed.contains("caption"), "{printed}");
    let ru = Texts(daylog::language::Language::Ru);
    assert!(printed.contains(ru.help_import_in_terminal()), "{printed}");
    assert!(!printed.contains("подписью"), "{printed}");
    assert!(chat.texts_of(63).await.is_empty());
}

/// Entries left unanswered by an earlier session (no key then) are answered by the
/// worker when the next session starts, after whatever the user types: each such reply
/// says which entry it answers (its first words and local time); a live answer does not.
#[tokio::test]
async fn replies_to_a_resumed_backlog_name_the_entry_they_answer() {
    use tokio::io::AsyncWriteExt as _;
    const WAIT: std::time::Duration = std::time::Duration::from_secs(20);
    let chat = Chat::start_with(|env| {
        for key in ["MISTRAL_API_KEY", "GEMINI_API_KEY", "GROQ_API_KEY"] {
            env.remove(key);
        }
    })
    .await;
    chat.talk(
        64,
        chat.dir.path().to_owned(),
        b"Walked the dog along the river at dawn, then coffee.\nA quiet evening.\n",
    )
    .await;
    let written: Vec<String> = sqlx::query_scalar(
        "SELECT substr(created_at, 12, 5) FROM day_logs WHERE user_id = 64 ORDER BY id",
    )
    .fetch_all(chat.store.read_pool().expect("a SQLite store"))
    .await
    .expect("times");

    // The next session, with keys: its worker finishes the backlog at start-up.
    let telegram = FakeTelegram::start().await;
    let db = format!("sqlite://{}/daylog.db", chat.dir.path().display());
    let journal = journal(&test_env(&db, &telegram, &chat._providers)).await;
    let screen = Screen::default();
    let terminal = Arc::new(Terminal::new(
        Box::new(screen.clone()),
        chat.dir.path().to_owned(),
    ));
    let (mut typing, input) = tokio::io::duplex(1024);
    let session = tokio::spawn(terminal::converse(
        journal,
        terminal,
        tokio::io::BufReader::new(input),
        daylog::domain::UserId(64),
    ));
    let answered = |n: usize| {
        let screen = screen.clone();
        async move { screen.text().matches(ANALYSIS_TEXT).count() >= n }
    };
    support::wait_until("the backlog answered", WAIT, || answered(2)).await;
    typing
        .write_all(b"Typed in this session.\n")
        .await
        .expect("type");
    support::wait_until("the live entry answered", WAIT, || answered(3)).await;
    drop(typing);
    session.await.expect("join").expect("the session ends well");

    let printed = screen.text();
    // "About your entry of 23:41, “…”:" (the day before the time, should the local day
    // have turned meanwhile).
    let named = |time: &str, words: &str| {
        printed.lines().any(|line| {
            line.starts_with("About your entry of ")
                && line.contains(&format!("{time}, “{words}”:"))
        })
    };
    assert!(
        named(&written[0], "Walked the dog along the river…"),
        "{printed}"
    );
    assert!(named(&written[1], "A quiet evening."), "{printed}");
    assert!(!printed.contains("“Typed in this session"), "{printed}");
    assert_eq!(printed.matches("About your entry").count(), 2, "{printed}");
}

/// A backup carries its photos, so it may be larger than a CSV may: the terminal takes
/// one over 10 MB as the bot does (up to Telegram's 20 MB).
#[tokio::test]
async fn import_takes_a_backup_larger_than_a_csv_may_be() {
    let chat = Chat::start().await;
    let path = chat.dir.path().join("with-photos.daylio");
    std::fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/daylio/custom_moods.daylio"
        ),
        &path,
    )
    .expect("fixture copied");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .expect("open");
    let mut zip = zip::ZipWriter::new_append(file).expect("a zip");
    let stored =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    zip.start_file("photos/holiday.jpg", stored)
        .expect("member");
    zip.write_all(&vec![7_u8; 11 * 1024 * 1024]).expect("photo");
    zip.finish().expect("zip written");
    assert!(std::fs::metadata(&path).expect("size").len() > 10 * 1024 * 1024);

    let printed = chat
        .talk(
            62,
            chat.dir.path().to_owned(),
            format!("/import {}\n", path.display()).as_bytes(),
        )
        .await;

    assert!(
        !printed.contains(
            daylog::import::ImportError::TooLarge.sentence(daylog::language::Language::En)
        ),
        "{printed}"
    );
    assert!(!chat.texts_of(62).await.is_empty(), "{printed}");
}
