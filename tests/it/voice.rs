//! Voice notes end to end (docs/behaviour.md, "Voice notes"): the real dispatcher against a fake Bot API that
//! serves `getFile` and the download, and a fake Groq Whisper that checks the multipart
//! upload of a real Ogg Opus recording. Waits are on conditions, never on fixed sleeps.

#![expect(
    clippy::expect_used,
    reason = "helpers outside #[test] fns fail loudly by design"
)]

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use daylog::config::Settings;
use daylog::terminal::{self, Terminal};
use support::telegram::{audio_update, voice_update};
use support::{ANALYSIS_TEXT, App, FakeTelegram, Providers, TRANSCRIPT, test_env, voice_fixture};

const WAIT: Duration = Duration::from_secs(20);

// Telegram HTML as a person sees it: tags dropped, entities decoded (the bot's own
// function, so the tests read replies the way `daylog chat` shows them).
use daylog::render::html_to_plain as visible;

async fn wait_until<F, Fut>(cond: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    support::wait_until("the condition", WAIT, cond).await;
}

/// The system prompts of the analysis requests Mistral received.
async fn analysis_system_prompts(providers: &Providers) -> Vec<String> {
    providers
        .mistral
        .received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .filter_map(|r| serde_json::from_slice::<serde_json::Value>(&r.body).ok())
        .filter_map(|b| b["messages"][0]["content"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn a_voice_note_is_stored_transcribed_shown_back_and_analysed() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    app.providers.answer_transcription(TRANSCRIPT).await;
    app.telegram
        .add_file("voice-1", "voice/file_1.oga", &voice_fixture());

    app.telegram.push_update(voice_update(
        7,
        20,
        "voice-1",
        3,
        voice_fixture().len() as u64,
    ));
    let sent = app.telegram.wait_sent(7, 2).await;

    // The transcript first, escaped, as a reply to the voice note.
    let transcript = &sent[0];
    assert_eq!(transcript.reply_to(), Some(20));
    assert_eq!(transcript.body["parse_mode"], "HTML");
    assert!(
        transcript.text().contains("&lt;today&gt; &amp; slept"),
        "escaped: {}",
        transcript.text()
    );
    assert!(visible(transcript.text()).contains(TRANSCRIPT));
    // Then the analysis, as for a text entry.
    let analysis = visible(sent[1].text());
    assert!(analysis.contains(ANALYSIS_TEXT), "{analysis}");
    assert_eq!(sent[1].reply_to(), Some(20));
    // Downloaded through the Bot API base URL, with the file_path getFile gave.
    assert_eq!(
        app.telegram.downloads(),
        vec!["voice/file_1.oga".to_owned()]
    );
    // The analysis prompt knows the entry is a transcript.
    let prompts = analysis_system_prompts(&app.providers).await;
    assert!(
        prompts.iter().any(|p| p.contains("automatic transcript")),
        "{prompts:?}"
    );

    wait_until(|| async {
        app.count("SELECT count(*) FROM day_logs WHERE replied_at IS NOT NULL")
            .await
            == 1
    })
    .await;
    let row: (
        String,
        String,
        String,
        Option<String>,
        Option<i64>,
        Option<String>,
    ) = sqlx::query_as(
        "SELECT kind, text, status, file_id, duration_s, transcript_sent_at FROM day_logs
             WHERE chat_id = 7 AND message_id = 20",
    )
    .fetch_one(app.store.read_pool().expect("a SQLite store"))
    .await
    .expect("row");
    assert_eq!(row.0, "voice");
    assert_eq!(row.1, TRANSCRIPT, "the transcript is the entry's text");
    assert_eq!(row.2, "analyzed");
    assert_eq!(row.3.as_deref(), Some("voice-1"));
    assert_eq!(row.4, Some(3));
    assert!(row.5.is_some(), "transcript recorded as shown");
    app.store.flush_calls().await;
    assert_eq!(
        app.count(
            "SELECT count(*) FROM llm_calls WHERE task = 'transcription' AND outcome = 'ok'
             AND model = 'whisper-large-v3-turbo'"
        )
        .await,
        1
    );
    app.stop().await;
}

#[tokio::test]
async fn an_audio_file_is_journaled_like_a_voice_note() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    app.providers.answer_transcription(TRANSCRIPT).await;
    // The fixture is Ogg whatever the name says; the fake Whisper checks the bytes.
    app.telegram
        .add_file("audio-1", "music/file_2.ogg", &voice_fixture());

    app.telegram.push_update(audio_update(
        9,
        5,
        "audio-1",
        3,
        voice_fixture().len() as u64,
    ));
    let sent = app.telegram.wait_sent(9, 2).await;

    assert!(visible(sent[0].text()).contains(TRANSCRIPT));
    assert!(visible(sent[1].text()).contains(ANALYSIS_TEXT));
    app.stop().await;
}

#[tokio::test]
async fn a_too_long_or_too_large_voice_note_is_refused_politely_and_nothing_is_stored() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    app.providers.answer_transcription(TRANSCRIPT).await;
    app.telegram
        .add_file("long", "voice/long.oga", &voice_fixture());

    // Over the default voice.max_seconds (600), then over Telegram's 20 MB.
    app.telegram
        .push_update(voice_update(11, 1, "long", 601, 4000));
    app.telegram
        .push_update(voice_update(11, 2, "long", 60, 21 * 1024 * 1024));
    let sent = app.telegram.wait_sent(11, 2).await;

    let too_long = visible(sent[0].text());
    assert!(too_long.contains("too long"), "{too_long}");
    assert!(too_long.contains("10 min"), "{too_long}");
    assert!(too_long.contains("Nothing was saved"), "{too_long}");
    assert_eq!(sent[0].reply_to(), Some(1));
    let too_large = visible(sent[1].text());
    assert!(too_large.contains("20 MB"), "{too_large}");
    assert_eq!(app.count("SELECT count(*) FROM day_logs").await, 0);
    assert!(app.telegram.downloads().is_empty(), "nothing downloaded");
    assert_eq!(app.providers.transcription_requests().await, 0);
    assert!(
        !app.telegram.calls().iter().any(|c| c.method == "GetFile"),
        "no getFile for a refused note"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_voice_note_survives_a_transcription_outage_and_is_answered_once_later() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    app.providers.transcription_down().await;
    app.telegram
        .add_file("voice-2", "voice/file_2.oga", &voice_fixture());

    app.telegram.push_update(voice_update(
        12,
        3,
        "voice-2",
        3,
        voice_fixture().len() as u64,
    ));
    let sent = app.telegram.wait_sent(12, 1).await;
    let notice = visible(sent[0].text());
    assert!(notice.contains("Saved your voice note"), "{notice}");
    let row: (String, String, String) = sqlx::query_as(
        "SELECT kind, text, status FROM day_logs WHERE chat_id = 12 AND message_id = 3",
    )
    .fetch_one(app.store.read_pool().expect("a SQLite store"))
    .await
    .expect("stored first");
    assert_eq!(row, ("voice".into(), String::new(), "pending".into()));

    // Whisper comes back; the worker transcribes, shows the transcript, analyses.
    app.providers.reset().await;
    app.providers.healthy().await;
    app.providers.answer_transcription(TRANSCRIPT).await;
    let sent = app.telegram.wait_sent(12, 3).await;
    assert!(
        visible(sent[1].text()).contains(TRANSCRIPT),
        "{}",
        sent[1].text()
    );
    assert_eq!(sent[1].reply_to(), Some(3));
    assert!(
        visible(sent[2].text()).contains(ANALYSIS_TEXT),
        "{}",
        sent[2].text()
    );
    wait_until(|| async {
        app.count(
            "SELECT count(*) FROM day_logs WHERE status = 'analyzed' AND replied_at IS NOT NULL",
        )
        .await
            == 1
    })
    .await;
    // Answered once: no second transcript, no second analysis, no second transcription.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(app.telegram.sent_to(12).len(), 3);
    assert_eq!(app.providers.transcription_requests().await, 1);
    app.store.flush_calls().await;
    assert!(
        app.count(
            "SELECT count(*) FROM llm_calls WHERE task = 'transcription' AND outcome = 'retryable'"
        )
        .await
            >= 1,
        "the outage is recorded"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_failed_download_is_retried_by_the_worker_from_the_stored_file_id() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    app.providers.answer_transcription(TRANSCRIPT).await;
    app.telegram
        .add_file("voice-3", "voice/file_3.oga", &voice_fixture());
    app.telegram.fail_downloads(1);

    app.telegram.push_update(voice_update(
        13,
        4,
        "voice-3",
        3,
        voice_fixture().len() as u64,
    ));
    let sent = app.telegram.wait_sent(13, 3).await;

    assert!(visible(sent[0].text()).contains("Saved your voice note"));
    assert!(visible(sent[1].text()).contains(TRANSCRIPT));
    assert!(visible(sent[2].text()).contains(ANALYSIS_TEXT));
    assert_eq!(app.telegram.downloads().len(), 2, "one failure, one retry");
    app.stop().await;
}

/// What the terminal printed, shared with the test.
#[derive(Clone, Default)]
struct Screen(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Screen {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("screen").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn daylog_chat_takes_a_voice_note_by_path_through_the_same_transcription() {
    support::init_test_tracing();
    let dir = tempfile::tempdir().expect("dir");
    let providers = Providers::start().await;
    providers.healthy().await;
    providers.answer_transcription(TRANSCRIPT).await;
    let telegram = FakeTelegram::start().await;
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let settings = Settings::load_from(&test_env(&db, &telegram, &providers)).expect("settings");
    let app = daylog::app::App::build(settings).await.expect("app");
    let (store, journal) = (app.store().clone(), Arc::clone(app.journal()));
    let note = dir.path().join("note.ogg");
    std::fs::write(&note, voice_fixture()).expect("fixture copy");
    let screen = Screen::default();
    let terminal = Arc::new(Terminal::new(
        Box::new(screen.clone()),
        dir.path().to_path_buf(),
    ));
    let input = format!(
        "/voice {}\n/voice {}/missing.ogg\n",
        note.display(),
        dir.path().display()
    );

    terminal::converse(
        journal,
        terminal,
        input.as_bytes(),
        daylog::domain::UserId(900),
    )
    .await
    .expect("session");

    let printed = String::from_utf8_lossy(&screen.0.lock().expect("screen")).into_owned();
    assert!(printed.contains(TRANSCRIPT), "{printed}");
    assert!(printed.contains(ANALYSIS_TEXT), "{printed}");
    assert!(printed.contains("Cannot read the recording"), "{printed}");
    let row: (String, String, String, String, Option<i64>) = sqlx::query_as(
        "SELECT kind, source, text, file_id, duration_s FROM day_logs WHERE user_id = 900",
    )
    .fetch_one(store.read_pool().expect("a SQLite store"))
    .await
    .expect("one row: the missing file stored nothing");
    assert_eq!(row.0, "voice");
    assert_eq!(row.1, "chat");
    assert_eq!(row.2, TRANSCRIPT);
    assert_eq!(row.3, note.display().to_string());
    assert_eq!(row.4, Some(3), "duration read from the Ogg pages");
    assert_eq!(providers.transcription_requests().await, 1);
}

#[tokio::test]
async fn a_transcript_lost_to_a_telegram_outage_is_shown_later_and_before_the_analysis() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    app.providers.answer_transcription(TRANSCRIPT).await;
    app.telegram
        .add_file("voice-4", "voice/file_4.oga", &voice_fixture());
    app.telegram.fail_next(
        "SendMessage",
        Some(14),
        502,
        serde_json::json!({"ok": false, "error_code": 502, "description": "Bad Gateway"}),
    );

    app.telegram.push_update(voice_update(
        14,
        6,
        "voice-4",
        3,
        voice_fixture().len() as u64,
    ));
    let sent = app.telegram.wait_sent(14, 2).await;

    assert!(
        visible(sent[0].text()).contains(TRANSCRIPT),
        "{}",
        sent[0].text()
    );
    assert!(
        visible(sent[1].text()).contains(ANALYSIS_TEXT),
        "{}",
        sent[1].text()
    );
    wait_until(|| async {
        app.count("SELECT count(*) FROM day_logs WHERE replied_at IS NOT NULL")
            .await
            == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(app.telegram.sent_to(14).len(), 2, "each shown once");
    assert_eq!(
        app.providers.transcription_requests().await,
        1,
        "the stored transcript is reused"
    );
    app.stop().await;
}

#[tokio::test]
async fn the_voice_migration_keeps_every_llm_call_and_lets_transcriptions_in() {
    let dir = tempfile::tempdir().expect("dir");
    let url = format!("sqlite://{}/old.db?mode=rwc", dir.path().display());
    let pool = sqlx::SqlitePool::connect(&url).await.expect("db");
    let all = sqlx::migrate!("./migrations");
    let mut before = sqlx::migrate!("./migrations");
    before.migrations = all
        .migrations
        .iter()
        .filter(|m| m.version < 20261201000009)
        .cloned()
        .collect::<Vec<_>>()
        .into();
    before.run(&pool).await.expect("older migrations");
    sqlx::query("INSERT INTO users (user_id, chat_id) VALUES (1, 1)")
        .execute(&pool)
        .await
        .expect("user");
    sqlx::query(
        "INSERT INTO day_logs (id, user_id, chat_id, message_id, text) VALUES (5, 1, 1, 1, 'old')",
    )
    .execute(&pool)
    .await
    .expect("log");
    for (task, outcome) in [("analysis", "ok"), ("metrics", "retryable")] {
        sqlx::query(
            "INSERT INTO llm_calls (day_log_id, task, provider, model, key_index, attempt,
                 http_status, outcome, latency_ms, wait_ms, error)
             VALUES (5, ?1, 'groq', 'm', 0, 1, 200, ?2, 12, 3, 'e')",
        )
        .bind(task)
        .bind(outcome)
        .execute(&pool)
        .await
        .expect("old call");
    }
    let rejected = sqlx::query(
        "INSERT INTO llm_calls (task, provider, model, attempt, outcome)
         VALUES ('transcription', 'groq', 'w', 1, 'ok')",
    )
    .execute(&pool)
    .await;
    assert!(rejected.is_err(), "the old CHECK refuses transcriptions");

    all.run(&pool).await.expect("voice migration");

    let kept: Vec<(i64, String, String, i64, i64, Option<String>)> = sqlx::query_as(
        "SELECT day_log_id, task, outcome, latency_ms, wait_ms, error FROM llm_calls ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .expect("calls");
    assert_eq!(
        kept,
        vec![
            (5, "analysis".into(), "ok".into(), 12, 3, Some("e".into())),
            (
                5,
                "metrics".into(),
                "retryable".into(),
                12,
                3,
                Some("e".into())
            ),
        ]
    );
    sqlx::query(
        "INSERT INTO llm_calls (day_log_id, task, provider, model, attempt, outcome)
         VALUES (5, 'transcription', 'groq', 'w', 1, 'ok')",
    )
    .execute(&pool)
    .await
    .expect("transcriptions are accepted");
    let kind: String = sqlx::query_scalar("SELECT kind FROM day_logs WHERE id = 5")
        .fetch_one(&pool)
        .await
        .expect("kind");
    assert_eq!(kind, "text", "logs stored before are text");
    let bad = sqlx::query("UPDATE day_logs SET kind = 'video' WHERE id = 5")
        .execute(&pool)
        .await;
    assert!(bad.is_err(), "kind is text or voice");
    // The index of the rebuilt table is back.
    let indexed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = 'llm_calls_day_log'",
    )
    .fetch_one(&pool)
    .await
    .expect("index");
    assert_eq!(indexed, 1);
}

#[tokio::test]
async fn a_redelivered_voice_update_is_transcribed_and_answered_once() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    app.providers.answer_transcription(TRANSCRIPT).await;
    app.telegram
        .add_file("voice-5", "voice/file_5.oga", &voice_fixture());
    let update = voice_update(15, 8, "voice-5", 3, voice_fixture().len() as u64);

    app.telegram.push_update(update.clone());
    app.telegram.wait_sent(15, 2).await;
    // Telegram re-delivers it. One chat's updates are handled in order, so the answer
    // to a text sent after it marks the re-delivery as handled.
    app.telegram.push_update(update);
    app.telegram
        .push_update(support::telegram::text_update(15, 9, "And in words."));
    app.telegram.wait_sent(15, 3).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    assert_eq!(app.telegram.sent_to(15).len(), 3);
    assert_eq!(app.count("SELECT count(*) FROM day_logs").await, 2);
    assert_eq!(app.providers.transcription_requests().await, 1);
    app.stop().await;
}

#[tokio::test]
async fn a_voice_note_with_no_words_is_answered_once_and_not_transcribed_again() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    app.providers.answer_transcription("  ").await;
    app.telegram
        .add_file("voice-6", "voice/file_6.oga", &voice_fixture());

    app.telegram.push_update(voice_update(
        16,
        2,
        "voice-6",
        3,
        voice_fixture().len() as u64,
    ));
    let sent = app.telegram.wait_sent(16, 1).await;

    let answer = visible(sent[0].text());
    assert!(answer.contains("could not make out any words"), "{answer}");
    assert_eq!(sent[0].reply_to(), Some(2));
    wait_until(|| async {
        app.count(
            "SELECT count(*) FROM day_logs WHERE status = 'failed' AND replied_at IS NOT NULL",
        )
        .await
            == 1
    })
    .await;
    // The worker polls every 100 ms in tests: a pending log would be tried again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(app.providers.transcription_requests().await, 1);
    assert_eq!(app.providers.analysis_requests().await, 0);
    assert_eq!(app.telegram.sent_to(16).len(), 1);
    app.stop().await;
}

/// A voice note the transcription never reached in `worker.max_age_hours` is given up
/// with a sentence about the voice note: it has no text, so "its text is in /history"
/// would be untrue.
#[tokio::test]
async fn a_voice_note_given_up_untranscribed_is_not_said_to_have_a_text() {
    let app = App::spawn_with(|env| {
        env.insert("DAYLOG__WORKER__MAX_AGE_HOURS".into(), "1".into());
    })
    .await;
    app.providers.healthy().await;
    app.providers.transcription_down().await;
    app.telegram
        .add_file("voice-9", "voice/file_9.oga", &voice_fixture());
    app.telegram.push_update(voice_update(
        19,
        1,
        "voice-9",
        3,
        voice_fixture().len() as u64,
    ));
    app.telegram.wait_sent(19, 1).await; // saved, will follow
    app.age_logs_three_hours().await;

    let sent = app.telegram.wait_sent(19, 2).await;
    let texts = daylog::texts::Texts(daylog::language::Language::En);
    assert_eq!(visible(sent[1].text()), texts.voice_failed(), "{sent:?}");
    assert_eq!(
        app.count("SELECT count(*) FROM day_logs WHERE status = 'failed'")
            .await,
        1
    );
    app.stop().await;
}

/// A voice note with no transcription key (only `MISTRAL_API_KEY` set), the
/// user is told what is missing, not that a service is down, and the recording is not
/// downloaded at every try for nothing.
#[tokio::test]
async fn a_voice_note_with_no_transcription_key_says_so_and_is_not_downloaded() {
    let app = App::spawn_with(|env| {
        env.remove("GROQ_API_KEY");
    })
    .await;
    app.providers.healthy().await;
    app.telegram
        .add_file("voice-9", "voice/file_9.oga", &voice_fixture());

    app.telegram.push_update(voice_update(
        31,
        9,
        "voice-9",
        3,
        voice_fixture().len() as u64,
    ));
    let sent = app.telegram.wait_sent(31, 1).await;

    let said = visible(sent[0].text());
    assert!(
        said.contains("No speech-to-text provider has a key"),
        "{said}"
    );
    assert!(said.contains("GROQ_API_KEY"), "{said}");
    // The worker's retries (100 ms doubling, in tests) fetch nothing either.
    wait_until(|| async {
        app.count("SELECT count(*) FROM day_logs WHERE attempts >= 3")
            .await
            == 1
    })
    .await;
    assert!(app.telegram.downloads().is_empty());
    assert_eq!(app.telegram.sent_to(31).len(), 1, "told once");
    app.stop().await;
}

/// Any passing failure of a voice note resumes. `getFile` answering Telegram's "wrong file_id
/// or the file is temporarily unavailable", and a download answering 429 or 408, are
/// tried again from the stored file id: the voice note is transcribed and answered, not
/// failed as a recording that can no longer be fetched.
#[tokio::test]
async fn a_file_telegram_cannot_serve_for_now_is_fetched_again_later() {
    for (n, failure) in ["getFile", "429", "408"].into_iter().enumerate() {
        let app = App::spawn().await;
        app.providers.healthy().await;
        app.providers.answer_transcription(TRANSCRIPT).await;
        app.telegram
            .add_file("voice-7", "voice/file_7.oga", &voice_fixture());
        match failure {
            "getFile" => app.telegram.fail_next(
                "GetFile",
                None,
                400,
                serde_json::json!({"ok": false, "error_code": 400,
                    "description": "Bad Request: wrong file_id or the file is temporarily unavailable"}),
            ),
            status => app
                .telegram
                .fail_downloads_with(1, status.parse().expect("status")),
        }
        let chat = 40 + i64::try_from(n).expect("small");

        app.telegram.push_update(voice_update(
            chat,
            7,
            "voice-7",
            3,
            voice_fixture().len() as u64,
        ));
        let sent = app.telegram.wait_sent(chat, 3).await;

        assert!(
            visible(sent[0].text()).contains("Saved your voice note"),
            "{failure}: {}",
            sent[0].text()
        );
        assert!(visible(sent[1].text()).contains(TRANSCRIPT), "{failure}");
        assert!(visible(sent[2].text()).contains(ANALYSIS_TEXT), "{failure}");
        assert_eq!(app.telegram.failures_left(), 0, "{failure}");
        app.stop().await;
    }
}

/// A voice note whose caption reads like a command is a voice note, never a command: stored,
/// transcribed and analysed, the command not run in its place.
#[tokio::test]
async fn a_voice_note_captioned_with_a_command_is_kept_as_a_voice_note() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    app.providers.answer_transcription(TRANSCRIPT).await;
    app.telegram
        .add_file("voice-8", "voice/file_8.oga", &voice_fixture());
    let mut update = voice_update(45, 8, "voice-8", 3, voice_fixture().len() as u64);
    update["message"]["caption"] = serde_json::json!("/week summary");
    update["message"]["caption_entities"] =
        serde_json::json!([{"type": "bot_command", "offset": 0, "length": 5}]);

    app.telegram.push_update(update);
    let sent = app.telegram.wait_sent(45, 2).await;

    assert!(
        visible(sent[0].text()).contains(TRANSCRIPT),
        "{}",
        sent[0].text()
    );
    assert!(
        visible(sent[1].text()).contains(ANALYSIS_TEXT),
        "{}",
        sent[1].text()
    );
    assert_eq!(
        app.count("SELECT count(*) FROM day_logs WHERE kind = 'voice'")
            .await,
        1
    );
    app.stop().await;
}

/// Every transcription step refusing the recording itself (Whisper's 400 for a format
/// it cannot read) is not said to be an outage: the user is told the service refused
/// this recording; the note stays saved and is tried again.
#[tokio::test]
async fn a_recording_every_step_refuses_is_not_said_to_be_an_outage() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    app.providers.transcription_refuses().await;
    app.telegram
        .add_file("audio-2", "music/file_3.amr", &voice_fixture());

    app.telegram.push_update(audio_update(
        46,
        5,
        "audio-2",
        3,
        voice_fixture().len() as u64,
    ));
    let sent = app.telegram.wait_sent(46, 1).await;

    let said = visible(sent[0].text());
    assert!(said.contains("refused this recording"), "{said}");
    assert!(!said.contains("not answering"), "{said}");
    assert_eq!(
        app.count("SELECT count(*) FROM day_logs WHERE status = 'pending'")
            .await,
        1
    );
    app.stop().await;
}

