//! The Telegram front end: the update inbox and its sources (long polling here; a
//! webhook beside it), the handler tree in one function, and a [`Messenger`] that sends
//! [`Response`]s as Telegram messages.
//!
//! Every update is committed to the inbox (`inbox`) before Telegram may forget it —
//! `intake` confirms a polled batch only then — and handled from there: a chat's updates
//! in order, different chats concurrently (`inbox/handling`). An entry's handler only
//! stores it (its update handled in the same transaction) and hands its analysis to
//! [`Answers`], which answers a chat's entries in the order they came (commands are not
//! held behind analyses: their replies may come first; a slow one — `/week`, an import
//! — runs in a task of its own, its update handled when it ends). [`Running`] is what
//! runs whatever the source: the inbox's loop, the worker, the reminders, retention.
//!
//! Cancelling the stop token (the process does that on SIGINT and SIGTERM, see `app`)
//! stops polling, lets in-flight work finish within `telegram.shutdown_grace_ms`, and
//! returns.
//!
//! Start-up calls (`getMe`, the command menu, the webhook check) are retried with backoff
//! while Telegram has passing trouble (5xx, 429, the network): only 401/404 mean a bad
//! token. Every start-up and shutdown step gives way to the stop signal, so a Bot API
//! that hangs cannot hold a stop past the grace period (Docker kills after its own).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use backon::{ExponentialBuilder, Retryable as _};
use dptree::HandlerDescription as _;
use futures::{FutureExt as _, StreamExt as _};
use teloxide::adaptors::throttle::Limits;
use teloxide::dispatching::{DpHandlerDescription, UpdateHandler, dialogue::GetChatId};
use teloxide::net::Download;
use teloxide::prelude::*;
use teloxide::types::FileId;
use teloxide::types::{
    BotCommand, ChatAction, InlineKeyboardButton, InlineKeyboardMarkup, InputFile, Me, MessageId,
    MessageKind, ParseMode, ReplyParameters,
};
use teloxide::{ApiError, RequestError};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cluster::Leases;
use crate::commands::{self, Command};
use crate::config::Settings;
use crate::digest::Digests;
use crate::frontend::{FetchError, MAX_VOICE_BYTES, Messenger, Response, SendError, Target};
use crate::journal::{Accepted, EntryError, Incoming, IncomingVoice, Journal};
use crate::language::Language;
use crate::llm::Audio;
use crate::render::{self, Reply, TELEGRAM_MESSAGE_LIMIT};
use crate::store::{FrontEnd, Store, UserId};
use crate::texts::Texts;
use crate::users::Users;
use crate::worker;
use delete_button::{DeleteAnswer, DeleteButton};
use inbox::{Deferred, LeaseLost, Taking, UnderLease};

mod delete_button;
mod inbox;
mod intake;
pub mod menu_button;
pub mod webhook;
pub use inbox::{Inbox, NotSaved, Notice, NoticeKind, ReceiveError, Received};

/// What the bot needs of a Bot API client: `Bot`, or `Throttle<Bot>` when
/// `telegram.throttle` is on. Downloads (voice notes) go through the same client and
/// the configured Bot API URL (`{TELOXIDE_API_URL}/file/bot<token>/<file_path>`).
pub trait TgBot:
    Requester<Err = RequestError, GetUpdates: Send>
    + Download<StreamErr = reqwest::Error>
    + Clone
    + Send
    + Sync
    + 'static
{
}
impl<T> TgBot for T where
    T: Requester<Err = RequestError, GetUpdates: Send>
        + Download<StreamErr = reqwest::Error>
        + Clone
        + Send
        + Sync
        + 'static
{
}

type HandlerResult = Result<(), anyhow::Error>;

/// Telegram's `RetryAfter` is honoured this many times per request.
const MAX_TELEGRAM_RETRIES: u32 = 5;
/// Backoff of the start-up calls while Telegram has passing trouble.
const START_MIN_DELAY: Duration = Duration::from_millis(500);
const START_MAX_DELAY: Duration = Duration::from_secs(30);
/// Retries of one language's command menu before start-up goes on without it.
const MENU_RETRIES: usize = 4;
/// Sends [`Response`]s through the Bot API.
#[derive(Clone)]
pub struct Telegram<B> {
    bot: B,
    /// When each user last sent `/import` (docs/behaviour.md, Search and Import: a document within 10 minutes of it
    /// is an import). Stored (`said_once`) when the store is given, so that a restart
    /// or another instance takes it; this copy answers only while the store cannot.
    import_asked: Arc<std::sync::Mutex<std::collections::HashMap<UserId, jiff::Timestamp>>>,
    /// Where what is said once, `/import`'s window and Telegram's 429 holds are shared
    /// (across restarts, and on PostgreSQL across instances); `None`: in memory only.
    store: Option<Store>,
    /// Telegram's 429 holds as this instance knows them (with `store` only).
    held: Arc<Holds>,
    /// Chats already told that this is a private bot (docs/behaviour.md, What arrives: one polite refusal, not
    /// one per message, which in a group would flood it).
    refused: Once<i64>,
    /// Albums (media groups) already told that only text is kept: one answer for ten
    /// photos sent together, not ten.
    albums: Once<String>,
}

/// A document sent this long after `/import` is imported without the caption.
const IMPORT_WINDOW: Duration = Duration::from_secs(10 * 60);

/// Keys seen before, to say something once. Claimed in the store's `said_once` (named
/// `what`) when the [`Telegram`] has one, so that neither a restart nor another instance
/// says it again; this set spares the store a question for keys seen here, and
/// answers alone while the store cannot (then a restart may say it once more). Past
/// [`Once::MAX`] keys (what strangers can make it hold) the set starts over.
struct Once<K> {
    what: &'static str,
    seen: Arc<std::sync::Mutex<std::collections::HashSet<K>>>,
}

impl<K> Clone for Once<K> {
    fn clone(&self) -> Self {
        Self {
            what: self.what,
            seen: Arc::clone(&self.seen),
        }
    }
}

impl<K: std::hash::Hash + Eq + std::fmt::Display> Once<K> {
    const MAX: usize = 100_000;

    fn new(what: &'static str) -> Self {
        Self {
            what,
            seen: Arc::default(),
        }
    }

    /// Says something once for `key`: `say` (a send, `true` once delivered) runs the
    /// first time `key` comes, and again the next time if it did not get through.
    async fn say(&self, store: Option<&Store>, key: K, say: impl Future<Output = bool>)
    where
        K: Clone,
    {
        if !self.first(key.clone()) {
            return;
        }
        let name = key.to_string();
        if let Some(store) = store {
            match store.say_once(self.what, &name).await {
                Ok(true) => {}
                // Said before: by another instance, or before a restart.
                Ok(false) => return,
                Err(error) => {
                    tracing::warn!(%error, what = self.what, "could not check what was said once; saying it");
                }
            }
        }
        if !say.await {
            self.forget(&key);
            if let Some(store) = store
                && let Err(error) = store.forget_said(self.what, &name).await
            {
                tracing::warn!(%error, what = self.what, "could not forget a notice that did not get through");
            }
        }
    }

    /// `true` the first time `key` comes. It is marked at once, not after the send,
    /// so that what comes meanwhile is not answered too.
    fn first(&self, key: K) -> bool {
        let mut seen = self.seen();
        if seen.len() >= Self::MAX {
            seen.clear();
        }
        seen.insert(key)
    }

    fn forget(&self, key: &K) {
        self.seen().remove(key);
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<K>> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl<B: TgBot> Telegram<B> {
    pub fn new(bot: B) -> Self {
        Self {
            bot,
            import_asked: Arc::default(),
            store: None,
            held: Arc::default(),
            refused: Once::new("refused"),
            albums: Once::new("album"),
        }
    }

    /// The same messenger, keeping what is said once, `/import`'s window and Telegram's
    /// 429 holds in `store` (docs/behaviour.md, Several instances).
    #[must_use]
    pub fn sharing(mut self, store: Store) -> Self {
        self.store = Some(store);
        self
    }

    async fn asked_import(&self, user_id: UserId, at: jiff::Timestamp) {
        self.import_asked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(user_id, at);
        if let Some(store) = &self.store
            && let Err(error) = store.ask_import(user_id, at).await
        {
            tracing::warn!(%error, "could not store an /import; this instance remembers it");
        }
    }

    /// Whether `user_id` sent `/import` within [`IMPORT_WINDOW`] before `now`; the ask is
    /// used up either way (here and in the store).
    async fn take_import_ask(&self, user_id: UserId, now: jiff::Timestamp) -> bool {
        let here = self
            .import_asked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&user_id);
        let asked = match &self.store {
            Some(store) => match store.take_import_ask(user_id).await {
                // Not stored here (storing failed) but remembered here: still an ask.
                Ok(stored) => stored.or(here),
                Err(error) => {
                    tracing::warn!(%error, "could not read a stored /import; using this instance's");
                    here
                }
            },
            None => here,
        };
        asked.is_some_and(|at| {
            let elapsed = now.duration_since(at);
            !elapsed.is_negative() && elapsed.unsigned_abs() <= IMPORT_WINDOW
        })
    }

    /// The store that shares Telegram's holds on `chat`, for [`with_retry_after_in`].
    fn holds(&self, chat: ChatId) -> Option<Shared<'_>> {
        self.store.as_ref().map(|store| Shared {
            store,
            held: &self.held,
            chat: chat.0,
        })
    }

