//! The journal: the life of a day log (SPEC §4), independent of the front end.
//!
//! Telegram (`bot`) and the terminal (`chat`) both hand incoming text to [`Journal`] and
//! give it a [`Messenger`] to answer through; the background worker uses the same type to
//! finish what an outage or a crash left undone. The order is always: store first, then
//! analyse, then store the result, then answer, then record that the answer went out.
//! A message being worked on is *claimed* in memory — by `(chat_id, message_id)`, so a
//! handler holds it from before the insert — and the worker never races a handler; at
//! start-up nothing is claimed, so everything unfinished is picked up. A terminal entry's
//! message id is chosen by the insert itself, so its claim can only follow the insert:
//! the worker lists and claims under a gate that such an insert holds until it has
//! claimed its log, so it never sees one unclaimed. Results are
//! stored only if the text they were made from is still the log's text, so an edit
//! that lands mid-analysis is analysed again rather than overwritten.
//!
//! A front end's handler only stores: `accept_*` returns an [`Accepted`] entry, which
//! [`Journal::answer_accepted`] analyses and answers — after the chat's earlier entries
//! (`lanes`), and in a task of its own, so the chat's next update is stored at once
//! rather than held in memory behind an analysis.

mod lanes;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::analysis::{self, Metrics, UserContext};
use crate::config::Settings;
use crate::domain::{Failure, ModelRef, Outcome, Wait};
use crate::frontend::{
    FetchError, MAX_VOICE_BYTES, Messenger, Response, SendError, Target, truncate_chars,
};
use crate::language::Language;
use crate::llm::{Attempt, AttemptSink, CascadeError, Llm, Task};
use crate::render::Reply;
use crate::store::{
    ChatId, DayLog, FrontEnd, Inserted, LogId, LogStatus, MessageId, NewLog, NewUser, NewVoiceLog,
    Store, StoreError, Unfinished, UserId, VoiceNote,
};
use crate::streaks::Streaks;
use crate::texts::Texts;
use crate::time::{Clock, SystemClock, UserZone};
use lanes::{Lanes, Turn};

/// A failure while handling an entry, sorted by what the user must be told.
#[derive(Debug, thiserror::Error)]
pub enum EntryError {
    /// The entry could not be stored: the user has to send it again.
    #[error("entry not stored: {0}")]
    NotSaved(#[source] StoreError),
    /// The entry is stored; something after that failed and the worker will finish it.
    #[error("entry stored, handling failed: {0}")]
    Later(#[from] StoreError),
}

impl EntryError {
    /// What every front end tells the user: send it again (not stored), or that it is
    /// safe (stored; the worker finishes it). The one sentence both front ends use.
    pub fn sentence(&self, language: Language) -> &'static str {
        let texts = Texts(language);
        match self {
            Self::NotSaved(_) => texts.not_saved(),
            Self::Later(_) => texts.internal_error(),
        }
    }
}

/// A text message from a user.
#[derive(Debug, Clone)]
pub struct Incoming {
    pub user_id: UserId,
    pub chat_id: ChatId,
    pub message_id: MessageId,
    pub username: Option<String>,
    pub language_code: Option<String>,
    pub text: String,
    /// When the user wrote it (Telegram's message `date`); `None`: now, by the clock.
    pub sent_at: Option<jiff::Timestamp>,
}

/// A voice or audio message from a user (SPEC §11).
#[derive(Debug, Clone)]
pub struct IncomingVoice {
    pub user_id: UserId,
    pub chat_id: ChatId,
    pub message_id: MessageId,
    pub username: Option<String>,
    pub language_code: Option<String>,
    /// What [`Messenger::fetch_audio`] fetches it by: Telegram's `file_id`, or for
    /// `daylog chat` the path of the file.
    pub file_id: String,
    /// As the sender's client reports it; `None` when unknown.
    pub duration_s: Option<u32>,
    pub file_size: Option<u64>,
    /// When the user sent it (Telegram's message `date`); `None`: now, by the clock.
    pub sent_at: Option<jiff::Timestamp>,
}

/// What became of one transcription round.
enum Transcribed {
    /// The transcript is stored: the log, with it as its text.
    Text(Box<DayLog>),
    /// Not a text: what the store now holds about the log (a wait, or a give-up).
    Decided(Outcome),
    /// Someone else stored a transcript meanwhile (or the log is no longer pending).
    Superseded,
}

/// Whether the user hears about an entry before its answer, and how the answer is
/// titled: [`Timing::Live`] for the path that stored it (notices such as "saved, it
/// follows" go out), [`Timing::Late`] once the user was told it follows, and for the
/// worker's answers (no notices; the answer says it is the one that was owed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timing {
    Live,
    Late,
}

/// The author of a log as the path that brought it to its analysis read them: their
/// language and zone, read once per entry (from the user row the insert returned, or one
/// read by the worker) instead of again by the context, the streak and the reply — each
/// read is a round trip to the store's thread, the largest cost per entry.
#[derive(Clone)]
struct Author {
    language: Language,
    zone: UserZone,
}

/// What the path that brings a log to its analysis knows of it without asking the store
/// (as [`Author`], each question saved is a round trip to the store's thread).
#[derive(Debug, Clone, Copy, Default)]
struct Known {
    /// Whether the log is a voice note; `None`: the store is asked.
    spoken: Option<bool>,
    /// Inserted by this very call, so no refusal can be recorded for it yet (refusals
    /// of a deleted log with the same id went with it: `ON DELETE CASCADE`).
    new: bool,
}

impl Known {
    /// A text entry the caller has just inserted.
    const NEW_TEXT: Self = Self {
        spoken: Some(false),
        new: true,
    };
}

/// A message is claimed by its chat and message id.
type ClaimKey = (ChatId, MessageId);

/// The claimed messages, each with whether an edit came that could not claim it.
type Claims = Arc<Mutex<HashMap<ClaimKey, bool>>>;

/// An in-memory claim on a message's log, released on drop.
pub struct Claim {
    key: ClaimKey,
    set: Claims,
}

impl Claim {
    /// Whether the message was edited since it was claimed (or since the last call):
    /// its holder answers the new text too, rather than leaving it to the worker.
    fn take_edited(&self) -> bool {
        let mut set = self.set.lock().unwrap_or_else(PoisonError::into_inner);
        set.get_mut(&self.key).is_some_and(std::mem::take)
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.key);
    }
}

/// What this process did about logs but could not write down (the store refused the
/// write: a full disk), kept so that the worker does not redo it at every poll.
#[derive(Default)]
struct Unrecorded {
    /// Answers that went out: only the record is retried, the answer is not sent again.
    replies: HashSet<LogId>,
    /// Voice notes whose transcript was shown: it is not shown again by this process.
    transcripts: HashSet<LogId>,
    /// Logs the worker could not finish because a write failed, and when it may try
    /// again: each try may run a whole cascade (the analysis is asked for, then cannot be
    /// stored), so a full disk would otherwise spend the free tiers' budgets on the same
    /// logs at every poll. The wait grows as a pending log's does (`retry_delay`).
    failed: HashMap<LogId, (i64, tokio::time::Instant)>,
}