/// A transcription key every provider refuses (401 on each of Groq's two keys) is not an
/// outage: the user is told the bot's transcription key was refused, as a text entry's
/// refused key is, and the log names the variable to fix, never its value.
#[tokio::test]
async fn a_voice_note_whose_transcription_keys_are_refused_says_so() {
    let logs = support::llm::LogCapture::this_thread();
    let app = App::spawn_with(|env| {
        env.insert("GROQ_API_KEY_2".to_owned(), "groq-revoked-2".to_owned());
    })
    .await;
    app.providers.healthy().await;
    wiremock::Mock::given(wiremock::matchers::method("POST"))
        .and(wiremock::matchers::path("/v1/audio/transcriptions"))
        .respond_with(
            wiremock::ResponseTemplate::new(401).set_body_json(serde_json::json!({
                "error": {"message": "Invalid API Key", "type": "invalid_request_error",
                          "code": "invalid_api_key"}
            })),
        )
        .mount(&app.providers.groq)
        .await;
    app.telegram
        .add_file("voice-10", "voice/file_10.oga", &voice_fixture());

    app.telegram.push_update(voice_update(
        47,
        10,
        "voice-10",
        3,
        voice_fixture().len() as u64,
    ));
    let sent = app.telegram.wait_sent(47, 1).await;

    let said = visible(sent[0].text());
    assert!(
        said.contains("refused this bot's transcription key"),
        "{said}"
    );
    assert!(said.contains("GROQ_API_KEY"), "{said}");
    assert!(!said.contains("not answering"), "{said}");
    assert_eq!(
        app.count("SELECT count(*) FROM day_logs WHERE status = 'pending'")
            .await,
        1,
        "kept, to be transcribed once a key works"
    );
    let log = logs.text();
    assert!(log.contains("refused this API key"), "{log}");
    assert!(log.contains("key=\"GROQ_API_KEY_2\""), "{log}");
    assert!(
        !log.contains("groq-revoked-2") && !log.contains("test-groq-key"),
        "{log}"
    );
    app.stop().await;
}

