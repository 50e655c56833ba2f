//! Issue 10's audit: behaviours of the budgets (docs/behaviour.md, "Budgets") that `budgets.rs` did not pin down,
//! against fake providers on 127.0.0.1 (wiremock). Each header and body shape teaches
//! the wait it names (not just "some" wait); nonsense in any of them behaves exactly as a
//! 429 that says nothing; and when no step has budget the request waits for the soonest
//! one within the deadline, or ends without a request when none returns in time.

#![expect(
    clippy::expect_used,
    reason = "test helpers outside #[test] fns: a failure is a test failure"
)]

use crate::support;

use std::time::{Duration, SystemTime};

use daylog::llm::{ChatRequest, Llm, Outcome, Task};
use support::llm::*;
use wiremock::{MockServer, ResponseTemplate};

const KEYS: [(&str, &str); 2] = [("A_API_KEY", "key-a"), ("B_API_KEY", "key-b")];

/// Provider `a` of `a_kind` (with `budget` lines under its budget table) then an always
/// healthy openai provider `b`; steps a/m1 then b/m2; `extra` is appended (settings).
fn config(a: &MockServer, a_kind: &str, budget: &str, b: &MockServer, extra: &str) -> String {
    let a_url = match a_kind {
        "gemini" => format!("{}/v1beta", a.uri()),
        _ => format!("{}/v1", a.uri()),
    };
    let mut toml = FAST_RETRY.to_owned();
    toml.push_str(extra);
    toml.push_str(&provider("a", a_kind, &a_url));
    toml.push_str(&format!("[providers.a.budget]\n{budget}\n"));
    toml.push_str(&provider("b", "openai", &format!("{}/v1", b.uri())));
    toml.push_str(&analysis_steps(&[("a", "m1"), ("b", "m2")]));
    toml
}

fn llm(toml: &str) -> Llm {
    Llm::new(&settings(toml, &KEYS)).expect("llm")
}

fn ok() -> ResponseTemplate {
    json_reply(200, "openai/chat_completion.json")
}

/// The milliseconds a `skipped_budget` record says the budget stays spent.
fn spent_ms(error: &str) -> u64 {
    error
        .strip_prefix("budget spent for ")
        .and_then(|rest| rest.strip_suffix("ms more"))
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("not a budget skip: {error:?}"))
}

fn gemini_429(details: &str) -> ResponseTemplate {
    let body = format!(
        r#"{{"error":{{"code":429,"status":"RESOURCE_EXHAUSTED","message":"quota","details":{details}}}}}"#
    );
    ResponseTemplate::new(429).set_body_raw(body, "application/json")
}

/// One header or body shape: what `a` answers, and the wait in ms it names.
struct Shape {
    name: &'static str,
    kind: &'static str,
    answer: ResponseTemplate,
    /// Whether the answer is a 429 (then `b` answers the first request).
    rate_limited: bool,
    said_ms: u64,
}

fn shapes() -> Vec<Shape> {
    let in_two_minutes = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(120));
    let openai_429 = || ResponseTemplate::new(429).set_body_string("{\"message\":\"slow down\"}");
    vec![
        Shape {
            name: "x-ratelimit-reset-requests 2m59.56s",
            kind: "openai",
            answer: ok()
                .insert_header("x-ratelimit-remaining-requests", "0")
                .insert_header("x-ratelimit-reset-requests", "2m59.56s"),
            rate_limited: false,
            said_ms: 179_560,
        },
        Shape {
            name: "x-ratelimit-reset-tokens 7.66s",
            kind: "openai",
            answer: ok()
                .insert_header("x-ratelimit-remaining-requests", "12")
                .insert_header("x-ratelimit-reset-requests", "2s")
                .insert_header("x-ratelimit-remaining-tokens", "0")
                .insert_header("x-ratelimit-reset-tokens", "7.66s"),
            rate_limited: false,
            said_ms: 7_660,
        },
        Shape {
            name: "x-ratelimit-reset-requests 1h2m",
            kind: "openai",
            answer: ok()
                .insert_header("x-ratelimit-remaining-requests", "0")
                .insert_header("x-ratelimit-reset-requests", "1h2m"),
            rate_limited: false,
            said_ms: 3_720_000,
        },
        Shape {
            name: "429 with x-ratelimit-reset-requests",
            kind: "openai",
            answer: openai_429()
                .insert_header("x-ratelimit-remaining-requests", "0")
                .insert_header("x-ratelimit-reset-requests", "2m59.56s"),
            rate_limited: true,
            said_ms: 179_560,
        },
        Shape {
            name: "retry-after in seconds",
            kind: "openai",
            answer: openai_429().insert_header("retry-after", "30"),
            rate_limited: true,
            said_ms: 30_000,
        },
        Shape {
            name: "retry-after as an HTTP date",
            kind: "openai",
            answer: openai_429().insert_header("retry-after", in_two_minutes.as_str()),
            rate_limited: true,
            said_ms: 120_000,
        },
        Shape {
            name: "retry-after-ms",
            kind: "openai",
            answer: openai_429().insert_header("retry-after-ms", "45000"),
            rate_limited: true,
            said_ms: 45_000,
        },
        Shape {
            name: "Gemini RetryInfo.retryDelay",
            kind: "gemini",
            answer: gemini_429(
                r#"[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"52s"}]"#,
            ),
            rate_limited: true,
            said_ms: 52_000,
        },
    ]
}

