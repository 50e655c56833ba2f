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
//! Everything else is the shipped default (no `max_concurrency` cap, 30 analyses per
//! user and hour) — but the fakes of every scenario except `free-tier` enforce no
//! limit, so the bot is given paid-tier budgets there ([`PAID_TIER`]) — unless `--max-concurrency` / `--analyses-per-hour` raise it, which
//! the output then says.
//!
//! The burst scenarios (`many`, `stalled`, `failover burst`, `free-tier`) push every log
//! of every chat at once instead (open loop); time to reply is then the time to the
//! reply that carries the analysis. In `free-tier` the fakes enforce the 2026 free
//! tiers and answer 429 as each provider does (Mistral: no Retry-After; Groq:
//! `retry-after` and `x-ratelimit-*` in its format; Gemini: `RetryInfo.retryDelay` and
//! `QuotaFailure` in the body), and the tool reports the last analysis against the
//! ideal the fakes' budgets allow for the analyses alone, 429s per entry, the share
//! answered without a "later" notice, and lost entries. `free-tier-tokens` is the same
//! burst with Groq's 6 000 tokens per minute per model enforced by its fake too (a
//! request counts a quarter of its body's bytes and a 60-token answer), run with the
//! shipped bot and, labelled, with the bot told a token budget it never reaches. That
//! fake is friendlier than Groq in two ways: it counts the answer's 60 tokens where
//! Groq may reserve `max_tokens` up front, and it counts a quarter of the body's bytes,
//! the bot's own estimate, so the estimate's accuracy (Cyrillic text) is not tested. Its
//! minute is a sliding window, as the bot's ledger; Groq's may be a bucket.
//!
//! Printed per scenario: logs/s end to end, the bot's CPU time per log (utime + stime
//! from `/proc/<pid>/stat`), time to reply and the bot's overhead beyond the providers'
//! configured latency (p50/p95/p99), idle and peak RSS (`VmRSS`, `VmHWM`), database
//! bytes per 1000 logs (`page_count * page_size` after a checkpoint), and what the
//! fakes saw. The fakes run in this process on a 2-thread runtime and share the cores
//! with the bot, as they would on the benchmark machine.
//!
//! `--postgres` runs every scenario on PostgreSQL instead: a throwaway cluster this tool
//! starts (as the tests do) with a fresh database per run, the server's CPU per log
//! printed beside the bot's; `--pg-top N` shows where the server's time goes.
//! `--count-statements` counts the SQL statements per log on either backend.
//!
//! `--postgres --instances N` runs N `daylog run` processes on one PostgreSQL database
//! in webhook mode, each on its own `http.listen`, behind a round-robin balancer in this
//! process (the fake Telegram posts to it; it forwards each POST to the next instance,
//! 502 when it cannot reach it). CPU per entry is then the sum over the instances, beside
//! the PostgreSQL server's; statements are counted in every instance's log. Scenario
//! `kill` (with N ≥ 2) kills the last instance with SIGKILL when half of `many`'s burst
//! is answered and reports how long after its death the chats it held were answered.

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
/// The budgets of the scenarios whose fakes enforce no limit (every one but the free
/// tier): a paid tier, far above what a run sends. The shipped free tiers would pace
/// Mistral to 1 request/s.
const PAID_TIER: [(&str, &str); 6] = [
    (
        "DAYLOG__PROVIDERS__MISTRAL__BUDGET__REQUESTS_PER_SECOND",
        "1000000",
    ),
    (
        "DAYLOG__PROVIDERS__GROQ__BUDGET__REQUESTS_PER_MINUTE",
        "100000000",
    ),
    (
        "DAYLOG__PROVIDERS__GROQ__BUDGET__REQUESTS_PER_DAY",
        "1000000000",
    ),
    (
        "DAYLOG__PROVIDERS__GROQ__BUDGET__TOKENS_PER_MINUTE",
        "1000000000",
    ),
    (
        "DAYLOG__PROVIDERS__GEMINI__BUDGET__REQUESTS_PER_MINUTE",
        "100000000",
    ),
    (
        "DAYLOG__PROVIDERS__GEMINI__BUDGET__REQUESTS_PER_DAY",
        "1000000000",
    ),
];

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
    /// Providers at 200 ms, 200 chats × 3 logs, every log pushed at once; then again
    /// with a restarted bot whose hedging starts from its stored latencies.
    Many,
    /// mistral-small holds every connection (2 s request timeout); 200 chats × 3 at
    /// 200 ms, pushed at once.
    Stalled,
    /// 40 chats × 1 log pushed at once against fakes that enforce the free tiers
    /// (Mistral 1/s per key, Groq 30/min per model, Gemini 15/min per model; 300 ms).
    FreeTier,
    /// As `free-tier`, and Groq's fake also enforces its 6 000 tokens/min per model
    /// (a 429 naming TPM); run with the shipped bot, then with the bot not counting
    /// tokens (labelled).
    FreeTierTokens,
    /// `many` (200 chats × 3 at once, 200 ms) with the updates long-polled and with
    /// them posted to the bot's webhook, alternated in one run (polling first), each
    /// `--rounds` times.
    Webhook,
    /// `many` on `--instances` N ≥ 2: the last instance is killed (SIGKILL) when half
    /// the entries have their analysis; reports the time from its death to the last
    /// analysis of the chats it held then (`cluster.lease_ms` is the shipped 30 s).
    Kill,
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
    /// `telegram.analyses_per_hour` for the run (default: the shipped 30 per user).
    #[arg(long)]
    analyses_per_hour: Option<u32>,
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
    /// Rounds of the `webhook` comparison (each: polling, then webhook).
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Run the bot on PostgreSQL: a throwaway cluster of the newest server installed in
    /// `/usr/lib/postgresql/<version>/bin` (as `nobody` when root, Unix socket only),
    /// a fresh database per run. Its CPU (the postmaster and every backend) is
    /// reported beside the bot's.
    #[arg(long)]
    postgres: bool,
    /// A server setting for `--postgres` (`name=value`, repeatable): the cluster runs
    /// PostgreSQL's own defaults otherwise.
    #[arg(long, value_name = "NAME=VALUE")]
    pg_setting: Vec<String>,
    /// With `--postgres`: after each run, the server's `N` costliest statements by
    /// execution time (`pg_stat_statements`, nested ones too): where its CPU goes.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pg_top: usize,
    /// Count the SQL statements the bot runs per entry (sqlx's `debug` log, JSON):
    /// the log costs CPU, so take CPU figures from runs without it.
    #[arg(long)]
    count_statements: bool,
    /// Run N `daylog run` instances on one PostgreSQL database (needs `--postgres`), in
    /// webhook mode, each with its own `http.listen`, behind a round-robin balancer in
    /// this process: the fake Telegram posts every update to the balancer, which
    /// forwards each POST to the next instance (502 when it cannot reach it; the fake
    /// posts it again 100 ms later). CPU and statements are summed over the instances.
    /// Every scenario then runs in webhook mode; `webhook` (the polling comparison) and
    /// the restarted twins of `many` and `stalled` are left out.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=16))]
    instances: Option<u16>,
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
    primary: Primary,
    /// Every log of every chat is queued at once (open loop) instead of one per chat.
    burst: bool,
    /// The fakes enforce the free tiers (answering 429 as each provider does).
    free_tier: bool,
    /// Groq's fake also enforces its 6 000 tokens per minute per model.
    groq_tokens: bool,
    /// The bot ran before: its database holds the last answers of every step at the
    /// scenario's latency (as `llm_calls`), which a restarted bot learns its hedging
    /// thresholds from.
    history: bool,
    /// Extra environment for the bot.
    env: Vec<(String, String)>,
    /// Telegram posts the updates to the bot's webhook instead of the bot polling.
    webhook: bool,
    /// One of several instances is killed when half the entries are answered.
    kill: bool,
}

