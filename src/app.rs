//! One start-up for every way daylog runs (zero2prod's `Application::build`): settings →
//! store (opened and migrated) → the providers' HTTP client → [`Llm`] → [`Journal`] (and
//! the Bot API's client when the Telegram front end starts). The daemon
//! (`daylog run`), `daylog chat`, the test helpers and the benches all start from
//! [`App::build`], so what runs in a test is wired exactly as what runs in production.
//!
//! Signals are the process's concern, not a front end's: [`run_daemon`] listens for
//! SIGINT and SIGTERM before anything else (a stop during migrations is a clean stop too)
//! and hands the Telegram front end a [`CancellationToken`].

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::digest::Digests;
use crate::journal::Journal;
use crate::llm::{Llm, LlmError};
use crate::store::{Store, StoreError};
use crate::time::Clock;

/// What closing the store may take after the grace period is spent (its queued LLM
/// call records; the logs themselves are committed long before).
const CLOSE_AT_LEAST: Duration = Duration::from_millis(500);

/// Why the application could not be put together.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot build the HTTP client")]
    Client(#[source] reqwest::Error),
    #[error("cannot set up the LLM providers")]
    Llm(#[source] LlmError),
}

/// The wired application: cheap to clone (every part is shared).
#[derive(Clone)]
pub struct App {
    settings: Arc<Settings>,
    store: Store,
    llm: Arc<Llm>,
    journal: Arc<Journal>,
    digests: Arc<Digests>,
    /// Webhook mode: between the HTTP listener and the bot (closed until it takes posts).
    webhook: crate::bot::webhook::Gate,
}

impl App {
    /// Opens and migrates the store, builds the providers' HTTP client, the LLM
    /// providers on it, and the journal over both.
    pub async fn build(settings: Settings) -> Result<Self, StartError> {
        let store =
            Store::open_and_migrate_with(settings.database_url.expose(), (&settings.store).into())
                .await?;
        let settings = Arc::new(settings);
        let client = crate::http_client().map_err(StartError::Client)?;
        let llm = Llm::with_client(&settings, client).map_err(StartError::Llm)?;
        // Several instances share budgets and cooldowns through PostgreSQL.
        let llm = if store.is_postgres() {
            Arc::new(llm.sharing(Arc::new(store.clone())))
        } else {
            Arc::new(llm)
        };
        learn_from_last_run(&store, &llm).await;
        let journal = Arc::new(Journal::new(
            Arc::clone(&settings),
            store.clone(),
            Arc::clone(&llm),
        ));
        let digests = Digests::of(&journal);
        Ok(Self {
            settings,
            store,
            llm,
            journal,
            digests,
            webhook: crate::bot::webhook::Gate::default(),
        })
    }

    /// The same application reading "now" from `clock` (tests drive time with it). Call
    /// it before anything runs: the journal is made afresh.
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.journal = Arc::new(
            Journal::new(
                Arc::clone(&self.settings),
                self.store.clone(),
                Arc::clone(&self.llm),
            )
            .with_clock(clock),
        );
        self.digests = Digests::of(&self.journal);
        self
    }

    pub fn settings(&self) -> &Arc<Settings> {
        &self.settings
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn journal(&self) -> &Arc<Journal> {
        &self.journal
    }

    pub fn digests(&self) -> &Arc<Digests> {
        &self.digests
    }

    /// The Telegram front end until `stop` is cancelled (then in-flight work gets
    /// `telegram.shutdown_grace_ms`). The store stays open: closing it is the caller's.
    pub async fn serve_telegram(self, stop: CancellationToken) -> anyhow::Result<()> {
        let client = crate::telegram_client().map_err(StartError::Client)?;
        let bot = crate::bot::build_bot(&self.settings, client)?;
        crate::bot::serve_configured(bot, self.journal, self.digests, stop, self.webhook).await
    }

    /// The Mini App's routes (`/app`, `/app/api/…`) when `webapp.url` is set, empty
    /// otherwise. Its messenger is a Bot API client of its own, for the `/export` file and
    /// the `/delete` question it has the bot send to the private chat.
    pub fn mini_app(&self) -> anyhow::Result<axum::Router> {
        let token = match (
            &self.settings.secrets.telegram_token,
            self.settings.webapp.url(),
        ) {
            (Some(token), Some(_)) => token,
            _ => return Ok(axum::Router::new()),
        };
        let client = crate::telegram_client().map_err(StartError::Client)?;
        let bot = crate::bot::build_bot(&self.settings, client)?;
        let webapp = crate::webapp::Webapp::new(
            self.store.clone(),
            self.journal.users().clone(),
            Arc::clone(&self.settings),
            token.expose(),
            Arc::new(crate::bot::Telegram::new(bot).sharing(self.store.clone())),
        );
        Ok(crate::webapp::router(webapp))
    }

    /// `daylog chat` for the local `user` until stdin ends; then the store is closed.
    pub async fn chat(self, user: i64) -> anyhow::Result<()> {
        let talked =
            crate::terminal::run(Arc::clone(&self.journal), crate::domain::UserId(user)).await;
        self.store.close().await;
        talked
    }
}

/// What an earlier run of this database learned, handed to the LLM layer before anything
/// is asked of it: the daily budgets it found spent (so a restart does not spend a dead
/// daily quota again) and each step's recent latencies (so hedging does not start from
/// nothing). A read that fails costs only that knowledge, never the start.
async fn learn_from_last_run(store: &Store, llm: &Llm) {
    match store.spent_budgets().await {
        Ok(spent) => llm.restore_budgets(&spent),
        Err(error) => tracing::warn!(%error, "could not read the spent daily budgets"),
    }
    match store.recent_latencies().await {
        Ok(samples) => llm.learn_latencies(&samples),
        Err(error) => {
            tracing::warn!(%error, "could not read recent latencies; hedging starts fresh")
        }
    }
}

/// `daylog run`: the daemon, until SIGINT or SIGTERM.
pub async fn run_daemon(settings: Settings) -> anyhow::Result<()> {
    // Listen for signals before anything else, so a SIGTERM during start-up (migrations,
    // connecting) is a clean stop too rather than the default kill.
    let stop = CancellationToken::new();
    let stopped_at = Arc::new(OnceLock::new());
    let signals = listen_for_signals(stop.clone(), Arc::clone(&stopped_at));
    let app = App::build(settings).await?;
    let store = app.store().clone();
    let grace = app.settings().telegram.shutdown_grace();
    // Up before the front end, so that a probe sees a process that is still connecting;
    // down only once the front end is done, so that `/readyz` says 503 all the while.
    let http = crate::http::start(
        &app.settings().http,
        &store,
        app.journal().llm(),
        stop.clone(),
        crate::bot::webhook::Mount::of(app.settings(), &app.webhook),
        app.mini_app()?,
    )
    .await?;
    let served = app.serve_telegram(stop).await;
    signals.abort();
    if let Some(http) = http {
        http.close().await;
    }
    // Closing counts against the same grace as the work in flight, with a little time
    // of its own should that be spent.
    let deadline = stopped_at
        .get()
        .map_or_else(|| tokio::time::Instant::now() + grace, |at| *at + grace)
        .max(tokio::time::Instant::now() + CLOSE_AT_LEAST);
    if tokio::time::timeout_at(deadline, store.close())
        .await
        .is_err()
    {
        tracing::warn!("the database did not close in time; committed entries are safe");
    }
    tracing::info!("daylog stopped");
    served
}

/// Cancels `stop` on SIGINT or SIGTERM (teloxide's own handler knows only SIGINT), after
/// noting when in `stopped_at`. On Unix the handlers are installed before this returns.
fn listen_for_signals(
    stop: CancellationToken,
    stopped_at: Arc<OnceLock<tokio::time::Instant>>,
) -> tokio::task::JoinHandle<()> {
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
        let _ = stopped_at.set(tokio::time::Instant::now());
        stop.cancel();
    })
}