/// The journal of every user: what front ends, the worker and the commands go through.
/// Its parts are its own; [`Journal::settings`] and [`Journal::store`] are there for the
/// commands and schedulers that read them.
pub struct Journal {
    settings: Arc<Settings>,
    store: Store,
    llm: Arc<Llm>,
    claims: Claims,
    /// Held (shared) by an insert that claims its log only after it (a terminal entry),
    /// and (exclusively) by the worker while it lists and claims unfinished logs.
    claim_gate: tokio::sync::RwLock<()>,
    /// What this process did but could not record (a full disk), so that the worker
    /// does not do it again on every poll for as long as the disk stays full.
    unrecorded: Mutex<Unrecorded>,
    /// The order of each chat's analyses (SPEC §8: a chat's updates in order).
    lanes: Lanes,
    /// Whether logs may wait out their retry schedule after a failure, and when they
    /// were last made due ([`Journal::resume_backlog`]).
    backlog: Mutex<Backlog>,
    clock: Arc<dyn Clock>,
}

/// An entry its handler has stored and claimed; its analysis and answer are still to
/// come ([`Journal::answer_accepted`]), in its turn among the chat's entries.
pub struct Accepted {
    log: DayLog,
    author: Author,
    work: Work,
    claim: Claim,
    turn: Turn,
}

/// A log the worker is to finish ([`Journal::finish`]): claimed, with its turn in its
/// chat.
pub struct Pickup {
    id: LogId,
    claim: Claim,
    turn: Turn,
}

impl Pickup {
    pub fn id(&self) -> LogId {
        self.id
    }

    /// Waits until the chat's earlier entries are done.
    pub async fn wait_turn(&mut self) {
        self.turn.begin().await;
    }
}

/// The logs an outage left on the retry schedule ([`Journal::resume_backlog`]).
#[derive(Debug, Clone, Copy)]
struct Backlog {
    /// Some log may be waiting after a failure: set by each one, cleared by a resume.
    /// Set at start-up too: logs of an earlier process may be waiting.
    waits: bool,
    /// When the last resume ran.
    at: Option<tokio::time::Instant>,
    /// Resumes in a row that found logs waiting.
    in_a_row: u32,
}

impl Default for Backlog {
    fn default() -> Self {
        Self {
            waits: true,
            at: None,
            in_a_row: 0,
        }
    }
}

impl Backlog {
    /// Whether another resume may run at `now`: the first at once, then each after the
    /// retry delay of as many attempts as resumes before it found logs
    /// ([`Journal::retry_delay`]).
    fn allows(&self, now: tokio::time::Instant, retry_delay: impl Fn(i64) -> Duration) -> bool {
        match self.at {
            Some(at) if self.in_a_row > 0 => {
                now.duration_since(at) >= retry_delay(i64::from(self.in_a_row) - 1)
            }
            _ => true,
        }
    }
}

/// What an accepted entry still needs before its analysis.
enum Work {
    Text(Known),
    /// A voice note: its recording, to transcribe first.
    Voice {
        file_id: String,
    },
}

impl Journal {
    pub fn new(settings: Arc<Settings>, store: Store, llm: Arc<Llm>) -> Self {
        let store = store.with_default_timezone(&settings.journal.default_zone());
        Self {
            settings,
            store,
            llm,
            claims: Arc::default(),
            claim_gate: tokio::sync::RwLock::new(()),
            unrecorded: Mutex::default(),
            lanes: Lanes::default(),
            backlog: Mutex::default(),
            clock: Arc::new(SystemClock),
        }
    }

    /// The same journal reading "now" from `clock` (tests drive time with it).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The settings the journal runs with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The store, for the commands and schedulers that query it (`commands`,
    /// `reminders`, `import`): what a log goes through is the journal's own methods.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Writes one weekly digest through the cascade (task `digest`); its attempts are
    /// recorded against the digest.
    pub async fn write_digest(
        &self,
        digest_id: crate::store::DigestId,
        request: &crate::llm::ChatRequest,
    ) -> Result<crate::llm::Completion, CascadeError> {
        let sink = self.store.digest_call_sink(digest_id);
        self.llm.run(Task::Digest, request, &sink).await
    }

    /// Whether this Telegram user may use the bot (an empty allowed list: everyone).
    pub fn is_allowed(&self, user_id: UserId) -> bool {
        self.settings.telegram.is_allowed(user_id.get())
    }

    /// Records a user seen for the first time (or again: a new name);
    /// commands, locations and documents may come before any entry, and the
    /// user must exist (with a language) for what they do to stick.
    pub async fn ensure_user(&self, user: &NewUser<'_>) -> Result<(), StoreError> {
        self.store.upsert_user(user).await.map(drop)
    }

    /// Now, by the one clock of the process.
    pub fn now(&self) -> jiff::Timestamp {
        self.clock.now()
    }

    /// The user's zone (the default for a user not seen yet).
    pub async fn zone_of(&self, user_id: UserId) -> UserZone {
        match self.store.user(user_id).await {
            Ok(Some(user)) => user.timezone,
            Ok(None) => self.settings.journal.default_zone(),
            Err(error) => {
                tracing::warn!(%error, user_id = user_id.get(), "could not read the user's zone");
                self.settings.journal.default_zone()
            }
        }
    }

    /// The local day `at` belongs to in `zone` (SPEC §10).
    pub fn local_day(&self, zone: &UserZone, at: jiff::Timestamp) -> jiff::civil::Date {
        zone.local_day(at, self.settings.journal.day_starts_hour)
    }

    /// The local day of a moment scheduled for `time` in `zone` (a reminder, a digest):
    /// that of the time it was meant for ([`UserZone::local_day_of`]).
    pub fn local_day_of(
        &self,
        zone: &UserZone,
        at: jiff::Timestamp,
        time: crate::time::LocalTime,
    ) -> jiff::civil::Date {
        zone.local_day_of(at, time, self.settings.journal.day_starts_hour)
    }

    /// The user's zone and their "today".
    pub async fn today_of(&self, user_id: UserId) -> (UserZone, jiff::civil::Date) {
        let zone = self.zone_of(user_id).await;
        let today = self.local_day(&zone, self.now());
        (zone, today)
    }

    /// The user's current and longest streak, in local days.
    pub async fn streaks(&self, user_id: UserId) -> Result<Streaks, StoreError> {
        let (_, today) = self.today_of(user_id).await;
        let days = self.store.entry_days(user_id).await?;
        Ok(Streaks::from_days(&days, today))
    }

    /// The current streak for an analysis reply's note, in the author's zone; 0 when it
    /// cannot be read.
    async fn streak_for_note(&self, user_id: UserId, zone: &UserZone) -> u32 {
        let today = self.local_day(zone, self.now());
        let streaks = self
            .store
            .entry_days(user_id)
            .await
            .map(|days| Streaks::from_days(&days, today));
        match streaks {
            Ok(streaks) => streaks.current,
            Err(error) => {
                tracing::warn!(%error, user_id = user_id.get(), "could not read the streak");
                0
            }
        }
    }

    fn unrecorded(&self) -> std::sync::MutexGuard<'_, Unrecorded> {
        self.unrecorded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Claims a message's log for this process; `None` when someone is already on it.
    pub fn claim(&self, chat_id: ChatId, message_id: MessageId) -> Option<Claim> {
        let key = (chat_id, message_id);
        let mut set = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        if set.contains_key(&key) {
            return None;
        }
        set.insert(key, false);
        Some(Claim {
            key,
            set: Arc::clone(&self.claims),
        })
    }

    /// Tells the holder of a claimed message that its text changed (see
    /// [`Claim::take_edited`]).
    fn mark_edited(&self, chat_id: ChatId, message_id: MessageId) {
        let mut set = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(edited) = set.get_mut(&(chat_id, message_id)) {
            *edited = true;
        }
    }

    /// The user's language, as stored (English when unknown).
    pub async fn language_of(&self, user_id: UserId) -> Language {
        self.language_or(user_id, Language::default()).await
    }

