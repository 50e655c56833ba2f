//! The Telegram front end: long polling with teloxide, the handler tree in one function,
//! and a [`Messenger`] that sends [`Response`]s as Telegram messages.
//!
//! Updates of one chat are handled in order (teloxide's default distribution by chat),
//! different chats concurrently. SIGINT and SIGTERM stop polling, let in-flight work
//! finish within `telegram.shutdown_grace_ms`, and return.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use teloxide::adaptors::throttle::Limits;
use teloxide::dispatching::{UpdateHandler, dialogue::GetChatId};
use teloxide::error_handlers::LoggingErrorHandler;
use teloxide::prelude::*;
use teloxide::types::{
    BotCommand, ChatAction, InlineKeyboardButton, InlineKeyboardMarkup, InputFile, MessageId,
    ParseMode, ReplyParameters,
};
use teloxide::update_listeners::Polling;
use teloxide::{ApiError, RequestError};
use tokio_util::sync::CancellationToken;

use crate::commands::{self, Command};
use crate::config::Settings;
use crate::journal::{EntryError, Incoming, Journal, Messenger, Response, SendError, Target};
use crate::language::Language;
use crate::llm::Llm;
use crate::render::{self, Reply, TELEGRAM_MESSAGE_LIMIT};
use crate::texts::Texts;
use crate::worker;

/// What the bot needs of a Bot API client: `Bot`, or `Throttle<Bot>` when
/// `telegram.throttle` is on.
pub trait TgBot:
    Requester<Err = RequestError, GetUpdates: Send> + Clone + Send + Sync + 'static
{
}
impl<T> TgBot for T where
    T: Requester<Err = RequestError, GetUpdates: Send> + Clone + Send + Sync + 'static
{
}

type HandlerResult = Result<(), anyhow::Error>;

/// Long-polling timeout of `getUpdates` (below the HTTP client's 17 s).
const POLL_TIMEOUT: Duration = Duration::from_secs(10);
/// Callback data of the `/delete` buttons.
const DELETE_YES: &str = "delete:yes";
const DELETE_NO: &str = "delete:no";
/// Telegram's `RetryAfter` is honoured this many times per request.
const MAX_TELEGRAM_RETRIES: u32 = 5;

/// Sends [`Response`]s through the Bot API.
#[derive(Clone)]
pub struct Telegram<B> {
    bot: B,
}

impl<B: TgBot> Telegram<B> {
    pub fn new(bot: B) -> Self {
        Self { bot }
    }

    async fn send_one(&self, target: Target, response: Response) -> Result<(), RequestError> {
        let chat = ChatId(target.chat_id);
        let reply_to = target
            .reply_to
            .and_then(|id| i32::try_from(id).ok())
            .map(|id| ReplyParameters::new(MessageId(id)).allow_sending_without_reply());
        match response {
            Response::Text(reply) => {
                let parts = render::split_message(reply.pieces(), TELEGRAM_MESSAGE_LIMIT);
                for (i, part) in parts.into_iter().enumerate() {
                    let reply_to = if i == 0 { reply_to.clone() } else { None };
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
                    match with_retry_after(|| send(part.clone(), true)).await {
                        Err(RequestError::Api(ApiError::CantParseEntities(reason))) => {
                            // Our escaping should make this impossible; if Telegram still
                            // disagrees, the user gets the words without the formatting.
                            tracing::error!(%reason, "Telegram could not parse a reply's HTML; sending it as plain text");
                            let plain = render::html_to_plain(&part);
                            with_retry_after(|| send(plain.clone(), false)).await?;
                        }
                        other => {
                            other?;
                        }
                    }
                }
            }
            Response::Photo {
                png,
                caption,
                file_name,
            } => {
                with_retry_after(|| {
                    self.bot
                        .send_photo(
                            chat,
                            InputFile::memory(png.clone()).file_name(file_name.clone()),
                        )
                        .caption(caption.clone())
                        .into_future()
                })
                .await?;
            }
            Response::Document {
                bytes,
                file_name,
                caption,
            } => {
                with_retry_after(|| {
                    self.bot
                        .send_document(
                            chat,
                            InputFile::memory(bytes.clone()).file_name(file_name.clone()),
                        )
                        .caption(caption.clone())
                        .into_future()
                })
                .await?;
            }
            Response::ConfirmDelete { language } => {
                let texts = Texts(language);
                let keyboard = InlineKeyboardMarkup::new([[
                    InlineKeyboardButton::callback(texts.delete_yes(), DELETE_YES),
                    InlineKeyboardButton::callback(texts.delete_no(), DELETE_NO),
                ]]);
                with_retry_after(|| {
                    self.bot
                        .send_message(chat, texts.delete_confirm())
                        .reply_markup(keyboard.clone())
                        .into_future()
                })
                .await?;
            }
        }
        Ok(())
    }
}

