//! Time and rhythm (docs/behaviour.md, "Time zones and rhythm") through the real dispatcher and a fake Telegram: time
//! zones, local days, streaks and reminders. The bot reads "now" from the harness's
//! [`daylog::time::ManualClock`], so a test stands at 20:59:50 in Los Angeles and
//! moves the clock instead of waiting; waits are on conditions.

#![expect(
    clippy::expect_used,
    reason = "helpers outside #[test] fns fail loudly by design"
)]

use crate::support;

use std::time::Duration;

use daylog::language::Language;
use daylog::store::NewUser;
use daylog::store::{ChatId, MessageId, UserId};
use daylog::texts::Texts;
use jiff::Timestamp;
use support::telegram::{Call, location_update, text_update, text_update_at};
use support::{App, wait_until};

const WAIT: Duration = Duration::from_secs(20);

fn at(text: &str) -> Timestamp {
    text.parse().expect("timestamp")
}

fn is_reminder(call: &Call) -> bool {
    (0..4).any(|i| {
        [true, false].into_iter().any(|evening| {
            call.text() == Texts(Language::En).reminder(i, evening)
                || call.text() == Texts(Language::Ru).reminder(i, evening)
        })
    })
}

fn reminders_to(app: &App, chat: i64) -> usize {
    app.telegram
        .sent_to(chat)
        .iter()
        .filter(|c| is_reminder(c))
        .count()
}

/// Sends a command and waits for its answer; returns the answer's text.
async fn command(app: &App, user: i64, message_id: i64, text: &str) -> String {
    let before = app.telegram.sent_to(user).len();
    app.telegram
        .push_update(text_update(user, message_id, text));
    let sent = app.telegram.wait_sent(user, before + 1).await;
    sent[before].text().to_owned()
}

async fn reminder_row(app: &App, user: i64) -> (i64, Option<String>, Option<String>) {
    sqlx::query_as("SELECT enabled, last_sent_day, next_due_at FROM reminders WHERE user_id = ?1")
        .bind(user)
        .fetch_one(app.store.read_pool().expect("a SQLite store"))
        .await
        .expect("reminder row")
}

/// A user with a reminder at `time`, next due at `due`, set up directly in the store.
/// The test clock starts at the real time, which may be any moment of the days these
/// tests are dated (1 December itself): set it before `due` first, or the reminder may
/// be due, and sent, before the test moves the clock.
async fn user_with_reminder(app: &App, user: i64, zone: &str, time: &str, due: Timestamp) {
    app.store
        .upsert_user(&NewUser {
            user_id: UserId(user),
            username: None,
            language: Language::En,
        })
        .await
        .expect("user");
    let zone = daylog::time::UserZone::parse(zone).expect("zone");
    app.store
        .set_timezone(UserId(user), &zone)
        .await
        .expect("tz");
    app.store
        .set_reminder(
            UserId(user),
            daylog::time::LocalTime::parse(time).expect("time"),
            due,
            due,
        )
        .await
        .expect("reminder");
}

#[tokio::test]
async fn a_user_at_20_59_50_in_los_angeles_gets_exactly_one_reminder_even_across_a_restart() {
    // Arrange: 20:59:50 on 1 December in Los Angeles (PST, UTC−8).
    let app = App::spawn().await;
    app.clock.set(at("2026-12-02T04:59:50Z"));
    let tz = command(&app, 1, 1, "/tz America/Los_Angeles").await;
    assert!(
        tz.contains("America/Los_Angeles") && tz.contains("20:59"),
        "{tz}"
    );
    let set = command(&app, 1, 2, "/remind 21:00").await;
    assert!(set.contains("21:00"), "{set}");
    let (_, _, due) = reminder_row(&app, 1).await;
    assert_eq!(
        due.as_deref(),
        Some("2026-12-02 05:00:00"),
        "21:00 PST in UTC"
    );
    // A sentinel user due a little later shows when a tick has looked past 21:00.
    user_with_reminder(
        &app,
        2,
        "America/Los_Angeles",
        "21:00",
        at("2026-12-02T05:00:02Z"),
    )
    .await;

    // Act: the clock reaches 21:00:05 local.
    app.clock.set(at("2026-12-02T05:00:05Z"));
    app.telegram
        .wait_for("both reminders", WAIT, |calls| {
            calls.iter().filter(|c| is_reminder(c)).count() >= 2
        })
        .await;
    // Later that evening and the next afternoon: nothing more.
    app.clock.set(at("2026-12-02T05:30:00Z"));
    let (_, sent_day, next) = reminder_row(&app, 1).await;
    assert_eq!(
        sent_day.as_deref(),
        Some("2026-12-01"),
        "recorded for the local day"
    );
    assert_eq!(
        next.as_deref(),
        Some("2026-12-03 05:00:00"),
        "next: tomorrow 21:00"
    );
    assert_eq!(reminders_to(&app, 1), 1, "exactly one before the restart");

    // Act: a restart in the same minute (the sentinel is due again so a tick is visible).
    let (dir, providers) = app.stop().await;
    let app = App::spawn_on(dir, providers, |_| {}).await;
    app.clock.set(at("2026-12-02T05:00:40Z"));
    // One statement, so that no tick sees the sentinel half reset.
    sqlx::query(
        "UPDATE reminders SET next_due_at = '2026-12-02 05:00:30', last_sent_day = NULL
         WHERE user_id = 2",
    )
    .execute(
        &sqlx::SqlitePool::connect(&app.env["DATABASE_URL"])
            .await
            .expect("raw"),
    )
    .await
    .expect("sentinel due again");
    app.telegram
        .wait_for("the sentinel's reminder after the restart", WAIT, |calls| {
            calls
                .iter()
                .any(|c| is_reminder(c) && c.chat_id() == Some(2))
        })
        .await;

    // Assert: user 1 got exactly one reminder in all.
    assert_eq!(
        reminders_to(&app, 1),
        0,
        "no second reminder after the restart"
    );
    app.stop().await;
}

