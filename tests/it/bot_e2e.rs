//! The real dispatcher against a fake Telegram Bot API and fake providers on 127.0.0.1
//! (docs/behaviour.md: the life of an entry, Telegram, the promises). Waits are on conditions, never on fixed sleeps.

#![expect(
    clippy::expect_used,
    reason = "helpers outside #[test] fns fail loudly by design"
)]

use crate::support;

use std::time::Duration;

use daylog::language::Language;
use daylog::texts::Texts;
use serde_json::json;
use support::telegram::{
    Call, callback_update, edited_update, group_callback_update, group_text_update,
    member_joined_update, photo_update, sticker_update, text_update, text_update_lang,
};
use support::{ANALYSIS_TEXT, App};
use wiremock::matchers::{method, path};
use wiremock::{Mock, ResponseTemplate};

const WAIT: Duration = Duration::from_secs(20);

// Telegram HTML as a person sees it: tags dropped, entities decoded (the bot's own
// function, so the tests read replies the way `daylog chat` shows them).
use daylog::render::html_to_plain as visible;

#[tokio::test]
async fn a_day_log_is_stored_analysed_and_answered_as_a_reply() {
    let app = App::spawn().await;
    app.providers.healthy().await;

    app.telegram.push_update(text_update(
        7,
        10,
        "Ran 5 km, slept 6.5 hours, big deadline at work.",
    ));
    let sent = app.telegram.wait_sent(7, 1).await;

    let reply = &sent[0];
    assert_eq!(reply.reply_to(), Some(10), "answers the user's message");
    assert_eq!(reply.body["parse_mode"], "HTML");
    let text = visible(reply.text());
    assert!(text.contains(ANALYSIS_TEXT), "{text}");
    assert!(text.contains("mood 4/5"), "metrics line: {text}");
    assert!(text.contains("sleep 6.5 h"), "{text}");
    let typing = app
        .telegram
        .calls()
        .iter()
        .filter(|c| c.method == "SendChatAction")
        .count();
    assert!(typing >= 1, "typing… shown while working");

    let row: (String, Option<String>, Option<String>, Option<String>) = sqlx::query_as(
        "SELECT status, analysis, metrics, replied_at FROM day_logs WHERE chat_id = 7 AND message_id = 10",
    )
    .fetch_one(app.store.read_pool().expect("a SQLite store"))
    .await
    .expect("row");
    assert_eq!(row.0, "analyzed");
    assert_eq!(row.1.as_deref(), Some(ANALYSIS_TEXT));
    let metrics: serde_json::Value = serde_json::from_str(&row.2.expect("metrics")).expect("json");
    assert_eq!(metrics["mood"], 4);
    assert_eq!(metrics["activities"], json!(["run", "work"]));
    wait_until(|| async {
        app.count("SELECT count(*) FROM day_logs WHERE replied_at IS NOT NULL")
            .await
            == 1
    })
    .await;
    app.store.flush_calls().await;
    let ok_calls = app
        .count("SELECT count(*) FROM llm_calls WHERE outcome = 'ok'")
        .await;
    assert_eq!(ok_calls, 2, "one analysis and one metrics call recorded");
    app.stop().await;
}

/// Polls an async condition until it holds (or panics after 20 s).
async fn wait_until<F, Fut>(cond: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    support::wait_until("the condition", WAIT, cond).await;
}

/// An entry or a command written in a group is answered there, but the user's chat on
/// record — where reminders and the Sunday digest, a summary of the journal, go — stays
/// their private chat.
#[tokio::test]
async fn writing_in_a_group_does_not_send_the_users_reminders_and_digests_there() {
    const GROUP: i64 = -100_555;
    let app = App::spawn().await;
    app.providers.healthy().await;

    app.telegram
        .push_update(group_text_update(GROUP, 12, 1, "A day with friends."));
    app.telegram
        .push_update(group_text_update(GROUP, 13, 2, "/streak"));
    let sent = app.telegram.wait_sent(GROUP, 2).await;
    assert!(
        sent.iter().any(|m| m.reply_to() == Some(1)),
        "the entry is answered where it came"
    );

    let chats: Vec<(i64, i64)> =
        sqlx::query_as("SELECT user_id, chat_id FROM users ORDER BY user_id")
            .fetch_all(app.store.read_pool().expect("a SQLite store"))
            .await
            .expect("users");
    assert_eq!(chats, [(12, 12), (13, 13)]);
    app.stop().await;
}

