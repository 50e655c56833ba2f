//! The journal: the life of a day log (docs/behaviour.md, The life of an entry), independent of the front end.
//!
//! Telegram (`bot`) and the terminal (`terminal`) both hand incoming entries to
//! [`Journal`] and give it a [`Messenger`](crate::frontend::Messenger) to answer
//! through; the background worker uses the same type to finish what an outage or a
//! crash left undone. The order is always: store first, then analyse, then store the
//! result, then answer, then record that the answer went out. A message being worked on
//! is *claimed* in memory — by `(chat_id, message_id)`, so a handler holds it from
//! before the insert — and the worker never races a handler; at start-up nothing is
//! claimed, so everything unfinished is picked up. A terminal entry's message id is
//! chosen by the insert itself, so its claim can only follow the insert: the worker
//! lists and claims under a gate that such an insert holds until it has claimed its
//! log, so it never sees one unclaimed. Results are stored only if the text they were
//! made from is still the log's text, so an edit that lands mid-analysis is analysed
//! again rather than overwritten.
//!
//! A file per stage of a log's life: `intake` (store first, claim), `voice`
//! (transcription), `analyse` (one round, returning an [`Outcome`](crate::domain::Outcome)
//! and messaging nobody), `reply` (the one reply to an outcome, live and late alike),
//! `unfinished` (what the worker resumes), and `lanes` (each chat's entries in order).
//! A front end's handler only stores: `accept_*` returns an [`Accepted`] entry, which
//! [`Journal::answer_accepted`] analyses and answers — after the chat's earlier entries,
//! and in a task of its own, so the chat's next update is stored at once rather than
//! held in memory behind an analysis.

mod analyse;
pub mod claims;
mod intake;
mod lanes;
mod reply;
mod unfinished;
mod voice;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use crate::cluster::ChatLease;
use crate::config::Settings;

use crate::language::Language;
use crate::llm::Llm;
use crate::store::{ChatId, DayLog, LogId, MessageId, Store, StoreError, UserId};
use crate::texts::Texts;
use crate::time::{Clock, SystemClock, UserZone};
use crate::users::Users;
use analyse::Backlog;
pub(crate) use analyse::keep_spent_budgets;
pub use analyse::retry_delay;
use lanes::{Lanes, Turn};
pub use reply::{Notes, Style, analysis_reply};

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

/// A voice or audio message from a user (docs/behaviour.md, Voice notes).
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

/// An in-memory claim on a message's log, released on drop; its value says whether an
/// edit came that could not claim it.
pub type Claim = claims::Claim<ClaimKey, bool>;

impl Claim {
    /// Whether the message was edited since it was claimed (or since the last call): its
    /// holder answers the new text too, rather than leaving it to the worker.
    fn take_edited(&self) -> bool {
        self.take()
    }
}

/// What a log is worked on under: this process's claim on its message and, among
/// instances (PostgreSQL), its chat's lease. Every message about the log goes out only
/// while the lease is in hand — checked right before the send, by the lease's own
/// deadline, and past that deadline by asking the database ([`ChatLease::confirm`]) —
/// and the log's outcome and the record of its answer are written only while the lease
/// is still the chat's (its fence, checked in the write's statement): an instance whose
/// chat was taken over (it stalled past its lease) neither sends nor records, and
/// leaves the log to the chat's new holder.
#[derive(Clone, Copy)]
struct Under<'a> {
    /// The log is worked on only while claimed: borrowed here so that it is.
    claim: &'a Claim,
    lease: Option<&'a ChatLease>,
}

impl<'a> Under<'a> {
    fn new(claim: &'a Claim, lease: Option<&'a ChatLease>) -> Self {
        Self {
            claim,
            // On SQLite the lock file keeps every other daemon out: nobody can take the
            // chat over, and nothing is checked.
            lease: lease.filter(|lease| lease.shared()),
        }
    }

