//! The real `daylog` binary as a process: signals (also against a Bot API that hangs or
//! has passing trouble at start-up), a crash in the middle of an analysis (also with
//! the chat's next entry behind it), and
//! terminals (`daylog chat`) sharing a database.

use crate::support;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::telegram::text_update;
use support::{ANALYSIS_TEXT, FakeTelegram, Providers, signal, test_env, wait_exit};

/// The real binary; its stderr goes to a log file beside its database.
fn spawn_bot(env: &std::collections::HashMap<String, String>) -> support::Bot {
    let log = support::bot_log_path(env);
    support::spawn_daylog(env, &log)
}

async fn wait_polling(telegram: &FakeTelegram) {
    telegram
        .wait_for("the bot to start", Duration::from_secs(30), |calls| {
            calls.iter().any(|c| c.method == "SetMyCommands")
        })
        .await;
}

#[tokio::test]
async fn sigterm_and_sigint_stop_the_bot_with_exit_0() {
    for sig in ["TERM", "INT"] {
        let dir = tempfile::tempdir().expect("dir");
        let telegram = FakeTelegram::start().await;
        let providers = Providers::start().await;
        providers.healthy().await;
        let db = format!("sqlite://{}/daylog.db", dir.path().display());
        let mut bot = spawn_bot(&test_env(&db, &telegram, &providers));
        wait_polling(&telegram).await;

        signal(&bot, sig);
        let status = wait_exit(&mut bot, Duration::from_secs(15)).await;
        assert_eq!(status.code(), Some(0), "SIG{sig}");
    }
}

/// A bot whose providers take 30 s (and may), polling: its analyses stay in flight.
async fn slow_first_life(db: &str, telegram: &FakeTelegram) -> (Providers, support::Bot) {
    let slow = Providers::start().await;
    slow.slow(Duration::from_secs(30)).await;
    let mut env = test_env(db, telegram, &slow);
    env.insert("DAYLOG__RETRY__REQUEST_TIMEOUT_MS".into(), "60000".into());
    env.insert("DAYLOG__RETRY__DEADLINE_MS".into(), "60000".into());
    let bot = spawn_bot(&env);
    wait_polling(telegram).await;
    (slow, bot)
}

/// A bot whose providers answer at once (kept alive by the caller).
async fn healthy_life(db: &str, telegram: &FakeTelegram) -> (Providers, support::Bot) {
    let healthy = Providers::start().await;
    healthy.healthy().await;
    let bot = spawn_bot(&test_env(db, telegram, &healthy));
    (healthy, bot)
}

async fn wait_analysis_started(providers: &Providers) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while providers.analysis_requests().await == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "analysis never started"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test]
async fn a_crash_in_the_middle_of_an_analysis_is_answered_once_after_restart() {
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let telegram = FakeTelegram::start().await;

    // First life: the providers are slow, so the analysis is in flight when we kill it.
    let (slow, mut first) = slow_first_life(&db, &telegram).await;
    telegram.push_update(text_update(31, 1, "Crash-test day."));
    wait_analysis_started(&slow).await;
    first.kill().expect("kill -9");
    let _ = first.wait();
    assert!(
        telegram.sent_to(31).is_empty(),
        "nothing was answered before the crash"
    );

    // Second life: healthy providers; the worker picks the log up at start-up.
    let (_healthy, mut second) = healthy_life(&db, &telegram).await;
    let sent = telegram.wait_sent(31, 1).await;
    assert!(
        sent[0].text().contains("Here is your analysis"),
        "{}",
        sent[0].text()
    );
    assert!(sent[0].text().contains(ANALYSIS_TEXT));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(telegram.sent_to(31).len(), 1, "answered once");

    signal(&second, "TERM");
    assert_eq!(
        wait_exit(&mut second, Duration::from_secs(15)).await.code(),
        Some(0)
    );
    let pool = sqlx::SqlitePool::connect(&db).await.expect("db");
    let (status, replied): (String, Option<String>) =
        sqlx::query_as("SELECT status, replied_at FROM day_logs WHERE chat_id = 31")
            .fetch_one(&pool)
            .await
            .expect("row");
    assert_eq!(status, "analyzed");
    assert!(replied.is_some());
}

