//! The load benchmark of BENCHMARKS.md: the real `daylog run` binary as a child process
//! against a fake Telegram Bot API and fake LLM providers, all on 127.0.0.1.
//!
//! ```sh
//! cargo build --release && cargo run --release --example loadtest -- --scenario all
//! ```
//!
//! Each scenario starts a fresh bot (fresh database in a temporary folder), configured
//! only through environment variables, waits until it polls, samples its idle memory,
//! then drives U chats × M logs *closed loop*: every chat has exactly one log in flight
//! and sends its next one when the reply to the previous one arrives, so each chat's
//! logs are in order and "U concurrent chats" means U logs in flight. The fake Telegram
//! answers `getUpdates` at once when updates are queued and holds it (≤ 500 ms)
//! otherwise; it stamps each update when it is handed out and each reply when it
//! arrives, keyed by (chat_id, reply_parameters.message_id). Throttle is off
//! (`DAYLOG__TELEGRAM__THROTTLE=false`): these are capacity runs, not Telegram's limits.
//!
//! Printed per scenario: logs/s end to end, the bot's CPU time per log (utime + stime
//! from `/proc/<pid>/stat`), time to reply and the bot's overhead beyond the providers'
//! configured latency (p50/p95/p99), idle and peak RSS (`VmRSS`, `VmHWM`), database
//! bytes per 1000 logs (`page_count * page_size` after a checkpoint), and what the
//! fakes saw. The fakes run in this process on a 2-thread runtime and share the cores
//! with the bot, as they would on the benchmark machine.

#![expect(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark reports on stdout and warns on stderr; the bot's own logs go to a file"
)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use clap::{Parser, ValueEnum};
use serde::Deserialize;
use sqlx::ConnectOptions as _;
use sqlx::sqlite::SqliteConnectOptions;
use tokio::sync::Notify;

const TOKEN: &str = "123456:LOAD-token";
/// In every analysis the fake providers give, so a reply can be told from "saved, the
/// analysis will follow".
const MARKER: &str = "LOADTEST-OK";
const ANALYSIS_TEXT: &str = "LOADTEST-OK You sound tired but proud of the run. Suggestion: go to bed at 23:00 tonight and keep tomorrow's first hour free.";
const METRICS_JSON: &str = r#"{"mood":4,"stress":2,"energy":3,"productivity":4,"sleep_hours":6.5,"activities":["run","work"],"emotions":["proud"],"summary":"A long run and a busy day."}"#;
/// The analysis step the failover scenario takes down.
const PRIMARY_MODEL: &str = "mistral-small-2506";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ScenarioName {
    /// Providers at 0 ms, 50 chats × 20 logs.
    Healthy,
    /// As `healthy`, but each user pauses `--think-ms` (default 200) before the next
    /// log: the overhead below saturation (~250 logs/s offered).
    Paced,
    /// Providers at 200 ms, 500 chats × 4 logs.
    Slow,
    /// mistral-small answers 503; run with cooldown on, then with cooldown off.
    Failover,
    All,
}

#[derive(Debug, Parser)]
#[command(about = "Load benchmark: the real daylog binary against fake Telegram and providers")]
struct Args {
    /// Scenarios to run (repeatable).
    #[arg(long, value_enum, default_values_t = [ScenarioName::All])]
    scenario: Vec<ScenarioName>,
    /// The daylog binary; default: `daylog` in the folder above this example's.
    #[arg(long)]
    bin: Option<PathBuf>,
    /// Override the scenario's number of chats.
    #[arg(long)]
    chats: Option<usize>,
    /// Override the scenario's logs per chat.
    #[arg(long)]
    logs: Option<usize>,
    /// Override the scenario's provider latency (ms).
    #[arg(long)]
    latency_ms: Option<u64>,
    /// The pause of each user between a reply and their next log in `paced`.
    #[arg(long, default_value_t = 200)]
    think_ms: u64,
    /// Fraction of provider requests (any provider) that answer 503, spread evenly.
    #[arg(long, default_value_t = 0.0)]
    error_rate: f64,
    /// `providers.*.max_concurrency` for the run: 0, the shipped default, is no cap (the
    /// budgets pace requests); N > 0 is a safety limit that spills over when full.
    #[arg(long, default_value_t = 0)]
    max_concurrency: usize,
    /// `retry.min_delay_ms` in the failover scenario (`max_delay_ms` is 10×). The shipped
    /// default is 1000; 100 keeps the cooldown-off run short and makes its ratio smaller.
    #[arg(long, default_value_t = 100)]
    failover_min_delay_ms: u64,
    /// `worker.poll_interval_ms` of the bot.
    #[arg(long, default_value_t = 5000)]
    worker_poll_ms: u64,
    /// `RUST_LOG` of the bot (its log goes to a file in the run folder).
    #[arg(long, default_value = "info")]
    rust_log: String,
    /// Give up on a run after this long.
    #[arg(long, default_value_t = 300)]
    timeout_s: u64,
    /// Keep each run's folder (database, bot log) and print where it is.
    #[arg(long)]
    keep: bool,
}

