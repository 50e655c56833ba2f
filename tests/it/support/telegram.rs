//! A fake Telegram Bot API on 127.0.0.1: enough of `getMe`, `getUpdates` (long polling
//! with `offset`), `sendMessage`, `sendPhoto`/`sendDocument` (multipart), chat actions,
//! commands and callbacks for the real teloxide dispatcher to run against it. Tests
//! queue updates, script failures, and wait on what the bot sent. Files (voice notes)
//! are served as the Bot API does: `getFile` gives a `file_path`, and
//! `GET /file/bot<token>/<file_path>` gives the bytes.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::Notify;

pub const TOKEN: &str = "123456:TEST-token";

/// One request the bot made, as the fake saw it.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: String,
    /// JSON body, or the text fields of a multipart body.
    pub body: Value,
    /// Raw bytes of a multipart file part (photo, document).
    pub file: Option<Vec<u8>>,
    /// The tag of the API URL the call came through ([`FakeTelegram::url_tagged`]):
    /// which process sent it, when several share the fake; `None` through [`FakeTelegram::url`].
    pub via: Option<String>,
}

impl Call {
    pub fn chat_id(&self) -> Option<i64> {
        match &self.body["chat_id"] {
            Value::Number(n) => n.as_i64(),
            Value::String(s) => s.parse().ok(),
            _ => None,
        }
    }

    pub fn text(&self) -> &str {
        self.body["text"].as_str().unwrap_or_default()
    }

    /// The message this one replies to; a multipart body (a photo, a document) carries
    /// `reply_parameters` as a JSON text field.
    pub fn reply_to(&self) -> Option<i64> {
        match &self.body["reply_parameters"] {
            Value::String(json) => serde_json::from_str::<Value>(json).ok()?["message_id"].as_i64(),
            parameters => parameters["message_id"].as_i64(),
        }
    }
}

#[derive(Default)]
struct Inner {
    updates: Vec<Value>,
    calls: Vec<Call>,
    /// Scripted answers: (method, chat filter) → status and body, used once each.
    failures: VecDeque<Failure>,
    /// Chats whose every send fails with 403 (the user blocked the bot).
    blocked_chats: Vec<i64>,
    /// Methods that never answer (a Bot API that hangs), and the calls of them so far.
    hanging: Vec<String>,
    hung: Vec<String>,
    next_message_id: i64,
    /// Files by `file_id`: their `file_path` and bytes.
    files: std::collections::HashMap<String, (String, Vec<u8>)>,
    /// `file_path`s downloaded so far, in order.
    downloads: Vec<String>,
    /// File ids `getFile` always answers "wrong file_id or the file is temporarily
    /// unavailable" for.
    refused_files: std::collections::HashSet<String>,
    /// Downloads that answer 500 before one succeeds.
    download_failures: usize,
    download_failure_status: Option<StatusCode>,
    /// The highest `offset` a `getUpdates` has sent: every update below it is confirmed,
    /// and Telegram never delivers it again.
    confirmed_below: i64,
    /// The `allowed_updates` of the last `getUpdates` that sent any.
    allowed_updates: Value,
    /// `getUpdates` calls answered so far.
    polls: usize,
    /// The id of this fake's first update: each fake of the process starts its own
    /// range, so a bot started again on the same database with a new fake is given new
    /// ids, as Telegram's keep growing (the inbox would take a repeated id for a
    /// redelivery).
    first_update_id: i64,
    /// Webhook mode, as Telegram keeps it: see [`Webhook`].
    webhook: Webhook,
}

/// Where the next fake's update ids begin.
static NEXT_FIRST_UPDATE_ID: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(1);

/// A scripted failure: method, chat, text the message must contain, and the answer.
type Failure = (String, Option<i64>, Option<String>, u16, Value);

#[derive(Clone)]
pub struct FakeTelegram {
    inner: Arc<Mutex<Inner>>,
    changed: Arc<Notify>,
    pub addr: SocketAddr,
}

