//! The HTTP face of `daylog run` (docs/operations.md, Health and metrics): `/healthz`,
//! `/readyz` and, in webhook mode, the webhook's path (`bot::webhook`) on `http.listen`,
//! `/metrics` on `http.metrics_listen` and only there (the public listener answers it
//! 404). One axum server per address; each lives until
//! the daemon has finished its work, so `/readyz` says 503 throughout the shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::bot::webhook::Mount;
use crate::config::HttpSettings;
use crate::llm::Llm;
use crate::store::Store;

/// The most a probe waits for the store: a busy writer does not make it unready, a
/// store that does not answer in this long does.
const STORE_PROBE: Duration = Duration::from_secs(2);

/// How long a request in flight may hold the listener open after the daemon is done.
const CLOSE_WITHIN: Duration = Duration::from_millis(500);

/// The media type of the Prometheus text format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Why the HTTP face could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} (`{key}`): {source}")]
pub struct ListenError {
    key: &'static str,
    addr: SocketAddr,
    #[source]
    source: std::io::Error,
}

/// The running listeners.
pub struct Server {
    tasks: Vec<JoinHandle<()>>,
    close: CancellationToken,
}

impl Server {
    /// Closes the listeners (requests in flight get [`CLOSE_WITHIN`]) and waits for them.
    pub async fn close(self) {
        self.close.cancel();
        for mut task in self.tasks {
            if tokio::time::timeout(CLOSE_WITHIN, &mut task).await.is_err() {
                task.abort();
            }
        }
    }
}

/// What the probes read.
#[derive(Clone)]
struct Probe {
    store: Store,
    /// Cancelled when shutdown starts (SIGTERM): from then on `/readyz` is 503.
    stopping: CancellationToken,
    /// Webhook mode: ready only while the bot takes posts.
    webhook: Option<Mount>,
}

/// What `/metrics` reads.
#[derive(Clone)]
struct Scrape {
    store: Store,
    llm: Arc<Llm>,
    handle: &'static PrometheusHandle,
}

/// Binds every configured address and serves it; `None` when neither is set. In webhook
/// mode `webhook` is the route Telegram posts to (the settings make sure `http.listen`
/// is set then); `mini_app`'s routes are served on the public address too.
pub async fn start(
    settings: &HttpSettings,
    store: &Store,
    llm: &Arc<Llm>,
    stopping: CancellationToken,
    webhook: Option<Mount>,
    mini_app: Router,
) -> Result<Option<Server>, ListenError> {
    if settings.listen().is_none() && settings.metrics_listen().is_none() {
        return Ok(None);
    }
    let close = CancellationToken::new();
    let mut tasks = Vec::new();
    if let Some(addr) = settings.listen() {
        // The Mini App's page and API (`crate::webapp`; empty when it is off).
        let router = public_router(store.clone(), stopping, webhook).merge(mini_app);
        tasks.push(serve("http.listen", addr, router, close.clone()).await?);
    }
    if let Some(addr) = settings.metrics_listen() {
        let router = match crate::observe::exporter() {
            Some(handle) => scrape_router(store.clone(), Arc::clone(llm), handle),
            None => Router::new(),
        };
        tasks.push(serve("http.metrics_listen", addr, router, close.clone()).await?);
    }
    Ok(Some(Server { tasks, close }))
}

async fn serve(
    key: &'static str,
    addr: SocketAddr,
    router: Router,
    close: CancellationToken,
) -> Result<JoinHandle<()>, ListenError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ListenError { key, addr, source })?;
    let bound = listener.local_addr().unwrap_or(addr);
    tracing::info!(%bound, key, "HTTP listener started");
    Ok(tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router)
            .with_graceful_shutdown(close.cancelled_owned())
            .await
        {
            tracing::error!(%error, key, "the HTTP listener stopped");
        }
    }))
}

/// `/healthz`, `/readyz` and the webhook's path.
fn public_router(store: Store, stopping: CancellationToken, webhook: Option<Mount>) -> Router {
    let probes = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(Probe {
            store,
            stopping: stopping.clone(),
            webhook: webhook.clone(),
        });
    match webhook {
        Some(mount) => probes.merge(mount.router(stopping)),
        None => probes,
    }
}

/// `/metrics`.
fn scrape_router(store: Store, llm: Arc<Llm>, handle: &'static PrometheusHandle) -> Router {
    Router::new()
        .route("/metrics", get(scrape))
        .with_state(Scrape { store, llm, handle })
}

/// 200 while the process runs.
async fn healthz() -> &'static str {
    "ok\n"
}

/// 200 when the store answers, its migrations are applied and (webhook mode) the bot
/// takes posts; 503 with a one-line reason (no URL, path or secret) otherwise, and from
/// the moment shutdown starts.
async fn readyz(State(probe): State<Probe>) -> (StatusCode, &'static str) {
    if probe.stopping.is_cancelled() {
        return (StatusCode::SERVICE_UNAVAILABLE, "stopping\n");
    }
    if probe.webhook.as_ref().is_some_and(|mount| !mount.is_open()) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "not taking updates yet (connecting to Telegram)\n",
        );
    }
    match tokio::time::timeout(STORE_PROBE, probe.store.is_migrated()).await {
        Ok(Ok(true)) => (StatusCode::OK, "ready\n"),
        Ok(Ok(false)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the database schema is not up to date\n",
        ),
        Ok(Err(error)) => {
            tracing::warn!(%error, "readiness probe: the database did not answer");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "the database does not answer\n",
            )
        }
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the database did not answer in time\n",
        ),
    }
}

/// Every series in the Prometheus text format; the store's gauges read now.
async fn scrape(State(scrape): State<Scrape>) -> impl IntoResponse {
    match tokio::time::timeout(STORE_PROBE, scrape.store.pending_count()).await {
        Ok(Ok(count)) => crate::observe::entries_pending(count),
        Ok(Err(error)) => tracing::warn!(%error, "could not count the pending entries"),
        Err(_) => tracing::warn!("counting the pending entries took too long"),
    }
    for (provider, model, key, cooling) in scrape.llm.cooling_now() {
        crate::observe::llm_cooling(&provider, &model, key, cooling);
    }
    for (provider, model, key, left) in scrape.llm.budgets_left_now() {
        crate::observe::llm_budget_left(&provider, &model, key, left.minute, left.day);
    }
    (
        [(header::CONTENT_TYPE, PROMETHEUS_TEXT)],
        crate::observe::render(scrape.handle),
    )
}