#[tokio::test]
async fn no_reminder_on_a_local_day_that_already_has_an_entry() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    app.clock.set(at("2026-12-02T04:00:00Z")); // 20:00 in Los Angeles
    command(&app, 3, 1, "/tz Los_Angeles").await;
    command(&app, 3, 2, "/remind 21:00").await;
    // Written at 18:00 local, which is already 2 December in UTC.
    app.telegram.push_update(text_update_at(
        3,
        3,
        "A calm evening walk.",
        at("2026-12-02T02:00:00Z").as_second(),
    ));
    app.telegram.wait_sent(3, 3).await;
    let day: String = sqlx::query_scalar("SELECT local_day FROM day_logs WHERE user_id = 3")
        .fetch_one(app.store.read_pool().expect("a SQLite store"))
        .await
        .expect("day");
    assert_eq!(
        day, "2026-12-01",
        "the Los Angeles evening, not the UTC date"
    );

    app.clock.set(at("2026-12-02T05:00:05Z"));
    wait_until("the reminder moved to tomorrow", WAIT, || async {
        reminder_row(&app, 3).await.2.as_deref() == Some("2026-12-03 05:00:00")
    })
    .await;

    assert_eq!(reminders_to(&app, 3), 0);
    assert_eq!(
        reminder_row(&app, 3).await.1,
        None,
        "nothing recorded as sent"
    );

    // /history and /export show the entry's local day, and when it was written on the
    // Los Angeles clock: the message's date, not when daylog stored it (the real time,
    // which here plays a downtime of a day or more).
    let (created, written): (String, Option<String>) =
        sqlx::query_as("SELECT created_at, written_at FROM day_logs WHERE user_id = 3")
            .fetch_one(app.store.read_pool().expect("a SQLite store"))
            .await
            .expect("created_at");
    assert_eq!(
        written.as_deref(),
        Some("2026-12-02 02:00:00"),
        "the message's date"
    );
    assert_ne!(
        created, "2026-12-02 02:00:00",
        "stored later than it was written"
    );
    let local = "2026-12-01 18:00";
    let history = command(&app, 3, 4, "/history").await;
    assert!(history.contains(local), "{history}");
    app.telegram.push_update(text_update(3, 5, "/export"));
    let bytes = app.telegram.wait_file("SendDocument").await;
    let mut reader = csv::Reader::from_reader(bytes.as_slice());
    let headers = reader.headers().expect("headers").clone();
    let row = reader.records().next().expect("a row").expect("row");
    let column = |name: &str| {
        let i = headers.iter().position(|h| h == name).expect(name);
        row[i].to_owned()
    };
    assert_eq!(column("local_day"), "2026-12-01");
    assert_eq!(column("local_time"), local);
    app.stop().await;
}