/// `/remind` in a group sets the reminder and says where it will come: the private chat.
#[tokio::test]
async fn remind_in_a_group_says_reminders_come_in_the_private_chat() {
    const GROUP: i64 = -100_556;
    let app = App::spawn().await;

    app.telegram
        .push_update(group_text_update(GROUP, 15, 1, "/remind 21:00"));
    let sent = app.telegram.wait_sent(GROUP, 2).await;

    assert!(
        visible(sent[0].text()).contains("21:00"),
        "{}",
        sent[0].text()
    );
    assert!(
        visible(sent[1].text()).contains("private chat"),
        "{}",
        sent[1].text()
    );
    // In the private chat itself nothing more is said.
    app.telegram
        .push_update(text_update(15, 2, "/remind 21:30"));
    app.telegram.wait_sent(15, 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(app.telegram.sent_to(15).len(), 1);
    app.stop().await;
}

/// A reply too long for one Telegram message goes out in parts; a part that fails for a
/// passing reason is sent again on its own, and the parts before it are not repeated.
#[tokio::test]
async fn a_part_of_a_long_reply_that_fails_is_sent_again_without_the_parts_before_it() {
    let app = App::spawn().await;
    let long = format!("{}{}", "alpha ".repeat(700), "omega ".repeat(300));
    app.providers.answer_analysis(&long).await;
    app.providers.answer_metrics(support::METRICS_JSON).await;
    let bad_gateway = json!({"ok": false, "error_code": 502, "description": "Bad Gateway"});
    app.telegram
        .fail_next_containing("SendMessage", 14, "omega", 200, bad_gateway);

    app.telegram.push_update(text_update(14, 1, "A long day."));

    wait_until(|| async {
        app.count("SELECT count(*) FROM day_logs WHERE chat_id = 14 AND replied_at IS NOT NULL")
            .await
            == 1
    })
    .await;
    assert_eq!(
        app.telegram.failures_left(),
        0,
        "the second part failed once"
    );
    let sent = app.telegram.sent_to(14);
    let first = sent.iter().filter(|m| !m.text().contains("omega")).count();
    let second = sent.iter().filter(|m| m.text().contains("omega")).count();
    assert_eq!((first, second), (1, 1), "each part once");
    assert_eq!(sent[0].reply_to(), Some(1));
    app.stop().await;
}

/// After an outage the backlog does not wait out its retry schedule: the first analysis
/// that succeeds again (here a new entry's, answered live) makes the waiting entries due
/// at once, and the worker answers them, oldest first, after it. Their next tries are an
/// hour away here, so without that they would not be answered within the test.
#[tokio::test]
async fn after_an_outage_the_first_answer_brings_the_waiting_entries_forward() {
    let app = with_hour_long_retries().await;
    app.providers.all_down().await;
    app.telegram.push_update(text_update(9, 1, "A rough day."));
    app.telegram.push_update(text_update(9, 2, "Still rough."));
    let told = app.telegram.wait_sent(9, 2).await;
    assert!(
        told.iter()
            .all(|m| visible(m.text()).contains("will follow"))
    );
    assert_eq!(
        app.count(
            "SELECT count(*) FROM day_logs
             WHERE status = 'pending' AND next_attempt_at > datetime('now', '+30 minutes')"
        )
        .await,
        2,
        "both wait out an hour"
    );

    app.providers.reset().await;
    app.providers.healthy().await;
    app.telegram.push_update(text_update(9, 3, "Better now."));

    let sent = app.telegram.wait_sent(9, 5).await;
    let answers: Vec<Option<i64>> = sent[2..].iter().map(|m| m.reply_to()).collect();
    assert_eq!(
        answers,
        [Some(3), Some(1), Some(2)],
        "the backlog in its order"
    );
    assert!(
        sent[2..]
            .iter()
            .all(|m| visible(m.text()).contains(ANALYSIS_TEXT))
    );
    wait_until(|| async {
        app.count("SELECT count(*) FROM day_logs WHERE replied_at IS NOT NULL")
            .await
            == 3
    })
    .await;
    app.stop().await;
}

#[tokio::test]
async fn with_every_provider_down_the_user_is_told_saved_and_gets_the_analysis_later() {
    let app = App::spawn().await;
    app.providers.all_down().await;

    app.telegram.push_update(text_update(8, 1, "A rough day."));
    let sent = app.telegram.wait_sent(8, 1).await;
    assert!(
        visible(sent[0].text()).contains("Saved"),
        "{}",
        sent[0].text()
    );
    assert!(visible(sent[0].text()).contains("will follow"));
    assert_eq!(
        app.count("SELECT count(*) FROM day_logs WHERE status = 'pending'")
            .await,
        1
    );

    // The providers come back; the worker finishes the log on its own.
    app.providers.reset().await;
    app.providers.healthy().await;
    let sent = app.telegram.wait_sent(8, 2).await;
    let late = visible(sent[1].text());
    assert!(late.contains(ANALYSIS_TEXT), "{late}");
    assert_eq!(sent[1].reply_to(), Some(1));
    wait_until(|| async {
        app.count(
            "SELECT count(*) FROM day_logs WHERE status = 'analyzed' AND replied_at IS NOT NULL",
        )
        .await
            == 1
    })
    .await;
    // No third message: answered once.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(app.telegram.sent_to(8).len(), 2);
    app.stop().await;
}

/// Requests every fake provider has received so far.
async fn provider_requests(app: &App) -> usize {
    let mut n = 0;
    for server in [
        &app.providers.mistral,
        &app.providers.gemini,
        &app.providers.groq,
    ] {
        n += server
            .received_requests()
            .await
            .expect("recording on")
            .len();
    }
    n
}

#[tokio::test]
async fn the_same_update_delivered_twice_gives_one_row_one_reply_and_one_analysis() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    app.telegram.push_update(text_update(9, 5, "Same message."));
    app.telegram.wait_sent(9, 1).await;
    // Telegram re-delivers the same message in a new update. One chat's updates are
    // handled in order, so the next message's reply marks the re-delivery as handled.
    app.telegram.push_update(text_update(9, 5, "Same message."));
    app.telegram
        .push_update(text_update(9, 6, "A different one."));
    app.telegram.wait_sent(9, 2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(app.telegram.sent_to(9).len(), 2);
    assert_eq!(
        app.count("SELECT count(*) FROM day_logs WHERE chat_id = 9")
            .await,
        2
    );
    // The re-delivery spent no budget: one analysis and one metrics call per message.
    assert_eq!(
        app.providers.analysis_requests().await,
        2,
        "one analysis per distinct message"
    );
    assert_eq!(
        provider_requests(&app).await,
        4,
        "and one metrics call each"
    );
    app.store.flush_calls().await;
    assert_eq!(
        app.count(
            "SELECT count(*) FROM llm_calls WHERE day_log_id = \
             (SELECT id FROM day_logs WHERE chat_id = 9 AND message_id = 5)"
        )
        .await,
        2,
        "the re-delivered message's log has its first delivery's calls only"
    );
    app.stop().await;
}

/// The store's own de-duplication, not the in-memory claim of a delivery still in
/// flight: the message comes again after it was answered and another entry came between
/// (its claim long released), as Telegram re-delivers after a crash or a lost offset.
#[tokio::test]
async fn a_message_redelivered_long_after_its_answer_is_stored_and_answered_once() {
    // Arrange: message 5 answered, then message 6 answered after it.
    let app = App::spawn().await;
    app.providers.healthy().await;
    app.telegram.push_update(text_update(9, 5, "Same message."));
    app.telegram.wait_sent(9, 1).await;
    app.telegram
        .push_update(text_update(9, 6, "A different one."));
    app.telegram.wait_sent(9, 2).await;
    support::wait_until("both answers recorded", Duration::from_secs(20), || async {
        app.count("SELECT count(*) FROM day_logs WHERE chat_id = 9 AND replied_at IS NOT NULL")
            .await
            == 2
    })
    .await;

    // Act: message 5 again in a new update, then a third message as a marker.
    app.telegram.push_update(text_update(9, 5, "Same message."));
    app.telegram.push_update(text_update(9, 7, "A third one."));
    app.telegram.wait_sent(9, 3).await;

    // Assert: the marker's answer is the third and last; message 5 has one row, one
    // reply, one analysis.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sent = app.telegram.sent_to(9);
    assert_eq!(sent.len(), 3, "no second answer to message 5");
    assert_eq!(
        app.count("SELECT count(*) FROM day_logs WHERE chat_id = 9 AND message_id = 5")
            .await,
        1
    );
    assert_eq!(
        app.providers.analysis_requests().await,
        3,
        "one analysis per distinct message"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_redelivered_update_during_an_outage_costs_no_call_and_no_second_notice() {
    // The worker's first retry is far away: every provider call here is a handler's.
    let app = App::spawn_with(|env| {
        env.insert("DAYLOG__WORKER__RETRY_MIN_MS".into(), "600000".into());
        env.insert("DAYLOG__WORKER__RETRY_MAX_MS".into(), "600000".into());
    })
    .await;
    app.providers.all_down().await;
    app.telegram
        .push_update(text_update(12, 5, "Same message."));
    let sent = app.telegram.wait_sent(12, 1).await;
    assert!(
        visible(sent[0].text()).contains("will follow"),
        "{}",
        sent[0].text()
    );
    // One chat's updates are handled in order: the answer to a /help after an update
    // marks that update as handled.
    app.telegram.push_update(text_update(12, 6, "/help"));
    app.telegram.wait_sent(12, 2).await;
    let calls_before = provider_requests(&app).await;
    assert!(calls_before > 0, "the first delivery tried the providers");

    app.telegram
        .push_update(text_update(12, 5, "Same message."));
    app.telegram.push_update(text_update(12, 7, "/help"));
    let sent = app.telegram.wait_sent(12, 3).await;

    let texts: Vec<String> = sent.iter().map(|c| visible(c.text())).collect();
    assert_eq!(sent.len(), 3, "{texts:?}");
    assert_eq!(
        texts.iter().filter(|t| t.contains("will follow")).count(),
        1,
        "one \"saved, will follow\" notice: {texts:?}"
    );
    assert!(texts[2].contains("What I can do"), "{texts:?}");
    assert_eq!(
        provider_requests(&app).await,
        calls_before,
        "the re-delivery called no provider"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM day_logs WHERE chat_id = 12 AND status = 'pending'")
            .await,
        1
    );
    app.stop().await;
}

#[tokio::test]
async fn an_edited_message_updates_the_text_and_is_analysed_again() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    app.telegram.push_update(text_update(10, 3, "Slept badly."));
    app.telegram.wait_sent(10, 1).await;
    app.telegram
        .push_update(edited_update(10, 3, "Slept badly, but the run helped."));
    let sent = app.telegram.wait_sent(10, 2).await;
    // The new answer says what it is: the same entry, updated, not a second one saved.
    assert!(
        visible(sent[0].text()).starts_with("Saved."),
        "{}",
        sent[0].text()
    );
    assert!(
        visible(sent[1].text()).starts_with("Updated."),
        "{}",
        sent[1].text()
    );
    let text: String =
        sqlx::query_scalar("SELECT text FROM day_logs WHERE chat_id = 10 AND message_id = 3")
            .fetch_one(app.store.read_pool().expect("a SQLite store"))
            .await
            .expect("row");
    assert_eq!(text, "Slept badly, but the run helped.");
    assert_eq!(
        app.count("SELECT count(*) FROM day_logs WHERE chat_id = 10")
            .await,
        1
    );
    app.stop().await;
}

/// In a group: a member joining (a service message every bot is sent) and another bot's
/// command get no answer and make no entry; this bot's own, named, does.
#[tokio::test]
async fn a_group_service_message_and_another_bots_command_get_no_answer() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    let group = -100_777;
    app.telegram.push_update(member_joined_update(group, 71, 1));
    app.telegram
        .push_update(group_text_update(group, 71, 2, "/stats@OtherBot"));
    app.telegram
        .push_update(group_text_update(group, 71, 3, "/settings@OtherBot"));
    app.telegram
        .push_update(group_text_update(group, 71, 4, "/settings@daylog_bot"));
    // A chat's updates are handled in order: once the last is answered, all were.
    let sent = app.telegram.wait_sent(group, 1).await;
    assert!(
        visible(sent[0].text()).contains("know that command"),
        "{}",
        sent[0].text()
    );
    app.telegram
        .push_update(group_text_update(group, 71, 5, "/stats@daylog_bot"));
    let sent = app.telegram.wait_sent(group, 2).await;
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(app.count("SELECT count(*) FROM day_logs").await, 0);
    app.stop().await;
}

#[tokio::test]
async fn photos_and_stickers_get_a_short_answer_and_create_no_log() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    app.telegram.push_update(photo_update(11, 1));
    app.telegram.push_update(sticker_update(11, 2));
    let sent = app.telegram.wait_sent(11, 2).await;
    for call in &sent {
        assert!(call.text().contains("only keep text"), "{}", call.text());
    }
    assert_eq!(app.count("SELECT count(*) FROM day_logs").await, 0);
    app.stop().await;
}

