//! A voice note against the real `daylog` binary: a kill -9 between its transcription
//! and its analysis, then a restart. The stored transcript is not made again nor shown
//! again; the analysis arrives once.

use crate::support;

use std::process::Command;
use std::time::Duration;

use support::telegram::voice_update;
use support::{
    ANALYSIS_TEXT, FakeTelegram, Providers, TRANSCRIPT, test_env, voice_fixture, wait_exit,
};

fn spawn_bot(env: &std::collections::HashMap<String, String>) -> support::Bot {
    let log = support::bot_log_path(env);
    support::spawn_daylog(env, &log)
}

#[tokio::test]
async fn a_kill_between_transcription_and_analysis_resumes_with_the_analysis_only() {
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let telegram = FakeTelegram::start().await;
    telegram.add_file("voice-k", "voice/file_k.oga", &voice_fixture());

    // First life: Whisper answers at once, the analysis providers hang.
    let slow = Providers::start().await;
    slow.answer_transcription(TRANSCRIPT).await;
    slow.slow(Duration::from_secs(30)).await;
    let mut env = test_env(&db, &telegram, &slow);
    env.insert("DAYLOG__RETRY__REQUEST_TIMEOUT_MS".into(), "60000".into());
    env.insert("DAYLOG__RETRY__DEADLINE_MS".into(), "60000".into());
    let mut first = spawn_bot(&env);
    telegram
        .wait_for("the bot to start", Duration::from_secs(30), |calls| {
            calls.iter().any(|c| c.method == "SetMyCommands")
        })
        .await;
    telegram.push_update(voice_update(
        41,
        7,
        "voice-k",
        3,
        voice_fixture().len() as u64,
    ));
    let sent = telegram.wait_sent(41, 1).await;
    assert!(sent[0].text().contains("slept well"), "{}", sent[0].text());
    support::wait_until("the analysis to start", Duration::from_secs(20), || async {
        slow.analysis_requests().await > 0
    })
    .await;
    first.kill().expect("kill -9");
    let _ = first.wait();
    assert_eq!(telegram.sent_to(41).len(), 1, "only the transcript so far");

    // Second life: healthy providers; the worker picks the log up at start-up.
    let healthy = Providers::start().await;
    healthy.healthy().await;
    healthy.answer_transcription(TRANSCRIPT).await;
    let mut second = spawn_bot(&test_env(&db, &telegram, &healthy));
    let sent = telegram.wait_sent(41, 2).await;
    assert!(sent[1].text().contains(ANALYSIS_TEXT), "{}", sent[1].text());
    assert_eq!(sent[1].reply_to(), Some(7));
    let pool = sqlx::SqlitePool::connect(&db).await.expect("db");
    support::wait_until(
        "the reply to be recorded",
        Duration::from_secs(20),
        || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM day_logs WHERE chat_id = 41 AND replied_at IS NOT NULL",
            )
            .fetch_one(&pool)
            .await
            .expect("count")
                == 1
        },
    )
    .await;
    let status = Command::new("kill")
        .args(["-TERM", &second.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    assert_eq!(
        wait_exit(&mut second, Duration::from_secs(15)).await.code(),
        Some(0)
    );

    // The bot has exited: what it sent is final.
    assert_eq!(
        telegram.sent_to(41).len(),
        2,
        "transcript once, analysis once"
    );
    assert_eq!(
        healthy.transcription_requests().await,
        0,
        "the stored transcript is not made again"
    );
    let (text, kind): (String, String) =
        sqlx::query_as("SELECT text, kind FROM day_logs WHERE chat_id = 41")
            .fetch_one(&pool)
            .await
            .expect("row");
    assert_eq!((text.as_str(), kind.as_str()), (TRANSCRIPT, "voice"));
    pool.close().await;
}
