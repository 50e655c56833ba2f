//! Content-policy refusals remembered per log, and free-tier budgets (docs/behaviour.md, "Budgets"), through
//! the real dispatcher against fakes on 127.0.0.1. Waits are on conditions.

use crate::support;

use std::time::Duration;

use daylog::language::Language;
use daylog::store::{ChatId, MessageId, UserId};
use daylog::store::{Inserted, NewLog, NewUser, Store};
use serde_json::json;
use support::App;
use support::telegram::text_update;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const WAIT: Duration = Duration::from_secs(20);

async fn requests(server: &MockServer) -> usize {
    server.received_requests().await.unwrap_or_default().len()
}

async fn gemini_refuses(app: &App) {
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "promptFeedback": {"blockReason": "SAFETY"}
        })))
        .mount(&app.providers.gemini)
        .await;
}

async fn mistral_answers(app: &App, status: u16) {
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(ResponseTemplate::new(status).set_body_string("nope"))
        .mount(&app.providers.mistral)
        .await;
}

/// Item 7 of issue 10: with Mistral down and Gemini refusing, the log stays pending —
/// and Gemini is never asked about it again, neither by the worker's later rounds nor
/// when the log finally has no other step left (then it is blocked, without a request).
#[tokio::test]
async fn a_model_that_refused_a_log_is_never_asked_about_it_again() {
    let app = App::spawn().await;
    mistral_answers(&app, 503).await;
    gemini_refuses(&app).await;
    app.providers.answer_metrics(support::METRICS_JSON).await;

    app.telegram
        .push_update(text_update(31, 1, "I'd kill for a coffee."));
    let sent = app.telegram.wait_sent(31, 1).await;
    assert!(
        sent[0].text().contains("will follow"),
        "pending, not blocked, while Mistral may still answer: {}",
        sent[0].text()
    );
    // The worker comes back several times (retry_min_ms = 100) while Mistral is down.
    support::wait_until("three analysis rounds", WAIT, || async {
        app.count("SELECT attempts FROM day_logs WHERE chat_id = 31")
            .await
            >= 3
    })
    .await;
    assert_eq!(
        requests(&app.providers.gemini).await,
        1,
        "Gemini refused once and was not asked again"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM llm_refusals WHERE provider = 'gemini'")
            .await,
        1
    );
    assert_eq!(
        app.count("SELECT count(*) FROM day_logs WHERE status = 'pending'")
            .await,
        1
    );

    // Mistral now rejects the request for good: no step that has not refused is left.
    app.providers.mistral.reset().await;
    mistral_answers(&app, 400).await;
    let sent = app.telegram.wait_sent(31, 2).await;
    assert!(sent[1].text().contains("refused"), "{}", sent[1].text());
    support::wait_until("the log is blocked and answered", WAIT, || async {
        app.count(
            "SELECT count(*) FROM day_logs WHERE status = 'blocked' AND replied_at IS NOT NULL",
        )
        .await
            == 1
    })
    .await;
    assert_eq!(requests(&app.providers.gemini).await, 1, "still only once");
    app.stop().await;
}

/// An edit is a new question: a model that refused the old text may answer the new
/// one; and a refusal of a text that was edited meanwhile is not stored.
#[tokio::test]
async fn an_edit_forgets_the_refusals_of_the_old_text() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}/daylog.db", dir.path().display());
    let store = Store::open_and_migrate(&url, Duration::from_secs(5))
        .await
        .expect("store");
    store
        .upsert_user(&NewUser {
            user_id: UserId(5),
            username: None,
            language: Language::En,
        })
        .await
        .expect("user");
    let Inserted::New(log) = store
        .insert_log(&NewLog {
            user_id: UserId(5),
            chat_id: ChatId(5),
            message_id: MessageId(1),
            text: "old text",
            local_day: None,
            written_at: None,
        })
        .await
        .expect("insert")
    else {
        panic!("a new log");
    };
    let gemini = daylog::domain::ModelRef::new("gemini", "flash");
    store
        .record_refusals(log.id, "old text", &[gemini.clone(), gemini.clone()])
        .await
        .expect("record");
    assert_eq!(
        store.refusals(log.id).await.expect("read"),
        vec![gemini.clone()]
    );

    store
        .update_text(ChatId(5), MessageId(1), "new text")
        .await
        .expect("edit")
        .expect("edited");
    assert!(store.refusals(log.id).await.expect("read").is_empty());
    // A refusal that arrives for the old text after the edit is dropped.
    store
        .record_refusals(log.id, "old text", std::slice::from_ref(&gemini))
        .await
        .expect("record");
    assert!(store.refusals(log.id).await.expect("read").is_empty());
}