impl FakeTelegram {
    pub async fn start() -> Self {
        let inner = Arc::new(Mutex::new(Inner {
            next_message_id: 100_000,
            first_update_id: NEXT_FIRST_UPDATE_ID
                .fetch_add(100_000, std::sync::atomic::Ordering::Relaxed),
            ..Inner::default()
        }));
        let changed = Arc::new(Notify::new());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let fake = Self {
            inner,
            changed,
            addr,
        };
        let app = Router::new()
            .route("/{bot}/{method}", post(handle))
            .route("/{via}/{bot}/{method}", post(handle_tagged))
            .route("/file/{bot}/{*path}", get(download))
            .with_state(fake.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        fake
    }

    /// The `TELOXIDE_API_URL` pointing here.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// A `TELOXIDE_API_URL` pointing here whose calls are recorded with `tag`
    /// ([`Call::via`]): each process of a test given its own tells its calls apart.
    /// (Methods only: files are not downloaded through it.)
    pub fn url_tagged(&self, tag: &str) -> String {
        format!("http://{}/{tag}", self.addr)
    }

    pub fn push_update(&self, mut update: Value) -> i64 {
        let mut inner = self.inner.lock().expect("lock");
        let id = inner.first_update_id + inner.updates.len() as i64;
        update["update_id"] = json!(id);
        inner.updates.push(update);
        drop(inner);
        self.changed.notify_waiters();
        self.deliver();
        id
    }

    /// The kinds of update the bot asked for, sorted (empty: it never said).
    pub fn allowed_updates(&self) -> Vec<String> {
        let inner = self.inner.lock().expect("lock");
        let mut kinds: Vec<String> = inner
            .allowed_updates
            .as_array()
            .map(|kinds| {
                kinds
                    .iter()
                    .filter_map(|k| k.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        kinds.sort();
        kinds
    }

    /// Waits until the bot has confirmed update `id` (asked for the updates after it).
    pub async fn wait_confirmed(&self, id: i64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let notified = self.changed.notified();
            if self.inner.lock().expect("lock").confirmed_below > id {
                return;
            }
            assert!(Instant::now() < deadline, "update {id} never confirmed");
            let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
        }
    }

    /// Every update below this one is confirmed: the bot has asked for those after it.
    pub fn confirmed_below(&self) -> i64 {
        self.inner.lock().expect("lock").confirmed_below
    }

    /// `getUpdates` calls answered so far.
    pub fn polls(&self) -> usize {
        self.inner.lock().expect("lock").polls
    }

    /// Waits until `getUpdates` has been called `n` more times than `since`.
    pub async fn wait_polls(&self, since: usize, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let notified = self.changed.notified();
            if self.polls() >= since + n {
                return;
            }
            assert!(Instant::now() < deadline, "{n} more polls never came");
            let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
        }
    }

    /// Delivers update `id` once more, with the same `update_id`, as Telegram does when
    /// it did not see it confirmed (a webhook's answer lost, an offset not sent).
    pub fn redeliver(&self, id: i64) {
        let mut inner = self.inner.lock().expect("lock");
        let again = inner
            .updates
            .iter()
            .find(|u| u["update_id"].as_i64() == Some(id))
            .cloned()
            .expect("an update pushed before");
        inner
            .updates
            .retain(|u| u["update_id"].as_i64() != Some(id));
        let at = inner
            .updates
            .iter()
            .position(|u| u["update_id"].as_i64().unwrap_or(0) > id)
            .unwrap_or(inner.updates.len());
        inner.updates.insert(at, again);
        inner.confirmed_below = inner.confirmed_below.min(id);
        drop(inner);
        self.changed.notify_waiters();
    }

    /// The next call of `method` (to `chat`, if given) answers `status` with `body`.
    pub fn fail_next(&self, method: &str, chat: Option<i64>, status: u16, body: Value) {
        self.script((method.to_owned(), chat, None, status, body));
    }

    fn script(&self, failure: Failure) {
        self.inner.lock().expect("lock").failures.push_back(failure);
    }

    /// The next call of `method` to `chat` whose text contains `fragment` answers
    /// `status` with `body` (one part of a message sent in several).
    pub fn fail_next_containing(
        &self,
        method: &str,
        chat: i64,
        fragment: &str,
        status: u16,
        body: Value,
    ) {
        self.script((
            method.to_owned(),
            Some(chat),
            Some(fragment.to_owned()),
            status,
            body,
        ));
    }

    /// Scripted failures (`fail_next`) not used yet.
    pub fn failures_left(&self) -> usize {
        self.inner.lock().expect("lock").failures.len()
    }

    /// From now on every call of `method` hangs: accepted, never answered.
    pub fn hang(&self, method: &str) {
        self.inner
            .lock()
            .expect("lock")
            .hanging
            .push(method.to_owned());
    }

    /// Calls of `method` answer again (those already hanging stay so).
    pub fn unhang(&self, method: &str) {
        self.inner
            .lock()
            .expect("lock")
            .hanging
            .retain(|m| m != method);
    }

    /// Calls of hanging methods so far (they are not in [`FakeTelegram::calls`]).
    pub fn hung(&self) -> Vec<String> {
        self.inner.lock().expect("lock").hung.clone()
    }

    /// Serves `bytes` as the file `file_id` at `file_path`.
    pub fn add_file(&self, file_id: &str, file_path: &str, bytes: &[u8]) {
        self.inner
            .lock()
            .expect("lock")
            .files
            .insert(file_id.to_owned(), (file_path.to_owned(), bytes.to_vec()));
    }

    /// Every `getFile` of `file_id` answers 400 "wrong file_id or the file is
    /// temporarily unavailable", as Telegram does for a file it will not serve.
    pub fn refuse_file(&self, file_id: &str) {
        self.inner
            .lock()
            .expect("lock")
            .refused_files
            .insert(file_id.to_owned());
    }

    /// How many `getFile` calls asked for `file_id`.
    pub fn get_file_calls(&self, file_id: &str) -> usize {
        self.calls()
            .iter()
            .filter(|c| c.method == "GetFile" && c.body["file_id"] == file_id)
            .count()
    }

    /// The next `n` downloads answer 500.
    pub fn fail_downloads(&self, n: usize) {
        self.fail_downloads_with(n, 500);
    }

    /// The next `n` downloads answer `status`.
    pub fn fail_downloads_with(&self, n: usize, status: u16) {
        let mut inner = self.inner.lock().expect("lock");
        inner.download_failures = n;
        inner.download_failure_status = StatusCode::from_u16(status).ok();
    }

    /// `file_path`s downloaded so far (failed attempts included).
    pub fn downloads(&self) -> Vec<String> {
        self.inner.lock().expect("lock").downloads.clone()
    }

    pub fn block_chat(&self, chat: i64) {
        self.inner.lock().expect("lock").blocked_chats.push(chat);
    }

    /// The user unblocked the bot: sends to `chat` succeed again.
    pub fn unblock_chat(&self, chat: i64) {
        self.inner
            .lock()
            .expect("lock")
            .blocked_chats
            .retain(|c| *c != chat);
    }

    pub fn calls(&self) -> Vec<Call> {
        self.inner.lock().expect("lock").calls.clone()
    }

    /// Sent messages (text, photo, document) to one chat, in order.
    pub fn sent_to(&self, chat: i64) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| {
                matches!(
                    c.method.as_str(),
                    "SendMessage" | "SendPhoto" | "SendDocument"
                ) && c.chat_id() == Some(chat)
            })
            .collect()
    }