#[tokio::test]
async fn a_sticker_as_first_message_is_answered_in_the_clients_language() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    let mut sticker = sticker_update(13, 1);
    sticker["message"]["from"]["language_code"] = "ru".into();
    app.telegram.push_update(sticker);
    let sent = app.telegram.wait_sent(13, 1).await;
    assert_eq!(sent[0].text(), Texts(Language::Ru).only_text());
    app.stop().await;
}

#[tokio::test]
async fn a_9000_character_analysis_is_split_into_valid_parts() {
    let app = App::spawn().await;
    let paragraph = "This sentence is part of a very long analysis & it has <markup> to escape. ";
    let long: String = paragraph.repeat(9000 / paragraph.len() + 1);
    app.providers.answer_analysis(&long).await;
    app.providers.answer_metrics(support::METRICS_JSON).await;

    app.telegram
        .push_update(text_update(12, 1, "Tell me a lot."));
    let sent = app
        .telegram
        .wait_for("three parts", WAIT, |calls| {
            calls
                .iter()
                .filter(|c| c.method == "SendMessage" && c.chat_id() == Some(12))
                .count()
                >= 3
        })
        .await;
    let parts: Vec<_> = sent
        .iter()
        .filter(|c| c.chat_id() == Some(12) && c.method == "SendMessage")
        .collect();
    assert_eq!(parts.len(), 3);
    let mut joined = String::new();
    for part in &parts {
        let seen = visible(part.text());
        assert!(
            seen.encode_utf16().count() <= 4096,
            "part too long: {}",
            seen.len()
        );
        assert!(!part.text().contains("<markup>"), "escaped");
        joined.push_str(&seen);
        joined.push(' ');
    }
    let squash = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(squash(&joined).contains(&squash(&long)), "no text lost");
    assert_eq!(parts[0].reply_to(), Some(1));
    assert_eq!(
        parts[1].reply_to(),
        None,
        "a private chat quotes the first part only"
    );
    app.stop().await;
}

/// In a group (a forum supergroup: a message that is no reply goes to the General
/// topic) every part of a long answer, and a command's picture, replies to the message
/// it answers.
#[tokio::test]
async fn in_a_group_every_part_and_picture_replies_to_its_message() {
    let app = App::spawn().await;
    let group = -4242;
    let paragraph = "A long analysis for a group, sentence after sentence. ";
    app.providers
        .answer_analysis(&paragraph.repeat(9000 / paragraph.len() + 1))
        .await;
    app.providers.answer_metrics(support::METRICS_JSON).await;
    app.telegram
        .push_update(group_text_update(group, 14, 1, "A day in a topic."));
    let sent = app.telegram.wait_sent(group, 3).await;
    assert!(
        sent.iter().all(|part| part.reply_to() == Some(1)),
        "{:?}",
        sent.iter().map(Call::reply_to).collect::<Vec<_>>()
    );
    app.telegram
        .push_update(group_text_update(group, 14, 2, "/year"));
    let sent = app.telegram.wait_sent(group, 4).await;
    let picture = sent
        .iter()
        .find(|c| c.method == "SendPhoto")
        .expect("the year's picture");
    assert_eq!(picture.reply_to(), Some(2));
    app.stop().await;
}

#[tokio::test]
async fn hostile_html_from_the_model_is_escaped() {
    let app = App::spawn().await;
    app.providers
        .answer_analysis("<b>bold</b> <script>alert(1)</script> & <a href=\"x\">link</a>")
        .await;
    app.providers.answer_metrics(support::METRICS_JSON).await;
    app.telegram
        .push_update(text_update(13, 1, "<i>my</i> day & night"));
    let sent = app.telegram.wait_sent(13, 1).await;
    let html = sent[0].text();
    assert!(html.contains("&lt;script&gt;"), "{html}");
    assert!(html.contains("&lt;a href=\"x\"&gt;"), "{html}");
    assert!(!html.contains("<script>"));
    assert!(visible(html).contains("<b>bold</b>"));
    app.stop().await;
}

#[tokio::test]
async fn telegram_429_is_waited_out_and_the_reply_still_arrives_once() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    app.telegram.fail_next(
        "SendMessage",
        Some(14),
        429,
        json!({"ok": false, "error_code": 429, "description": "Too Many Requests: retry after 1",
               "parameters": {"retry_after": 1}}),
    );
    let started = std::time::Instant::now();
    app.telegram.push_update(text_update(14, 1, "Busy day."));
    let sent = app.telegram.wait_sent(14, 1).await;
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "waited as Telegram asked"
    );
    assert!(visible(sent[0].text()).contains(ANALYSIS_TEXT));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(app.telegram.sent_to(14).len(), 1);
    app.stop().await;
}

#[tokio::test]
async fn a_user_who_blocked_the_bot_does_not_stop_others_being_served() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    app.telegram.block_chat(15);
    app.telegram
        .push_update(text_update(15, 1, "I blocked you."));
    app.telegram.push_update(text_update(16, 1, "I did not."));
    let sent = app.telegram.wait_sent(16, 1).await;
    assert!(visible(sent[0].text()).contains(ANALYSIS_TEXT));
    // The blocked user's log is kept, analysed, and not retried forever.
    wait_until(|| async {
        app.count("SELECT count(*) FROM day_logs WHERE chat_id = 15 AND status = 'analyzed' AND replied_at IS NOT NULL")
            .await
            == 1
    })
    .await;
    app.stop().await;
}

#[tokio::test]
async fn stats_sends_a_png_chart() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    app.telegram.push_update(text_update(17, 1, "Good day."));
    app.telegram.wait_sent(17, 1).await;
    app.telegram.push_update(text_update(17, 2, "/stats 7"));
    let sent = app
        .telegram
        .wait_for("a photo", WAIT, |calls| {
            calls.iter().any(|c| c.method == "SendPhoto")
        })
        .await;
    let photo = sent
        .iter()
        .find(|c| c.method == "SendPhoto")
        .expect("photo");
    let png = photo.file.as_ref().expect("file part");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "PNG signature");
    assert!(png.len() > 2_000, "a real chart, {} bytes", png.len());
    let text = app.telegram.sent_to(17);
    let summary = text
        .iter()
        .find(|c| c.text().contains("statistics"))
        .expect("stats text");
    assert!(
        visible(summary.text()).contains("mood: 4.0/5"),
        "{}",
        summary.text()
    );
    app.stop().await;
}

