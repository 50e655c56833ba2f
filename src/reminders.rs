//! Daily reminders (docs/behaviour.md, Time zones and rhythm): `/remind HH:MM` and the scheduler that sends them.
//!
//! Each reminder row carries the UTC moment it is next due (`next_due_at`, computed in
//! the user's zone, so 21:30 stays 21:30 across DST), and the scheduler reads only the
//! rows that are due, through an index — never every user. For each due reminder it
//! decides ([`decide`]): send, or move on without sending (the user already wrote
//! today; the bot was down and the moment is more than `reminders.max_late_minutes`
//! past; that local day already had its reminder). A reminder to send is first
//! recorded as sent for its local day and moved to its next time, in one conditional
//! update; only the tick that made that update sends. So a reminder comes at most once
//! per user and local day, across restarts; a passing delivery failure undoes the
//! record so the next tick tries again, a user who blocked the bot has reminders
//! turned off.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::digest::Digests;
use crate::frontend::{Messenger, Response, SendError, Target};
use crate::render::Reply;
use crate::store::{DueReminder, Reminder, Store, StoreError, UserId};
use crate::texts::Texts;
use crate::time::{LocalTime, UserZone};
use crate::users::Users;

/// Due reminders read per look; more wait for the next tick (soonest first).
const BATCH: i64 = 1000;
/// Reminders being sent at once. The Throttle adaptor spreads them over Telegram's
/// limits; this only bounds the tasks waiting in it.
const CONCURRENCY: usize = 64;

/// A reminder from this hour (to the day's start) is an evening one; earlier, it is
/// said as one in the day.
const EVENING_FROM_HOUR: u8 = 17;

/// What to do with one due reminder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Send it; it counts for local day `day`.
    Send { day: jiff::civil::Date },
    /// Move on to the next time without sending.
    Skip(SkipReason),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// More than `reminders.max_late_minutes` past its moment (the bot was down).
    TooLate,
    /// That local day already had its reminder.
    AlreadySent,
    /// The user already wrote something that day.
    HasEntry,
}

/// The rules for a reminder due at `due_at`, looked at `now`. `has_entry` says whether
/// the user has an entry for the local day of `due_at`.
pub fn decide(
    due_at: Timestamp,
    now: Timestamp,
    max_late: Duration,
    day: jiff::civil::Date,
    last_sent_day: Option<jiff::civil::Date>,
    has_entry: bool,
) -> Decision {
    let late = now.duration_since(due_at);
    if late > jiff::SignedDuration::try_from(max_late).unwrap_or(jiff::SignedDuration::MAX) {
        return Decision::Skip(SkipReason::TooLate);
    }
    if last_sent_day == Some(day) {
        return Decision::Skip(SkipReason::AlreadySent);
    }
    if has_entry {
        return Decision::Skip(SkipReason::HasEntry);
    }
    Decision::Send { day }
}

/// `/remind`, `/remind off`, `/remind HH:MM`.
pub async fn command(
    store: &Store,
    users: &Users,
    user_id: UserId,
    arg: &str,
) -> Result<Reply, StoreError> {
    let language = users.language_of(user_id).await;
    let texts = Texts(language);
    let arg = arg.trim();
    let zone = users.zone_of(user_id).await;
    if arg.is_empty() {
        let reminder = store.reminder(user_id).await?;
        return Ok(Reply::new().text(match reminder {
            Some(Reminder {
                enabled: true,
                local_time: Some(time),
                ..
            }) => texts.remind_show(&time.to_string(), zone.name()),
            _ => texts.remind_none().to_owned(),
        }));
    }
    if matches!(arg.to_lowercase().as_str(), "off" | "stop" | "выкл" | "нет") {
        store.disable_reminder(user_id).await?;
        tracing::info!(user_id = user_id.get(), "reminder turned off");
        return Ok(Reply::new().text(texts.remind_off()));
    }
    let Some(time) = LocalTime::parse(arg) else {
        return Ok(Reply::new().text(texts.remind_usage()));
    };
    let now = users.now();
    let next = zone.next_at(now, time);
    store.set_reminder(user_id, time, next, now).await?;
    tracing::info!(user_id = user_id.get(), "reminder set");
    Ok(Reply::new().text(texts.remind_set(&time.to_string(), zone.name())))
}

/// The user moved to `zone`: a reminder that is on follows the new wall clock.
pub async fn zone_changed(
    store: &Store,
    users: &Users,
    user_id: UserId,
    zone: &UserZone,
) -> Result<(), StoreError> {
    let Some(reminder) = store.reminder(user_id).await? else {
        return Ok(());
    };
    let Some(time) = reminder.local_time else {
        return Ok(());
    };
    if reminder.enabled {
        let next = zone.next_at(users.now(), time);
        store.reschedule_reminder(user_id, next).await?;
    }
    Ok(())
}

/// What one tick did (for logs and tests).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tick {
    pub sent: usize,
    pub skipped: usize,
    pub failed: usize,
}