/// A chat's second entry, sent while its first is analysed, is confirmed to Telegram at
/// once (teloxide fetches the next batch): a crash then must not lose it, so it has to
/// be stored by then, not held in memory behind the first analysis.
#[tokio::test]
async fn a_crash_while_a_chats_first_entry_is_analysed_loses_not_the_entry_after_it() {
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let telegram = FakeTelegram::start().await;

    // First life: slow providers; both entries arrive while the first is analysed.
    let (slow, mut first) = slow_first_life(&db, &telegram).await;
    telegram.push_update(text_update(32, 1, "First entry of the evening."));
    let second_entry = telegram.push_update(text_update(32, 2, "And one more thing."));
    telegram.wait_confirmed(second_entry).await;
    wait_analysis_started(&slow).await;
    // Storing is a few milliseconds; an entry not stored within seconds is held back.
    let pool = sqlx::SqlitePool::connect(&db).await.expect("db");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM day_logs WHERE chat_id = 32")
            .fetch_one(&pool)
            .await
            .expect("count");
        if stored == 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the second entry is not stored while the first is analysed"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    pool.close().await;
    first.kill().expect("kill -9");
    let _ = first.wait();
    assert!(
        telegram.sent_to(32).is_empty(),
        "nothing answered before the crash"
    );

    // Second life: Telegram delivers neither again; the worker answers both, in the
    // order they came.
    let (_healthy, mut second) = healthy_life(&db, &telegram).await;
    let sent = telegram.wait_sent(32, 2).await;
    let answered: Vec<_> = sent.iter().map(|c| c.reply_to()).collect();
    assert_eq!(answered, vec![Some(1), Some(2)], "both answered, in order");
    assert!(sent.iter().all(|c| c.text().contains(ANALYSIS_TEXT)));

    signal(&second, "TERM");
    assert_eq!(
        wait_exit(&mut second, Duration::from_secs(15)).await.code(),
        Some(0)
    );
}

/// A bot whose every send hangs, with chat 33's `/help` stuck on its reply (its
/// handler holds the chat): the fakes, the bot's environment and the bot.
async fn a_chat_stuck_on_its_reply(
    db: &str,
) -> (
    FakeTelegram,
    Providers,
    std::collections::HashMap<String, String>,
    support::Bot,
) {
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    providers.healthy().await;
    let env = test_env(db, &telegram, &providers);
    let bot = spawn_bot(&env);
    wait_polling(&telegram).await;
    telegram.hang("SendMessage");
    telegram.push_update(text_update(33, 1, "/help"));
    support::wait_until(
        "the /help reply to hang",
        Duration::from_secs(30),
        || async { telegram.hung().iter().any(|m| m == "SendMessage") },
    )
    .await;
    (telegram, providers, env, bot)
}

/// An entry queued behind its own chat's handler — a command whose reply Telegram does
/// not answer — waits for as long as that lasts, but in the inbox, committed: a crash
/// meanwhile loses nothing (the next start handles it), and other chats' entries go on
/// being taken.
#[tokio::test]
async fn an_entry_held_behind_its_chats_stuck_reply_waits_in_the_inbox_and_survives_a_kill() {
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let (telegram, _providers, env, mut first) = a_chat_stuck_on_its_reply(&db).await;
    let held = telegram.push_update(text_update(33, 2, "An entry behind the stuck reply."));
    telegram.push_update(text_update(34, 1, "Another chat's evening."));
    let pool = sqlx::SqlitePool::connect(&db).await.expect("db");
    let stored = |chat: i64| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM day_logs WHERE chat_id = ?1")
                .bind(chat)
                .fetch_one(&pool)
                .await
                .expect("count")
        }
    };
    support::wait_until(
        "the other chat's entry to be stored",
        Duration::from_secs(20),
        || {
            let stored = &stored;
            async move { stored(34).await == 1 }
        },
    )
    .await;
    assert_eq!(stored(33).await, 0, "still behind the stuck reply");
    let in_inbox: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM updates WHERE update_id = ?1 AND handled_at IS NULL AND payload IS NOT NULL",
    )
    .bind(held)
    .fetch_one(&pool)
    .await
    .expect("inbox");
    assert!(
        telegram.confirmed_below() <= held || in_inbox == 1,
        "the held entry was confirmed (below {}) while only in memory",
        telegram.confirmed_below()
    );
    first.kill().expect("kill -9");
    let _ = first.wait();

    // Second life: Telegram answers again and gives the held entry again.
    telegram.unhang("SendMessage");
    let mut second = spawn_bot(&env);
    support::wait_until(
        "the held entry to be answered",
        Duration::from_secs(30),
        || async { telegram.sent_to(33).iter().any(|c| c.reply_to() == Some(2)) },
    )
    .await;
    assert_eq!(stored(33).await, 1);
    pool.close().await;
    signal(&second, "TERM");
    assert_eq!(
        wait_exit(&mut second, Duration::from_secs(15)).await.code(),
        Some(0)
    );
}

