//! The weekly digest (docs/behaviour.md, Time zones and rhythm): `/week` on demand, `/digest on|off` for Sundays, the
//! Sunday schedule and the worker's delivery of digests an outage or a crash delayed.
//!
//! A digest covers 7 local days of one user, `week_start` to `week_start + 6`, and is
//! stored first (`digests`, pending), then written through the analysis steps as task
//! `digest` (the text is stored before anything is sent), then sent with the week's
//! chart, then marked sent — the order of a day log (docs/behaviour.md, The life of an entry), with the same duplicate
//! window: only a crash between sending and recording can send it twice.
//! `UNIQUE (user_id, week_start)` makes a week's digest one row, however it was asked
//! for: a `/week` on a Sunday covers that week's Monday to Sunday, so the scheduled
//! digest of that evening finds it already there and sends nothing. A written digest
//! keeps a fingerprint of the week's entries it was written from: a `/week` asked again
//! after an entry of the week was created or edited since renews the same row (pending,
//! its text cleared) and writes it again, rather than sending the earlier text.
//!
//! Within a process, whoever works on a digest holds an in-memory claim on its user and
//! week, taken *before* the row is stored, so the worker never picks up a digest that a
//! `/week` is writing or the scheduler is storing. The scheduler reads only the users
//! whose next digest is due, through an index on `users.digest_next_at`, never every
//! user, and only stores their digests: the worker writes and sends them, a few at a
//! time (its permits), and waits for them when the process stops.
//!
//! Among instances (PostgreSQL) a digest is also claimed in the database for its
//! cascade's deadline and a margin (`claim_digest`); its text is stored and it is sent
//! only while that claim is still this instance's (checked in the write's statement,
//! and right before the send, which renews it; the send is bounded inside the renewed
//! claim): a claim that ran out and was taken by another instance never sends the
//! digest a second time.

use std::sync::Arc;

use jiff::Timestamp;
use jiff::civil::{Date, Time, Weekday};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::analysis::{self, WeekContext};
use crate::charts;
use crate::config::WorkerSettings;
use crate::frontend::{Messenger, Response, SendError, Target};
use crate::journal::{self, claims::ClaimSet};
use crate::language::Language;
use crate::llm::{Llm, Task};
use crate::render::Reply;
use crate::store::{
    Digest, DigestAdvance, DigestClaim, DigestStatus, DueDigest, FrontEnd, MessageId, Store,
    StoreError, UserId,
};
use crate::texts::Texts;
use crate::time::{LocalTime, UserZone};
use crate::users::Users;

/// Due users (scheduler) or due digests (worker) read per look; more wait for the next.
const BATCH: i64 = 200;
/// Entry summaries a digest is written from, at most (a week of a busy journal).
const MAX_SUMMARIES: i64 = 60;
/// A scheduled digest needs this many entries in its week (docs/behaviour.md, Time zones and rhythm).
const MIN_SCHEDULED_ENTRIES: i64 = 2;
/// What a digest's claim holds beyond its cascade's deadline: its send (Telegram's
/// `retry_after` waited out a few times) and the marks after it.
const CLAIM_MARGIN: std::time::Duration = std::time::Duration::from_secs(300);

/// How long a digest's send may take once its claim was renewed for it (Telegram's
/// `retry_after` waited out, a shared 429 hold included): a minute inside the claim's
/// margin, so that the claim still holds when the send ends and is recorded. A send
/// still waiting then is given up as a transient failure (the worker sends the digest
/// later, under a claim of its own) rather than going out after another instance may
/// have claimed and sent it.
const SEND_WITHIN: std::time::Duration =
    CLAIM_MARGIN.saturating_sub(std::time::Duration::from_secs(60));

/// How long a digest claimed for writing and sending is left to its claimer by the
/// other instances (PostgreSQL): past it, one whose claimer died is taken over. Its
/// cascade's deadline (`retry.deadline_ms`) and a margin for its send, so that a live
/// claimer is not overtaken however long the deadline is configured.
fn claim_hold(deadline: std::time::Duration) -> std::time::Duration {
    deadline.saturating_add(CLAIM_MARGIN)
}

/// The first and last local day of the digest that ends on `last`.
pub fn week_ending(last: Date) -> (Date, Date) {
    let first = last.checked_sub(jiff::Span::new().days(6)).unwrap_or(last);
    (first, last)
}