/// What the analysis cascade's first step (`mistral-small-2506`) does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Primary {
    Up,
    /// Answers 503 at once.
    Down,
    /// Holds the connection and never answers.
    Stalled,
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
    /// The first reply that carried the analysis, per (chat, message).
    answered: HashMap<(i64, i64), Instant>,
    /// In a burst, and on the free tiers: how many logs there are (done when all are
    /// answered with their analysis).
    burst_total: usize,
    /// Logs still to send per chat: (next message id, how many left).
    plan: HashMap<i64, (i64, usize)>,
    chats_done: usize,
    chats_total: usize,
    think: Duration,
    first_push: Option<Instant>,
    last_reply: Option<Instant>,
    /// When the last update of a burst was taken: its offset confirmed (polling) or
    /// its post answered 2xx (webhook).
    intake_done: Option<Instant>,
    /// Webhook mode: the URL and secret of `setWebhook`, and the updates answered 2xx.
    webhook: Option<(String, String)>,
    delivered: usize,
    /// Webhook mode: the sender runs (one for all instances, which each call
    /// `setWebhook` with the same URL).
    delivering: bool,
    /// Replies carrying an analysis for an entry that already had one.
    second_analyses: usize,
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
    fn start_load(
        self: &Arc<Self>,
        chats: usize,
        logs: usize,
        think: Duration,
        burst: bool,
        until_analysed: bool,
    ) {
        let mut inner = lock(&self.inner);
        inner.chats_total = chats;
        if until_analysed {
            inner.burst_total = chats * logs;
        }
        inner.think = think;
        inner.first_push = Some(Instant::now());
        if burst {
            // Open loop: every log at once, in order within each chat (message 1 of every
            // chat first, then message 2, …), as an evening's entries arrive.
            inner.burst_total = chats * logs;
            for m in 1..=logs {
                for c in 0..chats {
                    Self::push(&mut inner, 1_000_000 + c as i64, m as i64);
                }
            }
            drop(inner);
            self.updates.notify_waiters();
            return;
        }
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
        if analysed && inner.answered.contains_key(&(chat, message_id)) {
            inner.second_analyses += 1;
        } else if analysed {
            inner.answered.insert((chat, message_id), now);
            if inner.burst_total > 0 && inner.answered.len() == inner.burst_total {
                self.done.notify_waiters();
            }
        }
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
        // Done when every chat had its replies, unless the run waits for every analysis.
        let all_done = inner.burst_total == 0
            && inner.chats_total > 0
            && inner.chats_done == inner.chats_total;
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
        "SetWebhook" => {
            // teloxide sends it as multipart (it may carry a certificate).
            let url = multipart_field(&body, "url");
            let secret = multipart_field(&body, "secret_token");
            let start = {
                let mut inner = lock(&fake.inner);
                inner.webhook = Some((url, secret));
                !std::mem::replace(&mut inner.delivering, true)
            };
            if start {
                tokio::spawn(deliver(Arc::clone(&fake)));
            }
            json_ok("true")
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
            let mut confirmed = false;
            while inner
                .queue
                .front()
                .is_some_and(|(id, ..)| *id < request.offset)
            {
                inner.queue.pop_front();
                confirmed = true;
            }
            if confirmed && inner.queue.is_empty() && inner.burst_total > 0 {
                inner.intake_done = Some(Instant::now());
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

/// Each chat's updates not posted yet: (message id, JSON); a chat is in the map while
/// its delivery runs.
type ChatQueues = Arc<Mutex<HashMap<i64, VecDeque<(i64, String)>>>>;

/// Webhook mode, as Telegram delivers: every queued update is posted to the URL with the
/// secret, a chat's next one only after the previous got a 2xx (a non-2xx is posted
/// again after 100 ms), chats at once. An update is stamped as handed when its first
/// post starts.
async fn deliver(fake: Arc<FakeTelegram>) {
    let client = reqwest::Client::new();
    let chats: ChatQueues = Arc::default();
    loop {
        let notified = fake.updates.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let taken: Vec<(i64, i64, i64, String)> = lock(&fake.inner).queue.drain(..).collect();
        for (_, chat, message_id, json) in taken {
            let mut queues = lock(&chats);
            let idle = !queues.contains_key(&chat);
            queues
                .entry(chat)
                .or_default()
                .push_back((message_id, json));
            drop(queues);
            if idle {
                tokio::spawn(deliver_chat(
                    Arc::clone(&fake),
                    Arc::clone(&chats),
                    client.clone(),
                    chat,
                ));
            }
        }
        notified.await;
    }
}

async fn deliver_chat(
    fake: Arc<FakeTelegram>,
    chats: ChatQueues,
    client: reqwest::Client,
    chat: i64,
) {
    let Some((url, secret)) = lock(&fake.inner).webhook.clone() else {
        return;
    };
    loop {
        let next = {
            let mut queues = lock(&chats);
            match queues.get_mut(&chat).and_then(VecDeque::pop_front) {
                Some(next) => next,
                None => {
                    queues.remove(&chat);
                    return;
                }
            }
        };
        let (message_id, json) = next;
        lock(&fake.inner)
            .handed
            .entry((chat, message_id))
            .or_insert_with(Instant::now);
        loop {
            let posted = client
                .post(&url)
                .header(header::CONTENT_TYPE, "application/json")
                .header("X-Telegram-Bot-Api-Secret-Token", &secret)
                .body(json.clone())
                .send()
                .await;
            if posted.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut inner = lock(&fake.inner);
        inner.delivered += 1;
        if inner.burst_total > 0 && inner.delivered == inner.burst_total {
            inner.intake_done = Some(Instant::now());
        }
    }
}

/// The text of the field `name` of a multipart body (`""` when it has none).
fn multipart_field(body: &[u8], name: &str) -> String {
    let text = String::from_utf8_lossy(body);
    let marker = format!("name=\"{name}\"");
    text.split(&marker)
        .nth(1)
        .and_then(|rest| rest.split("\r\n\r\n").nth(1))
        .and_then(|value| value.split("\r\n").next())
        .unwrap_or_default()
        .to_owned()
}

// ---------------------------------------------------------------- the balancer ----

/// `--instances`: a round-robin load balancer, the one URL the fake Telegram posts the
/// webhook to. Each POST goes to the next instance in turn, its status and body passed
/// back; 502 when that instance cannot be reached (no retry on another: Telegram, here
/// the fake, posts the update again).
#[derive(Clone)]
struct Balancer {
    ports: Arc<Vec<u16>>,
    next: Arc<AtomicU64>,
    client: reqwest::Client,
}

impl Balancer {
    /// Listens on a port of its own; returns the webhook URL every instance registers.
    async fn start(ports: Vec<u16>) -> anyhow::Result<(String, tokio::task::JoinHandle<()>)> {
        let (listener, addr) = bind().await?;
        let balancer = Self {
            ports: Arc::new(ports),
            next: Arc::new(AtomicU64::new(0)),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()?,
        };
        let app = Router::new().fallback(forward).with_state(balancer);
        let task = tokio::spawn(serve(listener, app));
        Ok((format!("http://{addr}/telegram"), task))
    }
}

async fn forward(
    State(balancer): State<Balancer>,
    uri: Uri,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    let n = balancer.next.fetch_add(1, Ordering::Relaxed) as usize;
    let Some(port) = balancer.ports.get(n % balancer.ports.len().max(1)) else {
        return StatusCode::BAD_GATEWAY.into_response();
    };
    let mut request = balancer
        .client
        .post(format!("http://127.0.0.1:{port}{}", uri.path()))
        .body(body);
    for (name, value) in &headers {
        if name != header::HOST && name != header::CONTENT_LENGTH {
            request = request.header(name, value);
        }
    }
    match request.send().await {
        Ok(response) => {
            let status =
                StatusCode::from_u16(response.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
            let body = response.bytes().await.unwrap_or_default();
            (status, body).into_response()
        }
        Err(_) => StatusCode::BAD_GATEWAY.into_response(),
    }
}

/// A port no listener uses now.
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Whether the bot takes updates: it polled, or its webhook is set and `/readyz` is 200.
async fn is_ready(telegram: &FakeTelegram, webhook_port: Option<u16>) -> bool {
    let Some(port) = webhook_port else {
        return telegram.counters.get_updates.load(Ordering::Relaxed) > 0;
    };
    if lock(&telegram.inner).webhook.is_none() {
        return false;
    }
    reqwest::get(format!("http://127.0.0.1:{port}/readyz"))
        .await
        .is_ok_and(|r| r.status().is_success())
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

// ---------------------------------------------------------------- fake providers ----

/// A documented free tier as the fakes enforce it: `limit` requests in any sliding
/// `window`, per key (and per model where the provider counts per model).
#[derive(Debug, Clone, Copy)]
struct Tier {
    limit: usize,
    window: Duration,
    per_model: bool,
}

/// The free tiers of 2026 (config/default.toml; docs/behaviour.md, "Budgets"), as enforced by the fakes.
fn tier(provider: &str) -> Tier {
    match provider {
        // 1 request/s per workspace key, all models together.
        "mistral" => Tier {
            limit: 1,
            window: Duration::from_secs(1),
            per_model: false,
        },
        // 30 requests/min per model.
        "groq" => Tier {
            limit: 30,
            window: Duration::from_secs(60),
            per_model: true,
        },
        // flash-lite: 15 requests/min per model.
        _ => Tier {
            limit: 15,
            window: Duration::from_secs(60),
            per_model: true,
        },
    }
}

/// Groq's daily request budget, reported in its `x-ratelimit-*-requests` headers.
const GROQ_PER_DAY: u64 = 1000;
/// Groq's tokens per minute per model (free tier), enforced by the fake only in
/// `free-tier-tokens`.
const GROQ_TOKENS_PER_MINUTE: u64 = 6000;
/// The tokens the fake's answers take (its `usage.completion_tokens`).
const ANSWER_TOKENS: u64 = 60;

/// The tokens Groq's fake counts a request at: a quarter of its body's bytes for the
/// prompt, and the answer it gives.
fn groq_request_tokens(body: &[u8]) -> (u64, u64) {
    let prompt = (body.len() as u64).div_ceil(4);
    (prompt, prompt + ANSWER_TOKENS)
}

/// Groq's reset format: `2m59.56s`, `7.66s`, `1h2m`.
fn groq_duration(d: Duration) -> String {
    let total = d.as_secs_f64();
    let hours = (total / 3600.0).floor();
    let minutes = ((total - hours * 3600.0) / 60.0).floor();
    let seconds = total - hours * 3600.0 - minutes * 60.0;
    let mut out = String::new();
    if hours > 0.0 {
        let _ = write!(out, "{hours}h");
    }
    if minutes > 0.0 {
        let _ = write!(out, "{minutes}m");
    }
    if seconds >= 0.005 || out.is_empty() {
        let _ = write!(out, "{:.2}s", seconds);
    }
    out
}

/// Tokens taken within the last minute, oldest first: (when, tokens).
type TokenWindow = VecDeque<(Instant, u64)>;

struct FakeProviders {
    latency: Duration,
    error_rate: f64,
    primary: Primary,
    free_tier: bool,
    /// Groq's fake also enforces its tokens per minute.
    groq_tokens: bool,
    /// Tokens taken per Groq (model, key) within the last minute, oldest first.
    token_windows: Mutex<HashMap<(String, String), TokenWindow>>,
    /// The most tokens one Groq request asked for (what the ideal counts Groq's minute in).
    groq_request_max: AtomicU64,
    /// Accepted requests per free-tier budget (provider, model or '', key), oldest first.
    windows: Mutex<HashMap<(String, String, String), VecDeque<Instant>>>,
    /// Accepted requests per (provider, model, key) since the start, for Groq's daily headers.
    per_day: Mutex<HashMap<(String, String, String), u64>>,
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
    fn new(
        latency: Duration,
        error_rate: f64,
        primary: Primary,
        free_tier: bool,
        groq_tokens: bool,
    ) -> anyhow::Result<Self> {
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
            primary,
            free_tier,
            groq_tokens,
            token_windows: Mutex::new(HashMap::new()),
            groq_request_max: AtomicU64::new(0),
            windows: Mutex::new(HashMap::new()),
            per_day: Mutex::new(HashMap::new()),
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

    /// Takes one request from the free-tier budget, or says how long until it has room.
    fn admit(&self, provider: &str, model: &str, key: &str) -> Result<u64, Duration> {
        let tier = tier(provider);
        let scope = if tier.per_model { model } else { "" };
        let budget = (provider.to_owned(), scope.to_owned(), key.to_owned());
        let now = Instant::now();
        let mut windows = lock(&self.windows);
        let sent = windows.entry(budget).or_default();
        while sent
            .front()
            .is_some_and(|t| now.duration_since(*t) >= tier.window)
        {
            sent.pop_front();
        }
        if sent.len() >= tier.limit {
            let oldest = sent.front().copied().unwrap_or(now);
            return Err((oldest + tier.window).saturating_duration_since(now));
        }
        sent.push_back(now);
        drop(windows);
        let mut per_day = lock(&self.per_day);
        let used = per_day
            .entry((provider.to_owned(), model.to_owned(), key.to_owned()))
            .or_default();
        *used += 1;
        Ok(*used)
    }

    /// Takes `tokens` from Groq's minute for this model and key: what is left then, or
    /// (used, how long until it fits) when it does not fit.
    fn take_tokens(&self, model: &str, key: &str, tokens: u64) -> Result<u64, (u64, Duration)> {
        let now = Instant::now();
        let mut windows = lock(&self.token_windows);
        let taken = windows
            .entry((model.to_owned(), key.to_owned()))
            .or_default();
        while taken
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) >= Duration::from_secs(60))
        {
            taken.pop_front();
        }
        let used: u64 = taken.iter().map(|(_, n)| n).sum();
        self.groq_request_max.fetch_max(tokens, Ordering::Relaxed);
        if used + tokens > GROQ_TOKENS_PER_MINUTE {
            let mut left = used;
            let mut wait = Duration::from_secs(60);
            for (t, n) in taken.iter() {
                left -= n;
                if left + tokens <= GROQ_TOKENS_PER_MINUTE {
                    wait = (*t + Duration::from_secs(60)).saturating_duration_since(now);
                    break;
                }
            }
            return Err((used, wait));
        }
        taken.push_back((now, tokens));
        Ok(GROQ_TOKENS_PER_MINUTE - used - tokens)
    }

    /// Gives back the tokens [`FakeProviders::take_tokens`] took last for this model and
    /// key: the request was refused for another limit, and Groq counts none of it.
    fn return_tokens(&self, model: &str, key: &str) {
        if let Some(taken) = lock(&self.token_windows).get_mut(&(model.to_owned(), key.to_owned()))
        {
            taken.pop_back();
        }
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

/// The 429 each provider sends when its free tier is spent, as it sends it.
fn rate_limited(provider: &str, model: &str, wait: Duration, used_today: u64) -> Response {
    let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
    match provider {
        // Mistral: no Retry-After, no reset header.
        "mistral" => (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::CONTENT_TYPE, "application/json")],
            r#"{"object":"error","message":"Requests rate limit exceeded","type":"rate_limited","param":null,"code":"1300"}"#,
        )
            .into_response(),
        "groq" => {
            let mut response = (
                StatusCode::TOO_MANY_REQUESTS,
                [(header::CONTENT_TYPE, "application/json")],
                format!(
                    r#"{{"error":{{"message":"Rate limit reached for model `{model}` in organization `org_load` service tier `on_demand` on requests per minute (RPM): Limit 30, Used 30, Requested 1. Please try again in {secs}s.","type":"requests","code":"rate_limit_exceeded"}}}}"#
                ),
            )
                .into_response();
            let headers = response.headers_mut();
            groq_headers(headers, used_today, None);
            if let Ok(v) = secs.to_string().parse() {
                headers.insert("retry-after", v);
            }
            response
        }
        _ => (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::CONTENT_TYPE, "application/json")],
            format!(
                r#"{{"error":{{"code":429,"message":"You exceeded your current quota, please check your plan and billing details.","status":"RESOURCE_EXHAUSTED","details":[{{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{{"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests","quotaId":"GenerateRequestsPerMinutePerProjectPerModel-FreeTier","quotaDimensions":{{"location":"global","model":"{model}"}},"quotaValue":"15"}}]}},{{"@type":"type.googleapis.com/google.rpc.Help","links":[{{"description":"Learn more about Gemini API quotas","url":"https://ai.google.dev/gemini-api/docs/rate-limits"}}]}},{{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"{secs}s"}}]}}}}"#
            ),
        )
            .into_response(),
    }
}

/// Sets each header whose value parses.
fn insert_headers(
    headers: &mut axum::http::HeaderMap,
    pairs: impl IntoIterator<Item = (&'static str, String)>,
) {
    for (name, value) in pairs {
        if let Ok(value) = value.parse() {
            headers.insert(name, value);
        }
    }
}

/// Groq's `x-ratelimit-*` headers: `-requests` count the day (Groq's RPD), `-tokens` the
/// minute. `tokens` is the minute's (remaining, reset) where the fake counts tokens;
/// otherwise their limit is reported high enough (30 × the 360 tokens of a fake answer)
/// that requests per minute bind first.
fn groq_headers(
    headers: &mut axum::http::HeaderMap,
    used_today: u64,
    tokens: Option<(u64, Duration)>,
) {
    let remaining = GROQ_PER_DAY.saturating_sub(used_today);
    // The day's bucket refills one request every 86.4 s.
    let reset = Duration::from_secs_f64(86.4 * used_today.min(GROQ_PER_DAY) as f64);
    let (limit, left, refill) = match tokens {
        Some((left, refill)) => (GROQ_TOKENS_PER_MINUTE, left, groq_duration(refill)),
        None => (10_800, 10_440, "2s".to_owned()),
    };
    insert_headers(
        headers,
        [
            ("x-ratelimit-limit-requests", GROQ_PER_DAY.to_string()),
            ("x-ratelimit-remaining-requests", remaining.to_string()),
            ("x-ratelimit-reset-requests", groq_duration(reset)),
            ("x-ratelimit-limit-tokens", limit.to_string()),
            ("x-ratelimit-remaining-tokens", left.to_string()),
            ("x-ratelimit-reset-tokens", refill),
        ],
    );
}

async fn provider(
    State(fake): State<Arc<FakeProviders>>,
    uri: Uri,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
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
    let primary = name == "mistral" && model == PRIMARY_MODEL;
    if primary && fake.primary == Primary::Stalled {
        // Holds the connection until the bot gives up on it.
        tokio::time::sleep(Duration::from_secs(600)).await;
    }
    let mut used_today = 0;
    // Groq's minute of tokens, when the fake enforces it: (prompt tokens, what is left).
    let mut groq_tokens: Option<(u64, u64)> = None;
    if fake.free_tier {
        let key = headers
            .get(header::AUTHORIZATION)
            .or_else(|| headers.get("x-goog-api-key"))
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        if fake.groq_tokens && name == "groq" {
            let (prompt, requested) = groq_request_tokens(&body);
            match fake.take_tokens(&model, &key, requested) {
                Ok(left) => groq_tokens = Some((prompt, left)),
                Err((used, wait)) => {
                    fake.count(name, &model, 429);
                    return groq_out_of_tokens(&model, used, requested, wait);
                }
            }
        }
        match fake.admit(name, &model, &key) {
            Ok(used) => used_today = used,
            Err(wait) => {
                if groq_tokens.is_some() {
                    fake.return_tokens(&model, &key);
                }
                fake.count(name, &model, 429);
                return rate_limited(name, &model, wait, 0);
            }
        }
    }
    let down = primary && fake.primary == Primary::Down;
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
    // With its tokens counted, Groq's answer says what it took.
    let body = match groq_tokens {
        Some((prompt, _)) => serde_json::json!({
            "id": "cmpl-1", "object": "chat.completion", "created": 1_764_460_800, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": METRICS_JSON}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": ANSWER_TOKENS, "total_tokens": prompt + ANSWER_TOKENS}
        })
        .to_string(),
        None => body,
    };
    let mut response = ([(header::CONTENT_TYPE, "application/json")], body).into_response();
    if fake.free_tier && name == "groq" {
        // The fake's minute is a sliding window (as the bot's own ledger): whole again a
        // minute after this request, the newest in it.
        let tokens = groq_tokens.map(|(_, left)| (left, Duration::from_secs(60)));
        groq_headers(response.headers_mut(), used_today, tokens);
    }
    response
}

/// Groq's 429 for a minute's tokens spent, as it sends it.
fn groq_out_of_tokens(model: &str, used: u64, requested: u64, wait: Duration) -> Response {
    let secs = wait.as_secs_f64().max(0.01);
    let mut response = (
        StatusCode::TOO_MANY_REQUESTS,
        [(header::CONTENT_TYPE, "application/json")],
        format!(
            r#"{{"error":{{"message":"Rate limit reached for model `{model}` in organization `org_load` service tier `on_demand` on tokens per minute (TPM): Limit {GROQ_TOKENS_PER_MINUTE}, Used {used}, Requested {requested}. Please try again in {secs:.3}s.","type":"tokens","code":"rate_limit_exceeded"}}}}"#
        ),
    )
        .into_response();
    insert_headers(
        response.headers_mut(),
        [
            ("retry-after", (secs.ceil() as u64).to_string()),
            (
                "x-ratelimit-limit-tokens",
                GROQ_TOKENS_PER_MINUTE.to_string(),
            ),
            (
                "x-ratelimit-remaining-tokens",
                GROQ_TOKENS_PER_MINUTE.saturating_sub(used).to_string(),
            ),
            ("x-ratelimit-reset-tokens", groq_duration(wait)),
        ],
    );
    response
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

/// What a bot that ran before has stored: the database migrated by `daylog migrate`,
/// and the last [`REMEMBERED_ANSWERS`] answers of every analysis and metrics step, each
/// taking `latency`, as `llm_calls` rows.
async fn remember_answers(
    bin: &Path,
    env: &[(String, String)],
    db: &Database,
    folder: &Path,
    settings: &daylog::config::Settings,
    latency: Duration,
) -> anyhow::Result<()> {
    let status = Command::new(bin)
        .arg("migrate")
        .env_clear()
        .current_dir(folder) // no stray .env is read
        .envs(env.iter().cloned())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    anyhow::ensure!(status.success(), "daylog migrate failed: {status}");
    let mut rows = Vec::new();
    let steps = [
        ("analysis", settings.analysis.steps()),
        ("metrics", settings.metrics.steps()),
    ];
    for (task, steps) in steps {
        for step in steps {
            for _ in 0..REMEMBERED_ANSWERS {
                rows.push((task, step.provider(), step.model()));
            }
        }
    }
    let latency_ms = i64::try_from(latency.as_millis()).unwrap_or(i64::MAX);
    const INSERT: &str = "INSERT INTO llm_calls (task, provider, model, key_index, attempt, http_status, outcome, latency_ms)
                          VALUES ($1, $2, $3, 0, 1, 200, 'ok', $4)";
    // One transaction: a row each, one commit.
    match db {
        Database::Sqlite(path) => {
            let mut conn = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))?
                .connect()
                .await?;
            let mut tx = sqlx::Connection::begin(&mut conn).await?;
            for (task, provider, model) in rows {
                sqlx::query(INSERT)
                    .bind(task)
                    .bind(provider)
                    .bind(model)
                    .bind(latency_ms)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
        }
        Database::Postgres(url) => {
            let mut conn = sqlx::postgres::PgConnectOptions::from_str(url)?
                .connect()
                .await?;
            let mut tx = sqlx::Connection::begin(&mut conn).await?;
            for (task, provider, model) in rows {
                sqlx::query(INSERT)
                    .bind(task)
                    .bind(provider)
                    .bind(model)
                    .bind(latency_ms)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
        }
    }
    Ok(())
}

/// How many answers per step [`remember_answers`] stores: the hedging window.
const REMEMBERED_ANSWERS: usize = 32;

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

/// A file's length (0 when it cannot be read).
fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// One `daylog run` process and its log.
struct Bot {
    child: Child,
    pid: u32,
    /// Its `http.listen` port (webhook mode).
    port: Option<u16>,
    log: PathBuf,
    /// Killed by `kill`: its CPU ticks and peak RSS just before.
    killed: Option<(u64, u64)>,
}

impl Bot {
    fn start(
        bin: &Path,
        env: &[(String, String)],
        folder: &Path,
        log: PathBuf,
        port: Option<u16>,
    ) -> anyhow::Result<Self> {
        let log_file = std::fs::File::create(&log)?;
        let mut command = Command::new(bin);
        command
            .arg("run")
            .env_clear()
            .current_dir(folder) // no stray .env is read
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file);
        if let Ok(path) = std::env::var("PATH") {
            command.env("PATH", path);
        }
        // Later pairs win: an instance's own `http.listen` comes last.
        for (k, v) in env {
            command.env(k, v);
        }
        let child = command
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        Ok(Self {
            pid: child.id(),
            child,
            port,
            log,
            killed: None,
        })
    }

    /// Waits until it polls (or, webhook mode, answers /readyz with 200 after
    /// setWebhook), at most 30 s.
    async fn wait_ready(&mut self, telegram: &FakeTelegram) -> anyhow::Result<()> {
        let ready_by = Instant::now() + Duration::from_secs(30);
        while !is_ready(telegram, self.port).await {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "the bot exited at start-up ({status}); its log:\n{}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            if Instant::now() > ready_by {
                let _ = stop_child(&mut self.child);
                bail!("the bot was not ready within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Its CPU so far (utime + stime, clock ticks); a killed one's at its death.
    fn ticks(&self) -> anyhow::Result<u64> {
        match self.killed {
            Some((ticks, _)) => Ok(ticks),
            None => cpu_ticks(self.pid),
        }
    }

    fn peak_rss_kib(&self) -> anyhow::Result<u64> {
        match self.killed {
            Some((_, peak)) => Ok(peak),
            None => vm_kib(self.pid, "VmHWM:"),
        }
    }

    /// SIGKILL, as a crash: returns the moment it was sent.
    fn kill(&mut self) -> anyhow::Result<Instant> {
        let before = (cpu_ticks(self.pid)?, vm_kib(self.pid, "VmHWM:")?);
        self.child.kill()?;
        let at = Instant::now();
        self.child.wait()?;
        self.killed = Some(before);
        Ok(at)
    }
}

impl Drop for Bot {
    /// A run that failed half-way leaves no process behind.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `kill`: waits until half the entries have their analysis, kills the last instance
/// (SIGKILL), reads which chats it held then (their leases stay its own until
/// `cluster.lease_ms` has passed), and waits for the end of the burst. Returns whether
/// every entry was answered in time.
async fn wait_with_kill(
    telegram: &FakeTelegram,
    mut done: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>,
    bots: &mut [Bot],
    db: &Database,
    logs: usize,
    lease: Duration,
    timeout: Duration,
) -> anyhow::Result<(bool, KillReport)> {
    let deadline = Instant::now() + timeout;
    loop {
        let half = {
            let inner = lock(&telegram.inner);
            inner.answered.len() * 2 >= inner.burst_total
        };
        if half {
            break;
        }
        if Instant::now() > deadline {
            return Ok((false, KillReport::default()));
        }
        if tokio::time::timeout(Duration::from_millis(5), done.as_mut())
            .await
            .is_ok()
        {
            return Ok((true, KillReport::default()));
        }
    }
    anyhow::ensure!(bots.len() >= 2, "`kill` needs --instances 2 or more");
    let victim = bots.last_mut().context("no instance")?;
    let killed_at = victim.kill()?;
    let answered_before: std::collections::HashSet<(i64, i64)> =
        lock(&telegram.inner).answered.keys().copied().collect();
    let held = db.chats_held_by(victim.pid).await?;
    let finished = tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), done)
        .await
        .is_ok();
    let inner = lock(&telegram.inner);
    let mut report = KillReport {
        answered_before: answered_before.len(),
        held_chats: held.len(),
        lease,
        last_overall: inner
            .answered
            .values()
            .max()
            .map(|t| t.saturating_duration_since(killed_at)),
        ..KillReport::default()
    };
    for chat in held {
        for m in 1..=logs as i64 {
            if answered_before.contains(&(chat, m)) {
                continue;
            }
            report.pending += 1;
            match inner.answered.get(&(chat, m)) {
                Some(t) => {
                    let after = t.saturating_duration_since(killed_at);
                    report.last_of_held = report.last_of_held.max(Some(after));
                }
                None => report.lost_of_held += 1,
            }
        }
    }
    Ok((finished, report))
}

// ------------------------------------------------------------ PostgreSQL ----

/// The watchdog of the throwaway cluster (as the test harness's, tests/it/support/
/// postgres.rs): starts it, says `ready`, waits for its stdin to close (this process
/// gone, however it ended), then stops the cluster and removes its folder. `$1` the
/// server binaries, `$2` the folder, `$3` `root` when it must run as nobody, `$4`
/// extra `-c name=value` server options.
const PG_WATCHDOG: &str = r#"
bin=$1; dir=$2; mode=$3; extra=$4
group=$(id -g nobody 2>/dev/null || echo 65534)
run() { if [ "$mode" = root ]; then setpriv --reuid=nobody --regid="$group" --clear-groups "$@"; else "$@"; fi; }
if [ "$mode" = root ]; then chown "nobody:$group" "$dir"; fi
if run "$bin/initdb" -D "$dir/data" -U daylog --auth=trust -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
   && run "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses='' -k $dir $extra" start >/dev/null 2>&1; then
    echo ready
else
    echo "failed: $(tail -n 3 "$dir/initdb.log" "$dir/server.log" 2>/dev/null | tr '\n' ' ')"
fi
cat >/dev/null
run "$bin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1
rm -rf "$dir"
"#;

/// A throwaway PostgreSQL cluster for the runs of this process.
struct PgCluster {
    dir: PathBuf,
    /// Kept so that the watchdog's stdin stays open while this process lives.
    _watchdog: (Child, std::process::ChildStdin),
    databases: AtomicU64,
}

impl PgCluster {
    fn start(settings: &[String]) -> anyhow::Result<Self> {
        use std::io::BufRead as _;
        use std::os::unix::process::CommandExt as _;
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .context("no /usr/lib/postgresql: is the server installed?")?
            .filter_map(Result::ok)
            .filter_map(|e| {
                let version: u32 = e.file_name().to_str()?.parse().ok()?;
                let bin = e.path().join("bin");
                bin.join("initdb").is_file().then_some((version, bin))
            })
            .max()
            .map(|(_, bin)| bin)
            .context("no /usr/lib/postgresql/<version>/bin/initdb")?;
        let dir = tempfile::Builder::new()
            .prefix("daylog-load-pg-")
            .tempdir()?
            .keep();
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|out| out.stdout.trim_ascii() == b"0");
        let extra: String = settings.iter().map(|s| format!(" -c {s}")).collect();
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(PG_WATCHDOG)
            .arg("watchdog")
            .arg(&bin)
            .arg(&dir)
            .arg(if root { "root" } else { "user" })
            .arg(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .context("cannot start the cluster's watchdog")?;
        let stdin = child.stdin.take().context("the watchdog has no stdin")?;
        let stdout = child.stdout.take().context("the watchdog has no stdout")?;
        let mut said = String::new();
        std::io::BufReader::new(stdout).read_line(&mut said)?;
        anyhow::ensure!(
            said.trim() == "ready",
            "the PostgreSQL cluster did not start: {}",
            said.trim()
        );
        Ok(Self {
            dir,
            _watchdog: (child, stdin),
            databases: AtomicU64::new(0),
        })
    }

    fn url(&self, database: &str) -> String {
        format!(
            "postgres://daylog@localhost/{database}?host={}",
            self.dir.display()
        )
    }

    /// A new empty database's URL.
    async fn create_database(&self) -> anyhow::Result<String> {
        let name = format!("load_{}", self.databases.fetch_add(1, Ordering::Relaxed));
        let mut admin = sqlx::postgres::PgConnectOptions::from_str(&self.url("postgres"))?
            .connect()
            .await?;
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await?;
        sqlx::Connection::close(admin).await?;
        Ok(self.url(&name))
    }

    /// The postmaster's process id (the first line of `postmaster.pid`).
    fn postmaster(&self) -> anyhow::Result<u32> {
        let pid = std::fs::read_to_string(self.dir.join("data/postmaster.pid"))?;
        Ok(pid
            .lines()
            .next()
            .context("empty postmaster.pid")?
            .trim()
            .parse()?)
    }

    /// The server's CPU so far, in clock ticks: the postmaster's own and its reaped
    /// children's (backends that have exited), and every live child's (backends,
    /// checkpointer, autovacuum…) with their reaped children.
    fn cpu_ticks(&self) -> anyhow::Result<u64> {
        let postmaster = self.postmaster()?;
        let mut ticks = tree_ticks(postmaster)?.1;
        for entry in std::fs::read_dir("/proc")?.filter_map(Result::ok) {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            // A process may end between the listing and the read: not counted twice
            // either way, its time is then in the postmaster's reaped children.
            if let Ok((parent, own)) = tree_ticks(pid)
                && parent == postmaster
            {
                ticks += own;
            }
        }
        Ok(ticks)
    }
}

/// A process's parent and its utime + stime + cutime + cstime, in clock ticks.
fn tree_ticks(pid: u32) -> anyhow::Result<(u32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("odd /proc/<pid>/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let parent: u32 = fields.get(1).context("no ppid")?.parse()?;
    let mut ticks = 0;
    for i in 11..=14 {
        ticks += fields.get(i).context("short stat")?.parse::<u64>()?;
    }
    Ok((parent, ticks))
}

/// The database of one run.
enum Database {
    Sqlite(PathBuf),
    Postgres(String),
}

impl Database {
    fn url(&self) -> String {
        match self {
            Self::Sqlite(path) => format!("sqlite://{}", path.display()),
            Self::Postgres(url) => url.clone(),
        }
    }

    /// Bytes the database takes: SQLite's `page_count * page_size` (after a full
    /// checkpoint when asked), PostgreSQL's `pg_database_size`.
    async fn bytes(&self, checkpoint: bool) -> anyhow::Result<u64> {
        match self {
            Self::Sqlite(path) => db_bytes(path, checkpoint).await,
            Self::Postgres(url) => {
                let size: i64 = self
                    .scalar(url, "SELECT pg_database_size(current_database())")
                    .await?;
                Ok(u64::try_from(size).unwrap_or(0))
            }
        }
    }

    async fn count(&self, sql: &str) -> anyhow::Result<i64> {
        match self {
            Self::Sqlite(path) => db_count(path, sql).await,
            Self::Postgres(url) => self.scalar(url, sql).await,
        }
    }

    async fn execute(&self, url: &str, sql: &str) -> anyhow::Result<()> {
        let mut conn = sqlx::postgres::PgConnectOptions::from_str(url)?
            .connect()
            .await?;
        sqlx::query(sql).execute(&mut conn).await?;
        sqlx::Connection::close(conn).await?;
        Ok(())
    }

    /// `pg_stat_statements`' costliest `n` statements of this database, per entry.
    async fn print_top_statements(
        &self,
        url: &str,
        n: usize,
        entries: usize,
    ) -> anyhow::Result<()> {
        let mut conn = sqlx::postgres::PgConnectOptions::from_str(url)?
            .connect()
            .await?;
        let rows: Vec<(i64, i64, f64, f64, String)> = sqlx::query_as(
            "SELECT calls, plans, total_exec_time, total_plan_time, regexp_replace(query, '\\s+', ' ', 'g')
             FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
             ORDER BY total_exec_time + total_plan_time DESC LIMIT $1",
        )
        .bind(i64::try_from(n).unwrap_or(i64::MAX))
        .fetch_all(&mut conn)
        .await?;
        sqlx::Connection::close(conn).await?;
        let per = entries.max(1) as f64;
        println!(
            "server's costliest statements (µs per entry: execution + planning; calls per entry; \
             plans per entry, counted with `--pg-setting pg_stat_statements.track_planning=on`):"
        );
        for (calls, plans, exec, plan, query) in rows {
            let query: String = query.chars().take(100).collect();
            println!(
                "  {:7.1} + {:5.1} µs  {:5.2}×  {:5.2}p  {query}",
                exec * 1000.0 / per,
                plan * 1000.0 / per,
                calls as f64 / per,
                plans as f64 / per
            );
        }
        Ok(())
    }

    /// The chats whose lease the instance with this process id holds (PostgreSQL).
    async fn chats_held_by(&self, pid: u32) -> anyhow::Result<Vec<i64>> {
        let Self::Postgres(url) = self else {
            return Ok(Vec::new());
        };
        let mut conn = sqlx::postgres::PgConnectOptions::from_str(url)?
            .connect()
            .await?;
        let chats = sqlx::query_scalar(
            "SELECT chat_id FROM chat_leases WHERE holder =
                (SELECT id FROM instances WHERE pid = $1 ORDER BY id DESC LIMIT 1)",
        )
        .bind(i64::from(pid))
        .fetch_all(&mut conn)
        .await?;
        sqlx::Connection::close(conn).await?;
        Ok(chats)
    }

    async fn scalar(&self, url: &str, sql: &str) -> anyhow::Result<i64> {
        let mut conn = sqlx::postgres::PgConnectOptions::from_str(url)?
            .connect()
            .await?;
        let value = sqlx::query_scalar(sql).fetch_one(&mut conn).await?;
        sqlx::Connection::close(conn).await?;
        Ok(value)
    }
}

/// sqlx's statement events (`target` `sqlx::query`) in a JSON log's text.
fn statements_in(log: &str) -> usize {
    log.lines()
        .filter(|line| line.contains("\"target\":\"sqlx::query\""))
        .count()
}

// ---------------------------------------------------------------- a run ----

#[derive(Debug, Clone, Default)]
struct Report {
    name: String,
    burst: bool,
    /// Free tier: the earliest the budgets allow the last analysis.
    ideal: Option<Duration>,
    /// Free tier: the same with the metrics requests, which share Mistral's budget.
    ideal_with_metrics: Option<Duration>,
    /// From the first push to the last reply that carried an analysis.
    last_answer: Option<Duration>,
    /// Logs that got their analysis (after a notice or not).
    answered_in_all: usize,
    /// In a burst: updates taken per second, from the push to the last update's
    /// confirmation (polling) or 2xx (webhook).
    intake_per_s: Option<f64>,
    /// Logs whose first reply was a notice ("saved, the analysis will follow").
    noticed: usize,
    /// 429s the fakes answered.
    rate_limited: u64,
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
    /// On PostgreSQL: the server's CPU per log (postmaster and children).
    server_cpu_ms_per_log: Option<f64>,
    /// With `--count-statements`: SQL statements the bot ran per log under load.
    statements_per_log: Option<f64>,
    backend: &'static str,
    ttr_ms: [f64; 4],
    /// In a burst: from the push (when every entry was sent) to its analysis.
    ttr_pushed_ms: Option<[f64; 4]>,
    overhead_ms: [f64; 4],
    idle_rss_kib: u64,
    peak_rss_kib: u64,
    db_bytes_per_1000: f64,
    db_bytes_total: u64,
    db_rows: String,
    provider_calls: String,
    telegram_calls: String,
    hold_overshoot_ms: Option<f64>,
    /// Each instance's exit code after SIGTERM (`killed` for the one `kill` killed).
    bot_exit: String,
    log_lines: usize,
    warn_lines: usize,
    folder: Option<PathBuf>,
    /// `daylog run` processes on the database (1 unless `--instances`).
    instances: usize,
    /// `kill`: what followed the death of one instance.
    kill: Option<KillReport>,
    /// Replies carrying an analysis for an entry that already had one.
    second_analyses: usize,
    /// Chats whose first replies came out of their entries' order.
    out_of_order: usize,
}

/// `kill`: one instance of several killed (SIGKILL) in the middle of a burst.
#[derive(Debug, Clone, Default)]
struct KillReport {
    /// Entries with their analysis when it was killed.
    answered_before: usize,
    /// Chats whose lease it held when it died (`chat_leases`).
    held_chats: usize,
    /// Their entries without an analysis then.
    pending: usize,
    /// From its death to the last analysis of those entries.
    last_of_held: Option<Duration>,
    /// Those entries never answered by the end of the run.
    lost_of_held: usize,
    /// From its death to the last analysis of the burst.
    last_overall: Option<Duration>,
    /// `cluster.lease_ms` of the instances.
    lease: Duration,
}

/// The earliest moment `entries` analyses can be answered when every one is there at
/// once: each budget admits `limit` requests in any sliding `window` (as the fakes
/// enforce it), so `limit` at once and `limit` more at each window's end; each answer
/// takes `latency`.
fn ideal_time(entries: usize, budgets: &[(usize, Duration)], latency: Duration) -> Duration {
    ideal_shared(entries, budgets, 0, &[], &[], latency)
}

/// Requests a budget admits from 0 up to and including `at`.
fn admitted(budgets: &[(usize, Duration)], at: Duration) -> usize {
    budgets
        .iter()
        .map(|(limit, window)| limit * (at.as_nanos() / window.as_nanos().max(1)) as usize + limit)
        .sum()
}

/// As [`ideal_time`] for two tasks at once: `a` requests on `a_only` budgets or the
/// `shared` ones, `b` requests on `b_only` or `shared` (the analyses on Gemini or
/// Mistral, the metrics on Groq or Mistral).
fn ideal_shared(
    a: usize,
    a_only: &[(usize, Duration)],
    b: usize,
    b_only: &[(usize, Duration)],
    shared: &[(usize, Duration)],
    latency: Duration,
) -> Duration {
    let all: Vec<(usize, Duration)> = a_only.iter().chain(b_only).chain(shared).copied().collect();
    if all.is_empty() || a + b == 0 {
        return latency;
    }
    let mut at = Duration::ZERO;
    loop {
        let need = a.saturating_sub(admitted(a_only, at)) + b.saturating_sub(admitted(b_only, at));
        let room = if shared.is_empty() {
            0
        } else {
            admitted(shared, at)
        };
        if need <= room {
            return at + latency;
        }
        // The next moment some budget admits more.
        at = all
            .iter()
            .map(|(_, window)| {
                let passed = (at.as_nanos() / window.as_nanos().max(1)) as u32;
                *window * (passed + 1)
            })
            .min()
            .unwrap_or(at + Duration::from_secs(1));
    }
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

async fn run(
    args: &Args,
    bin: &Path,
    scenario: &Scenario,
    pg: Option<&PgCluster>,
) -> anyhow::Result<Report> {
    let dir = tempfile::Builder::new().prefix("daylog-load-").tempdir()?;
    let db = match pg {
        Some(cluster) => Database::Postgres(cluster.create_database().await?),
        None => Database::Sqlite(dir.path().join("daylog.db")),
    };
    if let (Database::Postgres(url), true) = (&db, args.pg_top > 0) {
        db.execute(url, "CREATE EXTENSION pg_stat_statements")
            .await?;
    }

    let telegram = Arc::new(FakeTelegram::new());
    let (tg_listener, tg_addr) = bind().await?;
    let tg_app = Router::new()
        .route("/{bot}/{method}", post(telegram_api))
        .with_state(Arc::clone(&telegram));
    let tg_server = tokio::spawn(serve(tg_listener, tg_app));

    let providers = Arc::new(FakeProviders::new(
        scenario.latency,
        args.error_rate,
        scenario.primary,
        scenario.free_tier,
        scenario.groq_tokens,
    )?);
    let (p_listener, p_addr) = bind().await?;
    let p_app = Router::new()
        .fallback(provider)
        .with_state(Arc::clone(&providers));
    let p_server = tokio::spawn(serve(p_listener, p_app));

    let mut env: Vec<(String, String)> = vec![
        ("DATABASE_URL".into(), db.url()),
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
        // The one setting that is not the shipped default: Telegram's own limits, which
        // the fake does not enforce.
        ("DAYLOG__TELEGRAM__THROTTLE".into(), "false".into()),
        (
            "DAYLOG__WORKER__POLL_INTERVAL_MS".into(),
            args.worker_poll_ms.to_string(),
        ),
        ("RUST_LOG".into(), args.rust_log.clone()),
    ];
    if args.count_statements {
        env.retain(|(k, _)| k != "RUST_LOG");
        env.push((
            "RUST_LOG".into(),
            format!("{},sqlx::query=debug", args.rust_log),
        ));
        env.push(("DAYLOG__LOG__FORMAT".into(), "json".into()));
    }
    if !scenario.free_tier {
        // These fakes enforce no free tier: the bot is told so (paid-tier budgets far
        // above what a run sends) instead of pacing itself to the shipped free tiers.
        env.extend(
            PAID_TIER
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
    }
    // 0 is the shipped default (no cap); anything else is a labelled raised-limit run.
    if args.max_concurrency > 0 {
        for provider in ["MISTRAL", "GEMINI", "GROQ"] {
            env.push((
                format!("DAYLOG__PROVIDERS__{provider}__MAX_CONCURRENCY"),
                args.max_concurrency.to_string(),
            ));
        }
    }
    if let Some(limit) = args.analyses_per_hour {
        env.push((
            "DAYLOG__TELEGRAM__ANALYSES_PER_HOUR".into(),
            limit.to_string(),
        ));
    }
    let keys = |name: &str| {
        env.iter()
            .find(|(k, _)| k == name)
            .map_or(0, |(_, v)| v.split(',').count())
    };
    let mistral_keys = keys("MISTRAL_API_KEY");
    let gemini_keys = keys("GEMINI_API_KEY");
    let groq_keys = keys("GROQ_API_KEY");
    env.extend(scenario.env.iter().cloned());
    // Webhook mode: each instance's own HTTP port; with `--instances`, the balancer in
    // front of them is the one URL every instance registers.
    let count = if scenario.webhook {
        usize::from(args.instances.unwrap_or(1))
    } else {
        1
    };
    let ports: Vec<u16> = if scenario.webhook {
        (0..count)
            .map(|_| free_port())
            .collect::<anyhow::Result<_>>()?
    } else {
        Vec::new()
    };
    let mut balancer_task = None;
    if let Some(first) = ports.first() {
        let url = if args.instances.is_some() {
            let (url, task) = Balancer::start(ports.clone()).await?;
            balancer_task = Some(task);
            url
        } else {
            format!("http://127.0.0.1:{first}/telegram")
        };
        env.extend([
            ("DAYLOG__TELEGRAM__MODE".to_owned(), "webhook".to_owned()),
            (
                "DAYLOG__HTTP__LISTEN".to_owned(),
                format!("127.0.0.1:{first}"),
            ),
            ("DAYLOG__TELEGRAM__WEBHOOK_URL".to_owned(), url),
            (
                "TELEGRAM_WEBHOOK_SECRET".to_owned(),
                "load-webhook-secret".to_owned(),
            ),
        ]);
    }
    // The metrics cascade the bot will run, read the way the bot reads it: Groq counts
    // per model, so each Groq model of the cascade is a budget of its own.
    let settings =
        daylog::config::Settings::load_from(&env.iter().cloned().collect::<HashMap<_, _>>())
            .context("the bot's settings for this scenario")?;
    let groq_metric_models = {
        let mut models: Vec<&str> = settings
            .metrics
            .steps()
            .iter()
            .filter(|step| step.provider() == "groq")
            .map(|step| step.model())
            .collect();
        models.sort_unstable();
        models.dedup();
        models.len()
    };

    if scenario.history {
        remember_answers(bin, &env, &db, dir.path(), &settings, scenario.latency).await?;
    }

    // The instances start one after another (the first migrates the database), each
    // ready when it polls or, in webhook mode, answers /readyz with 200 after
    // setWebhook; then start-up settles before idle memory is sampled.
    let mut bots: Vec<Bot> = Vec::with_capacity(count);
    for n in 0..count {
        let log = dir.path().join(if count == 1 {
            "bot.log".to_owned()
        } else {
            format!("bot-{n}.log")
        });
        let mut bot_env = env.clone();
        let port = ports.get(n).copied();
        if let Some(port) = port {
            bot_env.push((
                "DAYLOG__HTTP__LISTEN".to_owned(),
                format!("127.0.0.1:{port}"),
            ));
        }
        let mut bot = Bot::start(bin, &bot_env, dir.path(), log, port)?;
        bot.wait_ready(&telegram).await?;
        bots.push(bot);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let idle_rss_kib = bots
        .iter()
        .map(|b| vm_kib(b.pid, "VmRSS:"))
        .sum::<anyhow::Result<u64>>()?;
    let db_baseline = db.bytes(false).await.unwrap_or(0);

    let log_before: Vec<u64> = bots.iter().map(|b| file_len(&b.log)).collect();
    let server_before = pg.map(PgCluster::cpu_ticks).transpose()?;
    let cpu_before = bots.iter().map(Bot::ticks).sum::<anyhow::Result<u64>>()?;
    let done = telegram.done.notified();
    tokio::pin!(done);
    done.as_mut().enable();
    telegram.start_load(
        scenario.chats,
        scenario.logs,
        scenario.think,
        scenario.burst,
        // On the free tiers a reply may be "saved, will follow": the run ends when
        // every analysis has come, not when every chat has had a reply.
        scenario.free_tier,
    );
    let timeout = Duration::from_secs(args.timeout_s);
    let (finished, kill) = if scenario.kill {
        let lease = settings.cluster.lease();
        let (finished, kill) = wait_with_kill(
            &telegram,
            done,
            &mut bots,
            &db,
            scenario.logs,
            lease,
            timeout,
        )
        .await?;
        (finished, Some(kill))
    } else {
        (tokio::time::timeout(timeout, done).await.is_ok(), None)
    };
    // Let the tail (mark_replied, llm_calls rows) land before the CPU sample.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cpu_after = bots.iter().map(Bot::ticks).sum::<anyhow::Result<u64>>()?;
    let server_after = pg.map(PgCluster::cpu_ticks).transpose()?;
    let log_after: Vec<u64> = bots.iter().map(|b| file_len(&b.log)).collect();
    let peak_rss_kib = bots
        .iter()
        .map(Bot::peak_rss_kib)
        .sum::<anyhow::Result<u64>>()?;
    let mut exits = Vec::with_capacity(bots.len());
    for bot in &mut bots {
        exits.push(match bot.killed {
            Some(_) => "killed".to_owned(),
            None => format!("{:?}", stop_child(&mut bot.child)?),
        });
    }
    let bot_exit = exits.join(", ");
    if let Some(task) = balancer_task {
        task.abort();
    }
    tg_server.abort();
    p_server.abort();

    let total = scenario.chats * scenario.logs;
    let (ttr, ttr_pushed, analysed, replies, elapsed, noticed, last_answer) = {
        let inner = lock(&telegram.inner);
        let mut ttr = Vec::with_capacity(total);
        // In a burst every entry was sent at the push: the time a user waited.
        let mut ttr_pushed = Vec::with_capacity(total);
        let mut analysed = 0;
        let mut noticed = 0;
        for (key, (replied, ok)) in &inner.replies {
            // The time to the analysis: after a notice ("saved, will follow"), the
            // later reply that carries it.
            let answered = if *ok {
                Some(replied)
            } else {
                inner.answered.get(key)
            };
            if let (Some(handed), Some(answered)) = (inner.handed.get(key), answered) {
                ttr.push(answered.saturating_duration_since(*handed).as_secs_f64() * 1000.0);
            }
            if let (true, Some(pushed), Some(answered)) =
                (scenario.burst, inner.first_push, answered)
            {
                ttr_pushed.push(answered.saturating_duration_since(pushed).as_secs_f64() * 1000.0);
            }
            if *ok {
                analysed += 1;
            } else {
                noticed += 1;
            }
        }
        let replies = inner.replies.len();
        let last = if scenario.burst {
            inner.answered.values().max().copied()
        } else {
            inner.last_reply
        };
        let elapsed = match (inner.first_push, last) {
            (Some(a), Some(b)) => b.saturating_duration_since(a),
            _ => Duration::ZERO,
        };
        let last_answer = inner
            .first_push
            .zip(inner.answered.values().max())
            .map(|(a, b)| b.saturating_duration_since(a));
        (
            ttr,
            ttr_pushed,
            analysed,
            replies,
            elapsed,
            noticed,
            last_answer,
        )
    };
    let answered_in_all = lock(&telegram.inner).answered.len();
    let intake_per_s = {
        let inner = lock(&telegram.inner);
        inner
            .first_push
            .zip(inner.intake_done)
            .map(|(a, b)| total as f64 / b.saturating_duration_since(a).as_secs_f64().max(1e-6))
    };
    if !finished {
        eprintln!(
            "warning: {}: only {replies} of {total} logs answered within {} s",
            scenario.name, args.timeout_s
        );
    }
    let latency_ms = scenario.latency.as_secs_f64() * 1000.0;
    let overhead: Vec<f64> = ttr.iter().map(|t| t - latency_ms).collect();

    let db_total = db.bytes(true).await.unwrap_or(0);
    let logs_in_db = db.count("SELECT count(*) FROM day_logs").await?;
    let replied_in_db = db
        .count("SELECT count(*) FROM day_logs WHERE replied_at IS NOT NULL")
        .await?;
    let calls_in_db = db.count("SELECT count(*) FROM llm_calls").await?;
    if let (Database::Postgres(url), true) = (&db, args.pg_top > 0) {
        db.print_top_statements(url, args.pg_top, total).await?;
    }

    let mut provider_calls = String::new();
    let mut rate_limited = 0;
    for ((p, m, s), n) in lock(&providers.seen).iter() {
        let _ = write!(provider_calls, "{p}/{m} {s}: {n}; ");
        if *s == 429 {
            rate_limited += n;
        }
    }
    // The analyses alone, from the fakes' budgets and the keys this run gives each
    // provider: Mistral's per-key budget (both analysis models together) and Gemini's
    // flash-lite budget per key.
    let budgets = |provider: &str, keys: usize| {
        let t = tier(provider);
        vec![(t.limit, t.window); keys]
    };
    let ideal = scenario.free_tier.then(|| {
        let mut both = budgets("mistral", mistral_keys);
        both.extend(budgets("gemini", gemini_keys));
        ideal_time(total, &both, scenario.latency)
    });
    // With the metrics too: the reply waits for both; the metrics have each Groq model
    // of their cascade per key, and their last fallback (mistral-small) shares Mistral's
    // budget with the analyses.
    // Where the fake counts Groq's tokens too, a Groq model admits a minute's tokens'
    // worth of the largest request it saw, if that is fewer than its 30.
    let groq = {
        let mut groq = budgets("groq", groq_keys * groq_metric_models);
        let largest = providers.groq_request_max.load(Ordering::Relaxed);
        if scenario.groq_tokens && largest > 0 {
            let fit = usize::try_from(GROQ_TOKENS_PER_MINUTE / largest).unwrap_or(usize::MAX);
            for (limit, _) in &mut groq {
                *limit = (*limit).min(fit.max(1));
            }
        }
        groq
    };
    let ideal_with_metrics = scenario.free_tier.then(|| {
        ideal_shared(
            total,
            &budgets("gemini", gemini_keys),
            total,
            &groq,
            &budgets("mistral", mistral_keys),
            scenario.latency,
        )
    });
    let holds = {
        let mut holds: Vec<f64> = lock(&providers.holds_us)
            .iter()
            .map(|us| *us as f64 / 1000.0 - latency_ms)
            .collect();
        holds.sort_by(f64::total_cmp);
        (!holds.is_empty()).then(|| percentile(&holds, 50.0))
    };
    let c = &telegram.counters;
    let log_texts: Vec<String> = bots
        .iter()
        .map(|b| std::fs::read_to_string(&b.log).unwrap_or_default())
        .collect();
    let ticks = clock_ticks_per_second() as f64;
    let cpu_ms = (cpu_after.saturating_sub(cpu_before)) as f64 * 1000.0 / ticks;
    let server_cpu_ms = server_before
        .zip(server_after)
        .map(|(before, after)| after.saturating_sub(before) as f64 * 1000.0 / ticks);
    // The statements every instance logged while it was under load.
    let statements = args.count_statements.then(|| {
        log_texts
            .iter()
            .zip(log_before.iter().zip(&log_after))
            .map(|(text, (before, after))| {
                let window = text
                    .as_bytes()
                    .get(
                        usize::try_from(*before).unwrap_or(0)..usize::try_from(*after).unwrap_or(0),
                    )
                    .unwrap_or_default();
                statements_in(&String::from_utf8_lossy(window))
            })
            .sum::<usize>()
    });
    let (second_analyses, out_of_order) = {
        let inner = lock(&telegram.inner);
        (
            inner.second_analyses,
            chats_out_of_order(&inner.replies, scenario.chats, scenario.logs),
        )
    };
    let folder = if args.keep { Some(dir.keep()) } else { None };
    Ok(Report {
        name: scenario.name.clone(),
        burst: scenario.burst,
        ideal,
        ideal_with_metrics,
        last_answer,
        answered_in_all,
        intake_per_s,
        noticed,
        rate_limited,
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
        server_cpu_ms_per_log: server_cpu_ms.map(|ms| ms / replies.max(1) as f64),
        statements_per_log: statements.map(|n| n as f64 / replies.max(1) as f64),
        backend: if pg.is_some() { "postgres" } else { "sqlite" },
        ttr_ms: quantiles(ttr),
        ttr_pushed_ms: (!ttr_pushed.is_empty()).then(|| quantiles(ttr_pushed)),
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
        log_lines: log_texts.iter().map(|t| t.lines().count()).sum(),
        warn_lines: log_texts
            .iter()
            .flat_map(|t| t.lines())
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .count(),
        folder,
        instances: count,
        kill,
        second_analyses,
        out_of_order,
    })
}

/// Chats whose first replies did not arrive in the order of their entries.
fn chats_out_of_order(
    replies: &HashMap<(i64, i64), (Instant, bool)>,
    chats: usize,
    logs: usize,
) -> usize {
    (0..chats)
        .filter(|c| {
            let chat = 1_000_000 + *c as i64;
            let times: Vec<Instant> = (1..=logs as i64)
                .filter_map(|m| replies.get(&(chat, m)).map(|(t, _)| *t))
                .collect();
            times.windows(2).any(|w| w[1] < w[0])
        })
        .count()
}

/// `--instances`: one line per run, the figures of BENCHMARKS.md's section on several
/// instances.
fn print_instances_summary(reports: &[Report]) {
    println!(
        "\n| run | instances | from the push p50 / p95 ms | CPU ms / entry: instances + server = total | statements / entry | 429s / entry | last analysis / ideal | lost | second analyses | chats out of order |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in reports {
        let pushed = r.ttr_pushed_ms.unwrap_or([f64::NAN; 4]);
        let server = r.server_cpu_ms_per_log.unwrap_or(0.0);
        let total = r.logs + r.unanswered;
        let ideal = match (r.ideal, r.last_answer) {
            (Some(ideal), Some(last)) => format!(
                "{:.2} / {:.2} s = {:.2}×",
                last.as_secs_f64(),
                ideal.as_secs_f64(),
                last.as_secs_f64() / ideal.as_secs_f64().max(1e-9)
            ),
            _ => "–".to_owned(),
        };
        println!(
            "| {} | {} | {:.0} / {:.0} | {:.3} + {:.3} = {:.3} | {} | {:.2} | {ideal} | {} | {} | {} |",
            r.name,
            r.instances,
            pushed[0],
            pushed[1],
            r.cpu_ms_per_log,
            server,
            r.cpu_ms_per_log + server,
            r.statements_per_log
                .map_or_else(|| "–".to_owned(), |n| format!("{n:.1}")),
            r.rate_limited as f64 / total.max(1) as f64,
            total.saturating_sub(r.answered_in_all),
            r.second_analyses,
            r.out_of_order
        );
    }
}

/// The `webhook` scenario's rounds side by side: each webhook run against the polling
/// run just before it, and the mean of the ratios.
fn print_webhook_comparison(reports: &[Report]) {
    let runs: Vec<&Report> = reports
        .iter()
        .filter(|r| r.name.starts_with("webhook vs polling"))
        .collect();
    if runs.is_empty() {
        return;
    }
    println!(
        "\n| run | intake updates/s | from the push p50 / p95 ms | CPU ms / entry | vs polling: p50, p95, CPU |"
    );
    println!("|---|---|---|---|---|");
    let mut ratios = Vec::new();
    let mut baseline: Option<&Report> = None;
    for r in runs {
        let pushed = r.ttr_pushed_ms.unwrap_or([0.0; 4]);
        let ratio = match baseline {
            Some(b) if r.name.ends_with("webhook") => {
                let bp = b.ttr_pushed_ms.unwrap_or([1.0; 4]);
                let ratio = (
                    pushed[0] / bp[0].max(1e-6),
                    pushed[1] / bp[1].max(1e-6),
                    r.cpu_ms_per_log / b.cpu_ms_per_log.max(1e-6),
                );
                ratios.push(ratio);
                format!("{:.2}×, {:.2}×, {:.2}×", ratio.0, ratio.1, ratio.2)
            }
            _ => "baseline".to_owned(),
        };
        if r.name.ends_with("polling") {
            baseline = Some(r);
        }
        println!(
            "| {} | {:.0} | {:.0} / {:.0} | {:.3} | {ratio} |",
            r.name,
            r.intake_per_s.unwrap_or(0.0),
            pushed[0],
            pushed[1],
            r.cpu_ms_per_log
        );
    }
    if !ratios.is_empty() {
        let n = ratios.len() as f64;
        println!(
            "\nwebhook / polling, mean of {} rounds: p50 {:.2}×, p95 {:.2}×, CPU per entry {:.2}×",
            ratios.len(),
            ratios.iter().map(|r| r.0).sum::<f64>() / n,
            ratios.iter().map(|r| r.1).sum::<f64>() / n,
            ratios.iter().map(|r| r.2).sum::<f64>() / n,
        );
    }
}

fn print_report(r: &Report) {
    let q = |v: &[f64; 4]| {
        format!(
            "p50 {:.2}  p95 {:.2}  p99 {:.2}  max {:.2} ms",
            v[0], v[1], v[2], v[3]
        )
    };
    println!(
        "\n== {} [{}] — {} chats × {} logs{}, providers at {} ms, think {} ms, throttle off ==",
        r.name,
        r.backend,
        r.chats,
        r.logs_per_chat,
        if r.burst { ", all pushed at once" } else { "" },
        r.latency_ms,
        r.think_ms
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
    if r.instances > 1 {
        println!(
            "instances        {} on one PostgreSQL database, behind the balancer (CPU, RSS, statements and log lines below are their sums)",
            r.instances
        );
    }
    println!("bot CPU          {:.3} ms per log", r.cpu_ms_per_log);
    if let Some(server) = r.server_cpu_ms_per_log {
        println!(
            "server CPU       {server:.3} ms per log (PostgreSQL: the postmaster and its children); bot + server {:.3} ms",
            r.cpu_ms_per_log + server
        );
    }
    if let Some(n) = r.statements_per_log {
        println!("statements       {n:.2} per log (sqlx's log while under load)");
    }
    if let Some(rate) = r.intake_per_s {
        println!("intake           {rate:.0} updates/s taken (push → last confirmed or 2xx)");
    }
    let total = r.logs + r.unanswered;
    println!(
        "later notices    {} of {} first replies were \"saved, will follow\" ({:.0} % answered without one)",
        r.noticed,
        r.logs,
        100.0 * (total.saturating_sub(r.noticed)) as f64 / total.max(1) as f64
    );
    println!(
        "429s             {} ({:.2} per entry); lost (no analysis by the end): {}",
        r.rate_limited,
        r.rate_limited as f64 / total.max(1) as f64,
        total.saturating_sub(r.answered_in_all)
    );
    if let Some(ideal) = r.ideal {
        let last = r.last_answer.unwrap_or_default();
        println!(
            "last analysis    {:.2} s after the burst; ideal {:.2} s (the analyses alone, from the fakes' budgets): {:.2}× the ideal",
            last.as_secs_f64(),
            ideal.as_secs_f64(),
            last.as_secs_f64() / ideal.as_secs_f64().max(1e-9)
        );
    }
    if let Some(bound) = r.ideal_with_metrics {
        println!(
            "                 with the metrics requests too (Groq, then Mistral's shared budget): {:.2} s, {:.2}× that",
            bound.as_secs_f64(),
            r.last_answer.unwrap_or_default().as_secs_f64() / bound.as_secs_f64().max(1e-9)
        );
    }
    println!(
        "once, in order   {} second analyses; {} chats with replies out of order",
        r.second_analyses, r.out_of_order
    );
    if let Some(k) = &r.kill {
        let secs = |d: Option<Duration>| {
            d.map_or_else(|| "–".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()))
        };
        println!(
            "killed           1 instance (SIGKILL) at {} entries answered; it held {} chats with {} entries unanswered",
            k.answered_before, k.held_chats, k.pending
        );
        println!(
            "                 their last analysis {} after its death (goal: cluster.lease_ms {:.0} s + 5 s = {:.0} s); {} of them never answered; the burst's last analysis {} after it",
            secs(k.last_of_held),
            k.lease.as_secs_f64(),
            k.lease.as_secs_f64() + 5.0,
            k.lost_of_held,
            secs(k.last_overall)
        );
    }
    println!("time to reply    {}", q(&r.ttr_ms));
    if let Some(pushed) = &r.ttr_pushed_ms {
        // The bot's intake (when it fetched each update) is not in the line above.
        println!("  from the push  {}", q(pushed));
    }
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
        "bot              exit code {} after SIGTERM; {} log lines, {} WARN/ERROR",
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
        primary: Primary::Up,
        burst: false,
        free_tier: false,
        groq_tokens: false,
        history: false,
        env: Vec::new(),
        webhook: false,
        kill: false,
    };
    let burst = |name: &str, chats: usize, logs: usize, latency_ms: u64| Scenario {
        burst: true,
        ..sized(name, chats, logs, latency_ms)
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
        on.primary = Primary::Down;
        on.env = retry.clone();
        let mut off = sized("failover, cooldown off", 50, 20, 0);
        off.primary = Primary::Down;
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
        // Every log at once, with the shipped retry delays (1 s doubling).
        let mut on = burst("failover burst, cooldown on", 200, 3, 200);
        on.primary = Primary::Down;
        let mut off = burst("failover burst, cooldown off", 200, 3, 200);
        off.primary = Primary::Down;
        off.env
            .push(("DAYLOG__COOLDOWN__DURATION_MS".to_owned(), "0".to_owned()));
        out.extend([on, off]);
    }
    if wants(ScenarioName::Many) {
        let many = burst("many", 200, 3, 200);
        // Beside it: a bot that has answered before, whose hedging thresholds start
        // from its stored (idle) latencies: the burst's own queueing must not hedge.
        let mut known = many.clone();
        known.name = "many, the bot restarted with its last answers stored".to_owned();
        known.history = true;
        out.extend([many, known]);
    }
    if wants(ScenarioName::Webhook) {
        for round in 1..=args.rounds {
            let polling = burst(
                &format!("webhook vs polling, round {round}: polling"),
                200,
                3,
                200,
            );
            let mut webhook = polling.clone();
            webhook.name = format!("webhook vs polling, round {round}: webhook");
            webhook.webhook = true;
            out.extend([polling, webhook]);
        }
    }
    if wants(ScenarioName::Stalled) {
        let mut stalled = burst("stalled primary", 200, 3, 200);
        stalled.primary = Primary::Stalled;
        stalled.env.push((
            "DAYLOG__RETRY__REQUEST_TIMEOUT_MS".to_owned(),
            "2000".to_owned(),
        ));
        // Beside it: a bot that has answered before (restarted, or running when the
        // primary stalls), whose thresholds come from its stored latencies.
        let mut known = stalled.clone();
        known.name = "stalled primary, the bot restarted with its last answers stored".to_owned();
        known.history = true;
        out.extend([stalled, known]);
    }
    if args.scenario.contains(&ScenarioName::Kill) {
        let mut kill = burst("kill one instance mid-burst", 200, 3, 200);
        kill.kill = true;
        out.push(kill);
    }
    if wants(ScenarioName::FreeTier) {
        let mut free = burst("free-tier burst", 40, 1, 300);
        free.free_tier = true;
        out.push(free);
    }
    if wants(ScenarioName::FreeTierTokens) {
        let mut free = burst(
            "free-tier burst, Groq's tokens per minute enforced too",
            40,
            1,
            300,
        );
        free.free_tier = true;
        free.groq_tokens = true;
        // Beside it, labelled: the same bot told a token budget it never reaches, as if
        // it did not count tokens (what it did before it enforced them).
        let mut blind = free.clone();
        blind.name =
            "free-tier burst, Groq's tokens enforced, the bot not counting them".to_owned();
        blind.env.push((
            "DAYLOG__PROVIDERS__GROQ__BUDGET__TOKENS_PER_MINUTE".to_owned(),
            "1000000000".to_owned(),
        ));
        // A steady stream instead of a burst: each chat sends its next entry when the
        // reply to the last one arrives, so answers have come back while later requests
        // are decided — where counting what the answers took can keep a request off a
        // spent minute. Run with the shipped bot and, labelled, the bot not counting.
        let mut steady = sized("free-tier stream, Groq's tokens enforced too", 20, 4, 300);
        steady.free_tier = true;
        steady.groq_tokens = true;
        let mut steady_blind = steady.clone();
        steady_blind.name =
            "free-tier stream, Groq's tokens enforced, the bot not counting them".to_owned();
        steady_blind.env = blind.env.clone();
        out.extend([free, blind, steady, steady_blind]);
    }
    if let Some(n) = args.instances {
        // Several instances are for webhook mode: every run posts its updates to the
        // balancer; the polling comparison and the restarted twins are left out.
        out.retain(|s| !s.history && !s.name.starts_with("webhook vs polling"));
        for s in &mut out {
            s.webhook = true;
            s.name = format!("{}, {n} instance{}", s.name, if n == 1 { "" } else { "s" });
        }
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
        "shipped defaults except telegram.throttle = false; providers.*.max_concurrency = {}{}; telegram.analyses_per_hour = {}; RUST_LOG={}; worker poll {} ms",
        args.max_concurrency,
        if args.max_concurrency == 0 {
            " (shipped: no cap)"
        } else {
            " (RAISED)"
        },
        args.analyses_per_hour
            .map_or_else(|| "30 (shipped)".to_owned(), |n| format!("{n} (RAISED)")),
        args.rust_log,
        args.worker_poll_ms
    );
    if let Some(n) = args.instances {
        anyhow::ensure!(
            args.postgres,
            "--instances needs --postgres: instances share one PostgreSQL database"
        );
        if args.scenario.contains(&ScenarioName::Kill) {
            anyhow::ensure!(n >= 2, "--scenario kill needs --instances 2 or more");
        }
    } else if args.scenario.contains(&ScenarioName::Kill) {
        bail!("--scenario kill needs --postgres --instances 2 or more");
    }
    let pg = if args.postgres {
        let mut settings = args.pg_setting.clone();
        if args.pg_top > 0 {
            settings.extend([
                "shared_preload_libraries=pg_stat_statements".to_owned(),
                "pg_stat_statements.track=all".to_owned(),
            ]);
        }
        let cluster = PgCluster::start(&settings)?;
        let version = Command::new("sh")
            .args(["-c", "ls /usr/lib/postgresql | sort -n | tail -n 1"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default();
        println!(
            "database: PostgreSQL {version}, a throwaway cluster on a Unix socket, the server's defaults{}",
            if args.pg_setting.is_empty() {
                String::new()
            } else {
                format!(" except {}", args.pg_setting.join(", "))
            }
        );
        Some(cluster)
    } else {
        println!("database: SQLite (a fresh file per run)");
        None
    };
    let mut reports = Vec::new();
    for scenario in scenarios(&args) {
        let report = run(&args, &bin, &scenario, pg.as_ref()).await?;
        print_report(&report);
        reports.push(report);
    }

    println!(
        "\n| scenario | logs | logs/s | CPU ms/log | TTR p50 | overhead p50 / p95 / p99 ms | RSS idle / peak MiB | DB bytes / 1000 logs | server CPU ms/log | statements/log |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let or_dash = |v: Option<f64>, digits: usize| {
        v.map_or_else(|| "–".to_owned(), |v| format!("{v:.digits$}"))
    };
    for r in &reports {
        println!(
            "| {} [{}] ({}×{}, {} ms) | {} | {:.0} | {:.3} | {:.1} ms | {:.2} / {:.2} / {:.2} | {:.1} / {:.1} | {:.0} | {} | {} |",
            r.name,
            r.backend,
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
            r.db_bytes_per_1000,
            or_dash(r.server_cpu_ms_per_log, 3),
            or_dash(r.statements_per_log, 2)
        );
    }
    print_webhook_comparison(&reports);
    if args.instances.is_some() {
        print_instances_summary(&reports);
    }
    let pairs = [
        ("failover", "", args.failover_min_delay_ms),
        ("failover", ", paced", args.failover_min_delay_ms),
        ("failover burst", "", 1000),
    ];
    for (prefix, suffix, min_delay) in pairs {
        let find = |name: String| reports.iter().find(|r| r.name == name);
        let on = find(format!("{prefix}, cooldown on{suffix}"));
        let off = find(format!("{prefix}, cooldown off{suffix}"));
        if let (Some(on), Some(off)) = (on, off) {
            println!(
                "\n{prefix}{suffix}: p50 time to reply {:.2} ms with cooldown, {:.2} ms without: {:.0}× better (retry.min_delay_ms = {min_delay})",
                on.ttr_ms[0],
                off.ttr_ms[0],
                off.ttr_ms[0] / on.ttr_ms[0].max(1e-6),
            );
        }
    }
    Ok(())
}