    /// The user's language, as stored; `fallback` (for Telegram, the client's
    /// `language_code`) for a user not stored yet or when the store cannot say.
    pub async fn language_or(&self, user_id: UserId, fallback: Language) -> Language {
        match self.store.user(user_id).await {
            Ok(Some(user)) => user.language(),
            Ok(None) => fallback,
            Err(error) => {
                tracing::warn!(%error, user_id = user_id.get(), "could not read the user's language");
                fallback
            }
        }
    }

    /// A log's author as stored, with the fallbacks of [`Journal::language_of`] and
    /// [`Journal::zone_of`] (English and the default zone for a user the store does not
    /// have or cannot read), in one read.
    async fn author_of(&self, user_id: UserId) -> Author {
        match self.store.user(user_id).await {
            Ok(Some(user)) => Author {
                language: user.language(),
                zone: user.timezone.clone(),
            },
            Ok(None) => Author {
                language: Language::default(),
                zone: self.settings.journal.default_zone(),
            },
            Err(error) => {
                tracing::warn!(%error, user_id = user_id.get(), "could not read the user's language and zone");
                Author {
                    language: Language::default(),
                    zone: self.settings.journal.default_zone(),
                }
            }
        }
    }

    /// A new text message: store, analyse, answer (SPEC §4), here and now.
    pub async fn on_text<M: Messenger>(
        &self,
        messenger: &M,
        msg: Incoming,
    ) -> Result<(), EntryError> {
        if let Some(accepted) = self.accept_text(msg).await? {
            self.answer_accepted(messenger, accepted).await;
        }
        Ok(())
    }

    /// A new text message, stored (SPEC §4.1); `None` when there is nothing to answer
    /// (a re-delivered update, or one being handled right now).
    pub async fn accept_text(&self, msg: Incoming) -> Result<Option<Accepted>, EntryError> {
        // Claimed before the insert, so the worker cannot take a log that is seconds old.
        let Some(claim) = self.claim(msg.chat_id, msg.message_id) else {
            return Ok(None); // the same message is being handled right now
        };
        let user = self
            .store
            .upsert_user(&NewUser {
                user_id: msg.user_id,
                username: msg.username.as_deref(),
                language: Language::from_code(msg.language_code.as_deref()),
            })
            .await
            .map_err(EntryError::NotSaved)?;
        let zone = user.timezone.clone();
        let local_day = self.local_day(&zone, msg.sent_at.unwrap_or_else(|| self.now()));
        let author = Author {
            language: user.language(),
            zone,
        };
        let inserted = self
            .store
            .insert_log(&NewLog {
                user_id: msg.user_id,
                chat_id: msg.chat_id,
                message_id: msg.message_id,
                text: &msg.text,
                local_day: Some(local_day),
                written_at: msg.sent_at,
            })
            .await
            .map_err(EntryError::NotSaved)?;
        let log = match inserted {
            Inserted::New(log) => *log,
            Inserted::Duplicate(id) => {
                // A re-delivered update: the first delivery (or the worker) answers.
                tracing::debug!(log_id = id.get(), "duplicate update ignored");
                return Ok(None);
            }
        };
        Ok(Some(self.accepted(
            log,
            author,
            Work::Text(Known::NEW_TEXT),
            claim,
        )))
    }

    /// A line typed in `daylog chat` by its terminal user: store, analyse, answer. The
    /// store numbers terminal entries itself (SPEC §7 `source = 'chat'`).
    pub async fn on_terminal_text<M: Messenger>(
        &self,
        messenger: &M,
        user_id: UserId,
        text: &str,
        read_at: jiff::Timestamp,
    ) -> Result<(), EntryError> {
        let user = self
            .store
            .upsert_user(&NewUser {
                user_id,
                username: None,
                language: Language::default(),
            })
            .await
            .map_err(EntryError::NotSaved)?;
        let author = Author {
            language: user.language(),
            zone: user.timezone.clone(),
        };
        let local_day = self.local_day(&author.zone, read_at);
        let (log, claim) = {
            let _storing = self.claim_gate.read().await;
            let log = self
                .store
                .insert_chat_log(user_id, text, Some(local_day))
                .await
                .map_err(EntryError::NotSaved)?;
            let claim = self.claim(log.chat_id, log.message_id);
            (log, claim)
        };
        let Some(claim) = claim else {
            // A fresh id nobody else can know; should it be taken, its holder answers.
            tracing::warn!(
                log_id = log.id.get(),
                "a new terminal entry was already claimed"
            );
            return Ok(());
        };
        let accepted = self.accepted(log, author, Work::Text(Known::NEW_TEXT), claim);
        self.answer_accepted(messenger, accepted).await;
        Ok(())
    }

    /// Why a voice note is refused before anything is stored, if it is: longer than
    /// `voice.max_seconds` or larger than Telegram lets a bot download.
    fn voice_refusal(&self, voice: &IncomingVoice, texts: Texts) -> Option<String> {
        let max_seconds = self.settings.voice.max_seconds;
        if voice.duration_s.is_some_and(|d| d > max_seconds) {
            return Some(texts.voice_too_long(max_seconds));
        }
        if voice.file_size.is_some_and(|size| size > MAX_VOICE_BYTES) {
            return Some(texts.voice_too_large().to_owned());
        }
        None
    }

    /// A voice or audio message: refuse it if too long or too large (nothing stored,
    /// `None`); else store it. Its answer ([`Journal::answer_accepted`]) transcribes it,
    /// shows the transcript, analyses, answers.
    pub async fn accept_voice<M: Messenger>(
        &self,
        messenger: &M,
        voice: IncomingVoice,
    ) -> Result<Option<Accepted>, EntryError> {
        let language = match self.store.user(voice.user_id).await {
            Ok(Some(user)) => user.language(),
            _ => Language::from_code(voice.language_code.as_deref()),
        };
        if let Some(refusal) = self.voice_refusal(&voice, Texts(language)) {
            tracing::info!(
                chat_id = voice.chat_id.get(),
                duration_s = voice.duration_s,
                file_size = voice.file_size,
                "voice note refused: too long or too large"
            );
            let target = Target::reply(voice.chat_id, voice.message_id);
            let reply = Reply::new().text(refusal);
            if let Err(error) = messenger.send(target, vec![Response::Text(reply)]).await {
                tracing::warn!(%error, chat_id = voice.chat_id.get(), "refusal not delivered");
            }
            return Ok(None);
        }
        let Some(claim) = self.claim(voice.chat_id, voice.message_id) else {
            return Ok(None);
        };
        let user = self
            .store
            .upsert_user(&NewUser {
                user_id: voice.user_id,
                username: voice.username.as_deref(),
                language: Language::from_code(voice.language_code.as_deref()),
            })
            .await
            .map_err(EntryError::NotSaved)?;
        let author = Author {
            language: user.language(),
            zone: user.timezone.clone(),
        };
        let inserted = self
            .store
            .insert_voice_log(&NewVoiceLog {
                user_id: voice.user_id,
                chat_id: voice.chat_id,
                message_id: voice.message_id,
                file_id: &voice.file_id,
                duration_s: voice.duration_s,
                local_day: Some(
                    self.local_day(&author.zone, voice.sent_at.unwrap_or_else(|| self.now())),
                ),
                written_at: voice.sent_at,
            })
            .await
            .map_err(EntryError::NotSaved)?;
        let log = match inserted {
            Inserted::New(log) => *log,
            Inserted::Duplicate(id) => {
                tracing::debug!(log_id = id.get(), "duplicate voice update ignored");
                return Ok(None);
            }
        };
        let work = Work::Voice {
            file_id: voice.file_id,
        };
        Ok(Some(self.accepted(log, author, work, claim)))
    }