/// The first moment strictly after `after` at `time` on the user's wall clock whose local
/// day is a Sunday (DST-correct, as reminders are): with the day starting at 04:00, a
/// 00:30 reminder's Sunday is the night into Monday, so the week's digest has all of it.
pub fn next_sunday_at(
    zone: &UserZone,
    after: Timestamp,
    time: LocalTime,
    day_starts_hour: u8,
) -> Timestamp {
    let mut at = zone.next_at(after, time);
    for _ in 0..8 {
        if zone.local_day_of(at, time, day_starts_hour).weekday() == Weekday::Sunday {
            break;
        }
        at = zone.next_at(at, time);
    }
    at
}

/// The last moment at or before `at` at `time` whose local day is a Sunday.
fn last_sunday_at_or_before(
    zone: &UserZone,
    at: Timestamp,
    time: LocalTime,
    day_starts_hour: u8,
) -> Timestamp {
    let mut moment = zone.last_at_or_before(at, time);
    for _ in 0..8 {
        if zone.local_day_of(moment, time, day_starts_hour).weekday() == Weekday::Sunday {
            break;
        }
        let Ok(before) = moment.checked_sub(jiff::SignedDuration::from_secs(1)) else {
            break;
        };
        moment = zone.last_at_or_before(before, time);
    }
    moment
}

/// The weekly digests of every user: what `/week`, the Sunday scheduler and the worker
/// go through. It holds what a digest uses — the store, the users (languages, zones,
/// local days and the clock), the [`Llm`] that writes it, the worker's retry and age
/// settings — and the in-memory claims on the digests being worked on.
pub struct Digests {
    store: Store,
    users: Users,
    llm: Arc<Llm>,
    worker: WorkerSettings,
    claims: Claims,
    /// [`SEND_WITHIN`], shorter in tests.
    send_within: std::time::Duration,
}

/// The digests being worked on in this process, by user and week.
type Claims = ClaimSet<(UserId, Date)>;

/// An in-memory claim on a user's digest of one week, released on drop.
type Claim = journal::claims::Claim<(UserId, Date)>;

/// Whether the digest is asked for by the user now (who always gets an answer) or
/// comes on its own (the schedule, the worker: it speaks only with the digest itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Asked {
    OnDemand,
    Background,
}

/// When the user's Sunday digest comes: the reminder time, 19:00 without one.
async fn digest_time(store: &Store, user_id: UserId) -> Result<LocalTime, StoreError> {
    Ok(store
        .reminder(user_id)
        .await?
        .filter(|r| r.enabled)
        .and_then(|r| r.local_time)
        .unwrap_or(LocalTime::EVENING))
}

/// `/digest`, `/digest on`, `/digest off`.
pub async fn command(
    store: &Store,
    users: &Users,
    user_id: UserId,
    arg: &str,
) -> Result<Reply, StoreError> {
    let texts = Texts(users.language_of(user_id).await);
    let zone = users.zone_of(user_id).await;
    let time = digest_time(store, user_id).await?;
    let night = time.is_before_day_start(users.day_starts_hour());
    let on = match arg.trim().to_lowercase().as_str() {
        "" => {
            let enabled = store.digest_enabled(user_id).await?;
            return Ok(Reply::new().text(if enabled {
                texts.digest_on(&time.to_string(), zone.name(), night)
            } else {
                texts.digest_off().to_owned()
            }));
        }
        "on" | "вкл" | "да" => true,
        "off" | "stop" | "выкл" | "нет" => false,
        _ => return Ok(Reply::new().text(texts.digest_usage())),
    };
    if on {
        if store.digest_enabled(user_id).await? {
            // Already on: the schedule follows the settings, but a digest that is due
            // this very moment is kept for the scheduler rather than skipped.
            reschedule(store, users, user_id).await?;
        } else {
            let next = next_sunday_at(&zone, users.now(), time, users.day_starts_hour());
            store.set_digest(user_id, Some(next)).await?;
        }
        tracing::info!(user_id = user_id.get(), "weekly digest turned on");
        Ok(Reply::new().text(texts.digest_on(&time.to_string(), zone.name(), night)))
    } else {
        store.set_digest(user_id, None).await?;
        tracing::info!(user_id = user_id.get(), "weekly digest turned off");
        Ok(Reply::new().text(texts.digest_off()))
    }
}

/// The user's zone or reminder time changed: a Sunday digest that is on follows it
/// (one already due is sent first, by the scheduler, which then follows the change).
pub async fn reschedule(store: &Store, users: &Users, user_id: UserId) -> Result<(), StoreError> {
    if !store.digest_enabled(user_id).await? {
        return Ok(());
    }
    let zone = users.zone_of(user_id).await;
    let time = digest_time(store, user_id).await?;
    let now = users.now();
    let starts = users.day_starts_hour();
    let next = next_sunday_at(&zone, now, time, starts);
    // A moment still to come before the local day of the new one is this week's Sunday
    // (a new time earlier than now on a Sunday evening, `/remind off` after 19:00): it
    // is kept, or this week would have no digest at all.
    let sunday = zone.local_day_of(next, time, starts);
    let sunday_begins = Time::new(i8::try_from(starts).unwrap_or(4), 0, 0, 0)
        .ok()
        .and_then(|start| zone.to_timestamp(sunday.to_datetime(start)))
        .unwrap_or(next);
    store
        .reschedule_digest(user_id, next, now, sunday_begins)
        .await
}

