//! The weekly digest (docs/behaviour.md, "The weekly digest") through the real dispatcher, a fake Telegram and fake
//! providers: `/week` on demand, the Sunday schedule on the harness's drivable clock,
//! an outage, a 403, a restart, and a kill -9 of the real binary. Digest requests are
//! told from analysis requests by their system prompt.

#![expect(
    clippy::expect_used,
    reason = "helpers outside #[test] fns fail loudly by design"
)]

use crate::support;

use std::time::Duration;

use daylog::language::Language;
use daylog::texts::Texts;
use jiff::Timestamp;
use support::telegram::{Call, edited_update, group_text_update, text_update, text_update_at};
use support::{App, FakeTelegram, Providers, completion, gemini_completion, wait_until};
use wiremock::matchers::{body_string_contains, method};
use wiremock::{Mock, ResponseTemplate};

const WAIT: Duration = Duration::from_secs(20);
/// Only the digest's system prompt says this.
const DIGEST_MARK: &str = "write the user's weekly digest";
const DIGEST_TEXT: &str = "A steady week: your runs went with your best days. Suggestion: plan two runs for the week ahead.";

fn at(text: &str) -> Timestamp {
    text.parse().expect("timestamp")
}

/// Both analysis providers answer digest requests with `text` (before any other mock).
async fn answer_digest(providers: &Providers, text: &str) {
    answer_digest_after(providers, text, Duration::ZERO).await;
}

/// As [`answer_digest`], each answer taking `delay`.
async fn answer_digest_after(providers: &Providers, text: &str, delay: Duration) {
    for (server, body) in [
        (&providers.mistral, completion(text)),
        (&providers.gemini, gemini_completion(text)),
    ] {
        Mock::given(method("POST"))
            .and(body_string_contains(DIGEST_MARK))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(body)
                    .set_delay(delay),
            )
            .with_priority(1)
            .mount(server)
            .await;
    }
}

/// Every healthy answer, the digest included.
async fn healthy(providers: &Providers) {
    providers.healthy().await;
    answer_digest(providers, DIGEST_TEXT).await;
}

/// The bodies of the digest requests the providers received.
async fn digest_requests(providers: &Providers) -> Vec<String> {
    let mut bodies = Vec::new();
    for server in [&providers.mistral, &providers.gemini] {
        for request in server.received_requests().await.unwrap_or_default() {
            let body = String::from_utf8_lossy(&request.body).into_owned();
            if body.contains(DIGEST_MARK) {
                bodies.push(body);
            }
        }
    }
    bodies
}

/// An entry of `user` written at `written` whose extracted summary is `summary`,
/// through the real flow; waits for its answer.
async fn entry(app: &App, user: i64, message_id: i64, written: &str, summary: &str) {
    app.providers.groq.reset().await;
    app.providers
        .answer_metrics(&format!(
            r#"{{"mood":4,"stress":2,"energy":3,"productivity":4,"sleep_hours":7,"activities":["run"],"emotions":["calm"],"summary":"{summary}"}}"#
        ))
        .await;
    let before = app.telegram.sent_to(user).len();
    app.telegram.push_update(text_update_at(
        user,
        message_id,
        &format!("Entry {message_id}"),
        at(written).as_second(),
    ));
    app.telegram.wait_sent(user, before + 1).await;
}

/// Sends a command and waits for its first answer; returns its text.
async fn command(app: &App, user: i64, message_id: i64, text: &str) -> String {
    let before = app.telegram.sent_to(user).len();
    app.telegram
        .push_update(text_update(user, message_id, text));
    let sent = app.telegram.wait_sent(user, before + 1).await;
    sent[before].text().to_owned()
}

fn is_digest(call: &Call) -> bool {
    call.method == "SendMessage" && call.text().contains(DIGEST_TEXT)
}

fn digests_to(telegram: &FakeTelegram, chat: i64) -> usize {
    telegram
        .sent_to(chat)
        .iter()
        .filter(|c| is_digest(c))
        .count()
}

fn photos_to(telegram: &FakeTelegram, chat: i64) -> usize {
    telegram
        .sent_to(chat)
        .iter()
        .filter(|c| c.method == "SendPhoto")
        .count()
}

async fn wait_digest(telegram: &FakeTelegram, chat: i64) {
    telegram
        .wait_for(
            &format!("the digest and its chart to {chat}"),
            WAIT,
            |calls| {
                let to_chat = |c: &&Call| c.chat_id() == Some(chat);
                calls.iter().filter(to_chat).any(is_digest)
                    && calls
                        .iter()
                        .filter(to_chat)
                        .any(|c| c.method == "SendPhoto")
            },
        )
        .await;
}

async fn digest_next_at(app: &App, user: i64) -> Option<String> {
    sqlx::query_scalar("SELECT digest_next_at FROM users WHERE user_id = ?1")
        .bind(user)
        .fetch_one(app.store.read_pool().expect("a SQLite store"))
        .await
        .expect("user row")
}

/// Users `ids`, each in its own private chat, in English.
async fn add_users(app: &App, ids: impl IntoIterator<Item = i64>) {
    for user_id in ids {
        app.store
            .upsert_user(&daylog::store::NewUser {
                user_id: daylog::store::UserId(user_id),
                username: None,
                language: Language::En,
            })
            .await
            .expect("user");
    }
}

async fn raw_pool(app: &App) -> sqlx::SqlitePool {
    sqlx::SqlitePool::connect(&app.env["DATABASE_URL"])
        .await
        .expect("raw pool")
}

#[tokio::test]
async fn week_sends_a_digest_of_this_users_week_only_with_its_chart() {
    // Arrange: Tuesday 1 December; user 1 wrote twice this week, user 2 once.
    let app = App::spawn().await;
    healthy(&app.providers).await;
    app.clock.set(at("2026-12-01T20:00:00Z"));
    entry(&app, 1, 1, "2026-11-27T12:00:00Z", "Walked by the river").await;
    entry(
        &app,
        1,
        2,
        "2026-11-30T12:00:00Z",
        "Slept badly before a deadline",
    )
    .await;
    entry(
        &app,
        2,
        1,
        "2026-11-30T12:00:00Z",
        "Private matter of user two",
    )
    .await;
    // Older than the 7 days: not in the digest.
    entry(&app, 1, 3, "2026-11-20T12:00:00Z", "An old week entirely").await;

    // Act
    let before = app.telegram.sent_to(1).len();
    app.telegram.push_update(text_update(1, 10, "/week"));
    wait_digest(&app.telegram, 1).await;

    // Assert: text (as a reply) and chart, the prompt made of user 1's week only.
    let sent = app.telegram.sent_to(1)[before..].to_vec();
    let text = sent.iter().find(|c| is_digest(c)).expect("digest text");
    assert!(text.text().contains("2026-11-25"), "{}", text.text());
    assert_eq!(text.reply_to(), Some(10));
    let photo = sent
        .iter()
        .find(|c| c.method == "SendPhoto")
        .expect("chart");
    assert!(
        photo
            .file
            .as_ref()
            .is_some_and(|png| png.starts_with(b"\x89PNG"))
    );
    let requests = digest_requests(&app.providers).await;
    assert_eq!(requests.len(), 1, "one digest request");
    let body = &requests[0];
    assert!(body.contains("Walked by the river"), "{body}");
    assert!(body.contains("Slept badly before a deadline"), "{body}");
    assert!(!body.contains("Private matter of user two"), "{body}");
    assert!(!body.contains("An old week entirely"), "{body}");
    wait_until("the digest is recorded as sent", WAIT, || async {
        app.count("SELECT count(*) FROM digests WHERE user_id = 1 AND status = 'sent' AND week_start = '2026-11-25' AND sent_at IS NOT NULL")
            .await
            == 1
    })
    .await;
    assert_eq!(
        app.count("SELECT count(*) FROM llm_calls WHERE task = 'digest' AND outcome = 'ok'")
            .await,
        1
    );

    // A user with nothing in the last 7 days is told so kindly; nothing is stored.
    let empty = command(&app, 3, 1, "/week").await;
    assert_eq!(empty, Texts(Language::En).week_empty());
    assert_eq!(
        app.count("SELECT count(*) FROM digests WHERE user_id = 3")
            .await,
        0
    );
}

