//! Any text a user can send — NUL, RTL marks, emoji, SQL, 100 000 characters — is
//! stored byte for byte and always answered, never a panic (docs/behaviour.md, "Promises": bad input).

// Helpers here panic on a broken fixture by design (see tests/support).
#![expect(clippy::expect_used)]

use crate::support;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use daylog::config::Settings;
use daylog::frontend::{Messenger, Response, SendError, Target};
use daylog::journal::Incoming;
use proptest::prelude::*;
use support::{FakeTelegram, Providers, test_env};

/// A front end that keeps what it was asked to send.
#[derive(Default)]
struct Recorder(Mutex<Vec<(Target, Vec<Response>)>>);

impl Messenger for Recorder {
    async fn send(&self, target: Target, responses: Vec<Response>) -> Result<(), SendError> {
        self.0.lock().expect("lock").push((target, responses));
        Ok(())
    }
    async fn typing(&self, _chat_id: daylog::domain::ChatId) {}
}

struct Fixture {
    runtime: tokio::runtime::Runtime,
    app: daylog::app::App,
    _dir: tempfile::TempDir,
    _providers: Providers,
    _telegram: FakeTelegram,
}

fn fixture() -> Fixture {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("dir");
    let (app, providers, telegram) = runtime.block_on(async {
        let telegram = FakeTelegram::start().await;
        let providers = Providers::start().await;
        providers.healthy().await;
        let db = format!("sqlite://{}/daylog.db", dir.path().display());
        let mut env = test_env(&db, &telegram, &providers);
        env.insert("DAYLOG__TELEGRAM__ANALYSES_PER_HOUR".into(), "0".into());
        let settings = Settings::load_from(&env).expect("settings");
        let app = daylog::app::App::build(settings).await.expect("app");
        (app, providers, telegram)
    });
    Fixture {
        runtime,
        app,
        _dir: dir,
        _providers: providers,
        _telegram: telegram,
    }
}

static NEXT_MESSAGE: AtomicI64 = AtomicI64::new(1);

/// Sends `text` through the journal; returns the stored text and what was answered.
fn roundtrip(fx: &Fixture, text: &str) -> (String, Vec<(Target, Vec<Response>)>) {
    let message_id = NEXT_MESSAGE.fetch_add(1, Ordering::Relaxed);
    let recorder = Recorder::default();
    fx.runtime.block_on(async {
        fx.app
            .journal()
            .on_text(
                &recorder,
                Incoming {
                    user_id: daylog::domain::UserId(9),
                    chat_id: daylog::domain::ChatId(9),
                    message_id: daylog::domain::MessageId(message_id),
                    username: Some("\u{202E}evil\0name".into()),
                    language_code: Some("\u{0}xx".into()),
                    text: text.to_owned(),
                    sent_at: None,
                },
            )
            .await
            .expect("handled");
        let stored: String =
            sqlx::query_scalar("SELECT text FROM day_logs WHERE chat_id = 9 AND message_id = ?1")
                .bind(message_id)
                .fetch_one(fx.app.store().read_pool().expect("a SQLite store"))
                .await
                .expect("stored row");
        (stored, recorder.0.into_inner().expect("lock"))
    })
}

fn assert_answered(text: &str, sent: &[(Target, Vec<Response>)]) {
    assert_eq!(sent.len(), 1, "one answer for {text:?}");
    let (target, responses) = &sent[0];
    assert_eq!(target.chat_id, daylog::domain::ChatId(9));
    assert!(matches!(responses.as_slice(), [Response::Text(_)]));
}

fn hostile_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "\\PC{0,300}",
        prop::collection::vec(
            prop::sample::select(vec![
                "\0",
                "\u{202E}",
                "\u{200F}",
                "\u{FEFF}",
                "👨‍👩‍👧",
                "🏳️‍🌈",
                "e\u{301}",
                "'",
                "\"",
                ";",
                "--",
                "%",
                "_",
                "\\",
                "<b>",
                "&amp;",
                "\r\n",
                "\t",
                "日本",
                "Ω",
                "'); DROP TABLE day_logs;--",
            ]),
            0..40,
        )
        .prop_map(|parts| parts.concat()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn any_text_is_stored_exactly_and_answered(text in hostile_text()) {
        let fx = FIXTURE.with(|f| f.clone());
        let (stored, sent) = roundtrip(&fx, &text);
        prop_assert_eq!(&stored, &text);
        assert_answered(&text, &sent);
    }
}

thread_local! {
    static FIXTURE: Arc<Fixture> = Arc::new(fixture());
}

/// The corpus: inputs worth keeping as explicit cases.
#[test]
fn regression_corpus_is_stored_exactly_and_answered() {
    let fx = fixture();
    let long: String = "Ω日👍a".repeat(25_000); // 100 000 characters, over max_text_chars
    let corpus = [
        "'); DROP TABLE day_logs;--",
        "Robert'); DELETE FROM users WHERE ('1'='1",
        "nul\0inside\0",
        "\u{202E}reversed\u{202C} and \u{200F}RTL mark",
        "👨‍👩‍👧‍👦🏳️‍🌈 e\u{301} \u{FEFF}",
        "<b>not bold</b> &amp; <a href=\"x\">",
        " ",
        long.as_str(),
    ];
    for text in corpus {
        let (stored, sent) = roundtrip(&fx, text);
        assert_eq!(stored, text);
        assert_answered(text, &sent);
    }
    let tables: i64 = fx.runtime.block_on(async {
        sqlx::query_scalar("SELECT count(*) FROM sqlite_master WHERE name IN ('day_logs', 'users')")
            .fetch_one(fx.app.store().read_pool().expect("a SQLite store"))
            .await
            .expect("tables")
    });
    assert_eq!(tables, 2, "the tables are still there");
}