impl Digests {
    pub fn new(store: Store, users: Users, llm: Arc<Llm>, worker: WorkerSettings) -> Self {
        Self {
            store,
            users,
            llm,
            worker,
            claims: Claims::default(),
            send_within: SEND_WITHIN,
        }
    }

    /// The same, with a digest's send given up after `within` rather than
    /// [`SEND_WITHIN`] (tests of a send that never ends).
    #[must_use]
    pub fn send_within(self, within: std::time::Duration) -> Self {
        Self {
            send_within: within.min(SEND_WITHIN),
            ..self
        }
    }

    /// The digests over `journal`'s store, users (and so its clock) and LLM layer.
    pub fn of(journal: &crate::journal::Journal) -> Arc<Self> {
        Arc::new(Self::new(
            journal.store().clone(),
            journal.users().clone(),
            Arc::clone(journal.llm()),
            journal.settings().worker.clone(),
        ))
    }

    /// Claims the user's digest of the week from `week_start`; `None` when someone in
    /// this process is already on it.
    fn claim(&self, user_id: UserId, week_start: Date) -> Option<Claim> {
        self.claims.claim((user_id, week_start))
    }

    /// `/week`: the digest of the last 7 local days, sent through `messenger` to `target`
    /// (its message, if any, is the one that asked). With no entry in those days the user
    /// is told so and nothing is stored. A store failure is returned for the front end to
    /// report.
    pub async fn week<M: Messenger>(
        &self,
        messenger: &M,
        user_id: UserId,
        target: Target,
        front_end: FrontEnd,
    ) -> Result<(), StoreError> {
        let asked_by = target.reply_to;
        let language = self.users.language_of(user_id).await;
        let texts = Texts(language);
        let (_, today) = self.users.today_of(user_id).await;
        let (first, last) = week_ending(today);
        if self.store.entries_between(user_id, first, last).await? == 0 {
            send_notice(messenger, target, texts.week_empty(), user_id).await;
            return Ok(());
        }
        let Some(claim) = self.claim(user_id, first) else {
            // The scheduler or the worker is writing this very digest; it comes from there.
            let stored = self.store.digest_of_week(user_id, first).await?;
            if !stored.is_some_and(|d| same_ask(&d, asked_by)) {
                send_notice(messenger, target, texts.digest_on_its_way(), user_id).await;
            }
            return Ok(());
        };
        let (digest, inserted) = self
            .store
            .insert_digest(user_id, target.chat_id, first, front_end, asked_by)
            .await?;
        let digest = if inserted || same_ask(&digest, asked_by) {
            digest
        } else {
            renewed_if_stale(&self.store, digest, target, front_end).await?
        };
        match digest.status {
            // Not written yet and waiting for the worker's next try after failed ones: the
            // providers were down a moment ago, so asking again now would only bypass the
            // worker's growing delay (a `/week` pressed again and again in an outage).
            DigestStatus::Pending
                if digest.text.is_none()
                    && digest.attempts > 0
                    && self.store.due_digest(digest.id).await?.is_none() =>
            {
                send_notice(messenger, target, texts.digest_will_follow(), user_id).await;
            }
            // Several instances: another one's worker may be writing it (its claim
            // moved the next attempt ahead); then it comes from there.
            DigestStatus::Pending if self.store.is_postgres() => {
                match self
                    .store
                    .claim_digest(digest.id, claim_hold(self.llm.deadline()))
                    .await?
                {
                    Some((digest, claim)) => {
                        self.run(messenger, digest, claim, target, Asked::OnDemand)
                            .await?;
                    }
                    None => {
                        send_notice(messenger, target, texts.digest_on_its_way(), user_id).await;
                    }
                }
            }
            DigestStatus::Pending => {
                // No claim in the database: only where no other instance can share it
                // (SQLite: the in-memory claim above is the whole claim).
                debug_assert!(
                    !self.store.is_postgres(),
                    "a digest run unclaimed on PostgreSQL"
                );
                let claim = DigestClaim::default();
                self.run(messenger, digest, claim, target, Asked::OnDemand)
                    .await?;
            }
            // The same `/week` re-delivered after a crash: it has had its answer.
            _ if same_ask(&digest, asked_by) => {}
            // Asked again for a week already sent, with the same entries: the same digest
            // again, nothing new written and nothing recorded (the user asked; no schedule
            // is involved). A digest written but failed (a 403 while the user had blocked
            // the bot) is sent the same way: the user is back, and the AI did not refuse
            // anything.
            DigestStatus::Sent | DigestStatus::Failed if digest.text.is_some() => {
                let text = digest.text.clone().unwrap_or_default();
                let responses = self.responses(language, &digest, &text).await?;
                if let Err(error) = messenger.send(target, responses).await {
                    tracing::warn!(%error, user_id = user_id.get(), "digest not delivered again");
                }
            }
            _ => send_notice(messenger, target, texts.digest_refused(), user_id).await,
        }
        drop(claim);
        Ok(())
    }