    /// A voice note given to `daylog chat` (`/voice path`): the same path as Telegram's,
    /// the file read again from `voice.file_id` (its path) whenever it is transcribed.
    pub async fn on_terminal_voice<M: Messenger>(
        &self,
        messenger: &M,
        voice: IncomingVoice,
    ) -> Result<(), EntryError> {
        let user = self
            .store
            .upsert_user(&NewUser {
                user_id: voice.user_id,
                username: None,
                language: Language::default(),
            })
            .await
            .map_err(EntryError::NotSaved)?;
        let texts = Texts(user.language());
        if let Some(refusal) = self.voice_refusal(&voice, texts) {
            let target = Target::chat(ChatId::private(voice.user_id));
            let reply = Reply::new().text(refusal);
            if let Err(error) = messenger.send(target, vec![Response::Text(reply)]).await {
                tracing::warn!(%error, "refusal not shown");
            }
            return Ok(());
        }
        let author = Author {
            language: user.language(),
            zone: user.timezone.clone(),
        };
        let local_day = self.local_day(&author.zone, voice.sent_at.unwrap_or_else(|| self.now()));
        let (log, claim) = {
            let _storing = self.claim_gate.read().await;
            let log = self
                .store
                .insert_chat_voice_log(
                    voice.user_id,
                    &voice.file_id,
                    voice.duration_s,
                    Some(local_day),
                )
                .await
                .map_err(EntryError::NotSaved)?;
            let claim = self.claim(log.chat_id, log.message_id);
            (log, claim)
        };
        let Some(claim) = claim else {
            tracing::warn!(
                log_id = log.id.get(),
                "a new terminal voice note was already claimed"
            );
            return Ok(());
        };
        let work = Work::Voice {
            file_id: voice.file_id,
        };
        let accepted = self.accepted(log, author, work, claim);
        self.answer_accepted(messenger, accepted).await;
        Ok(())
    }

    /// A log just stored and claimed, given its turn in the chat.
    fn accepted(&self, log: DayLog, author: Author, work: Work, claim: Claim) -> Accepted {
        let what = match work {
            Work::Text(_) => "day log stored",
            Work::Voice { .. } => "voice note stored",
        };
        tracing::info!(
            log_id = log.id.get(),
            user_id = log.user_id.get(),
            chars = log.text.chars().count(),
            "{what}"
        );
        let turn = self.lanes.take(log.chat_id);
        Accepted {
            log,
            author,
            work,
            claim,
            turn,
        }
    }

    /// Analyses and answers an accepted entry once the chat's earlier ones are done. A
    /// failure after the store is told to the user here, in the entry's turn.
    pub async fn answer_accepted<M: Messenger>(&self, messenger: &M, accepted: Accepted) {
        let target = Target::reply(accepted.log.chat_id, accepted.log.message_id);
        let Accepted {
            log,
            author,
            work,
            claim,
            mut turn,
        } = accepted;
        let waited = turn.begin().await;
        if let Err(error) = self
            .answer_in_turn(messenger, log, &author, work, &claim, waited)
            .await
        {
            let error = EntryError::Later(error);
            tracing::error!(%error, chat_id = target.chat_id.get(), "day log handling failed");
            let reply = Reply::new().text(error.sentence(author.language));
            if let Err(error) = messenger.send(target, vec![Response::Text(reply)]).await {
                tracing::warn!(%error, chat_id = target.chat_id.get(), "reply not delivered");
            }
        }
        drop(turn); // the chat's next entry goes now
    }

    async fn answer_in_turn<M: Messenger>(
        &self,
        messenger: &M,
        mut log: DayLog,
        author: &Author,
        work: Work,
        claim: &Claim,
        waited: bool,
    ) -> Result<(), StoreError> {
        if waited {
            // It waited behind an earlier entry: it may have been edited (the edit could
            // not claim it, and this read has its text) or deleted meanwhile.
            claim.take_edited();
            match self.still_pending(log.id).await? {
                Some(now) => log = now,
                None => return Ok(()),
            }
        }
        let mut known = match work {
            Work::Text(known) => known,
            Work::Voice { file_id } => {
                return self
                    .transcribe_and_answer(messenger, log, &file_id, author, Timing::Live, claim)
                    .await;
            }
        };
        loop {
            let id = log.id;
            self.analyse_and_answer(messenger, log, author, known, Timing::Live, claim)
                .await?;
            // Edited while it was analysed: the old text's result was not stored, and
            // the new text is answered now, as the edit itself would have been.
            if !claim.take_edited() {
                return Ok(());
            }
            match self.still_pending(id).await? {
                Some(now) => log = now,
                None => return Ok(()),
            }
            known = Known::default();
        }
    }

    /// The log as stored now, if it is still waiting for its analysis (not deleted, not
    /// finished by someone else).
    async fn still_pending(&self, id: LogId) -> Result<Option<DayLog>, StoreError> {
        Ok(self
            .store
            .log(id)
            .await?
            .filter(|log| log.status == LogStatus::Pending))
    }

    /// Transcribes a stored voice note, shows the transcript, then analyses it as text.
    /// Each stage leaves what it did in the store, so the worker resumes from there.
    async fn transcribe_and_answer<M: Messenger>(
        &self,
        messenger: &M,
        log: DayLog,
        file_id: &str,
        author: &Author,
        timing: Timing,
        claim: &Claim,
    ) -> Result<(), StoreError> {
        let transcribed = with_typing(
            messenger,
            log.chat_id,
            self.transcribe(messenger, &log, file_id),
        )
        .await?;
        match transcribed {
            Transcribed::Text(log) => {
                if !self.show_transcript(messenger, &log, author.language).await {
                    // The analysis follows the transcript, never overtakes it.
                    return self.postpone(&log).await;
                }
                self.analyse_and_answer(messenger, *log, author, Known::default(), timing, claim)
                    .await
            }
            Transcribed::Decided(outcome) => {
                self.answer_outcome(messenger, &log, &outcome, author, timing)
                    .await;
                Ok(())
            }
            Transcribed::Superseded => Ok(()),
        }
    }

    /// One transcription round: fetch the recording (in memory), run the cascade, store
    /// the transcript only if the log has none yet.
    async fn transcribe<M: Messenger>(
        &self,
        messenger: &M,
        log: &DayLog,
        file_id: &str,
    ) -> Result<Transcribed, StoreError> {
        if !self.llm.can_transcribe() {
            // Not worth a download (up to 20 MB at every try) that nothing can use.
            tracing::warn!(
                log_id = log.id.get(),
                "no transcription provider has a key; voice note stays pending"
            );
            return self.wait_for_transcription(log, Wait::NoTranscriber).await;
        }
        let audio = match messenger.fetch_audio(file_id).await {
            Ok(audio) => audio,
            Err(FetchError::Gone(reason)) => {
                tracing::warn!(log_id = log.id.get(), %reason, "voice note recording unavailable");
                return self.give_up_voice(log, Failure::RecordingGone).await;
            }
            Err(FetchError::Transient(reason)) => {
                tracing::warn!(log_id = log.id.get(), %reason, "voice note download failed; log stays pending");
                let wait = Wait::Transcription { refused: false };
                return self.wait_for_transcription(log, wait).await;
            }
        };
        let sink = self.store.call_sink(Some(log.id));
        match self.llm.transcribe(&audio, &sink).await {
            Ok(completion) if completion.text.is_empty() => {
                tracing::info!(log_id = log.id.get(), provider = %completion.provider, model = %completion.model, "voice note has no words");
                self.give_up_voice(log, Failure::NoWords).await
            }
            Ok(completion) => match self
                .store
                .store_transcript(log.id, &completion.text)
                .await?
            {
                Some(log) => {
                    tracing::info!(log_id = log.id.get(), provider = %completion.provider, model = %completion.model, chars = log.text.chars().count(), "voice note transcribed");
                    Ok(Transcribed::Text(Box::new(log)))
                }
                None => Ok(Transcribed::Superseded),
            },
            Err(error) => {
                tracing::warn!(log_id = log.id.get(), %error, "transcription cascade failed; log stays pending");
                let wait = Wait::Transcription {
                    refused: error.every_attempt_refused(),
                };
                self.wait_for_transcription(log, wait).await
            }
        }
    }

