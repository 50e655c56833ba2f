//! What a front end is to the journal: where an answer goes ([`Target`]), what it shows
//! ([`Response`]), how it answers ([`Messenger`]) and how that can fail ([`SendError`],
//! [`FetchError`]). Telegram (`bot`) and the terminal (`terminal`) implement [`Messenger`];
//! the journal, the worker and the commands only speak these types.

use std::future::Future;

use crate::domain::{ChatId, MessageId, UserId};
use crate::language::Language;
use crate::llm::Audio;
use crate::render::Reply;

/// Where an answer goes: a chat, as a reply to one message when there is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub chat_id: ChatId,
    pub reply_to: Option<MessageId>,
}

impl Target {
    /// A reply to `message` in `chat`.
    pub const fn reply(chat_id: ChatId, message: MessageId) -> Self {
        Self {
            chat_id,
            reply_to: Some(message),
        }
    }

    /// A message of its own in `chat` (a reminder, a digest).
    pub const fn chat(chat_id: ChatId) -> Self {
        Self {
            chat_id,
            reply_to: None,
        }
    }
}

/// One thing to show the user. Front ends decide how (HTML message, photo, file, …).
#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    Text(Reply),
    Photo {
        png: Vec<u8>,
        caption: String,
        /// What a front end that writes files (`daylog chat`) calls it.
        file_name: String,
    },
    Document {
        bytes: Vec<u8>,
        file_name: String,
        caption: String,
    },
    /// Ask `user_id` to confirm `/delete` (Telegram: an inline keyboard only they can
    /// answer, in a group too).
    ConfirmDelete {
        language: Language,
        user_id: UserId,
    },
    /// A sentence with a button that opens the Mini App at `url` (Telegram: a `web_app`
    /// button, which Telegram allows in private chats only; elsewhere the link).
    OpenApp {
        text: String,
        button: String,
        url: String,
    },
}

/// Why an answer did not go out.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SendError {
    /// Worth trying again later (network, Telegram down).
    #[error("temporary delivery failure: {0}")]
    Transient(String),
    /// Never deliverable (the user blocked the bot, the chat is gone).
    #[error("undeliverable: {0}")]
    Gone(String),
    /// This message was refused (a formatting Telegram could not parse, a chart it could
    /// not process): sending it again will not help, but the chat is fine, so what the
    /// user asked for (reminders, digests) stays on.
    #[error("refused: {0}")]
    Refused(String),
}

/// Why a voice note's recording could not be fetched.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FetchError {
    /// Worth trying again later (network, Telegram down).
    #[error("temporary download failure: {0}")]
    Transient(String),
    /// Refused for now in words that may mean gone or not (Telegram's "wrong file_id or
    /// the file is temporarily unavailable"): tried again, `voice.fetch_max_tries` times.
    #[error("recording refused for now: {0}")]
    Refused(String),
    /// Never fetchable (the file is gone, or too large to download).
    #[error("recording unavailable: {0}")]
    Gone(String),
}

/// Telegram's download limit for bots; larger recordings are refused (docs/behaviour.md, Voice notes).
pub const MAX_VOICE_BYTES: u64 = 20 * 1024 * 1024;

/// A front end's way to answer.
pub trait Messenger: Send + Sync + 'static {
    fn send(
        &self,
        target: Target,
        responses: Vec<Response>,
    ) -> impl Future<Output = Result<(), SendError>> + Send;

    /// Shows that the bot is working (Telegram's "typing…"); may do nothing. It must
    /// return quickly (fire and forget): the analysis waits while it runs.
    fn typing(&self, chat_id: ChatId) -> impl Future<Output = ()> + Send;

    /// Whether a reply shows the message it answers (Telegram quotes it). A front end
    /// that does not (the terminal) gets a late answer with its entry named.
    fn shows_what_a_reply_answers(&self) -> bool {
        true
    }

    /// The recording of a voice note, in memory only (never written to disk), by what
    /// the front end stored as its `file_id`. A front end without voice notes has none.
    fn fetch_audio(&self, file_id: &str) -> impl Future<Output = Result<Audio, FetchError>> + Send {
        let _ = file_id;
        async {
            Err(FetchError::Gone(
                "this front end has no recordings".to_owned(),
            ))
        }
    }
}

/// The first `max` characters of `text` (never cutting a character).
pub fn truncate_chars(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((end, _)) => &text[..end],
        None => text,
    }
}