    /// `getFile`, then the download into memory; `None` past `max` bytes.
    async fn fetch_bytes(&self, file_id: &str, max: u64) -> Result<(String, Vec<u8>), FetchError> {
        let file = with_retry_after("getFile", || {
            self.bot.get_file(FileId(file_id.to_owned())).into_future()
        })
        .await
        .map_err(|e| match classify(e) {
            // Telegram's one wording for a wrong id and a file it cannot serve for
            // now: a stored voice note's id is not wrong, so it is tried again
            // (docs/behaviour.md, Voice notes), up to `voice.fetch_max_tries` times.
            SendError::Refused(reason) if reason.contains("temporarily unavailable") => {
                FetchError::Refused(reason)
            }
            SendError::Gone(reason) | SendError::Refused(reason) => FetchError::Gone(reason),
            SendError::Transient(reason) => FetchError::Transient(reason),
        })?;
        if u64::from(file.meta.size) > max {
            return Err(FetchError::Gone(format!(
                "{} bytes, over the download limit",
                file.meta.size
            )));
        }
        let stream = self.bot.download_file_stream(&file.path);
        tokio::pin!(stream);
        let mut bytes = Vec::with_capacity(usize::try_from(file.meta.size).unwrap_or(0));
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                // A 4xx says the file is not there, except a timeout or a rate limit.
                let gone = e.status().is_some_and(|s| {
                    s.is_client_error()
                        && s != reqwest::StatusCode::REQUEST_TIMEOUT
                        && s != reqwest::StatusCode::TOO_MANY_REQUESTS
                });
                let reason = e.without_url().to_string();
                if gone {
                    FetchError::Gone(reason)
                } else {
                    FetchError::Transient(reason)
                }
            })?;
            bytes.extend_from_slice(&chunk);
            if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > max {
                return Err(FetchError::Gone(format!(
                    "the download exceeds {max} bytes"
                )));
            }
        }
        Ok((file.path, bytes))
    }

    /// Sends `response`, which may be several Bot API messages (a long text in parts),
    /// skipping the first `done` of them and counting each one that goes out in `done`,
    /// so that a failed part is tried again without the parts before it.
    async fn send_one(
        &self,
        target: Target,
        response: &Response,
        done: &mut usize,
    ) -> Result<(), RequestError> {
        let chat = ChatId(target.chat_id.get());
        let reply_to = target
            .reply_to
            .and_then(|id| i32::try_from(id.get()).ok())
            .map(|id| ReplyParameters::new(MessageId(id)).allow_sending_without_reply());
        // In a group every message about an entry or a command is a reply to it: in a
        // forum supergroup a message that is no reply goes to the General topic, away
        // from the topic it answers; and in a busy group it says whose it is. A private
        // chat quotes only the first part.
        let in_group = target.chat_id.get() < 0;
        let attached = if in_group { reply_to.clone() } else { None };
        match response {
            Response::Text(reply) => {
                return self.send_text(chat, reply, reply_to, in_group, done).await;
            }
            Response::Photo {
                png,
                caption,
                file_name,
            } => {
                with_retry_after_in("sendPhoto", self.holds(chat), || {
                    let mut request = self
                        .bot
                        .send_photo(
                            chat,
                            InputFile::memory(png.clone()).file_name(file_name.clone()),
                        )
                        .caption(caption.clone());
                    if let Some(r) = attached.clone() {
                        request = request.reply_parameters(r);
                    }
                    request.into_future()
                })
                .await?;
            }
            Response::Document {
                bytes,
                file_name,
                caption,
            } => {
                with_retry_after_in("sendDocument", self.holds(chat), || {
                    let mut request = self
                        .bot
                        .send_document(
                            chat,
                            InputFile::memory(bytes.clone()).file_name(file_name.clone()),
                        )
                        .caption(caption.clone());
                    if let Some(r) = attached.clone() {
                        request = request.reply_parameters(r);
                    }
                    request.into_future()
                })
                .await?;
            }
            Response::ConfirmDelete { language, user_id } => {
                let texts = Texts(*language);
                let keyboard = InlineKeyboardMarkup::new([[
                    InlineKeyboardButton::callback(
                        texts.delete_yes(),
                        DeleteButton::new(DeleteAnswer::Yes, *user_id).data(),
                    ),
                    InlineKeyboardButton::callback(
                        texts.delete_no(),
                        DeleteButton::new(DeleteAnswer::No, *user_id).data(),
                    ),
                ]]);
                with_retry_after_in("sendMessage", self.holds(chat), || {
                    let mut request = self
                        .bot
                        .send_message(chat, texts.delete_confirm())
                        .reply_markup(keyboard.clone());
                    if let Some(r) = attached.clone() {
                        request = request.reply_parameters(r);
                    }
                    request.into_future()
                })
                .await?;
            }
            Response::OpenApp { text, button, url } => {
                menu_button::send_open_app(&self.bot, chat, text, button, url, attached.clone())
                    .await?;
            }
        }
        // Every other response is one message.
        *done += 1;
        Ok(())
    }

    /// Sends a text reply in as many messages as Telegram's limit needs, from part
    /// `done` on (see [`Telegram::send_one`]). Only the first part quotes the message it
    /// answers, but in a group every part does.
    async fn send_text(
        &self,
        chat: ChatId,
        reply: &Reply,
        reply_to: Option<ReplyParameters>,
        in_group: bool,
        done: &mut usize,
    ) -> Result<(), RequestError> {
        let parts = render::split_message(reply.pieces(), TELEGRAM_MESSAGE_LIMIT);
        for (i, part) in parts.into_iter().enumerate().skip(*done) {
            let reply_to = if i == 0 || in_group {
                reply_to.clone()
            } else {
                None
            };
            let send = |text: String, html: bool| {
                let mut request = self.bot.send_message(chat, text);
                if html {
                    request = request.parse_mode(ParseMode::Html);
                }
                if let Some(r) = reply_to.clone() {
                    request = request.reply_parameters(r);
                }
                request.into_future()
            };
            match with_retry_after_in("sendMessage", self.holds(chat), || send(part.clone(), true))
                .await
            {
                Err(RequestError::Api(ApiError::CantParseEntities(reason))) => {
                    // Our escaping should make this impossible; if Telegram still
                    // disagrees, the user gets the words without the formatting.
                    tracing::error!(%reason, "Telegram could not parse a reply's HTML; sending it as plain text");
                    let plain = render::html_to_plain(&part);
                    with_retry_after_in("sendMessage", self.holds(chat), || {
                        send(plain.clone(), false)
                    })
                    .await?;
                }
                other => {
                    other?;
                }
            }
            *done += 1;
        }
        Ok(())
    }
}

impl<B: TgBot> Messenger for Telegram<B> {
    /// The parts in order. The callers' retry sends a message whole again (a digest's
    /// text twice for a failed chart, a long reply's first part twice), so once a part
    /// has reached the user a later one that fails for a passing reason is first tried
    /// again on its own, a few times; only if it still fails does the send fail (the
    /// whole answer twice rather than half of it once). A later part Telegram refuses
    /// (a chart it could not process) says nothing about the chat: it and the rest are
    /// given up, loudly, and the message counts as delivered.
    async fn send(&self, target: Target, responses: Vec<Response>) -> Result<(), SendError> {
        let mut target = target;
        let mut moved = false;
        // Messages that reached the user, of the responses before this one.
        let mut delivered = 0;
        for response in &responses {
            let mut done = 0;
            let mut pauses = LATER_PART_PAUSES.iter();
            loop {
                let error = match self.send_one(target, response, &mut done).await {
                    Ok(()) => break,
                    // A group made a supergroup has a new id, and its messages new ids:
                    // what was owed to it goes to the new chat, as a plain message.
                    Err(RequestError::MigrateToChatId(to)) if !moved => {
                        tracing::info!(
                            chat_id = target.chat_id.get(),
                            to = to.0,
                            "the group became a supergroup; sending there"
                        );
                        (target, moved) = (Target::chat(crate::domain::ChatId(to.0)), true);
                        continue;
                    }
                    Err(error) => classify(error),
                };
                if delivered + done == 0 {
                    return Err(error);
                }
                match (error, pauses.next()) {
                    (SendError::Transient(reason), Some(pause)) => {
                        tracing::debug!(chat_id = target.chat_id.get(), %reason, "a later part of a message failed; trying it again");
                        tokio::time::sleep(*pause).await;
                    }
                    // Still failing: the caller sends it all again later. Its first
                    // parts twice, but the whole answer, rather than an answer cut short.
                    (error @ SendError::Transient(_), None) => return Err(error),
                    (SendError::Gone(reason) | SendError::Refused(reason), _) => {
                        tracing::warn!(
                            chat_id = target.chat_id.get(),
                            delivered = delivered + done,
                            %reason,
                            "Telegram refused a later part of a message; the parts before it were delivered, so it is not sent again"
                        );
                        return Ok(());
                    }
                }
            }
            delivered += done;
        }
        Ok(())
    }

    /// `getFile`, then the download, collected in memory and cut off past Telegram's
    /// 20 MB limit (a server that sends more is not believed).
    async fn fetch_audio(&self, file_id: &str) -> Result<Audio, FetchError> {
        let (path, bytes) = self.fetch_bytes(file_id, MAX_VOICE_BYTES).await?;
        Ok(Audio::named(&path, bytes.into()))
    }

    async fn typing(&self, chat_id: crate::domain::ChatId) {
        let bot = self.bot.clone();
        let chat_id = chat_id.get();
        tokio::spawn(async move {
            if let Err(error) = bot
                .send_chat_action(ChatId(chat_id), ChatAction::Typing)
                .await
            {
                tracing::debug!(%error, chat_id, "typing action failed");
            }
        });
    }
}

/// How a Bot API call ended, as a fixed word for [`crate::observe::telegram_call`].
fn call_status<T>(result: &Result<T, RequestError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(RequestError::RetryAfter(_)) => "retry_after",
        Err(RequestError::Api(_)) => "api_error",
        Err(RequestError::MigrateToChatId(_)) => "migrated",
        Err(RequestError::Network(_) | RequestError::Io(_)) => "network",
        Err(_) => "error",
    }
}

/// The pauses before a later part of a message is tried again (see `Telegram::send`).
const LATER_PART_PAUSES: [Duration; 2] = [Duration::from_millis(500), Duration::from_secs(2)];