/// Item 1 of issue 10: every shape the providers use to say when a budget returns
/// teaches that very wait — the next request skips `a` without a request, and the skip
/// says it is spent for (at most, and about) what the answer said.
#[tokio::test]
async fn each_header_and_body_shape_teaches_the_wait_it_names() {
    let runs = shapes().into_iter().map(|shape| async move {
        let a = server_with(shape.answer).await;
        let b = ok_server().await;
        let llm = llm(&config(&a, shape.kind, "per = \"model\"", &b, ""));
        let sink = RecordingSink::default();
        let first = llm
            .run(Task::Analysis, &request(false), &sink)
            .await
            .expect("first answer");
        let skips_before = sink.count("m1", Outcome::SkippedBudget);
        let second = llm
            .run(Task::Analysis, &request(false), &sink)
            .await
            .expect("second answer");
        let skip = sink
            .attempts()
            .into_iter()
            .filter(|a| a.model == "m1" && a.outcome == Outcome::SkippedBudget)
            .nth(skips_before)
            .unwrap_or_else(|| panic!("{}: the second request skipped a", shape.name));
        let left = spent_ms(&skip.error.unwrap_or_default());
        (
            shape.name,
            shape.rate_limited,
            shape.said_ms,
            first.provider,
            second.provider,
            calls(&a).await,
            left,
        )
    });
    for (name, rate_limited, said, first, second, a_calls, left) in
        futures::future::join_all(runs).await
    {
        let expected_first = if rate_limited { "b" } else { "a" };
        assert_eq!(
            (first.as_str(), second.as_str()),
            (expected_first, "b"),
            "{name}"
        );
        assert_eq!(a_calls, 1, "{name}: no request on the spent budget");
        // The said wait, less the moments between the answer and the skip: far more
        // than half of it, never more (a misread unit is off by 60×, 1000× or more).
        assert!(
            left <= said && left > said / 2,
            "{name}: spent for {left} ms, the answer said {said} ms"
        );
    }
}

/// A 429 whose headers and body make no sense — what a hintless 429 gets from `a`:
/// the same attempts, in the same order, with the same outcomes.
async fn as_a_hintless_429(kind: &str, answer: ResponseTemplate) -> (usize, Vec<String>) {
    let a = server_with(answer).await;
    let b = ok_server().await;
    let llm = llm(&config(&a, kind, "", &b, ""));
    let sink = RecordingSink::default();
    let answer = llm
        .run(Task::Analysis, &request(false), &sink)
        .await
        .expect("the cascade goes on to b");
    assert_eq!(answer.provider, "b");
    let trace = sink
        .attempts()
        .into_iter()
        .map(|a| {
            format!(
                "{} key {:?} round {} {} waited:{}",
                a.model,
                a.key_index,
                a.attempt,
                a.outcome,
                a.wait_ms > 0
            )
        })
        .collect();
    (calls(&a).await, trace)
}