/// A held update must not stop the bot from seeing new ones: once a whole batch
/// behind it has been handed out before, the hold gives up (confirms it anyway) rather
/// than ask for the same hundred updates for ever.
#[tokio::test]
async fn a_hold_behind_a_full_batch_gives_up_and_new_updates_still_come() {
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let (telegram, _providers, _env, mut bot) = a_chat_stuck_on_its_reply(&db).await;
    let held = telegram.push_update(text_update(33, 2, "An entry behind the stuck reply."));
    // More than a batch of other chats' entries behind it, then one more.
    for chat in 0..120 {
        telegram.push_update(text_update(1000 + chat, 1, "A busy evening for everyone."));
    }
    let pool = sqlx::SqlitePool::connect(&db).await.expect("db");
    support::wait_until(
        "every other chat's entry to be stored",
        Duration::from_secs(30),
        || async {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM day_logs WHERE chat_id >= 1000")
                .fetch_one(&pool)
                .await
                .expect("count")
                == 120
        },
    )
    .await;
    let stored_held: i64 = sqlx::query_scalar("SELECT count(*) FROM day_logs WHERE chat_id = 33")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(
        stored_held, 0,
        "the others came while the held entry still waited (not once its reply timed out)"
    );
    telegram.wait_confirmed(held).await;
    pool.close().await;
    let _ = bot.kill();
    let _ = bot.wait();
}