/// Runs a Bot API request, waiting out Telegram's `RetryAfter` a few times. Each
/// attempt is counted by `method`, as the Bot API spells it (`sendMessage`).
async fn with_retry_after<T, F, Fut>(method: &'static str, request: F) -> Result<T, RequestError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, RequestError>>,
{
    with_retry_after_in(method, None, request).await
}

/// The longest a hold another instance recorded is waited out before one send (a
/// hold is Telegram's own `retry_after`; this only bounds a hand-edited row).
const MAX_SHARED_HOLD: Duration = Duration::from_secs(60);

/// [`with_retry_after`] for a message to a chat, with Telegram's holds shared through
/// `store` (PostgreSQL: every instance together): a hold any instance recorded for the
/// chat (or for every chat) is waited out before each try, and a `RetryAfter` is
/// recorded for the others before it is waited out here.
async fn with_retry_after_in<T, F, Fut>(
    method: &'static str,
    shared: Option<Shared<'_>>,
    mut request: F,
) -> Result<T, RequestError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, RequestError>>,
{
    let mut retries = 0;
    loop {
        if let Some(shared) = &shared {
            shared.honour().await;
        }
        let result = request().await;
        crate::observe::telegram_call(method, call_status(&result));
        match result {
            Err(RequestError::RetryAfter(wait)) if retries < MAX_TELEGRAM_RETRIES => {
                retries += 1;
                tracing::warn!(wait_s = wait.seconds(), "Telegram asked to retry later");
                if let Some(shared) = &shared {
                    shared.record(wait.duration()).await;
                }
                tokio::time::sleep(wait.duration()).await;
            }
            other => return other,
        }
    }
}

/// The longest the store is waited on for its holds before a send, or to record one:
/// a database that is slow or gone is no reason not to send (Telegram says so itself).
const SHARED_HOLD_TIMEOUT: Duration = Duration::from_millis(200);
/// How long a read of the store's holds is taken as current: sends in between (the
/// parts of one reply, other chats) read no more than this instance's copy.
const HOLDS_FRESH: Duration = Duration::from_millis(500);
/// After a 429 on one chat, every chat is held this long (at most the 429's own wait):
/// Telegram's flood limit counts the bot's messages to all chats together.
const ALL_CHATS_HOLD: Duration = Duration::from_secs(1);

/// Telegram's holds as this instance knows them: those it recorded itself, and those
/// the store held at its last read (at most [`HOLDS_FRESH`] ago). Key 0: every chat.
#[derive(Default)]
struct Holds {
    known: std::sync::Mutex<KnownHolds>,
}

#[derive(Default)]
struct KnownHolds {
    read_at: Option<tokio::time::Instant>,
    until: std::collections::HashMap<i64, tokio::time::Instant>,
}

impl Holds {
    fn known(&self) -> std::sync::MutexGuard<'_, KnownHolds> {
        self.known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the store's holds are due a read; if so the read is taken as begun, so
    /// that sends meanwhile do not read too.
    fn read_due(&self, now: tokio::time::Instant) -> bool {
        let mut known = self.known();
        let due = known
            .read_at
            .is_none_or(|at| now.saturating_duration_since(at) >= HOLDS_FRESH);
        if due {
            known.read_at = Some(now);
        }
        due
    }

    /// `chat` (0: every chat) held for `hold` from `now`, unless held longer already.
    fn hold(&self, chat: i64, now: tokio::time::Instant, hold: Duration) {
        let until = now + hold.min(MAX_SHARED_HOLD);
        let mut known = self.known();
        let entry = known.until.entry(chat).or_insert(until);
        *entry = (*entry).max(until);
    }

    /// How long a send to `chat` waits from `now`; holds that are over are forgotten.
    fn wait(&self, chat: i64, now: tokio::time::Instant) -> Duration {
        let mut known = self.known();
        known.until.retain(|_, until| *until > now);
        [chat, 0]
            .iter()
            .filter_map(|key| known.until.get(key))
            .map(|until| until.saturating_duration_since(now))
            .max()
            .unwrap_or_default()
    }

    /// Waits out what holds `chat`, after reading the store's holds with `read` when
    /// they are due (given at most [`SHARED_HOLD_TIMEOUT`]; on failure: what is known).
    async fn honour<E: std::fmt::Display>(
        &self,
        chat: i64,
        read: impl Future<Output = Result<Vec<(i64, Duration)>, E>>,
    ) {
        let now = tokio::time::Instant::now();
        if self.read_due(now) {
            match tokio::time::timeout(SHARED_HOLD_TIMEOUT, read).await {
                Ok(Ok(holds)) => {
                    for (held, left) in holds {
                        self.hold(held, now, left);
                    }
                }
                Ok(Err(error)) => tracing::debug!(%error, "could not read Telegram's shared holds"),
                Err(_) => tracing::debug!("Telegram's shared holds not read in time; sending"),
            }
        }
        let wait = self.wait(chat, tokio::time::Instant::now());
        if !wait.is_zero() {
            tracing::debug!(
                hold_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                "Telegram asked an instance to wait: waiting before this send"
            );
            tokio::time::sleep(wait).await;
        }
    }
}

/// Telegram's holds on one chat, shared through a store (PostgreSQL: every instance).
struct Shared<'a> {
    store: &'a Store,
    held: &'a Holds,
    chat: i64,
}

impl Shared<'_> {
    /// Waits out a hold on the chat (or on every chat) that some instance's 429 recorded.
    async fn honour(&self) {
        self.held
            .honour(self.chat, self.store.telegram_holds())
            .await;
    }

    /// A 429 that asked to wait `wait`: the chat held that long, and every chat for a
    /// moment ([`ALL_CHATS_HOLD`]), here and for the other instances.
    async fn record(&self, wait: Duration) {
        let now = tokio::time::Instant::now();
        let all = wait.min(ALL_CHATS_HOLD);
        self.held.hold(self.chat, now, wait);
        self.held.hold(0, now, all);
        let chat = crate::domain::ChatId(self.chat);
        let share = async {
            self.store.hold_telegram(Some(chat), wait).await?;
            self.store.hold_telegram(None, all).await
        };
        match tokio::time::timeout(SHARED_HOLD_TIMEOUT, share).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "could not share Telegram's retry_after"),
            Err(_) => tracing::warn!("Telegram's retry_after not shared in time"),
        }
    }
}

/// Sorts a Bot API failure: API refusals are final, transport trouble is worth a retry.
fn classify(error: RequestError) -> SendError {
    match error {
        RequestError::Api(
            api @ (ApiError::BotBlocked
            | ApiError::UserDeactivated
            | ApiError::ChatNotFound
            | ApiError::BotKicked
            | ApiError::BotKickedFromSupergroup
            | ApiError::CantInitiateConversation
            | ApiError::CantTalkWithBots),
        ) => SendError::Gone(api.to_string()),
        RequestError::Api(ApiError::Unknown(description)) if is_passing_refusal(&description) => {
            SendError::Transient(description)
        }
        // Telegram's current wording of "this chat is closed to the bot" (kicked from a
        // group, not a member, a private chat never opened), which teloxide knows only
        // in older spellings.
        RequestError::Api(ApiError::Unknown(description))
            if description.starts_with("Forbidden:") =>
        {
            SendError::Gone(description)
        }
        RequestError::Api(api @ ApiError::GroupDeactivated) => SendError::Gone(api.to_string()),
        RequestError::Api(api) => {
            // Any other refusal will not change on a retry, but it is about this
            // message (most likely our bug), not the chat; the log says which.
            tracing::error!(error = %api, "Telegram refused a message");
            SendError::Refused(api.to_string())
        }
        // Only when the new chat refused it too (`Telegram::send` follows the move once).
        RequestError::MigrateToChatId(_) => SendError::Gone("the chat moved".to_owned()),
        other => SendError::Transient(other.to_string()),
    }
}

/// An unknown API error that passes: a 5xx ([`is_server_trouble`]), or a 429 without
/// `retry_after` (teloxide turns only a 429 that carries one into `RetryAfter`), which
/// would otherwise be taken for a refusal of the message and the answer given up.
fn is_passing_refusal(description: &str) -> bool {
    is_server_trouble(description) || description.starts_with("Too Many Requests")
}

/// Telegram's own 5xx answers reach teloxide as unknown API errors; they are worth a
/// retry, unlike a refusal.
fn is_server_trouble(description: &str) -> bool {
    const TRANSIENT: [&str; 4] = [
        "Internal Server Error",
        "Bad Gateway",
        "Service Unavailable",
        "Gateway Timeout",
    ];
    TRANSIENT.iter().any(|t| description.contains(t))
}

fn incoming(msg: &Message, text: String) -> Option<Incoming> {
    let from = msg.from.as_ref()?;
    Some(Incoming {
        user_id: user_id_of(from.id)?,
        chat_id: chat_of(msg),
        message_id: crate::domain::MessageId(i64::from(msg.id.0)),
        username: from.username.clone(),
        language_code: from.language_code.clone(),
        text,
        sent_at: jiff::Timestamp::from_second(msg.date.timestamp()).ok(),
    })
}

/// A `voice` or `audio` message, as the journal takes it.
fn incoming_voice(msg: &Message) -> Option<IncomingVoice> {
    let (file, duration) = match (msg.voice(), msg.audio()) {
        (Some(voice), _) => (&voice.file, voice.duration),
        (None, Some(audio)) => (&audio.file, audio.duration),
        (None, None) => return None,
    };
    let from = msg.from.as_ref()?;
    Some(IncomingVoice {
        user_id: user_id_of(from.id)?,
        chat_id: chat_of(msg),
        message_id: crate::domain::MessageId(i64::from(msg.id.0)),
        username: from.username.clone(),
        language_code: from.language_code.clone(),
        file_id: file.id.0.clone(),
        duration_s: Some(duration.seconds()),
        // Telegram leaves the size out when it does not know it (0 here).
        file_size: (file.size > 0).then_some(u64::from(file.size)),
        sent_at: jiff::Timestamp::from_second(msg.date.timestamp()).ok(),
    })
}

fn sender_id(msg: &Message) -> Option<UserId> {
    msg.from.as_ref().and_then(|u| user_id_of(u.id))
}

/// A Telegram user's id as daylog types it (Telegram's are below 2^52).
fn user_id_of(id: teloxide::types::UserId) -> Option<UserId> {
    i64::try_from(id.0).ok().map(UserId)
}

/// The chat of `msg` as daylog types it.
fn chat_of(msg: &Message) -> crate::domain::ChatId {
    crate::domain::ChatId(msg.chat.id.0)
}

/// The handler tree: every update kind the bot answers, in one place.
pub fn schema<B: TgBot>() -> UpdateHandler<anyhow::Error> {
    let messages = Update::filter_message()
        .branch(dptree::filter(|msg: Message| is_service(&msg)).endpoint(on_service))
        .branch(
            dptree::filter(|msg: Message, journal: Arc<Journal>| !allowed(&msg, &journal))
                .endpoint(refuse::<B>),
        )
        // Before the commands, which read a caption as a command: a voice note captioned
        // "/week summary" is still a voice note to keep (docs/behaviour.md, The life of an entry), not a command that
        // drops the recording. (A document captioned `/import` is the import.)
        .branch(dptree::filter_map(|msg: Message| incoming_voice(&msg)).endpoint(on_voice::<B>))
        .branch(
            dptree::entry()
                .filter_command::<Command>()
                .endpoint(on_command::<B>),
        )
        .branch(
            dptree::filter(|msg: Message| is_command_like(&msg)).endpoint(on_unknown_command::<B>),
        )
        .branch(
            dptree::filter_map(|msg: Message| msg.text().map(str::to_owned)).endpoint(on_text::<B>),
        )
        .branch(
            dptree::filter_map(|msg: Message| msg.document().cloned()).endpoint(on_document::<B>),
        )
        .branch(
            dptree::filter_map(|msg: Message| msg.location().cloned()).endpoint(on_location::<B>),
        )
        .branch(dptree::endpoint(on_other::<B>));
    let edits = Update::filter_edited_message()
        .filter(|msg: Message, journal: Arc<Journal>| allowed(&msg, &journal))
        .filter(|msg: Message| !is_command_like(&msg))
        .filter_map(|msg: Message| msg.text().map(str::to_owned))
        .endpoint(on_edit::<B>);
    let callbacks = Update::filter_callback_query().endpoint(on_callback::<B>);
    unwinding().chain(
        dptree::entry()
            .branch(messages)
            .branch(edits)
            .branch(callbacks),
    )
}