/// The bad-input paragraph of issue 10: nonsense rate-limit headers and bodies —
/// negative, unparsable, not finite, a reset now or in the past — never panic, never
/// stop the cascade, and fall back to the 429 rules: `a` is treated exactly as after a
/// 429 that says nothing (lowered rate, a short pause, one more try, then the next step).
#[tokio::test]
async fn nonsense_hints_are_treated_exactly_as_a_hintless_429() {
    let openai_429 = || ResponseTemplate::new(429).set_body_string("{\"message\":\"nope\"}");
    let header = |name: &'static str, value: &'static str| openai_429().insert_header(name, value);
    let nonsense: Vec<(&str, &str, ResponseTemplate)> = vec![
        (
            "negative retry-after",
            "openai",
            header("retry-after", "-5"),
        ),
        (
            "unparsable retry-after",
            "openai",
            header("retry-after", "soon"),
        ),
        ("retry-after NaN", "openai", header("retry-after", "NaN")),
        (
            "non-finite retry-after",
            "openai",
            header("retry-after", "1e400"),
        ),
        (
            "retry-after in the past",
            "openai",
            header("retry-after", "Sun, 06 Nov 1994 08:49:37 GMT"),
        ),
        (
            "negative retry-after-ms",
            "openai",
            header("retry-after-ms", "-250"),
        ),
        (
            "unparsable retry-after-ms",
            "openai",
            header("retry-after-ms", "1.5.6"),
        ),
        (
            "a reset in the past",
            "openai",
            header("x-ratelimit-remaining-requests", "0")
                .insert_header("x-ratelimit-reset-requests", "-3s"),
        ),
        (
            "a reset now",
            "openai",
            header("x-ratelimit-remaining-requests", "0")
                .insert_header("x-ratelimit-reset-requests", "0s"),
        ),
        (
            "negative remaining, unparsable reset",
            "openai",
            header("x-ratelimit-remaining-requests", "-1")
                .insert_header("x-ratelimit-reset-requests", "1x2y")
                .insert_header("x-ratelimit-remaining-tokens", "lots")
                .insert_header("x-ratelimit-reset-tokens", "9999999999999999999999h"),
        ),
        (
            "negative retryDelay",
            "gemini",
            gemini_429(
                r#"[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"-5s"}]"#,
            ),
        ),
        (
            "unparsable retryDelay",
            "gemini",
            gemini_429(
                r#"[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"soon"}]"#,
            ),
        ),
        (
            "retryDelay not a string",
            "gemini",
            gemini_429(r#"[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":52}]"#),
        ),
        (
            "QuotaFailure without violations",
            "gemini",
            gemini_429(
                r#"[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":"x"}]"#,
            ),
        ),
        ("details not a list", "gemini", gemini_429(r#""x""#)),
        // Huge but finite waits: no provider means them (a daily quota resets within a
        // day), so one bogus header does not take a key out for a day.
        (
            "a huge retry-after",
            "openai",
            header("retry-after", "1e30"),
        ),
        (
            "a retry-after past u64",
            "openai",
            header("retry-after", "18446744073709551616"),
        ),
        (
            "a huge retry-after-ms",
            "openai",
            header("retry-after-ms", "1e30"),
        ),
        (
            "a retry-after in the year 9999",
            "openai",
            header("retry-after", "Fri, 31 Dec 9999 23:59:59 GMT"),
        ),
        (
            "a reset in 99999999 hours",
            "openai",
            header("x-ratelimit-remaining-requests", "0")
                .insert_header("x-ratelimit-reset-requests", "99999999h"),
        ),
        (
            "a retryDelay of a century",
            "gemini",
            gemini_429(
                r#"[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"3155760000s"}]"#,
            ),
        ),
    ];
    let (openai, gemini) = tokio::join!(
        as_a_hintless_429("openai", openai_429()),
        as_a_hintless_429("gemini", gemini_429("[]")),
    );
    // The 429 rules for a hintless 429 on a step's only key, as the control runs show.
    for (kind, (a_calls, trace)) in [("openai", &openai), ("gemini", &gemini)] {
        assert_eq!(
            *a_calls, 2,
            "{kind}: tried again after a short pause: {trace:?}"
        );
    }
    let runs = nonsense.into_iter().map(|(name, kind, answer)| async move {
        (name, kind, as_a_hintless_429(kind, answer).await)
    });
    for (name, kind, got) in futures::future::join_all(runs).await {
        let control = if kind == "gemini" { &gemini } else { &openai };
        assert_eq!(&got, control, "{name}");
    }
}

/// Item 2 of issue 10: no step has budget. The request waits for the step whose budget
/// returns first — here the second one (a second away), not the first (a minute
/// away) — sends nothing meanwhile, and records both skips.
#[tokio::test]
async fn with_no_step_in_budget_the_request_waits_for_the_soonest_one() {
    let a = ok_server().await;
    let b = ok_server().await;
    // Nothing is worth waiting for while another step has budget, and the deadline is
    // longer than either budget's return.
    let extra = "[budgets]\nspill_after_ms = 0\nnotify_after_ms = 600000\n";
    let toml = config(&a, "openai", "requests_per_minute = 1", &b, extra)
        .replace("deadline_ms = 20000", "deadline_ms = 120000")
        .replace(
            "[providers.b]\n",
            "[providers.b]\nbudget = { requests_per_second = 1 }\n",
        );
    let llm = llm(&toml);
    let sink = RecordingSink::default();

    let mut providers = Vec::new();
    for _ in 0..3 {
        let answer = llm
            .run(Task::Analysis, &request(false), &sink)
            .await
            .expect("answer");
        providers.push(answer.provider);
    }

    assert_eq!(providers, ["a", "b", "b"], "{:?}", sink.attempts());
    assert_eq!(calls(&a).await, 1, "a's minute is never hammered");
    assert_eq!(calls(&b).await, 2, "one request per second on b");
    let last = sink.attempts().into_iter().last().expect("an attempt");
    assert_eq!((last.model.as_str(), last.outcome), ("m2", Outcome::Ok));
    assert!(last.wait_ms > 0, "it waited for b's budget: {last:?}");
    assert!(sink.count("m1", Outcome::SkippedBudget) >= 2);
    assert!(sink.count("m2", Outcome::SkippedBudget) >= 1);
}

/// …and when no budget returns within the deadline, the task ends at once without a
/// request, rather than hammering a spent budget.
#[tokio::test]
async fn with_no_budget_back_before_the_deadline_nothing_is_sent() {
    let a = ok_server().await;
    let b = ok_server().await;
    let extra = "[budgets]\nspill_after_ms = 0\nnotify_after_ms = 600000\n";
    let toml = config(&a, "openai", "requests_per_minute = 1", &b, extra)
        .replace("deadline_ms = 20000", "deadline_ms = 5000")
        .replace(
            "[providers.b]\n",
            "[providers.b]\nbudget = { requests_per_minute = 1 }\n",
        );
    let llm = llm(&toml);
    let sink = RecordingSink::default();
    for expected in ["a", "b"] {
        let answer = llm
            .run(Task::Analysis, &request(false), &sink)
            .await
            .expect("answer");
        assert_eq!(answer.provider, expected);
    }
    let before = sink.attempts().len();

    let err = llm
        .run(Task::Analysis, &request(false), &sink)
        .await
        .expect_err("no budget within the deadline");

    assert!(
        !matches!(err, daylog::llm::CascadeError::DeadlineExceeded { .. }),
        "ended at once, not at the deadline: {err}"
    );
    assert_eq!((calls(&a).await, calls(&b).await), (1, 1), "nothing sent");
    let outcomes: Vec<(String, Outcome)> = sink.outcomes().split_off(before);
    assert_eq!(
        outcomes,
        [
            ("m1".to_owned(), Outcome::SkippedBudget),
            ("m2".to_owned(), Outcome::SkippedBudget)
        ]
    );
}

/// Item 5 of issue 10 at the cascade's level: a burst larger than a budget allows is
/// sent at the budget's pace (one request a second here), in the order the requests
/// came — the oldest first — with no request on the spent budget meanwhile.
#[tokio::test]
async fn a_burst_drains_at_the_budgets_pace_oldest_first() {
    let a = ok_server().await;
    let mut toml = FAST_RETRY.to_owned();
    toml.push_str("[budgets]\nspill_after_ms = 10000\nnotify_after_ms = 600000\n");
    toml.push_str(&provider("a", "openai", &format!("{}/v1", a.uri())));
    toml.push_str("[providers.a.budget]\nrequests_per_second = 1\n");
    toml.push_str(&analysis_steps(&[("a", "m1")]));
    let llm = std::sync::Arc::new(llm(&toml));
    let sink = std::sync::Arc::new(RecordingSink::default());

    // Started one after the other: each has joined the budget's queue before the next
    // starts (a current-thread runtime runs spawned tasks in order, up to their wait).
    let mut tasks = Vec::new();
    for n in 0..4 {
        let (llm, sink) = (std::sync::Arc::clone(&llm), std::sync::Arc::clone(&sink));
        tasks.push(tokio::spawn(async move {
            let request = ChatRequest {
                user: format!("entry number {n}"),
                ..request(false)
            };
            llm.run(Task::Analysis, &request, &*sink).await
        }));
        tokio::task::yield_now().await;
    }
    for task in futures::future::join_all(tasks).await {
        assert_eq!(task.expect("task").expect("answer").provider, "a");
    }

    let sent: Vec<usize> = a
        .received_requests()
        .await
        .expect("recording on")
        .iter()
        .map(|r| {
            let body = String::from_utf8_lossy(&r.body);
            (0..4)
                .find(|n| body.contains(&format!("entry number {n}")))
                .expect("one of the entries")
        })
        .collect();
    assert_eq!(sent, [0, 1, 2, 3], "one request each, oldest first");
    let waits: Vec<u64> = sink
        .attempts()
        .into_iter()
        .filter(|a| a.outcome == Outcome::Ok)
        .map(|a| a.wait_ms)
        .collect();
    assert!(
        waits.windows(2).all(|w| w[0] < w[1]),
        "each waited for the one before it: {waits:?}"
    );
    assert_eq!(sink.count("m1", Outcome::Retryable), 0, "no 429 asked for");
}
