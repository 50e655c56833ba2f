//! Budgets (docs/behaviour.md, "Budgets") against fake providers on 127.0.0.1 (wiremock): no
//! request on a budget known to be spent, spill-over to the next step with budget, limits
//! declared in config and learned from each header and body shape, waiting for the
//! soonest budget when no step has one, and nonsense hints that fall back to the 429
//! rules.

#![expect(
    clippy::expect_used,
    reason = "test helpers outside #[test] fns: a failure is a test failure"
)]

use crate::support;

use daylog::llm::{Llm, Outcome, Task};
use support::llm::*;
use wiremock::{MockServer, ResponseTemplate};

const KEYS: [(&str, &str); 3] = [
    ("A_API_KEY", "key-a"),
    ("B_API_KEY", "key-b"),
    ("G_API_KEY", "key-g"),
];

/// Provider `a` (kind `a_kind`, with `a_budget` lines under its `budget` table) and an
/// always healthy openai provider `b`; steps a/m1 then b/m2.
fn config(a: &MockServer, a_kind: &str, a_budget: &str, b: &MockServer) -> String {
    let a_url = match a_kind {
        "gemini" => format!("{}/v1beta", a.uri()),
        _ => format!("{}/v1", a.uri()),
    };
    let mut toml = FAST_RETRY.to_owned();
    toml.push_str(&provider("a", a_kind, &a_url));
    toml.push_str(&format!("[providers.a.budget]\n{a_budget}\n"));
    toml.push_str(&provider("b", "openai", &format!("{}/v1", b.uri())));
    toml.push_str(&analysis_steps(&[("a", "m1"), ("b", "m2")]));
    toml
}

fn llm(toml: &str) -> Llm {
    Llm::new(&settings(toml, &KEYS)).expect("llm")
}

/// Two runs; the answers' providers.
async fn two_runs(llm: &Llm, sink: &RecordingSink) -> (String, String) {
    let first = llm
        .run(Task::Analysis, &request(false), sink)
        .await
        .expect("first answer");
    let second = llm
        .run(Task::Analysis, &request(false), sink)
        .await
        .expect("second answer");
    (first.provider, second.provider)
}

#[tokio::test]
async fn a_declared_budget_spills_over_without_a_request() {
    let a = ok_server().await;
    let b = ok_server().await;
    let llm = llm(&config(&a, "openai", "requests_per_minute = 1", &b));
    let sink = RecordingSink::default();

    let (first, second) = two_runs(&llm, &sink).await;

    assert_eq!((first.as_str(), second.as_str()), ("a", "b"));
    assert_eq!(calls(&a).await, 1, "no request on the spent budget");
    assert_eq!(calls(&b).await, 1);
    assert_eq!(sink.count("m1", Outcome::SkippedBudget), 1);
}

#[tokio::test]
async fn groq_headers_teach_a_spent_budget() {
    let a = server_with(
        json_reply(200, "openai/chat_completion.json")
            .insert_header("x-ratelimit-remaining-requests", "0")
            .insert_header("x-ratelimit-reset-requests", "2m59.56s")
            .insert_header("x-ratelimit-remaining-tokens", "5900")
            .insert_header("x-ratelimit-reset-tokens", "7.66s"),
    )
    .await;
    let b = ok_server().await;
    let llm = llm(&config(&a, "openai", "per = \"model\"", &b));
    let sink = RecordingSink::default();

    let (first, second) = two_runs(&llm, &sink).await;

    assert_eq!((first.as_str(), second.as_str()), ("a", "b"));
    assert_eq!(calls(&a).await, 1);
    assert_eq!(sink.count("m1", Outcome::SkippedBudget), 1);
}

#[tokio::test]
async fn spent_tokens_count_too() {
    let a = server_with(
        json_reply(200, "openai/chat_completion.json")
            .insert_header("x-ratelimit-remaining-tokens", "0")
            .insert_header("x-ratelimit-reset-tokens", "1h2m"),
    )
    .await;
    let b = ok_server().await;
    let llm = llm(&config(&a, "openai", "", &b));
    let sink = RecordingSink::default();
    let (first, second) = two_runs(&llm, &sink).await;
    assert_eq!((first.as_str(), second.as_str()), ("a", "b"));
    assert_eq!(calls(&a).await, 1);
}