/// After a move (`/tz` to another zone) an entry's hour stays the one the user saw on
/// their clock then, named with its zone; an entry written after the move shows the new
/// clock. /history and the export agree.
#[tokio::test]
async fn after_a_move_past_entries_keep_the_hour_they_were_written_at() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    command(&app, 4, 1, "/tz Europe/Moscow").await;
    // 21:30 in Moscow.
    app.telegram.push_update(text_update_at(
        4,
        2,
        "Dinner with friends.",
        at("2026-12-02T18:30:00Z").as_second(),
    ));
    app.telegram.wait_sent(4, 2).await;
    command(&app, 4, 3, "/tz America/New_York").await;
    // 09:15 in New York.
    app.telegram.push_update(text_update_at(
        4,
        4,
        "Jet lag, but a good walk.",
        at("2026-12-03T14:15:00Z").as_second(),
    ));
    app.telegram.wait_sent(4, 4).await;

    let history = command(&app, 4, 5, "/history").await;

    assert!(
        history.contains("2026-12-02 21:30 (Europe/Moscow)"),
        "the Moscow hour, not 13:30 in New York: {history}"
    );
    assert!(history.contains("2026-12-03 09:15"), "{history}");
    assert!(!history.contains("(America/New_York)"), "{history}");
    app.telegram.push_update(text_update(4, 6, "/export"));
    let bytes = app.telegram.wait_file("SendDocument").await;
    let mut reader = csv::Reader::from_reader(bytes.as_slice());
    let headers = reader.headers().expect("headers").clone();
    let rows: Vec<csv::StringRecord> = reader.records().map(|r| r.expect("row")).collect();
    let column = |row: &csv::StringRecord, name: &str| {
        let i = headers.iter().position(|h| h == name).expect(name);
        row[i].to_owned()
    };
    assert_eq!(column(&rows[0], "local_time"), "2026-12-02 21:30");
    assert_eq!(column(&rows[0], "local_zone"), "Europe/Moscow");
    assert_eq!(column(&rows[1], "local_time"), "2026-12-03 09:15");
    assert_eq!(column(&rows[1], "local_zone"), "America/New_York");
    app.stop().await;
}

/// A new user writes before telling their zone (the default, UTC, is no choice of
/// theirs): once they set it, those first entries show on their own clock, not "(UTC)".
#[tokio::test]
async fn entries_written_before_the_first_tz_show_on_the_zone_then_set() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    // 21:30 in Moscow, written before /tz.
    app.telegram.push_update(text_update_at(
        5,
        1,
        "My first entry.",
        at("2026-12-02T18:30:00Z").as_second(),
    ));
    app.telegram.wait_sent(5, 1).await;
    command(&app, 5, 2, "/tz Europe/Moscow").await;

    let history = command(&app, 5, 3, "/history").await;

    assert!(history.contains("21:30"), "{history}");
    assert!(!history.contains("(UTC)"), "{history}");
    app.stop().await;
}

#[tokio::test]
async fn a_reminder_missed_by_more_than_max_late_is_skipped_not_sent_late() {
    let app = App::spawn().await;
    // Before the reminder is due (see `user_with_reminder`).
    app.clock.set(at("2026-12-01T17:00:00Z"));
    user_with_reminder(
        &app,
        4,
        "Europe/Moscow",
        "21:00",
        at("2026-12-01T18:00:00Z"),
    )
    .await;
    // The bot "comes back" 91 minutes after 21:00 Moscow time.
    app.clock.set(at("2026-12-01T19:31:00Z"));
    wait_until("the reminder moved to tomorrow", WAIT, || async {
        reminder_row(&app, 4).await.2.as_deref() == Some("2026-12-02 18:00:00")
    })
    .await;
    // Moved on and recorded in one statement: a reminder to send would carry its day.
    assert_eq!(reminder_row(&app, 4).await.1, None, "not recorded as sent");
    assert_eq!(reminders_to(&app, 4), 0);
    app.stop().await;
}

/// A stop while a reminder is on its way (here waiting out Telegram's `retry_after`,
/// 2 s, of which the test's wait takes a poll of 50 ms) lets it arrive: it is recorded
/// as sent for the day before it goes, so a send cut short by the stop would lose it
/// until tomorrow.
#[tokio::test]
async fn a_stop_while_a_reminder_is_on_its_way_lets_it_arrive() {
    let app = App::spawn().await;
    // Before the reminder is due (see `user_with_reminder`).
    app.clock.set(at("2026-12-01T20:00:00Z"));
    user_with_reminder(&app, 6, "UTC", "21:00", at("2026-12-01T21:00:00Z")).await;
    let slow_down = serde_json::json!({
        "ok": false, "error_code": 429, "description": "Too Many Requests: retry after 2",
        "parameters": {"retry_after": 2}
    });
    app.telegram
        .fail_next("SendMessage", Some(6), 429, slow_down);
    app.clock.set(at("2026-12-01T21:00:03Z"));
    wait_until(
        "the reminder is recorded and waits to be sent",
        WAIT,
        || async { app.telegram.failures_left() == 0 && reminder_row(&app, 6).await.1.is_some() },
    )
    .await;

    let telegram = app.telegram.clone();
    app.stop().await;

    let reminders = telegram
        .sent_to(6)
        .iter()
        .filter(|c| is_reminder(c))
        .count();
    assert_eq!(reminders, 1);
}