#[tokio::test]
async fn daylog_chat_runs_the_pipeline_in_a_terminal_without_a_token() {
    use std::io::Write as _;
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    providers.healthy().await;
    let mut env = test_env(&db, &telegram, &providers);
    env.remove("TELOXIDE_TOKEN");
    let mut chat = Command::new(env!("CARGO_BIN_EXE_daylog"))
        .args(["chat", "--user", "5"])
        .current_dir(dir.path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(&env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("chat starts");
    let mut stdin = chat.stdin.take().expect("stdin");
    stdin
        .write_all(b"Long walk, slept 8 hours.\n/history\n/export\n/nonsense\n")
        .expect("write");
    drop(stdin); // EOF ends the chat
    let output = tokio::task::spawn_blocking(move || chat.wait_with_output())
        .await
        .expect("join")
        .expect("output");
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{out}");
    assert!(out.contains(ANALYSIS_TEXT), "{out}");
    assert!(out.contains("Long walk, slept 8 hours."), "history: {out}");
    assert!(out.contains("daylog-export.csv"), "{out}");
    assert!(out.contains("/help"), "unknown command answered: {out}");
    assert!(dir.path().join("daylog-export.csv").exists());
    assert!(!out.contains("<b>"), "plain text in a terminal");
}

/// Issue 9 item 8: `daylog chat` as a new user first runs it, with no key and no
/// `RUST_LOG`: the reply says what is true (no AI provider has a key, the entry is saved,
/// which key to add), counts agree with their numbers, and no log line reaches the
/// terminal, on stdout or stderr.
#[tokio::test]
async fn daylog_chat_with_no_key_says_so_and_keeps_log_lines_off_the_terminal() {
    use std::io::Write as _;
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    let mut env = test_env(&db, &telegram, &providers);
    for name in [
        "TELOXIDE_TOKEN",
        "RUST_LOG",
        "MISTRAL_API_KEY",
        "GEMINI_API_KEY",
        "GROQ_API_KEY",
    ] {
        env.remove(name);
    }
    let mut chat = Command::new(env!("CARGO_BIN_EXE_daylog"))
        .arg("chat")
        .current_dir(dir.path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(&env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chat starts");
    let mut stdin = chat.stdin.take().expect("stdin");
    stdin
        .write_all(b"A first day with daylog.\n/delete\nyes\n")
        .expect("write");
    drop(stdin); // EOF ends the chat
    let output = tokio::task::spawn_blocking(move || chat.wait_with_output())
        .await
        .expect("join")
        .expect("output");
    let out = String::from_utf8_lossy(&output.stdout);
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{out}\n{err}");
    let english = daylog::texts::Texts(daylog::language::Language::En);
    assert!(
        out.contains(&english.saved_no_provider("MISTRAL_API_KEY")),
        "{out}"
    );
    assert!(!out.contains(english.saved_pending()), "{out}");
    assert!(out.contains("Done: 1 entry and"), "{out}");
    for level in ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"] {
        assert!(!out.contains(level), "a log line on stdout: {out}");
    }
    assert!(err.trim().is_empty(), "log lines on the terminal: {err}");
}

/// Once-only answers: a crash after the analysis is stored and before any reply reached the
/// user. Telegram answers `sendMessage` with 500, so nothing can reach the user; the bot
/// is killed (-9) once the log is 'analyzed' with `replied_at` NULL and its reply has
/// been refused, then restarted against a healthy Telegram: the stored analysis is sent,
/// once, and nothing is analysed again.
#[tokio::test]
async fn a_crash_after_the_analysis_and_before_any_reply_is_answered_once_after_restart() {
    const REFUSALS: usize = 10;
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}/daylog.db", dir.path().display());

    // First life: the providers answer, Telegram refuses every message to chat 32 (more
    // refusals than the first life lives to ask for: teloxide waits 10 s after a 5xx).
    let broken = FakeTelegram::start().await;
    for _ in 0..REFUSALS {
        broken.fail_next(
            "SendMessage",
            Some(32),
            500,
            serde_json::json!({"ok": false, "error_code": 500, "description": "Internal Server Error"}),
        );
    }
    let providers = Providers::start().await;
    providers.healthy().await;
    let mut first = spawn_bot(&test_env(&db, &broken, &providers));
    wait_polling(&broken).await;
    broken.push_update(text_update(32, 1, "Analysed, never answered."));

    // Bounded wait for the moment: analysis stored, reply refused, nothing delivered.
    let pool = sqlx::SqlitePool::connect(&db).await.expect("db");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let row: Option<(String, Option<String>)> =
            sqlx::query_as("SELECT status, replied_at FROM day_logs WHERE chat_id = 32")
                .fetch_optional(&pool)
                .await
                .expect("poll");
        let stored = matches!(&row, Some((status, None)) if status == "analyzed");
        if stored && broken.failures_left() < REFUSALS {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never reached 'analysed, reply refused': {row:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    pool.close().await;
    first.kill().expect("kill -9");
    let _ = first.wait();
    assert!(broken.sent_to(32).is_empty(), "nothing reached the user");

    // Second life: a healthy Telegram; the worker finds the log at start-up.
    let telegram = FakeTelegram::start().await;
    let fresh = Providers::start().await;
    fresh.healthy().await;
    let mut second = spawn_bot(&test_env(&db, &telegram, &fresh));
    let sent = telegram.wait_sent(32, 1).await;
    assert!(sent[0].text().contains(ANALYSIS_TEXT), "{}", sent[0].text());
    assert_eq!(sent[0].reply_to(), Some(1));
    let pool = sqlx::SqlitePool::connect(&db).await.expect("db");
    support::wait_until(
        "the reply to be recorded",
        Duration::from_secs(20),
        || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM day_logs WHERE chat_id = 32 AND replied_at IS NOT NULL",
            )
            .fetch_one(&pool)
            .await
            .expect("count")
                == 1
        },
    )
    .await;
    pool.close().await;
    signal(&second, "TERM");
    assert_eq!(
        wait_exit(&mut second, Duration::from_secs(15)).await.code(),
        Some(0)
    );

    // The bot has exited: what it sent is final.
    assert_eq!(telegram.sent_to(32).len(), 1, "answered exactly once");
    assert_eq!(
        fresh.analysis_requests().await
            + fresh
                .groq
                .received_requests()
                .await
                .expect("recording on")
                .len(),
        0,
        "the stored analysis is sent, not made again"
    );
}

/// Docker's stop timeout: a stop must be done by then, whatever the Bot API does. The
/// test bot's grace is far below it (3 s), so this is a hang guard, not a benchmark.
const DOCKER_STOP_TIMEOUT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn sigterm_while_the_bot_api_never_answers_exits_0() {
    // Arrange: a "Bot API" that accepts connections and never says a word.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/", silent.local_addr().expect("addr"));
    let (accepted, mut first_call) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            held.push(socket);
            let _ = accepted.send(());
        }
    });
    let dir = tempfile::tempdir().expect("dir");
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let mut env = test_env(&db, &telegram, &providers);
    env.insert("TELOXIDE_API_URL".into(), url);
    let mut bot = spawn_bot(&env);
    tokio::time::timeout(Duration::from_secs(30), first_call.recv())
        .await
        .expect("the bot calls the Bot API");

    // Act: stop it while getMe hangs.
    signal(&bot, "TERM");

    // Assert
    assert_eq!(
        wait_exit(&mut bot, DOCKER_STOP_TIMEOUT).await.code(),
        Some(0)
    );
}