/// A 429 naming its reset spills over at once (no backoff round on a) and the next
/// request does not try a again: for `Retry-After` and `retry-after-ms` alike.
#[tokio::test]
async fn a_429_with_a_reset_spills_over_at_once_and_is_remembered() {
    for (name, value) in [("retry-after", "30"), ("retry-after-ms", "30000")] {
        let a = server_with(
            ResponseTemplate::new(429)
                .insert_header(name, value)
                .set_body_string("{\"message\":\"slow down\"}"),
        )
        .await;
        let b = ok_server().await;
        let llm = llm(&config(&a, "openai", "", &b));
        let sink = RecordingSink::default();

        let (first, second) = two_runs(&llm, &sink).await;

        assert_eq!((first.as_str(), second.as_str()), ("b", "b"), "{name}");
        assert_eq!(calls(&a).await, 1, "{name}: one 429, never a second");
        assert!(sink.count("m1", Outcome::SkippedBudget) >= 1, "{name}");
    }
}

#[tokio::test]
async fn gemini_retry_info_spends_the_budget_for_its_delay() {
    let a = server_with(json_reply(429, "gemini/resource_exhausted.json")).await;
    let b = ok_server().await;
    let llm = llm(&config(&a, "gemini", "per = \"model\"", &b));
    let sink = RecordingSink::default();

    let (first, second) = two_runs(&llm, &sink).await;

    assert_eq!((first.as_str(), second.as_str()), ("b", "b"));
    assert_eq!(calls(&a).await, 1);
    let skip = sink
        .attempts()
        .into_iter()
        .find(|a| a.outcome == Outcome::SkippedBudget)
        .expect("a skip");
    let error = skip.error.unwrap_or_default();
    assert!(error.contains("budget spent"), "{error}");
}