#[tokio::test]
async fn a_user_who_blocked_the_bot_has_reminders_turned_off() {
    let app = App::spawn().await;
    // Before the reminder is due (see `user_with_reminder`).
    app.clock.set(at("2026-12-01T20:00:00Z"));
    user_with_reminder(&app, 5, "UTC", "21:00", at("2026-12-01T21:00:00Z")).await;
    app.telegram.block_chat(5);
    app.clock.set(at("2026-12-01T21:00:03Z"));
    wait_until("reminders off", WAIT, || async {
        reminder_row(&app, 5).await.0 == 0
    })
    .await;
    assert_eq!(reminder_row(&app, 5).await.2, None);
    app.stop().await;
}

/// A reminder Telegram refuses (a Bad Request: about that message, not the chat) is
/// lost for the day, but the user's reminders stay on: tomorrow's is sent.
#[tokio::test]
async fn a_refused_reminder_keeps_reminders_on_and_tomorrows_comes() {
    // Arrange
    let app = App::spawn().await;
    // Before the reminder is due (see `user_with_reminder`).
    app.clock.set(at("2026-12-01T20:00:00Z"));
    user_with_reminder(&app, 7, "UTC", "21:00", at("2026-12-01T21:00:00Z")).await;
    let refused = serde_json::json!({
        "ok": false, "error_code": 400,
        "description": "Bad Request: message is too long"
    });
    app.telegram.fail_next("SendMessage", Some(7), 400, refused);

    // Act: today's is refused.
    sent_at_nine_and_moved_to_tomorrow(&app, &[7], 61).await;

    // Assert
    assert_eq!(app.telegram.failures_left(), 0, "the refusal was met");
    assert_eq!(reminders_to(&app, 7), 0);
    assert_eq!(reminder_row(&app, 7).await.0, 1, "reminders stay on");

    // Act: tomorrow.
    app.clock.set(at("2026-12-02T21:00:03Z"));

    // Assert
    app.telegram
        .wait_for("tomorrow's reminder", WAIT, |calls| {
            calls
                .iter()
                .any(|c| is_reminder(c) && c.chat_id() == Some(7))
        })
        .await;
    assert_eq!(reminder_row(&app, 7).await.1.as_deref(), Some("2026-12-02"));
    app.stop().await;
}

#[tokio::test]
async fn two_hundred_reminders_due_at_once_are_all_sent_under_the_throttle() {
    let app = App::spawn_with(|env| {
        env.insert("DAYLOG__TELEGRAM__THROTTLE".into(), "true".into());
    })
    .await;
    const USERS: i64 = 200;
    // Before the reminder is due (see `user_with_reminder`).
    app.clock.set(at("2026-12-01T20:00:00Z"));
    for user in 100..100 + USERS {
        user_with_reminder(&app, user, "UTC", "21:00", at("2026-12-01T21:00:00Z")).await;
    }
    app.clock.set(at("2026-12-01T21:00:01Z"));
    app.telegram
        .wait_for("every reminder", Duration::from_secs(60), |calls| {
            calls.iter().filter(|c| is_reminder(c)).count() >= USERS as usize
        })
        .await;
    for user in 100..100 + USERS {
        assert_eq!(reminders_to(&app, user), 1, "user {user}");
    }
    app.stop().await;
}