/// Catches a handler's panic, so that it ends that update only, as a failure: the inbox
/// tries it again later and, after its last try, marks it dead, and its chat moves on.
/// The panic itself is logged by the hook `telemetry::init` installs.
fn unwinding() -> dptree::Handler<'static, HandlerResult, DpHandlerDescription> {
    dptree::from_fn_with_description(
        DpHandlerDescription::entry(),
        |deps, cont| async move {
            match std::panic::AssertUnwindSafe(cont(deps))
                .catch_unwind()
                .await
            {
                Ok(flow) => flow,
                Err(_) => {
                    tracing::error!("an update's handler panicked; it is tried again later");
                    std::ops::ControlFlow::Break(Err(anyhow::anyhow!("the handler panicked")))
                }
            }
        },
        dptree::HandlerSignature::Entry,
    )
}

/// A service message, which Telegram delivers to every bot in a chat: a member joined
/// or left, a message was pinned, the bot was added to a group, a timer changed. Nobody
/// wrote it: it is neither an entry nor asked for an answer.
fn is_service(msg: &Message) -> bool {
    !matches!(msg.kind, MessageKind::Common(_) | MessageKind::Dice(_))
}

async fn on_service(msg: Message) -> HandlerResult {
    tracing::debug!(chat_id = msg.chat.id.0, "service message ignored");
    Ok(())
}

/// The first word of `text` as a command: its name (`/import`) and the bot it is
/// addressed to (`/import@daylog_bot`), if any.
fn command_word(text: &str) -> Option<(&str, Option<&str>)> {
    let word = text.split_whitespace().next()?;
    word.starts_with('/').then(|| {
        word.split_once('@')
            .map_or((word, None), |(name, bot)| (name, Some(bot)))
    })
}

/// A command addressed to another bot (`/stats@OtherBot` in a group): that bot's to answer.
fn for_another_bot(text: &str, bot: &str) -> bool {
    command_word(text)
        .and_then(|(_, to)| to)
        .is_some_and(|to| !to.eq_ignore_ascii_case(bot))
}

/// `/something`: a command, even one this bot does not know — never a journal entry.
fn is_command_like(msg: &Message) -> bool {
    msg.text().is_some_and(|t| {
        t.strip_prefix('/')
            .and_then(|rest| rest.chars().next())
            .is_some_and(|c| c.is_ascii_alphabetic())
    })
}

async fn on_unknown_command<B: TgBot>(
    msg: Message,
    journal: Arc<Journal>,
    messenger: Arc<Telegram<B>>,
    me: Me,
) -> HandlerResult {
    if msg
        .text()
        .is_some_and(|text| for_another_bot(text, me.username()))
    {
        return Ok(());
    }
    answer_in_language(&msg, &journal, &messenger, Texts::unknown_command).await;
    Ok(())
}

fn allowed(msg: &Message, journal: &Journal) -> bool {
    sender_id(msg).is_some_and(|id| journal.is_allowed(id))
}

async fn refuse<B: TgBot>(msg: Message, messenger: Arc<Telegram<B>>) -> HandlerResult {
    let language = Language::from_code(msg.from.as_ref().and_then(|u| u.language_code.as_deref()));
    tracing::info!(
        chat_id = msg.chat.id.0,
        "message from a user not on the allowed list"
    );
    let reply = Reply::new().text(Texts(language).not_allowed());
    let send = send_logged(&messenger, &msg, vec![Response::Text(reply)]);
    messenger
        .refused
        .say(messenger.store.as_ref(), msg.chat.id.0, send)
        .await;
    Ok(())
}

/// The analyses that entries' handlers hand off ([`Journal::answer_accepted`]) and the
/// slow commands, tracked so that a stop lets them finish within the grace period.
#[derive(Clone, Default)]
pub struct Answers(TaskTracker);

impl Answers {
    /// What an entry's handler does once the store has answered: a stored entry is
    /// answered in a task of its own. An entry not stored is an error: the inbox tries
    /// its update again (and tells the user once that it is not saved yet).
    fn hand_off<B: TgBot>(
        &self,
        taking: &Taking,
        accepted: Result<Option<Accepted>, EntryError>,
        journal: Arc<Journal>,
        messenger: Arc<Telegram<B>>,
    ) -> HandlerResult {
        if let Some(accepted) = accepted? {
            taking.marked_by_store();
            // The chat stays this instance's until its answer is out, and the answer goes
            // out only while it is.
            let lease = taking.lease();
            self.0.spawn(async move {
                journal
                    .answer_accepted(messenger.as_ref(), accepted, lease.as_deref())
                    .await;
            });
        }
        Ok(())
    }

    /// Runs a slow command's `work` (a `/week`: a whole cascade; an import) in its own
    /// task, so that its chat's next updates are not held behind it; its update is
    /// handled (`done`) once the work ended — its rows committed, or the user told why
    /// not. Its reply may come after the chat's later messages are answered.
    ///
    /// The work is never cut off from outside: it checks the chat's lease itself at its
    /// safe points ([`UnderLease`]: before it writes or sends), and stops there with
    /// [`LeaseLost`] when the chat may be another instance's — its update is then left
    /// to that one. Cut anywhere (between a digest's send and its record, in the
    /// middle of an import), the work would be done a second time by the next holder.
    fn slow_command<W, F>(&self, chat: i64, work: W, done: Deferred)
    where
        W: FnOnce(UnderLease) -> F,
        F: Future<Output = HandlerResult> + Send + 'static,
    {
        let work = work(done.under());
        self.0.spawn(async move {
            match std::panic::AssertUnwindSafe(work).catch_unwind().await {
                Ok(Ok(())) => done.handled().await,
                Ok(Err(error)) if error.is::<LeaseLost>() => done.let_go(),
                Ok(Err(error)) => {
                    tracing::error!(%error, chat_id = chat, "command handling failed");
                    done.handled().await;
                }
                // A failure of its update, on the backoff (dead after the last try):
                // released at once, it would panic again in a tight loop.
                Err(_) => {
                    tracing::error!(chat_id = chat, "a slow command panicked");
                    done.failed("task_panicked").await;
                }
            }
        });
    }

    /// Waits until every analysis handed off has ended (none may be handed off after).
    async fn finished(&self) {
        self.0.close();
        self.0.wait().await;
    }
}

async fn on_text<B: TgBot>(
    msg: Message,
    text: String,
    journal: Arc<Journal>,
    messenger: Arc<Telegram<B>>,
    answers: Answers,
    taking: Taking,
) -> HandlerResult {
    handle_entry(&msg, text, journal, messenger, &answers, &taking, false).await
}

async fn on_voice<B: TgBot>(
    voice: IncomingVoice,
    journal: Arc<Journal>,
    messenger: Arc<Telegram<B>>,
    answers: Answers,
    taking: Taking,
) -> HandlerResult {
    let accepted = journal
        .accept_voice_for(messenger.as_ref(), voice, Some(taking.key()))
        .await;
    answers.hand_off(&taking, accepted, journal, messenger)
}

async fn on_edit<B: TgBot>(
    msg: Message,
    text: String,
    journal: Arc<Journal>,
    messenger: Arc<Telegram<B>>,
    answers: Answers,
    taking: Taking,
) -> HandlerResult {
    handle_entry(&msg, text, journal, messenger, &answers, &taking, true).await
}

/// A new or edited day log: stored here (its update handled in the same transaction),
/// answered by [`Answers`]; an error when it cannot be stored (the inbox tries again).
async fn handle_entry<B: TgBot>(
    msg: &Message,
    text: String,
    journal: Arc<Journal>,
    messenger: Arc<Telegram<B>>,
    answers: &Answers,
    taking: &Taking,
    edited: bool,
) -> HandlerResult {
    let Some(incoming) = incoming(msg, text) else {
        return Ok(()); // channel posts and the like have no sender to journal for
    };
    let update = Some(taking.key());
    let accepted = if edited {
        journal.accept_edit_for(incoming, update).await
    } else {
        journal.accept_text_for(incoming, update).await
    };
    answers.hand_off(taking, accepted, journal, messenger)
}

/// A shared location sets the user's time zone (docs/behaviour.md, Time zones and rhythm), confirmed in a reply.
async fn on_location<B: TgBot>(
    msg: Message,
    location: teloxide::types::Location,
    journal: Arc<Journal>,
    messenger: Arc<Telegram<B>>,
    store: Store,
    users: Users,
) -> HandlerResult {
    let Some(user_id) = sender_id(&msg) else {
        return Ok(());
    };
    ensure_user(&msg, &journal, user_id).await;
    let reply = match commands::set_zone_from_location(
        &store,
        &users,
        user_id,
        location.latitude,
        location.longitude,
    )
    .await
    {
        Ok(reply) => reply,
        Err(error) => {
            tracing::error!(%error, user_id = user_id.get(), "could not set the time zone from a location");
            Reply::new().text(Texts(journal.users().language_of(user_id).await).internal_error())
        }
    };
    send_logged(&messenger, &msg, vec![Response::Text(reply)]).await;
    Ok(())
}

/// Commands, locations and documents may come before any entry: the user must exist
/// (with a language). A failure is logged; what follows reports its own.
async fn ensure_user(msg: &Message, journal: &Journal, user_id: UserId) {
    if let Some(from) = msg.from.as_ref()
        && let Err(error) = journal
            .users()
            .ensure(&crate::store::NewUser {
                user_id,
                username: from.username.as_deref(),
                language: Language::from_code(from.language_code.as_deref()),
            })
            .await
    {
        tracing::warn!(%error, user_id = user_id.get(), "could not record the user");
    }
}

/// The caption `/import`, or `/import@bot` with this bot's name, any case: in a group
/// `/import@OtherBot` is another bot's.
fn is_import_caption(caption: Option<&str>, bot: &str) -> bool {
    caption.is_some_and(|c| {
        command_word(c).is_some_and(|(name, _)| name.eq_ignore_ascii_case("/import"))
            && !for_another_bot(c, bot)
    })
}