/// Item 4 of issue 10: a per-day quota that Gemini reported spent is stored (readable
/// with SQL) and a restarted bot does not spend a request on it again.
#[tokio::test]
async fn a_restart_does_not_spend_a_dead_daily_quota_again() {
    // The shipped budgets, and one round per step: Mistral's 1 request/s budget would
    // otherwise stretch each analysis over seconds of (correct) waiting.
    let one_round = |env: &mut std::collections::HashMap<String, String>| {
        support::shipped_budgets(env);
        env.insert("DAYLOG__RETRY__MAX_ATTEMPTS".into(), "1".into());
    };
    let app = App::spawn_with(one_round).await;
    mistral_answers(&app, 503).await;
    let per_day = r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[
        {"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[
          {"quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]},
        {"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"3s"}]}}"#;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(429).set_body_raw(per_day, "application/json"))
        .mount(&app.providers.gemini)
        .await;
    app.providers.answer_metrics(support::METRICS_JSON).await;
    app.telegram.push_update(text_update(33, 1, "A quiet day."));
    app.telegram.wait_sent(33, 1).await;
    support::wait_until("the spent quota is stored", WAIT, || async {
        app.count(
            "SELECT count(*) FROM llm_budgets WHERE provider = 'gemini' AND key_index = 0
             AND spent_until > datetime('now', '+1 minute')",
        )
        .await
            == 1
    })
    .await;
    let gemini_before = requests(&app.providers.gemini).await;
    assert_eq!(gemini_before, 1, "one 429, then the budget is known spent");
    let (dir, providers) = app.stop().await;

    let app = App::spawn_on(dir, providers, one_round).await;
    let attempts = app
        .count("SELECT attempts FROM day_logs WHERE chat_id = 33")
        .await;
    // The restarted worker takes the pending log up again, several times.
    support::wait_until("two more analysis rounds", WAIT, || async {
        app.count("SELECT attempts FROM day_logs WHERE chat_id = 33")
            .await
            >= attempts + 2
    })
    .await;
    assert_eq!(
        requests(&app.providers.gemini).await,
        gemini_before,
        "no request on the dead daily quota after the restart"
    );
    app.store.flush_calls().await;
    assert!(
        app.count("SELECT count(*) FROM llm_calls WHERE outcome = 'skipped_budget' AND provider = 'gemini'")
            .await
            >= 1
    );
    app.stop().await;
}

/// Item 5 of issue 10: when every step's budget is spent for longer than
/// `notify_after_ms`, the user is told at once, roughly when, and the log is parked
/// until the first budget returns (not on the failure schedule).
#[tokio::test]
async fn with_every_budget_spent_the_user_is_told_roughly_when() {
    let app = App::spawn_with(support::shipped_budgets).await;
    for server in [&app.providers.mistral, &app.providers.gemini] {
        Mock::given(method("POST"))
            .respond_with(
                ResponseTemplate::new(429)
                    .insert_header("retry-after", "150")
                    .set_body_string("{\"message\":\"rate limited\"}"),
            )
            .mount(server)
            .await;
    }
    app.providers.answer_metrics(support::METRICS_JSON).await;
    app.telegram
        .push_update(text_update(34, 1, "Busy evening."));
    let sent = app.telegram.wait_sent(34, 1).await;
    let text = sent[0].text();
    assert!(text.contains("in about 3 minutes"), "{text}");
    assert_eq!(
        app.count(
            "SELECT count(*) FROM day_logs WHERE chat_id = 34 AND status = 'pending'
             AND next_attempt_at > datetime('now', '+100 seconds')"
        )
        .await,
        1,
        "parked until the budget returns"
    );
    // One 429 per budget (Mistral's workspace for both its models, Gemini's model).
    assert_eq!(requests(&app.providers.mistral).await, 1);
    assert_eq!(requests(&app.providers.gemini).await, 1);
    app.stop().await;
}

/// Item 5 of issue 10: a log parked for lack of budget is answered when the budget
/// returns, not at the worker's next poll. The poll is an hour here and the task
/// deadline shorter than the budget's return, so only the budget's wake-up can answer
/// it within the test's wait; the wait is short, so the user is not told "later".
#[tokio::test]
async fn the_worker_is_woken_when_a_parked_logs_budget_returns() {
    let app = App::spawn_with(|env| {
        env.insert("DAYLOG__WORKER__POLL_INTERVAL_MS".into(), "3600000".into());
        env.insert("DAYLOG__RETRY__DEADLINE_MS".into(), "150".into());
    })
    .await;
    for server in [&app.providers.mistral, &app.providers.gemini] {
        Mock::given(method("POST"))
            .respond_with(
                ResponseTemplate::new(429)
                    .insert_header("retry-after-ms", "300")
                    .set_body_string("{\"message\":\"rate limited\"}"),
            )
            .up_to_n_times(1)
            .mount(server)
            .await;
    }
    app.providers.healthy().await;
    app.telegram
        .push_update(text_update(35, 1, "Long day, good run."));
    let sent = app.telegram.wait_sent(35, 1).await;
    assert!(
        sent[0].text().contains(support::ANALYSIS_TEXT),
        "the analysis, with no notice before it: {}",
        sent[0].text()
    );
    app.store.flush_calls().await;
    assert!(
        app.count("SELECT attempts FROM day_logs WHERE chat_id = 35")
            .await
            >= 1,
        "it was parked once, and the worker answered it"
    );
    app.stop().await;
}

/// An analysis that takes longer than `budgets.notify_after_ms` (here a
/// slow provider inside the task deadline) is announced once while it is still on its
/// way, and the analysis itself follows under the late title; one that comes
/// sooner gets no notice.
#[tokio::test]
async fn a_wait_past_notify_after_is_said_and_the_analysis_still_follows() {
    let app = App::spawn_with(|env| {
        env.insert("DAYLOG__BUDGETS__NOTIFY_AFTER_MS".into(), "300".into());
        env.insert("DAYLOG__RETRY__DEADLINE_MS".into(), "10000".into());
    })
    .await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(wiremock::matchers::body_string_contains("slow evening"))
        .and(wiremock::matchers::body_string_contains("mistral-small"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(support::completion(support::ANALYSIS_TEXT))
                .set_delay(Duration::from_millis(1500)),
        )
        .mount(&app.providers.mistral)
        .await;
    app.providers.healthy().await;

    app.telegram
        .push_update(text_update(36, 1, "A slow evening, finally quiet."));
    let sent = app.telegram.wait_sent(36, 2).await;
    assert!(
        sent[0].text().contains("longer than usual"),
        "told first: {}",
        sent[0].text()
    );
    assert!(
        sent[1].text().contains("Here is your analysis")
            && sent[1].text().contains(support::ANALYSIS_TEXT),
        "then the analysis: {}",
        sent[1].text()
    );

    app.telegram.push_update(text_update(37, 1, "A quick one."));
    let sent = app.telegram.wait_sent(37, 1).await;
    assert!(
        sent[0].text().contains(support::ANALYSIS_TEXT),
        "a quick analysis comes with no notice: {}",
        sent[0].text()
    );
    let telegram = app.telegram.clone();
    app.stop().await;
    assert_eq!(telegram.sent_to(36).len(), 2, "one notice, one analysis");
    assert_eq!(telegram.sent_to(37).len(), 1);
}
