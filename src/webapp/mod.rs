//! The journal as a Telegram Mini App (docs/behaviour.md, The Mini App): the page at
//! `/app` (static HTML, CSS and a little plain JavaScript, compiled in) and its data at
//! `/app/api/…`, served on `http.listen` when `webapp.url` is set.
//!
//! Who is who: every API request carries `Authorization: tma <initData>`, checked by
//! [`init_data`]; the caller is the initData's user and nobody else — no parameter
//! names a user, and every read is the caller's. Any refusal is a bare 401. What the
//! page shows comes through the same code as the commands: the store's reads, the
//! chart code of the PNGs ([`crate::charts`]), `/tz`, `/remind`, `/lang`, `/digest`'s
//! handlers, and the bot's own `/export` and `/delete` answers, sent to the private chat
//! through the front end's [`Messenger`].

pub mod api;
pub mod init_data;
mod labels;

use std::sync::Arc;

use axum::Router;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::config::Settings;
use crate::frontend::Messenger;
use crate::store::Store;
use crate::users::Users;

/// Who may embed the page: Telegram's web clients (a `DENY` would break Telegram Web).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; \
     script-src 'self' https://telegram.org; style-src 'self'; img-src 'self' blob: data:; \
     connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'self' https://web.telegram.org https://*.web.telegram.org";

const PAGE: &str = include_str!("static/index.html");
const SCRIPT: &str = include_str!("static/app.js");
const STYLE: &str = include_str!("static/app.css");

/// What the page's handlers share.
pub struct Webapp<M> {
    store: Store,
    users: Users,
    settings: Arc<Settings>,
    /// `HMAC_SHA256("WebAppData", bot token)`: all of the token the checks need.
    secret: [u8; 32],
    /// Sends the `/export` file and the `/delete` question to the private chat.
    messenger: Arc<M>,
    /// The page, with its labels in both languages filled in once.
    page: String,
}

impl<M: Messenger> Webapp<M> {
    /// The Mini App of the bot whose token is `bot_token`.
    pub fn new(
        store: Store,
        users: Users,
        settings: Arc<Settings>,
        bot_token: &str,
        messenger: Arc<M>,
    ) -> Arc<Self> {
        Arc::new(Self {
            store,
            users,
            settings,
            secret: init_data::secret_key(bot_token),
            messenger,
            page: PAGE.replace("{{LABELS}}", &labels::json()),
        })
    }
}

/// The routes of the page and its API.
pub fn router<M: Messenger>(webapp: Arc<Webapp<M>>) -> Router {
    Router::new()
        .route("/app", get(page::<M>))
        .route("/app/", get(page::<M>))
        .route("/app/app.js", get(script))
        .route("/app/app.css", get(style))
        .route("/app/api/me", get(api::me::<M>))
        .route("/app/api/entries", get(api::entries::<M>))
        .route("/app/api/entries/{id}", get(api::entry::<M>))
        .route("/app/api/days/{day}", get(api::day::<M>))
        .route("/app/api/year", get(api::year::<M>))
        .route("/app/api/chart", get(api::chart::<M>))
        .route("/app/api/search", get(api::search::<M>))
        .route("/app/api/settings", post(api::settings::<M>))
        .route("/app/api/export", post(api::export::<M>))
        .route("/app/api/delete", post(api::delete::<M>))
        .route(
            "/app/api/{*rest}",
            get(api::unknown::<M>).post(api::unknown::<M>),
        )
        .with_state(webapp)
}

/// The headers of every answer: no sniffing, no caching of a journal, no referrer.
fn hardened(mut response: Response, content_type: &'static str) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

async fn page<M: Messenger>(
    axum::extract::State(webapp): axum::extract::State<Arc<Webapp<M>>>,
) -> Response {
    let mut response = hardened(
        webapp.page.clone().into_response(),
        "text/html; charset=utf-8",
    );
    response.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    response
}

async fn script() -> Response {
    hardened(SCRIPT.into_response(), "text/javascript; charset=utf-8")
}

async fn style() -> Response {
    hardened(STYLE.into_response(), "text/css; charset=utf-8")
}

/// The user an API request is from, by its initData; anything else is [`Unauthorized`].
#[derive(Debug, Clone)]
pub struct Caller(pub init_data::Signed);

/// A refused API request: 401, and nothing in it.
#[derive(Debug, Clone, Copy)]
pub struct Unauthorized;

impl IntoResponse for Unauthorized {
    fn into_response(self) -> Response {
        hardened(
            StatusCode::UNAUTHORIZED.into_response(),
            "text/plain; charset=utf-8",
        )
    }
}

impl<M: Messenger> FromRequestParts<Arc<Webapp<M>>> for Caller {
    type Rejection = Unauthorized;

    async fn from_request_parts(
        parts: &mut Parts,
        webapp: &Arc<Webapp<M>>,
    ) -> Result<Self, Self::Rejection> {
        let raw = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("tma "))
            .ok_or(Unauthorized)?;
        let now = webapp.users.now().as_second();
        let max_age = webapp.settings.webapp.max_age();
        let signed = init_data::validate(raw, &webapp.secret, now, max_age).map_err(|refused| {
            tracing::debug!(%refused, "Mini App request refused");
            Unauthorized
        })?;
        if !webapp.settings.telegram.is_allowed(signed.user_id.get()) {
            tracing::info!("Mini App request from a user not on telegram.allowed_users");
            return Err(Unauthorized);
        }
        Ok(Self(signed))
    }
}