    /// Writes (if not written yet), sends and records one pending digest that the caller
    /// has claimed (`claim`: the database's claim, on PostgreSQL). Its text is stored,
    /// and it is sent, only while the claim is still this instance's: one that ran out
    /// and was claimed by another instance is written and sent by that one alone.
    async fn run<M: Messenger>(
        &self,
        messenger: &M,
        digest: Digest,
        mut claim: DigestClaim,
        target: Target,
        asked: Asked,
    ) -> Result<(), StoreError> {
        let language = self.users.language_of(digest.user_id).await;
        let texts = Texts(language);
        let text = match digest.text.clone() {
            Some(text) => text,
            None => match self.write(&digest, language).await? {
                Written::Text(text, written_from) => {
                    if !self
                        .store
                        .store_claimed_digest_text(digest.id, &text, &written_from, &claim)
                        .await?
                    {
                        // Written by someone else meanwhile (another process), or claimed
                        // by another instance after this claim ran out: theirs to send.
                        tracing::info!(
                            digest_id = digest.id.get(),
                            "digest written or claimed by another instance meanwhile; it sends it"
                        );
                        return Ok(());
                    }
                    text
                }
                Written::Later => {
                    let retry_in = crate::journal::retry_delay(&self.worker, digest.attempts);
                    self.store.digest_retry(digest.id, retry_in).await?;
                    tracing::warn!(
                        digest_id = digest.id.get(),
                        user_id = digest.user_id.get(),
                        retry_in_s = retry_in.as_secs(),
                        "digest not written now; it stays pending"
                    );
                    if asked == Asked::OnDemand {
                        let user_id = digest.user_id;
                        send_notice(messenger, target, texts.digest_will_follow(), user_id).await;
                    }
                    return Ok(());
                }
                Written::Refused => {
                    self.store.mark_digest_failed(digest.id).await?;
                    tracing::info!(
                        digest_id = digest.id.get(),
                        "digest refused by the content filter"
                    );
                    if asked == Asked::OnDemand {
                        send_notice(messenger, target, texts.digest_refused(), digest.user_id)
                            .await;
                    }
                    return Ok(());
                }
            },
        };
        let responses = self.responses(language, &digest, &text).await?;
        // The claim checked (and renewed for the send) right before it: a digest whose
        // claim another instance took is sent by that one only.
        let hold = claim_hold(self.llm.deadline());
        if !self
            .store
            .keep_digest_claim(digest.id, &mut claim, hold)
            .await?
        {
            tracing::info!(
                digest_id = digest.id.get(),
                "digest claimed by another instance meanwhile; it sends it"
            );
            return Ok(());
        }
        // Bounded well inside the claim just renewed: see [`SEND_WITHIN`].
        let sent = tokio::time::timeout(self.send_within, messenger.send(target, responses))
            .await
            .unwrap_or_else(|_| {
                Err(SendError::Transient(
                    "not sent while its claim held; the worker sends it later".to_owned(),
                ))
            });
        self.record_send(&digest, sent).await
    }