#[tokio::test]
async fn export_sends_a_csv_that_parses() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    app.telegram
        .push_update(text_update(18, 1, "Entry, with \"quotes\" and a comma."));
    app.telegram.wait_sent(18, 1).await;
    app.telegram
        .push_update(text_update(18, 2, "=HYPERLINK(\"http://x\") ёлка"));
    app.telegram.wait_sent(18, 2).await;
    app.telegram.push_update(text_update(18, 3, "/export"));
    let bytes = app.telegram.wait_file("SendDocument").await;
    // A spreadsheet reads it as UTF-8 only with the byte-order mark.
    let csv = bytes.strip_prefix("\u{feff}".as_bytes()).expect("a BOM");
    let mut reader = csv::Reader::from_reader(csv);
    let headers = reader.headers().expect("headers").clone();
    assert_eq!(&headers[0], "id");
    assert_eq!(&headers[3], "text");
    let rows: Vec<csv::StringRecord> = reader.records().map(|r| r.expect("row")).collect();
    assert_eq!(rows.len(), 2);
    assert_eq!(&rows[0][3], "Entry, with \"quotes\" and a comma.");
    assert_eq!(&rows[0][5], "4", "mood column");
    // A text that begins like a formula is shown as text, never run.
    assert_eq!(&rows[1][3], "'=HYPERLINK(\"http://x\") ёлка");
    app.stop().await;
}

/// Waits for the `/delete` confirmation; its row of buttons.
async fn delete_keyboard(app: &App) -> serde_json::Value {
    let has_keyboard =
        |c: &support::telegram::Call| c.body["reply_markup"]["inline_keyboard"].is_array();
    let sent = app
        .telegram
        .wait_for("the confirmation", WAIT, |calls| {
            calls.iter().any(has_keyboard)
        })
        .await;
    let confirm = sent.into_iter().find(has_keyboard).expect("keyboard");
    confirm.body["reply_markup"]["inline_keyboard"][0].clone()
}

#[tokio::test]
async fn delete_after_confirmation_removes_every_row_of_that_user_and_no_other() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    app.telegram.push_update(text_update(19, 1, "Mine."));
    app.telegram
        .push_update(text_update(20, 1, "Someone else's."));
    app.telegram.wait_sent(19, 1).await;
    app.telegram.wait_sent(20, 1).await;

    app.telegram.push_update(text_update(19, 2, "/delete"));
    let keyboard = delete_keyboard(&app).await;
    assert_eq!(keyboard[0]["callback_data"], "delete:yes:19");
    assert_eq!(
        app.count("SELECT count(*) FROM day_logs WHERE user_id = 19")
            .await,
        1,
        "nothing before confirming"
    );

    app.telegram
        .push_update(callback_update(19, "delete:yes:19", 555));
    app.telegram
        .wait_for("deleted", WAIT, |calls| {
            calls.iter().any(|c| c.text().contains("deleted"))
        })
        .await;
    assert_eq!(
        app.count("SELECT count(*) FROM day_logs WHERE user_id = 19")
            .await,
        0
    );
    assert_eq!(
        app.count("SELECT count(*) FROM users WHERE user_id = 19")
            .await,
        0
    );
    assert_eq!(
        app.count(
            "SELECT count(*) FROM llm_calls WHERE day_log_id NOT IN (SELECT id FROM day_logs)"
        )
        .await,
        0
    );
    assert_eq!(
        app.count("SELECT count(*) FROM day_logs WHERE user_id = 20")
            .await,
        1
    );

    // A typo fixed in the deleted entry's message does not bring it back.
    let told = app.telegram.sent_to(19).len();
    let edit = app
        .telegram
        .push_update(edited_update(19, 1, "Mine, without the typo."));
    support::wait_until("the edit is taken", WAIT, || async {
        app.telegram.confirmed_below() > edit
    })
    .await;
    assert_eq!(
        app.count("SELECT count(*) FROM day_logs WHERE user_id = 19")
            .await,
        0
    );
    assert_eq!(app.telegram.sent_to(19).len(), told, "nothing said");
    app.stop().await;
}

/// In a group, the `/delete` buttons answer only the user who asked: another member's
/// "yes" deletes nothing (neither journal) and tells them so; the asker's still works.
#[tokio::test]
async fn a_delete_asked_in_a_group_is_answered_only_by_who_asked() {
    // Arrange: two members with entries; 19 asks for /delete in the group.
    let app = App::spawn().await;
    app.providers.healthy().await;
    app.telegram.push_update(text_update(19, 1, "Mine."));
    app.telegram.push_update(text_update(20, 1, "Theirs."));
    app.telegram.wait_sent(19, 1).await;
    app.telegram.wait_sent(20, 1).await;
    app.telegram
        .push_update(group_text_update(-300, 19, 2, "/delete"));
    let keyboard = delete_keyboard(&app).await;
    let yes = keyboard[0]["callback_data"]
        .as_str()
        .expect("data")
        .to_owned();

    // Act: 20 presses 19's "yes", and an old button without a user.
    app.telegram
        .push_update(group_callback_update(-300, 20, &yes, 700));
    app.telegram
        .push_update(group_callback_update(-300, 20, "delete:yes", 701));

    // Assert: told it is not theirs, and that the old one is to be asked again;
    // nothing deleted.
    let texts = Texts(Language::En);
    app.telegram
        .wait_for("both presses answered", WAIT, |calls| {
            let answered = |text: &str| {
                calls
                    .iter()
                    .any(|c| c.method == "AnswerCallbackQuery" && c.body["text"] == text)
            };
            answered(texts.delete_not_yours()) && answered(texts.delete_expired())
        })
        .await;
    for user in [19, 20] {
        assert_eq!(
            app.count(&format!(
                "SELECT count(*) FROM day_logs WHERE user_id = {user}"
            ))
            .await,
            1,
            "user {user}"
        );
    }

    // Act: 19 presses it.
    app.telegram
        .push_update(group_callback_update(-300, 19, &yes, 702));

    // Assert
    wait_until(|| async {
        app.count("SELECT count(*) FROM day_logs WHERE user_id = 19")
            .await
            == 0
    })
    .await;
    assert_eq!(
        app.count("SELECT count(*) FROM day_logs WHERE user_id = 20")
            .await,
        1
    );
    app.stop().await;
}

#[tokio::test]
async fn russian_users_are_answered_in_russian() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    app.telegram
        .push_update(text_update_lang(21, 1, "/start", "ru"));
    let sent = app.telegram.wait_sent(21, 1).await;
    assert!(sent[0].text().contains("Привет"), "{}", sent[0].text());
    app.stop().await;
}

#[tokio::test]
async fn users_outside_the_allowed_list_get_one_polite_refusal() {
    let app = App::spawn_with(|env| {
        env.insert("DAYLOG__TELEGRAM__ALLOWED_USERS".into(), "[22]".into());
    })
    .await;
    app.providers.healthy().await;
    app.telegram.push_update(text_update(23, 1, "Let me in."));
    app.telegram
        .push_update(text_update(22, 1, "I am allowed."));
    let refused = app.telegram.wait_sent(23, 1).await;
    assert!(
        refused[0].text().contains("private"),
        "{}",
        refused[0].text()
    );
    app.telegram.wait_sent(22, 1).await;
    // Two more: taken (confirmed), not answered again (one refusal, not one a message).
    app.telegram.push_update(text_update(23, 2, "Please?"));
    let last = app.telegram.push_update(text_update(23, 3, "Hello?"));
    support::wait_until("both are taken", Duration::from_secs(20), || async {
        app.telegram.confirmed_below() > last
    })
    .await;
    assert_eq!(app.telegram.sent_to(23).len(), 1);
    assert_eq!(
        app.count("SELECT count(*) FROM day_logs WHERE user_id = 23")
            .await,
        0
    );
    app.stop().await;
}

#[tokio::test]
async fn a_refusal_that_did_not_get_through_is_sent_at_the_next_message() {
    let app = App::spawn_with(|env| {
        env.insert("DAYLOG__TELEGRAM__ALLOWED_USERS".into(), "[22]".into());
    })
    .await;
    let down = json!({"ok": false, "error_code": 500, "description": "Internal Server Error"});
    app.telegram.fail_next("SendMessage", Some(23), 500, down);
    app.telegram.push_update(text_update(23, 1, "Let me in."));
    support::wait_until("the refusal is tried", WAIT, || async {
        app.telegram.failures_left() == 0
    })
    .await;
    assert!(app.telegram.sent_to(23).is_empty());
    // The one refusal never reached the chat: the next message gets it.
    app.telegram.push_update(text_update(23, 2, "Hello?"));
    let refused = app.telegram.wait_sent(23, 1).await;
    assert!(
        refused[0].text().contains("private"),
        "{}",
        refused[0].text()
    );
    let last = app.telegram.push_update(text_update(23, 3, "Anyone?"));
    support::wait_until("it is taken", WAIT, || async {
        app.telegram.confirmed_below() > last
    })
    .await;
    assert_eq!(app.telegram.sent_to(23).len(), 1);
    app.stop().await;
}