    /// The voice note waits for its transcription again, on the retry schedule
    /// (superseded when the log moved on meanwhile: edited, or answered).
    async fn wait_for_transcription(
        &self,
        log: &DayLog,
        wait: Wait,
    ) -> Result<Transcribed, StoreError> {
        let outcome = Outcome::Waiting {
            wait,
            retry_in: self.retry_delay(log.attempts),
            metrics: None,
        };
        Ok(if self.store.record(log.id, &log.text, &outcome).await? {
            Transcribed::Decided(outcome)
        } else {
            Transcribed::Superseded
        })
    }

    /// A voice note that can never be transcribed is given up on, with its reason.
    async fn give_up_voice(&self, log: &DayLog, why: Failure) -> Result<Transcribed, StoreError> {
        let outcome = Outcome::Failed(why);
        Ok(if self.store.record(log.id, &log.text, &outcome).await? {
            Transcribed::Decided(outcome)
        } else {
            Transcribed::Superseded
        })
    }

    /// The worker comes back to this log later without counting an attempt (a
    /// transcript that could not be delivered yet).
    async fn postpone(&self, log: &DayLog) -> Result<(), StoreError> {
        let retry_in = self.settings.worker.retry_min();
        if log.status == LogStatus::Pending {
            self.store.postpone(log.id, retry_in).await
        } else {
            self.store.delay_reply(log.id, retry_in).await
        }
    }

    /// Shows a voice note's transcript as a reply to it, once: it is recorded as shown
    /// when it went out (or never can). `false` when delivery failed for now: then
    /// nothing that follows from the transcript is sent before it.
    async fn show_transcript<M: Messenger>(
        &self,
        messenger: &M,
        log: &DayLog,
        language: Language,
    ) -> bool {
        let reply = Reply::new()
            .italic(Texts(language).transcript_title())
            .paragraph()
            .text(&log.text);
        let target = Target::reply(log.chat_id, log.message_id);
        let shown = match messenger.send(target, vec![Response::Text(reply)]).await {
            Ok(()) => true,
            Err(SendError::Gone(reason) | SendError::Refused(reason)) => {
                tracing::warn!(log_id = log.id.get(), %reason, "transcript undeliverable; not retried");
                true
            }
            Err(SendError::Transient(reason)) => {
                tracing::warn!(log_id = log.id.get(), %reason, "transcript not delivered; shown later");
                false
            }
        };
        if shown {
            match self.store.mark_transcript_sent(log.id).await {
                Ok(()) => {
                    self.unrecorded().transcripts.remove(&log.id);
                }
                Err(error) => {
                    tracing::error!(log_id = log.id.get(), %error, "transcript sent but not recorded; it is not sent again");
                    self.unrecorded().transcripts.insert(log.id);
                }
            }
        }
        shown
    }

    /// Completes when a log parked for lack of budget is due (the worker's wake-up).
    pub async fn budget_returned(&self) {
        self.llm.budget_returned().await;
    }

    /// What the worker of `front_end` should finish now, each log claimed for it (logs
    /// a handler is on are left out). Listing and claiming happen under the claim gate,
    /// so a terminal entry is never seen between its insert and its claim.
    /// Each is given its turn in its chat in the order of the logs (oldest first), so a
    /// chat's entries left over by a crash are answered in the order they came.
    pub async fn claim_unfinished(
        &self,
        front_end: FrontEnd,
        limit: i64,
    ) -> Result<Vec<Pickup>, StoreError> {
        let _listing = self.claim_gate.write().await;
        let batch = self.store.unfinished(front_end, limit).await?;
        let now = tokio::time::Instant::now();
        let waiting: HashSet<LogId> = {
            let mut unrecorded = self.unrecorded();
            // Only the logs still unfinished are remembered (a deleted one is not).
            let listed = |id: &LogId| batch.iter().any(|(_, log)| log.id == *id);
            unrecorded.failed.retain(|id, _| listed(id));
            unrecorded.transcripts.retain(listed);
            unrecorded
                .failed
                .iter()
                .filter(|(_, (_, until))| *until > now)
                .map(|(id, _)| *id)
                .collect()
        };
        Ok(batch
            .into_iter()
            .filter(|(_, log)| !waiting.contains(&log.id))
            .filter_map(|(_, log)| {
                let claim = self.claim(log.chat_id, log.message_id)?;
                let turn = self.lanes.take(log.chat_id);
                Some(Pickup {
                    id: log.id,
                    claim,
                    turn,
                })
            })
            .collect())
    }

    /// An edited message: new text, analysed again. A message never stored is a new log,
    /// unless the user erased their data (`/delete`) after sending it: its entry does
    /// not come back.
    pub async fn accept_edit(&self, msg: Incoming) -> Result<Option<Accepted>, EntryError> {
        let Some(log) = self
            .store
            .update_text(msg.chat_id, msg.message_id, &msg.text)
            .await
            .map_err(EntryError::NotSaved)?
        else {
            if let Some(sent_at) = msg.sent_at
                && self
                    .store
                    .erased_after(msg.user_id, sent_at)
                    .await
                    .map_err(EntryError::NotSaved)?
            {
                tracing::info!(
                    user_id = msg.user_id.get(),
                    "edit of a message sent before the user's /delete; not stored again"
                );
                return Ok(None);
            }
            return self.accept_text(msg).await;
        };
        tracing::info!(log_id = log.id.get(), "day log edited");
        let Some(claim) = self.claim(msg.chat_id, msg.message_id) else {
            // Its entry waits for its turn (and reads the new text when it comes), or an
            // analysis of the old text is running: that result will not be stored (the
            // text changed), and the claim's holder analyses the new text after it.
            self.mark_edited(msg.chat_id, msg.message_id);
            return Ok(None);
        };
        let author = self.author_of(msg.user_id).await;
        Ok(Some(self.accepted(
            log,
            author,
            Work::Text(Known::default()),
            claim,
        )))
    }