impl<B: TgBot> Messenger for Telegram<B> {
    async fn send(&self, target: Target, responses: Vec<Response>) -> Result<(), SendError> {
        for response in responses {
            self.send_one(target, response).await.map_err(classify)?;
        }
        Ok(())
    }

    async fn typing(&self, chat_id: i64) {
        let bot = self.bot.clone();
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

/// Runs a Bot API request, waiting out Telegram's `RetryAfter` a few times.
async fn with_retry_after<T, F, Fut>(mut request: F) -> Result<T, RequestError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, RequestError>>,
{
    let mut retries = 0;
    loop {
        match request().await {
            Err(RequestError::RetryAfter(wait)) if retries < MAX_TELEGRAM_RETRIES => {
                retries += 1;
                tracing::warn!(wait_s = wait.seconds(), "Telegram asked to retry later");
                tokio::time::sleep(wait.duration()).await;
            }
            other => return other,
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
        RequestError::Api(ApiError::Unknown(description)) if is_server_trouble(&description) => {
            SendError::Transient(description)
        }
        RequestError::Api(api) => {
            // Any other refusal will not change on a retry; it is our bug or the chat's
            // state, and the log says which.
            tracing::error!(error = %api, "Telegram refused a message");
            SendError::Gone(api.to_string())
        }
        RequestError::MigrateToChatId(_) => SendError::Gone("the chat moved".to_owned()),
        other => SendError::Transient(other.to_string()),
    }
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
        user_id: i64::try_from(from.id.0).ok()?,
        chat_id: msg.chat.id.0,
        message_id: i64::from(msg.id.0),
        username: from.username.clone(),
        language_code: from.language_code.clone(),
        text,
    })
}

fn sender_id(msg: &Message) -> Option<i64> {
    msg.from.as_ref().and_then(|u| i64::try_from(u.id.0).ok())
}

/// The handler tree: every update kind the bot answers, in one place.
pub fn schema<B: TgBot>() -> UpdateHandler<anyhow::Error> {
    let messages = Update::filter_message()
        .branch(
            dptree::filter(|msg: Message, journal: Arc<Journal>| !allowed(&msg, &journal))
                .endpoint(refuse::<B>),
        )
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
        .branch(dptree::endpoint(on_other::<B>));
    let edits = Update::filter_edited_message()
        .filter(|msg: Message, journal: Arc<Journal>| allowed(&msg, &journal))
        .filter(|msg: Message| !is_command_like(&msg))
        .filter_map(|msg: Message| msg.text().map(str::to_owned))
        .endpoint(on_edit::<B>);
    let callbacks = Update::filter_callback_query().endpoint(on_callback::<B>);
    dptree::entry()
        .branch(messages)
        .branch(edits)
        .branch(callbacks)
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
) -> HandlerResult {
    answer_in_language(&msg, &journal, &messenger, Texts::unknown_command).await;
    Ok(())
}

fn allowed(msg: &Message, journal: &Journal) -> bool {
    sender_id(msg).is_some_and(|id| journal.settings.telegram.is_allowed(id))
}

async fn refuse<B: TgBot>(msg: Message, messenger: Arc<Telegram<B>>) -> HandlerResult {
    let language = Language::from_code(msg.from.as_ref().and_then(|u| u.language_code.as_deref()));
    tracing::info!(
        chat_id = msg.chat.id.0,
        "message from a user not on the allowed list"
    );
    let reply = Reply::new().text(Texts(language).not_allowed());
    send_logged(&messenger, &msg, vec![Response::Text(reply)]).await;
    Ok(())
}

async fn on_text<B: TgBot>(
    msg: Message,
    text: String,
    journal: Arc<Journal>,
    messenger: Arc<Telegram<B>>,
) -> HandlerResult {
    handle_entry(&msg, text, &journal, &messenger, false).await;
    Ok(())
}

async fn on_edit<B: TgBot>(
    msg: Message,
    text: String,
    journal: Arc<Journal>,
    messenger: Arc<Telegram<B>>,
) -> HandlerResult {
    handle_entry(&msg, text, &journal, &messenger, true).await;
    Ok(())
}

/// A new or edited day log, with a sentence for the user when it goes wrong.
async fn handle_entry<B: TgBot>(
    msg: &Message,
    text: String,
    journal: &Journal,
    messenger: &Telegram<B>,
    edited: bool,
) {
    let Some(incoming) = incoming(msg, text) else {
        return; // channel posts and the like have no sender to journal for
    };
    let language = Language::from_code(incoming.language_code.as_deref());
    let result = if edited {
        journal.on_edit(messenger, incoming).await
    } else {
        journal.on_text(messenger, incoming).await
    };
    if let Err(error) = result {
        report_entry_error(messenger, msg, language, &error).await;
    }
}

async fn report_entry_error<B: TgBot>(
    messenger: &Telegram<B>,
    msg: &Message,
    language: Language,
    error: &EntryError,
) {
    tracing::error!(%error, chat_id = msg.chat.id.0, "day log handling failed");
    let texts = Texts(language);
    let text = match error {
        EntryError::NotSaved(_) => texts.not_saved(),
        EntryError::Later(_) => texts.internal_error(),
    };
    send_logged(
        messenger,
        msg,
        vec![Response::Text(Reply::new().text(text))],
    )
    .await;
}

async fn on_other<B: TgBot>(
    msg: Message,
    journal: Arc<Journal>,
    messenger: Arc<Telegram<B>>,
) -> HandlerResult {
    answer_in_language(&msg, &journal, &messenger, Texts::only_text).await;
    Ok(())
}

/// Answers `msg` with one sentence in the sender's stored language.
async fn answer_in_language<B: TgBot>(
    msg: &Message,
    journal: &Journal,
    messenger: &Telegram<B>,
    sentence: fn(Texts) -> &'static str,
) {
    let Some(id) = sender_id(msg) else {
        return;
    };
    let language = journal.language_of(id).await;
    let reply = Reply::new().text(sentence(Texts(language)));
    send_logged(messenger, msg, vec![Response::Text(reply)]).await;
}

async fn on_command<B: TgBot>(
    msg: Message,
    command: Command,
    journal: Arc<Journal>,
    messenger: Arc<Telegram<B>>,
) -> HandlerResult {
    let Some(user_id) = sender_id(&msg) else {
        return Ok(());
    };
    if let Some(from) = msg.from.as_ref() {
        // Commands may come before any entry: make sure the user exists with a language.
        let _ = journal
            .store
            .upsert_user(&crate::store::NewUser {
                user_id,
                chat_id: msg.chat.id.0,
                username: from.username.as_deref(),
                language: Language::from_code(from.language_code.as_deref()),
            })
            .await;
    }
    let responses = match commands::respond(&journal, user_id, command).await {
        Ok(responses) => responses,
        Err(error) => {
            tracing::error!(%error, user_id, "command failed");
            let language = journal.language_of(user_id).await;
            vec![Response::Text(
                Reply::new().text(Texts(language).internal_error()),
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
) -> HandlerResult {
    let user_id = i64::try_from(query.from.id.0).unwrap_or_default();
    let language = journal.language_of(user_id).await;
    let _ = bot.answer_callback_query(query.id.clone()).await;
    let reply = match query.data.as_deref() {
        Some(DELETE_YES) if journal.settings.telegram.is_allowed(user_id) => {
            match commands::delete_confirmed(&journal, user_id, language).await {
                Ok(reply) => reply,
                Err(error) => {
                    tracing::error!(%error, user_id, "delete failed");
                    Reply::new().text(Texts(language).internal_error())
                }
            }
        }
        Some(DELETE_NO) => Reply::new().text(Texts(language).delete_cancelled()),
        _ => return Ok(()),
    };
    if let Some(message) = query.regular_message() {
        // The buttons go away so the question cannot be answered twice.
        let _ = bot
            .edit_message_reply_markup(message.chat.id, message.id)
            .await;
    }
    if let Some(chat_id) = query.chat_id() {
        let target = Target {
            chat_id: chat_id.0,
            reply_to: None,
        };
        if let Err(error) = messenger.send(target, vec![Response::Text(reply)]).await {
            tracing::warn!(%error, user_id, "could not confirm a delete");
        }
    }
    Ok(())
}

async fn send_logged<B: TgBot>(messenger: &Telegram<B>, msg: &Message, responses: Vec<Response>) {
    let target = Target {
        chat_id: msg.chat.id.0,
        reply_to: Some(i64::from(msg.id.0)),
    };
    if let Err(error) = messenger.send(target, responses).await {
        tracing::warn!(%error, chat_id = msg.chat.id.0, "reply not delivered");
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

/// Registers the command menu in English (the default) and Russian.
async fn register_commands<B: TgBot>(bot: &B) {
    for language in [Language::En, Language::Ru] {
        let commands: Vec<BotCommand> = Command::menu(language)
            .into_iter()
            .map(|(name, description)| BotCommand::new(name, description))
            .collect();
        let mut request = bot.set_my_commands(commands);
        if language != Language::En {
            request = request.language_code(language.code());
        }
        if let Err(error) = request.await {
            tracing::warn!(%error, language = %language, "could not register the command menu");
        }
    }
}

/// `daylog run`: the daemon, until SIGINT or SIGTERM.
pub async fn run(settings: Settings) -> anyhow::Result<()> {
    // Listen for signals before anything else, so a SIGTERM during start-up (migrations,
    // connecting) is a clean stop too rather than the default kill.
    let stop = CancellationToken::new();
    let signals = listen_for_signals(stop.clone());
    let store = crate::cli::open_store(&settings).await?;
    let settings = Arc::new(settings);
    let client = crate::http_client().context("cannot build the HTTP client")?;
    let bot = build_bot(&settings, client.clone())?;
    let llm =
        Arc::new(Llm::with_client(&settings, client).context("cannot set up the LLM providers")?);
    let journal = Arc::new(Journal::new(Arc::clone(&settings), store.clone(), llm));
    let served = if settings.telegram.throttle {
        serve(bot.throttle(Limits::default()), journal, stop).await
    } else {
        serve(bot, journal, stop).await
    };
    signals.abort();
    store.close().await;
    tracing::info!("daylog stopped");
    served
}

/// Polls and handles updates until `stop` is cancelled, then stops polling and lets
/// in-flight work finish within `telegram.shutdown_grace_ms`. The worker runs beside it.
pub async fn serve<B: TgBot>(
    bot: B,
    journal: Arc<Journal>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let grace = journal.settings.telegram.shutdown_grace();
    if !wait_for_telegram(&bot, &stop).await? {
        return Ok(()); // stopped before Telegram ever answered
    }
    let messenger = Arc::new(Telegram::new(bot.clone()));
    register_commands(&bot).await;
    let worker = tokio::spawn(worker::run(
        Arc::clone(&journal),
        Arc::clone(&messenger),
        stop.clone(),
    ));
    let mut dispatcher = Dispatcher::builder(bot.clone(), schema::<B>())
        .dependencies(dptree::deps![Arc::clone(&journal), Arc::clone(&messenger)])
        .default_handler(|_| async {})
        .build();
    let shutdown = dispatcher.shutdown_token();
    let stopper = tokio::spawn({
        let stop = stop.clone();
        async move {
            stop.cancelled().await;
            // The dispatcher may still be starting; ask until it listens.
            for _ in 0..200 {
                match shutdown.shutdown() {
                    Ok(done) => {
                        done.await;
                        return;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(25)).await,
                }
            }
        }
    });
    let listener = Polling::builder(bot.clone())
        .timeout(POLL_TIMEOUT)
        .delete_webhook()
        .await
        .build();
    let listener_errors =
        LoggingErrorHandler::with_custom_text("polling Telegram failed; retrying");
    tracing::info!("daylog is running");
    let dispatch = dispatcher.try_dispatch_with_listener(listener, listener_errors);
    tokio::pin!(dispatch);
    // One grace period for everything in flight, counted from the stop.
    let dispatched = tokio::select! {
        result = &mut dispatch => Some(result),
        () = stop.cancelled() => None,
    };
    let stopped_at = tokio::time::Instant::now();
    let dispatched = match dispatched {
        Some(result) => result,
        None => match tokio::time::timeout_at(stopped_at + grace, &mut dispatch).await {
            Ok(result) => result,
            Err(_) => {
                tracing::warn!(
                    grace_ms = grace.as_millis() as u64,
                    "in-flight work did not finish in time; stored logs resume at the next start"
                );
                Ok(())
            }
        },
    };
    stop.cancel();
    if tokio::time::timeout_at(stopped_at + grace, worker)
        .await
        .is_err()
    {
        tracing::warn!("the worker did not stop in time");
    }
    stopper.abort();
    dispatched.map_err(|e| anyhow::anyhow!("Telegram refused the bot: {e}"))
}

/// Waits until Telegram answers `getMe`: `Ok(true)` then, `Ok(false)` when stopped
/// first, an error when the token is refused (retrying would not help).
async fn wait_for_telegram<B: TgBot>(bot: &B, stop: &CancellationToken) -> anyhow::Result<bool> {
    let mut wait = Duration::from_millis(500);
    loop {
        match bot.get_me().await {
            Ok(me) => {
                tracing::info!(username = %me.username(), "connected to Telegram");
                return Ok(true);
            }
            Err(RequestError::Api(error)) => {
                anyhow::bail!("Telegram refused the bot token ({error}); check TELOXIDE_TOKEN")
            }
            Err(error) => {
                tracing::warn!(%error, retry_in_ms = wait.as_millis() as u64, "cannot reach Telegram yet");
            }
        }
        tokio::select! {
            () = stop.cancelled() => return Ok(false),
            () = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(Duration::from_secs(30));
    }
}

/// Cancels `stop` on SIGINT or SIGTERM (teloxide's own handler knows only SIGINT). On
/// Unix the handlers are installed before this returns.
fn listen_for_signals(stop: CancellationToken) -> tokio::task::JoinHandle<()> {
    #[cfg(unix)]
    let signals = {
        use tokio::signal::unix::{SignalKind, signal};
        (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        )
    };
    tokio::spawn(async move {
        #[cfg(unix)]
        match signals {
            (Ok(mut interrupt), Ok(mut term)) => {
                tokio::select! {
                    _ = interrupt.recv() => {}
                    _ = term.recv() => {}
                }
            }
            (_, Err(error)) | (Err(error), _) => {
                tracing::warn!(%error, "cannot listen for SIGTERM/SIGINT; falling back to Ctrl-C only");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("stopping: no new updates, finishing work in hand");
        stop.cancel();
    })
}