/// One run of the bot under one load.
#[derive(Debug, Clone)]
struct Scenario {
    name: String,
    chats: usize,
    logs: usize,
    latency: Duration,
    /// Pause of each chat between a reply and its next log (0: closed loop at full speed).
    think: Duration,
    primary_down: bool,
    /// Extra environment for the bot.
    env: Vec<(String, String)>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

// ---------------------------------------------------------------- fake Telegram ----

#[derive(Default)]
struct TgInner {
    /// Queued updates: (update_id, chat, message_id, JSON).
    queue: VecDeque<(i64, i64, i64, String)>,
    next_update_id: i64,
    /// When each (chat, message) was first handed out in getUpdates.
    handed: HashMap<(i64, i64), Instant>,
    /// Replies: (chat, message) → arrival, and whether it carried the analysis.
    replies: HashMap<(i64, i64), (Instant, bool)>,
    /// Logs still to send per chat: (next message id, how many left).
    plan: HashMap<i64, (i64, usize)>,
    chats_done: usize,
    chats_total: usize,
    think: Duration,
    first_push: Option<Instant>,
    last_reply: Option<Instant>,
}

#[derive(Default)]
struct TgCounters {
    get_updates: AtomicU64,
    send_message: AtomicU64,
    chat_action: AtomicU64,
    other: AtomicU64,
}

struct FakeTelegram {
    inner: Mutex<TgInner>,
    updates: Notify,
    done: Notify,
    counters: TgCounters,
}

impl FakeTelegram {
    fn new() -> Self {
        Self {
            inner: Mutex::new(TgInner {
                next_update_id: 1,
                ..TgInner::default()
            }),
            updates: Notify::new(),
            done: Notify::new(),
            counters: TgCounters::default(),
        }
    }

    fn push(inner: &mut TgInner, chat: i64, message_id: i64) {
        let id = inner.next_update_id;
        inner.next_update_id += 1;
        let json = update_json(id, chat, message_id);
        inner.queue.push_back((id, chat, message_id, json));
    }

    /// Queues the first log of every chat and plans the rest. Paced chats start spread
    /// over one think time, so they do not arrive in lock-step bursts.
    fn start_load(self: &Arc<Self>, chats: usize, logs: usize, think: Duration) {
        let mut inner = lock(&self.inner);
        inner.chats_total = chats;
        inner.think = think;
        inner.first_push = Some(Instant::now());
        for c in 0..chats {
            let chat = 1_000_000 + c as i64;
            inner.plan.insert(chat, (2, logs.saturating_sub(1)));
            if think.is_zero() {
                Self::push(&mut inner, chat, 1);
            } else {
                self.push_later(chat, 1, think.mul_f64(c as f64 / chats as f64));
            }
        }
        drop(inner);
        self.updates.notify_waiters();
    }

    fn push_later(self: &Arc<Self>, chat: i64, message_id: i64, after: Duration) {
        let fake = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            Self::push(&mut lock(&fake.inner), chat, message_id);
            fake.updates.notify_waiters();
        });
    }

    fn on_reply(self: &Arc<Self>, chat: i64, message_id: i64, analysed: bool) {
        let now = Instant::now();
        let mut inner = lock(&self.inner);
        // A log gets one reply; only the first counts (it is what the user waited for).
        if inner.replies.contains_key(&(chat, message_id)) {
            return;
        }
        inner.replies.insert((chat, message_id), (now, analysed));
        inner.last_reply = Some(now);
        let next = match inner.plan.get_mut(&chat) {
            Some((next, left)) if *left > 0 => {
                *left -= 1;
                *next += 1;
                Some(*next - 1)
            }
            Some(_) => {
                inner.plan.remove(&chat);
                inner.chats_done += 1;
                None
            }
            None => None,
        };
        let all_done = inner.chats_total > 0 && inner.chats_done == inner.chats_total;
        let think = inner.think;
        if let Some(message_id) = next {
            if think.is_zero() {
                Self::push(&mut inner, chat, message_id);
            } else {
                // Users do not type in step: the pause varies 0.5–1.5× per log.
                self.push_later(
                    chat,
                    message_id,
                    think.mul_f64(0.5 + spread(chat, message_id)),
                );
            }
        }
        drop(inner);
        if next.is_some() && think.is_zero() {
            self.updates.notify_waiters();
        }
        if all_done {
            self.done.notify_waiters();
        }
    }
}