#[tokio::test]
async fn a_content_policy_block_is_saved_answered_plainly_and_not_retried() {
    let app = App::spawn().await;
    // Mistral steps reject the request; Gemini blocks the prompt.
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(ResponseTemplate::new(400).set_body_string("bad request"))
        .mount(&app.providers.mistral)
        .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "promptFeedback": {"blockReason": "SAFETY"}
        })))
        .mount(&app.providers.gemini)
        .await;
    app.providers.answer_metrics(support::METRICS_JSON).await;
    app.telegram
        .push_update(text_update(24, 1, "I'd kill for a coffee."));
    let sent = app.telegram.wait_sent(24, 1).await;
    assert!(
        visible(sent[0].text()).contains("refused"),
        "{}",
        sent[0].text()
    );
    wait_until(|| async {
        app.count(
            "SELECT count(*) FROM day_logs WHERE status = 'blocked' AND replied_at IS NOT NULL",
        )
        .await
            == 1
    })
    .await;
    let gemini_calls = app
        .providers
        .gemini
        .received_requests()
        .await
        .unwrap_or_default()
        .len();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        app.providers
            .gemini
            .received_requests()
            .await
            .unwrap_or_default()
            .len(),
        gemini_calls,
        "never retried"
    );
    app.stop().await;
}

#[tokio::test]
async fn throttled_bot_still_answers() {
    let app = App::spawn_with(|env| {
        env.insert("DAYLOG__TELEGRAM__THROTTLE".into(), "true".into());
    })
    .await;
    app.providers.healthy().await;
    app.telegram
        .push_update(text_update(25, 1, "Throttled but fine."));
    let sent = app.telegram.wait_sent(25, 1).await;
    assert!(visible(sent[0].text()).contains(ANALYSIS_TEXT));
    app.stop().await;
}

#[tokio::test]
async fn a_log_pending_past_max_age_is_marked_failed_and_the_user_told() {
    let app = App::spawn_with(|env| {
        env.insert("DAYLOG__WORKER__MAX_AGE_HOURS".into(), "0".into());
    })
    .await;
    app.providers.all_down().await;
    app.telegram
        .push_update(text_update(26, 1, "Nobody will analyse this."));
    let sent = app.telegram.wait_sent(26, 2).await;
    assert!(
        visible(sent[0].text()).contains("will follow"),
        "{}",
        sent[0].text()
    );
    assert!(
        visible(sent[1].text()).contains("gave up"),
        "{}",
        sent[1].text()
    );
    wait_until(|| async {
        app.count(
            "SELECT count(*) FROM day_logs WHERE status = 'failed' AND replied_at IS NOT NULL",
        )
        .await
            == 1
    })
    .await;
    assert_eq!(
        app.count("SELECT count(*) FROM day_logs WHERE length(text) > 0")
            .await,
        1,
        "the text is kept"
    );
    app.stop().await;
}

/// A bot with `worker.max_age_hours = 1` (and no retry on its own while a test arranges
/// the past) whose user `chat` wrote an entry while every provider was down: saved, to
/// follow. The providers are reset, answering nothing until the test says.
async fn saved_before_a_downtime(chat: i64) -> App {
    let app = App::spawn_with(|env| {
        env.insert("DAYLOG__WORKER__MAX_AGE_HOURS".into(), "1".into());
        env.insert("DAYLOG__WORKER__RETRY_MIN_MS".into(), "600000".into());
        env.insert("DAYLOG__WORKER__RETRY_MAX_MS".into(), "600000".into());
    })
    .await;
    app.providers.all_down().await;
    app.telegram
        .push_update(text_update(chat, 1, "Written before a long downtime."));
    let sent = app.telegram.wait_sent(chat, 1).await;
    assert!(visible(sent[0].text()).contains("will follow"));
    app.providers.reset().await;
    app
}

/// Past `worker.max_age_hours` a log is tried once more before it is given up: after a
/// downtime longer than that (or when the first answer after a long outage makes the
/// backlog due) a provider may answer now, and the user gets the analysis, not "gave up".
#[tokio::test]
async fn a_log_older_than_max_age_is_still_answered_when_a_provider_works() {
    let app = saved_before_a_downtime(32).await;
    app.providers.healthy().await;
    // Three hours old and due now, as after a downtime of three hours.
    app.age_logs_three_hours().await;

    let sent = app.telegram.wait_sent(32, 2).await;
    assert!(
        visible(sent[1].text()).contains(ANALYSIS_TEXT),
        "{}",
        sent[1].text()
    );
    assert_eq!(
        app.count("SELECT count(*) FROM day_logs WHERE status = 'analyzed'")
            .await,
        1
    );
    app.stop().await;
}

/// An entry past `worker.max_age_hours` gets one more try; edited while that try runs,
/// it is a young entry again: its new text is analysed, it is not given up on with the
/// old one's age.
#[tokio::test]
async fn an_entry_edited_during_its_last_try_is_analysed_not_given_up() {
    let app = saved_before_a_downtime(34).await;
    // The providers are back, slowly: the worker's last try is in flight…
    app.providers.slow(Duration::from_millis(800)).await;
    app.age_logs_three_hours().await;
    wait_until(|| async { app.providers.analysis_requests().await > 0 }).await;
    // …when the user edits the entry.
    app.telegram
        .push_update(edited_update(34, 1, "Written again, just now."));

    let sent = app.telegram.wait_sent(34, 2).await;
    assert!(
        visible(sent[1].text()).contains(ANALYSIS_TEXT),
        "{}",
        sent[1].text()
    );
    wait_until(|| async {
        app.count(
            "SELECT count(*) FROM day_logs WHERE status = 'analyzed' AND replied_at IS NOT NULL",
        )
        .await
            == 1
    })
    .await;
    assert!(
        app.telegram
            .sent_to(34)
            .iter()
            .all(|call| !call.text().contains("gave up")),
        "{:?}",
        app.telegram.sent_to(34)
    );
    app.stop().await;
}

/// `worker.max_age_hours` counts from the last edit that changed an entry, not from when
/// it was first written: an entry written three days ago and edited during an outage is
/// retried like a new one, not given up at its first retry.
#[tokio::test]
async fn an_old_entry_edited_during_an_outage_is_not_given_up_as_too_old() {
    let app = App::spawn_with(|env| {
        env.insert("DAYLOG__WORKER__MAX_AGE_HOURS".into(), "1".into());
    })
    .await;
    app.providers.healthy().await;
    app.telegram
        .push_update(text_update(29, 1, "Written long ago."));
    app.telegram.wait_sent(29, 1).await;
    let writer = sqlx::SqlitePool::connect(&app.env["DATABASE_URL"])
        .await
        .expect("writer");
    sqlx::query("UPDATE day_logs SET created_at = datetime('now', '-3 days')")
        .execute(&writer)
        .await
        .expect("an entry of three days ago");
    writer.close().await;

    app.providers.reset().await;
    app.providers.all_down().await;
    app.telegram.push_update(edited_update(
        29,
        1,
        "Written long ago, and corrected today.",
    ));

    wait_until(|| async {
        app.count(
            "SELECT count(*) FROM day_logs
             WHERE text LIKE '%corrected%' AND (attempts >= 2 OR status <> 'pending')",
        )
        .await
            == 1
    })
    .await;
    assert_eq!(
        app.count("SELECT count(*) FROM day_logs WHERE status = 'pending'")
            .await,
        1,
        "still being retried"
    );
    assert!(
        app.telegram
            .sent_to(29)
            .iter()
            .all(|m| !visible(m.text()).contains("gave up"))
    );
    app.stop().await;
}

