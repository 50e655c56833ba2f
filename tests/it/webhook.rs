//! Webhook mode on the real `daylog run` binary, with the fake Bot API posting updates
//! to it as Telegram does (the secret header, one chat at a time, again after a
//! non-2xx): the door's refusals and what they leave stored, dead letters, duplicates,
//! a kill -9 right after the 2xx, a full disk, per-chat order, SIGTERM, `setWebhook`'s
//! parameters and never a `deleteWebhook`, the configuration refusals, `doctor`, and
//! polling's start-up removing a webhook left set.

#![expect(
    clippy::expect_used,
    reason = "helpers outside #[test] fns fail loudly by design"
)]

use crate::support;

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use sqlx::Connection as _;
use support::telegram::text_update;
use support::{Backend, FakeTelegram, Providers, signal, test_env, wait_exit};

const SECRET: &str = "Webhook-test_secret-0123456789";
const PATH: &str = "/telegram/hook";
/// A guard against hangs, never a measurement.
const HANG_GUARD: Duration = Duration::from_secs(30);

/// A free port on loopback (the webhook URL is given before the bot binds it).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// The bot's environment in webhook mode on `port`.
fn webhook_env(
    db: &str,
    telegram: &FakeTelegram,
    providers: &Providers,
    port: u16,
) -> HashMap<String, String> {
    let mut env = test_env(db, telegram, providers);
    env.insert("DAYLOG__TELEGRAM__MODE".into(), "webhook".into());
    env.insert("DAYLOG__HTTP__LISTEN".into(), format!("127.0.0.1:{port}"));
    env.insert(
        "DAYLOG__TELEGRAM__WEBHOOK_URL".into(),
        format!("http://127.0.0.1:{port}{PATH}"),
    );
    env.insert("TELEGRAM_WEBHOOK_SECRET".into(), SECRET.into());
    env
}

/// A webhook-mode bot and what a test needs around it.
struct Hook {
    bot: support::Bot,
    env: HashMap<String, String>,
    port: u16,
    db: String,
    backend: Backend,
    _dir: tempfile::TempDir,
    _fresh: Option<support::FreshDb>,
}

impl Hook {
    async fn start(telegram: &FakeTelegram, providers: &Providers) -> Self {
        Self::start_with(telegram, providers, |_| {}).await
    }

    async fn start_with(
        telegram: &FakeTelegram,
        providers: &Providers,
        configure: impl FnOnce(&mut HashMap<String, String>),
    ) -> Self {
        Self::start_on(Backend::Sqlite, telegram, providers, configure).await
    }

    /// A webhook-mode bot on a fresh database of `backend`.
    async fn start_on(
        backend: Backend,
        telegram: &FakeTelegram,
        providers: &Providers,
        configure: impl FnOnce(&mut HashMap<String, String>),
    ) -> Self {
        let dir = tempfile::tempdir().expect("dir");
        let (db, fresh) = match backend {
            Backend::Sqlite => (format!("sqlite://{}/daylog.db", dir.path().display()), None),
            Backend::Postgres => {
                let fresh = backend.fresh().await;
                (fresh.url.clone(), Some(fresh))
            }
        };
        let port = free_port();
        let mut env = webhook_env(&db, telegram, providers, port);
        env.insert(support::LOG_DIR.into(), dir.path().display().to_string());
        configure(&mut env);
        let bot = support::spawn_daylog(&env, &support::bot_log_path(&env));
        let hook = Self {
            bot,
            env,
            port,
            db,
            backend,
            _dir: dir,
            _fresh: fresh,
        };
        hook.wait_ready().await;
        hook
    }

    /// Starts the bot again on the same database and port.
    async fn restart(&mut self) {
        self.bot = support::spawn_daylog(&self.env, &support::bot_log_path(&self.env));
        self.wait_ready().await;
    }