/// A document: a Daylio export (docs/behaviour.md, Search and Import) when captioned `/import` or sent within 10
/// minutes of `/import`; anything else is not for the journal.
#[expect(
    clippy::too_many_arguments,
    reason = "a dptree endpoint: its arguments are the dependencies it is handed by type"
)]
async fn on_document<B: TgBot>(
    msg: Message,
    document: teloxide::types::Document,
    journal: Arc<Journal>,
    messenger: Arc<Telegram<B>>,
    answers: Answers,
    taking: Taking,
    me: Me,
    store: Store,
    users: Users,
) -> HandlerResult {
    let Some(user_id) = sender_id(&msg) else {
        return Ok(());
    };
    let asked = messenger.take_import_ask(user_id, journal.now()).await;
    if !is_import_caption(msg.caption(), me.username()) && !asked {
        return on_other(msg, journal, messenger).await;
    }
    let chat = msg.chat.id.0;
    let import = |under| import_document(msg, document, journal, messenger, store, users, under);
    answers.slow_command(chat, import, taking.defer());
    Ok(())
}

/// Downloads a Daylio export and imports it; answers with the three numbers or why not.
/// Its update is handled (see [`Answers::slow_command`]) only once the import's rows
/// are committed, or it stored nothing: a crash before then imports the file again at
/// the next start, which adds nothing twice. Among instances it stops before its
/// import and before its answer once the chat's lease is no longer this instance's
/// (`under`): the chat's new holder imports the file again (adding nothing twice) and
/// answers.
async fn import_document<B: TgBot>(
    msg: Message,
    document: teloxide::types::Document,
    journal: Arc<Journal>,
    messenger: Arc<Telegram<B>>,
    store: Store,
    users: Users,
    under: UnderLease,
) -> HandlerResult {
    let Some(user_id) = sender_id(&msg) else {
        return Ok(());
    };
    ensure_user(&msg, &journal, user_id).await;
    let language = journal.users().language_of(user_id).await;
    let texts = Texts(language);
    let max = u64::try_from(crate::import::MAX_DOWNLOAD_BYTES).unwrap_or(u64::MAX);
    let sentence = if u64::from(document.file.size) > max {
        crate::import::ImportError::TooLarge
            .sentence(language)
            .to_owned()
    } else {
        match messenger.fetch_bytes(&document.file.id.0, max).await {
            Err(FetchError::Gone(reason))
                if reason.contains("exceeds") || reason.contains("over the download limit") =>
            {
                crate::import::ImportError::TooLarge
                    .sentence(language)
                    .to_owned()
            }
            Err(error) => {
                tracing::warn!(%error, user_id = user_id.get(), "could not download an import");
                texts.import_download_failed().to_owned()
            }
            Ok((_, bytes)) => {
                under.go_on().await?;
                match crate::import::import_bytes(&store, &users, user_id, &bytes).await {
                    Ok(report) => report.sentence(language),
                    Err(error) => {
                        tracing::warn!(%error, user_id = user_id.get(), "import refused");
                        error.sentence(language)
                    }
                }
            }
        }
    };
    under.go_on().await?;
    send_logged(
        &messenger,
        &msg,
        vec![Response::Text(Reply::new().text(&sentence))],
    )
    .await;
    Ok(())
}

async fn on_other<B: TgBot>(
    msg: Message,
    journal: Arc<Journal>,
    messenger: Arc<Telegram<B>>,
) -> HandlerResult {
    let answer = answer_in_language(&msg, &journal, &messenger, Texts::only_text);
    match msg.media_group_id() {
        Some(album) => {
            messenger
                .albums
                .say(messenger.store.as_ref(), album.0.clone(), answer)
                .await;
        }
        None => _ = answer.await,
    }
    Ok(())
}

/// Answers `msg` with one sentence in the sender's stored language, or their client's
/// for someone the store does not know yet (a sticker as the first message). `false`
/// when it was not delivered.
async fn answer_in_language<B: TgBot>(
    msg: &Message,
    journal: &Journal,
    messenger: &Telegram<B>,
    sentence: fn(Texts) -> &'static str,
) -> bool {
    let Some(id) = sender_id(msg) else {
        return false;
    };
    let client = Language::from_code(msg.from.as_ref().and_then(|u| u.language_code.as_deref()));
    let language = journal.users().language_or(id, client).await;
    let reply = Reply::new().text(sentence(Texts(language)));
    send_logged(messenger, msg, vec![Response::Text(reply)]).await
}

#[expect(
    clippy::too_many_arguments,
    reason = "a dptree endpoint: its arguments are the dependencies it is handed by type"
)]
async fn on_command<B: TgBot>(
    msg: Message,
    command: Command,
    journal: Arc<Journal>,
    messenger: Arc<Telegram<B>>,
    answers: Answers,
    taking: Taking,
    store: Store,
    users: Users,
    digests: Arc<Digests>,
) -> HandlerResult {
    if matches!(command, Command::Import(_))
        && let Some(document) = msg.document().cloned()
    {
        // The caption of a document is parsed as a command too: that is the import,
        // handled once it is stored.
        let chat = msg.chat.id.0;
        let import =
            |under| import_document(msg, document, journal, messenger, store, users, under);
        answers.slow_command(chat, import, taking.defer());
        return Ok(());
    }
    // The others are quick, and run here, in order with the chat's updates: a `/lang`
    // or `/tz` applies to the entry sent after it, an `/import` ask to the file.
    let slow = command == Command::Week;
    if !slow {
        return run_command(msg, command, journal, messenger, store, users, digests).await;
    }
    // Its safe point is its start: the digest itself is written and sent under its
    // own claim in the database (see `digest`), which another instance respects.
    let chat = msg.chat.id.0;
    let week = |under: UnderLease| async move {
        under.go_on().await?;
        run_command(msg, command, journal, messenger, store, users, digests).await
    };
    answers.slow_command(chat, week, taking.defer());
    Ok(())
}

async fn run_command<B: TgBot>(
    msg: Message,
    command: Command,
    journal: Arc<Journal>,
    messenger: Arc<Telegram<B>>,
    store: Store,
    users: Users,
    digests: Arc<Digests>,
) -> HandlerResult {
    let Some(user_id) = sender_id(&msg) else {
        return Ok(());
    };
    ensure_user(&msg, &journal, user_id).await;
    if matches!(command, Command::Import(_)) {
        messenger.asked_import(user_id, journal.now()).await;
    }
    if command == Command::Week {
        let target = reply_target(&msg);
        if let Err(error) = digests
            .week(messenger.as_ref(), user_id, target, FrontEnd::Telegram)
            .await
        {
            tracing::error!(%error, user_id = user_id.get(), "weekly digest failed");
            let language = journal.users().language_of(user_id).await;
            let reply = Reply::new().text(commands::failure_sentence(language));
            send_logged(&messenger, &msg, vec![Response::Text(reply)]).await;
        }
        return Ok(());
    }
    if command == Command::App {
        let language = journal.users().language_of(user_id).await;
        let url = journal.settings().webapp.url();
        let responses = commands::open_app(language, url, msg.chat.is_private());
        send_logged(&messenger, &msg, responses).await;
        return Ok(());
    }
    // Reminders and the digest go to the private chat (`users.chat_id`), never here.
    let scheduled_elsewhere =
        !msg.chat.is_private() && matches!(command, Command::Remind(_) | Command::Digest(_));
    let responses = match commands::respond(&store, &users, user_id, command).await {
        Ok(mut responses) => {
            if scheduled_elsewhere {
                let texts = Texts(journal.users().language_of(user_id).await);
                responses.push(Response::Text(
                    Reply::new().text(texts.scheduled_in_private_chat()),
                ));
            }
            responses
        }
        Err(error) => {
            tracing::error!(%error, user_id = user_id.get(), "command failed");
            let language = journal.users().language_of(user_id).await;
            vec![Response::Text(
                Reply::new().text(commands::failure_sentence(language)),
            )]
        }
    };
    send_logged(&messenger, &msg, responses).await;
    Ok(())
}

async fn on_callback<B: TgBot>(
    bot: B,
    query: CallbackQuery,
    journal: Arc<Journal>,
    messenger: Arc<Telegram<B>>,
    store: Store,
    taking: Taking,
) -> HandlerResult {
    let user_id = user_id_of(query.from.id).unwrap_or_default();
    // A group member the bot does not know may press someone else's button.
    let client = Language::from_code(query.from.language_code.as_deref());
    let language = journal.users().language_or(user_id, client).await;
    let Some(DeleteButton { answer, asked_by }) =
        query.data.as_deref().and_then(DeleteButton::parse)
    else {
        let _ = bot.answer_callback_query(query.id.clone()).await;
        return Ok(());
    };
    let texts = Texts(language);
    let in_own_chat = query
        .regular_message()
        .is_some_and(|message| message.chat.id.0 == user_id.get());
    let not_theirs = match asked_by {
        Some(asked_by) if asked_by == user_id => None,
        Some(_) => Some(texts.delete_not_yours()),
        // A button from before they named their user: only where nobody else can press;
        // elsewhere whose it was cannot be told, and it is asked again.
        None if in_own_chat => None,
        None => Some(texts.delete_expired()),
    };
    let answered = bot.answer_callback_query(query.id.clone());
    if let Some(refusal) = not_theirs {
        let _ = answered.text(refusal).await;
        tracing::info!(
            user_id = user_id.get(),
            "a /delete button pressed by someone who did not ask"
        );
        return Ok(());
    }
    let _ = answered.await;
    let reply = match answer {
        DeleteAnswer::Yes if journal.is_allowed(user_id) => {
            match commands::delete_pressed(&store, user_id, language, Some(taking.key())).await {
                Ok(reply) => {
                    taking.marked_by_store();
                    reply
                }
                Err(error) => {
                    tracing::error!(%error, user_id = user_id.get(), "delete failed");
                    Reply::new().text(commands::failure_sentence(language))
                }
            }
        }
        DeleteAnswer::Yes => return Ok(()),
        DeleteAnswer::No => Reply::new().text(texts.delete_cancelled()),
    };
    if let Some(message) = query.regular_message() {
        // The buttons go away so the question cannot be answered twice.
        let _ = bot
            .edit_message_reply_markup(message.chat.id, message.id)
            .await;
    }
    if let Some(chat_id) = query.chat_id() {
        let target = Target::chat(crate::domain::ChatId(chat_id.0));
        if let Err(error) = messenger.send(target, vec![Response::Text(reply)]).await {
            tracing::warn!(%error, user_id = user_id.get(), "could not confirm a delete");
        }
    }
    Ok(())
}