#[tokio::test]
async fn beyond_the_hourly_limit_entries_are_saved_and_deferred() {
    let app = App::spawn_with(|env| {
        env.insert("DAYLOG__TELEGRAM__ANALYSES_PER_HOUR".into(), "1".into());
    })
    .await;
    app.providers.healthy().await;
    app.telegram.push_update(text_update(27, 1, "First entry."));
    app.telegram
        .push_update(text_update(27, 2, "Second entry."));
    let sent = app.telegram.wait_sent(27, 2).await;
    assert!(visible(sent[0].text()).contains(ANALYSIS_TEXT));
    assert!(
        visible(sent[1].text()).contains("hourly"),
        "{}",
        sent[1].text()
    );
    let deferred: (String, Option<String>) = sqlx::query_as(
        "SELECT status, next_attempt_at FROM day_logs WHERE chat_id = 27 AND message_id = 2",
    )
    .fetch_one(app.store.read_pool().expect("a SQLite store"))
    .await
    .expect("row");
    assert_eq!(deferred.0, "pending");
    assert!(deferred.1.is_some(), "scheduled for later");
    app.stop().await;
}

/// A burst beyond the hourly limit drains at the limit's pace: with two
/// analyses an hour, entries 3–4 wait an hour, 5–6 two hours and 7 three, and each is
/// told its own wait, instead of five analyses all coming back an hour later.
#[tokio::test]
async fn a_burst_beyond_the_hourly_limit_is_spread_over_the_hours_it_needs() {
    let app = App::spawn_with(|env| {
        env.insert("DAYLOG__TELEGRAM__ANALYSES_PER_HOUR".into(), "2".into());
    })
    .await;
    app.providers.healthy().await;
    for id in 1..=7 {
        app.telegram
            .push_update(text_update(64, id, &format!("Entry {id}.")));
    }
    let sent = app.telegram.wait_sent(64, 7).await;

    let waits: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT message_id,
                CAST(round((unixepoch(next_attempt_at) - unixepoch(created_at)) / 3600.0) AS INTEGER)
         FROM day_logs WHERE chat_id = 64 AND status = 'pending' AND waiting_for = 'deferred'
         ORDER BY message_id",
    )
    .fetch_all(app.store.read_pool().expect("a SQLite store"))
    .await
    .expect("rows");
    assert_eq!(waits, [(3, 1), (4, 1), (5, 2), (6, 2), (7, 3)]);
    assert_eq!(app.providers.analysis_requests().await, 2);
    let notices: Vec<String> = sent[2..].iter().map(|m| visible(m.text())).collect();
    assert!(
        notices[0].contains("hourly") && notices[0].contains("60 minutes"),
        "{notices:?}"
    );
    assert!(notices[2].contains("2 hours"), "{notices:?}");
    assert!(notices[4].contains("3 hours"), "{notices:?}");
    app.stop().await;
}

#[tokio::test]
async fn an_overlong_entry_is_saved_whole_and_analysed_truncated_with_a_note() {
    let app = App::spawn_with(|env| {
        env.insert("DAYLOG__TELEGRAM__MAX_TEXT_CHARS".into(), "100".into());
    })
    .await;
    app.providers.healthy().await;
    let long = "word ".repeat(200);
    app.telegram.push_update(text_update(28, 1, &long));
    let sent = app.telegram.wait_sent(28, 1).await;
    assert!(
        visible(sent[0].text()).contains("only its beginning was analysed"),
        "{}",
        sent[0].text()
    );
    let stored: String = sqlx::query_scalar("SELECT text FROM day_logs WHERE chat_id = 28")
        .fetch_one(app.store.read_pool().expect("a SQLite store"))
        .await
        .expect("row");
    assert_eq!(stored, long, "saved whole");
    let requests = app
        .providers
        .mistral
        .received_requests()
        .await
        .unwrap_or_default();
    let body = String::from_utf8_lossy(&requests[0].body).to_string();
    assert!(
        !body.contains(&long.trim_end()[..400]),
        "the model got the truncated text"
    );
    app.stop().await;
}

/// A reply Telegram could not take for a passing reason is delivered later, once: a
/// 502, and a 429 without `retry_after` (teloxide sees an unknown API error there, not
/// its `RetryAfter`, and it must not be taken for a refusal of the message).
#[tokio::test]
async fn a_reply_lost_to_a_telegram_outage_is_delivered_later() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    let failures = [
        (29, 502, "Bad Gateway"),
        (31, 429, "Too Many Requests: retry later"),
    ];
    for (chat, status, description) in failures {
        app.telegram.fail_next(
            "SendMessage",
            Some(chat),
            status,
            json!({"ok": false, "error_code": status, "description": description}),
        );
        app.telegram
            .push_update(text_update(chat, 1, "Telegram hiccups."));
    }
    for (chat, _, description) in failures {
        let sent = app.telegram.wait_sent(chat, 1).await;
        assert!(
            visible(sent[0].text()).contains(ANALYSIS_TEXT),
            "after {description}: {}",
            sent[0].text()
        );
    }
    wait_until(|| async {
        app.count("SELECT count(*) FROM day_logs WHERE replied_at IS NOT NULL")
            .await
            == 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (chat, _, _) in failures {
        assert_eq!(app.telegram.sent_to(chat).len(), 1, "delivered once");
    }
    assert_eq!(app.telegram.failures_left(), 0);
    app.stop().await;
}

/// A group made a supergroup gets a new chat id: an answer owed to the old one goes to
/// the new chat (as a plain message: message ids change too), not marked delivered and
/// dropped.
#[tokio::test]
async fn an_answer_owed_to_a_group_that_became_a_supergroup_goes_to_the_new_chat() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    let (old, new) = (-500, -100_500);
    app.telegram.fail_next(
        "SendMessage",
        Some(old),
        400,
        json!({"ok": false, "error_code": 400,
               "description": "Bad Request: group chat was upgraded to a supergroup chat",
               "parameters": {"migrate_to_chat_id": new}}),
    );
    app.telegram
        .push_update(group_text_update(old, 32, 1, "A day in the old group."));
    let sent = app.telegram.wait_sent(new, 1).await;
    assert!(
        visible(sent[0].text()).contains(ANALYSIS_TEXT),
        "{}",
        sent[0].text()
    );
    assert_eq!(sent[0].reply_to(), None);
    assert_eq!(app.telegram.failures_left(), 0);
    app.stop().await;
}

#[tokio::test]
async fn an_edit_during_a_background_analysis_is_analysed_and_the_old_text_never_answered() {
    let app = App::spawn().await;
    app.providers.all_down().await;
    app.telegram.push_update(text_update(40, 1, "old text"));
    app.telegram.wait_sent(40, 1).await; // "saved, will follow"

    // Providers come back, slowly: the worker's analysis of the old text is in flight…
    app.providers.reset().await;
    app.providers.slow(Duration::from_millis(800)).await;
    wait_until(|| async { app.providers.analysis_requests().await > 0 }).await;
    // …when the user edits the entry.
    app.telegram.push_update(edited_update(40, 1, "new text"));

    let sent = app.telegram.wait_sent(40, 2).await;
    assert!(visible(sent[1].text()).contains(ANALYSIS_TEXT));
    wait_until(|| async {
        app.count("SELECT count(*) FROM day_logs WHERE text = 'new text' AND status = 'analyzed' AND replied_at IS NOT NULL")
            .await
            == 1
    })
    .await;
    let bodies = analysis_bodies(&app).await;
    let last = bodies.last().expect("a request");
    assert!(
        last.contains("new text"),
        "the stored analysis is of the new text"
    );
    // The old text's analysis finished before the new one started (same claim).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        app.telegram.sent_to(40).len(),
        2,
        "no answer to the old text"
    );
    app.stop().await;
}

/// How long a slow provider takes in the tests of a chat's order: ample time for the
/// store to take the entries behind the first one, even on a loaded machine.
const SLOW_ANSWER: Duration = Duration::from_secs(3);

/// Slow answers are still answers (not timeouts), and the worker stays out of the way.
fn slow_answers_allowed(env: &mut std::collections::HashMap<String, String>) {
    env.insert("DAYLOG__RETRY__REQUEST_TIMEOUT_MS".into(), "10000".into());
    env.insert("DAYLOG__RETRY__DEADLINE_MS".into(), "30000".into());
    env.insert("DAYLOG__WORKER__POLL_INTERVAL_MS".into(), "60000".into());
}