/// Runs until `shutdown`: a tick at once, then every `reminders.poll_interval_ms`.
///
/// The Sunday digests ride on the same clock and poll (`digests`).
pub async fn run<M: Messenger>(
    store: Store,
    users: Users,
    settings: Arc<Settings>,
    digests: Arc<Digests>,
    messenger: Arc<M>,
    shutdown: CancellationToken,
) {
    let poll = settings.reminders.poll_interval();
    loop {
        // Not cancelled by the stop: a reminder recorded as sent and still on its way
        // would be lost for the day (the next is due tomorrow). The stop ends the tick
        // before its next reminder; those in flight finish within the shutdown grace.
        if shutdown.is_cancelled() {
            break;
        }
        match tick_until(&store, &users, &settings, &messenger, &shutdown).await {
            Ok(done) if done != Tick::default() => {
                tracing::info!(
                    sent = done.sent,
                    skipped = done.skipped,
                    failed = done.failed,
                    "reminders tick"
                );
            }
            Ok(_) => {}
            Err(error) => {
                tracing::error!(%error, "reminder scheduler could not read due reminders")
            }
        }
        // The Sunday digests ride on the same clock and poll (docs/behaviour.md, Time zones and rhythm).
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = digests.schedule_tick() => {}
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(poll) => {}
        }
    }
    tracing::info!("reminder scheduler stopped");
}

/// One look at the due reminders: each is sent or moved on, soonest first.
pub async fn tick<M: Messenger>(
    store: &Store,
    users: &Users,
    settings: &Settings,
    messenger: &Arc<M>,
) -> Result<Tick, StoreError> {
    tick_until(store, users, settings, messenger, &CancellationToken::new()).await
}

/// [`tick`], taking no further reminder once `stop` is cancelled; the ones already
/// recorded as sent are still delivered.
async fn tick_until<M: Messenger>(
    store: &Store,
    users: &Users,
    settings: &Settings,
    messenger: &Arc<M>,
    stop: &CancellationToken,
) -> Result<Tick, StoreError> {
    let now = users.now();
    let due = store.due_reminders(now, BATCH).await?;
    let mut done = Tick::default();
    let mut sending = JoinSet::new();
    let max_late = settings.reminders.max_late();
    for reminder in due {
        // A send slot first, then the stop is looked at, then the reminder is recorded
        // as sent: so no reminder is recorded and then left waiting for a slot.
        while sending.len() >= CONCURRENCY {
            if let Some(result) = sending.join_next().await {
                count(&mut done, result.unwrap_or(false));
            }
        }
        if stop.is_cancelled() {
            break;
        }
        match prepare(store, users, max_late, &reminder, now).await {
            Ok(Some(send)) => {
                let (store, users) = (store.clone(), users.clone());
                let messenger = Arc::clone(messenger);
                sending
                    .spawn(async move { deliver(&store, &users, messenger.as_ref(), send).await });
            }
            Ok(None) => done.skipped += 1,
            Err(error) => {
                done.failed += 1;
                tracing::error!(%error, user_id = reminder.user_id.get(), "could not schedule a reminder");
            }
        }
    }
    while let Some(result) = sending.join_next().await {
        count(&mut done, result.unwrap_or(false));
    }
    Ok(done)
}

fn count(done: &mut Tick, sent: bool) {
    if sent {
        done.sent += 1;
    } else {
        done.failed += 1;
    }
}

/// A reminder recorded as sent, still to be delivered.
struct ToSend {
    reminder: DueReminder,
    day: jiff::civil::Date,
    advanced_to: Timestamp,
}

/// Decides one due reminder and records the decision; `Some` when it is to be sent.
async fn prepare(
    store: &Store,
    users: &Users,
    max_late: std::time::Duration,
    reminder: &DueReminder,
    now: Timestamp,
) -> Result<Option<ToSend>, StoreError> {
    let zone = &reminder.timezone;
    let Some(time) = reminder.local_time else {
        tracing::warn!(
            user_id = reminder.user_id.get(),
            "unreadable reminder time; turning it off"
        );
        store.disable_reminder(reminder.user_id).await?;
        return Ok(None);
    };
    let due_at = reminder.next_due_at.at();
    if due_at > now {
        // Its text sorted as due but it spells a later moment (a hand edit with a UTC
        // offset): it goes to that moment, written as the store writes moments. One
        // written so already is a hand edit far ahead, read at every tick: left as it is.
        if !reminder.next_due_at.is_canonical() {
            store
                .advance_reminder(reminder.user_id, &reminder.next_due_at, None, due_at)
                .await?;
        }
        return Ok(None);
    }
    // The moment a downtime of a day or more left behind is long past, but today's may
    // not be: the reminder owed is the last one at or before now (docs/behaviour.md, Time zones and rhythm skips only
    // the day whose own moment is more than `max_late_minutes` past).
    let (due_at, meant) = zone.owed(due_at, zone.last_at_or_before(now, time), time);
    let day = users.local_day_of(zone, due_at, meant);
    let has_entry = store.has_entry_on(reminder.user_id, day).await?;
    let decision = decide(
        due_at,
        now,
        max_late,
        day,
        reminder.last_sent_day,
        has_entry,
    );
    // Never the same moment again: the next time strictly after both.
    let next = zone.next_at(now.max(due_at), time);
    let sent_day = match &decision {
        Decision::Send { day } => Some(*day),
        Decision::Skip(reason) => {
            tracing::debug!(
                user_id = reminder.user_id.get(),
                ?reason,
                "reminder skipped"
            );
            None
        }
    };
    let won = store
        .advance_reminder(reminder.user_id, &reminder.next_due_at, sent_day, next)
        .await?;
    Ok(match decision {
        Decision::Send { day } if won => Some(ToSend {
            reminder: reminder.clone(),
            day,
            advanced_to: next,
        }),
        _ => None,
    })
}

