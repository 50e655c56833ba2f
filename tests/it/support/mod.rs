//! Test harness: a fresh database per test, fake providers (wiremock) and a fake
//! Telegram (axum) on 127.0.0.1, and the real bot running against them — in process
//! ([`App`]) or as the real binary ([`BotProcess`]).

// Harness code panics on broken fixtures by design; clippy's `allow-expect-in-tests`
// covers only `#[test]` functions, not the helpers they share.
#![expect(clippy::expect_used)]

pub mod browser;
pub mod cluster;
pub mod fill;
pub mod llm;
pub mod postgres;
pub mod telegram;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use daylog::config::Settings;
use daylog::store::Store;
use daylog::time::ManualClock;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use wiremock::matchers::{method, path, path_regex};
use wiremock::{Mock, MockServer, ResponseTemplate};

pub use postgres::{Backend, FreshDb, Raw, backends};
pub use telegram::FakeTelegram;

pub const ANALYSIS_TEXT: &str =
    "You sound tired but proud. Suggestion: go to bed at 23:00 tonight.";
pub const METRICS_JSON: &str = r#"{"mood":4,"stress":2,"energy":3,"productivity":4,"sleep_hours":6.5,"activities":["Run","work"],"emotions":["proud"],"summary":"A long run and a busy day."}"#;

/// An OpenAI-style chat completion body.
pub fn completion(text: &str) -> Value {
    json!({
        "id": "cmpl-1",
        "object": "chat.completion",
        "created": 1_764_460_800,
        "model": "test",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}
    })
}

/// A Gemini generateContent body.
pub fn gemini_completion(text: &str) -> Value {
    json!({
        "candidates": [{"content": {"role": "model", "parts": [{"text": text}]}, "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 10}
    })
}

/// The three providers of the default cascades, each its own server.
pub struct Providers {
    /// Analysis steps 1–2 (and the metrics fallback).
    pub mistral: MockServer,
    /// Analysis step 3.
    pub gemini: MockServer,
    /// Metrics step 1.
    pub groq: MockServer,
}

impl Providers {
    pub async fn start() -> Self {
        Self {
            mistral: MockServer::start().await,
            gemini: MockServer::start().await,
            groq: MockServer::start().await,
        }
    }

    /// Every provider answers at once.
    pub async fn healthy(&self) {
        self.answer_analysis(ANALYSIS_TEXT).await;
        self.answer_metrics(METRICS_JSON).await;
    }

    pub async fn answer_analysis(&self, text: &str) {
        Mock::given(method("POST"))
            .and(path("/v1/chat/completions"))
            .respond_with(ResponseTemplate::new(200).set_body_json(completion(text)))
            .mount(&self.mistral)
            .await;
        Mock::given(method("POST"))
            .and(path_regex("^/v1beta/models/.*:generateContent$"))
            .respond_with(ResponseTemplate::new(200).set_body_json(gemini_completion(text)))
            .mount(&self.gemini)
            .await;
    }

    pub async fn answer_metrics(&self, json_text: &str) {
        Mock::given(method("POST"))
            .and(path("/v1/chat/completions"))
            .respond_with(ResponseTemplate::new(200).set_body_json(completion(json_text)))
            .mount(&self.groq)
            .await;
    }

    /// Every provider answers 503.
    pub async fn all_down(&self) {
        for server in [&self.mistral, &self.gemini, &self.groq] {
            Mock::given(method("POST"))
                .respond_with(ResponseTemplate::new(503).set_body_string("overloaded"))
                .mount(server)
                .await;
        }
    }

    /// Every provider takes `delay` to answer (successfully).
    pub async fn slow(&self, delay: Duration) {
        Mock::given(method("POST"))
            .and(path("/v1/chat/completions"))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(completion(ANALYSIS_TEXT))
                    .set_delay(delay),
            )
            .mount(&self.mistral)
            .await;
        Mock::given(method("POST"))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(gemini_completion(ANALYSIS_TEXT))
                    .set_delay(delay),
            )
            .mount(&self.gemini)
            .await;
        Mock::given(method("POST"))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(completion(METRICS_JSON))
                    .set_delay(delay),
            )
            .mount(&self.groq)
            .await;
    }

    pub async fn reset(&self) {
        self.mistral.reset().await;
        self.gemini.reset().await;
        self.groq.reset().await;
    }

    /// Requests the analysis providers received.
    pub async fn analysis_requests(&self) -> usize {
        let m = self
            .mistral
            .received_requests()
            .await
            .unwrap_or_default()
            .len();
        let g = self
            .gemini
            .received_requests()
            .await
            .unwrap_or_default()
            .len();
        m + g
    }
}

