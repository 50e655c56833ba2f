//! The HTTP face of the real `daylog run` binary: `/healthz`, `/readyz` (ready, then 503
//! from the moment SIGTERM arrives), `/metrics` on its own listener only, parsed as
//! Prometheus text, its counters moved by what the test did and nothing of the user's
//! in it; `daylog doctor --ready`; and the configuration refusals.
//!
//! The binary runs as a child process, so its process-global metrics recorder is its
//! own: the counters are read before and after, and compared.

#![expect(
    clippy::expect_used,
    reason = "helpers outside #[test] fns fail loudly by design"
)]

use crate::support;

use std::collections::HashMap;
use std::process::{Command, Output};
use std::time::Duration;

use support::telegram::text_update;
use support::{FakeTelegram, Providers, signal, test_env};

/// A chat (and user) id that appears nowhere in a scrape unless it leaked into one.
const CHAT: i64 = 7_304_911_235;
/// An entry's text that appears nowhere in a scrape unless it leaked into one.
const ENTRY: &str = "Quokka-shaped clouds over the harbour today.";

/// The addresses the child bound, read from its JSON log: `(listen, metrics_listen)`.
async fn bound_addresses(log: &std::path::Path, want_metrics: bool) -> (String, Option<String>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let mut listen = None;
        let mut metrics = None;
        for line in text.lines() {
            let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let fields = &value["fields"];
            if fields["message"] != "HTTP listener started" {
                continue;
            }
            let bound = fields["bound"].as_str().map(str::to_owned);
            match fields["key"].as_str() {
                Some("http.listen") => listen = bound,
                Some("http.metrics_listen") => metrics = bound,
                _ => {}
            }
        }
        if let Some(listen) = listen.clone()
            && (metrics.is_some() || !want_metrics)
        {
            return (listen, metrics);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the HTTP listeners never started:\n{}",
            support::tail(log, 30)
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The bot's environment with both listeners on free loopback ports and JSON logs.
fn http_env(
    db: &str,
    telegram: &FakeTelegram,
    providers: &Providers,
    metrics: bool,
) -> HashMap<String, String> {
    let mut env = test_env(db, telegram, providers);
    env.insert("DAYLOG__LOG__FORMAT".into(), "json".into());
    env.insert("RUST_LOG".into(), "info".into());
    env.insert("DAYLOG__HTTP__LISTEN".into(), "127.0.0.1:0".into());
    if metrics {
        env.insert("DAYLOG__HTTP__METRICS_LISTEN".into(), "127.0.0.1:0".into());
    }
    env
}

async fn get(url: &str) -> (u16, String) {
    let response = reqwest::Client::new()
        .get(url)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("the listener answers");
    let status = response.status().as_u16();
    (status, response.text().await.expect("a body"))
}

/// `/metrics`, parsed by a real Prometheus text parser.
async fn scrape(addr: &str) -> (String, prometheus_parse::Scrape) {
    let (status, body) = get(&format!("http://{addr}/metrics")).await;
    assert_eq!(status, 200, "{body}");
    let lines = body.lines().map(|l| Ok(l.to_owned()));
    let parsed = prometheus_parse::Scrape::parse(lines).expect("Prometheus text");
    (body, parsed)
}

/// The sum of a series' samples whose labels include every `(name, value)` of `labels`.
fn total(scrape: &prometheus_parse::Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum()
}

/// `daylog doctor --ready` against `listen` (no other setting needed).
fn doctor_ready(listen: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_daylog"))
        .args(["doctor", "--ready"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DAYLOG__HTTP__LISTEN", listen)
        .env("DATABASE_URL", "sqlite://unused/never-opened.db")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("daylog runs")
}

#[tokio::test]
async fn health_readiness_and_metrics_move_with_an_entry_and_name_no_one() {
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    providers.healthy().await;
    let env = http_env(&db, &telegram, &providers, true);
    let log = support::bot_log_path(&env);
    let mut bot = support::spawn_daylog(&env, &log);
    let (listen, metrics) = bound_addresses(&log, true).await;
    let metrics = metrics.expect("the metrics listener");

    assert_eq!(get(&format!("http://{listen}/healthz")).await.0, 200);
    let (status, body) = get(&format!("http://{listen}/readyz")).await;
    assert_eq!((status, body.trim()), (200, "ready"));
    // The public listener never serves the metrics.
    assert_eq!(get(&format!("http://{listen}/metrics")).await.0, 404);
    let ready = doctor_ready(&listen);
    assert_eq!(
        ready.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ready.stdout)
    );

    let (_, before) = scrape(&metrics).await;
    assert_eq!(
        total(
            &before,
            "daylog_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        1.0
    );
    let stored =
        |s: &prometheus_parse::Scrape| total(s, "daylog_entries_stored_total", &[("kind", "text")]);
    let answered = |s: &prometheus_parse::Scrape| {
        total(
            s,
            "daylog_entries_answered_total",
            &[("outcome", "analysed")],
        )
    };
    let attempts_ok =
        |s: &prometheus_parse::Scrape| total(s, "daylog_llm_attempts_total", &[("outcome", "ok")]);

    telegram.push_update(text_update(CHAT, 1, ENTRY));
    telegram.wait_sent(CHAT, 1).await;
    // The answer is counted once it went out: a scrape or two after the fake saw it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let (body, after) = loop {
        let (body, after) = scrape(&metrics).await;
        if answered(&after) > answered(&before) {
            break (body, after);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the answer was never counted:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(stored(&after) - stored(&before), 1.0, "{body}");
    assert_eq!(answered(&after) - answered(&before), 1.0, "{body}");
    // The analysis and the metrics, each answered by a provider.
    assert!(attempts_ok(&after) - attempts_ok(&before) >= 2.0, "{body}");
    assert!(
        total(
            &after,
            "daylog_llm_attempts_total",
            &[("task", "analysis"), ("outcome", "ok")]
        ) >= 1.0,
        "{body}"
    );
    assert!(
        total(
            &after,
            "daylog_telegram_calls_total",
            &[("method", "sendMessage"), ("status", "ok")]
        ) >= 1.0,
        "{body}"
    );
    assert!(body.contains("daylog_answer_seconds_bucket"), "{body}");
    // Every key of every step, none cooling while the providers answer.
    let cooling: Vec<_> = after
        .samples
        .iter()
        .filter(|s| s.metric == "daylog_llm_cooldown")
        .collect();
    assert!(
        cooling.iter().any(
            |s| s.labels.get("provider") == Some("mistral") && s.labels.get("key") == Some("0")
        ),
        "{body}"
    );
    assert_eq!(total(&after, "daylog_llm_cooldown", &[]), 0.0, "{body}");
    // What the budgets have left: the metrics' one request taken from Groq's day
    // (100 000 declared by the test setup), nothing from a budget not declared.
    let groq_day: Vec<f64> = after
        .samples
        .iter()
        .filter(|s| s.metric == "daylog_llm_budget_left_requests")
        .filter(|s| {
            s.labels.get("provider") == Some("groq") && s.labels.get("window") == Some("day")
        })
        .filter_map(|s| match s.value {
            prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Untyped(v) => Some(v),
            _ => None,
        })
        .collect();
    assert!(
        groq_day.iter().all(|left| (1.0..=100_000.0).contains(left))
            && groq_day.iter().any(|left| *left < 100_000.0),
        "{groq_day:?}: {body}"
    );
    assert_eq!(
        total(
            &after,
            "daylog_llm_budget_left_requests",
            &[("provider", "mistral"), ("window", "day")],
        ),
        0.0,
        "Mistral declares no daily budget: {body}"
    );
    assert!(
        body.contains("daylog_entries_pending"),
        "the pending gauge: {body}"
    );
    for secret in [
        CHAT.to_string().as_str(),
        ENTRY,
        "Quokka",
        support::telegram::TOKEN,
        "test-mistral-key",
        "test-gemini-key",
        "test-groq-key",
    ] {
        assert!(!body.contains(secret), "{secret:?} in the scrape:\n{body}");
    }

    signal(&bot, "TERM");
    let status = bot.wait().expect("wait");
    assert_eq!(status.code(), Some(0));
    // Nothing answers once the daemon is gone: the healthcheck fails.
    assert_eq!(doctor_ready(&listen).status.code(), Some(1));
}

#[tokio::test]
async fn readyz_is_503_from_the_moment_shutdown_starts() {
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let telegram = FakeTelegram::start().await;
    // Providers that take 30 s: an analysis in flight holds the shutdown for its grace.
    let providers = Providers::start().await;
    providers.slow(Duration::from_secs(30)).await;
    let mut env = http_env(&db, &telegram, &providers, false);
    env.insert("DAYLOG__RETRY__REQUEST_TIMEOUT_MS".into(), "60000".into());
    env.insert("DAYLOG__RETRY__DEADLINE_MS".into(), "60000".into());
    env.insert("DAYLOG__TELEGRAM__SHUTDOWN_GRACE_MS".into(), "9000".into());
    let log = support::bot_log_path(&env);
    let bot = support::spawn_daylog(&env, &log);
    let (listen, _) = bound_addresses(&log, false).await;
    let readyz = format!("http://{listen}/readyz");
    assert_eq!(get(&readyz).await.0, 200);

    telegram.push_update(text_update(CHAT, 1, ENTRY));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while providers.analysis_requests().await == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "analysis never started"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    signal(&bot, "TERM");
    // The process still finishes its work: the probe answers, and says not ready.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
    loop {
        let (status, body) = get(&readyz).await;
        if status == 503 {
            assert_eq!(body.trim(), "stopping");
            break;
        }
        assert_eq!(status, 200, "{body}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "/readyz still 200 after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(get(&format!("http://{listen}/healthz")).await.0, 200);
    drop(bot);
}

/// Runs `daylog run` with `env` over a clean environment.
fn run_with(dir: &std::path::Path, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_daylog"));
    cmd.arg("run")
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("TELOXIDE_TOKEN", support::telegram::TOKEN)
        .stdin(std::process::Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("daylog runs")
}

#[test]
fn metrics_on_the_public_address_or_an_address_that_is_none_exits_2_with_a_sentence() {
    let dir = tempfile::tempdir().expect("dir");
    let same = run_with(
        dir.path(),
        &[
            ("DAYLOG__HTTP__LISTEN", "127.0.0.1:8080"),
            ("DAYLOG__HTTP__METRICS_LISTEN", "127.0.0.1:8080"),
        ],
    );
    let said = String::from_utf8_lossy(&same.stderr);
    assert_eq!(same.status.code(), Some(2), "{said}");
    assert!(
        said.contains("http.metrics_listen") && said.contains("same address"),
        "{said}"
    );

    let garbled = run_with(dir.path(), &[("DAYLOG__HTTP__LISTEN", "localhost")]);
    let said = String::from_utf8_lossy(&garbled.stderr);
    assert_eq!(garbled.status.code(), Some(2), "{said}");
    assert!(
        said.contains("http.listen") && said.contains("address"),
        "{said}"
    );
    // Nothing was started or created by a refused configuration.
    assert!(!dir.path().join("data").exists());
}

#[test]
fn doctor_ready_without_a_listener_fails() {
    let dir = tempfile::tempdir().expect("dir");
    let out = Command::new(env!("CARGO_BIN_EXE_daylog"))
        .args(["doctor", "--ready"])
        .current_dir(dir.path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("daylog runs");
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("http.listen"), "{said}");
}
