//! Webhook mode's door (docs/operations.md, Webhook mode): the one route on
//! `http.listen` that Telegram posts updates to, mounted by `http`, and the `setWebhook`
//! of the start-up.
//!
//! teloxide ships a webhook listener (`update_listeners::webhooks::axum`); its shape is
//! kept here (a router for the path of the URL, the secret header, a sender that can be
//! closed) but not the listener itself: it answers 200 before anything is stored, drops
//! a body it cannot parse, compares the secret in variable time and deletes the webhook
//! when it stops, which would silence every other instance serving the same bot.
//!
//! Each post goes through, in this order: the method (POST, else 405); the secret in
//! `X-Telegram-Bot-Api-Secret-Token`, compared in constant time before a byte of the body
//! is read (401, nothing stored); the size (over [`MAX_BODY`] 413); then the body is
//! handed to the [`Receive`]r — the update inbox — whose answer decides the status: 200
//! once it is committed (a duplicate and a dead letter too), 5xx otherwise so that
//! Telegram delivers it again. Until the bot takes updates, and from the moment the
//! daemon stops, posts get 503: Telegram keeps them and tries again.

use std::sync::{Arc, RwLock};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures::future::BoxFuture;
use subtle::ConstantTimeEq as _;
use teloxide::prelude::*;
use teloxide::types::AllowedUpdate;
use tokio_util::sync::CancellationToken;

use crate::config::{ApiKey, Settings, TelegramMode};

/// The header Telegram sends the `secret_token` of `setWebhook` in.
pub const SECRET_HEADER: &str = "x-telegram-bot-api-secret-token";
/// The largest body taken: an update is a few kilobytes; Telegram's own cap on a message
/// (4096 characters, with entities) stays far below.
pub const MAX_BODY: usize = 1024 * 1024;
/// The longest secret Telegram accepts; a longer header is wrong without a comparison.
const MAX_SECRET: usize = 256;
/// The kinds of update asked for, in both modes: what the handler tree handles (a
/// message, an edit, the `/delete` button).
pub const ALLOWED_UPDATES: [AllowedUpdate; 3] = [
    AllowedUpdate::Message,
    AllowedUpdate::EditedMessage,
    AllowedUpdate::CallbackQuery,
];

/// Why a body could not be taken: either way Telegram is told to deliver it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotTaken {
    /// The commit failed (a full disk, a database that does not answer): 500.
    NotStored,
    /// The bot is not taking updates now (starting, stopping): 503.
    Unavailable,
}

/// What takes a webhook body: commits it (as an update, or a dead letter when it is not
/// one) before answering `Ok`, which is what lets the 2xx promise that nothing is lost.
pub trait Receive: Send + Sync + 'static {
    fn receive<'a>(&'a self, body: &'a [u8]) -> BoxFuture<'a, Result<(), NotTaken>>;
}

/// The update inbox takes a webhook body as it takes a polled one: committed (a
/// duplicate and a dead letter are taken too), or not stored — then it has already told
/// the user once that the entry is not saved yet, and Telegram is asked to try again.
impl Receive for super::Inbox {
    fn receive<'a>(&'a self, body: &'a [u8]) -> BoxFuture<'a, Result<(), NotTaken>> {
        Box::pin(async move {
            match super::Inbox::receive(self, body).await {
                Ok(_) => Ok(()),
                Err(error) => {
                    tracing::warn!(%error, "a webhook update could not be stored; Telegram will deliver it again");
                    Err(NotTaken::NotStored)
                }
            }
        })
    }
}

/// Between the listener, which is up before the bot connects, and the bot, which takes
/// updates only once `setWebhook` is done: closed (503) until [`Gate::open`], closed
/// again by [`Gate::close`]. `/readyz` reads it in webhook mode.
#[derive(Clone, Default)]
pub struct Gate(Arc<RwLock<Option<Arc<dyn Receive>>>>);

impl Gate {
    /// From now on posts go to `receiver`.
    pub fn open(&self, receiver: Arc<dyn Receive>) {
        *self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(receiver);
    }

    /// From now on posts get 503 (the daemon stops).
    pub fn close(&self) {
        *self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }

    /// Whether posts are taken.
    pub fn is_open(&self) -> bool {
        self.receiver().is_some()
    }

