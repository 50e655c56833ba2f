//! Answering: the one reply to an [`Outcome`] ([`Journal::reply`]), for the live path
//! and the worker alike, and how it goes out (a final answer recorded as sent, a notice
//! not). The live path (`analyse_and_answer`) tells the user when an analysis takes
//! longer than `budgets.notify_after_ms`.

use std::future::Future;
use std::time::Duration;

use crate::domain::Metrics;
use crate::domain::{Failure, Outcome, Wait};
use crate::frontend::{Messenger, Response, SendError, Target};
use crate::language::Language;
use crate::llm::Task;
use crate::render::Reply;
use std::sync::PoisonError;

use tokio::sync::oneshot::error::TryRecvError;

use crate::store::{ChatId, DayLog, Fence, LogId, Store, StoreError, UserId};
use crate::texts::Texts;
use crate::time::UserZone;

use super::*;

/// How the answer to an analysed log is titled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// The first answer to a new entry ("Saved.").
    Saved,
    /// The answer to an edited entry ("Updated."), not a second entry.
    Edited,
    /// The worker's answer, or one the user was told would follow.
    Late,
}

/// The notes under an analysis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Notes {
    /// The entry was longer than was analysed.
    pub truncated: bool,
    /// The current streak, noted from two days on.
    pub streak: u32,
}

/// The answer to an analysed log: the one place that lays it out.
pub fn analysis_reply(
    language: Language,
    analysis: &str,
    metrics: &Metrics,
    style: Style,
    notes: Notes,
) -> Reply {
    let texts = Texts(language);
    let title = match style {
        Style::Saved => texts.analysis_title(),
        Style::Edited => texts.edited_title(),
        Style::Late => texts.late_analysis_title(),
    };
    let mut reply = Reply::new().bold(title).paragraph().text(analysis);
    let line = metrics.compact_line(language);
    if !line.is_empty() {
        reply = reply.paragraph().italic(line);
    }
    if notes.truncated {
        reply = reply.paragraph().italic(texts.truncated_note());
    }
    if notes.streak >= 2 {
        reply = reply.paragraph().italic(texts.streak_note(notes.streak));
    }
    reply
}

/// What the path that answers a log read before its analysis, so that the reply does
/// not read it again (each read is a round trip, and on PostgreSQL a statement's work
/// on the server); `None`: read when needed.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Read<'a> {
    /// The author's days with an entry ([`crate::store::Store::before_analysis`]), for the streak note.
    entry_days: Option<&'a [jiff::civil::Date]>,
}

/// The records of answers sent, committed together when they come together (a group
/// commit): an answer that goes out while another's record is being committed waits for
/// that commit, then its record and those of every answer sent meanwhile are committed
/// by one statement — under load one commit for many answers instead of one each. Each
/// caller still returns only once its own record is committed (or failed), so an answer
/// is recorded as sent exactly as before; alone, a record is committed at once.
#[derive(Default)]
pub(super) struct RepliedRecords {
    /// The answers sent whose record waits for the next commit, each with the lease it
    /// was sent under and where to say how its record went.
    waiting: std::sync::Mutex<Vec<Waiting>>,
    /// Held by the one committing.
    commit: tokio::sync::Mutex<()>,
}

/// An answer's record waiting for the next commit.
type Waiting = (LogId, Option<Fence>, tokio::sync::oneshot::Sender<Recorded>);

/// How the record of an answer sent went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Recorded {
    /// `replied_at` is set.
    Yes,
    /// The chat's lease it was sent under was taken over before the record: nothing
    /// written (the chat's new holder answers the log, maybe once more).
    TakenOver,
    /// The statement failed.
    Failed,
}