    /// Waits until `cond` holds over the calls, or panics after `timeout`.
    pub async fn wait_for<F>(&self, what: &str, timeout: Duration, cond: F) -> Vec<Call>
    where
        F: Fn(&[Call]) -> bool,
    {
        let deadline = Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            let calls = self.calls();
            if cond(&calls) {
                return calls;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let summary: Vec<String> = calls
                    .iter()
                    .map(|c| format!("{} {:?} {:.60}", c.method, c.chat_id(), c.text()))
                    .collect();
                panic!(
                    "timed out waiting for {what}; calls so far:\n{}",
                    summary.join("\n")
                );
            }
            let _ = tokio::time::timeout(left.min(Duration::from_millis(200)), notified).await;
        }
    }

    /// Waits for the first file sent with `method` (`SendDocument`, `SendPhoto`) and
    /// returns its bytes.
    pub async fn wait_file(&self, method: &str) -> Vec<u8> {
        let sent = self
            .wait_for(&format!("a {method}"), Duration::from_secs(20), |calls| {
                calls.iter().any(|c| c.method == method)
            })
            .await;
        sent.into_iter()
            .find(|c| c.method == method)
            .and_then(|c| c.file)
            .expect("a file part")
    }

    /// Waits until `n` messages were sent to `chat`.
    pub async fn wait_sent(&self, chat: i64, n: usize) -> Vec<Call> {
        self.wait_for(
            &format!("{n} messages to chat {chat}"),
            Duration::from_secs(20),
            |calls| {
                calls
                    .iter()
                    .filter(|c| {
                        matches!(
                            c.method.as_str(),
                            "SendMessage" | "SendPhoto" | "SendDocument"
                        ) && c.chat_id() == Some(chat)
                    })
                    .count()
                    >= n
            },
        )
        .await;
        self.sent_to(chat)
    }
}