/// Free tiers the fakes do not have: under the shipped budgets (Mistral's 1 request/s,
/// Groq's 30 requests and 6 000 tokens a minute) a test that sends a few entries would
/// mostly wait, correctly, for its turn. The shipped defaults stay as they are;
/// [`shipped_budgets`] puts them back.
const GENEROUS_BUDGETS: [(&str, &str); 6] = [
    (
        "DAYLOG__PROVIDERS__MISTRAL__BUDGET__REQUESTS_PER_SECOND",
        "100000",
    ),
    (
        "DAYLOG__PROVIDERS__GROQ__BUDGET__REQUESTS_PER_MINUTE",
        "100000",
    ),
    (
        "DAYLOG__PROVIDERS__GROQ__BUDGET__REQUESTS_PER_DAY",
        "100000",
    ),
    (
        "DAYLOG__PROVIDERS__GROQ__BUDGET__TOKENS_PER_MINUTE",
        "100000000",
    ),
    (
        "DAYLOG__PROVIDERS__GEMINI__BUDGET__REQUESTS_PER_MINUTE",
        "100000",
    ),
    (
        "DAYLOG__PROVIDERS__GEMINI__BUDGET__REQUESTS_PER_DAY",
        "100000",
    ),
];

/// For the tests that are about budgets, rounds or throttling: the budgets of
/// `config/default.toml`, as shipped, instead of [`test_env`]'s generous ones.
pub fn shipped_budgets(env: &mut HashMap<String, String>) {
    for (key, _) in GENEROUS_BUDGETS {
        env.remove(key);
    }
}

/// Settings from `env` alone (`DAYLOG_CONFIG` in it names a TOML layer): the one way
/// every helper and test builds them.
pub fn settings(env: &HashMap<String, String>) -> Settings {
    Settings::load_from(env).unwrap_or_else(|e| panic!("test config: {e}"))
}