#[tokio::test]
async fn the_sunday_digest_comes_once_at_the_reminder_time_across_a_restart() {
    // Arrange: Tuesday 1 December, everyone in UTC.
    let app = App::spawn().await;
    healthy(&app.providers).await;
    app.clock.set(at("2026-12-01T12:00:00Z"));
    // User 1: the digest on, then a reminder at 20:30, which the digest follows.
    let on = command(&app, 1, 1, "/digest on").await;
    assert!(on.contains("19:00"), "{on}");
    command(&app, 1, 2, "/remind 20:30").await;
    assert_eq!(
        digest_next_at(&app, 1).await.as_deref(),
        Some("2026-12-06 20:30:00")
    );
    entry(&app, 1, 3, "2026-11-30T12:00:00Z", "Monday run").await;
    entry(&app, 1, 4, "2026-12-01T12:00:00Z", "Tuesday work").await;
    // User 3: on, but one entry only. User 4: two entries, never turned on.
    command(&app, 3, 1, "/remind 20:30").await;
    command(&app, 3, 2, "/digest on").await;
    entry(&app, 3, 3, "2026-12-01T12:00:00Z", "A lonely entry").await;
    let off = command(&app, 4, 1, "/digest").await;
    assert_eq!(off, Texts(Language::En).digest_off(), "off by default");
    entry(&app, 4, 2, "2026-11-30T12:00:00Z", "One").await;
    entry(&app, 4, 3, "2026-12-01T12:00:00Z", "Two").await;

    // Act: Sunday 6 December, 20:30:05.
    app.clock.set(at("2026-12-06T20:30:05Z"));
    wait_digest(&app.telegram, 1).await;
    wait_until("user 3's Sunday passes without a digest", WAIT, || async {
        digest_next_at(&app, 3).await.as_deref() == Some("2026-12-13 20:30:00")
    })
    .await;

    // Assert
    assert_eq!(digests_to(&app.telegram, 1), 1);
    assert_eq!(
        digest_next_at(&app, 1).await.as_deref(),
        Some("2026-12-13 20:30:00")
    );
    assert_eq!(
        app.count("SELECT count(*) FROM digests WHERE user_id = 1 AND week_start = '2026-11-30'")
            .await,
        1
    );
    assert_eq!(
        app.count("SELECT count(*) FROM digests WHERE user_id IN (3, 4)")
            .await,
        0,
        "fewer than 2 entries, or off: none"
    );

    // Act: a restart in the same minute, and both schedules seen as due once more.
    let (dir, providers) = app.stop().await;
    let app = App::spawn_on(dir, providers, |_| {}).await;
    app.clock.set(at("2026-12-06T20:30:40Z"));
    sqlx::query("UPDATE users SET digest_next_at = '2026-12-06 20:30:00' WHERE user_id IN (1, 3)")
        .execute(&raw_pool(&app).await)
        .await
        .expect("reset");
    wait_until("the scheduler looked at both again", WAIT, || async {
        digest_next_at(&app, 1).await.as_deref() == Some("2026-12-13 20:30:00")
            && digest_next_at(&app, 3).await.as_deref() == Some("2026-12-13 20:30:00")
    })
    .await;
    // The worker polls every 100 ms: a few polls show nothing is left to deliver.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Assert: the new process (a fresh fake Telegram) sent nothing more.
    assert_eq!(digests_to(&app.telegram, 1), 0, "never twice");
    assert_eq!(
        app.count("SELECT count(*) FROM digests WHERE user_id = 1 AND status = 'sent'")
            .await,
        1
    );
    assert_eq!(digest_requests(&app.providers).await.len(), 1);
}