    fn claim(&self) -> &'a Claim {
        self.claim
    }

    /// Whether the chat is still this instance's to answer in (always, without a
    /// lease to check).
    async fn holds(&self) -> bool {
        match self.lease {
            Some(lease) => lease.confirm().await,
            None => true,
        }
    }

    /// [`Under::holds`] before a message about `log` goes out; says so when not.
    async fn may_send(&self, log: &DayLog) -> bool {
        let holds = self.holds().await;
        if !holds {
            tracing::info!(
                log_id = log.id.get(),
                chat_id = log.chat_id.get(),
                "this instance no longer holds the chat's lease; its new holder answers the log"
            );
        }
        holds
    }

    /// What the log's writes check: the lease's fence.
    fn fence(&self) -> Option<crate::store::Fence> {
        self.lease.map(ChatLease::fence)
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

/// The journal of every user: what front ends and the worker go through for a log. Its
/// parts are its own; [`Journal::store`], [`Journal::users`], [`Journal::llm`] and
/// [`Journal::settings`] are there for the front ends' wiring, which hands the commands,
/// the digests and the reminders what each uses.
pub struct Journal {
    settings: Arc<Settings>,
    store: Store,
    llm: Arc<Llm>,
    claims: claims::ClaimSet<ClaimKey, bool>,
    /// Held (shared) by an insert that claims its log only after it (a terminal entry),
    /// and (exclusively) by the worker while it lists and claims unfinished logs.
    claim_gate: tokio::sync::RwLock<()>,
    /// What this process did but could not record (a full disk), so that the worker
    /// does not do it again on every poll for as long as the disk stays full.
    unrecorded: Mutex<Unrecorded>,
    /// The order of each chat's analyses (docs/behaviour.md, What arrives: a chat's updates in order).
    lanes: Lanes,
    /// Whether logs may wait out their retry schedule after a failure, and when they
    /// were last made due ([`Journal::resume_backlog`]).
    backlog: Mutex<Backlog>,
    /// The users' languages, zones and days, and the clock.
    users: Users,
    /// The records of answers sent, committed together when they come together.
    replied: reply::RepliedRecords,
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
        let users = Users::new(
            store.clone(),
            Arc::new(SystemClock),
            settings.journal.default_zone(),
            settings.journal.day_starts_hour(),
        );
        Self {
            settings,
            store,
            llm,
            claims: claims::ClaimSet::default(),
            claim_gate: tokio::sync::RwLock::new(()),
            unrecorded: Mutex::default(),
            lanes: Lanes::default(),
            backlog: Mutex::default(),
            users,
            replied: reply::RepliedRecords::default(),
        }
    }

    /// The same journal reading "now" from `clock` (tests drive time with it).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.users = self.users.with_clock(clock);
        self
    }

    /// The users service the journal reads authors through, for the front ends to hand
    /// the commands, the digest and the reminders.
    pub fn users(&self) -> &Users {
        &self.users
    }

    /// The settings the journal runs with.
    pub fn settings(&self) -> &Arc<Settings> {
        &self.settings
    }

    /// The store, for the front ends to hand the commands, the digests, the reminders and
    /// the import: what a log goes through is the journal's own methods.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The LLM layer the journal asks, for the front ends to hand the digests.
    pub fn llm(&self) -> &Arc<Llm> {
        &self.llm
    }

    /// Whether this Telegram user may use the bot (an empty allowed list: everyone).
    pub fn is_allowed(&self, user_id: UserId) -> bool {
        self.settings.telegram.is_allowed(user_id.get())
    }

    /// Now, by the one clock of the process.
    pub fn now(&self) -> jiff::Timestamp {
        self.users.now()
    }

    /// The local day `at` belongs to in `zone` ([`Users::local_day`]).
    pub fn local_day(&self, zone: &UserZone, at: jiff::Timestamp) -> jiff::civil::Date {
        self.users.local_day(zone, at)
    }

    fn unrecorded(&self) -> std::sync::MutexGuard<'_, Unrecorded> {
        self.unrecorded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Claims a message's log for this process; `None` when someone is already on it.
    pub fn claim(&self, chat_id: ChatId, message_id: MessageId) -> Option<Claim> {
        self.claims.claim((chat_id, message_id))
    }

    /// Tells the holder of a claimed message that its text changed (see
    /// [`Claim::take_edited`]).
    fn mark_edited(&self, chat_id: ChatId, message_id: MessageId) {
        self.claims
            .update(&(chat_id, message_id), |edited| *edited = true);
    }

    /// A log's author as stored, with the fallbacks of [`Users::language_of`] and
    /// [`Users::zone_of`] (English and the default zone for a user the store does not
    /// have or cannot read), in one read.
    async fn author_of(&self, user_id: UserId) -> Author {
        match self.store.user(user_id).await {
            Ok(Some(user)) => Author {
                language: user.language(),
                zone: user.timezone.clone(),
            },
            Ok(None) => Author {
                language: Language::default(),
                zone: self.users.default_zone().clone(),
            },
            Err(error) => {
                tracing::warn!(%error, user_id = user_id.get(), "could not read the user's language and zone");
                Author {
                    language: Language::default(),
                    zone: self.users.default_zone().clone(),
                }
            }
        }
    }
}