    /// Records what sending a written digest came to.
    async fn record_send(
        &self,
        digest: &Digest,
        sent: Result<(), SendError>,
    ) -> Result<(), StoreError> {
        let (digest_id, user_id) = (digest.id.get(), digest.user_id.get());
        match sent {
            Ok(()) => {
                crate::observe::digest_sent();
                if let Err(error) = self.store.mark_digest_sent(digest.id).await {
                    // The same window as a log's answer: the worker may send it once more.
                    tracing::error!(%error, digest_id, "digest sent but not recorded");
                } else {
                    tracing::info!(digest_id, user_id, "weekly digest sent");
                }
            }
            // A `/week` asked in a group the bot has left since: the user's own Sunday
            // digests (in their private chat) are not about that group.
            Err(SendError::Gone(reason)) if digest.chat_id.get() != digest.user_id.get() => {
                tracing::warn!(digest_id, user_id, %reason, "digest undeliverable in the group it was asked in");
                self.store.mark_digest_failed(digest.id).await?;
            }
            Err(SendError::Gone(reason)) => {
                tracing::warn!(digest_id, user_id, %reason, "digest undeliverable; weekly digests turned off");
                // Off first: the digest marked failed is the last thing a `/week` can see
                // change, so one sent right after it finds the digest no longer being
                // written (the off switch now waits for the disk).
                self.store.set_digest(digest.user_id, None).await?;
                self.store.mark_digest_failed(digest.id).await?;
            }
            Err(SendError::Refused(reason)) => {
                // This digest cannot go out, but the user still wants the next one.
                tracing::warn!(digest_id, user_id, %reason, "digest refused by Telegram; weekly digests stay on");
                self.store.mark_digest_failed(digest.id).await?;
            }
            Err(SendError::Transient(reason)) => {
                // As a log's answer: a Telegram outage is waited out at a growing pace, not
                // knocked on every `retry_min_ms` until the digest is too old.
                let retry_in = crate::journal::retry_delay(&self.worker, digest.attempts);
                tracing::warn!(digest_id, %reason, retry_in_ms = retry_in.as_millis() as u64, "digest not delivered; the worker retries");
                self.store.digest_retry(digest.id, retry_in).await?;
            }
        }
        Ok(())
    }

    /// The week's data of the digest's user only, and the cascade's answer (task
    /// `digest`, its attempts recorded against the digest).
    async fn write(&self, digest: &Digest, language: Language) -> Result<Written, StoreError> {
        let Some((first, last)) = days_of(digest) else {
            return Ok(Written::Refused);
        };
        let (store, user_id) = (&self.store, digest.user_id);
        // Read before the week itself: an entry stored while the digest is written makes
        // it out of date, so a `/week` after it writes it again.
        let (written_from, entries) = store.week_entries_mark(user_id, first, last).await?;
        let days = week_days(store, user_id, first, last).await?;
        let summaries = store
            .summaries_between(user_id, first, last, MAX_SUMMARIES)
            .await?;
        let request = analysis::digest_request(&WeekContext {
            language,
            first_day: first,
            last_day: last,
            days,
            summaries,
            entries,
        });
        let sink = store.digest_call_sink(digest.id);
        let written = self.llm.run(Task::Digest, &request, &sink).await;
        crate::journal::keep_spent_budgets(&self.llm, store).await;
        Ok(match written {
            Ok(completion) if !completion.text.trim().is_empty() => {
                tracing::info!(digest_id = digest.id.get(), provider = %completion.provider, model = %completion.model, "digest written");
                Written::Text(completion.text.trim().to_owned(), written_from)
            }
            Ok(_) => Written::Later,
            Err(error) if error.is_blocked() => Written::Refused,
            Err(error) => {
                tracing::warn!(digest_id = digest.id.get(), %error, "digest cascade failed");
                Written::Later
            }
        })
    }

    /// The digest as sent: its text under a heading, then the week's chart as a photo.
    async fn responses(
        &self,
        language: Language,
        digest: &Digest,
        text: &str,
    ) -> Result<Vec<Response>, StoreError> {
        let texts = Texts(language);
        let (first, last) = days_of(digest).unwrap_or_else(|| {
            let today = self.users.local_day(&UserZone::utc(), self.users.now());
            week_ending(today)
        });
        let reply = Reply::new()
            .bold(texts.digest_title(&first.to_string(), &last.to_string()))
            .paragraph()
            .text(text);
        let mut responses = vec![Response::Text(reply)];
        let days = week_days(&self.store, digest.user_id, first, last).await?;
        // Every day of the week has its place: a day without an entry breaks the lines.
        let days = crate::day::calendar(&days, first, last);
        match charts::stats_chart(&days, language) {
            Ok(png) => responses.push(Response::Photo {
                png,
                caption: texts.digest_chart_caption().to_owned(),
                file_name: format!("daylog-week-{first}.png"),
            }),
            // The digest goes out without its chart rather than not at all.
            Err(error) => {
                tracing::error!(%error, digest_id = digest.id.get(), "digest chart failed")
            }
        }
        Ok(responses)
    }