    fn receiver(&self) -> Option<Arc<dyn Receive>> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// Webhook mode's update source, in place of long polling: posts go to `inbox` from now
/// until `stop` (then 503 again, while the handling finishes). The listener itself is
/// `http`'s, up since before start-up.
pub async fn take_posts(gate: &Gate, inbox: super::Inbox, stop: &CancellationToken) {
    gate.open(Arc::new(inbox));
    tracing::info!("daylog is running: taking Telegram's posts");
    stop.cancelled().await;
    gate.close();
}

/// Everything `http` needs to mount the webhook: the path, the secret, the gate.
#[derive(Clone)]
pub struct Mount {
    path: String,
    secret: ApiKey,
    gate: Gate,
}

impl Mount {
    /// The webhook of `settings` in webhook mode (the settings guarantee the URL and the
    /// secret there), with `gate` between it and the bot; `None` in polling mode.
    pub fn of(settings: &Settings, gate: &Gate) -> Option<Self> {
        if settings.telegram.mode() != TelegramMode::Webhook {
            return None;
        }
        let url = settings.telegram.webhook_url()?;
        let secret = settings.secrets.webhook_secret.clone()?;
        Some(Self {
            path: url.path().to_owned(),
            secret,
            gate: gate.clone(),
        })
    }

    /// A mount at `path` (tests).
    pub fn at(path: &str, secret: ApiKey, gate: Gate) -> Self {
        Self {
            path: path.to_owned(),
            secret,
            gate,
        }
    }

    /// Whether the bot takes posts now (`/readyz` in webhook mode).
    pub fn is_open(&self) -> bool {
        self.gate.is_open()
    }

    /// The route; from the moment `stopping` fires every post gets 503.
    pub fn router(&self, stopping: CancellationToken) -> Router {
        Router::new()
            .route(&self.path, post(take))
            .with_state(Door {
                secret: self.secret.clone(),
                gate: self.gate.clone(),
                stopping,
            })
    }
}

#[derive(Clone)]
struct Door {
    secret: ApiKey,
    gate: Gate,
    stopping: CancellationToken,
}

/// One post from Telegram (the method is already POST: the router answers 405 to others).
async fn take(State(door): State<Door>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    if !secret_matches(&parts.headers, door.secret.expose()) {
        tracing::debug!("a webhook post without the right secret was refused");
        return StatusCode::UNAUTHORIZED.into_response();
    }
    if door.stopping.is_cancelled() {
        return unavailable();
    }
    let Some(receiver) = door.gate.receiver() else {
        return unavailable();
    };
    let body = match read_body(&parts.headers, body).await {
        Ok(body) => body,
        Err(status) => return status.into_response(),
    };
    match receiver.receive(&body).await {
        Ok(()) => StatusCode::OK.into_response(),
        Err(NotTaken::NotStored) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        Err(NotTaken::Unavailable) => unavailable(),
    }
}

/// 503 with a hint of when to come back (Telegram retries on its own schedule anyway).
fn unavailable() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, "1")],
    )
        .into_response()
}

/// The body, at most [`MAX_BODY`] bytes: 413 beyond (said by `Content-Length` before any
/// byte is read, or found while reading), 400 when the client stops sending.
async fn read_body(headers: &HeaderMap, body: Body) -> Result<axum::body::Bytes, StatusCode> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > MAX_BODY as u64) {
        return Err(StatusCode::PAYLOAD_TOO_LARGE);
    }
    use http_body_util::BodyExt as _;
    match http_body_util::Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            Err(StatusCode::PAYLOAD_TOO_LARGE)
        }
        Err(_) => Err(StatusCode::BAD_REQUEST),
    }
}

/// Whether the request carries `secret`, compared in constant time: both sides padded to
/// the longest secret Telegram allows, their lengths compared the same way, so the time
/// taken says nothing about how much of a guess was right, nor about the secret's length.
fn secret_matches(headers: &HeaderMap, secret: &str) -> bool {
    let Some(given) = headers.get(SECRET_HEADER).map(|v| v.as_bytes()) else {
        return false;
    };
    if given.len() > MAX_SECRET || secret.len() > MAX_SECRET {
        return false;
    }
    let padded = |bytes: &[u8]| {
        let mut out = [0_u8; MAX_SECRET];
        out[..bytes.len()].copy_from_slice(bytes);
        out
    };
    let (a, b) = (padded(given), padded(secret.as_bytes()));
    let same_length = (given.len() as u16).ct_eq(&(secret.len() as u16));
    bool::from(a.ct_eq(&b) & same_length)
}

/// `setWebhook` as the start-up calls it: the URL, the secret, `max_connections`, the
/// three kinds of update, and the updates Telegram holds kept (`drop_pending_updates =
/// false`: they are entries not yet stored).
pub fn set_webhook_request<B: Requester>(bot: &B, settings: &Settings) -> Option<B::SetWebhook> {
    use teloxide::payloads::SetWebhookSetters as _;
    let url = settings.telegram.webhook_url()?.clone();
    let secret = settings.secrets.webhook_secret.as_ref()?;
    Some(
        bot.set_webhook(url)
            .secret_token(secret.expose().to_owned())
            .max_connections(settings.telegram.max_connections())
            .allowed_updates(ALLOWED_UPDATES)
            .drop_pending_updates(false),
    )
}

