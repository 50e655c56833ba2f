//! The background worker: finishes every log that an outage or a crash left unfinished
//! (docs/behaviour.md, The life of an entry). It looks at once at start-up, then every `worker.poll_interval_ms`, and
//! as soon as a log parked for lack of budget is due (the budget wakes it, oldest logs
//! first); pending logs come back on their own growing schedule (`next_attempt_at`), and
//! logs that were decided but never answered are answered.

use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::cluster::{ChatLease, Leases};
use crate::digest::Digests;
use crate::frontend::Messenger;
use crate::journal::{Journal, Pickup};
use crate::store::FrontEnd;

/// Logs finished at the same time, at most.
const CONCURRENCY: usize = 16;
/// Logs fetched per look.
const BATCH: i64 = 200;

/// Runs until `shutdown` is cancelled, then lets the logs in hand finish. It finishes
/// only `front_end`'s own logs, and delivers its due digests through `digests`. With
/// `leases` (the daemon, one instance among others on a database) each log is finished
/// under its chat's lease, and a chat another live instance holds is left to it.
pub async fn run<M: Messenger>(
    journal: Arc<Journal>,
    digests: Arc<Digests>,
    messenger: Arc<M>,
    front_end: FrontEnd,
    leases: Option<Leases>,
    shutdown: CancellationToken,
) {
    let permits = Arc::new(Semaphore::new(CONCURRENCY));
    let mut tasks = JoinSet::new();
    let poll = journal.settings().worker.poll_interval();
    loop {
        let batch = match &leases {
            Some(leases) => journal
                .claim_unfinished_held(front_end, BATCH, leases)
                .await
                .map(|batch| batch.into_iter().map(|(p, l)| (p, Some(l))).collect()),
            None => journal
                .claim_unfinished(front_end, BATCH)
                .await
                .map(|batch| batch.into_iter().map(|p| (p, None)).collect::<Vec<_>>()),
        };
        match batch {
            Ok(batch) => {
                if !batch.is_empty() {
                    tracing::debug!(count = batch.len(), "worker found unfinished logs");
                }
                // Each log gets a task; one cut short by the stop keeps its log for the
                // next start. A log waits for its chat's earlier ones before it takes a
                // permit, so one chat's backlog does not hold the permits of every other
                // chat (a log holding a permit may still make a new entry of its chat
                // wait, in order, behind the other chats' leftovers).
                for (pickup, lease) in batch {
                    if shutdown.is_cancelled() {
                        break;
                    }
                    tasks.spawn(finish_one(
                        Arc::clone(&journal),
                        Arc::clone(&messenger),
                        Arc::clone(&permits),
                        shutdown.clone(),
                        pickup,
                        lease,
                    ));
                }
            }
            Err(error) => tracing::error!(%error, "worker could not read unfinished logs"),
        }
        while tasks.try_join_next().is_some() {}
        digests
            .deliver_due(&messenger, front_end, &mut tasks, &permits)
            .await;
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(poll) => {}
            // A parked log's budget returned: its answer does not wait for the poll.
            () = journal.budget_returned() => {}
        }
    }
    while tasks.join_next().await.is_some() {}
    tracing::info!("worker stopped");
}

/// One look of the worker now at chat `chat_id`, which this instance just took over
/// from one that died: all its unfinished logs are claimed — and take their turns in
/// the chat — before the chat's next updates are handled, so they are answered first,
/// in order. Other chats' logs are left to the worker's own looks. They are finished
/// in tasks of their own, in `tasks` (a stop waits for them, within its grace, before
/// this instance gives its leases up), each holding one of `permits`; `shutdown` stops
/// those still waiting for their turn.
pub async fn take_over<M: Messenger>(
    journal: Arc<Journal>,
    messenger: Arc<M>,
    leases: Leases,
    chat_id: i64,
    tasks: TakeOverTasks,
) {
    match journal
        .claim_unfinished_in_chat(FrontEnd::Telegram, chat_id, &leases)
        .await
    {
        Ok(batch) => {
            for (pickup, lease) in batch {
                tasks.tracker.spawn(finish_one(
                    Arc::clone(&journal),
                    Arc::clone(&messenger),
                    Arc::clone(&tasks.permits),
                    tasks.shutdown.clone(),
                    pickup,
                    Some(lease),
                ));
            }
        }
        Err(error) => {
            tracing::warn!(%error, "could not read the unfinished logs of a chat taken over")
        }
    }
}

/// Where [`take_over`] runs what it claimed: the daemon's tracked tasks (a stop waits
/// for them), its stop token, and permits shared by every take-over.
#[derive(Clone)]
pub struct TakeOverTasks {
    pub tracker: tokio_util::task::TaskTracker,
    pub shutdown: CancellationToken,
    pub permits: Arc<Semaphore>,
}

impl TakeOverTasks {
    /// Take-overs' tasks in `tracker`, stopped by `shutdown`, at most as many at once as
    /// the worker's own.
    pub fn new(tracker: tokio_util::task::TaskTracker, shutdown: CancellationToken) -> Self {
        Self {
            tracker,
            shutdown,
            permits: Arc::new(Semaphore::new(CONCURRENCY)),
        }
    }
}

/// Finishes one log in its turn, holding a permit and (among instances) its chat's
/// lease; a lease taken over meanwhile leaves the log to its new holder.
async fn finish_one<M: Messenger>(
    journal: Arc<Journal>,
    messenger: Arc<M>,
    permits: Arc<Semaphore>,
    shutdown: CancellationToken,
    mut pickup: Pickup,
    lease: Option<ChatLease>,
) {
    let id = pickup.id();
    let permit = tokio::select! {
        permit = async {
            pickup.wait_turn().await;
            permits.acquire_owned().await
        } => permit,
        () = shutdown.cancelled() => return,
    };
    let Ok(permit) = permit else {
        return;
    };
    if let Some(lease) = &lease
        && !lease.confirm().await
    {
        tracing::info!(
            log_id = id.get(),
            "another instance took this log's chat over; left to it"
        );
        return;
    }
    if let Err(error) = journal
        .finish(messenger.as_ref(), pickup, lease.as_ref())
        .await
    {
        tracing::error!(log_id = id.get(), %error, "worker could not finish a log");
    }
    drop(permit);
    drop(lease);
}