/// A repeatable pseudo-random number in [0, 1) for one log (splitmix64).
fn spread(chat: i64, message_id: i64) -> f64 {
    let mut z = (chat as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ message_id as u64;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

fn update_json(update_id: i64, chat: i64, message_id: i64) -> String {
    format!(
        concat!(
            r#"{{"update_id":{u},"message":{{"message_id":{m},"date":1764460800,"#,
            r#""chat":{{"id":{c},"type":"private","first_name":"User"}},"#,
            r#""from":{{"id":{c},"is_bot":false,"first_name":"User","username":"user{c}","language_code":"en"}},"#,
            r#""text":"Day {m}: slept about six hours, went for a long run before work, then two meetings and a deadline that moved again. Felt proud of the run but tired and a bit anxious by the evening. Dinner with friends helped."}}}}"#
        ),
        u = update_id,
        m = message_id,
        c = chat,
    )
}

fn json_ok(result: &str) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        format!(r#"{{"ok":true,"result":{result}}}"#),
    )
        .into_response()
}

#[derive(Deserialize)]
struct GetUpdatesBody {
    #[serde(default)]
    offset: i64,
    #[serde(default)]
    limit: Option<usize>,
}

#[derive(Deserialize)]
struct SendBody {
    chat_id: i64,
    #[serde(default)]
    reply_parameters: Option<ReplyParameters>,
}

#[derive(Deserialize)]
struct ReplyParameters {
    message_id: i64,
}

static MESSAGE_IDS: AtomicU64 = AtomicU64::new(500_000);

async fn telegram_api(
    State(fake): State<Arc<FakeTelegram>>,
    UrlPath((_bot, method)): UrlPath<(String, String)>,
    body: Bytes,
) -> Response {
    match method.as_str() {
        "GetUpdates" => {
            fake.counters.get_updates.fetch_add(1, Ordering::Relaxed);
            let request: GetUpdatesBody = serde_json::from_slice(&body).unwrap_or(GetUpdatesBody {
                offset: 0,
                limit: None,
            });
            get_updates(&fake, request).await
        }
        "SendMessage" => {
            fake.counters.send_message.fetch_add(1, Ordering::Relaxed);
            let Ok(send) = serde_json::from_slice::<SendBody>(&body) else {
                return (StatusCode::BAD_REQUEST, "bad body").into_response();
            };
            if let Some(reply) = &send.reply_parameters {
                let analysed = contains(&body, MARKER.as_bytes());
                fake.on_reply(send.chat_id, reply.message_id, analysed);
            }
            let id = MESSAGE_IDS.fetch_add(1, Ordering::Relaxed);
            json_ok(&format!(
                concat!(
                    r#"{{"message_id":{id},"date":1764460800,"#,
                    r#""chat":{{"id":{chat},"type":"private","first_name":"User"}},"#,
                    r#""from":{{"id":42,"is_bot":true,"first_name":"daylog","username":"daylog_bot"}},"text":"ok"}}"#
                ),
                id = id,
                chat = send.chat_id
            ))
        }
        "SendChatAction" => {
            fake.counters.chat_action.fetch_add(1, Ordering::Relaxed);
            json_ok("true")
        }
        "GetMe" => json_ok(
            r#"{"id":42,"is_bot":true,"first_name":"daylog","username":"daylog_bot","can_join_groups":false,"can_read_all_group_messages":false,"supports_inline_queries":false,"can_connect_to_business":false,"has_main_web_app":false}"#,
        ),
        "GetWebhookInfo" => {
            json_ok(r#"{"url":"","has_custom_certificate":false,"pending_update_count":0}"#)
        }
        _ => {
            fake.counters.other.fetch_add(1, Ordering::Relaxed);
            json_ok("true")
        }
    }
}

async fn get_updates(fake: &FakeTelegram, request: GetUpdatesBody) -> Response {
    let limit = request.limit.unwrap_or(100).clamp(1, 100);
    let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
    loop {
        let notified = fake.updates.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        {
            let mut inner = lock(&fake.inner);
            while inner
                .queue
                .front()
                .is_some_and(|(id, ..)| *id < request.offset)
            {
                inner.queue.pop_front();
            }
            if !inner.queue.is_empty() {
                let now = Instant::now();
                let mut out = String::with_capacity(512 * inner.queue.len().min(limit));
                out.push('[');
                let mut handed = Vec::new();
                for (i, (_, chat, message_id, json)) in inner.queue.iter().take(limit).enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(json);
                    handed.push((*chat, *message_id));
                }
                out.push(']');
                for key in handed {
                    inner.handed.entry(key).or_insert(now);
                }
                drop(inner);
                return json_ok(&out);
            }
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return json_ok("[]");
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

// ---------------------------------------------------------------- fake providers ----

struct FakeProviders {
    latency: Duration,
    error_rate: f64,
    primary_down: bool,
    requests: AtomicU64,
    /// (provider, model, status) → count.
    seen: Mutex<BTreeMap<(String, String, u16), u64>>,
    /// How long answered requests were really held, in µs (the fake's timer overshoot).
    holds_us: Mutex<Vec<u64>>,
    openai_analysis: String,
    openai_metrics: String,
    gemini_analysis: String,
}

impl FakeProviders {
    fn new(latency: Duration, error_rate: f64, primary_down: bool) -> anyhow::Result<Self> {
        let openai = |text: &str| -> anyhow::Result<String> {
            Ok(serde_json::to_string(&serde_json::json!({
                "id": "cmpl-1", "object": "chat.completion", "created": 1_764_460_800, "model": "fake",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 300, "completion_tokens": 60, "total_tokens": 360}
            }))?)
        };
        let gemini = serde_json::to_string(&serde_json::json!({
            "candidates": [{"content": {"role": "model", "parts": [{"text": ANALYSIS_TEXT}]}, "finishReason": "STOP"}],
            "usageMetadata": {"promptTokenCount": 300, "candidatesTokenCount": 60}
        }))?;
        Ok(Self {
            latency,
            error_rate,
            primary_down,
            requests: AtomicU64::new(0),
            seen: Mutex::new(BTreeMap::new()),
            holds_us: Mutex::new(Vec::new()),
            openai_analysis: openai(ANALYSIS_TEXT)?,
            openai_metrics: openai(METRICS_JSON)?,
            gemini_analysis: gemini,
        })
    }

    /// Spreads `error_rate` evenly: request n fails when floor((n+1)·r) > floor(n·r).
    fn scripted_error(&self) -> bool {
        let n = self.requests.fetch_add(1, Ordering::Relaxed) as f64;
        self.error_rate > 0.0
            && ((n + 1.0) * self.error_rate).floor() > (n * self.error_rate).floor()
    }

    fn count(&self, provider: &str, model: &str, status: u16) {
        *lock(&self.seen)
            .entry((provider.to_owned(), model.to_owned(), status))
            .or_default() += 1;
    }
}

#[derive(Deserialize)]
struct OpenAiBody {
    model: String,
    #[serde(default)]
    response_format: Option<serde::de::IgnoredAny>,
}

async fn provider(State(fake): State<Arc<FakeProviders>>, uri: Uri, body: Bytes) -> Response {
    let arrived = Instant::now();
    let path = uri.path();
    let (name, model, json_mode) = if let Some(rest) = path.strip_prefix("/gemini/v1beta/models/") {
        let model = rest.split(':').next().unwrap_or_default().to_owned();
        ("gemini", model, false)
    } else {
        let name = if path.starts_with("/mistral/") {
            "mistral"
        } else {
            "groq"
        };
        match serde_json::from_slice::<OpenAiBody>(&body) {
            Ok(b) => (name, b.model, b.response_format.is_some()),
            Err(_) => return (StatusCode::BAD_REQUEST, "bad body").into_response(),
        }
    };
    let down = fake.primary_down && name == "mistral" && model == PRIMARY_MODEL;
    if down || fake.scripted_error() {
        fake.count(name, &model, 503);
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, "application/json")],
            r#"{"object":"error","message":"Service unavailable.","type":"service_unavailable","code":"1000"}"#,
        )
            .into_response();
    }
    if !fake.latency.is_zero() {
        tokio::time::sleep_until(tokio::time::Instant::from_std(arrived + fake.latency)).await;
        lock(&fake.holds_us).push(arrived.elapsed().as_micros() as u64);
    }
    fake.count(name, &model, 200);
    let body = match (name, json_mode) {
        ("gemini", _) => fake.gemini_analysis.clone(),
        (_, true) => fake.openai_metrics.clone(),
        (_, false) => fake.openai_analysis.clone(),
    };
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

// ---------------------------------------------------------------- the bot process ----

async fn serve(listener: tokio::net::TcpListener, app: Router) {
    if let Err(error) = axum::serve(listener, app).await {
        eprintln!("fake server stopped: {error}");
    }
}

async fn bind() -> anyhow::Result<(tokio::net::TcpListener, SocketAddr)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    Ok((listener, addr))
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name may contain spaces; fields count from after its closing ')'.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("odd /proc/<pid>/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ')': state is field 3 of stat(5), so utime (14) and stime (15) are at 11, 12.
    let utime: u64 = fields.get(11).context("no utime")?.parse()?;
    let stime: u64 = fields.get(12).context("no stime")?.parse()?;
    Ok(utime + stime)
}

/// A `Vm*` line of `/proc/<pid>/status`, in KiB.
fn vm_kib(pid: u32, field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .with_context(|| format!("no {field} in /proc/{pid}/status"))?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .context("odd status line")?
        .parse()?)
}