    /// Analyses a pending log and answers it: the answer, or (live) a notice of why it
    /// waits. Live, an analysis that takes longer than `budgets.notify_after_ms` is said
    /// to the user, and the answer still follows (here, or from the worker).
    async fn analyse_and_answer<M: Messenger>(
        &self,
        messenger: &M,
        log: DayLog,
        author: &Author,
        known: Known,
        timing: Timing,
        _claim: &Claim,
    ) -> Result<(), StoreError> {
        let texts = Texts(author.language);
        // The worker's tries are not held to it: one past `worker.max_age_hours` is the
        // last before the entry is given up, and a backlog after an outage is no abuse.
        if timing == Timing::Live && self.over_hourly_limit(&log).await? {
            let limit = self.settings.telegram.analyses_per_hour;
            let wait = self.store.defer_to_free_slot(&log, limit).await?;
            self.notify(
                messenger,
                &log,
                Reply::new().text(texts.saved_rate_limited(wait)),
            )
            .await;
            return Ok(());
        }
        // In a block, so that the analysis (which borrows the log) is gone before the
        // answer takes the log over.
        let (outcome, timing) = {
            let analysing = with_typing(messenger, log.chat_id, self.analyse(&log, author, known));
            tokio::pin!(analysing);
            // SPEC §4, §5: a wait longer than `budgets.notify_after_ms` is said to the
            // user, and the answer still follows.
            tokio::select! {
                outcome = &mut analysing => (outcome?, timing),
                () = tokio::time::sleep(self.settings.budgets.notify_after()), if timing == Timing::Live => {
                    let reply = match self.llm.budget_wait(Task::Analysis) {
                        Some(back_in) => texts.saved_budget(back_in),
                        None => texts.saved_slow().to_owned(),
                    };
                    tracing::info!(log_id = log.id.get(), "the analysis takes longer than notify_after_ms; user told it follows");
                    self.notify(messenger, &log, Reply::new().text(reply)).await;
                    (analysing.await?, Timing::Late)
                }
            }
        };
        // `None`: edited meanwhile, nothing stored; the new text is answered next. An
        // edit after the outcome was stored is caught by `mark_replied`.
        if let Some(outcome) = outcome {
            self.answer_outcome(messenger, &log, &outcome, author, timing)
                .await;
        }
        Ok(())
    }