#[tokio::test]
async fn tz_takes_names_cities_offsets_and_locations_and_refuses_the_rest() {
    let app = App::spawn().await;
    let shown = command(&app, 6, 1, "/tz").await;
    assert!(shown.contains("UTC") && shown.contains("/tz"), "{shown}");

    let moscow = command(&app, 6, 2, "/tz moscow").await;
    assert!(moscow.contains("Europe/Moscow"), "{moscow}");
    // A reminder follows the zone's wall clock: 21:00 in Moscow is 18:00 UTC.
    app.clock.set(at("2026-12-01T12:00:00Z"));
    command(&app, 6, 20, "/remind 21:00").await;
    assert_eq!(
        reminder_row(&app, 6).await.2.as_deref(),
        Some("2026-12-01 18:00:00")
    );
    let offset = command(&app, 6, 3, "/tz UTC+5:30").await;
    assert!(offset.contains("UTC+05:30"), "{offset}");

    let bad = command(&app, 6, 4, "/tz Atlantis").await;
    assert!(
        bad.contains("/tz Europe/Moscow") && bad.contains("-5"),
        "examples: {bad}"
    );
    let zone: String = sqlx::query_scalar("SELECT timezone FROM users WHERE user_id = 6")
        .fetch_one(app.store.read_pool().expect("a SQLite store"))
        .await
        .expect("zone");
    assert_eq!(zone, "UTC+05:30", "a bad /tz changes nothing");

    // A shared location in Los Angeles.
    let before = app.telegram.sent_to(6).len();
    app.telegram
        .push_update(location_update(6, 5, 34.05, -118.24));
    let sent = app.telegram.wait_sent(6, before + 1).await;
    assert!(
        sent[before].text().contains("America/Los_Angeles"),
        "{}",
        sent[before].text()
    );
    let zone: String = sqlx::query_scalar("SELECT timezone FROM users WHERE user_id = 6")
        .fetch_one(app.store.read_pool().expect("a SQLite store"))
        .await
        .expect("zone");
    assert_eq!(zone, "America/Los_Angeles");
    assert_eq!(
        reminder_row(&app, 6).await.2.as_deref(),
        Some("2026-12-02 05:00:00"),
        "21:00 in Los Angeles now"
    );
    app.stop().await;
}

#[tokio::test]
async fn start_invites_a_new_user_to_set_a_zone_and_the_default_zone_is_configurable() {
    let app = App::spawn_with(|env| {
        env.insert(
            "DAYLOG__JOURNAL__DEFAULT_TIMEZONE".into(),
            "Europe/Berlin".into(),
        );
    })
    .await;
    let start = command(&app, 7, 1, "/start").await;
    assert!(
        start.contains("Europe/Berlin") && start.contains("/tz"),
        "{start}"
    );
    let zone: String = sqlx::query_scalar("SELECT timezone FROM users WHERE user_id = 7")
        .fetch_one(app.store.read_pool().expect("a SQLite store"))
        .await
        .expect("zone");
    assert_eq!(zone, "Europe/Berlin");
    command(&app, 7, 2, "/tz Asia/Tokyo").await;
    let again = command(&app, 7, 3, "/start").await;
    assert!(
        !again.contains("/tz Europe/Berlin"),
        "no invitation once set: {again}"
    );
    app.stop().await;
}