#[tokio::test]
async fn sigterm_while_the_command_menu_hangs_exits_0() {
    let dir = tempfile::tempdir().expect("dir");
    let telegram = FakeTelegram::start().await;
    telegram.hang("SetMyCommands");
    let providers = Providers::start().await;
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let mut bot = spawn_bot(&test_env(&db, &telegram, &providers));
    support::wait_until("setMyCommands to hang", Duration::from_secs(30), || async {
        telegram.hung().iter().any(|m| m == "SetMyCommands")
    })
    .await;

    signal(&bot, "TERM");

    assert_eq!(
        wait_exit(&mut bot, DOCKER_STOP_TIMEOUT).await.code(),
        Some(0)
    );
}

#[tokio::test]
async fn passing_telegram_errors_at_start_are_retried_not_blamed_on_the_token() {
    // Arrange: getMe answers 502, 429 (retry after 1 s), 502, and then works.
    let dir = tempfile::tempdir().expect("dir");
    let telegram = FakeTelegram::start().await;
    let bad_gateway =
        serde_json::json!({"ok": false, "error_code": 502, "description": "Bad Gateway"});
    telegram.fail_next("GetMe", None, 502, bad_gateway.clone());
    telegram.fail_next(
        "GetMe",
        None,
        429,
        serde_json::json!({"ok": false, "error_code": 429,
            "description": "Too Many Requests: retry after 1", "parameters": {"retry_after": 1}}),
    );
    telegram.fail_next("GetMe", None, 502, bad_gateway);
    let providers = Providers::start().await;
    let db = format!("sqlite://{}/daylog.db", dir.path().display());

    // Act
    let mut bot = spawn_bot(&test_env(&db, &telegram, &providers));

    // Assert: it gets through (teloxide itself waits 10 s after each 5xx) and polls.
    telegram
        .wait_for("the bot to start", Duration::from_secs(90), |calls| {
            calls.iter().any(|c| c.method == "SetMyCommands")
        })
        .await;
    let get_me = telegram
        .calls()
        .iter()
        .filter(|c| c.method == "GetMe")
        .count();
    assert_eq!(
        get_me, 1,
        "one successful getMe after the scripted failures"
    );
    signal(&bot, "TERM");
    assert_eq!(
        wait_exit(&mut bot, DOCKER_STOP_TIMEOUT).await.code(),
        Some(0)
    );
}

/// A second program polling with the same token (Telegram answers 409) is named in a
/// sentence that says what to do, not a Debug dump; polling goes on and entries come in.
#[tokio::test]
async fn another_program_polling_the_same_token_is_said_in_a_sentence() {
    let dir = tempfile::tempdir().expect("dir");
    let telegram = FakeTelegram::start().await;
    telegram.fail_next(
        "GetUpdates",
        None,
        409,
        serde_json::json!({"ok": false, "error_code": 409,
            "description": "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running"}),
    );
    let providers = Providers::start().await;
    providers.healthy().await;
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let log = dir.path().join("bot.log");

    let mut bot = support::spawn_daylog(&test_env(&db, &telegram, &providers), &log);
    telegram.push_update(text_update(7, 1, "A quiet day."));
    telegram.wait_sent(7, 1).await;

    let said = std::fs::read_to_string(&log).expect("log");
    assert!(
        said.contains("another program is polling Telegram with this TELOXIDE_TOKEN"),
        "{said}"
    );
    assert!(!said.contains("TerminatedByOtherGetUpdates"), "{said}");
    signal(&bot, "TERM");
    assert_eq!(
        wait_exit(&mut bot, DOCKER_STOP_TIMEOUT).await.code(),
        Some(0)
    );
}