/// Webhook mode's start-up after `getMe`: `setWebhook` (unless `telegram.set_webhook`
/// is off), retried while Telegram has passing trouble. A refusal (a URL or port
/// Telegram does not accept) stops the start with Telegram's words; the secret is in
/// the request only, never in what is logged. `Ok(false)` when stopped meanwhile.
pub(super) async fn register<B: super::TgBot>(
    bot: &B,
    settings: &Settings,
    stop: &CancellationToken,
) -> anyhow::Result<bool> {
    use teloxide::requests::Request as _;
    if !settings.telegram.set_webhook() {
        tracing::info!("telegram.set_webhook is off: serving the webhook as it is registered");
        return Ok(true);
    }
    let set = || async {
        match set_webhook_request(bot, settings) {
            Some(request) => request.send().await.map(|_| ()),
            // The settings refuse webhook mode without a URL and a secret.
            None => Ok(()),
        }
    };
    match super::at_start("setWebhook", stop, None, set).await {
        Ok(Some(())) => {
            let host = settings
                .telegram
                .webhook_url()
                .and_then(url::Url::host_str)
                .unwrap_or_default();
            tracing::info!(%host, "webhook registered with Telegram");
            Ok(true)
        }
        Ok(None) => Ok(false),
        Err(error) => anyhow::bail!(
            "Telegram refused setWebhook: {error}; check telegram.webhook_url (https, a port of 443, 80, 88 or 8443, reachable from the internet)"
        ),
    }
}