    /// Sends responses about a log; `true` when they went out or never can (so the
    /// log counts as answered), `false` when it is worth trying again later.
    async fn deliver<M: Messenger>(
        &self,
        messenger: &M,
        log: &DayLog,
        responses: Vec<Response>,
    ) -> bool {
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

    /// Sends the final answer about a log and records that it went out. A failure to
    /// record is logged, not reported to the user, who already has the answer (the
    /// worker may send it once more: the window SPEC §9 allows).
    async fn answer<M: Messenger>(&self, messenger: &M, log: &DayLog, reply: Reply) {
        if !self
            .deliver(messenger, log, vec![Response::Text(reply)])
            .await
        {
            return;
        }
        match self.store.mark_replied(log.id).await {
            Ok(()) => {
                self.unrecorded().replies.remove(&log.id);
            }
            Err(error) => {
                tracing::error!(log_id = log.id.get(), %error, "answer sent but not recorded; recording is retried, the answer is not sent again");
                self.unrecorded().replies.insert(log.id);
            }
        }
    }

    /// Sends a notice about a log that is not its final answer ("saved, will follow").
    async fn notify<M: Messenger>(&self, messenger: &M, log: &DayLog, reply: Reply) {
        self.deliver(messenger, log, vec![Response::Text(reply)])
            .await;
    }

    async fn over_hourly_limit(&self, log: &DayLog) -> Result<bool, StoreError> {
        let limit = self.settings.telegram.analyses_per_hour;
        if limit == 0 {
            return Ok(false);
        }
        // Entries stored before this one (a burst not analysed yet), or analyses given
        // (an entry edited again and again): either reaching the limit is enough.
        Ok(self.store.recent_use(log.user_id, log.id).await? >= i64::from(limit))
    }

    /// The key variable of the analysis cascade's first provider: the one to set first.
    fn first_key_env(&self) -> String {
        self.first_key_env_of(&self.settings.analysis.steps, "MISTRAL_API_KEY")
    }

    /// The key a voice note needs: that of the first transcription step.
    fn transcription_key_env(&self) -> String {
        self.first_key_env_of(&self.settings.transcription.steps, "GROQ_API_KEY")
    }

    fn first_key_env_of(&self, steps: &[crate::config::StepSettings], fallback: &str) -> String {
        let settings = &self.settings;
        steps
            .iter()
            .find_map(|step| {
                let provider = settings.providers.get(&step.provider)?;
                Some(provider.key_env(&step.provider))
            })
            .unwrap_or_else(|| fallback.to_owned())
    }

    fn was_truncated(&self, log: &DayLog) -> bool {
        log.text.chars().count() > self.settings.telegram.max_text_chars
    }

    /// One analysis round: analysis and metrics concurrently, the outcome stored and
    /// returned; `None` when the log was edited meanwhile (nothing stored). It never
    /// messages anyone: the answer is [`Journal::answer_outcome`]'s.
    async fn analyse(
        &self,
        log: &DayLog,
        author: &Author,
        known: Known,
    ) -> Result<Option<Outcome>, StoreError> {
        let text = truncate_chars(&log.text, self.settings.telegram.max_text_chars);
        let context = self.context(log, author, known).await?;
        // Models that refused this text before are not asked again (SPEC §5); new
        // refusals are remembered before the outcome is stored, so the worker's next
        // round already leaves them out.
        let refused = if known.new {
            Vec::new()
        } else {
            self.store.refusals(log.id).await?
        };
        let sink = RefusalWatch::new(self.store.call_sink(Some(log.id)));
        let (analysis, metrics) = self.ask(log, &context, text, &sink, &refused).await;
        let spent = self.llm.take_new_daily_budgets();
        if !spent.is_empty()
            && let Err(error) = self.store.save_spent_budgets(&spent).await
        {
            // Only a restart would pay for it: worth a warning, not the entry.
            tracing::warn!(%error, "could not store a spent daily budget");
        }
        let newly_refused = sink.refused();
        if !newly_refused.is_empty() {
            self.store
                .record_refusals(log.id, &log.text, &newly_refused)
                .await?;
        }
        let outcome = match analysis {
            Ok(completion) => {
                tracing::info!(log_id = log.id.get(), provider = %completion.provider, model = %completion.model, "day log analysed");
                Outcome::Analysed {
                    analysis: completion.text.trim().to_owned(),
                    metrics: metrics.or_defaults(log),
                }
            }
            Err(error) if error.is_blocked() => {
                tracing::info!(
                    log_id = log.id.get(),
                    "analysis refused by the content filter"
                );
                Outcome::Blocked {
                    metrics: Some(metrics.or_defaults(log)),
                }
            }
            Err(error) => {
                let refused: Vec<ModelRef> = refused.into_iter().chain(newly_refused).collect();
                self.waiting(log, &error, &refused, metrics.answered())
            }
        };
        if !self.store.record(log.id, &log.text, &outcome).await? {
            tracing::info!(
                log_id = log.id.get(),
                "log edited during its analysis; the new text is analysed next"
            );
            return Ok(None);
        }
        self.after_recording(log, &outcome).await;
        Ok(Some(outcome))
    }

    /// Asks for the analysis and the metrics of `text` at once. Metrics an earlier
    /// round of this very text got (its analysis failed) are not asked for again: they
    /// cost a request, and in an outage they might be lost to defaults on the round
    /// that finally has an analysis.
    async fn ask<S: AttemptSink>(
        &self,
        log: &DayLog,
        context: &UserContext,
        text: &str,
        sink: &S,
        refused: &[ModelRef],
    ) -> (Result<crate::llm::Completion, CascadeError>, RoundMetrics) {
        let analysis_request = analysis::analysis_request(context, text);
        let metrics_request = analysis::metrics_request(text);
        let excluded = ModelRef::pairs(refused);
        let earlier = log.metrics.clone().filter(|m| !m.is_all_defaulted());
        let metrics_round = async {
            if let Some(stored) = earlier {
                return RoundMetrics::Kept(stored);
            }
            match self
                .llm
                .run_excluding(Task::Metrics, &metrics_request, sink, &excluded)
                .await
            {
                Ok(completion) => RoundMetrics::Answered(Metrics::from_llm_text(&completion.text)),
                Err(error) => RoundMetrics::Failed(error),
            }
        };
        tokio::join!(
            self.llm
                .run_excluding(Task::Analysis, &analysis_request, sink, &excluded),
            metrics_round,
        )
    }

    /// The wait after an analysis that failed for `error`: until a budget returns when
    /// budgets are the whole story, else on the failure schedule. Metrics this round
    /// `answered` are kept with the log.
    fn waiting(
        &self,
        log: &DayLog,
        error: &CascadeError,
        refused: &[ModelRef],
        answered: Option<Metrics>,
    ) -> Outcome {
        // A step that failed for another reason (5xx, a stall) puts the log on the
        // failure schedule.
        let only_budgets = error
            .errors()
            .iter()
            .all(|e| matches!(e.error, crate::llm::LlmError::RateLimited { .. }));
        let budget_wait = self
            .llm
            .budget_wait_excluding(Task::Analysis, &ModelRef::pairs(refused))
            .filter(|_| only_budgets);
        let (wait, retry_in) = match budget_wait {
            Some(back_in) => (Wait::Budget, back_in),
            None => {
                let wait = match error {
                    CascadeError::NoUsableProvider => Wait::NoProvider,
                    error if error.every_key_refused() => Wait::KeysRefused,
                    _ => Wait::Provider,
                };
                (wait, self.retry_delay(log.attempts))
            }
        };
        if wait != Wait::Budget {
            tracing::warn!(log_id = log.id.get(), %error, retry_in_s = retry_in.as_secs(), "analysis cascade failed; log stays pending");
        }
        Outcome::Waiting {
            wait,
            retry_in,
            metrics: answered.filter(|m| !m.is_all_defaulted()),
        }
    }

    /// What follows from an outcome once it is stored: a success makes the backlog
    /// due; a budget wait wakes the worker when it ends; a failure marks a backlog.
    async fn after_recording(&self, log: &DayLog, outcome: &Outcome) {
        match outcome {
            Outcome::Analysed { .. } => {
                // The store takes writes again: logs left alone after a failed write
                // are due as soon as the backlog is.
                self.unrecorded().failed.clear();
                self.resume_backlog().await;
            }
            Outcome::Waiting {
                wait: Wait::Budget,
                retry_in,
                ..
            } => {
                // Stored as due no later than this (the store rounds down): the
                // worker is woken then, not at its next poll.
                self.llm.wake_at(tokio::time::Instant::now() + *retry_in);
                tracing::info!(
                    log_id = log.id.get(),
                    back_in_s = retry_in.as_secs(),
                    "every budget is spent; log parked until one returns"
                );
            }
            Outcome::Waiting { .. } => self.backlog().waits = true,
            Outcome::Blocked { .. } | Outcome::Failed(_) => {}
        }
    }

    /// An analysis has just succeeded. When logs may be waiting out their retry schedule
    /// after a failure (one since the last time, or a start-up), the outage that put
    /// them there is over for at least one step: they are made due now and the worker
    /// is woken, so the backlog is answered, oldest first, within moments of the first
    /// answer, not each at its own next try (up to `worker.retry_max_ms` away). Logs
    /// waiting for a budget, a transcription or the hourly limit keep their time.
    ///
    /// A provider that answers one request in twenty would otherwise have the whole
    /// backlog tried after each of its answers, so the resumes that keep finding logs
    /// are spaced like one log's retries: `worker.retry_min_ms`, doubling, up to
    /// `worker.retry_max_ms`. One that finds none (the backlog is gone) starts over.
    async fn resume_backlog(&self) {
        let now = tokio::time::Instant::now();
        {
            let mut backlog = self.backlog();
            if !backlog.waits || !backlog.allows(now, |n| self.retry_delay(n)) {
                return;
            }
            // Counted now, not after the update: a success that comes while it runs
            // sees this resume and waits its spacing. And cleared now: a failure marks
            // its log before it sets `waits`, so one this clears is made due below.
            *backlog = Backlog {
                waits: false,
                at: Some(now),
                in_a_row: backlog.in_a_row.saturating_add(1),
            };
        }
        match self.store.retry_pending_now().await {
            Ok(0) => {
                // Nothing was waiting: the backlog is gone, the next outage starts over
                // (unless another resume has been counted since).
                let mut backlog = self.backlog();
                if backlog.at == Some(now) {
                    backlog.at = None;
                    backlog.in_a_row = 0;
                }
            }
            Ok(due) => {
                tracing::info!(
                    logs = due,
                    "an analysis succeeded again; the logs waiting to retry are due now"
                );
                self.llm.wake_at(now);
            }
            Err(error) => {
                self.backlog().waits = true;
                tracing::warn!(%error, "could not make the waiting logs due; they keep their schedule");
            }
        }
    }

    fn backlog(&self) -> std::sync::MutexGuard<'_, Backlog> {
        self.backlog.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The background retry interval after `attempts` failed rounds: doubling from
    /// `worker.retry_min_ms`, capped at `worker.retry_max_ms`.
    pub fn retry_delay(&self, attempts: i64) -> Duration {
        let worker = &self.settings.worker;
        let factor =
            2u64.saturating_pow(u32::try_from(attempts.max(0)).unwrap_or(u32::MAX).min(40));
        Duration::from_millis(
            worker
                .retry_min_ms
                .saturating_mul(factor)
                .min(worker.retry_max_ms),
        )
    }

    async fn context(
        &self,
        log: &DayLog,
        author: &Author,
        known: Known,
    ) -> Result<UserContext, StoreError> {
        // The week up to the entry's own day: an entry answered days late (an outage)
        // is compared with the days before it, not with days written after it.
        let day = log
            .local_day
            .unwrap_or_else(|| self.local_day(&author.zone, self.now()));
        let week_start = day.checked_sub(jiff::Span::new().days(6)).unwrap_or(day);
        let mut days = self.store.daily_metrics(log.user_id, week_start).await?;
        days.retain(|metrics| metrics.day <= day);
        let spoken = match known.spoken {
            Some(spoken) => spoken,
            None => self.store.voice_note(log.id).await?.is_some(),
        };
        let mut summaries = self.store.recent_summaries(log.user_id, log.id, 3).await?;
        summaries.reverse();
        Ok(UserContext {
            language: author.language,
            recent_days: days,
            recent_summaries: summaries,
            spoken,
        })
    }

    /// The worker's try at a pending log: transcribe a recording never transcribed, or
    /// analyse the text again; answered when it succeeds.
    async fn try_unfinished<M: Messenger>(
        &self,
        messenger: &M,
        log: DayLog,
        voice: Option<VoiceNote>,
        author: &Author,
        claim: &Claim,
    ) -> Result<(), StoreError> {
        let spoken = voice.is_some();
        if let Some(voice) = voice.filter(|_| log.text.is_empty()) {
            // Stored, never transcribed: start from the recording.
            return self
                .transcribe_and_answer(messenger, log, &voice.file_id, author, Timing::Late, claim)
                .await;
        }
        let known = Known {
            spoken: Some(spoken),
            new: false,
        };
        self.analyse_and_answer(messenger, log, author, known, Timing::Late, claim)
            .await
    }

    /// Finishes one log the worker found (SPEC §4.6): analyse a due pending log again, or
    /// send an answer that was decided but never delivered. One that fails on a write
    /// is left alone by [`Journal::claim_unfinished`] for a growing while.
    pub async fn finish<M: Messenger>(
        &self,
        messenger: &M,
        pickup: Pickup,
    ) -> Result<(), StoreError> {
        let id = pickup.id;
        let finished = self.finish_claimed(messenger, pickup).await;
        let mut unrecorded = self.unrecorded();
        if finished.is_err() {
            let tries = unrecorded.failed.get(&id).map_or(0, |(tries, _)| *tries);
            let until = tokio::time::Instant::now() + self.retry_delay(tries);
            unrecorded.failed.insert(id, (tries + 1, until));
        } else {
            unrecorded.failed.remove(&id);
        }
        finished
    }

    async fn finish_claimed<M: Messenger>(
        &self,
        messenger: &M,
        pickup: Pickup,
    ) -> Result<(), StoreError> {
        let Pickup {
            id,
            claim,
            mut turn,
        } = pickup;
        turn.begin().await; // normally begun already (Pickup::wait_turn)
        // Read again under the claim: a handler may have finished it since the worker
        // listed it, and answering twice is what the claim is there to prevent.
        let Some((kind, log)) = self.store.unfinished_one(id).await? else {
            return Ok(());
        };
        let author = self.author_of(log.user_id).await;
        let language = author.language;
        let voice = self.store.voice_note(log.id).await?;
        // A transcript stored before a crash (or a lost delivery) is shown before anything
        // that follows from it.
        if let Some(VoiceNote {
            transcript_sent_at: None,
            ..
        }) = &voice
            && !log.text.is_empty()
            && !self.unrecorded().transcripts.contains(&log.id)
            && !self.show_transcript(messenger, &log, language).await
        {
            return self.postpone(&log).await;
        }
        match kind {
            Unfinished::Analyse => {
                // Past `worker.max_age_hours` a log still gets this try: after a downtime
                // longer than that, or when the first answer after a long outage makes
                // the backlog due, a provider may well answer now. Only a log this try
                // leaves pending is given up.
                let age = self.store.log_age(log.id).await?.unwrap_or_default();
                let id = log.id;
                // What the give-up compares with, kept only when it can come to that.
                let tried = (age > self.settings.worker.max_age())
                    .then(|| (log.edited_at, log.text.clone()));
                self.try_unfinished(messenger, log, voice, &author, &claim)
                    .await?;
                let Some((tried_edit, tried_text)) = tried else {
                    return Ok(());
                };
                // Still pending, and still the entry that was tried (a voice note's text
                // is its transcript, stored by the try): one edited during the try is
                // young again (its age counts from the edit), and the next poll analyses
                // its new text.
                let Some(left) = self.store.log(id).await?.filter(|l| {
                    l.status == LogStatus::Pending
                        && l.edited_at == tried_edit
                        && (tried_text.is_empty() || l.text == tried_text)
                }) else {
                    return Ok(());
                };
                tracing::warn!(
                    log_id = id.get(),
                    age_h = age.as_secs() / 3600,
                    "giving up on a pending log"
                );
                let gave_up = Outcome::Failed(Failure::GaveUp);
                if !self.store.record(id, &left.text, &gave_up).await? {
                    return Ok(()); // edited meanwhile: the new text gets its chance
                }
                self.answer_outcome(messenger, &left, &gave_up, &author, Timing::Late)
                    .await;
                Ok(())
            }
            Unfinished::Reply if self.unrecorded().replies.contains(&log.id) => {
                // Already delivered by this process: only the record is missing.
                match self.store.mark_replied(log.id).await {
                    Ok(()) => {
                        self.unrecorded().replies.remove(&log.id);
                        tracing::info!(log_id = log.id.get(), "answer recorded after all");
                    }
                    Err(error) => {
                        tracing::debug!(log_id = log.id.get(), %error, "answer still not recorded");
                    }
                }
                Ok(())
            }
            Unfinished::Reply => {
                if let Some(outcome) = log.outcome() {
                    self.answer_outcome(messenger, &log, &outcome, &author, Timing::Late)
                        .await;
                }
                Ok(())
            }
        }
    }

    /// The one reply to an outcome, for the live path and the worker alike: the
    /// answer to a final outcome (the analysis with its metrics line and notes, the
    /// content filter's refusal, a give-up), or — live only — the notice of why the
    /// log waits; `None` when there is nothing to say.
    async fn reply(
        &self,
        log: &DayLog,
        outcome: &Outcome,
        author: &Author,
        timing: Timing,
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
                    streak: self.streak_for_note(log.user_id, &author.zone).await,
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
                Wait::NoTranscriber => texts.saved_voice_no_provider(&self.transcription_key_env()),
            },
        };
        Some(Reply::new().text(sentence))
    }

    /// Sends [`Journal::reply`] to an outcome: a final one as the log's answer
    /// (recorded as sent), a wait as a notice.
    async fn answer_outcome<M: Messenger>(
        &self,
        messenger: &M,
        log: &DayLog,
        outcome: &Outcome,
        author: &Author,
        timing: Timing,
    ) {
        let Some(reply) = self.reply(log, outcome, author, timing).await else {
            return;
        };
        if outcome.is_final() {
            self.answer(messenger, log, reply).await;
        } else {
            self.notify(messenger, log, reply).await;
        }
    }
}