fn ok(result: Value) -> Response {
    (
        StatusCode::OK,
        axum::Json(json!({"ok": true, "result": result})),
    )
        .into_response()
}

fn message_json(id: i64, chat: i64, text: &str) -> Value {
    json!({
        "message_id": id,
        "date": 1_764_460_800,
        "chat": {"id": chat, "type": "private", "first_name": "Test"},
        "from": {"id": 42, "is_bot": true, "first_name": "daylog", "username": "daylog_bot"},
        "text": text,
    })
}

/// Text fields and the file of a multipart body (enough for sendPhoto/sendDocument).
fn parse_multipart(headers: &HeaderMap, body: &[u8]) -> (Value, Option<Vec<u8>>) {
    let boundary = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split("boundary=").nth(1))
        .map(|b| b.trim_matches('"').to_owned())
        .unwrap_or_default();
    let delimiter = format!("--{boundary}").into_bytes();
    let mut fields = serde_json::Map::new();
    let mut file = None;
    let mut rest = body;
    while let Some(start) = find(rest, &delimiter) {
        rest = &rest[start + delimiter.len()..];
        let Some(end) = find(rest, &delimiter) else {
            break;
        };
        let part = &rest[..end];
        if let Some(split) = find(part, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&part[..split]).to_string();
            let mut content = &part[split + 4..];
            if content.ends_with(b"\r\n") {
                content = &content[..content.len() - 2];
            }
            let name = head
                .split("name=\"")
                .nth(1)
                .and_then(|s| s.split('"').next())
                .unwrap_or_default()
                .to_owned();
            if head.contains("filename=") {
                file = Some(content.to_vec());
                fields.insert(name, json!("<file>"));
            } else {
                fields.insert(name, json!(String::from_utf8_lossy(content)));
            }
        }
    }
    (Value::Object(fields), file)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

async fn handle(
    State(fake): State<FakeTelegram>,
    Path((bot, method)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    handle_via(fake, None, bot, method, headers, body).await
}

/// [`handle`] through a tagged URL ([`FakeTelegram::url_tagged`]).
async fn handle_tagged(
    State(fake): State<FakeTelegram>,
    Path((via, bot, method)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    handle_via(fake, Some(via), bot, method, headers, body).await
}

async fn handle_via(
    fake: FakeTelegram,
    via: Option<String>,
    bot: String,
    method: String,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if bot != format!("bot{TOKEN}") {
        return (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"ok": false, "error_code": 401, "description": "Unauthorized"})),
        )
            .into_response();
    }
    let is_multipart = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("multipart/"));
    let (body, file) = if is_multipart {
        parse_multipart(&headers, &body)
    } else {
        (serde_json::from_slice(&body).unwrap_or(Value::Null), None)
    };

    let hangs = {
        let mut inner = fake.inner.lock().expect("lock");
        let hangs = inner.hanging.contains(&method);
        if hangs {
            inner.hung.push(method.clone());
        }
        hangs
    };
    if hangs {
        fake.changed.notify_waiters();
        return std::future::pending().await;
    }

    if let Some(answer) = webhook_method(&fake, &method, &body) {
        return answer;
    }
    if method == "GetUpdates" {
        // A scripted failure of a poll (`fail_next("GetUpdates", None, …)`): a 409 from
        // a second program polling with the same token, a 502.
        let failure = {
            let mut inner = fake.inner.lock().expect("lock");
            let pos = inner.failures.iter().position(|(m, ..)| *m == method);
            pos.and_then(|pos| inner.failures.remove(pos))
        };
        if let Some((_, _, _, status, body)) = failure {
            return (
                StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                axum::Json(body),
            )
                .into_response();
        }
        return get_updates(&fake, &body).await;
    }

    let call = Call {
        method: method.clone(),
        body: body.clone(),
        file,
        via,
    };
    let chat = call.chat_id();
    let scripted = {
        let mut inner = fake.inner.lock().expect("lock");
        let sending = matches!(
            method.as_str(),
            "SendMessage" | "SendPhoto" | "SendDocument"
        );
        if sending && chat.is_some_and(|c| inner.blocked_chats.contains(&c)) {
            Some((
                403,
                json!({"ok": false, "error_code": 403, "description": "Forbidden: bot was blocked by the user"}),
            ))
        } else if let Some(pos) = inner.failures.iter().position(|(m, c, fragment, _, _)| {
            *m == method
                && (c.is_none() || *c == chat)
                && fragment
                    .as_ref()
                    .is_none_or(|f| call.text().contains(f.as_str()))
        }) {
            inner
                .failures
                .remove(pos)
                .map(|(_, _, _, status, body)| (status, body))
        } else {
            None
        }
    };
    if let Some((status, body)) = scripted {
        // Failed calls are not recorded as delivered messages.
        return (
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            axum::Json(body),
        )
            .into_response();
    }
    let message_id = {
        let mut inner = fake.inner.lock().expect("lock");
        inner.calls.push(call);
        inner.next_message_id += 1;
        inner.next_message_id
    };
    fake.changed.notify_waiters();
    match method.as_str() {
        "GetFile" => {
            let file_id = body["file_id"].as_str().unwrap_or_default();
            let (file, refused) = {
                let inner = fake.inner.lock().expect("lock");
                (
                    inner.files.get(file_id).cloned(),
                    inner.refused_files.contains(file_id),
                )
            };
            if refused {
                return (
                    StatusCode::BAD_REQUEST,
                    axum::Json(json!({"ok": false, "error_code": 400,
                        "description": "Bad Request: wrong file_id or the file is temporarily unavailable"})),
                )
                    .into_response();
            }
            match file {
                Some((path, bytes)) => ok(json!({
                    "file_id": file_id, "file_unique_id": format!("u-{file_id}"),
                    "file_size": bytes.len(), "file_path": path,
                })),
                None => (
                    StatusCode::BAD_REQUEST,
                    axum::Json(json!({"ok": false, "error_code": 400, "description": "Bad Request: invalid file_id"})),
                )
                    .into_response(),
            }
        }
        "GetMe" => ok(json!({
            "id": 42, "is_bot": true, "first_name": "daylog", "username": "daylog_bot",
            "can_join_groups": false, "can_read_all_group_messages": false,
            "supports_inline_queries": false, "can_connect_to_business": false,
            "has_main_web_app": false,
        })),
        "SendMessage"
        | "SendPhoto"
        | "SendDocument"
        | "EditMessageReplyMarkup"
        | "EditMessageText" => {
            let text = body["text"].as_str().unwrap_or_default();
            ok(message_json(message_id, chat.unwrap_or_default(), text))
        }
        _ => ok(json!(true)),
    }
}