/// Where an answer to `msg` goes: a reply to it.
fn reply_target(msg: &Message) -> Target {
    Target::reply(
        crate::domain::ChatId(msg.chat.id.0),
        crate::domain::MessageId(i64::from(msg.id.0)),
    )
}

/// Sends `responses` in answer to `msg`; a failure is logged. `true` once delivered.
async fn send_logged<B: TgBot>(
    messenger: &Telegram<B>,
    msg: &Message,
    responses: Vec<Response>,
) -> bool {
    match messenger.send(reply_target(msg), responses).await {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(%error, chat_id = msg.chat.id.0, "reply not delivered");
            false
        }
    }
}

/// Builds the bot from settings: token and API URL (`TELOXIDE_API_URL`).
pub fn build_bot(settings: &Settings, client: reqwest::Client) -> anyhow::Result<Bot> {
    let token = settings
        .secrets
        .telegram_token
        .as_ref()
        .context("TELOXIDE_TOKEN is not set; `daylog chat` works without it")?;
    let mut bot = Bot::with_client(token.expose(), client);
    if let Some(url) = &settings.telegram_api_url {
        bot = bot.set_api_url(url.clone());
    }
    Ok(bot)
}

/// `daylog doctor --ping`: one `getMe` with the configured token and `TELOXIDE_API_URL`,
/// once, within 15 s. The bot's name when it answers; else a sentence saying which of
/// the two to check (`daylog run` would retry a passing failure for as long as it
/// lasts, so a wrong URL is best found here).
pub async fn ping_telegram(settings: &Settings) -> Result<String, String> {
    let client = crate::telegram_client().map_err(|e| e.without_url().to_string())?;
    let bot = build_bot(settings, client).map_err(|e| e.to_string())?;
    let asked = tokio::time::timeout(Duration::from_secs(15), bot.get_me().send()).await;
    match asked {
        Ok(Ok(me)) => Ok(format!("answered as @{}", me.username())),
        Ok(Err(RequestError::Api(ApiError::InvalidToken))) => Err(
            "Telegram refused the token (401/404): check TELOXIDE_TOKEN, and TELOXIDE_API_URL if set"
                .to_owned(),
        ),
        Ok(Err(RequestError::InvalidJson { .. })) => Err(
            "the answer is not the Bot API's: check TELOXIDE_API_URL (leave it empty for Telegram's own)"
                .to_owned(),
        ),
        Ok(Err(RequestError::Network(error))) => {
            // Its kind only: the error's URL would carry the token.
            let what = if error.is_connect() {
                "cannot connect"
            } else if error.is_timeout() {
                "timed out"
            } else {
                "the request failed"
            };
            Err(format!(
                "{what} to the Bot API: check TELOXIDE_API_URL and the network"
            ))
        }
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err("no answer within 15 s: check TELOXIDE_API_URL and the network".to_owned()),
    }
}

/// Start-up: wait until Telegram answers `getMe`, register the command menu, then
/// either register the webhook (webhook mode) or make sure no webhook stands in the way
/// of polling. The bot (`Me`: its id is the inbox's `bot_id`), or `None` when stopped
/// first; an error when Telegram refuses the bot (retrying would not help).
async fn start_up<B: TgBot>(
    bot: &B,
    settings: &Settings,
    stop: &CancellationToken,
) -> anyhow::Result<Option<Me>> {
    let me = match at_start("getMe", stop, None, || bot.get_me().send()).await {
        Ok(Some(me)) => me,
        Ok(None) => return Ok(None),
        Err(RequestError::Api(ApiError::InvalidToken)) => anyhow::bail!(
            "Telegram refused the bot token (401/404); check TELOXIDE_TOKEN and TELOXIDE_API_URL"
        ),
        Err(error) => anyhow::bail!("Telegram refused getMe: {error}"),
    };
    tracing::info!(username = %me.username(), "connected to Telegram");
    if !register_commands(bot, stop).await {
        return Ok(None);
    }
    let ready = match settings.telegram.mode() {
        crate::config::TelegramMode::Webhook => webhook::register(bot, settings, stop).await?,
        crate::config::TelegramMode::Polling => {
            let shared = crate::config::is_postgres_url(settings.database_url.expose());
            clear_webhook(bot, shared, stop).await?
        }
    };
    Ok(ready.then_some(me))
}

/// Polling mode: a webhook left set (by an earlier webhook-mode run, another program)
/// would make every `getUpdates` fail with 409. On SQLite (one instance) it is deleted,
/// with a warning that says why. On PostgreSQL (`shared`: other instances may use the
/// same database, one of them serving that webhook) it is left alone and start-up is
/// refused with a sentence naming `telegram.mode`. `false` when stopped meanwhile.
async fn clear_webhook<B: TgBot>(
    bot: &B,
    shared: bool,
    stop: &CancellationToken,
) -> anyhow::Result<bool> {
    match at_start("getWebhookInfo", stop, None, || {
        bot.get_webhook_info().send()
    })
    .await
    {
        Ok(None) => return Ok(false),
        Ok(Some(info)) if info.url.is_some() && shared => anyhow::bail!(
            "the bot has a webhook set, but telegram.mode is \"polling\": on PostgreSQL another daylog instance may be serving that webhook, so it is left in place and this one does not start (set telegram.mode = \"webhook\" to serve it here, or delete the webhook if nothing serves it)"
        ),
        Ok(Some(info)) if info.url.is_some() => {
            tracing::warn!(
                "the bot has a webhook set, but telegram.mode is \"polling\": deleting the webhook to poll instead (set telegram.mode = \"webhook\" if this bot is meant to be served by webhook)"
            );
            match at_start("deleteWebhook", stop, None, || bot.delete_webhook().send()).await {
                Ok(None) => return Ok(false),
                Ok(Some(_)) => tracing::info!("removed the bot's webhook to poll instead"),
                Err(error) => tracing::warn!(%error, "could not remove the bot's webhook"),
            }
        }
        Ok(Some(_)) => {}
        Err(error) => tracing::warn!(%error, "could not check for a webhook"),
    }
    Ok(true)
}

/// Registers the command menu in English (the default) and Russian. A menu that cannot
/// be set is logged, not fatal: it only helps typing. `false` when stopped meanwhile.
async fn register_commands<B: TgBot>(bot: &B, stop: &CancellationToken) -> bool {
    for language in [Language::En, Language::Ru] {
        let commands: Vec<BotCommand> = Command::menu(language)
            .into_iter()
            .map(|(name, description)| BotCommand::new(name, description))
            .collect();
        let set = || {
            let mut request = bot.set_my_commands(commands.clone());
            if language != Language::En {
                request = request.language_code(language.code());
            }
            request.send()
        };
        match at_start("setMyCommands", stop, Some(MENU_RETRIES), set).await {
            Ok(Some(_)) => {}
            Ok(None) => return false,
            Err(error) => {
                tracing::warn!(%error, language = %language, "could not register the command menu");
            }
        }
    }
    true
}

/// Whether a failed start-up call is Telegram's passing trouble: a 5xx (teloxide sees
/// its description; a body that is not JSON is an HTML error page), a 429 or the
/// network. Everything else is a refusal — 401/404 a bad token — and final.
fn is_passing(error: &RequestError) -> bool {
    match error {
        RequestError::Api(ApiError::Unknown(description)) => is_passing_refusal(description),
        RequestError::Api(_) | RequestError::MigrateToChatId(_) => false,
        RequestError::RetryAfter(_)
        | RequestError::Network(_)
        | RequestError::InvalidJson { .. }
        | RequestError::Io(_) => true,
    }
}

/// Runs a start-up call until it answers, retrying passing trouble with jittered
/// exponential backoff (a 429's `retry_after` is a lower bound of the wait), at most
/// `max_retries` times when given. `Ok(None)` when `stop` fires first, whatever the
/// call or the wait was doing.
async fn at_start<T, F, Fut>(
    what: &'static str,
    stop: &CancellationToken,
    max_retries: Option<usize>,
    call: F,
) -> Result<Option<T>, RequestError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, RequestError>>,
{
    let backoff = ExponentialBuilder::default()
        .with_min_delay(START_MIN_DELAY)
        .with_max_delay(START_MAX_DELAY)
        .with_factor(2.0)
        .with_jitter();
    let backoff = match max_retries {
        Some(times) => backoff.with_max_times(times),
        None => backoff.without_max_times(),
    };
    let retried = call
        .retry(backoff)
        .when(is_passing)
        .adjust(|error, wait| match error {
            RequestError::RetryAfter(after) => wait.map(|wait| wait.max(after.duration())),
            _ => wait,
        })
        .notify(|error, wait| {
            tracing::warn!(%error, what, retry_in_ms = wait.as_millis() as u64, "Telegram is not answering as it should yet; trying again");
        });
    tokio::select! {
        result = retried => result.map(Some),
        () = stop.cancelled() => Ok(None),
    }
}

/// [`serve`] behind teloxide's Throttle (Telegram's own limits) when
/// `telegram.throttle` is on, as the daemon runs.
pub async fn serve_configured(
    bot: Bot,
    journal: Arc<Journal>,
    digests: Arc<Digests>,
    stop: CancellationToken,
    webhook: webhook::Gate,
    leases: Option<Leases>,
) -> anyhow::Result<()> {
    if journal.settings().telegram.throttle() {
        serve(
            bot.throttle(Limits::default()),
            journal,
            digests,
            stop,
            webhook,
            leases,
        )
        .await
    } else {
        serve(bot, journal, digests, stop, webhook, leases).await
    }
}

/// Polls Telegram into the inbox (or, in webhook mode, opens `webhook` to it) and
/// handles it until `stop` is cancelled, then stops taking updates and lets in-flight
/// work finish within `telegram.shutdown_grace_ms`. The worker and the reminders run
/// beside it ([`Running`]); `leases`: this instance's chat leases (the daemon), under
/// which the worker finishes what is unfinished.
pub async fn serve<B: TgBot>(
    bot: B,
    journal: Arc<Journal>,
    digests: Arc<Digests>,
    stop: CancellationToken,
    webhook: webhook::Gate,
    leases: Option<Leases>,
) -> anyhow::Result<()> {
    let Some(me) = start_up(&bot, journal.settings(), &stop).await? else {
        return Ok(()); // stopped while starting
    };
    menu_button::set_menu_button(&bot, journal.settings().webapp.url()).await;
    if journal.settings().telegram.mode() == crate::config::TelegramMode::Webhook {
        let running = Running::start(bot, &me, journal, digests, leases, &stop);
        webhook::take_posts(&webhook, running.inbox(), &stop).await;
        running.finish().await;
        return Ok(());
    }
    let settings = Arc::clone(journal.settings());
    let token = settings
        .secrets
        .telegram_token
        .as_ref()
        .context("TELOXIDE_TOKEN is not set")?;
    let poller = intake::Poller::new(
        crate::telegram_client()?,
        settings.telegram_api_url.as_ref(),
        token.expose(),
    )?;
    let running = Running::start(bot, &me, journal, digests, leases, &stop);
    tracing::info!("daylog is running");
    poller.run(&running.inbox(), &stop).await;
    running.finish().await;
    Ok(())
}