impl RepliedRecords {
    /// Records that the answer to log `id` went out ([`Store::mark_replied_all`]) —
    /// under `fence`, the chat's lease it was sent under, if any — in one commit with
    /// those of answers sent at the same time. `Ok(false)`: the lease was taken over,
    /// nothing recorded.
    async fn record(
        &self,
        store: &Store,
        id: LogId,
        fence: Option<Fence>,
    ) -> Result<bool, StoreError> {
        let (tell, mut told) = tokio::sync::oneshot::channel();
        self.waiting().push((id, fence, tell));
        let _turn = self.commit.lock().await;
        match told.try_recv() {
            Ok(Recorded::Yes) => return Ok(true),
            Ok(Recorded::TakenOver) => return Ok(false),
            Ok(Recorded::Failed) | Err(TryRecvError::Closed) => {
                return Err(committed_with_others());
            }
            Err(TryRecvError::Empty) => {}
        }
        let batch = std::mem::take(&mut *self.waiting());
        let answers: Vec<(LogId, Option<Fence>)> =
            batch.iter().map(|(id, fence, _)| (*id, *fence)).collect();
        let result = store.mark_replied_all(&answers).await;
        for (each, _, tell) in batch {
            let _ = tell.send(match &result {
                Ok(taken) if taken.contains(&each) => Recorded::TakenOver,
                Ok(_) => Recorded::Yes,
                Err(_) => Recorded::Failed,
            });
        }
        result.map(|taken| !taken.contains(&id))
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, Vec<Waiting>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What a record committed by another caller's statement failed with: that caller logs
/// the database's error; this one says it shared it.
fn committed_with_others() -> StoreError {
    StoreError::Sql(sqlx::Error::Protocol(
        "the answers' record committed together with this one failed".to_owned(),
    ))
}

/// The first words of an entry, enough to know it by: up to 6 words and 40
/// characters, on one line, with "…" when there is more.
fn first_words(text: &str) -> String {
    const WORDS: usize = 6;
    const CHARS: usize = 40;
    let mut words = text.split_whitespace();
    let mut said = String::new();
    for word in words.by_ref().take(WORDS) {
        if !said.is_empty() {
            said.push(' ');
        }
        said.push_str(word);
    }
    let cut = crate::frontend::truncate_chars(&said, CHARS);
    if cut.len() < said.len() || words.next().is_some() {
        format!("{}…", cut.trim_end())
    } else {
        said
    }
}

/// Runs `work` while showing "typing…": Telegram shows it for 5 s, so it is renewed
/// every 4 s until the work is done.
pub(super) async fn with_typing<M: Messenger, T>(
    messenger: &M,
    chat_id: ChatId,
    work: impl Future<Output = T>,
) -> T {
    tokio::pin!(work);
    let mut renew = tokio::time::interval(Duration::from_secs(4));
    loop {
        tokio::select! {
            result = &mut work => return result,
            _ = renew.tick() => messenger.typing(chat_id).await,
        }
    }
}

impl Journal {
    /// Analyses a pending log and answers it: the answer, or (live) a notice of why it
    /// waits. Live, an analysis that takes longer than `budgets.notify_after_ms` is said
    /// to the user, and the answer still follows (here, or from the worker).
    pub(super) async fn analyse_and_answer<M: Messenger>(
        &self,
        messenger: &M,
        log: DayLog,
        author: &Author,
        known: Known,
        timing: Timing,
        under: Under<'_>,
    ) -> Result<(), StoreError> {
        let texts = Texts(author.language);
        // The worker's tries are not held to the hourly limit: one past
        // `worker.max_age_hours` is the last before the entry is given up, and a backlog
        // after an outage is no abuse.
        let limit = self.settings.telegram.analyses_per_hour();
        let count_use = timing == Timing::Live && limit > 0;
        // What the analysis and its answer read about the author, in one statement.
        let before = self.before_analysis(&log, author, count_use).await?;
        if before
            .recent_use
            .is_some_and(|used| used >= i64::from(limit))
        {
            let wait = self.store.defer_to_free_slot(&log, limit).await?;
            self.notify(
                messenger,
                &log,
                Reply::new().text(texts.saved_rate_limited(wait)),
                under,
            )
            .await;
            return Ok(());
        }
        // In a block, so that the analysis (which borrows the log) is gone before the
        // answer takes the log over.
        let (outcome, timing) = {
            let analysing = with_typing(
                messenger,
                log.chat_id,
                self.analyse(&log, author, known, &before, under),
            );
            tokio::pin!(analysing);
            // docs/behaviour.md, The life of an entry: a wait longer than `budgets.notify_after_ms` is said to the
            // user, and the answer still follows.
            tokio::select! {
                outcome = &mut analysing => (outcome?, timing),
                () = tokio::time::sleep(self.settings.budgets.notify_after()), if timing == Timing::Live => {
                    let reply = match self.llm.budget_wait(Task::Analysis) {
                        Some(back_in) => texts.saved_budget(back_in),
                        None => texts.saved_slow().to_owned(),
                    };
                    tracing::info!(log_id = log.id.get(), "the analysis takes longer than notify_after_ms; user told it follows");
                    self.notify(messenger, &log, Reply::new().text(reply), under).await;
                    (analysing.await?, Timing::Late)
                }
            }
        };
        // `None`: edited meanwhile, nothing stored; the new text is answered next. An
        // edit after the outcome was stored is caught by `mark_replied`.
        if let Some(outcome) = outcome {
            let read = Read {
                entry_days: Some(&before.entry_days),
            };
            self.answer_outcome_read(messenger, &log, &outcome, author, timing, read, under)
                .await;
        }
        Ok(())
    }

    /// The one reply to an outcome, for the live path and the worker alike: the
    /// answer to a final outcome (the analysis with its metrics line and notes, the
    /// content filter's refusal, a give-up), or — live only — the notice of why the
    /// log waits; `None` when there is nothing to say.
    pub(super) async fn reply(
        &self,
        log: &DayLog,
        outcome: &Outcome,
        author: &Author,
        timing: Timing,
        read: Read<'_>,
    ) -> Option<Reply> {
        let texts = Texts(author.language);
        let sentence = match outcome {
            Outcome::Analysed { analysis, metrics } => {
                let style = match timing {
                    Timing::Late => Style::Late,
                    Timing::Live if log.edited_at.is_some() => Style::Edited,
                    Timing::Live => Style::Saved,
                };
                let notes = Notes {
                    truncated: self.was_truncated(log),
                    streak: self
                        .streak_for_note(log.user_id, &author.zone, read.entry_days)
                        .await,
                };
                return Some(analysis_reply(
                    author.language,
                    analysis,
                    metrics,
                    style,
                    notes,
                ));
            }
            Outcome::Blocked { .. } => texts.blocked().to_owned(),
            // A voice note given up on before it had a transcript has no text to show.
            Outcome::Failed(Failure::GaveUp) if log.text.trim().is_empty() => {
                texts.voice_failed().to_owned()
            }
            Outcome::Failed(Failure::GaveUp) => texts.failed().to_owned(),
            Outcome::Failed(Failure::RecordingGone) => texts.voice_unavailable().to_owned(),
            Outcome::Failed(Failure::NoWords) => texts.voice_no_words().to_owned(),
            Outcome::Failed(Failure::RecordingRefused) => texts.voice_fetch_refused().to_owned(),
            Outcome::Waiting { .. } if timing == Timing::Late => return None,
            Outcome::Waiting { wait, retry_in, .. } => match wait {
                Wait::Provider => texts.saved_pending().to_owned(),
                Wait::NoProvider => texts.saved_no_provider(&self.first_key_env()),
                Wait::KeysRefused => texts.saved_key_refused().to_owned(),
                // Short enough that the user is not told "later" (it came back within
                // notify_after_ms); the worker answers as soon as it is back.
                Wait::Budget if *retry_in <= self.settings.budgets.notify_after() => {
                    return None;
                }
                Wait::Budget => texts.saved_budget(*retry_in),
                Wait::Transcription { refused: true } => texts.saved_voice_refused().to_owned(),
                Wait::Transcription { refused: false } => texts.saved_voice_pending().to_owned(),
                Wait::Recording => texts.saved_voice_fetch_pending().to_owned(),
                Wait::NoTranscriber => texts.saved_voice_no_provider(&self.transcription_key_env()),
                Wait::TranscriberKeysRefused => {
                    texts.saved_voice_key_refused(&self.transcription_key_env())
                }
            },
        };
        Some(Reply::new().text(sentence))
    }

    /// Sends [`Journal::reply`] to an outcome: a final one as the log's answer
    /// (recorded as sent), a wait as a notice.
    pub(super) async fn answer_outcome<M: Messenger>(
        &self,
        messenger: &M,
        log: &DayLog,
        outcome: &Outcome,
        author: &Author,
        timing: Timing,
        under: Under<'_>,
    ) {
        self.answer_outcome_read(
            messenger,
            log,
            outcome,
            author,
            timing,
            Read::default(),
            under,
        )
        .await;
    }

    /// [`Journal::answer_outcome`] with what was read before the analysis.
    #[expect(
        clippy::too_many_arguments,
        reason = "the answer's parts, each of its own kind; a struct would only rename them"
    )]
    async fn answer_outcome_read<M: Messenger>(
        &self,
        messenger: &M,
        log: &DayLog,
        outcome: &Outcome,
        author: &Author,
        timing: Timing,
        read: Read<'_>,
        under: Under<'_>,
    ) {
        let Some(mut reply) = self.reply(log, outcome, author, timing, read).await else {
            return;
        };
        // A late answer comes after whatever was typed since: where the reply does not
        // show the message it answers (the terminal), it names the entry.
        if timing == Timing::Late && !messenger.shows_what_a_reply_answers() {
            reply = self.naming_the_entry(log, author, reply);
        }
        if outcome.is_final() {
            if self.answer(messenger, log, reply, under).await {
                let waited =
                    std::time::Duration::try_from(self.now().duration_since(log.created_at))
                        .unwrap_or_default();
                crate::observe::entry_answered(outcome, waited);
            }
        } else {
            self.notify(messenger, log, reply, under).await;
        }
    }