/// The environment a test bot runs with: short delays, everything on loopback.
pub fn test_env(
    db_url: &str,
    telegram: &FakeTelegram,
    providers: &Providers,
) -> HashMap<String, String> {
    let mut env: HashMap<String, String> = [
        ("DATABASE_URL", db_url.to_owned()),
        ("TELOXIDE_TOKEN", telegram::TOKEN.to_owned()),
        ("TELOXIDE_API_URL", telegram.url()),
        ("MISTRAL_API_KEY", "test-mistral-key".to_owned()),
        ("GEMINI_API_KEY", "test-gemini-key".to_owned()),
        ("GROQ_API_KEY", "test-groq-key".to_owned()),
        (
            "DAYLOG__PROVIDERS__MISTRAL__BASE_URL",
            format!("{}/v1", providers.mistral.uri()),
        ),
        (
            "DAYLOG__PROVIDERS__GEMINI__BASE_URL",
            format!("{}/v1beta", providers.gemini.uri()),
        ),
        (
            "DAYLOG__PROVIDERS__GROQ__BASE_URL",
            format!("{}/v1", providers.groq.uri()),
        ),
        ("DAYLOG__RETRY__MIN_DELAY_MS", "10".to_owned()),
        ("DAYLOG__RETRY__MAX_DELAY_MS", "40".to_owned()),
        ("DAYLOG__RETRY__REQUEST_TIMEOUT_MS", "3000".to_owned()),
        ("DAYLOG__RETRY__HEDGE_AFTER_MS", "0".to_owned()),
        ("DAYLOG__RETRY__DEADLINE_MS", "8000".to_owned()),
        ("DAYLOG__COOLDOWN__DURATION_MS", "100".to_owned()),
        ("DAYLOG__WORKER__POLL_INTERVAL_MS", "100".to_owned()),
        ("DAYLOG__WORKER__RETRY_MIN_MS", "100".to_owned()),
        ("DAYLOG__WORKER__RETRY_MAX_MS", "1000".to_owned()),
        ("DAYLOG__REMINDERS__POLL_INTERVAL_MS", "50".to_owned()),
        ("DAYLOG__TELEGRAM__THROTTLE", "false".to_owned()),
        ("DAYLOG__TELEGRAM__SHUTDOWN_GRACE_MS", "3000".to_owned()),
        // A restart after a kill -9 on PostgreSQL takes the dead instance's chats over
        // a lease later: the shortest, so tests do not wait for the default 30 s.
        ("DAYLOG__CLUSTER__LEASE_MS", "1000".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    for (key, value) in GENEROUS_BUDGETS {
        env.insert(key.to_owned(), value.to_owned());
    }
    env.insert("RUST_LOG".to_owned(), "info".to_owned());
    env
}

/// The bot running in this process against fakes.
pub struct App {
    pub telegram: FakeTelegram,
    pub providers: Providers,
    pub store: Store,
    pub env: HashMap<String, String>,
    pub dir: tempfile::TempDir,
    /// The bot's clock: it stands at the real time of the start until a test moves it.
    pub clock: Arc<ManualClock>,
    /// The engine under it: SQLite unless started by [`App::spawn_on_backend`].
    pub backend: Backend,
    /// A PostgreSQL database made for this app (`None` on SQLite, whose file is in
    /// `dir`, or when the database was given).
    _db: Option<postgres::FreshDb>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

/// `TEST_LOG=1` shows the bot's events at `debug` (see [`llm::install_test_subscriber`]).
pub fn init_test_tracing() {
    if std::env::var("TEST_LOG").is_ok() {
        llm::install_test_subscriber();
    }
}

impl App {
    /// Starts fakes and the bot; `configure` may change the environment first.
    pub async fn spawn_with(configure: impl FnOnce(&mut HashMap<String, String>)) -> Self {
        Self::spawn_on(
            tempfile::tempdir().expect("temp dir"),
            Providers::start().await,
            configure,
        )
        .await
    }

    pub async fn spawn_on(
        dir: tempfile::TempDir,
        providers: Providers,
        configure: impl FnOnce(&mut HashMap<String, String>),
    ) -> Self {
        let db_url = format!("sqlite://{}/daylog.db", dir.path().display());
        Self::start(dir, None, &db_url, providers, configure).await
    }

    /// Starts fakes and the bot on a fresh database of `backend` (PostgreSQL: a new
    /// database of the test cluster; see [`postgres::backends`]).
    pub async fn spawn_on_backend(
        backend: Backend,
        configure: impl FnOnce(&mut HashMap<String, String>),
    ) -> Self {
        match backend {
            Backend::Sqlite => Self::spawn_with(configure).await,
            Backend::Postgres => {
                let db = backend.fresh().await;
                let url = db.url.clone();
                let dir = tempfile::tempdir().expect("temp dir");
                Self::start(dir, Some(db), &url, Providers::start().await, configure).await
            }
        }
    }

    async fn start(
        dir: tempfile::TempDir,
        db: Option<postgres::FreshDb>,
        db_url: &str,
        providers: Providers,
        configure: impl FnOnce(&mut HashMap<String, String>),
    ) -> Self {
        init_test_tracing();
        let telegram = FakeTelegram::start().await;
        let mut env = test_env(db_url, &telegram, &providers);
        configure(&mut env);
        let settings = settings(&env);
        let clock = Arc::new(ManualClock::new(jiff::Timestamp::now()));
        let app = daylog::app::App::build(settings)
            .await
            .expect("app")
            .with_clock(clock.clone());
        let store = app.store().clone();
        let backend = if store.is_postgres() {
            Backend::Postgres
        } else {
            Backend::Sqlite
        };
        let stop = CancellationToken::new();
        let task = tokio::spawn(app.serve_telegram(stop.clone()));
        Self {
            telegram,
            providers,
            store,
            env,
            dir,
            clock,
            backend,
            _db: db,
            stop,
            task,
        }
    }

    pub async fn spawn() -> Self {
        Self::spawn_with(|_| {}).await
    }

    /// Stops the bot the way SIGTERM does and waits for it.
    pub async fn stop(self) -> (tempfile::TempDir, Providers) {
        self.stop.cancel();
        let result = tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("bot stops in time")
            .expect("bot task");
        result.expect("bot ran without error");
        (self.dir, self.providers)
    }

    /// Runs `sql` on the bot's database through a connection of its own, as a user
    /// (or the test arranging a past) would with `daylog sql`'s writer. The text is
    /// the backend's own dialect.
    pub async fn write(&self, sql: &str) {
        let writer = Raw::connect(&self.env["DATABASE_URL"]).await;
        writer.exec(sql).await;
        writer.close().await;
    }

    /// Makes every log three hours old and due now, as after a downtime of three hours.
    pub async fn age_logs_three_hours(&self) {
        self.write(
            "UPDATE day_logs SET created_at = datetime('now', '-3 hours'),
                                 next_attempt_at = datetime('now', '-1 minute')",
        )
        .await;
    }

    /// The one integer a query gives, read through the bot's own store (either
    /// backend; the text must suit both, or the app's).
    pub async fn count(&self, sql: &str) -> i64 {
        store_value(&self.store, sql).await
    }
}

/// The one integer `sql` gives on `store`'s database, whichever the backend.
pub async fn store_value(store: &Store, sql: &str) -> i64 {
    if let Some(pool) = store.read_pool() {
        sqlx::query_scalar(sql).fetch_one(pool).await
    } else {
        sqlx::query_scalar(sql)
            .fetch_one(store.pg_pool().expect("a PostgreSQL store"))
            .await
    }
    .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// A small seeded xorshift64* generator: reproducible fault schedules without a new
/// dependency. Print the seed in a test so a failure can be replayed (`FAULT_SEED`).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    /// The seed from `FAULT_SEED` when set, else `default`.
    pub fn seed_from_env(default: u64) -> u64 {
        std::env::var("FAULT_SEED")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(default)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A provider reply that takes a seeded random time in `min..=max` (and fails with 503
/// in `fail_percent` of the requests), so a crash lands at varied points of an analysis.
struct Jittery {
    ok: ResponseTemplate,
    rng: std::sync::Mutex<Rng>,
    min_ms: u64,
    max_ms: u64,
    fail_percent: u64,
}

impl wiremock::Respond for Jittery {
    fn respond(&self, _request: &wiremock::Request) -> ResponseTemplate {
        let mut rng = self.rng.lock().expect("rng");
        let delay = Duration::from_millis(rng.between(self.min_ms, self.max_ms));
        if rng.chance(self.fail_percent) {
            ResponseTemplate::new(503)
                .set_body_string("overloaded")
                .set_delay(delay)
        } else {
            self.ok.clone().set_delay(delay)
        }
    }
}

impl Providers {
    /// Every provider answers after a seeded random delay in `min..=max`, failing with
    /// 503 in `fail_percent` of the requests.
    pub async fn jittery(&self, seed: u64, min: Duration, max: Duration, fail_percent: u64) {
        let jitter = |ok: ResponseTemplate, salt: u64| Jittery {
            ok,
            rng: std::sync::Mutex::new(Rng::new(seed ^ salt)),
            min_ms: min.as_millis() as u64,
            max_ms: max.as_millis() as u64,
            fail_percent,
        };
        Mock::given(method("POST"))
            .and(path("/v1/chat/completions"))
            .respond_with(jitter(
                ResponseTemplate::new(200).set_body_json(completion(ANALYSIS_TEXT)),
                1,
            ))
            .mount(&self.mistral)
            .await;
        Mock::given(method("POST"))
            .respond_with(jitter(
                ResponseTemplate::new(200).set_body_json(gemini_completion(ANALYSIS_TEXT)),
                2,
            ))
            .mount(&self.gemini)
            .await;
        Mock::given(method("POST"))
            .respond_with(jitter(
                ResponseTemplate::new(200).set_body_json(completion(METRICS_JSON)),
                3,
            ))
            .mount(&self.groq)
            .await;
    }

    /// Every provider answers 429 with `Retry-After: 1` (longer than the test
    /// `max_delay_ms`, so keys go into cooldown).
    pub async fn all_rate_limited(&self) {
        for server in [&self.mistral, &self.gemini, &self.groq] {
            Mock::given(method("POST"))
                .respond_with(
                    ResponseTemplate::new(429)
                        .insert_header("retry-after", "1")
                        .set_body_string("slow down"),
                )
                .mount(server)
                .await;
        }
    }
}

/// A `daylog run` process that is killed (and reaped) when dropped: a test that fails
/// before it stops its bot must not leave a daemon polling, and burning a core with the
/// tests' short retry settings, for the rest of the run.
pub struct Bot(std::process::Child);

impl std::ops::Deref for Bot {
    type Target = std::process::Child;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Bot {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for Bot {
    fn drop(&mut self) {
        // Already exited and waited for: `kill` fails harmlessly and `wait` returns
        // the status it has.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An entry of a test bot's environment that is the harness's, not the bot's: the
/// folder its stderr log goes to ([`bot_log_path`]). Never passed to the binary.
pub const LOG_DIR: &str = "TEST_BOT_LOG_DIR";

/// Starts the real `daylog run` binary with exactly `env` (plus `PATH`, less
/// [`LOG_DIR`]); its stderr is appended to `log` so a failing test can show what the
/// bot said.
pub fn spawn_daylog(env: &HashMap<String, String>, log: &std::path::Path) -> Bot {
    use std::process::{Command, Stdio};
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("bot log file");
    Command::new(env!("CARGO_BIN_EXE_daylog"))
        .arg("run")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().filter(|(key, _)| key.as_str() != LOG_DIR))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .map(Bot)
        .expect("daylog starts")
}

/// One database and the fakes around it, on which a test starts any number of real
/// `daylog run` binaries: one bot, restarted, or several instances sharing the
/// database. The database is fresh (a new PostgreSQL database of the test cluster, or
/// a SQLite file in `dir`) and migrated before the first binary starts, so binaries
/// started together do not race to create it.
pub struct Deployment {
    pub backend: Backend,
    pub telegram: FakeTelegram,
    pub providers: Providers,
    /// The environment every binary gets (its `DATABASE_URL` is the shared database);
    /// [`Deployment::spawn_with`] changes a copy for one binary.
    pub env: HashMap<String, String>,
    /// The logs' folder (and the SQLite file's).
    pub dir: tempfile::TempDir,
    _db: Option<FreshDb>,
    spawned: std::sync::atomic::AtomicUsize,
}

impl Deployment {
    /// Fakes (providers not yet answering) and a fresh, migrated database of `backend`.
    pub async fn start(backend: Backend) -> Self {
        Self::start_with(backend, |_| {}).await
    }

    /// As [`Deployment::start`], with `configure` changing the shared environment.
    pub async fn start_with(
        backend: Backend,
        configure: impl FnOnce(&mut HashMap<String, String>),
    ) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let (url, db) = match backend {
            Backend::Sqlite => (format!("sqlite://{}/daylog.db", dir.path().display()), None),
            Backend::Postgres => {
                let db = backend.fresh().await;
                (db.url.clone(), Some(db))
            }
        };
        Store::open_and_migrate(&url, Duration::from_secs(10))
            .await
            .expect("a migrated database")
            .close()
            .await;
        let telegram = FakeTelegram::start().await;
        let providers = Providers::start().await;
        let mut env = test_env(&url, &telegram, &providers);
        env.insert(LOG_DIR.to_owned(), dir.path().display().to_string());
        configure(&mut env);
        Self {
            backend,
            telegram,
            providers,
            env,
            dir,
            _db: db,
            spawned: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The shared database's `DATABASE_URL`.
    pub fn url(&self) -> &str {
        &self.env["DATABASE_URL"]
    }

    /// Starts one more `daylog run` with the shared environment; its stderr goes to
    /// its own log (see [`Deployment::log`]).
    pub fn spawn(&self) -> Bot {
        self.spawn_with(|_| {})
    }

    /// Starts one more `daylog run`, `configure` changing its copy of the environment
    /// (a port of its own, say).
    pub fn spawn_with(&self, configure: impl FnOnce(&mut HashMap<String, String>)) -> Bot {
        let n = self
            .spawned
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut env = self.env.clone();
        configure(&mut env);
        spawn_daylog(&env, &self.log_path(n))
    }

    /// Where the stderr of the `n`-th binary started (from 0) goes.
    pub fn log_path(&self, n: usize) -> std::path::PathBuf {
        self.dir.path().join(format!("daylog-{n}-stderr.log"))
    }

    /// What the `n`-th binary started (from 0) has said on stderr so far.
    pub fn log(&self, n: usize) -> String {
        std::fs::read_to_string(self.log_path(n)).unwrap_or_default()
    }

    /// A connection of the test's own to the shared database (hand edits, counts).
    pub async fn raw(&self) -> Raw {
        Raw::connect(self.url()).await
    }

    /// The one integer `sql` gives on the shared database (a text both dialects read).
    pub async fn count(&self, sql: &str) -> i64 {
        let raw = self.raw().await;
        let n = raw.value::<i64>(sql).await;
        raw.close().await;
        n
    }
}

/// Sends signal `name` (`TERM`, `INT`, `KILL`) to `child`, as an operator's `kill` does.
pub fn signal(child: &std::process::Child, name: &str) {
    let status = std::process::Command::new("kill")
        .args([format!("-{name}"), child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
}

/// Waits for `child` to exit, at most `within` (then kills it and fails the test).
pub async fn wait_exit(
    child: &mut std::process::Child,
    within: Duration,
) -> std::process::ExitStatus {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if tokio::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("daylog did not exit within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A log file for a bot started with `env`: in the folder [`LOG_DIR`] names, else
/// beside its SQLite database; in the test's own temporary folder either way, so
/// tests running in parallel never share one.
pub fn bot_log_path(env: &HashMap<String, String>) -> std::path::PathBuf {
    if let Some(dir) = env.get(LOG_DIR) {
        return std::path::Path::new(dir).join("daylog-stderr.log");
    }
    let db = env
        .get("DATABASE_URL")
        .expect("a test env names its database");
    assert!(
        !db.starts_with("postgres"),
        "a bot on PostgreSQL needs a {LOG_DIR} in its env for its log"
    );
    let db = db.strip_prefix("sqlite://").unwrap_or(db);
    std::path::Path::new(db).with_file_name("daylog-stderr.log")
}

/// The last `lines` lines of a file (for failure messages).
pub fn tail(path: &std::path::Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Polls an async condition every 50 ms until it holds; panics with `what` after
/// `limit` (a hang guard, not a performance bound: keep it generous).
pub async fn wait_until<F, Fut>(what: &str, limit: Duration, cond: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while !cond().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---- voice notes ----

/// The transcript the fake Whisper gives; it has HTML in it, which must reach the user
/// escaped.
pub const TRANSCRIPT: &str = "I went for a long run <today> & slept well.";

/// A real Ogg Opus voice note (2.8 s of espeak-ng speech, 3.7 KB).
pub fn voice_fixture() -> Vec<u8> {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/audio/note.ogg");
    std::fs::read(&path).expect("voice fixture")
}

/// Matches only a Whisper upload as docs/behaviour.md ("Voice notes") describes it: multipart with the recording
/// as `file`, a `model`, `response_format=json` and no `language`.
pub struct WhisperUpload {
    pub audio: Vec<u8>,
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

impl wiremock::Match for WhisperUpload {
    fn matches(&self, request: &wiremock::Request) -> bool {
        let multipart = request
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("multipart/form-data; boundary="));
        let body = &request.body;
        multipart
            && contains(body, b"name=\"file\"; filename=\"")
            && contains(body, &self.audio)
            && contains(body, b"name=\"model\"\r\n\r\nwhisper-large-v3")
            && contains(body, b"name=\"response_format\"\r\n\r\njson\r\n")
            && !contains(body, b"name=\"language\"")
    }
}

impl Providers {
    /// Groq's Whisper answers `text` to a well-formed upload of the fixture.
    pub async fn answer_transcription(&self, text: &str) {
        Mock::given(method("POST"))
            .and(path("/v1/audio/transcriptions"))
            .and(WhisperUpload {
                audio: voice_fixture(),
            })
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(json!({"text": text, "x_groq": {"id": "req_test"}})),
            )
            .mount(&self.groq)
            .await;
    }

    /// Groq's Whisper answers 503 to everything.
    pub async fn transcription_down(&self) {
        Mock::given(method("POST"))
            .and(path("/v1/audio/transcriptions"))
            .respond_with(ResponseTemplate::new(503).set_body_string("overloaded"))
            .mount(&self.groq)
            .await;
    }

    /// Every transcription request is refused as Whisper refuses a format it cannot
    /// read (400).
    pub async fn transcription_refuses(&self) {
        Mock::given(method("POST"))
            .and(path("/v1/audio/transcriptions"))
            .respond_with(ResponseTemplate::new(400).set_body_json(json!({
                "error": {"message": "could not process file - is it a valid media file?",
                          "type": "invalid_request_error"}
            })))
            .mount(&self.groq)
            .await;
    }

    /// Transcription requests Groq received (of any model).
    pub async fn transcription_requests(&self) -> usize {
        self.groq
            .received_requests()
            .await
            .unwrap_or_default()
            .iter()
            .filter(|r| r.url.path() == "/v1/audio/transcriptions")
            .count()
    }
}

/// A database file at the schema just before the migration whose file name starts
/// with `first_not_run`, holding `rows` (SQL run in order): what a migration finds in
/// a database made before it. Returns the folder, to keep, and the database's URL.
pub async fn database_before(first_not_run: &str, rows: &[&str]) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("dir");
    let older = dir.path().join("older-migrations");
    std::fs::create_dir(&older).expect("mkdir");
    for file in std::fs::read_dir("migrations").expect("migrations") {
        let path = file.expect("entry").path();
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        if name.as_str() < first_not_run {
            std::fs::copy(&path, older.join(&name)).expect("copy");
        }
    }
    let url = format!("sqlite://{}/daylog.db?mode=rwc", dir.path().display());
    let pool = sqlx::SqlitePool::connect(&url).await.expect("pool");
    sqlx::migrate::Migrator::new(older.as_path())
        .await
        .expect("older migrator")
        .run(&pool)
        .await
        .expect("older schema");
    for sql in rows {
        sqlx::query(sql).execute(&pool).await.expect("old rows");
    }
    pool.close().await;
    (dir, url)
}

/// What a store test records for an analysed log: `analysis`, with the metrics that
/// `metrics_json` holds (as the store writes them).
pub fn analysed(analysis: &str, metrics_json: &str) -> daylog::domain::Outcome {
    daylog::domain::Outcome::Analysed {
        analysis: analysis.to_owned(),
        metrics: stored_metrics(metrics_json),
    }
}

/// Metrics as the store reads them back from `json`.
pub fn stored_metrics(json: &str) -> daylog::domain::Metrics {
    daylog::domain::Metrics::from_stored_json(json).expect("metrics JSON")
}

/// A pending log's next try in `retry_in`, for `wait`.
pub fn waiting(wait: daylog::domain::Wait, retry_in: Duration) -> daylog::domain::Outcome {
    daylog::domain::Outcome::Waiting {
        wait,
        retry_in,
        metrics: None,
    }
}