    /// The worker's hook: delivers `front_end`'s pending digests that are due
    /// (docs/behaviour.md, Time zones and rhythm: "the worker delivers it when a provider
    /// answers"). Each runs in its own task, so a slow provider never holds up the
    /// worker's loop; claimed ones are left to their owner.
    ///
    /// The tasks go into `tasks`, which the worker waits for when it stops (within the
    /// shutdown grace, as its logs): a digest cut off between its send and its record would
    /// be sent again by the next start. Each holds one of the worker's `permits` while it
    /// works, so many due digests never run all at once against the providers.
    pub async fn deliver_due<M: Messenger>(
        self: &Arc<Self>,
        messenger: &Arc<M>,
        front_end: FrontEnd,
        tasks: &mut JoinSet<()>,
        permits: &Arc<Semaphore>,
    ) {
        let due = match self.store.due_digests(front_end, BATCH).await {
            Ok(due) => due,
            Err(error) => {
                tracing::error!(%error, "worker could not read pending digests");
                return;
            }
        };
        if due.is_empty() {
            return;
        }
        // Only when there is something to do, so an idle worker never writes.
        self.give_up_old(messenger.as_ref(), front_end).await;
        for listed in due {
            let Some((first, _)) = days_of(&listed) else {
                if let Err(error) = self.store.mark_digest_failed(listed.id).await {
                    tracing::error!(%error, digest_id = listed.id.get(), "could not give up a digest");
                }
                continue;
            };
            let Some(claim) = self.claim(listed.user_id, first) else {
                continue;
            };
            let digests = Arc::clone(self);
            let messenger = Arc::clone(messenger);
            let permits = Arc::clone(permits);
            tasks.spawn(async move {
                let _claim = claim;
                // A few at a time, sharing the worker's slots with its logs.
                let Ok(_permit) = permits.acquire_owned().await else {
                    return;
                };
                digests.finish_listed(messenger.as_ref(), &listed).await;
            });
        }
    }

    /// Gives up `front_end`'s digests pending longer than `worker.max_age_hours`, telling
    /// a `/week` that asked.
    async fn give_up_old<M: Messenger>(&self, messenger: &M, front_end: FrontEnd) {
        match self
            .store
            .fail_old_digests(front_end, self.worker.max_age())
            .await
        {
            Ok(given_up) if given_up.is_empty() => {}
            Ok(given_up) => {
                tracing::warn!(
                    count = given_up.len(),
                    "digests pending longer than worker.max_age_hours given up"
                );
                // Only a `/week` that asked was told the digest would follow.
                for digest in given_up {
                    let Some(message_id) = digest.message_id else {
                        continue;
                    };
                    let texts = Texts(self.users.language_of(digest.user_id).await);
                    let target = Target::reply(digest.chat_id, message_id);
                    send_notice(messenger, target, texts.digest_given_up(), digest.user_id).await;
                }
            }
            Err(error) => tracing::error!(%error, "could not give up old digests"),
        }
    }

    /// Writes and sends a digest the worker listed and claimed, read again under the
    /// claim: whoever held it before may have finished it.
    async fn finish_listed<M: Messenger>(&self, messenger: &M, listed: &Digest) {
        let digest = match self
            .store
            .claim_digest(listed.id, claim_hold(self.llm.deadline()))
            .await
        {
            Ok(Some(digest)) => digest,
            Ok(None) => return,
            Err(error) => {
                tracing::error!(%error, digest_id = listed.id.get(), "could not read a digest");
                return;
            }
        };
        let (digest, claim) = digest;
        let target = Target::chat(digest.chat_id);
        let id = digest.id;
        if let Err(error) = self
            .run(messenger, digest, claim, target, Asked::Background)
            .await
        {
            tracing::error!(%error, digest_id = id.get(), "worker could not finish a digest");
        }
    }

    /// The scheduler's hook (beside the reminders, with the same clock): every user whose
    /// Sunday digest is due gets it stored and sent when the week has at least 2 entries;
    /// the schedule moves on to the next Sunday either way. Writing and sending it is the
    /// worker's ([`Digests::deliver_due`]), so that a Sunday evening of many digests is
    /// written a few at a time.
    pub async fn schedule_tick(&self) {
        let now = self.users.now();
        let due = match self.store.due_digest_users(now, BATCH).await {
            Ok(due) => due,
            Err(error) => {
                tracing::error!(%error, "digest scheduler could not read due digests");
                return;
            }
        };
        for user in due {
            if let Err(error) = self.schedule_one(&user, now).await {
                tracing::error!(%error, user_id = user.user_id.get(), "could not schedule a weekly digest");
            }
        }
    }