/// Passes attempts on to the store and notes each model that refused on content policy.
struct RefusalWatch<S> {
    inner: S,
    refused: Mutex<Vec<ModelRef>>,
}

impl<S: AttemptSink> RefusalWatch<S> {
    fn new(inner: S) -> Self {
        Self {
            inner,
            refused: Mutex::new(Vec::new()),
        }
    }

    fn refused(&self) -> Vec<ModelRef> {
        self.refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl<S: AttemptSink> AttemptSink for RefusalWatch<S> {
    fn record(&self, attempt: Attempt) {
        if attempt.outcome == crate::llm::Outcome::Blocked {
            let model = ModelRef::new(attempt.provider.clone(), attempt.model.clone());
            let mut refused = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
            if !refused.contains(&model) {
                refused.push(model);
            }
        }
        self.inner.record(attempt);
    }
}

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

/// The metrics of one analysis round.
enum RoundMetrics {
    /// Kept from an earlier round of the same text: not asked for again.
    Kept(Metrics),
    /// Asked for in this round and answered.
    Answered(Metrics),
    Failed(CascadeError),
}

impl RoundMetrics {
    /// The metrics to store with an answer: defaults when none came.
    fn or_defaults(self, log: &DayLog) -> Metrics {
        match self {
            Self::Kept(metrics) | Self::Answered(metrics) => metrics,
            Self::Failed(error) => {
                tracing::warn!(log_id = log.id.get(), %error, "metrics cascade failed; defaults stored");
                Metrics::defaults()
            }
        }
    }

    /// The metrics this round got, if it asked for them.
    fn answered(self) -> Option<Metrics> {
        match self {
            Self::Answered(metrics) => Some(metrics),
            Self::Kept(_) | Self::Failed(_) => None,
        }
    }
}

/// Runs `work` while showing "typing…": Telegram shows it for 5 s, so it is renewed
/// every 4 s until the work is done.
async fn with_typing<M: Messenger, T>(
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

#[cfg(test)]
mod backlog_tests {
    use super::*;

    #[test]
    fn resumes_that_keep_finding_logs_are_spaced_like_one_logs_retries() {
        let start = tokio::time::Instant::now();
        let delay = |attempts: i64| Duration::from_secs(30 << attempts.min(7));
        let after = |secs| start + Duration::from_secs(secs);
        assert!(Backlog::default().allows(start, delay), "the first at once");
        let once = Backlog {
            at: Some(start),
            in_a_row: 1,
            ..Backlog::default()
        };
        assert!(!once.allows(after(29), delay));
        assert!(once.allows(after(30), delay));
        let thrice = Backlog {
            at: Some(start),
            in_a_row: 3,
            ..Backlog::default()
        };
        assert!(!thrice.allows(after(119), delay), "30 s, doubled twice");
        assert!(thrice.allows(after(120), delay));
    }
}