#[tokio::test]
async fn a_week_on_sunday_is_that_weeks_digest_and_the_evening_sends_none() {
    // Arrange: the digest on at 19:00 (no reminder), two entries this week.
    let app = App::spawn().await;
    healthy(&app.providers).await;
    app.clock.set(at("2026-12-01T12:00:00Z"));
    command(&app, 1, 1, "/digest on").await;
    entry(&app, 1, 2, "2026-11-30T12:00:00Z", "Monday").await;
    entry(&app, 1, 3, "2026-12-01T12:00:00Z", "Tuesday").await;

    // Act: /week on Sunday morning, then the evening comes.
    app.clock.set(at("2026-12-06T10:00:00Z"));
    app.telegram.push_update(text_update(1, 4, "/week"));
    wait_digest(&app.telegram, 1).await;
    app.clock.set(at("2026-12-06T19:00:05Z"));
    wait_until("the Sunday evening passed", WAIT, || async {
        digest_next_at(&app, 1).await.as_deref() == Some("2026-12-13 19:00:00")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Assert
    assert_eq!(digests_to(&app.telegram, 1), 1);
    assert_eq!(photos_to(&app.telegram, 1), 1);
    assert_eq!(
        app.count("SELECT count(*) FROM digests WHERE user_id = 1 AND week_start = '2026-11-30'")
            .await,
        1
    );
}

/// Sends `/week` as message `message_id` and waits until user 1 has had `digests`
/// digests and the week's row is recorded as sent again.
async fn week_again(app: &App, message_id: i64, digests: usize) {
    app.telegram
        .push_update(text_update(1, message_id, "/week"));
    app.telegram
        .wait_for("the digest again", WAIT, |calls| {
            let to_user = |c: &&Call| c.chat_id() == Some(1);
            calls
                .iter()
                .filter(to_user)
                .filter(|c| is_digest(c))
                .count()
                == digests
        })
        .await;
    wait_until("the digest is recorded as sent", WAIT, || async {
        app.count("SELECT count(*) FROM digests WHERE user_id = 1 AND status = 'sent'")
            .await
            == 1
    })
    .await;
}

#[tokio::test]
async fn week_asked_again_after_new_or_edited_entries_is_written_again_in_its_row() {
    // Arrange: Tuesday evening; /week once, with Monday's entry only.
    let app = App::spawn().await;
    healthy(&app.providers).await;
    app.clock.set(at("2026-12-01T20:00:00Z"));
    entry(&app, 1, 1, "2026-11-30T12:00:00Z", "Walked by the river").await;
    week_again(&app, 10, 1).await;
    assert_eq!(digest_requests(&app.providers).await.len(), 1);
    sqlx::query("UPDATE digests SET sent_at = '2000-01-01 00:00:00'")
        .execute(&raw_pool(&app).await)
        .await
        .expect("an old sent_at");

    // Act: an entry later that day, then /week again.
    app.clock.set(at("2026-12-01T21:00:00Z"));
    entry(
        &app,
        1,
        2,
        "2026-12-01T20:30:00Z",
        "Read late in the evening",
    )
    .await;
    week_again(&app, 11, 2).await;

    // Assert: written again from the week now, in the same row, sent_at renewed.
    let requests = digest_requests(&app.providers).await;
    assert_eq!(requests.len(), 2, "written again");
    assert!(
        requests
            .iter()
            .any(|r| r.contains("Read late in the evening")),
        "the later entry is in the second digest"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM digests WHERE user_id = 1")
            .await,
        1,
        "one row per week"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM digests WHERE sent_at = '2000-01-01 00:00:00'")
            .await,
        0,
        "sent_at renewed"
    );
    assert_eq!(photos_to(&app.telegram, 1), 2);

    // An edit since counts as a change too.
    app.telegram
        .push_update(edited_update(1, 2, "Entry 2, and a call home"));
    wait_until("the edit is stored", WAIT, || async {
        app.count("SELECT count(*) FROM day_logs WHERE text = 'Entry 2, and a call home'")
            .await
            == 1
    })
    .await;
    week_again(&app, 12, 3).await;
    assert_eq!(digest_requests(&app.providers).await.len(), 3);

    // Nothing new since: the digest as written, no provider asked.
    week_again(&app, 13, 4).await;
    assert_eq!(digest_requests(&app.providers).await.len(), 3);
    assert_eq!(
        app.count("SELECT count(*) FROM digests WHERE user_id = 1")
            .await,
        1
    );
}

#[tokio::test]
async fn a_digest_asked_during_an_outage_is_delivered_once_when_a_provider_answers() {
    // Arrange
    let app = App::spawn().await;
    healthy(&app.providers).await;
    app.clock.set(at("2026-12-01T20:00:00Z"));
    entry(&app, 1, 1, "2026-11-30T12:00:00Z", "Monday").await;
    app.providers.reset().await;
    app.providers.all_down().await;

    // Act: /week while every provider answers 503.
    let said = command(&app, 1, 2, "/week").await;

    // Assert: stored as pending, the user told once that it will follow.
    assert_eq!(said, Texts(Language::En).digest_will_follow());
    wait_until("the digest is pending with a retry", WAIT, || async {
        app.count("SELECT count(*) FROM digests WHERE status = 'pending' AND text IS NULL AND attempts >= 1")
            .await
            == 1
    })
    .await;

    // Act: the providers come back.
    app.providers.reset().await;
    healthy(&app.providers).await;
    wait_digest(&app.telegram, 1).await;
    wait_until("the digest is recorded as sent", WAIT, || async {
        app.count("SELECT count(*) FROM digests WHERE status = 'sent'")
            .await
            == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Assert
    assert_eq!(digests_to(&app.telegram, 1), 1, "delivered once");
    assert_eq!(photos_to(&app.telegram, 1), 1);
    let will_follow = app
        .telegram
        .sent_to(1)
        .iter()
        .filter(|c| c.text() == Texts(Language::En).digest_will_follow())
        .count();
    assert_eq!(will_follow, 1, "told once");
}

#[tokio::test]
async fn a_digest_telegram_did_not_take_is_retried_at_a_growing_delay() {
    // Arrange: the worker's first retry after 2 s, doubling.
    let app = App::spawn_with(|env| {
        env.insert("DAYLOG__WORKER__RETRY_MIN_MS".into(), "2000".into());
        env.insert("DAYLOG__WORKER__RETRY_MAX_MS".into(), "60000".into());
    })
    .await;
    healthy(&app.providers).await;
    app.clock.set(at("2026-12-01T20:00:00Z"));
    entry(&app, 1, 1, "2026-11-30T12:00:00Z", "Monday").await;
    // Telegram's "Bad Gateway" in the body of a 200: the bot sorts it as the 502 it is,
    // and teloxide does not first sleep the 10 s it waits on an HTTP 5xx.
    let bad_gateway =
        serde_json::json!({"ok": false, "error_code": 502, "description": "Bad Gateway"});
    for _ in 0..2 {
        app.telegram
            .fail_next("SendMessage", Some(1), 200, bad_gateway.clone());
    }
    let pending_after = |attempts: i64| {
        format!(
            "SELECT count(*) FROM digests WHERE status = 'pending' AND text IS NOT NULL AND attempts = {attempts}"
        )
    };
    let due_now = || async {
        sqlx::query("UPDATE digests SET next_attempt_at = datetime('now', '-1 seconds')")
            .execute(&raw_pool(&app).await)
            .await
            .expect("hand edit");
    };

    // Act: /week; the digest is written, and Telegram refuses it twice (the first
    // retry is made due at once rather than waited for).
    app.telegram.push_update(text_update(1, 2, "/week"));
    wait_until("the first delivery failed", WAIT, || async {
        app.count(&pending_after(1)).await == 1
    })
    .await;
    due_now().await;
    wait_until("the second delivery failed", WAIT, || async {
        app.count(&pending_after(2)).await == 1
    })
    .await;

    // Assert: the second wait is twice the first (4 s, not 2 s) …
    let ahead = app
        .count(
            "SELECT CAST(strftime('%s', next_attempt_at) AS INTEGER) - CAST(strftime('%s', 'now') AS INTEGER) FROM digests",
        )
        .await;
    assert!(ahead >= 3, "the second retry is {ahead} s ahead");
    // … and the digest still arrives, once.
    due_now().await;
    wait_digest(&app.telegram, 1).await;
    assert_eq!(digests_to(&app.telegram, 1), 1);
}

/// A digest is its text and its chart. A chart Telegram will not take (a refusal of
/// that photo, not of the chat) after the text went out: the digest is delivered, once,
/// and the user's digests stay on; a chart that fails for a passing reason is tried
/// again without the text.
#[tokio::test]
async fn a_chart_that_fails_after_the_digest_text_does_not_send_the_text_again() {
    // Arrange
    let app = App::spawn().await;
    healthy(&app.providers).await;
    app.clock.set(at("2026-12-01T20:00:00Z"));
    command(&app, 1, 1, "/digest on").await;
    entry(&app, 1, 2, "2026-11-30T12:00:00Z", "Monday").await;
    let refused = serde_json::json!({"ok": false, "error_code": 400, "description": "Bad Request: IMAGE_PROCESS_FAILED"});
    app.telegram.fail_next("SendPhoto", Some(1), 400, refused);

    // Act: the chart is refused.
    app.telegram.push_update(text_update(1, 3, "/week"));

    // Assert
    wait_until("the digest is recorded as sent", WAIT, || async {
        app.count("SELECT count(*) FROM digests WHERE user_id = 1 AND status = 'sent'")
            .await
            == 1
    })
    .await;
    assert_eq!(digests_to(&app.telegram, 1), 1);
    assert_eq!(photos_to(&app.telegram, 1), 0);
    assert_eq!(
        app.count("SELECT count(*) FROM users WHERE user_id = 1 AND digest_enabled = 1")
            .await,
        1,
        "a refused chart is not a user who left"
    );

    // Act: another user's chart meets a Bad Gateway once.
    entry(&app, 2, 1, "2026-11-30T12:00:00Z", "Monday too").await;
    let bad_gateway =
        serde_json::json!({"ok": false, "error_code": 502, "description": "Bad Gateway"});
    app.telegram
        .fail_next("SendPhoto", Some(2), 200, bad_gateway);
    app.telegram.push_update(text_update(2, 2, "/week"));

    // Assert: the text once, the chart on its second try.
    wait_until("the second digest is recorded as sent", WAIT, || async {
        app.count("SELECT count(*) FROM digests WHERE user_id = 2 AND status = 'sent'")
            .await
            == 1
    })
    .await;
    assert_eq!(app.telegram.failures_left(), 0);
    assert_eq!(digests_to(&app.telegram, 2), 1);
    assert_eq!(photos_to(&app.telegram, 2), 1);
}

#[tokio::test]
async fn a_user_who_blocked_the_bot_has_the_digest_turned_off() {
    // Arrange
    let app = user_with_digest_on_and_two_entries(5).await;
    app.telegram.block_chat(5);

    // Act: Sunday 19:00.
    app.clock.set(at("2026-12-06T19:00:05Z"));

    // Assert
    // Turned off, then (the last write of the two) marked failed.
    wait_until("the digest is turned off", WAIT, || async {
        app.count("SELECT count(*) FROM users WHERE user_id = 5 AND digest_enabled = 0 AND digest_next_at IS NULL")
            .await
            == 1
            && app
                .count("SELECT count(*) FROM digests WHERE user_id = 5 AND status = 'failed'")
                .await
                == 1
    })
    .await;
    assert_eq!(
        app.count("SELECT count(*) FROM digests WHERE user_id = 5 AND status = 'failed'")
            .await,
        1
    );
}

/// A `/week` asked on Sunday in a group the bot was removed from since (a 403 there) is
/// failed, but the user's own Sunday digests, which go to their private chat, stay on,
/// and that evening's comes there: the digest as written for the group, not written
/// again.
#[tokio::test]
async fn a_week_undeliverable_in_a_group_keeps_the_private_sunday_digest_on() {
    // Arrange
    let app = user_with_digest_on_and_two_entries(5).await;
    let kicked = serde_json::json!({
        "ok": false, "error_code": 403,
        "description": "Forbidden: bot was kicked from the group chat"
    });
    app.telegram
        .fail_next("SendMessage", Some(-300), 403, kicked);

    // Act: on Sunday afternoon, so it is that week's digest.
    app.clock.set(at("2026-12-06T12:00:00Z"));
    app.telegram
        .push_update(group_text_update(-300, 5, 4, "/week"));

    // Assert
    wait_until("the group's digest is failed", WAIT, || async {
        app.count("SELECT count(*) FROM digests WHERE user_id = 5 AND chat_id = -300 AND status = 'failed'")
            .await
            == 1
    })
    .await;
    assert_eq!(
        app.count("SELECT count(*) FROM users WHERE user_id = 5 AND digest_enabled = 1 AND digest_next_at IS NOT NULL")
            .await,
        1,
        "a group that is gone is not a user who left"
    );

    // Act: that Sunday's moment.
    app.clock.set(at("2026-12-06T19:00:05Z"));

    // Assert: the week's digest, as written for the group, reaches the private chat.
    wait_digest(&app.telegram, 5).await;
    wait_until("the digest is recorded as sent", WAIT, || async {
        app.count(
            "SELECT count(*) FROM digests WHERE user_id = 5 AND chat_id = 5 AND status = 'sent'",
        )
        .await
            == 1
    })
    .await;
    assert_eq!(
        digest_requests(&app.providers).await.len(),
        1,
        "written once"
    );
}

/// A reminder after midnight (00:30 in Berlin) is still the day before's until the day
/// starts at 04:00: the Sunday digest comes in the night into Monday, with Sunday's
/// entries, not a night early without Saturday evening and Sunday. A schedule an
/// earlier version made for the calendar's Sunday moves to that moment.
#[tokio::test]
async fn a_night_owls_sunday_digest_comes_after_their_sunday() {
    // Arrange: Berlin, reminders at 00:30, digest on, its next moment as an earlier
    // version set it (Sunday 6 December 00:30 CET).
    let app = App::spawn().await;
    healthy(&app.providers).await;
    app.clock.set(at("2026-12-01T12:00:00Z"));
    command(&app, 1, 1, "/tz Europe/Berlin").await;
    command(&app, 1, 2, "/remind 00:30").await;
    let said = command(&app, 1, 3, "/digest on").await;
    assert!(
        said.contains("every Sunday night at 00:30") && said.contains("Monday by the calendar"),
        "{said}"
    );
    assert_eq!(
        digest_next_at(&app, 1).await.as_deref(),
        Some("2026-12-06 23:30:00"),
        "Monday 00:30 CET: Sunday's local day"
    );
    edit_digest_due(&app, "2026-12-05 23:30:00").await;
    entry(&app, 1, 4, "2026-12-05T20:00:00Z", "Saturday").await;

    // Act: the calendar's Sunday 00:30 passes.
    app.clock.set(at("2026-12-05T23:30:05Z"));

    // Assert: nothing yet; the schedule moved to the night into Monday.
    wait_until("the schedule moved", WAIT, || async {
        digest_next_at(&app, 1).await.as_deref() == Some("2026-12-06 23:30:00")
    })
    .await;
    assert_eq!(app.count("SELECT count(*) FROM digests").await, 0);

    // Act: Sunday's entry, then Monday 00:30.
    app.clock.set(at("2026-12-06T12:00:00Z"));
    entry(&app, 1, 5, "2026-12-06T12:00:00Z", "Sunday").await;
    app.clock.set(at("2026-12-06T23:30:05Z"));

    // Assert: the week Monday to Sunday, Sunday included.
    digest_sent_once_and_next_at(&app, "2026-11-30", "2026-12-13 23:30:00").await;
    let requests = digest_requests(&app.providers).await;
    assert_eq!(requests.len(), 1);
    assert!(requests[0].contains("Sunday"), "{}", requests[0]);
    assert!(requests[0].contains("Saturday"), "{}", requests[0]);
}

/// A digest Telegram refuses (a Bad Request about that message, not the chat) is
/// failed, but the user's weekly digests stay on, next Sunday's due.
#[tokio::test]
async fn a_refused_digest_keeps_weekly_digests_on() {
    // Arrange
    let app = user_with_digest_on_and_two_entries(5).await;
    let refused = serde_json::json!({
        "ok": false, "error_code": 400,
        "description": "Bad Request: message is too long"
    });
    app.telegram
        .fail_next_containing("SendMessage", 5, DIGEST_TEXT, 400, refused);

    // Act: Sunday 19:00.
    app.clock.set(at("2026-12-06T19:00:05Z"));

    // Assert
    wait_until("the digest is failed", WAIT, || async {
        app.count("SELECT count(*) FROM digests WHERE user_id = 5 AND status = 'failed'")
            .await
            == 1
    })
    .await;
    assert_eq!(app.telegram.failures_left(), 0, "the refusal was met");
    assert_eq!(
        app.count("SELECT count(*) FROM users WHERE user_id = 5 AND digest_enabled = 1 AND digest_next_at > '2026-12-06 19:00:05'")
            .await,
        1,
        "a refused message is not a user who left"
    );
}

/// The real binary, killed with SIGKILL while the digest is stored and being written;
/// the next start delivers it once.
#[tokio::test]
async fn a_digest_stored_before_a_kill_9_is_delivered_once_after_restart() {
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let telegram = FakeTelegram::start().await;
    let log = dir.path().join("bot.log");

    // First life: entries are answered, the digest request never is.
    let first_providers = Providers::start().await;
    for server in [&first_providers.mistral, &first_providers.gemini] {
        Mock::given(method("POST"))
            .and(body_string_contains(DIGEST_MARK))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(completion(DIGEST_TEXT))
                    .set_delay(Duration::from_secs(60)),
            )
            .with_priority(1)
            .mount(server)
            .await;
    }
    first_providers.healthy().await;
    let mut env = support::test_env(&db, &telegram, &first_providers);
    env.insert("DAYLOG__RETRY__REQUEST_TIMEOUT_MS".into(), "60000".into());
    env.insert("DAYLOG__RETRY__DEADLINE_MS".into(), "60000".into());
    let mut first = support::spawn_daylog(&env, &log);
    telegram.push_update(text_update(41, 1, "A day worth a digest."));
    telegram.wait_sent(41, 1).await;
    telegram.push_update(text_update(41, 2, "/week"));
    wait_until("the digest is being written", WAIT, || async {
        !digest_requests(&first_providers).await.is_empty()
    })
    .await;
    first.kill().expect("kill -9");
    let _ = first.wait();
    assert_eq!(
        digests_to(&telegram, 41),
        0,
        "nothing sent before the crash"
    );

    // Second life: healthy providers. The stored row is found by the worker, and the
    // `/week` is re-delivered (its update was never confirmed): whichever claims the
    // week first sends it, the other one finds it claimed or sent.
    let providers = Providers::start().await;
    healthy(&providers).await;
    let mut second = support::spawn_daylog(&support::test_env(&db, &telegram, &providers), &log);
    wait_digest(&telegram, 41).await;
    let pool = sqlx::SqlitePool::connect(&db).await.expect("db");
    wait_until("the digest is recorded as sent", WAIT, || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM digests WHERE status = 'sent'")
            .fetch_one(&pool)
            .await
            .unwrap_or(0)
            == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(digests_to(&telegram, 41), 1, "delivered once");
    assert_eq!(photos_to(&telegram, 41), 1);
    assert_eq!(
        telegram.sent_to(41).len(),
        3,
        "the entry's answer, the digest and its chart; nothing about the re-delivered /week"
    );
    second.kill().expect("stop");
    let _ = second.wait();
}

/// `daylog chat`: `/week` prints the digest and writes the week's chart as a file;
/// `/digest on|off` answers.
#[tokio::test]
async fn the_terminal_prints_the_week_and_writes_its_chart() {
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Screen(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Screen {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("screen").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    // Arrange
    let dir = tempfile::tempdir().expect("dir");
    let providers = Providers::start().await;
    healthy(&providers).await;
    let telegram = FakeTelegram::start().await;
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let app = daylog::app::App::build(support::settings(&support::test_env(
        &db, &telegram, &providers,
    )))
    .await
    .expect("app");
    let (journal, store) = (Arc::clone(app.journal()), app.store().clone());
    let screen = Screen::default();
    let files = dir.path().to_path_buf();
    let terminal = Arc::new(daylog::terminal::Terminal::new(
        Box::new(screen.clone()),
        files.clone(),
    ));

    // Act
    daylog::terminal::converse(
        journal,
        terminal,
        &b"Ran 5 km.\n/week\n/digest on\n/digest off\n"[..],
        daylog::domain::UserId(7),
    )
    .await
    .expect("session");

    // Assert
    let printed = String::from_utf8_lossy(&screen.0.lock().expect("screen")).into_owned();
    assert!(printed.contains(DIGEST_TEXT), "{printed}");
    let chart = std::fs::read_dir(&files)
        .expect("files")
        .filter_map(Result::ok)
        .find(|f| f.file_name().to_string_lossy().starts_with("daylog-week-"))
        .expect("the week's chart is written");
    assert!(
        std::fs::read(chart.path())
            .expect("chart")
            .starts_with(b"\x89PNG")
    );
    let en = Texts(Language::En);
    assert!(
        printed.contains(&en.digest_on("19:00", "UTC", false)),
        "{printed}"
    );
    assert!(printed.contains(en.digest_off()), "{printed}");
    let sent: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM digests WHERE user_id = 7 AND front_end = 'chat' AND status = 'sent'",
    )
    .fetch_one(store.read_pool().expect("a SQLite store"))
    .await
    .expect("count");
    assert_eq!(sent, 1);
}

/// An outage or a crash delays a digest and never loses it. A bot that was
/// down over the Sunday moment for longer than a reminder may be late (90 minutes)
/// still sends that week's digest, once, when it is back.
#[tokio::test]
async fn a_sunday_digest_missed_by_a_long_downtime_comes_late_once() {
    // Arrange: the digest on at 19:00, two entries this week.
    let app = App::spawn().await;
    healthy(&app.providers).await;
    app.clock.set(at("2026-12-01T12:00:00Z"));
    command(&app, 1, 1, "/digest on").await;
    entry(&app, 1, 2, "2026-11-30T12:00:00Z", "Monday").await;
    entry(&app, 1, 3, "2026-12-01T12:00:00Z", "Tuesday").await;

    // Act: the bot is back only at 22:00, three hours after the digest was due.
    app.clock.set(at("2026-12-06T22:00:00Z"));

    // Assert: the week's digest comes, once, and the schedule moves to next Sunday.
    wait_digest(&app.telegram, 1).await;
    wait_until("the digest is recorded as sent", WAIT, || async {
        app.count("SELECT count(*) FROM digests WHERE user_id = 1 AND week_start = '2026-11-30' AND status = 'sent'")
            .await
            == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(digests_to(&app.telegram, 1), 1);
    assert_eq!(
        digest_next_at(&app, 1).await.as_deref(),
        Some("2026-12-13 19:00:00")
    );
}

/// A `/week` asked again while its digest waits for the worker's next try (the providers
/// were down) is told it will follow; it does not bypass the worker's growing delay
/// with a new round of provider calls.
#[tokio::test]
async fn week_asked_again_during_an_outage_waits_for_the_workers_retry() {
    // Arrange: the worker's next try is far away; every provider answers 503.
    let app = App::spawn_with(|env| {
        env.insert(
            "DAYLOG__WORKER__RETRY_MIN_MS".to_owned(),
            "600000".to_owned(),
        );
        env.insert(
            "DAYLOG__WORKER__RETRY_MAX_MS".to_owned(),
            "600000".to_owned(),
        );
    })
    .await;
    healthy(&app.providers).await;
    app.clock.set(at("2026-12-01T20:00:00Z"));
    entry(&app, 1, 1, "2026-11-30T12:00:00Z", "Monday").await;
    app.providers.reset().await;
    app.providers.all_down().await;
    let first = command(&app, 1, 2, "/week").await;
    assert_eq!(first, Texts(Language::En).digest_will_follow());
    let asked = app
        .providers
        .mistral
        .received_requests()
        .await
        .unwrap_or_default()
        .len()
        + app
            .providers
            .gemini
            .received_requests()
            .await
            .unwrap_or_default()
            .len();
    assert!(asked > 0, "the first /week tried the providers");

    // Act
    let again = command(&app, 1, 3, "/week").await;

    // Assert
    assert_eq!(again, Texts(Language::En).digest_will_follow());
    let after = app
        .providers
        .mistral
        .received_requests()
        .await
        .unwrap_or_default()
        .len()
        + app
            .providers
            .gemini
            .received_requests()
            .await
            .unwrap_or_default()
            .len();
    assert_eq!(
        after, asked,
        "no new provider calls before the worker's retry"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM digests WHERE status = 'pending' AND attempts = 1")
            .await,
        1
    );
}

/// A digest written but undeliverable (the user had blocked the bot) is not a refusal of
/// the AI: the user who unblocked the bot and asks `/week` that Sunday gets it.
#[tokio::test]
async fn week_after_unblocking_sends_the_digest_a_403_kept_back() {
    // Arrange: the Sunday digest written, then refused by Telegram with 403.
    let app = user_with_digest_on_and_two_entries(5).await;
    app.telegram.block_chat(5);
    app.clock.set(at("2026-12-06T19:00:05Z"));
    wait_until("the digest failed with a 403", WAIT, || async {
        app.count("SELECT count(*) FROM digests WHERE user_id = 5 AND status = 'failed' AND text IS NOT NULL")
            .await
            == 1
    })
    .await;

    // Act: unblocked, the user asks for the week that same evening.
    app.telegram.unblock_chat(5);
    app.clock.set(at("2026-12-06T20:00:00Z"));
    app.telegram.push_update(text_update(5, 4, "/week"));

    // Assert: the stored digest, with its chart, and no "the AI refused".
    wait_digest(&app.telegram, 5).await;
    let refused = Texts(Language::En).digest_refused();
    assert!(app.telegram.sent_to(5).iter().all(|c| c.text() != refused));
    assert_eq!(
        digest_requests(&app.providers).await.len(),
        1,
        "written once"
    );
}

/// A stop (SIGTERM) while the worker is writing a digest lets it finish within the
/// grace period, as logs in hand do: a digest cut off between its send and its record
/// would be sent a second time by the next start.
#[tokio::test]
async fn a_stop_while_a_digest_is_written_lets_it_finish_and_be_recorded() {
    // Arrange: a digest pending after an outage; the providers back, but slow.
    let app = App::spawn().await;
    healthy(&app.providers).await;
    app.clock.set(at("2026-12-01T20:00:00Z"));
    entry(&app, 1, 1, "2026-11-30T12:00:00Z", "Monday").await;
    app.providers.reset().await;
    app.providers.all_down().await;
    command(&app, 1, 2, "/week").await;
    app.providers.reset().await;
    for server in [&app.providers.mistral, &app.providers.gemini] {
        let body = if std::ptr::eq(server, &app.providers.mistral) {
            completion(DIGEST_TEXT)
        } else {
            gemini_completion(DIGEST_TEXT)
        };
        Mock::given(method("POST"))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(body)
                    .set_delay(Duration::from_millis(800)),
            )
            .mount(server)
            .await;
    }
    let providers = &app.providers;
    wait_until("the worker is writing the digest", WAIT, || async {
        !digest_requests(providers).await.is_empty()
    })
    .await;

    // Act: stopped the way SIGTERM does (3 s of grace in tests).
    let telegram = app.telegram.clone();
    let db = app.env["DATABASE_URL"].clone();
    let _kept = app.stop().await;

    // Assert: by the time the bot has stopped, the digest was sent and recorded.
    let pool = sqlx::SqlitePool::connect(&db).await.expect("pool");
    let sent: i64 = sqlx::query_scalar("SELECT count(*) FROM digests WHERE status = 'sent'")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(sent, 1, "recorded before the bot stopped");
    assert_eq!(digests_to(&telegram, 1), 1);
}

/// A `/remind` (or `/tz`) in the seconds between the Sunday moment and the scheduler's
/// next look must not move the schedule past the digest that is due: the scheduler
/// still sends it (and moves on from there with the new settings).
#[tokio::test]
async fn a_remind_just_after_the_sunday_moment_does_not_skip_the_due_digest() {
    // Arrange: the scheduler looks only at its start (a poll far away); two entries.
    let app = with_a_far_scheduler().await;
    healthy(&app.providers).await;
    app.clock.set(at("2026-12-01T12:00:00Z"));
    command(&app, 1, 1, "/digest on").await;
    entry(&app, 1, 2, "2026-11-30T12:00:00Z", "Monday").await;
    entry(&app, 1, 3, "2026-12-01T12:00:00Z", "Tuesday").await;

    // Act: Sunday 19:00:05, before the scheduler's next look, the user asks /remind.
    app.clock.set(at("2026-12-06T19:00:05Z"));
    command(&app, 1, 4, "/remind").await;

    // Assert: still due at 19:00 …
    assert_eq!(
        digest_next_at(&app, 1).await.as_deref(),
        Some("2026-12-06 19:00:00")
    );
    // … and the scheduler's next look (here: after a restart) sends it.
    let (dir, providers) = app.stop().await;
    let app = App::spawn_on(dir, providers, |_| {}).await;
    app.clock.set(at("2026-12-06T19:00:30Z"));
    wait_digest(&app.telegram, 1).await;
}

/// Many digests due at once (a Sunday evening, or the end of an outage) are written a
/// few at a time, like the worker's logs, not all at once against the providers while
/// the evening's entries wait behind them.
#[tokio::test]
async fn many_due_digests_are_written_a_few_at_a_time() {
    // Arrange: 20 pending digests; the providers take 2 s per digest.
    let app = App::spawn().await;
    let week: jiff::civil::Date = "2026-11-30".parse().expect("date");
    add_users(&app, 100..120).await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(completion(DIGEST_TEXT))
                .set_delay(Duration::from_secs(2)),
        )
        .mount(&app.providers.mistral)
        .await;

    // Act
    for user_id in 100..120 {
        app.store
            .insert_digest(
                daylog::store::UserId(user_id),
                daylog::store::ChatId(user_id),
                week,
                daylog::store::FrontEnd::Telegram,
                None,
            )
            .await
            .expect("digest");
    }

    // Assert: at most the worker's concurrency (16) in flight.
    let providers = &app.providers;
    wait_until("digests are being written", WAIT, || async {
        digest_requests(providers).await.len() >= 16
    })
    .await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let in_flight = digest_requests(providers).await.len();
    assert!(in_flight <= 16, "{in_flight} digests written at once");
}

/// `/digest on` again (a user checking it is on) just after the Sunday moment keeps the
/// digest that is due, as `/remind` does.
#[tokio::test]
async fn digest_on_again_just_after_the_sunday_moment_keeps_the_due_digest() {
    // Arrange: the scheduler looks only at its start (a poll far away).
    let app = with_a_far_scheduler().await;
    app.clock.set(at("2026-12-01T12:00:00Z"));
    command(&app, 1, 1, "/digest on").await;

    // Act
    app.clock.set(at("2026-12-06T19:00:05Z"));
    let said = command(&app, 1, 2, "/digest on").await;

    // Assert
    assert!(said.contains("19:00"), "{said}");
    assert_eq!(
        digest_next_at(&app, 1).await.as_deref(),
        Some("2026-12-06 19:00:00")
    );
}

/// A `/week` digest still unwritten after `worker.max_age_hours` is given up: the user
/// who asked (and was told it would follow) hears that it will not come, once; a
/// scheduled one, never announced, is given up silently.
#[tokio::test]
async fn a_digest_given_up_after_max_age_is_said_to_the_user_who_asked() {
    // Arrange: two pending digests created three days ago, one asked by message 7.
    let app = App::spawn().await;
    let week: jiff::civil::Date = "2026-11-23".parse().expect("date");
    add_users(&app, [40, 41]).await;
    let raw = raw_pool(&app).await;
    for (user_id, asked_by) in [(40, Some(7)), (41, None)] {
        let (digest, _) = app
            .store
            .insert_digest(
                daylog::store::UserId(user_id),
                daylog::store::ChatId(user_id),
                week,
                daylog::store::FrontEnd::Telegram,
                asked_by.map(daylog::store::MessageId),
            )
            .await
            .expect("digest");
        sqlx::query("UPDATE digests SET created_at = datetime('now', '-3 days') WHERE id = ?1")
            .bind(digest.id.get())
            .execute(&raw)
            .await
            .expect("age it");
    }

    // Act: the worker's next look gives them up.
    wait_until("both given up", WAIT, || async {
        app.count("SELECT count(*) FROM digests WHERE status = 'failed'")
            .await
            == 2
    })
    .await;
    let sent = app.telegram.wait_sent(40, 1).await;

    // Assert
    assert!(
        sent[0].text().contains("was not written"),
        "{}",
        sent[0].text()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let telegram = app.telegram.clone();
    app.stop().await;
    assert_eq!(telegram.sent_to(40).len(), 1, "told once");
    assert!(
        telegram.sent_to(41).is_empty(),
        "a scheduled digest goes silently"
    );
}

/// Tuesday 2026-12-01 12:00 UTC, the digest on (19:00), entries on Monday and Tuesday.
async fn digest_on_with_two_entries() -> App {
    user_with_digest_on_and_two_entries(1).await
}

/// A bot at Tuesday 1 December, noon UTC, whose `user` turned the digest on and wrote
/// on Monday and Tuesday (the first messages of their chat, ids 1 to 3).
async fn user_with_digest_on_and_two_entries(user: i64) -> App {
    let app = App::spawn().await;
    healthy(&app.providers).await;
    app.clock.set(at("2026-12-01T12:00:00Z"));
    command(&app, user, 1, "/digest on").await;
    entry(&app, user, 2, "2026-11-30T12:00:00Z", "Monday").await;
    entry(&app, user, 3, "2026-12-01T12:00:00Z", "Tuesday").await;
    app
}

/// `users.digest_next_at` of user 1 edited by hand to `due`.
async fn edit_digest_due(app: &App, due: &str) {
    sqlx::query("UPDATE users SET digest_next_at = ?1 WHERE user_id = 1")
        .bind(due)
        .execute(&raw_pool(app).await)
        .await
        .expect("hand edit");
}

/// The digest of the week from `week_start` is recorded as sent, it reached the user
/// once, and the next one is due at `next`.
async fn digest_sent_once_and_next_at(app: &App, week_start: &str, next: &str) {
    wait_until("the digest is recorded as sent", WAIT, || async {
        app.count(&format!(
            "SELECT count(*) FROM digests WHERE user_id = 1 AND week_start = '{week_start}' AND status = 'sent'"
        ))
        .await
            == 1
    })
    .await;
    assert_eq!(digest_next_at(app, 1).await.as_deref(), Some(next));
    // The worker polls every 100 ms: a few polls show nothing more is sent.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(digests_to(&app.telegram, 1), 1);
}

/// The digest scheduler's compare-and-set is keyed on the text it read: a due time
/// stored in another spelling of its moment (fractional seconds, a hand edit) comes
/// once and the schedule moves on to the next Sunday.
#[tokio::test]
async fn a_due_time_in_another_spelling_of_its_moment_sends_the_digest_once() {
    // Arrange
    let app = digest_on_with_two_entries().await;
    edit_digest_due(&app, "2026-12-06 19:00:00.500").await;

    // Act
    app.clock.set(at("2026-12-06T19:00:05Z"));

    // Assert
    digest_sent_once_and_next_at(&app, "2026-11-30", "2026-12-13 19:00:00").await;
}

/// A due time that is no moment at all (a hand edit) does not wedge the schedule: it is
/// due now, that week's digest comes once, and the next is on Sunday as usual.
#[tokio::test]
async fn a_due_time_that_is_no_moment_is_due_now_and_the_schedule_goes_on() {
    // Arrange
    let app = digest_on_with_two_entries().await;

    // Act
    edit_digest_due(&app, "soon").await;

    // Assert: the 7 days ending today, once; next on Sunday at 19:00.
    digest_sent_once_and_next_at(&app, "2026-11-25", "2026-12-06 19:00:00").await;
}

/// A due time spelt with a `T` (a hand edit) sorts after every moment of its day as
/// text: the digest still comes at its moment, once, not after midnight.
#[tokio::test]
async fn a_due_time_spelt_with_a_t_sends_the_digest_at_its_moment() {
    // Arrange
    let app = digest_on_with_two_entries().await;
    edit_digest_due(&app, "2026-12-06T19:00:00Z").await;

    // Act
    app.clock.set(at("2026-12-06T19:00:05Z"));

    // Assert
    digest_sent_once_and_next_at(&app, "2026-11-30", "2026-12-13 19:00:00").await;
}

/// A due time of digits that is no moment (`23:00`, a hand edit) and sorts after every
/// moment of these years does not wedge the schedule either: due now, sent once.
#[tokio::test]
async fn a_due_time_of_digits_that_is_no_moment_is_due_now_not_never() {
    // Arrange
    let app = digest_on_with_two_entries().await;

    // Act
    edit_digest_due(&app, "23:00").await;

    // Assert: the 7 days ending today, once; next on Sunday at 19:00.
    digest_sent_once_and_next_at(&app, "2026-11-25", "2026-12-06 19:00:00").await;
}

#[tokio::test]
async fn an_entry_sent_during_a_slow_week_is_stored_and_answered_at_once() {
    // Arrange: an entry this week, then digests that take 3 s to write.
    let app = App::spawn_with(|env| {
        env.insert("DAYLOG__RETRY__REQUEST_TIMEOUT_MS".into(), "10000".into());
        env.insert("DAYLOG__RETRY__DEADLINE_MS".into(), "30000".into());
    })
    .await;
    healthy(&app.providers).await;
    app.clock.set(at("2026-12-01T20:00:00Z"));
    entry(&app, 1, 1, "2026-11-30T12:00:00Z", "Walked by the river").await;
    for server in [&app.providers.mistral, &app.providers.gemini] {
        server.reset().await;
    }
    answer_digest_after(&app.providers, DIGEST_TEXT, Duration::from_secs(3)).await;
    app.providers.healthy().await;

    // Act: /week, and while it is written, an entry.
    let before = app.telegram.sent_to(1).len();
    app.telegram.push_update(text_update(1, 10, "/week"));
    wait_until("the digest to be asked for", WAIT, || async {
        !digest_requests(&app.providers).await.is_empty()
    })
    .await;
    app.telegram
        .push_update(text_update(1, 11, "A late thought."));

    // Assert: the entry is stored and answered while the digest is still written: it
    // is not held unstored (and so unconfirmed to Telegram) behind the command.
    wait_until("the entry's answer", WAIT, || async {
        app.telegram.sent_to(1)[before..]
            .iter()
            .any(|c| c.reply_to() == Some(11))
    })
    .await;
    assert_eq!(
        digests_to(&app.telegram, 1),
        0,
        "the digest is still being written"
    );
    wait_digest(&app.telegram, 1).await;
    app.stop().await;
}

/// A new reminder time earlier than now on a Sunday evening (or `/remind off` after
/// 19:00) must not move the schedule past this Sunday's digest, still to come: the
/// week would get none (a digest every Sunday, never lost).
#[tokio::test]
async fn a_remind_earlier_on_a_sunday_evening_keeps_that_weeks_digest() {
    // Arrange: the digest due Sunday 6 December at 19:00 UTC, two entries that week.
    let app = digest_on_with_two_entries().await;

    // Act: at 18:00 that Sunday the user moves the reminder to 17:00, already past.
    app.clock.set(at("2026-12-06T18:00:00Z"));
    command(&app, 1, 4, "/remind 17:00").await;

    // Assert: still due at 19:00; it comes, for that week, and the next is at 17:00.
    assert_eq!(
        digest_next_at(&app, 1).await.as_deref(),
        Some("2026-12-06 19:00:00")
    );
    app.clock.set(at("2026-12-06T19:00:30Z"));
    digest_sent_once_and_next_at(&app, "2026-11-30", "2026-12-13 17:00:00").await;
}

/// A night owl's 00:30 reminder moved to 19:00 in the half hour after midnight: the
/// digest of the Sunday that has just ended is still owed at 00:30, and it covers that
/// week (judged by the time it was scheduled for), not the week up to Monday.
#[tokio::test]
async fn a_remind_moved_after_midnight_keeps_sundays_digest_and_its_week() {
    // Arrange: reminder 00:30 UTC, the digest on, entries on Monday and Tuesday.
    let app = with_a_far_scheduler().await;
    healthy(&app.providers).await;
    app.clock.set(at("2026-12-01T12:00:00Z"));
    command(&app, 1, 1, "/remind 00:30").await;
    command(&app, 1, 2, "/digest on").await;
    entry(&app, 1, 3, "2026-11-30T12:00:00Z", "Monday").await;
    entry(&app, 1, 4, "2026-12-01T12:00:00Z", "Tuesday").await;
    assert_eq!(
        digest_next_at(&app, 1).await.as_deref(),
        Some("2026-12-07 00:30:00"),
        "Sunday night's 00:30 is Monday's by the calendar"
    );

    // Act: Monday 00:10, before the moment, the reminder moves to 19:00.
    app.clock.set(at("2026-12-07T00:10:00Z"));
    command(&app, 1, 5, "/remind 19:00").await;
    assert_eq!(
        digest_next_at(&app, 1).await.as_deref(),
        Some("2026-12-07 00:30:00")
    );
    let (dir, providers) = app.stop().await;
    let app = App::spawn_on(dir, providers, |_| {}).await;
    app.clock.set(at("2026-12-07T00:30:30Z"));

    // Assert: the week of Monday 30 November, once; next Sunday at 19:00.
    digest_sent_once_and_next_at(&app, "2026-11-30", "2026-12-13 19:00:00").await;
}

/// A bot down for more than a week, back within `worker.max_age_hours` of the last
/// Sunday's moment: that Sunday's digest comes; only the older one is too old.
#[tokio::test]
async fn after_a_downtime_of_over_a_week_the_last_sundays_digest_comes() {
    // Arrange: the digest on (due Sunday 6 December), the scheduler looking only at its
    // start; two entries in the week of 7 December.
    let app = with_a_far_scheduler().await;
    healthy(&app.providers).await;
    app.clock.set(at("2026-12-01T12:00:00Z"));
    command(&app, 1, 1, "/digest on").await;
    app.clock.set(at("2026-12-09T12:00:00Z"));
    entry(&app, 1, 2, "2026-12-08T12:00:00Z", "Tuesday").await;
    entry(&app, 1, 3, "2026-12-09T12:00:00Z", "Wednesday").await;

    // Act: the bot is back on Sunday 13 December at 20:00, a week and an hour late.
    let (dir, providers) = app.stop().await;
    let app = App::spawn_on(dir, providers, |_| {}).await;
    app.clock.set(at("2026-12-13T20:00:00Z"));

    // Assert
    digest_sent_once_and_next_at(&app, "2026-12-07", "2026-12-20 19:00:00").await;
    assert_eq!(
        app.count("SELECT count(*) FROM digests WHERE week_start = '2026-11-30'")
            .await,
        0
    );
}

/// A move east on a Sunday afternoon (UTC to Tokyo, where it is already evening) keeps
/// that Sunday's digest, and it covers that week: its moment, Monday 04:00 in Tokyo,
/// ends the week on the Sunday before it, not on the Monday.
#[tokio::test]
async fn a_move_east_on_sunday_keeps_that_weeks_digest_and_its_week() {
    let app = digest_on_with_two_entries().await;

    // Act: Sunday 6 December, 12:00 UTC (21:00 in Tokyo).
    app.clock.set(at("2026-12-06T12:00:00Z"));
    command(&app, 1, 4, "/tz Asia/Tokyo").await;
    assert_eq!(
        digest_next_at(&app, 1).await.as_deref(),
        Some("2026-12-06 19:00:00"),
        "this Sunday's moment kept"
    );
    app.clock.set(at("2026-12-06T19:00:30Z"));

    // Assert: the week of Monday 30 November; next Sunday at 19:00 Tokyo time.
    digest_sent_once_and_next_at(&app, "2026-11-30", "2026-12-13 10:00:00").await;
}

/// A bot whose scheduler looks only at its start (a poll far away): a test's change in
/// the seconds after a moment is seen before the scheduler's next look.
async fn with_a_far_scheduler() -> App {
    App::spawn_with(|env| {
        env.insert(
            "DAYLOG__REMINDERS__POLL_INTERVAL_MS".to_owned(),
            "600000".to_owned(),
        );
    })
    .await
}

/// A daily quota that a digest found spent is stored at once, not at the next analysis:
/// a restart before then would spend a request on it again (issue 31 item 8).
#[tokio::test]
async fn a_daily_quota_a_digest_found_spent_is_stored_at_once() {
    // Arrange: one analysed entry this week; then Mistral down and Gemini's daily
    // quota spent, one round per step.
    let app = App::spawn_with(|env| {
        support::shipped_budgets(env);
        env.insert("DAYLOG__RETRY__MAX_ATTEMPTS".into(), "1".into());
    })
    .await;
    healthy(&app.providers).await;
    app.clock.set(at("2026-12-01T20:00:00Z"));
    entry(&app, 1, 1, "2026-11-30T12:00:00Z", "Walked by the river").await;
    app.providers.mistral.reset().await;
    app.providers.gemini.reset().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(503).set_body_string("overloaded"))
        .mount(&app.providers.mistral)
        .await;
    let per_day = r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[
        {"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[
          {"quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]},
        {"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"3s"}]}}"#;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(429).set_body_raw(per_day, "application/json"))
        .mount(&app.providers.gemini)
        .await;

    // Act: the digest meets the spent quota; no entry is analysed after it.
    app.telegram.push_update(text_update(1, 10, "/week"));

    // Assert
    wait_until("the spent quota is stored", WAIT, || async {
        app.count("SELECT count(*) FROM llm_budgets WHERE provider = 'gemini'")
            .await
            == 1
    })
    .await;
    let asked = app
        .providers
        .gemini
        .received_requests()
        .await
        .unwrap_or_default();
    assert!(
        !asked.is_empty()
            && asked
                .iter()
                .all(|request| String::from_utf8_lossy(&request.body).contains(DIGEST_MARK)),
        "only the digest asked Gemini: no analysis stored the budget for it"
    );
}