async fn download(
    State(fake): State<FakeTelegram>,
    Path((bot, path)): Path<(String, String)>,
) -> Response {
    if bot != format!("bot{TOKEN}") {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let answer = {
        let mut inner = fake.inner.lock().expect("lock");
        inner.downloads.push(path.clone());
        if inner.download_failures > 0 {
            inner.download_failures -= 1;
            Err(inner
                .download_failure_status
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        } else {
            inner
                .files
                .values()
                .find(|(p, _)| *p == path)
                .map(|(_, bytes)| bytes.clone())
                .ok_or(StatusCode::NOT_FOUND)
        }
    };
    fake.changed.notify_waiters();
    match answer {
        Ok(bytes) => (StatusCode::OK, bytes).into_response(),
        Err(status) => status.into_response(),
    }
}

async fn get_updates(fake: &FakeTelegram, body: &Value) -> Response {
    // As Telegram does: an offset confirms every update below it, for good — a bot that
    // starts again with no offset is not given them again.
    let offset = {
        let mut inner = fake.inner.lock().expect("lock");
        if !body["allowed_updates"].is_null() {
            inner.allowed_updates = body["allowed_updates"].clone();
        }
        inner.confirmed_below = inner
            .confirmed_below
            .max(body["offset"].as_i64().unwrap_or(0));
        inner.polls += 1;
        inner.confirmed_below
    };
    // As Telegram does: at most `limit` updates (1–100, default 100), the oldest first.
    let limit = body["limit"]
        .as_u64()
        .map_or(100, |limit| limit.clamp(1, 100)) as usize;
    fake.changed.notify_waiters();
    // Long polling, but short: the fake answers within half a second so that shutdown
    // in tests is quick.
    let deadline = Instant::now() + Duration::from_millis(500);
    loop {
        let notified = fake.changed.notified();
        let pending: Vec<Value> = {
            let inner = fake.inner.lock().expect("lock");
            inner
                .updates
                .iter()
                .filter(|u| u["update_id"].as_i64().unwrap_or(0) >= offset)
                .take(limit)
                .cloned()
                .collect()
        };
        if !pending.is_empty() {
            return ok(Value::Array(pending));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return ok(json!([]));
        }
        let _ = tokio::time::timeout(left, notified).await;
    }
}

// ---- updates ----

fn user(user_id: i64, language: &str) -> Value {
    json!({"id": user_id, "is_bot": false, "first_name": "User", "username": format!("user{user_id}"), "language_code": language})
}

fn chat(chat_id: i64) -> Value {
    json!({"id": chat_id, "type": "private", "first_name": "User"})
}

/// A text message from user `user` in their private chat (chat id = user id).
pub fn text_update(user_id: i64, message_id: i64, text: &str) -> Value {
    text_update_lang(user_id, message_id, text, "en")
}

pub fn text_update_lang(user_id: i64, message_id: i64, text: &str, language: &str) -> Value {
    text_update_full(user_id, message_id, text, language, now_unix())
}

/// A text message written at `date` (Unix seconds): its local day comes from it.
pub fn text_update_at(user_id: i64, message_id: i64, text: &str, date: i64) -> Value {
    text_update_full(user_id, message_id, text, "en", date)
}

/// The real time in Unix seconds (Telegram stamps each message with it).
pub fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default()
}

fn text_update_full(user_id: i64, message_id: i64, text: &str, language: &str, date: i64) -> Value {
    let mut message = json!({
        "message_id": message_id,
        "date": date,
        "chat": chat(user_id),
        "from": user(user_id, language),
        "text": text,
    });
    if text.starts_with('/') {
        let len = text
            .split_whitespace()
            .next()
            .unwrap_or(text)
            .encode_utf16()
            .count();
        message["entities"] = json!([{"type": "bot_command", "offset": 0, "length": len}]);
    }
    json!({"message": message})
}

/// A text message from user `user_id` in the group `group_id`.
pub fn group_text_update(group_id: i64, user_id: i64, message_id: i64, text: &str) -> Value {
    json!({"message": {
        "message_id": message_id,
        "date": now_unix(),
        "chat": {"id": group_id, "type": "supergroup", "title": "Friends"},
        "from": user(user_id, "en"),
        "text": text,
    }})
}

/// `joined` joining the group `group_id`: a service message, which Telegram delivers to
/// every bot in the group.
pub fn member_joined_update(group_id: i64, joined: i64, message_id: i64) -> Value {
    json!({"message": {
        "message_id": message_id,
        "date": now_unix(),
        "chat": {"id": group_id, "type": "supergroup", "title": "Friends"},
        "from": user(joined, "en"),
        "new_chat_members": [user(joined, "en")],
    }})
}

pub fn edited_update(user_id: i64, message_id: i64, text: &str) -> Value {
    json!({"edited_message": {
        "message_id": message_id,
        "date": 1_764_460_800,
        "edit_date": 1_764_460_900,
        "chat": chat(user_id),
        "from": user(user_id, "en"),
        "text": text,
    }})
}

/// A shared location (it sets the time zone).
pub fn location_update(user_id: i64, message_id: i64, latitude: f64, longitude: f64) -> Value {
    json!({"message": {
        "message_id": message_id,
        "date": now_unix(),
        "chat": chat(user_id),
        "from": user(user_id, "en"),
        "location": {"latitude": latitude, "longitude": longitude},
    }})
}

pub fn photo_update(user_id: i64, message_id: i64) -> Value {
    json!({"message": {
        "message_id": message_id,
        "date": 1_764_460_800,
        "chat": chat(user_id),
        "from": user(user_id, "en"),
        "photo": [{"file_id": "p1", "file_unique_id": "u1", "width": 90, "height": 90, "file_size": 1000}],
    }})
}

pub fn sticker_update(user_id: i64, message_id: i64) -> Value {
    json!({"message": {
        "message_id": message_id,
        "date": 1_764_460_800,
        "chat": chat(user_id),
        "from": user(user_id, "en"),
        "sticker": {"file_id": "s1", "file_unique_id": "su1", "type": "regular", "width": 512,
                    "height": 512, "is_animated": false, "is_video": false, "emoji": "😀"},
    }})
}

pub fn callback_update(user_id: i64, data: &str, message_id: i64) -> Value {
    json!({"callback_query": {
        "id": format!("cb-{user_id}-{message_id}"),
        "from": user(user_id, "en"),
        "chat_instance": "ci",
        "data": data,
        "message": message_json(message_id, user_id, "confirm?"),
    }})
}

/// `user_id` pressing a button with `data` under the bot's message `message_id` in the
/// group `group_id`.
pub fn group_callback_update(group_id: i64, user_id: i64, data: &str, message_id: i64) -> Value {
    let mut message = message_json(message_id, group_id, "confirm?");
    message["chat"] = json!({"id": group_id, "type": "supergroup", "title": "Friends"});
    json!({"callback_query": {
        "id": format!("cb-{user_id}-{message_id}"),
        "from": user(user_id, "en"),
        "chat_instance": "ci",
        "data": data,
        "message": message,
    }})
}

/// A voice note from `user_id` (file `file_id`, `duration` seconds, `size` bytes).
pub fn voice_update(
    user_id: i64,
    message_id: i64,
    file_id: &str,
    duration: u32,
    size: u64,
) -> Value {
    json!({"message": {
        "message_id": message_id,
        "date": 1_764_460_800,
        "chat": chat(user_id),
        "from": user(user_id, "en"),
        "voice": {"file_id": file_id, "file_unique_id": format!("u-{file_id}"),
                  "duration": duration, "mime_type": "audio/ogg", "file_size": size},
    }})
}

/// An audio file (music player attachment) from `user_id`.
pub fn audio_update(
    user_id: i64,
    message_id: i64,
    file_id: &str,
    duration: u32,
    size: u64,
) -> Value {
    json!({"message": {
        "message_id": message_id,
        "date": 1_764_460_800,
        "chat": chat(user_id),
        "from": user(user_id, "en"),
        "audio": {"file_id": file_id, "file_unique_id": format!("u-{file_id}"),
                  "duration": duration, "mime_type": "audio/mpeg", "file_size": size,
                  "file_name": "day.mp3"},
    }})
}

// ---- webhook mode ----

/// What the fake keeps of a webhook, as Telegram does: the registration, and which
/// updates were delivered (answered 2xx). While a URL is set, `getUpdates` answers 409
/// and updates are posted to the URL instead, with the secret header, one chat's next
/// update only after the previous one got a 2xx, a non-2xx tried again after a pause.
#[derive(Default)]
struct Webhook {
    url: Option<String>,
    secret: Option<String>,
    /// Update ids answered 2xx: never posted again.
    delivered: std::collections::HashSet<i64>,
    /// Chats with a delivery running (one at a time per chat).
    delivering: std::collections::HashSet<i64>,
    /// Every post: update id and the status it got (0: no answer).
    posts: Vec<(i64, u16)>,
    last_error: Option<(i64, String)>,
}

/// Pause before a post that failed is tried again.
const REDELIVER_AFTER: Duration = Duration::from_millis(150);

/// `setWebhook`, `getWebhookInfo`, `deleteWebhook` (recorded as calls), and `getUpdates`
/// while a webhook is set; `None` for every other method.
fn webhook_method(fake: &FakeTelegram, method: &str, body: &Value) -> Option<Response> {
    let record = |fake: &FakeTelegram| {
        fake.inner.lock().expect("lock").calls.push(Call {
            method: method.to_owned(),
            body: body.clone(),
            file: None,
            via: None,
        });
        fake.changed.notify_waiters();
    };
    match method {
        "SetWebhook" => {
            record(fake);
            {
                let mut inner = fake.inner.lock().expect("lock");
                let url = body["url"].as_str().unwrap_or_default().to_owned();
                inner.webhook.url = (!url.is_empty()).then_some(url);
                inner.webhook.secret = body["secret_token"].as_str().map(str::to_owned);
            }
            fake.deliver();
            Some(ok(json!(true)))
        }
        "DeleteWebhook" => {
            record(fake);
            let mut inner = fake.inner.lock().expect("lock");
            inner.webhook.url = None;
            inner.webhook.secret = None;
            Some(ok(json!(true)))
        }
        "GetWebhookInfo" => {
            record(fake);
            let inner = fake.inner.lock().expect("lock");
            let pending = inner
                .updates
                .iter()
                .filter(|u| !inner.webhook.delivered.contains(&update_id(u)))
                .count();
            let mut info = json!({
                "url": inner.webhook.url.clone().unwrap_or_default(),
                "has_custom_certificate": false,
                "pending_update_count": if inner.webhook.url.is_some() { pending } else { 0 },
            });
            if let Some((date, message)) = &inner.webhook.last_error {
                info["last_error_date"] = json!(date);
                info["last_error_message"] = json!(message);
            }
            Some(ok(info))
        }
        "GetUpdates" if fake.inner.lock().expect("lock").webhook.url.is_some() => Some(
            (
                StatusCode::CONFLICT,
                axum::Json(json!({"ok": false, "error_code": 409,
                    "description": "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete the webhook first"})),
            )
                .into_response(),
        ),
        _ => None,
    }
}

fn update_id(update: &Value) -> i64 {
    update["update_id"].as_i64().unwrap_or_default()
}

/// The chat an update belongs to (its own id when it has none, so it goes alone).
fn chat_of_update(update: &Value) -> i64 {
    ["message", "edited_message"]
        .iter()
        .find_map(|kind| update[kind]["chat"]["id"].as_i64())
        .or_else(|| update["callback_query"]["message"]["chat"]["id"].as_i64())
        .unwrap_or_else(|| -update_id(update))
}

impl FakeTelegram {
    /// Queues an update and, while a webhook is set, posts it (a test's
    /// [`FakeTelegram::push_update`] does the same, since delivery follows every change).
    fn deliver(&self) {
        let chats: Vec<i64> = {
            let mut inner = self.inner.lock().expect("lock");
            if inner.webhook.url.is_none() {
                return;
            }
            let waiting: Vec<i64> = inner
                .updates
                .iter()
                .filter(|u| !inner.webhook.delivered.contains(&update_id(u)))
                .map(chat_of_update)
                .collect();
            let fresh: Vec<i64> = waiting
                .into_iter()
                .filter(|chat| !inner.webhook.delivering.contains(chat))
                .collect();
            for chat in &fresh {
                inner.webhook.delivering.insert(*chat);
            }
            fresh
        };
        for chat in chats {
            tokio::spawn(self.clone().deliver_chat(chat));
        }
    }

    /// Posts `chat`'s undelivered updates in order, each until it gets a 2xx; stops when
    /// none is left or the webhook is deleted.
    async fn deliver_chat(self, chat: i64) {
        let client = reqwest::Client::new();
        loop {
            let next = {
                let mut inner = self.inner.lock().expect("lock");
                let next = inner
                    .updates
                    .iter()
                    .filter(|u| chat_of_update(u) == chat)
                    .find(|u| !inner.webhook.delivered.contains(&update_id(u)))
                    .cloned();
                match (next, inner.webhook.url.clone()) {
                    (Some(update), Some(url)) => Some((update, url, inner.webhook.secret.clone())),
                    _ => {
                        inner.webhook.delivering.remove(&chat);
                        None
                    }
                }
            };
            let Some((update, url, secret)) = next else {
                return;
            };
            let mut request = client
                .post(&url)
                .json(&update)
                .timeout(Duration::from_secs(30));
            if let Some(secret) = secret {
                request = request.header("X-Telegram-Bot-Api-Secret-Token", secret);
            }
            let status = request.send().await.map_or(0, |r| r.status().as_u16());
            let id = update_id(&update);
            {
                let mut inner = self.inner.lock().expect("lock");
                inner.webhook.posts.push((id, status));
                if (200..300).contains(&status) {
                    inner.webhook.delivered.insert(id);
                } else {
                    inner.webhook.last_error = Some((
                        now_unix(),
                        if status == 0 {
                            "Connection refused".to_owned()
                        } else {
                            format!("Wrong response from the webhook: {status}")
                        },
                    ));
                }
            }
            self.changed.notify_waiters();
            if !(200..300).contains(&status) {
                tokio::time::sleep(REDELIVER_AFTER).await;
            }
        }
    }

    /// Every webhook post so far: the update's id and the status it got (0: none).
    pub fn webhook_posts(&self) -> Vec<(i64, u16)> {
        self.inner.lock().expect("lock").webhook.posts.clone()
    }

    /// Whether update `id` was answered 2xx.
    pub fn delivered(&self, id: i64) -> bool {
        self.inner
            .lock()
            .expect("lock")
            .webhook
            .delivered
            .contains(&id)
    }

    /// The URL the bot registered, if any.
    pub fn webhook_url(&self) -> Option<String> {
        self.inner.lock().expect("lock").webhook.url.clone()
    }

    /// Sets a webhook as another instance (or an earlier run) would have.
    pub fn set_webhook_as_if_elsewhere(&self, url: &str) {
        self.inner.lock().expect("lock").webhook.url = Some(url.to_owned());
    }

    /// Waits until update `id` was answered 2xx.
    pub async fn wait_delivered(&self, id: i64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let notified = self.changed.notified();
            if self.delivered(id) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "update {id} never delivered; posts: {:?}",
                self.webhook_posts()
            );
            let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
        }
    }
}