    /// Sends responses about a log; `true` when they went out or never can (so the
    /// log counts as answered), `false` when it is worth trying again later — or, among
    /// instances, when this one no longer holds the log's chat (checked right before
    /// the send): then nothing is sent, and the chat's new holder answers.
    async fn deliver<M: Messenger>(
        &self,
        messenger: &M,
        log: &DayLog,
        responses: Vec<Response>,
        under: Under<'_>,
    ) -> bool {
        if !under.may_send(log).await {
            return false;
        }
        let target = Target::reply(log.chat_id, log.message_id);
        match messenger.send(target, responses).await {
            Ok(()) => true,
            Err(SendError::Gone(reason) | SendError::Refused(reason)) => {
                tracing::warn!(log_id = log.id.get(), chat_id = log.chat_id.get(), %reason, "answer undeliverable; not retried");
                true
            }
            Err(SendError::Transient(reason)) => {
                let retry_in = self.settings.worker.retry_min();
                tracing::warn!(log_id = log.id.get(), chat_id = log.chat_id.get(), %reason, retry_in_ms = retry_in.as_millis() as u64, "answer not delivered; the worker retries");
                if let Err(error) = self.store.delay_reply(log.id, retry_in).await {
                    tracing::error!(log_id = log.id.get(), %error, "could not schedule the reply retry");
                }
                false
            }
        }
    }