/// What runs whatever brings the updates (long polling, a webhook): the inbox and its
/// handling loop, the analyses handed off, the worker, the reminders and digests, and
/// the inbox's retention. Started once `getMe` answered; stopped by the `stop` token
/// it was started with, then [`Running::finish`].
pub struct Running {
    inbox: Inbox,
    answers: Answers,
    lanes: TaskTracker,
    handling: tokio::task::JoinHandle<()>,
    background: Vec<(&'static str, tokio::task::JoinHandle<()>)>,
    grace: Duration,
    stop: CancellationToken,
}

/// How often the inbox is pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

impl Running {
    /// Starts handling the inbox of the bot `me` (crash resume first: what a last run
    /// left unhandled), the worker, the reminders and the inbox's retention.
    pub fn start<B: TgBot>(
        bot: B,
        me: &Me,
        journal: Arc<Journal>,
        digests: Arc<Digests>,
        leases: Option<Leases>,
        stop: &CancellationToken,
    ) -> Self {
        let settings = Arc::clone(journal.settings());
        let messenger = Arc::new(Telegram::new(bot.clone()).sharing(journal.store().clone()));
        let bot_id = i64::try_from(me.id.0).unwrap_or(i64::MAX);
        let answers = Answers::default();
        // What a take-over claims is answered in tracked tasks: a stop waits for them
        // (within its grace) before this instance gives its leases up.
        let take_over_tasks = worker::TakeOverTasks::new(answers.0.clone(), stop.clone());
        let take_over: Option<inbox::TakeOver> = leases.clone().map(|leases| {
            let (journal, messenger) = (Arc::clone(&journal), Arc::clone(&messenger));
            let hook: inbox::TakeOver = Arc::new(move |chat_id| {
                worker::take_over(
                    Arc::clone(&journal),
                    Arc::clone(&messenger),
                    leases.clone(),
                    chat_id,
                    take_over_tasks.clone(),
                )
                .boxed()
            });
            hook
        });
        let inbox = Inbox::with_leases(
            journal.store().clone(),
            bot_id,
            notice(&messenger, journal.users()),
            leases.clone(),
            take_over,
        );
        let handle = dispatching(bot, me, &journal, &messenger, &answers, &digests);
        let backoff = inbox::handling::Backoff {
            min: settings.worker.retry_min(),
            max: settings.worker.retry_max(),
        };
        let lanes = TaskTracker::new();
        let handling = tokio::spawn(inbox.clone().handle_until(
            handle,
            backoff,
            lanes.clone(),
            stop.clone(),
        ));
        let worker = tokio::spawn(worker::run(
            Arc::clone(&journal),
            Arc::clone(&digests),
            Arc::clone(&messenger),
            FrontEnd::Telegram,
            leases.clone(),
            stop.clone(),
        ));
        let reminders = tokio::spawn(crate::reminders::run(
            journal.store().clone(),
            journal.users().clone(),
            Arc::clone(&settings),
            Arc::clone(&digests),
            Arc::clone(&messenger),
            stop.clone(),
        ));
        let retention = tokio::spawn(prune_inbox(inbox.clone(), journal, stop.clone()));
        let listening = tokio::spawn(listen_inbox(inbox.clone(), leases, stop.clone()));
        Self {
            inbox,
            answers,
            lanes,
            handling,
            background: vec![
                ("the worker", worker),
                ("the reminder scheduler", reminders),
                ("the inbox's retention", retention),
                ("the inbox's listener", listening),
            ],
            grace: settings.telegram.shutdown_grace(),
            stop: stop.clone(),
        }
    }

    /// The inbox the update source commits to.
    pub fn inbox(&self) -> Inbox {
        self.inbox.clone()
    }

    /// Once the update source stopped: stops handling (the token is cancelled if it was
    /// not) and lets in-flight work finish within `telegram.shutdown_grace_ms`, counted
    /// from now. What does not finish resumes at the next start (its rows are there).
    pub async fn finish(self) {
        self.stop.cancel();
        let stopped_at = tokio::time::Instant::now();
        let deadline = stopped_at + self.grace;
        let grace_ms = self.grace.as_millis() as u64;
        let _ = tokio::time::timeout_at(deadline, self.handling).await;
        self.lanes.close();
        if tokio::time::timeout_at(deadline, self.lanes.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                grace_ms,
                "updates being handled did not finish in time; they are handled again at the next start"
            );
        }
        if tokio::time::timeout_at(deadline, self.answers.finished())
            .await
            .is_err()
        {
            tracing::warn!(
                grace_ms,
                "analyses did not finish in time; their logs resume at the next start"
            );
        }
        for (what, task) in self.background {
            if tokio::time::timeout_at(deadline, task).await.is_err() {
                tracing::warn!(what, "did not stop in time");
            }
        }
    }
}

/// The "not saved yet" and "given up" notices, sent through the Bot API as a reply to
/// the message, in the sender's language (`/lang`; their client's when the store, which
/// may be what failed, does not answer).
fn notice<B: TgBot>(messenger: &Arc<Telegram<B>>, users: &Users) -> Notice {
    let messenger = Arc::clone(messenger);
    let users = users.clone();
    Arc::new(move |about: NotSaved, kind: NoticeKind| {
        let (messenger, users) = (Arc::clone(&messenger), users.clone());
        async move {
            let client = Language::from_code(about.language_code.as_deref());
            let language = users.language_or(UserId(about.user_id), client).await;
            let texts = Texts(language);
            let sentence = match kind {
                NoticeKind::NotSavedYet => texts.not_saved_yet(),
                NoticeKind::GivenUp => texts.not_saved(),
            };
            let target = Target::reply(
                crate::domain::ChatId(about.chat_id),
                crate::domain::MessageId(i64::from(about.message_id)),
            );
            let reply = Reply::new().text(sentence);
            match messenger.send(target, vec![Response::Text(reply)]).await {
                Ok(()) => true,
                Err(error) => {
                    tracing::warn!(%error, chat_id = about.chat_id, "a notice about an unsaved message was not delivered");
                    false
                }
            }
        }
        .boxed()
    })
}

/// How the inbox's loop hands an update to the handler tree ([`schema`]), with what
/// teloxide's dispatcher would give it (the bot, `Me`, the update) and daylog's parts.
fn dispatching<B: TgBot>(
    bot: B,
    me: &Me,
    journal: &Arc<Journal>,
    messenger: &Arc<Telegram<B>>,
    answers: &Answers,
    digests: &Arc<Digests>,
) -> inbox::handling::Handle {
    let handler = Arc::new(schema::<B>());
    let deps = dptree::deps![
        Arc::clone(journal),
        Arc::clone(messenger),
        answers.clone(),
        journal.store().clone(),
        journal.users().clone(),
        Arc::clone(digests),
        bot,
        me.clone()
    ];
    // As teloxide's dispatcher does at its start: a dependency the tree asks for and
    // nobody gives is a bug found here, not at the first update that needs it.
    dptree::type_check(
        handler.sig(),
        &deps,
        &[dptree::Type::of::<Update>(), dptree::Type::of::<Taking>()],
    );
    Arc::new(move |update: Update, taking: Taking| {
        let mut deps = deps.clone();
        deps.insert(update);
        deps.insert(taking);
        let handler = Arc::clone(&handler);
        async move {
            match handler.dispatch(deps).await {
                std::ops::ControlFlow::Break(result) => result,
                // No branch wants it (a kind the bot does not answer): nothing to do.
                std::ops::ControlFlow::Continue(_) => Ok(()),
            }
        }
        .boxed()
    })
}