    async fn wait_ready(&self) {
        let url = format!("http://127.0.0.1:{}/readyz", self.port);
        let deadline = tokio::time::Instant::now() + HANG_GUARD;
        loop {
            if get_status(&url).await == 200 {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "webhook mode never became ready:\n{}",
                support::tail(&support::bot_log_path(&self.env), 30)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Posts `body` to the webhook as Telegram would (or would not) with `secret`.
    async fn post(&self, secret: Option<&str>, body: Vec<u8>) -> u16 {
        let mut request = reqwest::Client::new()
            .post(self.url(PATH))
            .header("content-type", "application/json")
            .body(body)
            .timeout(HANG_GUARD);
        if let Some(secret) = secret {
            request = request.header("X-Telegram-Bot-Api-Secret-Token", secret);
        }
        request.send().await.map_or(0, |r| r.status().as_u16())
    }

    /// The one integer `sql` gives on the bot's database (a text both dialects read).
    async fn count(&self, sql: &str) -> i64 {
        let raw = support::Raw::connect(&self.db).await;
        let n = raw.value::<i64>(sql).await;
        raw.close().await;
        n
    }

    fn log(&self) -> String {
        std::fs::read_to_string(support::bot_log_path(&self.env)).unwrap_or_default()
    }
}

async fn get_status(url: &str) -> u16 {
    reqwest::Client::new()
        .get(url)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .map_or(0, |r| r.status().as_u16())
}

/// A text update with its own `update_id`, as a raw body (for posts the test makes
/// itself rather than through the fake).
fn raw_update(update_id: i64, chat: i64, message_id: i64, text: &str) -> Vec<u8> {
    let mut update = text_update(chat, message_id, text);
    update["update_id"] = json!(update_id);
    serde_json::to_vec(&update).expect("json")
}

/// The `(min update_id, count)` of dead letters.
async fn dead_letters(hook: &Hook) -> (i64, i64) {
    (
        hook.count("SELECT coalesce(min(update_id), 0) FROM updates WHERE dead = 1")
            .await,
        hook.count("SELECT count(*) FROM updates WHERE dead = 1")
            .await,
    )
}

/// On each backend.
#[tokio::test]
async fn the_door_refuses_before_reading_and_a_garbage_body_is_a_dead_letter() {
    for backend in support::backends() {
        the_door_refuses_on(backend).await;
    }
}

async fn the_door_refuses_on(backend: Backend) {
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    providers.healthy().await;
    let hook = Hook::start_on(backend, &telegram, &providers, |_| {}).await;
    let update = || raw_update(9_001, 501, 1, "A walk by the river.");

    assert_eq!(hook.post(None, update()).await, 401);
    assert_eq!(
        hook.post(Some("Webhook-test_secret-012345678"), update())
            .await,
        401
    );
    assert_eq!(hook.post(Some(&format!("{SECRET}x")), update()).await, 401);
    let get = reqwest::Client::new()
        .get(hook.url(PATH))
        .header("X-Telegram-Bot-Api-Secret-Token", SECRET)
        .send()
        .await
        .expect("answers");
    assert_eq!(get.status().as_u16(), 405);
    let mut big = b"{\"update_id\": 9002, \"message\": \"".to_vec();
    big.resize(1024 * 1024 + 16, b'x');
    assert_eq!(hook.post(Some(SECRET), big).await, 413);
    assert_eq!(hook.count("SELECT count(*) FROM updates").await, 0);
    assert_eq!(hook.count("SELECT count(*) FROM day_logs").await, 0);
    assert!(telegram.sent_to(501).is_empty());

    // With the secret, what is not an update is kept as a dead letter and answered 200.
    for garbage in [
        b"not json at all".to_vec(),
        b"{\"no_update_id\": true}".to_vec(),
    ] {
        assert_eq!(hook.post(Some(SECRET), garbage).await, 200);
    }
    let (lowest, dead) = dead_letters(&hook).await;
    assert_eq!(dead, 2, "{}", hook.backend);
    assert!(lowest < 0, "a dead letter's id is negative: {lowest}");
    assert_eq!(hook.count("SELECT count(*) FROM day_logs").await, 0);

    // And the next real update is handled.
    assert_eq!(hook.post(Some(SECRET), update()).await, 200);
    telegram.wait_sent(501, 1).await;
    assert_eq!(hook.count("SELECT count(*) FROM day_logs").await, 1);
    // The secret is nowhere in what the bot said.
    assert!(!hook.log().contains(SECRET));
}

/// On each backend.
#[tokio::test]
async fn an_update_delivered_twice_is_handled_once() {
    for backend in support::backends() {
        an_update_delivered_twice_on(backend).await;
    }
}

async fn an_update_delivered_twice_on(backend: Backend) {
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    providers.healthy().await;
    let hook = Hook::start_on(backend, &telegram, &providers, |_| {}).await;
    let update = || raw_update(7_001, 502, 11, "Baked bread with my daughter.");
    assert_eq!(hook.post(Some(SECRET), update()).await, 200);
    assert_eq!(hook.post(Some(SECRET), update()).await, 200);
    telegram.wait_sent(502, 1).await;
    // A third delivery after the answer went out changes nothing either.
    assert_eq!(hook.post(Some(SECRET), update()).await, 200);
    // The next entry's answer proves the duplicates were seen and passed over.
    assert_eq!(
        hook.post(Some(SECRET), raw_update(7_002, 502, 12, "Then a nap."))
            .await,
        200
    );
    let sent = telegram.wait_sent(502, 2).await;
    assert_eq!(
        sent.iter().filter(|c| c.reply_to() == Some(11)).count(),
        1,
        "{sent:?}"
    );
    assert_eq!(hook.count("SELECT count(*) FROM day_logs").await, 2);
    assert_eq!(
        hook.count("SELECT count(*) FROM updates").await,
        2,
        "{}",
        hook.backend
    );
}

#[tokio::test]
async fn set_webhook_at_start_and_sigterm_answers_503_exits_0_and_never_deletes_it() {
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    // Slow analyses: the stop comes while one is in flight. A grace far above them, so
    // that a busy machine does not decide whether it is answered before the exit.
    providers.slow(Duration::from_millis(1500)).await;
    let mut hook = Hook::start_with(&telegram, &providers, |env| {
        env.insert("DAYLOG__TELEGRAM__SHUTDOWN_GRACE_MS".into(), "15000".into());
    })
    .await;
    let set: Vec<Value> = telegram
        .calls()
        .into_iter()
        .filter(|c| c.method == "SetWebhook")
        .map(|c| c.body)
        .collect();
    assert_eq!(set.len(), 1, "{set:?}");
    let set = &set[0];
    // teloxide sends setWebhook as multipart (it may carry a certificate): every field
    // is text there, `allowed_updates` a JSON array in it.
    let text = |key: &str| match &set[key] {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    assert_eq!(text("url"), hook.url(PATH));
    assert_eq!(text("secret_token"), SECRET);
    assert_eq!(text("max_connections"), "40");
    assert_eq!(text("drop_pending_updates"), "false");
    let kinds: Value = serde_json::from_str(&text("allowed_updates")).expect("a JSON list");
    let mut kinds: Vec<&str> = kinds
        .as_array()
        .expect("allowed_updates")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    kinds.sort_unstable();
    assert_eq!(kinds, ["callback_query", "edited_message", "message"]);
    // Webhook mode never polls (Telegram would answer 409).
    assert!(!telegram.calls().iter().any(|c| c.method == "GetUpdates"));

    let id = telegram.push_update(text_update(503, 21, "A long day at the workshop."));
    telegram.wait_delivered(id).await;
    // The analysis is under way; stop now.
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while providers.analysis_requests().await == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "analysis never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    signal(&hook.bot, "TERM");
    // The signal arrives when it arrives: from then on /readyz says 503.
    let readyz = hook.url("/readyz");
    support::wait_until("/readyz to say 503", HANG_GUARD, || {
        let readyz = readyz.clone();
        async move { get_status(&readyz).await == 503 }
    })
    .await;
    assert_eq!(
        hook.post(Some(SECRET), raw_update(8_001, 504, 1, "Too late?"))
            .await,
        503
    );
    let status = wait_exit(&mut hook.bot, HANG_GUARD).await;
    assert_eq!(status.code(), Some(0), "{}", hook.log());
    // The entry in flight was answered before the exit.
    assert_eq!(telegram.sent_to(503).len(), 1);
    // The update refused with 503 was not stored: Telegram delivers it again.
    assert_eq!(
        hook.count("SELECT count(*) FROM updates WHERE update_id = 8001")
            .await,
        0
    );
    assert!(
        !telegram.calls().iter().any(|c| c.method == "DeleteWebhook"),
        "a stopping instance never deletes the webhook"
    );
    assert!(!hook.log().contains(SECRET));
    // Not restarted: the webhook stays registered for whoever serves it next.
    assert_eq!(telegram.webhook_url(), Some(hook.url(PATH)));
}

/// On each backend.
#[tokio::test]
async fn a_kill_9_right_after_the_2xx_loses_nothing() {
    for backend in support::backends() {
        a_kill_9_after_the_2xx_on(backend).await;
    }
}

async fn a_kill_9_after_the_2xx_on(backend: Backend) {
    let telegram = FakeTelegram::start().await;
    let slow = Providers::start().await;
    // The first life never gets an answer out: the analysis outlasts it.
    slow.slow(Duration::from_secs(20)).await;
    let mut hook = Hook::start_on(backend, &telegram, &slow, |_| {}).await;
    let id = telegram.push_update(text_update(505, 31, "Finished the quilt at last."));
    telegram.wait_delivered(id).await;
    signal(&hook.bot, "KILL");
    let _ = wait_exit(&mut hook.bot, HANG_GUARD).await;
    // Telegram forgets an update it got a 2xx for: only the inbox has it now.
    assert_eq!(
        hook.count(&format!(
            "SELECT count(*) FROM updates WHERE update_id = {id}"
        ))
        .await,
        1
    );
    let healthy = Providers::start().await;
    healthy.healthy().await;
    for (key, value) in test_env(&hook.db, &telegram, &healthy) {
        if key.starts_with("DAYLOG__PROVIDERS__") {
            hook.env.insert(key, value);
        }
    }
    hook.restart().await;
    let backend = hook.backend;
    telegram
        .wait_for(
            &format!("{backend}: the entry's answer"),
            HANG_GUARD,
            |calls| {
                calls.iter().any(|c| {
                    c.method == "SendMessage"
                        && c.chat_id() == Some(505)
                        && c.text().contains("You sound tired")
                })
            },
        )
        .await;
    // Posted once: the fake never needed to deliver it again.
    assert_eq!(
        telegram
            .webhook_posts()
            .iter()
            .filter(|(u, s)| *u == id && *s == 200)
            .count(),
        1
    );
    assert_eq!(hook.count("SELECT count(*) FROM day_logs").await, 1);
}

/// Someone else's data in the same file, up to the bot's quota (`store.max_size_mb`).
/// The inbox's table gets a row of another bot first, half a page, so that the next
/// large update needs a page of its own: there is none.
async fn fill_store(db: &str) {
    let mut conn = sqlx::SqliteConnection::connect(db)
        .await
        .expect("filler connection");
    sqlx::query(
        "INSERT INTO updates (bot_id, update_id, handled_at, payload) VALUES (999, 1, datetime('now'), printf('%.2000c', 'x'))",
    )
    .execute(&mut conn)
    .await
    .expect("another bot's row");
    let page_size: i64 = sqlx::query_scalar("PRAGMA page_size")
        .fetch_one(&mut conn)
        .await
        .expect("page size");
    let pages = 1024 * 1024 / page_size;
    sqlx::query(&format!("PRAGMA max_page_count = {pages}"))
        .execute(&mut conn)
        .await
        .expect("quota");
    sqlx::query("CREATE TABLE IF NOT EXISTS test_filler (id INTEGER PRIMARY KEY, b BLOB)")
        .execute(&mut conn)
        .await
        .expect("filler table");
    while sqlx::query("INSERT INTO test_filler (b) VALUES (zeroblob(?1))")
        .bind(page_size / 2)
        .execute(&mut conn)
        .await
        .is_ok()
    {}
    conn.close().await.expect("close");
}

async fn empty_store(db: &str) {
    let mut conn = sqlx::SqliteConnection::connect(db)
        .await
        .expect("filler connection");
    sqlx::query("DELETE FROM test_filler")
        .execute(&mut conn)
        .await
        .expect("empty the filler");
    conn.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_answers_5xx_says_not_saved_yet_once_and_takes_the_redelivery() {
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    providers.healthy().await;
    let hook = Hook::start_with(&telegram, &providers, |env| {
        env.insert("DAYLOG__STORE__MAX_SIZE_MB".into(), "1".into());
    })
    .await;
    fill_store(&hook.db).await;
    // A long entry (within Telegram's 4096 characters): it cannot fit in what is left
    // of a page.
    let id = telegram.push_update(text_update(506, 41, &"Planted tulips. ".repeat(220)));
    // Refused more than once while the disk is full: Telegram keeps trying.
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while telegram
        .webhook_posts()
        .iter()
        .filter(|(u, s)| *u == id && *s >= 500)
        .count()
        < 3
    {
        assert!(tokio::time::Instant::now() < deadline, "never refused");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!telegram.delivered(id));
    empty_store(&hook.db).await;
    telegram.wait_delivered(id).await;
    telegram
        .wait_for("the entry's answer", HANG_GUARD, |calls| {
            calls.iter().any(|c| {
                c.method == "SendMessage"
                    && c.chat_id() == Some(506)
                    && c.text().contains("You sound tired")
            })
        })
        .await;
    let not_yet = telegram
        .sent_to(506)
        .iter()
        .filter(|c| c.text().contains("No need to send it again"))
        .count();
    assert_eq!(not_yet, 1, "{:?}", telegram.sent_to(506));
    assert_eq!(hook.count("SELECT count(*) FROM day_logs").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_keep_each_chats_order_under_webhook_delivery() {
    const CHATS: i64 = 6;
    const PER_CHAT: i64 = 4;
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    providers
        .jittery(
            0x5EB_400C,
            Duration::from_millis(5),
            Duration::from_millis(120),
            0,
        )
        .await;
    let hook = Hook::start(&telegram, &providers).await;
    for n in 1..=PER_CHAT {
        for chat in 0..CHATS {
            telegram.push_update(text_update(
                600 + chat,
                n,
                &format!("Entry {n} of chat {chat}."),
            ));
        }
    }
    for chat in 0..CHATS {
        let sent = telegram
            .wait_for(
                &format!("{PER_CHAT} answers in chat {}", 600 + chat),
                Duration::from_secs(60),
                |calls| {
                    calls
                        .iter()
                        .filter(|c| {
                            c.method == "SendMessage"
                                && c.chat_id() == Some(600 + chat)
                                && c.reply_to().is_some()
                        })
                        .count()
                        >= PER_CHAT as usize
                },
            )
            .await;
        let replied: Vec<i64> = sent
            .iter()
            .filter(|c| c.method == "SendMessage" && c.chat_id() == Some(600 + chat))
            .filter_map(support::telegram::Call::reply_to)
            .collect();
        assert_eq!(replied, (1..=PER_CHAT).collect::<Vec<_>>(), "chat {chat}");
    }
    assert_eq!(
        hook.count("SELECT count(*) FROM day_logs").await,
        CHATS * PER_CHAT
    );
}

#[tokio::test]
async fn updates_received_are_counted_in_metrics() {
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    providers.healthy().await;
    let metrics_port = free_port();
    let hook = Hook::start_with(&telegram, &providers, |env| {
        env.insert(
            "DAYLOG__HTTP__METRICS_LISTEN".into(),
            format!("127.0.0.1:{metrics_port}"),
        );
    })
    .await;
    let received = || async move {
        let body = reqwest::get(format!("http://127.0.0.1:{metrics_port}/metrics"))
            .await
            .expect("scrape")
            .text()
            .await
            .expect("body");
        let lines = body.lines().map(|l| Ok(l.to_owned()));
        let parsed = prometheus_parse::Scrape::parse(lines).expect("Prometheus text");
        parsed
            .samples
            .iter()
            .filter(|s| s.metric == "daylog_updates_received_total")
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
                _ => 0.0,
            })
            .sum::<f64>()
    };
    let before = received().await;
    assert_eq!(
        hook.post(Some(SECRET), raw_update(4_001, 507, 1, "Counted."))
            .await,
        200
    );
    assert_eq!(hook.post(Some(SECRET), b"garbage".to_vec()).await, 200);
    telegram.wait_sent(507, 1).await;
    let after = received().await;
    assert!(after - before >= 2.0, "{before} → {after}");
}

/// `daylog run` with `env` only; its exit code and stderr.
fn run_refused(env: &[(&str, &str)]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_daylog"))
        .arg("run")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DATABASE_URL", "sqlite://unused/never-opened.db")
        .env("TELOXIDE_TOKEN", support::telegram::TOKEN)
        .envs(env.iter().copied())
        .output()
        .expect("daylog runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout),
    )
}

#[test]
fn bad_webhook_configuration_exits_2_with_a_sentence_that_never_shows_the_secret() {
    let whole = [
        ("DAYLOG__TELEGRAM__MODE", "webhook"),
        ("DAYLOG__HTTP__LISTEN", "127.0.0.1:0"),
        (
            "DAYLOG__TELEGRAM__WEBHOOK_URL",
            "https://bot.example.org/hook",
        ),
        ("TELEGRAM_WEBHOOK_SECRET", SECRET),
    ];
    let without = |key: &str| -> Vec<(&str, &str)> {
        whole.iter().copied().filter(|(k, _)| *k != key).collect()
    };
    let with = |key: &'static str, value: &'static str| -> Vec<(&'static str, &'static str)> {
        let mut env: Vec<(&str, &str)> = whole.iter().copied().filter(|(k, _)| *k != key).collect();
        env.push((key, value));
        env
    };
    for (env, says) in [
        (without("DAYLOG__HTTP__LISTEN"), "http.listen"),
        (
            without("DAYLOG__TELEGRAM__WEBHOOK_URL"),
            "telegram.webhook_url",
        ),
        (
            without("TELEGRAM_WEBHOOK_SECRET"),
            "TELEGRAM_WEBHOOK_SECRET",
        ),
        (
            with("TELEGRAM_WEBHOOK_SECRET", "a secret with spaces!"),
            "TELEGRAM_WEBHOOK_SECRET",
        ),
        (
            with(
                "DAYLOG__TELEGRAM__WEBHOOK_URL",
                "http://bot.example.org/hook",
            ),
            "https",
        ),
        (
            with("DAYLOG__TELEGRAM__MAX_CONNECTIONS", "0"),
            "telegram.max_connections",
        ),
    ] {
        let (code, said) = run_refused(&env);
        assert_eq!(code, Some(2), "{env:?}: {said}");
        assert!(said.contains(says), "{env:?}: {said}");
        assert!(!said.contains(SECRET), "{said}");
        assert!(!said.contains("a secret with spaces!"), "{said}");
    }
}

#[tokio::test]
async fn doctor_warns_of_a_port_telegram_refuses_and_ping_shows_the_webhook_info() {
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    providers.healthy().await;
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let mut env = webhook_env(&db, &telegram, &providers, 8080);
    env.insert(
        "DAYLOG__TELEGRAM__WEBHOOK_URL".into(),
        "https://bot.example.org:8080/telegram/hook".into(),
    );
    telegram.set_webhook_as_if_elsewhere("https://bot.example.org:8080/telegram/hook");
    // Off the test's runtime, which serves the fakes meanwhile.
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_daylog"))
            .args(["doctor", "--ping"])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(&env)
            .output()
            .expect("doctor runs")
    })
    .await
    .expect("doctor");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("port 8080"), "{text}");
    assert!(
        text.contains("webhook: Telegram posts to https://bot.example.org:8080/telegram/hook"),
        "{text}"
    );
    assert!(text.contains("update(s) waiting"), "{text}");
    assert!(!text.contains(SECRET), "{text}");
    assert!(
        telegram
            .calls()
            .iter()
            .any(|c| c.method == "GetWebhookInfo"),
        "asked Telegram"
    );
}

#[tokio::test]
async fn polling_removes_a_webhook_left_set_and_says_which_setting_to_change() {
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    providers.healthy().await;
    telegram.set_webhook_as_if_elsewhere("https://bot.example.org/telegram/hook");
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let env = test_env(&db, &telegram, &providers);
    let log = support::bot_log_path(&env);
    let mut bot = support::spawn_daylog(&env, &log);
    let id = telegram.push_update(text_update(508, 1, "Polling again."));
    telegram.wait_sent(508, 1).await;
    assert!(
        telegram.calls().iter().any(|c| c.method == "DeleteWebhook"),
        "the webhook was removed"
    );
    assert!(telegram.confirmed_below() > id || telegram.webhook_url().is_none());
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(said.contains("telegram.mode"), "{said}");
    signal(&bot, "TERM");
    assert_eq!(wait_exit(&mut bot, HANG_GUARD).await.code(), Some(0));
}

/// On PostgreSQL another instance may be serving the webhook: polling start-up leaves it
/// set and refuses with a sentence naming `telegram.mode` (SQLite deletes it, above).
#[tokio::test]
async fn polling_on_postgres_refuses_a_webhook_left_set_and_leaves_it() {
    use support::postgres::{Backend, backends};
    if !backends().contains(&Backend::Postgres) {
        return; // said once by `backends()`; CI=true fails there
    }
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    providers.healthy().await;
    telegram.set_webhook_as_if_elsewhere("https://bot.example.org/telegram/hook");
    let db = Backend::Postgres.fresh().await;
    daylog::store::Store::open_and_migrate(&db.url, Duration::from_secs(5))
        .await
        .expect("migrated")
        .close()
        .await;
    let env = test_env(&db.url, &telegram, &providers);
    let dir = tempfile::tempdir().expect("dir");
    let log = dir.path().join("daylog-stderr.log");
    let mut bot = support::spawn_daylog(&env, &log);
    let status = wait_exit(&mut bot, HANG_GUARD).await;
    assert!(!status.success(), "{status:?}");
    assert!(
        !telegram.calls().iter().any(|c| c.method == "DeleteWebhook"),
        "the webhook is left alone"
    );
    assert!(telegram.webhook_url().is_some(), "still set");
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(said.contains("telegram.mode"), "{said}");
}

#[test]
fn the_compose_webhook_profile_puts_caddy_in_front_of_the_listener() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("docker-compose.yml")).expect("compose file");
    let compose: serde_yaml::Value = serde_yaml::from_str(&text).expect("valid YAML");
    let caddy = &compose["services"]["caddy"];
    assert_eq!(caddy["profiles"][0].as_str(), Some("webhook"));
    assert!(
        compose["services"]["daylog"]["profiles"].is_null(),
        "the bot runs in every profile"
    );
    let listen = compose["services"]["daylog"]["environment"]["DAYLOG__HTTP__LISTEN"]
        .as_str()
        .expect("the bot listens");
    let port = listen.rsplit(':').next().expect("a port");
    let caddyfile = std::fs::read_to_string(root.join("deploy/Caddyfile")).expect("Caddyfile");
    assert!(
        caddyfile.contains(&format!("reverse_proxy daylog:{port}")),
        "{caddyfile}"
    );
    assert!(caddyfile.contains("max_size 1MiB"), "{caddyfile}");
    let mounts = format!("{:?}", caddy["volumes"]);
    assert!(mounts.contains("./deploy/Caddyfile"), "{mounts}");
    let prometheus =
        std::fs::read_to_string(root.join("deploy/prometheus.yml")).expect("prometheus.yml");
    let scrape: serde_yaml::Value = serde_yaml::from_str(&prometheus).expect("valid YAML");
    assert_eq!(
        scrape["scrape_configs"][0]["metrics_path"].as_str(),
        Some("/metrics")
    );
}