#[tokio::test]
async fn streaks_count_local_days_and_the_analysis_reply_notes_them() {
    let app = App::spawn().await;
    app.providers.healthy().await;
    app.clock.set(at("2026-12-03T12:00:00Z"));
    // 1 and 2 December (UTC), then 3 December at 01:00, which is still the 2nd.
    for (id, when) in [
        (1, "2026-12-01T20:00:00Z"),
        (2, "2026-12-02T20:00:00Z"),
        (3, "2026-12-03T01:00:00Z"),
    ] {
        app.telegram
            .push_update(text_update_at(8, id, "A day.", at(when).as_second()));
        app.telegram.wait_sent(8, id as usize).await;
    }
    let sent = app.telegram.sent_to(8);
    assert!(
        !sent[0].text().contains("in a row"),
        "one day is no streak: {}",
        sent[0].text()
    );
    assert!(
        sent[1].text().contains("2 days in a row"),
        "{}",
        sent[1].text()
    );
    assert!(
        sent[2].text().contains("2 days in a row"),
        "same local day: {}",
        sent[2].text()
    );
    let streak = command(&app, 8, 4, "/streak").await;
    assert!(
        streak.contains("Current streak: 2 days") && streak.contains("longest: 2 days"),
        "{streak}"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_reminder_in_the_spring_dst_gap_comes_once_at_the_first_valid_minute() {
    let app = App::spawn().await;
    // 01:00 PST on 8 March 2026; 02:00–03:00 does not exist that night.
    app.clock.set(at("2026-03-08T09:00:00Z"));
    command(&app, 9, 1, "/tz America/Los_Angeles").await;
    command(&app, 9, 2, "/remind 02:30").await;
    assert_eq!(
        reminder_row(&app, 9).await.2.as_deref(),
        Some("2026-03-08 10:00:00"),
        "03:00 PDT, the first valid minute after 02:30"
    );
    app.clock.set(at("2026-03-08T10:00:05Z"));
    app.telegram
        .wait_for("the reminder", WAIT, |calls| calls.iter().any(is_reminder))
        .await;
    app.clock.set(at("2026-03-08T10:30:00Z"));
    let (_, day, next) = reminder_row(&app, 9).await;
    // 03:00 local is before the day starts (04:00): it reminds about 7 March.
    assert_eq!(day.as_deref(), Some("2026-03-07"));
    assert_eq!(
        next.as_deref(),
        Some("2026-03-09 09:30:00"),
        "02:30 PDT next night"
    );
    assert_eq!(reminders_to(&app, 9), 1);
    app.stop().await;
}

#[tokio::test]
async fn stats_names_what_goes_with_good_days() {
    let app = App::spawn().await;
    app.clock.set(at("2026-12-07T12:00:00Z"));
    app.store
        .upsert_user(&NewUser {
            user_id: UserId(11),
            username: None,
            language: Language::En,
        })
        .await
        .expect("user");
    // Runs on three days at mood 5, three days without at mood 3.
    for day in 1..=6i64 {
        let id = app
            .store
            .insert_log(&daylog::store::NewLog {
                user_id: UserId(11),
                chat_id: ChatId(11),
                message_id: MessageId(day),
                text: "a day",
                local_day: Some(format!("2026-12-0{day}").parse().expect("day")),
                written_at: None,
            })
            .await
            .expect("insert")
            .id();
        let metrics = if day <= 3 {
            r#"{"mood":5,"activities":["run","work"],"defaulted":[]}"#
        } else {
            r#"{"mood":3,"activities":["work"],"defaulted":[]}"#
        };
        assert!(
            app.store
                .record(id, "a day", &support::analysed("ok", metrics))
                .await
                .expect("mark")
        );
        app.store.mark_replied(id).await.expect("replied"); // not the worker's to answer
    }
    let rows = app
        .store
        .day_activities(UserId(11), "2026-11-01".parse().expect("day"))
        .await
        .expect("activities");
    assert_eq!(rows.len(), 9, "{rows:?}");
    // Found by its title: the worker may answer one of the logs above meanwhile.
    app.telegram.push_update(text_update(11, 100, "/stats"));
    let calls = app
        .telegram
        .wait_for("the statistics", WAIT, |calls| {
            calls.iter().any(|c| c.text().contains("Your statistics"))
        })
        .await;
    let stats = calls
        .iter()
        .find(|c| c.text().contains("Your statistics"))
        .expect("stats")
        .text()
        .to_owned();
    assert!(
        stats.contains("run: mood 5.0 on those days, 3.0 without"),
        "{stats}"
    );
    assert!(
        !stats.contains("work:"),
        "on every day: nothing to compare: {stats}"
    );
    assert!(
        stats.contains("Current streak: 6 days; longest: 6 days"),
        "{stats}"
    );
    app.stop().await;
}

/// Sets a reminder's `next_due_at` to `text` as a hand edit would, past the store.
async fn edit_next_due_at(app: &App, user: i64, text: &str) {
    sqlx::query("UPDATE reminders SET next_due_at = ?2 WHERE user_id = ?1")
        .bind(user)
        .bind(text)
        .execute(
            &sqlx::SqlitePool::connect(&app.env["DATABASE_URL"])
                .await
                .expect("raw"),
        )
        .await
        .expect("hand edit");
}

/// Makes the sentinel `user` due at `due` and waits for its reminder: a tick that
/// sends it has looked at every other reminder as well.
async fn a_later_tick_has_run(app: &App, user: i64, due: Timestamp) {
    let before = reminders_to(app, user);
    user_with_reminder(app, user, "UTC", "21:00", due).await;
    app.clock.set(due);
    app.telegram
        .wait_for("the sentinel's reminder", WAIT, |calls| {
            calls
                .iter()
                .filter(|c| is_reminder(c) && c.chat_id() == Some(user))
                .count()
                > before
        })
        .await;
}

/// At 21:00:03 UTC the reminder of each of `users` is sent and moved on to tomorrow's
/// 21:00; then a later tick (`tick_user`'s message, at 21:00:10) has run.
async fn sent_at_nine_and_moved_to_tomorrow(app: &App, users: &[i64], tick_user: i64) {
    app.clock.set(at("2026-12-01T21:00:03Z"));
    for &user in users {
        wait_until("the reminder moved to tomorrow", WAIT, || async {
            reminder_row(app, user).await.2.as_deref() == Some("2026-12-02 21:00:00")
        })
        .await;
    }
    a_later_tick_has_run(app, tick_user, at("2026-12-01T21:00:10Z")).await;
}

/// The scheduler's compare-and-set is keyed on the text it read, not on a formatting of
/// the moment: a due time stored in another spelling of its moment (fractional seconds,
/// as a hand edit may leave it) is sent once and moved on like any other.
#[tokio::test]
async fn a_due_time_in_another_spelling_of_its_moment_is_sent_once_and_moved_on() {
    // Arrange: 21:00 UTC, stored with fractional seconds.
    let app = App::spawn().await;
    // Before the reminder is due (see `user_with_reminder`).
    app.clock.set(at("2026-12-01T20:00:00Z"));
    user_with_reminder(&app, 6, "UTC", "21:00", at("2026-12-01T21:00:00Z")).await;
    edit_next_due_at(&app, 6, "2026-12-01 21:00:00.250").await;

    // Act
    sent_at_nine_and_moved_to_tomorrow(&app, &[6], 60).await;

    // Assert
    assert_eq!(reminder_row(&app, 6).await.1.as_deref(), Some("2026-12-01"));
    assert_eq!(reminders_to(&app, 6), 1);
    app.stop().await;
}

/// A due time that is no moment at all (a hand edit) does not wedge the reminder: it is
/// due now, sent once, and the schedule goes on in the canonical format.
#[tokio::test]
async fn a_due_time_that_is_no_moment_is_due_now_sent_once_and_moved_on() {
    // Arrange: noon UTC; the reminder at 21:00 was edited into nonsense.
    let app = App::spawn().await;
    app.clock.set(at("2026-12-01T12:00:00Z"));
    user_with_reminder(&app, 7, "UTC", "21:00", at("2026-12-01T21:00:00Z")).await;
    edit_next_due_at(&app, 7, "soon").await;

    // Act: the next tick, then 21:00 the same day.
    app.telegram
        .wait_for("the reminder found due", WAIT, |calls| {
            calls
                .iter()
                .any(|c| is_reminder(c) && c.chat_id() == Some(7))
        })
        .await;
    assert_eq!(
        reminder_row(&app, 7).await.2.as_deref(),
        Some("2026-12-01 21:00:00"),
        "moved on to its next time"
    );
    sent_at_nine_and_moved_to_tomorrow(&app, &[7], 70).await;

    // Assert: that local day had its one reminder.
    assert_eq!(reminder_row(&app, 7).await.1.as_deref(), Some("2026-12-01"));
    assert_eq!(reminders_to(&app, 7), 1);
    app.stop().await;
}

/// A due time whose text sorts before its moment (a hand edit with a UTC offset west of
/// Greenwich) is not sent early: the scheduler moves it to its moment, written as the
/// store writes moments, and sends it then, once.
#[tokio::test]
async fn a_due_time_spelt_with_an_offset_is_sent_at_its_moment_not_when_its_text_sorts() {
    // Arrange: 18:00 at UTC−03:00 is 21:00 UTC; the clock shows 19:00 UTC.
    let app = App::spawn().await;
    app.clock.set(at("2026-12-01T19:00:00Z"));
    user_with_reminder(&app, 8, "UTC", "21:00", at("2026-12-01T21:00:00Z")).await;
    edit_next_due_at(&app, 8, "2026-12-01 18:00:00-03:00").await;

    // Act
    wait_until("the due time written at its moment", WAIT, || async {
        reminder_row(&app, 8).await.2.as_deref() == Some("2026-12-01 21:00:00")
    })
    .await;
    assert_eq!(reminders_to(&app, 8), 0, "not two hours early");
    sent_at_nine_and_moved_to_tomorrow(&app, &[8], 80).await;

    // Assert
    assert_eq!(reminders_to(&app, 8), 1);
    app.stop().await;
}

/// A due time spelt with a `T` (ISO 8601's own form, as `toISOString` writes it: a hand
/// edit that `parse_sql_timestamp` reads as its moment) sorts after every moment of its
/// day as text: it is still sent at its moment, once, not skipped as too late when its
/// text finally sorts after midnight.
#[tokio::test]
async fn a_due_time_spelt_with_a_t_is_sent_at_its_moment_not_after_midnight() {
    // Arrange: both 21:00 UTC; the clock just after it.
    let app = App::spawn().await;
    app.clock.set(at("2026-12-01T20:00:00Z"));
    user_with_reminder(&app, 9, "UTC", "21:00", at("2026-12-01T21:00:00Z")).await;
    user_with_reminder(&app, 10, "UTC", "21:00", at("2026-12-01T21:00:00Z")).await;
    edit_next_due_at(&app, 9, "2026-12-01T21:00:00").await;
    edit_next_due_at(&app, 10, "2026-12-01T21:00:00.000Z").await;

    // Act
    sent_at_nine_and_moved_to_tomorrow(&app, &[9, 10], 90).await;

    // Assert
    for user in [9, 10] {
        assert_eq!(
            reminder_row(&app, user).await.1.as_deref(),
            Some("2026-12-01"),
            "user {user}"
        );
        assert_eq!(reminders_to(&app, user), 1, "user {user}");
    }
    app.stop().await;
}

/// A due time that is no moment but starts with digits that sort after every moment of
/// these years (`21:30`, the reminder's time written into the wrong column by hand) is
/// as wedging as one that starts with a letter: it too is due now, sent once, and moved
/// on in the canonical format, instead of never being read again.
#[tokio::test]
async fn a_due_time_of_digits_that_is_no_moment_is_due_now_not_never() {
    // Arrange: noon UTC; the reminder at 21:00 was edited into its own local time.
    let app = App::spawn().await;
    app.clock.set(at("2026-12-01T12:00:00Z"));
    user_with_reminder(&app, 11, "UTC", "21:00", at("2026-12-01T21:00:00Z")).await;
    edit_next_due_at(&app, 11, "21:30").await;

    // Act
    app.telegram
        .wait_for("the reminder found due", WAIT, |calls| {
            calls
                .iter()
                .any(|c| is_reminder(c) && c.chat_id() == Some(11))
        })
        .await;

    // Assert
    wait_until("the reminder moved on to its next time", WAIT, || async {
        reminder_row(&app, 11).await.2.as_deref() == Some("2026-12-01 21:00:00")
    })
    .await;
    a_later_tick_has_run(&app, 110, at("2026-12-01T12:00:10Z")).await;
    assert_eq!(reminders_to(&app, 11), 1);
    app.stop().await;
}

/// A bot down for a day and a quarter, back 15 minutes after today's moment: yesterday's
/// reminder is skipped, today's is sent (the scheduler skips the day whose own moment is more
/// than `max_late_minutes` past, not every day of a long downtime).
#[tokio::test]
async fn back_from_a_downtime_of_a_day_todays_reminder_is_sent() {
    // Arrange: 21:30 Moscow (18:30 UTC), due 1 December.
    let app = App::spawn().await;
    app.clock.set(at("2026-12-01T17:00:00Z"));
    user_with_reminder(
        &app,
        5,
        "Europe/Moscow",
        "21:30",
        at("2026-12-01T18:30:00Z"),
    )
    .await;

    // Act: back on 2 December at 21:45 Moscow time.
    app.clock.set(at("2026-12-02T18:45:00Z"));

    // Assert: one reminder, for 2 December; next on 3 December.
    app.telegram
        .wait_for("today's reminder", WAIT, |calls| {
            calls
                .iter()
                .any(|c| is_reminder(c) && c.chat_id() == Some(5))
        })
        .await;
    let (_, sent_day, next) = reminder_row(&app, 5).await;
    assert_eq!(sent_day.as_deref(), Some("2026-12-02"));
    assert_eq!(next.as_deref(), Some("2026-12-03 18:30:00"));
    assert_eq!(reminders_to(&app, 5), 1);
    app.stop().await;
}

/// `/remind` again, or `/tz` to the same zone, in the seconds between the moment and
/// the scheduler's next look keeps today's reminder due: it is sent, not moved to
/// tomorrow.
#[tokio::test]
async fn a_remind_or_tz_just_after_the_moment_keeps_todays_reminder() {
    // Arrange: the scheduler looks only at its start (a poll far away).
    let app = App::spawn_with(|env| {
        env.insert(
            "DAYLOG__REMINDERS__POLL_INTERVAL_MS".to_owned(),
            "600000".to_owned(),
        );
    })
    .await;
    app.clock.set(at("2026-12-01T12:00:00Z"));
    command(&app, 6, 1, "/remind 21:30").await;

    // Act: 21:30:05, the user sets the same time again and then the same zone.
    app.clock.set(at("2026-12-01T21:30:05Z"));
    command(&app, 6, 2, "/remind 21:30").await;
    command(&app, 6, 3, "/tz UTC").await;

    // Assert: still due at 21:30 today, and the next look sends it.
    assert_eq!(
        reminder_row(&app, 6).await.2.as_deref(),
        Some("2026-12-01 21:30:00")
    );
    let (dir, providers) = app.stop().await;
    let app = App::spawn_on(dir, providers, |_| {}).await;
    app.clock.set(at("2026-12-01T21:30:30Z"));
    app.telegram
        .wait_for("today's reminder", WAIT, |calls| {
            calls
                .iter()
                .any(|c| is_reminder(c) && c.chat_id() == Some(6))
        })
        .await;
    assert_eq!(
        reminder_row(&app, 6).await.2.as_deref(),
        Some("2026-12-02 21:30:00")
    );
    app.stop().await;
}