/// Among instances on PostgreSQL: an instance that committed updates of a chat
/// another instance holds says so (`NOTIFY daylog_inbox`); the holder reads its inbox
/// again at once rather than at its next periodic read. Nothing without shared leases.
async fn listen_inbox(inbox: Inbox, leases: Option<Leases>, stop: CancellationToken) {
    let Some(leases) = leases.filter(Leases::shared) else {
        return;
    };
    let mut listener = loop {
        match inbox.store().inbox_listener().await {
            Ok(Some(listener)) => break listener,
            Ok(None) => return,
            Err(error) => {
                tracing::debug!(%error, "cannot listen for other instances' updates yet");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    };
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            told = listener.recv() => match told {
                Ok(told) => {
                    let chat = told.payload().parse::<i64>().ok();
                    if chat.is_none_or(|chat| leases.holds(chat)) {
                        inbox.reread();
                    }
                }
                Err(error) => {
                    // The listener connects again by itself on its next receive.
                    tracing::debug!(%error, "lost the inbox's listener for a moment");
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            },
        }
    }
}

/// The inbox's retention, at the start and then every [`PRUNE_EVERY`]: payloads of
/// rows handled or dead for a day, and such rows received a week ago.
async fn prune_inbox(inbox: Inbox, journal: Arc<Journal>, stop: CancellationToken) {
    loop {
        match inbox.store().prune_updates(journal.now()).await {
            Ok(pruned) if pruned.rows + pruned.payloads > 0 => {
                tracing::info!(
                    rows = pruned.rows,
                    payloads = pruned.payloads,
                    "pruned the update inbox"
                );
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "could not prune the update inbox"),
        }
        inbox.count_rows().await;
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(PRUNE_EVERY) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::domain::UserId;
    use std::sync::Arc;

    use teloxide::types::Seconds;
    use teloxide::{ApiError, RequestError};

    use super::{classify, is_import_caption, is_passing};
    use crate::frontend::SendError;

    #[test]
    fn a_closed_chat_is_gone_and_a_refused_message_is_refused() {
        let unknown = |description: &str| RequestError::Api(ApiError::Unknown(description.into()));
        let gone = [
            RequestError::Api(ApiError::BotBlocked),
            unknown("Forbidden: bot can't initiate conversation with a user"),
            unknown("Forbidden: bot was kicked from the group chat"),
            unknown("Forbidden: bot is not a member of the supergroup chat"),
            RequestError::Api(ApiError::GroupDeactivated),
        ];
        for error in gone {
            let shown = format!("{error:?}");
            assert!(matches!(classify(error), SendError::Gone(_)), "{shown}");
        }
        let refused = [
            RequestError::Api(ApiError::MessageIsTooLong),
            unknown("Bad Request: something else"),
        ];
        for error in refused {
            let shown = format!("{error:?}");
            assert!(matches!(classify(error), SendError::Refused(_)), "{shown}");
        }
        assert!(matches!(
            classify(unknown("Bad Gateway")),
            SendError::Transient(_)
        ));
    }

    #[tokio::test]
    async fn a_panicking_slow_command_is_a_failure_of_its_update_until_dead() {
        let (inbox, _dir) = super::inbox::handling::tests::inbox().await;
        let body = r#"{"update_id":9}"#;
        let fresh = inbox
            .store()
            .insert_updates(
                inbox.bot_id(),
                &[crate::store::NewUpdate {
                    update_id: 9,
                    chat_id: Some(3),
                    user_id: Some(3),
                    payload: body,
                }],
            )
            .await
            .expect("stored");
        assert_eq!(fresh, [true]);
        for failures in 0..crate::store::UPDATE_MAX_FAILURES {
            let answers = super::Answers::default();
            let taking = super::Taking::for_test(&inbox, 9, failures);
            answers.slow_command(3, |_| async { panic!("a bug in /week") }, taking.defer());
            answers.finished().await;
            let rows = inbox
                .store()
                .unhandled_updates(inbox.bot_id(), 8, 100)
                .await
                .expect("rows");
            let last = failures + 1 == crate::store::UPDATE_MAX_FAILURES;
            assert_eq!(
                rows.iter().map(|row| row.failures).collect::<Vec<_>>(),
                if last { vec![] } else { vec![failures + 1] },
                "try {failures}"
            );
        }
        let counts = inbox.store().inbox_counts().await.expect("counts");
        assert_eq!((counts.unhandled, counts.dead), (0, 1));
    }

    /// A slow command (a `/week`) whose chat's lease runs out here between its digest's
    /// send and its record (the database did not answer the heartbeat for a while) is
    /// not cut off there: the record follows the send, and its update is handled, so
    /// that no instance handles it again and sends the digest a second time.
    #[tokio::test]
    async fn a_slow_command_is_not_cut_between_its_send_and_its_record_when_its_lease_runs_out() {
        use super::inbox::handling::tests::{is_handled, shared_leased_inbox, stored};
        let lease = std::time::Duration::from_millis(300);
        let (inbox, leases, _b, _dir) = shared_leased_inbox(lease).await;
        stored(&inbox, 7, Some(5)).await;
        let chat = leases.hold(5).await.expect("take").expect("free");
        let watch = chat.share().expect("in hand");
        let answers = super::Answers::default();
        let (sent, was_sent) = tokio::sync::oneshot::channel::<()>();
        let (go, may_go) = tokio::sync::oneshot::channel::<()>();
        let recorded = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let record = Arc::clone(&recorded);
        let taking = super::Taking::for_test(&inbox, 7, 0).with_lease(chat);
        let work = move |_| async move {
            _ = sent.send(()); // the digest went out
            _ = may_go.await; // and its record waits for the database
            record.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        };
        answers.slow_command(5, work, taking.defer());
        was_sent.await.expect("sent");
        // No heartbeat: the lease's deadline here passes, and what waits for it wakes.
        watch.lost().await;
        tokio::time::sleep(lease / 10).await;
        _ = go.send(());
        answers.finished().await;
        assert!(
            recorded.load(std::sync::atomic::Ordering::SeqCst),
            "the send's record was not cut off"
        );
        assert!(is_handled(&inbox, 7).await, "nobody handles it again");
    }

    /// A slow command that finds at a safe point that its chat's lease was taken over
    /// (this instance stalled past its lease) stops there: its update is left to the
    /// chat's new holder.
    #[tokio::test]
    async fn a_slow_command_that_finds_its_lease_taken_over_leaves_its_update() {
        use super::inbox::handling::tests::{is_handled, shared_leased_inbox, stored};
        let lease = std::time::Duration::from_millis(300);
        let (inbox, leases, b, _dir) = shared_leased_inbox(lease).await;
        stored(&inbox, 7, Some(5)).await;
        let chat = leases.hold(5).await.expect("take").expect("free");
        let watch = chat.share().expect("in hand");
        let answers = super::Answers::default();
        let taking = super::Taking::for_test(&inbox, 7, 0).with_lease(chat);
        let (go, may_go) = tokio::sync::oneshot::channel::<()>();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let did = Arc::clone(&done);
        let work = move |under: super::UnderLease| async move {
            _ = may_go.await;
            under.go_on().await?;
            did.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        };
        answers.slow_command(5, work, taking.defer());
        watch.lost().await;
        let store = inbox.store();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        while store
            .take_chat_lease(5, b, lease * 100)
            .await
            .expect("asked")
            .is_none()
        {
            assert!(tokio::time::Instant::now() < deadline, "never ran out");
            tokio::time::sleep(lease / 10).await;
        }
        _ = go.send(());
        answers.finished().await;
        assert!(!done.load(std::sync::atomic::Ordering::SeqCst), "stopped");
        assert!(!is_handled(&inbox, 7).await, "left to the new holder");
    }

    #[tokio::test]
    async fn a_panicking_handler_ends_its_update_only_as_a_failure() {
        let handler =
            super::unwinding().chain(teloxide::dptree::endpoint(|update: u32| async move {
                assert_ne!(update, 1, "the update that panics");
                Ok(())
            }));
        for update in [1_u32, 2, 1, 3] {
            let flow = handler.dispatch(teloxide::dptree::deps![update]).await;
            let failed = matches!(flow, std::ops::ControlFlow::Break(Err(_)));
            assert_eq!(failed, update == 1, "{update}");
        }
    }

    #[test]
    fn an_import_caption_names_this_bot_or_none() {
        // (caption, is an import for the bot `daylog_bot`)
        let rows = [
            (Some("/import"), true),
            (Some("/IMPORT my year"), true),
            (Some("/import@Daylog_Bot"), true),
            (Some("/import@OtherBot"), false),
            (Some("/imports"), false),
            (Some("import"), false),
            (Some(""), false),
            (None, false),
        ];
        for (caption, import) in rows {
            assert_eq!(
                is_import_caption(caption, "daylog_bot"),
                import,
                "{caption:?}"
            );
        }
    }

    #[test]
    fn only_passing_trouble_is_retried_at_start() {
        let not_json = serde_json::from_str::<u8>("<html>502</html>").expect_err("not JSON");
        let unknown = |description: &str| RequestError::Api(ApiError::Unknown(description.into()));
        let table = [
            (unknown("Bad Gateway"), true),
            (unknown("Internal Server Error"), true),
            (unknown("Service Unavailable"), true),
            (unknown("Too Many Requests: retry after 5"), true),
            (RequestError::RetryAfter(Seconds::from_seconds(3)), true),
            (
                RequestError::InvalidJson {
                    source: Arc::new(not_json),
                    raw: "<html>502</html>".into(),
                },
                true,
            ),
            (
                RequestError::Io(Arc::new(std::io::Error::other("reset"))),
                true,
            ),
            // 401 and 404: the token (or the URL) is wrong; trying again cannot help.
            (RequestError::Api(ApiError::InvalidToken), false),
            (unknown("Bad Request: something else"), false),
            (RequestError::Api(ApiError::BotBlocked), false),
        ];
        for (error, passing) in table {
            assert_eq!(is_passing(&error), passing, "{error}");
        }
    }

    #[tokio::test]
    async fn a_document_is_an_import_only_within_ten_minutes_of_the_ask_and_once() {
        let telegram = super::Telegram::new(teloxide::Bot::new("1:test"));
        let at = jiff::Timestamp::UNIX_EPOCH;
        let later = |minutes: i64| at + jiff::SignedDuration::from_mins(minutes);
        assert!(
            !telegram.take_import_ask(UserId(5), at).await,
            "never asked"
        );
        telegram.asked_import(UserId(5), at).await;
        assert!(
            !telegram.take_import_ask(UserId(6), later(1)).await,
            "another user"
        );
        assert!(telegram.take_import_ask(UserId(5), later(10)).await);
        assert!(
            !telegram.take_import_ask(UserId(5), later(10)).await,
            "used up"
        );
        telegram.asked_import(UserId(5), at).await;
        assert!(
            !telegram.take_import_ask(UserId(5), later(11)).await,
            "too late"
        );
    }

    #[tokio::test]
    async fn a_store_that_does_not_answer_holds_no_send() {
        let holds = super::Holds::default();
        let never = std::future::pending::<Result<Vec<(i64, std::time::Duration)>, String>>();
        // A guard against a hang only: the read is given up after a fifth of a second.
        let honoured =
            tokio::time::timeout(std::time::Duration::from_secs(60), holds.honour(7, never)).await;
        assert!(
            honoured.is_ok(),
            "a send waited on a store that never answered"
        );
    }

    #[tokio::test]
    async fn holds_are_read_from_the_store_at_most_once_in_a_while() {
        let holds = super::Holds::default();
        let reads = std::sync::atomic::AtomicUsize::new(0);
        for _ in 0..5 {
            holds
                .honour(7, async {
                    reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    Ok::<_, String>(Vec::new())
                })
                .await;
        }
        assert_eq!(reads.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    #[test]
    fn a_429_on_one_chat_holds_it_and_every_chat_for_a_moment() {
        let holds = super::Holds::default();
        let now = tokio::time::Instant::now();
        let wait = std::time::Duration::from_secs(30);
        holds.hold(7, now, wait);
        holds.hold(0, now, wait.min(super::ALL_CHATS_HOLD));
        assert_eq!(holds.wait(7, now), wait);
        assert_eq!(holds.wait(8, now), super::ALL_CHATS_HOLD);
        let later = now + super::ALL_CHATS_HOLD;
        assert!(holds.wait(8, later).is_zero());
        assert_eq!(holds.wait(7, later), wait - super::ALL_CHATS_HOLD);
    }

    #[tokio::test]
    async fn an_import_this_instance_remembers_counts_when_the_store_has_none() {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("import.db").display());
        let store = crate::store::Store::open_and_migrate(&url, std::time::Duration::from_secs(5))
            .await
            .expect("store");
        let telegram = super::Telegram::new(teloxide::Bot::new("1:test")).sharing(store);
        let at = jiff::Timestamp::UNIX_EPOCH;
        // As when storing the ask failed: only this instance's copy has it.
        telegram
            .import_asked
            .lock()
            .expect("lock")
            .insert(UserId(5), at);
        assert!(
            telegram
                .take_import_ask(UserId(5), at + jiff::SignedDuration::from_mins(1))
                .await
        );
    }
}