    async fn schedule_one(&self, user: &DueDigest, now: Timestamp) -> Result<(), StoreError> {
        let zone = &user.timezone;
        let time = user.reminder_time.unwrap_or(LocalTime::EVENING);
        let due_at = user.digest_next_at.at();
        let starts = self.users.day_starts_hour();
        if due_at > now {
            // Its text sorted as due but it spells a later moment (a hand edit with a UTC
            // offset): it goes to that moment, written as the store writes moments. One
            // written so already is a hand edit far ahead, read at every tick: left as it is.
            if !user.digest_next_at.is_canonical() {
                self.store
                    .advance_digest(user.user_id, &user.digest_next_at, due_at, None)
                    .await?;
            }
            return Ok(());
        }
        let next = next_sunday_at(zone, now.max(due_at), time, starts);
        // After a downtime of a week or more, the Sunday owed is the last one at or before
        // now, not the one the row still names.
        let latest = last_sunday_at_or_before(zone, now, time, starts);
        let (due_at, meant) = zone.owed(due_at, latest, time);
        // The week ends on the local day of the due moment, the Sunday, judged by the time
        // that moment was scheduled for (the reminder time may have changed since).
        let day = self.users.local_day_of(zone, due_at, meant);
        if day.weekday() != Weekday::Sunday
            && zone.civil(due_at).date().weekday() == Weekday::Sunday
        {
            // Scheduled by an earlier version by the calendar: a 00:30 reminder's Sunday
            // night began on Saturday's local day. This week's moment is the next one.
            self.store
                .advance_digest(user.user_id, &user.digest_next_at, next, None)
                .await?;
            return Ok(());
        }
        // A moment kept across a move east (`/tz Asia/Tokyo` on a UTC Sunday afternoon:
        // 19:00 UTC is Monday 04:00 there, at most Monday morning anywhere) is still that
        // Sunday's digest: its week ends on the Sunday, not on the Monday. (A due time that
        // is no moment, a hand edit, is due now and ends on today, whatever day it is.)
        let day = match day.weekday() {
            Weekday::Monday => day.yesterday().unwrap_or(day),
            _ => day,
        };
        let (first, _) = week_ending(day);
        let claim = self.claim(user.user_id, first);
        let create = match &claim {
            Some(_) => self.scheduled_create(user, now, due_at, day).await?,
            // A `/week` is writing this week's digest right now: that one is it.
            None => None,
        };
        let advanced = self
            .store
            .advance_digest(user.user_id, &user.digest_next_at, next, create)
            .await?;
        if let DigestAdvance::Moved {
            created: Some(digest),
        } = advanced
        {
            // Stored as due now: the worker writes and sends it at its next look, a few at
            // a time with everything else it has in hand, and waits for it on a stop.
            tracing::debug!(
                digest_id = digest.id.get(),
                user_id = user.user_id.get(),
                "weekly digest stored for the worker"
            );
        }
        drop(claim);
        Ok(())
    }

    /// Whether the Sunday digest of the week ending on `last`, due at `due_at`, is stored:
    /// `Some((chat, week_start))` when it is, `None` when it is skipped.
    async fn scheduled_create(
        &self,
        user: &DueDigest,
        now: Timestamp,
        due_at: Timestamp,
        last: Date,
    ) -> Result<Option<(crate::store::ChatId, Date)>, StoreError> {
        let (first, last) = week_ending(last);
        let late = now.duration_since(due_at);
        // A digest is delayed by a downtime, not lost (docs/behaviour.md, Time zones and
        // rhythm): unlike a reminder it is still worth reading hours later. One the bot was
        // down for longer than a pending digest may wait (`worker.max_age_hours`, 2 days)
        // is not written days late: by then the week is old news (a decision, not a limit:
        // the worker ages a digest from when it is stored, so it would still deliver one
        // stored now).
        let max_late = jiff::SignedDuration::try_from(self.worker.max_age())
            .unwrap_or(jiff::SignedDuration::MAX);
        if late > max_late {
            tracing::info!(
                user_id = user.user_id.get(),
                "weekly digest skipped: the bot was down longer than worker.max_age_hours at its moment"
            );
            return Ok(None);
        }
        if self
            .store
            .entries_between(user.user_id, first, last)
            .await?
            < MIN_SCHEDULED_ENTRIES
        {
            tracing::debug!(
                user_id = user.user_id.get(),
                "weekly digest skipped: fewer than 2 entries"
            );
            return Ok(None);
        }
        Ok(Some((user.chat_id, first)))
    }
}

/// A digest written before and asked for again by `target`'s message: when the week's
/// entries changed since its text was written (one created or edited since; or it was
/// written before that was kept), the same row is renewed, pending and without its
/// text, so that it is written again from the entries now — never the earlier text
/// without that day's later entries. Otherwise (or when someone else changed the row
/// meanwhile) the digest as stored.
async fn renewed_if_stale(
    store: &Store,
    digest: Digest,
    target: Target,
    front_end: FrontEnd,
) -> Result<Digest, StoreError> {
    let (Some(_), Some((first, last))) = (&digest.text, days_of(&digest)) else {
        return Ok(digest);
    };
    let (now, _) = store.week_entries_mark(digest.user_id, first, last).await?;
    if digest.written_from.as_deref() == Some(now.as_str()) {
        return Ok(digest);
    }
    let renewed = store
        .renew_digest(&digest, target.chat_id, front_end, target.reply_to)
        .await?;
    if let Some(renewed) = &renewed {
        tracing::info!(
            digest_id = renewed.id.get(),
            user_id = renewed.user_id.get(),
            "the week's entries changed since its digest was written; it is written again"
        );
    }
    Ok(renewed.unwrap_or(digest))
}