/// A bot with slow providers, and two entries of `chat` (messages 1 and 2) pushed one
/// right after the other; returns once both are stored.
async fn two_entries_behind_a_slow_analysis(chat: i64, second: &str) -> App {
    let app = App::spawn_with(slow_answers_allowed).await;
    app.providers.slow(SLOW_ANSWER).await;
    app.telegram
        .push_update(text_update(chat, 1, "first entry"));
    app.telegram.push_update(text_update(chat, 2, second));
    let stored = format!("SELECT count(*) FROM day_logs WHERE chat_id = {chat}");
    wait_until(|| async { app.count(&stored).await == 2 }).await;
    app
}

/// What the mistral fake was asked, each request's body as text.
async fn analysis_bodies(app: &App) -> Vec<String> {
    let requests = app
        .providers
        .mistral
        .received_requests()
        .await
        .unwrap_or_default();
    requests
        .iter()
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect()
}

#[tokio::test]
async fn a_chats_next_entry_is_stored_while_its_first_is_analysed_and_the_answers_keep_their_order()
{
    // Every answer takes 3 s, so the first entry's analysis is still out when the
    // second is already stored. Held in memory behind the first analysis, it would be
    // lost to a crash (Telegram has been told it arrived).
    let app = two_entries_behind_a_slow_analysis(41, "second entry").await;
    assert!(
        app.telegram.sent_to(41).is_empty(),
        "both stored before the first answer"
    );
    let sent = app.telegram.wait_sent(41, 2).await;
    let replies_to: Vec<_> = sent.iter().map(|c| c.reply_to()).collect();
    assert_eq!(replies_to, vec![Some(1), Some(2)], "answered in order");
    assert!(visible(sent[1].text()).contains(ANALYSIS_TEXT));
    app.stop().await;
}

#[tokio::test]
async fn an_entry_edited_while_it_is_analysed_is_answered_at_once_with_the_new_text() {
    let app = App::spawn_with(slow_answers_allowed).await;
    app.providers.slow(SLOW_ANSWER).await;
    app.telegram.push_update(text_update(43, 1, "Slept badly."));
    wait_until(|| async { app.providers.analysis_requests().await > 0 }).await;

    app.telegram
        .push_update(edited_update(43, 1, "Slept badly, but the run helped."));

    // One answer, to the new text, live: not the worker's late one a poll later
    // (its poll is a minute here).
    let sent = app.telegram.wait_sent(43, 1).await;
    let text = visible(sent[0].text());
    assert!(text.contains(ANALYSIS_TEXT), "{text}");
    assert!(
        !text.contains("Here is your analysis"),
        "answered live: {text}"
    );
    wait_until(|| async {
        app.count("SELECT count(*) FROM day_logs WHERE text = 'Slept badly, but the run helped.' AND status = 'analyzed' AND replied_at IS NOT NULL")
            .await
            == 1
    })
    .await;
    assert!(
        analysis_bodies(&app)
            .await
            .iter()
            .any(|b| b.contains("the run helped")),
        "the new text is analysed"
    );
    assert_eq!(
        app.telegram.sent_to(43).len(),
        1,
        "the old text is never answered"
    );
    app.stop().await;
}

#[tokio::test]
async fn an_entry_edited_while_it_waits_for_its_turn_is_analysed_as_edited() {
    let app = two_entries_behind_a_slow_analysis(42, "second, with a tpyo").await;

    // While the first is analysed, the second is edited.
    app.telegram
        .push_update(edited_update(42, 2, "second, without a typo"));
    wait_until(|| async {
        app.count("SELECT count(*) FROM day_logs WHERE text = 'second, without a typo'")
            .await
            == 1
    })
    .await;
    assert!(
        app.telegram.sent_to(42).is_empty(),
        "edited before the first answer"
    );

    let sent = app.telegram.wait_sent(42, 2).await;
    assert_eq!(sent[1].reply_to(), Some(2));
    wait_until(|| async {
        app.count("SELECT count(*) FROM day_logs WHERE text = 'second, without a typo' AND status = 'analyzed' AND replied_at IS NOT NULL")
            .await
            == 1
    })
    .await;
    let bodies = analysis_bodies(&app).await;
    assert!(
        bodies.iter().any(|b| b.contains("without a typo")),
        "the new text is analysed"
    );
    assert!(
        !bodies.iter().any(|b| b.contains("tpyo")),
        "the old text, never: it was read again when its turn came"
    );
    assert_eq!(app.telegram.sent_to(42).len(), 2, "one answer each");
    app.stop().await;
}

#[tokio::test]
async fn the_bot_asks_telegram_only_for_the_updates_it_handles() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    app.telegram.push_update(text_update(44, 1, "A quiet day."));
    app.telegram.wait_sent(44, 1).await;
    assert_eq!(
        app.telegram.allowed_updates(),
        vec!["callback_query", "edited_message", "message"]
    );
    app.stop().await;
}

#[tokio::test]
async fn unknown_and_edited_commands_are_never_journal_entries() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    app.telegram.push_update(text_update(41, 1, "/histroy"));
    let sent = app.telegram.wait_sent(41, 1).await;
    assert!(sent[0].text().contains("/help"), "{}", sent[0].text());
    app.telegram.push_update(text_update(41, 2, "/stats 7"));
    app.telegram.wait_sent(41, 2).await;
    app.telegram.push_update(edited_update(41, 2, "/stats 30"));
    app.telegram
        .push_update(text_update(41, 3, "A real entry."));
    app.telegram.wait_sent(41, 3).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        app.count("SELECT count(*) FROM day_logs WHERE chat_id = 41")
            .await,
        1
    );
    assert_eq!(
        app.count("SELECT count(*) FROM day_logs WHERE chat_id = 41 AND text LIKE '/%'")
            .await,
        0
    );
    app.stop().await;
}

#[tokio::test]
async fn a_reply_telegram_cannot_parse_is_sent_again_as_plain_text() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    app.telegram.fail_next(
        "SendMessage",
        Some(42),
        400,
        json!({"ok": false, "error_code": 400,
               "description": "Bad Request: can't parse entities: Unsupported start tag \"x\" at byte offset 3"}),
    );
    app.telegram
        .push_update(text_update(42, 1, "Format trouble."));
    let sent = app.telegram.wait_sent(42, 1).await;
    assert!(
        sent[0].body.get("parse_mode").is_none(),
        "{:?}",
        sent[0].body
    );
    assert!(sent[0].text().contains(ANALYSIS_TEXT), "{}", sent[0].text());
    assert!(!sent[0].text().contains("<b>"), "{}", sent[0].text());
    app.stop().await;
}

/// Issue 9 item 3: an entry's error sentence is in the user's stored language (`/lang`),
/// not the one their Telegram client reports.
#[tokio::test]
async fn an_entry_error_is_told_in_the_language_set_with_lang_not_the_clients() {
    use sqlx::Connection as _;
    let app = App::spawn().await;
    app.providers.healthy().await;
    app.telegram
        .push_update(text_update_lang(41, 1, "/lang ru", "en"));
    app.telegram.wait_sent(41, 1).await;
    // From now on every new day log fails to insert, as on a full disk.
    let url = format!("sqlite://{}/daylog.db", app.dir.path().display());
    let mut conn = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("connect");
    sqlx::query(
        "CREATE TRIGGER refuse_logs BEFORE INSERT ON day_logs
         BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",
    )
    .execute(&mut conn)
    .await
    .expect("trigger");
    conn.close().await.expect("close");

    app.telegram
        .push_update(text_update_lang(41, 2, "A quiet day.", "en"));

    let sent = app.telegram.wait_sent(41, 2).await;
    let told = visible(sent[1].text());
    let russian = daylog::texts::Texts(daylog::language::Language::Ru);
    // Kept in the inbox: it is taken once it can be stored.
    assert_eq!(told, russian.not_saved_yet());
    assert_eq!(sent[1].reply_to(), Some(2));
    assert_eq!(app.count("SELECT count(*) FROM day_logs").await, 0);
    app.stop().await;
}