/// Sends one reminder; `true` when it reached the user.
async fn deliver<M: Messenger>(store: &Store, users: &Users, messenger: &M, send: ToSend) -> bool {
    let ToSend {
        reminder,
        day,
        advanced_to,
    } = send;
    let language = reminder.language;
    let evening = reminder.local_time.is_none_or(|time| {
        time.hour() >= EVENING_FROM_HOUR || time.is_before_day_start(users.day_starts_hour())
    });
    let text = Texts(language).reminder(variant(reminder.user_id, day), evening);
    let target = Target::chat(reminder.chat_id);
    match messenger
        .send(target, vec![Response::Text(Reply::new().text(text))])
        .await
    {
        Ok(()) => {
            crate::observe::reminder_sent();
            true
        }
        Err(SendError::Gone(reason)) => {
            tracing::warn!(user_id = reminder.user_id.get(), %reason, "reminder undeliverable; reminders turned off");
            if let Err(error) = store.disable_reminder(reminder.user_id).await {
                tracing::error!(%error, user_id = reminder.user_id.get(), "could not turn reminders off");
            }
            false
        }
        Err(SendError::Refused(reason)) => {
            // Today's reminder is lost, but not the user's: tomorrow's is sent as usual.
            tracing::warn!(user_id = reminder.user_id.get(), %reason, "reminder refused by Telegram; reminders stay on");
            false
        }
        Err(SendError::Transient(reason)) => {
            tracing::warn!(user_id = reminder.user_id.get(), %reason, "reminder not delivered; the next tick tries again");
            if let Err(error) = store
                .restore_reminder(
                    reminder.user_id,
                    &reminder.next_due_at,
                    reminder.last_sent_day,
                    advanced_to,
                )
                .await
            {
                tracing::error!(%error, user_id = reminder.user_id.get(), "could not reschedule a reminder");
            }
            false
        }
    }
}

/// Which of the reminder texts: varies from day to day, the same for a user on a day.
fn variant(user_id: UserId, day: jiff::civil::Date) -> usize {
    let days = i64::from(day.day_of_year()) + i64::from(day.year()) * 366;
    usize::try_from(user_id.get().wrapping_add(days).rem_euclid(1 << 16)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_due_reminder_becomes() {
        let due: Timestamp = "2026-12-02T05:00:00Z".parse().expect("due");
        let day: jiff::civil::Date = "2026-12-01".parse().expect("day");
        let margin = Duration::from_secs(90 * 60);
        let at = |s: &str| -> Timestamp { s.parse().expect("now") };
        let at_day = |s: &str| -> jiff::civil::Date { s.parse().expect("day") };
        let table = [
            (
                "on time",
                at("2026-12-02T05:00:10Z"),
                None,
                false,
                Decision::Send { day },
            ),
            (
                "89 min late",
                at("2026-12-02T06:29:00Z"),
                Some(at_day("2026-11-30")),
                false,
                Decision::Send { day },
            ),
            (
                "91 min late",
                at("2026-12-02T06:31:00Z"),
                None,
                false,
                Decision::Skip(SkipReason::TooLate),
            ),
            (
                "sent already",
                at("2026-12-02T05:00:10Z"),
                Some(day),
                false,
                Decision::Skip(SkipReason::AlreadySent),
            ),
            (
                "wrote today",
                at("2026-12-02T05:00:10Z"),
                None,
                true,
                Decision::Skip(SkipReason::HasEntry),
            ),
            (
                "late and wrote",
                at("2026-12-02T09:00:00Z"),
                None,
                true,
                Decision::Skip(SkipReason::TooLate),
            ),
        ];
        for (what, now, last, has_entry, want) in table {
            assert_eq!(
                decide(due, now, margin, day, last, has_entry),
                want,
                "{what}"
            );
        }
    }

    #[test]
    fn texts_vary_by_day() {
        let day = |s: &str| -> jiff::civil::Date { s.parse().expect("day") };
        let a = variant(UserId(5), day("2026-12-01"));
        let b = variant(UserId(5), day("2026-12-02"));
        assert_ne!(a % 3, b % 3);
    }
}
