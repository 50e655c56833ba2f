//! Hedging after a restart (docs/behaviour.md, "Hedging"; issue 10 item 6): what the last run
//! learned of a step's latency is read back from `llm_calls`, so a restarted bot hedges
//! a step that turned slow at the latency it knew, not at the start value it has before
//! any answer. Through the real dispatcher against fakes on 127.0.0.1.

use crate::support;

use std::collections::HashMap;

use daylog::store::LogId;
use serde_json::json;
use support::telegram::text_update;
use support::{App, completion};
use wiremock::matchers::{body_partial_json, method, path};
use wiremock::{Mock, ResponseTemplate};

/// What the second step answers: the reply says which step answered it.
const HEDGED: &str = "Answered by the hedged step.";

fn auto_hedge(env: &mut HashMap<String, String>) {
    env.insert("DAYLOG__RETRY__HEDGE_AFTER_MS".into(), "auto".into());
}

#[tokio::test]
async fn a_restarted_bot_hedges_a_slow_step_at_the_latency_it_learned_before() {
    // Arrange: a first run in which mistral-small answers six entries at once.
    let app = App::spawn_with(auto_hedge).await;
    app.providers.healthy().await;
    for chat in 1..=6 {
        app.telegram
            .push_update(text_update(chat, 1, "A short ordinary day."));
        app.telegram.wait_sent(chat, 1).await;
    }
    app.store.flush_calls().await;
    let (dir, providers) = app.stop().await;
    // The restarted bot: mistral-small now takes 1.2 s, ministral answers at once. With
    // nothing learned, auto hedging would wait min(2 s, request timeout 3 s / 2) = 1.5 s
    // and mistral-small's slow answer would win.
    providers.reset().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(body_partial_json(json!({"model": "mistral-small-2506"})))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(completion(support::ANALYSIS_TEXT))
                .set_delay(std::time::Duration::from_millis(1200)),
        )
        .mount(&providers.mistral)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(body_partial_json(json!({"model": "ministral-14b-2512"})))
        .respond_with(ResponseTemplate::new(200).set_body_json(completion(HEDGED)))
        .mount(&providers.mistral)
        .await;
    providers.answer_metrics(support::METRICS_JSON).await;
    let app = App::spawn_on(dir, providers, auto_hedge).await;

    // Act
    app.telegram
        .push_update(text_update(7, 1, "Another short day."));
    let sent = app.telegram.wait_sent(7, 1).await;

    // Assert: the hedge answered, and mistral-small's attempt was cut short.
    let reply = sent
        .iter()
        .filter_map(|call| call.body["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(reply.contains(HEDGED), "{reply}");
    app.store.flush_calls().await;
    let log: LogId = sqlx::query_scalar("SELECT id FROM day_logs WHERE chat_id = 7")
        .fetch_one(app.store.read_pool().expect("a SQLite store"))
        .await
        .unwrap_or(LogId(0));
    let outcomes: Vec<(String, String)> = sqlx::query_as(
        "SELECT model, outcome FROM llm_calls WHERE day_log_id = ?1 AND task = 'analysis'
         ORDER BY id",
    )
    .bind(log)
    .fetch_all(app.store.read_pool().expect("a SQLite store"))
    .await
    .unwrap_or_default();
    assert!(
        outcomes.contains(&("mistral-small-2506".into(), "cancelled".into()))
            && outcomes.contains(&("ministral-14b-2512".into(), "ok".into())),
        "{outcomes:?}"
    );
    app.stop().await;
}