    /// Sends the final answer about a log and records that it went out (under the
    /// chat's lease, among instances). A failure to record is logged, not reported to
    /// the user, who already has the answer (the worker may send it once more: the
    /// window docs/behaviour.md, Promises allows). `true` when it went out (or never can).
    async fn answer<M: Messenger>(
        &self,
        messenger: &M,
        log: &DayLog,
        reply: Reply,
        under: Under<'_>,
    ) -> bool {
        if !self
            .deliver(messenger, log, vec![Response::Text(reply)], under)
            .await
        {
            return false;
        }
        match self
            .replied
            .record(&self.store, log.id, under.fence())
            .await
        {
            Ok(true) => {
                self.unrecorded().replies.remove(&log.id);
            }
            Ok(false) => {
                tracing::warn!(
                    log_id = log.id.get(),
                    chat_id = log.chat_id.get(),
                    "answer sent, but another instance took the chat over before it was recorded; the new holder may send it once more"
                );
            }
            Err(error) => {
                tracing::error!(log_id = log.id.get(), %error, "answer sent but not recorded; recording is retried, the answer is not sent again");
                self.unrecorded().replies.insert(log.id);
            }
        }
        true
    }

    /// Sends a notice about a log that is not its final answer ("saved, will follow").
    async fn notify<M: Messenger>(
        &self,
        messenger: &M,
        log: &DayLog,
        reply: Reply,
        under: Under<'_>,
    ) {
        self.deliver(messenger, log, vec![Response::Text(reply)], under)
            .await;
    }