#[tokio::test]
async fn gemini_per_day_quota_failure_is_spent_until_the_daily_reset() {
    let body = r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[
        {"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[
          {"quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]},
        {"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"1s"}]}}"#;
    let a = server_with(ResponseTemplate::new(429).set_body_raw(body, "application/json")).await;
    let b = ok_server().await;
    let llm = llm(&config(&a, "gemini", "per = \"model\"", &b));
    let sink = RecordingSink::default();

    let (first, second) = two_runs(&llm, &sink).await;

    assert_eq!((first.as_str(), second.as_str()), ("b", "b"));
    assert_eq!(
        calls(&a).await,
        1,
        "a 1 s delay on a per-day quota is not believed"
    );
    let skip = sink
        .attempts()
        .into_iter()
        .find(|a| a.outcome == Outcome::SkippedBudget)
        .expect("a skip");
    let error = skip.error.unwrap_or_default();
    let left_ms: u64 = error
        .trim_start_matches("budget spent for ")
        .trim_end_matches("ms more")
        .parse()
        .expect("a number of ms");
    assert!(left_ms > 60_000, "until the daily reset: {error}");
}

/// Nonsense rate-limit headers never stop the cascade: the 429 rules apply.
#[tokio::test]
async fn nonsense_hints_fall_back_to_the_429_rules() {
    let a = server_with(
        ResponseTemplate::new(429)
            .insert_header("retry-after", "-5")
            .insert_header("retry-after-ms", "soon")
            .insert_header("x-ratelimit-remaining-requests", "-1")
            .insert_header("x-ratelimit-reset-requests", "1x2y"),
    )
    .await;
    let b = ok_server().await;
    let llm = llm(&config(&a, "openai", "", &b));
    let sink = RecordingSink::default();
    let answer = llm
        .run(Task::Analysis, &request(false), &sink)
        .await
        .expect("an answer from b");
    assert_eq!(answer.provider, "b");
    assert!(calls(&a).await >= 1);
}

/// With one step whose budget is spent for a moment, the request waits for it rather
/// than failing or sending on the spent budget.
#[tokio::test]
async fn with_no_other_step_the_request_waits_for_the_budget() {
    let a = ok_server().await;
    let mut toml = FAST_RETRY.to_owned();
    toml.push_str(&provider("a", "openai", &format!("{}/v1", a.uri())));
    toml.push_str("[providers.a.budget]\nrequests_per_second = 1\n");
    toml.push_str("[budgets]\nspill_after_ms = 0\nnotify_after_ms = 20000\n");
    toml.push_str(&analysis_steps(&[("a", "m1")]));
    let llm = llm(&toml);
    let sink = RecordingSink::default();

    let (first, second) = two_runs(&llm, &sink).await;

    assert_eq!((first.as_str(), second.as_str()), ("a", "a"));
    assert_eq!(calls(&a).await, 2, "no extra request while waiting");
    let waited = sink
        .attempts()
        .into_iter()
        .filter(|a| a.outcome == Outcome::Ok)
        .map(|a| a.wait_ms)
        .max()
        .unwrap_or_default();
    assert!(waited > 0, "the second request waited for the budget");
}

/// A provider that answers only after `delay` (longer than any test waits on success).
async fn slow_server(delay: std::time::Duration) -> MockServer {
    server_with(json_reply(200, "openai/chat_completion.json").set_delay(delay)).await
}

/// Polls until `server` has received `n` requests, failing if any task ended first
/// (a request that waits in a local queue never arrives while the others are held).
async fn until_received(
    server: &MockServer,
    n: usize,
    tasks: &[tokio::task::JoinHandle<Result<daylog::llm::Completion, daylog::llm::CascadeError>>],
) {
    while calls(server).await < n {
        assert!(
            tasks.iter().all(|t| !t.is_finished()),
            "a task ended before {n} requests reached the first step"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_full_concurrency_cap_spills_over_instead_of_queueing() {
    // The first step holds its one slot for longer than the test runs on success.
    let a = slow_server(std::time::Duration::from_secs(30)).await;
    let b = ok_server().await;
    let toml = config(&a, "openai", "", &b)
        .replace("[providers.a]\n", "[providers.a]\nmax_concurrency = 1\n");
    let llm = std::sync::Arc::new(llm(&toml));
    let sink = std::sync::Arc::new(RecordingSink::default());
    let first = {
        let (llm, sink) = (std::sync::Arc::clone(&llm), std::sync::Arc::clone(&sink));
        tokio::spawn(async move { llm.run(Task::Analysis, &request(false), &*sink).await })
    };
    until_received(&a, 1, std::slice::from_ref(&first)).await;

    let second = llm
        .run(Task::Analysis, &request(false), &*sink)
        .await
        .expect("second answer");

    assert_eq!(second.provider, "b", "answered by the next step");
    assert!(!first.is_finished(), "while the first still holds the slot");
    assert_eq!(calls(&a).await, 1);
    assert_eq!(sink.count("m1", Outcome::SkippedBudget), 1);
    first.abort();
}

#[tokio::test]
async fn without_a_cap_twenty_concurrent_requests_all_reach_the_first_step() {
    const TASKS: usize = 20;
    // Long enough for 20 requests to be sent on a loaded machine, short for the test.
    let a = slow_server(std::time::Duration::from_secs(2)).await;
    let b = ok_server().await;
    // The shipped default: no max_concurrency line.
    let llm = std::sync::Arc::new(llm(&config(&a, "openai", "", &b)));
    let sink = std::sync::Arc::new(RecordingSink::default());
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (llm, sink) = (std::sync::Arc::clone(&llm), std::sync::Arc::clone(&sink));
            tokio::spawn(async move { llm.run(Task::Analysis, &request(false), &*sink).await })
        })
        .collect();

    until_received(&a, TASKS, &tasks).await;

    for task in futures::future::join_all(tasks).await {
        assert_eq!(task.expect("task").expect("answer").provider, "a");
    }
    assert_eq!(calls(&b).await, 0);
    assert_eq!(sink.count("m1", Outcome::SkippedBudget), 0);
}

#[tokio::test]
async fn a_full_cap_with_no_other_step_waits_for_its_slot() {
    let a = slow_server(std::time::Duration::from_millis(200)).await;
    let mut toml = FAST_RETRY.to_owned();
    toml.push_str(&provider("a", "openai", &format!("{}/v1", a.uri())));
    toml.push_str("max_concurrency = 1\n");
    toml.push_str(&analysis_steps(&[("a", "m1")]));
    let llm = std::sync::Arc::new(llm(&toml));
    let sink = std::sync::Arc::new(RecordingSink::default());
    let tasks: Vec<_> = (0..2)
        .map(|_| {
            let (llm, sink) = (std::sync::Arc::clone(&llm), std::sync::Arc::clone(&sink));
            tokio::spawn(async move { llm.run(Task::Analysis, &request(false), &*sink).await })
        })
        .collect();

    for task in futures::future::join_all(tasks).await {
        assert_eq!(task.expect("task").expect("answer").provider, "a");
    }
    assert_eq!(calls(&a).await, 2, "one after the other, none lost");
}

/// A budget that returns within `spill_after_ms` returns for one request, not for
/// every request waiting for it: with one request already waiting, the next one's turn
/// is a second later, and it spills over to the next step instead of queueing.
#[tokio::test]
async fn a_request_counts_those_already_waiting_for_the_budget() {
    let a = ok_server().await;
    let b = ok_server().await;
    let toml = config(&a, "openai", "requests_per_second = 1", &b).replace(
        "[providers.b]",
        "[budgets]\nspill_after_ms = 1200\n\n[providers.b]",
    );
    let llm = llm(&toml);
    let sink = RecordingSink::default();
    let first = llm
        .run(Task::Analysis, &request(false), &sink)
        .await
        .expect("first answer");
    assert_eq!(first.provider, "a");

    // Both see a's budget back within a second; only one of them gets it then.
    let request = request(false);
    let (x, y) = tokio::join!(
        llm.run(Task::Analysis, &request, &sink),
        llm.run(Task::Analysis, &request, &sink),
    );
    let mut providers = vec![x.expect("x").provider, y.expect("y").provider];
    providers.sort();
    assert_eq!(
        providers,
        ["a", "b"],
        "one waited for a's turn, one spilled over"
    );
    assert_eq!(calls(&a).await, 2, "no request on a spent budget");
}

/// A request that waited for its turn and is now in flight has left the queue: its
/// send is counted by the budget itself, not a second time as one still waiting. Here
/// a's budget is 1 request/s and its answers take 3 s: the third request finds a's next
/// slot at most a second away (within `spill_after_ms`) and waits for it, where the
/// second request, counted twice, made it look two seconds away and spill over.
#[tokio::test]
async fn a_request_in_flight_is_no_longer_counted_as_waiting() {
    let a = slow_server(std::time::Duration::from_secs(3)).await;
    let b = ok_server().await;
    let llm = std::sync::Arc::new(llm(&config(&a, "openai", "requests_per_second = 1", &b)));
    let sink = std::sync::Arc::new(RecordingSink::default());
    let run = || {
        let (llm, sink) = (std::sync::Arc::clone(&llm), std::sync::Arc::clone(&sink));
        tokio::spawn(async move {
            llm.run(Task::Analysis, &request(false), sink.as_ref())
                .await
        })
    };
    // The first takes this second's budget, the second waits for the next one.
    let first = run();
    until_received(&a, 1, std::slice::from_ref(&first)).await;
    let second = run();
    until_received(&a, 2, &[first, second]).await;
    // Both are in flight (a answers in 3 s): the next slot is at most a second away.
    let third = run().await.expect("join").expect("third answer");
    assert_eq!(third.provider, "a", "{:?}", sink.attempts());
    assert_eq!(calls(&b).await, 0);
}

/// The wait a log parked for lack of budget is told, and woken by, leaves out the
/// models that refused that log: they will not be asked about it again.
#[tokio::test]
async fn the_budget_wait_of_a_log_leaves_out_the_models_that_refused_it() {
    let (a, b) = (ok_server().await, ok_server().await);
    let mut toml = FAST_RETRY.to_owned();
    toml.push_str(&provider("b", "openai", &format!("{}/v1", b.uri())));
    toml.push_str("[providers.b.budget]\nrequests_per_minute = 1\n");
    toml.push_str(&provider("a", "openai", &format!("{}/v1", a.uri())));
    toml.push_str("[providers.a.budget]\nrequests_per_second = 1\n");
    toml.push_str(&analysis_steps(&[("b", "m2"), ("a", "m1")]));
    let llm = llm(&toml);
    let sink = RecordingSink::default();
    // b takes its minute's request, then a its second's.
    assert_eq!(
        two_runs(&llm, &sink).await,
        ("b".to_owned(), "a".to_owned())
    );

    let soonest = llm.budget_wait(Task::Analysis).expect("no step has budget");
    assert!(
        soonest <= std::time::Duration::from_secs(2),
        "a's second: {soonest:?}"
    );
    let without_a = llm
        .budget_wait_excluding(Task::Analysis, &[daylog::domain::ModelRef::new("a", "m1")])
        .expect("b has none either");
    assert!(
        without_a > std::time::Duration::from_secs(30),
        "b's minute, not a's second: {without_a:?}"
    );
}

/// `request(false)` as the budgets estimate it: its text (30 bytes: 8 tokens, plus 16
/// for the framing) and an answer of 256 tokens.
const ESTIMATED_TOKENS: u32 = 280;

/// Tokens per minute (Groq's free tier counts them per model) count what the answers
/// took: requests in flight together are not held back by a guess (the provider's 429
/// would say when), and once their answers have taken the minute the next request
/// spills over without a request.
#[tokio::test]
async fn declared_tokens_per_minute_spill_over_once_the_answers_took_them() {
    let a = server_with(
        ResponseTemplate::new(200)
            .set_body_json(serde_json::json!({
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "An answer."}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 100, "total_tokens": 200}
            }))
            .set_delay(std::time::Duration::from_millis(200)),
    )
    .await;
    let b = ok_server().await;
    // Three estimates of 280 (840) would not fit in 700 together, but the three go; their
    // answers take 600, beside which a fourth estimate does not fit.
    let llm = llm(&config(
        &a,
        "openai",
        "per = \"model\"\ntokens_per_minute = 700",
        &b,
    ));
    let sink = RecordingSink::default();

    let request = request(false);
    let runs = (0..3).map(|_| llm.run(Task::Analysis, &request, &sink));
    for answer in futures::future::join_all(runs).await {
        assert_eq!(
            answer.expect("answered").provider,
            "a",
            "in flight together"
        );
    }
    let fourth = llm
        .run(Task::Analysis, &request, &sink)
        .await
        .expect("answered");

    assert_eq!(fourth.provider, "b");
    assert_eq!(calls(&a).await, 3, "no request past the minute's tokens");
    assert_eq!(sink.count("m1", Outcome::SkippedBudget), 1);
}

/// The answer's `usage` is what its request cost, not the estimate: a request that
/// took fewer tokens leaves room for more (the fixture reports 50), one that took more
/// leaves less.
#[tokio::test]
async fn the_tokens_an_answer_reports_are_what_its_request_cost() {
    let budget = format!("tokens_per_minute = {}", ESTIMATED_TOKENS * 2 + 40);

    let a = ok_server().await;
    let b = ok_server().await;
    let llm = llm(&config(&a, "openai", &budget, &b));
    let sink = RecordingSink::default();
    for n in 0..5 {
        let answer = llm
            .run(Task::Analysis, &request(false), &sink)
            .await
            .expect("answered");
        assert_eq!(answer.provider, "a", "request {n}: 50 tokens each fit");
    }

    let big = server_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "A long answer."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 400, "total_tokens": 500}
    })))
    .await;
    let llm = self::llm(&config(&big, "openai", &budget, &b));
    let (first, second) = two_runs(&llm, &sink).await;
    assert_eq!(
        (first.as_str(), second.as_str()),
        ("a", "b"),
        "500 taken: 280 more do not fit in 600"
    );
    assert_eq!(calls(&big).await, 1);
}

/// A hedged attempt that lost the race was still sent: the provider counted it, so its
/// estimate counts against the minute's tokens, and the next request does not find a
/// budget that is not there.
#[tokio::test]
async fn an_attempt_cancelled_in_flight_still_took_its_tokens() {
    let a = slow_server(std::time::Duration::from_secs(3)).await;
    let b = ok_server().await;
    // Room for one estimate; a fixed hedge after 50 ms lets b answer first.
    let toml = config(
        &a,
        "openai",
        &format!("tokens_per_minute = {}", ESTIMATED_TOKENS + 100),
        &b,
    )
    .replace("hedge_after_ms = 0", "hedge_after_ms = 50");
    let llm = llm(&toml);
    let sink = RecordingSink::default();

    let (first, second) = two_runs(&llm, &sink).await;

    assert_eq!((first.as_str(), second.as_str()), ("b", "b"));
    assert_eq!(sink.count("m1", Outcome::Cancelled), 1);
    assert_eq!(
        calls(&a).await,
        1,
        "the cancelled one took the minute's tokens"
    );
    assert_eq!(sink.count("m1", Outcome::SkippedBudget), 1);
}