/// Whether `digest` was asked for by this very message (a re-delivered update).
fn same_ask(digest: &Digest, message_id: Option<MessageId>) -> bool {
    message_id.is_some() && digest.message_id == message_id
}

async fn send_notice<M: Messenger>(messenger: &M, target: Target, text: &str, user_id: UserId) {
    if let Err(error) = messenger
        .send(target, vec![Response::Text(Reply::new().text(text))])
        .await
    {
        tracing::warn!(%error, user_id = user_id.get(), "digest notice not delivered");
    }
}

/// What writing a digest came to.
enum Written {
    /// The text, and the week's entries it was written from
    /// ([`Store::week_entries_mark`]).
    Text(String, String),
    /// No provider answered now: the worker tries again.
    Later,
    /// The content filter refused it: never retried.
    Refused,
}

/// The digest's 7 local days; `None` for a `week_start` that is not a date (written by
/// hand, which the store logged).
fn days_of(digest: &Digest) -> Option<(Date, Date)> {
    let first = digest.week_start?;
    let last = first
        .checked_add(jiff::Span::new().days(6))
        .unwrap_or(first);
    Some((first, last))
}

async fn week_days(
    store: &Store,
    user_id: UserId,
    first: Date,
    last: Date,
) -> Result<Vec<crate::store::DayMetrics>, StoreError> {
    let mut days = store.daily_metrics(user_id, first).await?;
    days.retain(|d| d.day <= last);
    Ok(days)
}

#[cfg(test)]
mod claim_tests {
    #[test]
    fn a_digest_claim_outlasts_its_deadline() {
        assert!(
            super::SEND_WITHIN < super::CLAIM_MARGIN,
            "a send ends inside its claim"
        );
        let hour = std::time::Duration::from_secs(3600);
        assert!(super::claim_hold(hour) > hour);
        assert!(super::claim_hold(std::time::Duration::ZERO) > std::time::Duration::ZERO);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(text: &str) -> Timestamp {
        text.parse().expect("timestamp")
    }

    #[test]
    fn the_next_sunday_digest_is_on_sunday_at_the_local_time_across_dst() {
        let zone = UserZone::parse("America/Los_Angeles").expect("zone");
        // Tuesday 1 December 2026, 10:00 PST → Sunday 6 December 19:00 PST.
        let at = next_sunday_at(&zone, ts("2026-12-01T18:00:00Z"), LocalTime::EVENING, 4);
        assert_eq!(at, ts("2026-12-07T03:00:00Z"));
        // Sunday 19:00 exactly → the next Sunday, never the same moment again.
        let again = next_sunday_at(&zone, at, LocalTime::EVENING, 4);
        assert_eq!(again, ts("2026-12-14T03:00:00Z"));
        // Across the March change: 19:00 PDT (UTC−7) on Sunday 8 March 2026.
        let spring = next_sunday_at(&zone, ts("2026-03-04T12:00:00Z"), LocalTime::EVENING, 4);
        assert_eq!(spring, ts("2026-03-09T02:00:00Z"));
        // A reminder at 00:30 is still Sunday's until 04:00: the digest comes in the
        // night into Monday, when Sunday's local day has been written. With the day
        // starting at midnight it is the calendar's Sunday.
        let night = LocalTime::parse("00:30").expect("time");
        let berlin = UserZone::parse("Europe/Berlin").expect("zone");
        let owl = next_sunday_at(&berlin, ts("2026-12-01T18:00:00Z"), night, 4);
        assert_eq!(owl, ts("2026-12-06T23:30:00Z"), "Monday 00:30 CET");
        let midnight = next_sunday_at(&berlin, ts("2026-12-01T18:00:00Z"), night, 0);
        assert_eq!(midnight, ts("2026-12-05T23:30:00Z"), "Sunday 00:30 CET");
    }

    #[test]
    fn a_sunday_week_starts_on_its_monday() {
        let sunday: Date = "2026-12-06".parse().expect("date");
        assert_eq!(sunday.weekday(), Weekday::Sunday);
        let (first, last) = week_ending(sunday);
        assert_eq!(first.to_string(), "2026-11-30");
        assert_eq!(first.weekday(), Weekday::Monday);
        assert_eq!(last, sunday);
    }
}