    /// `reply` under a line that names the entry it answers: its local time (with the
    /// day when that is not today) and first words.
    fn naming_the_entry(&self, log: &DayLog, author: &Author, reply: Reply) -> Reply {
        let written_in = log.written_in(&author.zone);
        let written = written_in.civil(log.written());
        let today = self.local_day(&author.zone, self.now());
        let when = if log.local_day == Some(today) {
            written.strftime("%H:%M").to_string()
        } else {
            written.strftime("%Y-%m-%d %H:%M").to_string()
        };
        let words = first_words(&log.text);
        let line = Texts(author.language)
            .answering_entry(&when, (!words.is_empty()).then_some(words.as_str()));
        let mut pieces = Reply::new().italic(line).newline().pieces().to_vec();
        pieces.extend_from_slice(reply.pieces());
        Reply::from(pieces)
    }

    /// The key variable of the analysis cascade's first provider: the one to set first.
    fn first_key_env(&self) -> String {
        self.first_key_env_of(self.settings.analysis.steps(), "MISTRAL_API_KEY")
    }

    pub(super) fn first_key_env_of(
        &self,
        steps: &[crate::config::StepSettings],
        fallback: &str,
    ) -> String {
        let settings = &self.settings;
        steps
            .iter()
            .find_map(|step| {
                let provider = settings.providers.get(step.provider())?;
                Some(provider.key_env(step.provider()))
            })
            .unwrap_or_else(|| fallback.to_owned())
    }

    /// The current streak for an analysis reply's note, in the author's zone, from the
    /// `entry_days` read before the analysis or else read now; 0 when it cannot be read.
    async fn streak_for_note(
        &self,
        user_id: UserId,
        zone: &UserZone,
        entry_days: Option<&[jiff::civil::Date]>,
    ) -> u32 {
        let today = self.local_day(zone, self.now());
        if let Some(days) = entry_days {
            return crate::streaks::Streaks::from_days(days, today).current;
        }
        match self.users.streaks_on(user_id, today).await {
            Ok(streaks) => streaks.current,
            Err(error) => {
                tracing::warn!(%error, user_id = user_id.get(), "could not read the streak");
                0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::first_words;

    #[test]
    fn an_entry_is_named_by_its_first_words_on_one_line() {
        assert_eq!(first_words("A quiet day."), "A quiet day.");
        assert_eq!(
            first_words("Walked the dog\nalong the river at dawn, then coffee."),
            "Walked the dog along the river…"
        );
        assert_eq!(
            first_words("Пробежка вдоль реки на рассвете была прекрасной"),
            "Пробежка вдоль реки на рассвете была…"
        );
        let long = "Supercalifragilisticexpialidocious-and-then-some words";
        assert_eq!(first_words(long).chars().count(), 41);
        assert!(first_words(long).ends_with('…'));
        assert_eq!(first_words("  "), "");
    }
}