/// `daylog doctor --ping` in webhook mode: what Telegram says of the webhook
/// (`getWebhookInfo`): the URL it posts to, the updates it holds, its last error. `Ok`
/// when it posts to the configured URL and had no trouble, `Err` with the same line
/// otherwise. The secret is never part of it (Telegram does not give it back).
pub async fn doctor_line(settings: &Settings) -> Result<String, String> {
    use teloxide::requests::Request as _;
    let client = crate::telegram_client().map_err(|e| e.without_url().to_string())?;
    let bot = super::build_bot(settings, client).map_err(|e| e.to_string())?;
    let asked = tokio::time::timeout(
        std::time::Duration::from_secs(15),
        bot.get_webhook_info().send(),
    )
    .await;
    let info = match asked {
        Ok(Ok(info)) => info,
        // Its kind only: a network error's URL would carry the token.
        Ok(Err(teloxide::RequestError::Api(error))) => {
            return Err(format!("getWebhookInfo refused: {error}"));
        }
        Ok(Err(_)) | Err(_) => {
            return Err(
                "getWebhookInfo did not answer: check TELOXIDE_API_URL and the network".to_owned(),
            );
        }
    };
    let configured = settings.telegram.webhook_url();
    let mut line = match &info.url {
        Some(url) => format!("webhook: Telegram posts to {url}"),
        None => "webhook: none registered with Telegram".to_owned(),
    };
    line.push_str(&format!(
        ", {} update(s) waiting",
        info.pending_update_count
    ));
    if let Some(message) = &info.last_error_message {
        let when = info
            .last_error_date
            .and_then(|date| jiff::Timestamp::from_second(date.timestamp()).ok())
            .map(|at| format!(" at {}", at.strftime("%Y-%m-%d %H:%M:%S UTC")))
            .unwrap_or_default();
        line.push_str(&format!("; last error{when}: {message}"));
    }
    let matches = info.url.as_ref() == configured;
    if !matches {
        line.push_str(match (info.url.is_some(), settings.telegram.set_webhook()) {
            (_, true) => "; not telegram.webhook_url yet: `daylog run` registers it at start-up",
            (_, false) => "; not telegram.webhook_url, and telegram.set_webhook is off: register it yourself",
        });
    }
    if matches && info.last_error_message.is_none() {
        Ok(line)
    } else {
        Err(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Method;
    use std::sync::Mutex;
    use tower::ServiceExt as _;

    const SECRET: &str = "right-secret_1";

    /// Takes what it is given, or answers as scripted.
    #[derive(Default)]
    struct Inbox {
        taken: Mutex<Vec<Vec<u8>>>,
        refuse: Mutex<Option<NotTaken>>,
    }

    impl Receive for Inbox {
        fn receive<'a>(&'a self, body: &'a [u8]) -> BoxFuture<'a, Result<(), NotTaken>> {
            Box::pin(async move {
                if let Some(refusal) = *self.refuse.lock().expect("lock") {
                    return Err(refusal);
                }
                self.taken.lock().expect("lock").push(body.to_vec());
                Ok(())
            })
        }
    }

    fn door() -> (Mount, Arc<Inbox>, CancellationToken) {
        let gate = Gate::default();
        let inbox = Arc::new(Inbox::default());
        gate.open(inbox.clone());
        let mount = Mount::at("/tg/hook", ApiKey::new(SECRET), gate);
        (mount, inbox, CancellationToken::new())
    }

    async fn post_to(
        mount: &Mount,
        stopping: &CancellationToken,
        method: Method,
        secret: Option<&str>,
        body: Vec<u8>,
    ) -> StatusCode {
        let mut request = Request::builder().method(method).uri("/tg/hook");
        if let Some(secret) = secret {
            request = request.header(SECRET_HEADER, secret);
        }
        let request = request.body(Body::from(body)).expect("request");
        mount
            .router(stopping.clone())
            .oneshot(request)
            .await
            .expect("answer")
            .status()
    }

    #[tokio::test]
    async fn only_a_post_with_the_secret_is_taken() {
        let (mount, inbox, stopping) = door();
        let update = br#"{"update_id":1}"#.to_vec();
        for (method, secret, status) in [
            (Method::GET, Some(SECRET), StatusCode::METHOD_NOT_ALLOWED),
            (Method::PUT, Some(SECRET), StatusCode::METHOD_NOT_ALLOWED),
            (Method::POST, None, StatusCode::UNAUTHORIZED),
            (
                Method::POST,
                Some("right-secret_"),
                StatusCode::UNAUTHORIZED,
            ),
            (
                Method::POST,
                Some("right-secret_12"),
                StatusCode::UNAUTHORIZED,
            ),
            (Method::POST, Some(""), StatusCode::UNAUTHORIZED),
            (
                Method::POST,
                Some(&"x".repeat(300)),
                StatusCode::UNAUTHORIZED,
            ),
        ] {
            assert_eq!(
                post_to(&mount, &stopping, method.clone(), secret, update.clone()).await,
                status,
                "{method} {secret:?}"
            );
        }
        assert!(inbox.taken.lock().expect("lock").is_empty());
        assert_eq!(
            post_to(
                &mount,
                &stopping,
                Method::POST,
                Some(SECRET),
                update.clone()
            )
            .await,
            StatusCode::OK
        );
        assert_eq!(*inbox.taken.lock().expect("lock"), vec![update]);
    }

    #[tokio::test]
    async fn a_body_over_a_mebibyte_is_refused_unread() {
        let (mount, inbox, stopping) = door();
        let big = vec![b'x'; MAX_BODY + 1];
        assert_eq!(
            post_to(&mount, &stopping, Method::POST, Some(SECRET), big).await,
            StatusCode::PAYLOAD_TOO_LARGE
        );
        // Without the secret the size is not even looked at.
        let big = vec![b'x'; MAX_BODY + 1];
        assert_eq!(
            post_to(&mount, &stopping, Method::POST, None, big).await,
            StatusCode::UNAUTHORIZED
        );
        let exactly = vec![b'x'; MAX_BODY];
        assert_eq!(
            post_to(&mount, &stopping, Method::POST, Some(SECRET), exactly).await,
            StatusCode::OK
        );
        assert_eq!(inbox.taken.lock().expect("lock").len(), 1);
    }

    #[tokio::test]
    async fn what_is_not_stored_is_asked_for_again() {
        let (mount, inbox, stopping) = door();
        *inbox.refuse.lock().expect("lock") = Some(NotTaken::NotStored);
        let body = || b"{}".to_vec();
        assert_eq!(
            post_to(&mount, &stopping, Method::POST, Some(SECRET), body()).await,
            StatusCode::INTERNAL_SERVER_ERROR
        );
        *inbox.refuse.lock().expect("lock") = Some(NotTaken::Unavailable);
        assert_eq!(
            post_to(&mount, &stopping, Method::POST, Some(SECRET), body()).await,
            StatusCode::SERVICE_UNAVAILABLE
        );
        *inbox.refuse.lock().expect("lock") = None;
        stopping.cancel();
        assert_eq!(
            post_to(&mount, &stopping, Method::POST, Some(SECRET), body()).await,
            StatusCode::SERVICE_UNAVAILABLE
        );
        let closed = CancellationToken::new();
        mount.gate.close();
        assert!(!mount.is_open());
        assert_eq!(
            post_to(&mount, &closed, Method::POST, Some(SECRET), body()).await,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert!(inbox.taken.lock().expect("lock").is_empty());
    }
}