fn clock_ticks_per_second() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

fn default_bin() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    // target/<profile>/examples/loadtest → target/<profile>/daylog
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .context("cannot locate the target folder")?;
    Ok(dir.join("daylog"))
}

/// SQLite bytes of the database (`page_count * page_size`), after a full checkpoint.
async fn db_bytes(path: &Path, checkpoint: bool) -> anyhow::Result<u64> {
    let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))?
        .read_only(!checkpoint);
    let mut conn = options.connect().await?;
    if checkpoint {
        sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(&mut conn)
            .await?;
    }
    let pages: i64 = sqlx::query_scalar("PRAGMA page_count")
        .fetch_one(&mut conn)
        .await?;
    let size: i64 = sqlx::query_scalar("PRAGMA page_size")
        .fetch_one(&mut conn)
        .await?;
    Ok(u64::try_from(pages * size).unwrap_or(0))
}

async fn db_count(path: &Path, sql: &str) -> anyhow::Result<i64> {
    let options =
        SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))?.read_only(true);
    let mut conn = options.connect().await?;
    Ok(sqlx::query_scalar(sql).fetch_one(&mut conn).await?)
}

fn stop_child(child: &mut Child) -> anyhow::Result<Option<i32>> {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status.code());
        }
        if Instant::now() > deadline {
            child.kill()?;
            child.wait()?;
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------- a run ----

#[derive(Debug, Clone, Default)]
struct Report {
    name: String,
    chats: usize,
    logs_per_chat: usize,
    latency_ms: u64,
    think_ms: u64,
    logs: usize,
    analysed: usize,
    unanswered: usize,
    elapsed: Duration,
    logs_per_s: f64,
    cpu_ms_per_log: f64,
    ttr_ms: [f64; 4],
    overhead_ms: [f64; 4],
    idle_rss_kib: u64,
    peak_rss_kib: u64,
    db_bytes_per_1000: f64,
    db_bytes_total: u64,
    db_rows: String,
    provider_calls: String,
    telegram_calls: String,
    hold_overshoot_ms: Option<f64>,
    bot_exit: Option<i32>,
    log_lines: usize,
    warn_lines: usize,
    folder: Option<PathBuf>,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn quantiles(mut values: Vec<f64>) -> [f64; 4] {
    values.sort_by(f64::total_cmp);
    [
        percentile(&values, 50.0),
        percentile(&values, 95.0),
        percentile(&values, 99.0),
        values.last().copied().unwrap_or(f64::NAN),
    ]
}

async fn run(args: &Args, bin: &Path, scenario: &Scenario) -> anyhow::Result<Report> {
    let dir = tempfile::Builder::new().prefix("daylog-load-").tempdir()?;
    let db = dir.path().join("daylog.db");

    let telegram = Arc::new(FakeTelegram::new());
    let (tg_listener, tg_addr) = bind().await?;
    let tg_app = Router::new()
        .route("/{bot}/{method}", post(telegram_api))
        .with_state(Arc::clone(&telegram));
    let tg_server = tokio::spawn(serve(tg_listener, tg_app));

    let providers = Arc::new(FakeProviders::new(
        scenario.latency,
        args.error_rate,
        scenario.primary_down,
    )?);
    let (p_listener, p_addr) = bind().await?;
    let p_app = Router::new()
        .fallback(provider)
        .with_state(Arc::clone(&providers));
    let p_server = tokio::spawn(serve(p_listener, p_app));

    let concurrency = args.max_concurrency.to_string();
    let mut env: Vec<(String, String)> = vec![
        ("DATABASE_URL".into(), format!("sqlite://{}", db.display())),
        ("TELOXIDE_TOKEN".into(), TOKEN.into()),
        ("TELOXIDE_API_URL".into(), format!("http://{tg_addr}/")),
        ("MISTRAL_API_KEY".into(), "load-mistral-key".into()),
        ("GEMINI_API_KEY".into(), "load-gemini-key".into()),
        ("GROQ_API_KEY".into(), "load-groq-key".into()),
        (
            "DAYLOG__PROVIDERS__MISTRAL__BASE_URL".into(),
            format!("http://{p_addr}/mistral/v1"),
        ),
        (
            "DAYLOG__PROVIDERS__GEMINI__BASE_URL".into(),
            format!("http://{p_addr}/gemini/v1beta"),
        ),
        (
            "DAYLOG__PROVIDERS__GROQ__BASE_URL".into(),
            format!("http://{p_addr}/groq/v1"),
        ),
        (
            "DAYLOG__PROVIDERS__MISTRAL__MAX_CONCURRENCY".into(),
            concurrency.clone(),
        ),
        (
            "DAYLOG__PROVIDERS__GEMINI__MAX_CONCURRENCY".into(),
            concurrency.clone(),
        ),
        (
            "DAYLOG__PROVIDERS__GROQ__MAX_CONCURRENCY".into(),
            concurrency,
        ),
        ("DAYLOG__TELEGRAM__THROTTLE".into(), "false".into()),
        // 20 logs per chat within the hour stay under the per-user limit either way.
        ("DAYLOG__TELEGRAM__ANALYSES_PER_HOUR".into(), "1000".into()),
        (
            "DAYLOG__WORKER__POLL_INTERVAL_MS".into(),
            args.worker_poll_ms.to_string(),
        ),
        ("RUST_LOG".into(), args.rust_log.clone()),
    ];
    env.extend(scenario.env.iter().cloned());

    let log_path = dir.path().join("bot.log");
    let log_file = std::fs::File::create(&log_path)?;
    let mut command = Command::new(bin);
    command
        .arg("run")
        .env_clear()
        .current_dir(dir.path()) // no stray .env is read
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file);
    if let Ok(path) = std::env::var("PATH") {
        command.env("PATH", path);
    }
    for (k, v) in &env {
        command.env(k, v);
    }
    let mut child = command
        .spawn()
        .with_context(|| format!("cannot start {}", bin.display()))?;
    let pid = child.id();

    // Ready when it polls; then let start-up settle before sampling idle memory.
    let ready_by = Instant::now() + Duration::from_secs(30);
    while telegram.counters.get_updates.load(Ordering::Relaxed) == 0 {
        if let Some(status) = child.try_wait()? {
            bail!(
                "the bot exited at start-up ({status}); its log:\n{}",
                std::fs::read_to_string(&log_path).unwrap_or_default()
            );
        }
        if Instant::now() > ready_by {
            let _ = stop_child(&mut child);
            bail!("the bot did not poll within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let idle_rss_kib = vm_kib(pid, "VmRSS:")?;
    let db_baseline = db_bytes(&db, false).await.unwrap_or(0);

    let cpu_before = cpu_ticks(pid)?;
    let done = telegram.done.notified();
    tokio::pin!(done);
    done.as_mut().enable();
    telegram.start_load(scenario.chats, scenario.logs, scenario.think);
    let finished = tokio::time::timeout(Duration::from_secs(args.timeout_s), done)
        .await
        .is_ok();
    // Let the tail (mark_replied, llm_calls rows) land before the CPU sample.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cpu_after = cpu_ticks(pid)?;
    let peak_rss_kib = vm_kib(pid, "VmHWM:")?;
    let bot_exit = stop_child(&mut child)?;
    tg_server.abort();
    p_server.abort();

    let total = scenario.chats * scenario.logs;
    let (ttr, analysed, replies, elapsed) = {
        let inner = lock(&telegram.inner);
        let mut ttr = Vec::with_capacity(total);
        let mut analysed = 0;
        for (key, (replied, ok)) in &inner.replies {
            if let Some(handed) = inner.handed.get(key) {
                ttr.push(replied.saturating_duration_since(*handed).as_secs_f64() * 1000.0);
            }
            if *ok {
                analysed += 1;
            }
        }
        let replies = inner.replies.len();
        let elapsed = match (inner.first_push, inner.last_reply) {
            (Some(a), Some(b)) => b.saturating_duration_since(a),
            _ => Duration::ZERO,
        };
        (ttr, analysed, replies, elapsed)
    };
    if !finished {
        eprintln!(
            "warning: {}: only {replies} of {total} logs answered within {} s",
            scenario.name, args.timeout_s
        );
    }
    let latency_ms = scenario.latency.as_secs_f64() * 1000.0;
    let overhead: Vec<f64> = ttr.iter().map(|t| t - latency_ms).collect();

    let db_total = db_bytes(&db, true).await.unwrap_or(0);
    let logs_in_db = db_count(&db, "SELECT count(*) FROM day_logs").await?;
    let replied_in_db = db_count(
        &db,
        "SELECT count(*) FROM day_logs WHERE replied_at IS NOT NULL",
    )
    .await?;
    let calls_in_db = db_count(&db, "SELECT count(*) FROM llm_calls").await?;

    let mut provider_calls = String::new();
    for ((p, m, s), n) in lock(&providers.seen).iter() {
        let _ = write!(provider_calls, "{p}/{m} {s}: {n}; ");
    }
    let holds = {
        let mut holds: Vec<f64> = lock(&providers.holds_us)
            .iter()
            .map(|us| *us as f64 / 1000.0 - latency_ms)
            .collect();
        holds.sort_by(f64::total_cmp);
        (!holds.is_empty()).then(|| percentile(&holds, 50.0))
    };
    let c = &telegram.counters;
    let log_text = std::fs::read_to_string(&log_path).unwrap_or_default();
    let ticks = clock_ticks_per_second() as f64;
    let cpu_ms = (cpu_after.saturating_sub(cpu_before)) as f64 * 1000.0 / ticks;
    let folder = if args.keep { Some(dir.keep()) } else { None };
    Ok(Report {
        name: scenario.name.clone(),
        chats: scenario.chats,
        logs_per_chat: scenario.logs,
        latency_ms: scenario.latency.as_millis() as u64,
        think_ms: scenario.think.as_millis() as u64,
        logs: replies,
        analysed,
        unanswered: total.saturating_sub(replies),
        elapsed,
        logs_per_s: replies as f64 / elapsed.as_secs_f64().max(1e-9),
        cpu_ms_per_log: cpu_ms / replies.max(1) as f64,
        ttr_ms: quantiles(ttr),
        overhead_ms: quantiles(overhead),
        idle_rss_kib,
        peak_rss_kib,
        db_bytes_per_1000: db_total.saturating_sub(db_baseline) as f64 * 1000.0
            / replies.max(1) as f64,
        db_bytes_total: db_total,
        db_rows: format!(
            "day_logs {logs_in_db} (replied {replied_in_db}), llm_calls {calls_in_db}"
        ),
        provider_calls,
        telegram_calls: format!(
            "getUpdates {}, sendMessage {}, sendChatAction {}, other {}",
            c.get_updates.load(Ordering::Relaxed),
            c.send_message.load(Ordering::Relaxed),
            c.chat_action.load(Ordering::Relaxed),
            c.other.load(Ordering::Relaxed)
        ),
        hold_overshoot_ms: holds,
        bot_exit,
        log_lines: log_text.lines().count(),
        warn_lines: log_text
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .count(),
        folder,
    })
}

fn print_report(r: &Report) {
    let q = |v: &[f64; 4]| {
        format!(
            "p50 {:.2}  p95 {:.2}  p99 {:.2}  max {:.2} ms",
            v[0], v[1], v[2], v[3]
        )
    };
    println!(
        "\n== {} — {} chats × {} logs, providers at {} ms, think {} ms, throttle off ==",
        r.name, r.chats, r.logs_per_chat, r.latency_ms, r.think_ms
    );
    println!(
        "answered         {} of {} ({} with the analysis)",
        r.logs,
        r.logs + r.unanswered,
        r.analysed
    );
    println!(
        "throughput       {:.0} logs/s ({:.2} s end to end)",
        r.logs_per_s,
        r.elapsed.as_secs_f64()
    );
    println!("bot CPU          {:.3} ms per log", r.cpu_ms_per_log);
    println!("time to reply    {}", q(&r.ttr_ms));
    println!("overhead         {}", q(&r.overhead_ms));
    println!(
        "RSS              idle {:.1} MiB, peak {:.1} MiB",
        r.idle_rss_kib as f64 / 1024.0,
        r.peak_rss_kib as f64 / 1024.0
    );
    println!(
        "database         {:.0} bytes per 1000 logs ({} bytes in all; {})",
        r.db_bytes_per_1000, r.db_bytes_total, r.db_rows
    );
    println!("providers saw    {}", r.provider_calls);
    println!("telegram saw     {}", r.telegram_calls);
    if let Some(h) = r.hold_overshoot_ms {
        println!("fake timer       p50 {h:.2} ms over the configured latency (part of 'overhead')");
    }
    println!(
        "bot              exit code {:?} after SIGTERM; {} log lines, {} WARN/ERROR",
        r.bot_exit, r.log_lines, r.warn_lines
    );
    if let Some(folder) = &r.folder {
        println!("kept             {}", folder.display());
    }
}

fn scenarios(args: &Args) -> Vec<Scenario> {
    let wants =
        |s: ScenarioName| args.scenario.contains(&s) || args.scenario.contains(&ScenarioName::All);
    let sized = |name: &str, chats: usize, logs: usize, latency_ms: u64| Scenario {
        name: name.to_owned(),
        chats: args.chats.unwrap_or(chats),
        logs: args.logs.unwrap_or(logs),
        latency: Duration::from_millis(args.latency_ms.unwrap_or(latency_ms)),
        think: Duration::ZERO,
        primary_down: false,
        env: Vec::new(),
    };
    let mut out = Vec::new();
    if wants(ScenarioName::Healthy) {
        out.push(sized("healthy", 50, 20, 0));
    }
    if wants(ScenarioName::Paced) {
        let mut paced = sized("healthy, paced", 50, 20, 0);
        paced.think = Duration::from_millis(args.think_ms);
        out.push(paced);
    }
    if wants(ScenarioName::Slow) {
        out.push(sized("slow", 500, 4, 200));
    }
    if wants(ScenarioName::Failover) {
        let retry = vec![
            (
                "DAYLOG__RETRY__MIN_DELAY_MS".to_owned(),
                args.failover_min_delay_ms.to_string(),
            ),
            (
                "DAYLOG__RETRY__MAX_DELAY_MS".to_owned(),
                (args.failover_min_delay_ms * 10).to_string(),
            ),
        ];
        let mut on = sized("failover, cooldown on", 50, 20, 0);
        on.primary_down = true;
        on.env = retry.clone();
        let mut off = sized("failover, cooldown off", 50, 20, 0);
        off.primary_down = true;
        off.env = retry;
        off.env
            .push(("DAYLOG__COOLDOWN__DURATION_MS".to_owned(), "0".to_owned()));
        let mut on_paced = on.clone();
        on_paced.name = "failover, cooldown on, paced".to_owned();
        on_paced.think = Duration::from_millis(args.think_ms);
        let mut off_paced = off.clone();
        off_paced.name = "failover, cooldown off, paced".to_owned();
        off_paced.think = Duration::from_millis(args.think_ms);
        out.extend([on, off, on_paced, off_paced]);
    }
    out
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let bin = match &args.bin {
        Some(bin) => bin.clone(),
        None => default_bin()?,
    };
    if !bin.exists() {
        bail!(
            "{} not found: run `cargo build --release` first, or pass --bin",
            bin.display()
        );
    }
    // The bot runs in a temporary folder, so a relative --bin must be made absolute.
    let bin = std::fs::canonicalize(&bin)?;
    println!(
        "daylog load benchmark: {} ({} cores); bot {}",
        std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|c| c
                .lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_owned()))
            .unwrap_or_default(),
        std::thread::available_parallelism().map_or(0, usize::from),
        bin.display()
    );
    println!(
        "throttle off; providers.*.max_concurrency = {}; RUST_LOG={}; worker poll {} ms",
        args.max_concurrency, args.rust_log, args.worker_poll_ms
    );
    let mut reports = Vec::new();
    for scenario in scenarios(&args) {
        let report = run(&args, &bin, &scenario).await?;
        print_report(&report);
        reports.push(report);
    }

    println!(
        "\n| scenario | logs | logs/s | CPU ms/log | TTR p50 | overhead p50 / p95 / p99 ms | RSS idle / peak MiB | DB bytes / 1000 logs |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in &reports {
        println!(
            "| {} ({}×{}, {} ms) | {} | {:.0} | {:.3} | {:.1} ms | {:.2} / {:.2} / {:.2} | {:.1} / {:.1} | {:.0} |",
            r.name,
            r.chats,
            r.logs_per_chat,
            r.latency_ms,
            r.logs,
            r.logs_per_s,
            r.cpu_ms_per_log,
            r.ttr_ms[0],
            r.overhead_ms[0],
            r.overhead_ms[1],
            r.overhead_ms[2],
            r.idle_rss_kib as f64 / 1024.0,
            r.peak_rss_kib as f64 / 1024.0,
            r.db_bytes_per_1000
        );
    }
    for suffix in ["", ", paced"] {
        let find = |name: String| reports.iter().find(|r| r.name == name);
        let on = find(format!("failover, cooldown on{suffix}"));
        let off = find(format!("failover, cooldown off{suffix}"));
        if let (Some(on), Some(off)) = (on, off) {
            println!(
                "\nfailover{suffix}: p50 time to reply {:.2} ms with cooldown, {:.2} ms without: {:.0}× better (retry.min_delay_ms = {})",
                on.ttr_ms[0],
                off.ttr_ms[0],
                off.ttr_ms[0] / on.ttr_ms[0].max(1e-6),
                args.failover_min_delay_ms
            );
        }
    }
    Ok(())
}