/// Issue 9 item 8: with no key configured the user is told that no AI provider
/// is set up (not that the services are down); the entry is saved and stays pending.
#[tokio::test]
async fn with_no_key_configured_the_user_is_told_no_provider_is_set_up() {
    let app = App::spawn_with(|env| {
        for key in ["MISTRAL_API_KEY", "GEMINI_API_KEY", "GROQ_API_KEY"] {
            env.remove(key);
        }
    })
    .await;
    app.telegram.push_update(text_update_lang(
        42,
        1,
        "A day nobody can analyse yet.",
        "ru",
    ));

    let sent = app.telegram.wait_sent(42, 1).await;
    let told = visible(sent[0].text());
    let russian = daylog::texts::Texts(daylog::language::Language::Ru);
    assert_eq!(told, russian.saved_no_provider("MISTRAL_API_KEY"));
    assert_eq!(
        app.count("SELECT count(*) FROM day_logs WHERE status = 'pending'")
            .await,
        1
    );
    assert_eq!(provider_requests(&app).await, 0, "nothing was called");
    app.stop().await;
}

/// Metrics that came back in a round whose analysis failed are kept with the pending
/// entry: the round that finally has an analysis does not ask for them again, and an
/// outage of the metrics' providers by then does not turn them into defaults.
#[tokio::test]
async fn metrics_got_in_a_failed_round_are_kept_for_the_round_that_answers() {
    let app = App::spawn().await;
    // Round one: Groq answers the metrics, every analysis step answers 503.
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(503).set_body_string("overloaded"))
        .mount(&app.providers.mistral)
        .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(503).set_body_string("overloaded"))
        .mount(&app.providers.gemini)
        .await;
    app.providers
        .answer_metrics(r#"{"mood":2,"stress":5,"energy":2,"productivity":1,"sleep_hours":4,"activities":["work"],"emotions":["tired"],"summary":"Worn out"}"#)
        .await;
    app.telegram
        .push_update(text_update(61, 1, "Worn out after a long shift."));
    let told = app.telegram.wait_sent(61, 1).await;
    assert!(
        visible(told[0].text()).contains("will follow"),
        "{}",
        told[0].text()
    );
    assert_eq!(
        app.count("SELECT count(*) FROM day_logs WHERE status = 'pending' AND json_extract(metrics, '$.mood') = 2")
            .await,
        1,
        "kept with the pending entry"
    );

    // Round two: the analysis answers, Groq is down.
    app.providers.reset().await;
    app.providers.answer_analysis(ANALYSIS_TEXT).await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(503).set_body_string("overloaded"))
        .mount(&app.providers.groq)
        .await;
    let sent = app.telegram.wait_sent(61, 2).await;

    assert!(
        visible(sent[1].text()).contains(ANALYSIS_TEXT),
        "{}",
        sent[1].text()
    );
    assert_eq!(
        app.count(
            "SELECT count(*) FROM day_logs WHERE status = 'analyzed'
             AND json_extract(metrics, '$.mood') = 2 AND json_extract(metrics, '$.stress') = 5"
        )
        .await,
        1
    );
    assert!(
        app.providers
            .groq
            .received_requests()
            .await
            .unwrap_or_default()
            .is_empty(),
        "the metrics were not asked for again"
    );
    app.stop().await;
}

/// An entry answered days late (an outage) is compared with the week up to its own day:
/// the days written after it are not in its context as "recent days".
#[tokio::test]
async fn a_late_analysis_is_compared_with_the_days_before_its_entry_not_after() {
    let app = with_hour_long_retries().await;
    let at = |text: &str| text.parse::<jiff::Timestamp>().expect("moment");
    // Tuesday 1 December: written during an outage.
    app.clock.set(at("2026-12-01T20:00:00Z"));
    app.providers.all_down().await;
    app.telegram.push_update(support::telegram::text_update_at(
        62,
        1,
        "Tuesday, written in the outage.",
        at("2026-12-01T20:00:00Z").as_second(),
    ));
    app.telegram.wait_sent(62, 1).await;

    // Thursday 3 December: the providers are back, a new entry is answered, and the
    // Tuesday one with it.
    app.clock.set(at("2026-12-03T20:00:00Z"));
    app.providers.reset().await;
    app.providers.healthy().await;
    app.telegram.push_update(support::telegram::text_update_at(
        62,
        2,
        "Thursday.",
        at("2026-12-03T20:00:00Z").as_second(),
    ));
    app.telegram.wait_sent(62, 3).await;

    let prompts: Vec<String> = app
        .providers
        .mistral
        .received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .filter_map(|r| serde_json::from_slice::<serde_json::Value>(&r.body).ok())
        .filter_map(|b| b["messages"][1]["content"].as_str().map(str::to_owned))
        .collect();
    let tuesday = prompts
        .iter()
        .find(|p| p.contains("Tuesday, written in the outage."))
        .expect("the late analysis's prompt");
    assert!(!tuesday.contains("2026-12-03"), "{tuesday}");
    app.stop().await;
}

/// The hourly limit counts analyses, an edit's new analysis among them: one
/// entry edited again and again is not analysed without end; the edit over the limit
/// is saved and analysed later.
#[tokio::test]
async fn edits_count_toward_the_hourly_limit_on_analyses() {
    let app = App::spawn_with(|env| {
        env.insert("DAYLOG__TELEGRAM__ANALYSES_PER_HOUR".into(), "2".into());
    })
    .await;
    app.providers.healthy().await;
    app.telegram.push_update(text_update(63, 1, "First try."));
    app.telegram.wait_sent(63, 1).await;
    app.telegram
        .push_update(edited_update(63, 1, "Second try."));
    app.telegram.wait_sent(63, 2).await;

    app.telegram.push_update(edited_update(63, 1, "Third try."));
    let sent = app.telegram.wait_sent(63, 3).await;

    assert!(
        visible(sent[2].text()).contains("hourly"),
        "{}",
        sent[2].text()
    );
    assert_eq!(app.providers.analysis_requests().await, 2);
    assert_eq!(
        app.count(
            "SELECT count(*) FROM day_logs WHERE chat_id = 63 AND status = 'pending'
             AND waiting_for = 'deferred' AND text = 'Third try.'"
        )
        .await,
        1
    );
    app.stop().await;
}

/// An album of photos (one media group) gets one answer that only text is kept, not
/// one per photo; a photo sent on its own later is answered again.
#[tokio::test]
async fn an_album_of_photos_is_answered_once() {
    let app = App::spawn().await;
    let mut last = 0;
    for id in 1..=4 {
        let mut update = photo_update(65, id);
        update["message"]["media_group_id"] = serde_json::json!("album-1");
        last = app.telegram.push_update(update);
    }
    support::wait_until("the album is taken", WAIT, || async {
        app.telegram.confirmed_below() > last
    })
    .await;
    assert_eq!(app.telegram.sent_to(65).len(), 1);

    app.telegram.push_update(photo_update(65, 5));
    app.telegram.wait_sent(65, 2).await;
    app.stop().await;
}

#[tokio::test]
async fn an_albums_answer_that_did_not_get_through_is_sent_for_its_next_photo() {
    let app = App::spawn().await;
    let down = json!({"ok": false, "error_code": 500, "description": "Internal Server Error"});
    app.telegram.fail_next("SendMessage", Some(66), 500, down);
    for id in 1..=3 {
        let mut update = photo_update(66, id);
        update["message"]["media_group_id"] = serde_json::json!("album-2");
        app.telegram.push_update(update);
    }
    // A photo on its own after the album: the chat's updates are handled in order, so
    // once its answer is sent every photo of the album has been answered or skipped.
    app.telegram.push_update(photo_update(66, 4));
    app.telegram.wait_sent(66, 2).await;
    assert_eq!(app.telegram.failures_left(), 0);
    // The first photo's answer failed; the second's came; the third said nothing.
    assert_eq!(app.telegram.sent_to(66).len(), 2);
    app.stop().await;
}

/// A bot whose worker tries a failed log again only after an hour: what a test sees
/// come later came from something else than the retry schedule.
async fn with_hour_long_retries() -> App {
    App::spawn_with(|env| {
        for key in [
            "DAYLOG__WORKER__RETRY_MIN_MS",
            "DAYLOG__WORKER__RETRY_MAX_MS",
        ] {
            env.insert(key.to_owned(), "3600000".to_owned());
        }
    })
    .await
}