#[tokio::test]
async fn a_refused_token_ends_start_up_with_exit_1() {
    let dir = tempfile::tempdir().expect("dir");
    let telegram = FakeTelegram::start().await;
    telegram.fail_next(
        "GetMe",
        None,
        401,
        serde_json::json!({"ok": false, "error_code": 401, "description": "Unauthorized"}),
    );
    let providers = Providers::start().await;
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let log = dir.path().join("bot.log");

    let mut bot = support::spawn_daylog(&test_env(&db, &telegram, &providers), &log);

    assert_eq!(
        wait_exit(&mut bot, Duration::from_secs(30)).await.code(),
        Some(1)
    );
    let said = support::tail(&log, 5);
    assert!(said.contains("TELOXIDE_TOKEN"), "{said}");
}

#[tokio::test]
async fn two_terminals_on_one_database_lose_nothing() {
    use std::io::Write as _;
    const LINES: usize = 20;
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    providers.healthy().await;
    let mut env = test_env(&db, &telegram, &providers);
    env.remove("TELOXIDE_TOKEN");
    let daylog = |args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_daylog"));
        command
            .args(args)
            .current_dir(dir.path())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(&env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        command
    };
    assert!(
        daylog(&["migrate"])
            .stdin(Stdio::null())
            .status()
            .expect("migrate")
            .success()
    );

    // Act: two terminals of the same user, typing at the same time.
    let mut chats: Vec<Child> = (0..2)
        .map(|_| {
            daylog(&["chat", "--user", "7"])
                .spawn()
                .expect("chat starts")
        })
        .collect();
    for (n, chat) in chats.iter_mut().enumerate() {
        let mut stdin = chat.stdin.take().expect("stdin");
        let lines: String = (0..LINES)
            .map(|i| format!("Terminal {n}, entry {i}.\n"))
            .collect();
        std::thread::spawn(move || {
            let _ = stdin.write_all(lines.as_bytes());
        });
    }
    for chat in chats {
        let output = tokio::task::spawn_blocking(move || chat.wait_with_output())
            .await
            .expect("join")
            .expect("output");
        assert!(output.status.success());
    }

    // Assert: every line is stored, each under its own message id.
    let pool = sqlx::SqlitePool::connect(&db).await.expect("db");
    let (rows, ids): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT message_id) FROM day_logs WHERE user_id = 7",
    )
    .fetch_one(&pool)
    .await
    .expect("count");
    assert_eq!((rows, ids), (2 * LINES as i64, 2 * LINES as i64));
}

#[tokio::test]
async fn sigterm_while_replies_and_polling_hang_exits_0_and_the_entry_waits_for_the_next_start() {
    // Arrange: Telegram answers start-up, then hangs every send and the next poll.
    let dir = tempfile::tempdir().expect("dir");
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    providers.healthy().await;
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let mut bot = spawn_bot(&test_env(&db, &telegram, &providers));
    wait_polling(&telegram).await;
    telegram.hang("SendMessage");
    telegram.push_update(text_update(61, 1, "An entry whose answer hangs."));
    support::wait_until("the reply to hang", Duration::from_secs(30), || async {
        telegram.hung().iter().any(|m| m == "SendMessage")
    })
    .await;
    telegram.hang("GetUpdates");

    // Act
    signal(&bot, "TERM");

    // Assert: out within the grace, the entry stored and owed its answer.
    assert_eq!(
        wait_exit(&mut bot, DOCKER_STOP_TIMEOUT).await.code(),
        Some(0)
    );
    let pool = sqlx::SqlitePool::connect(&db).await.expect("db");
    let (status, replied): (String, Option<String>) =
        sqlx::query_as("SELECT status, replied_at FROM day_logs WHERE chat_id = 61")
            .fetch_one(&pool)
            .await
            .expect("row");
    assert_eq!((status.as_str(), replied), ("analyzed", None));
}