/// A file id `getFile` keeps refusing with Telegram's "wrong file_id or the file is
/// temporarily unavailable" is tried `voice.fetch_max_tries` times (7 by default, on the
/// worker's schedule), then given up with a sentence asking for the recording again:
/// not retried until the worker's max age.
#[tokio::test]
async fn a_recording_telegram_keeps_refusing_is_given_up_after_fetch_max_tries() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    app.providers.answer_transcription(TRANSCRIPT).await;
    app.telegram.refuse_file("voice-11");

    app.telegram.push_update(voice_update(
        48,
        11,
        "voice-11",
        3,
        voice_fixture().len() as u64,
    ));
    let sent = app.telegram.wait_sent(48, 2).await;

    let first = visible(sent[0].text());
    assert!(first.contains("Saved your voice note"), "{first}");
    // No transcription service is at fault while Telegram withholds the recording.
    assert!(
        first.contains("Telegram has not handed me the recording yet"),
        "{first}"
    );
    assert!(!first.contains("not answering"), "{first}");
    let said = visible(sent[1].text());
    assert!(said.contains("Please send it again"), "{said}");
    assert_eq!(sent[1].reply_to(), Some(11));
    wait_until(|| async {
        app.count(
            "SELECT count(*) FROM day_logs WHERE status = 'failed' AND replied_at IS NOT NULL",
        )
        .await
            == 1
    })
    .await;
    assert_eq!(app.telegram.get_file_calls("voice-11"), 7);
    // Given up: asked no more, told once.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(app.telegram.get_file_calls("voice-11"), 7);
    assert_eq!(app.telegram.sent_to(48).len(), 2);
    assert_eq!(app.providers.transcription_requests().await, 0);
    app.stop().await;
}
