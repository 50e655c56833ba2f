//! The state requests share — cooldowns and budgets — behind one small interface
//! ([`SharedState`]). [`LocalState`] is this process's, in memory; the cascade only ever
//! sees the trait. Every method is quick and synchronous.
//!
//! Several instances on one PostgreSQL database share it through [`SharedLimits`] (the
//! store implements it; this layer does not know the store): before a request is sent,
//! the local check is followed by one atomic check-and-spend in the database
//! ([`SharedState::admit_shared`]), which also says whether another instance put the
//! model or the key in cooldown. Cooldowns and what the answers taught (a named reset,
//! a lowered rate) are written through, behind the request (never awaited by it). A
//! database that cannot be asked admits nothing: the budget is held for
//! [`UNCHECKED_WAIT`] and asked again, so no request is sent on a budget nobody can
//! check. On SQLite (one instance) there is no remote and nothing of this runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::Instant;

use std::collections::HashMap;

use crate::config::BudgetSettings;
use crate::llm::budget::{BudgetKey, BudgetLeft, Budgets, SpentBudget, Taken};
use crate::llm::budget_hint::Hint;
use crate::llm::cooldown::{Cooldowns, StepId};

pub(crate) trait SharedState: Send + Sync {
    // ---- cooldowns ----
    /// The standard cooldown, from now.
    fn default_until(&self) -> Instant;
    /// Until when this key of this step is cooling, if it is.
    fn key_cooling_until(&self, step: &StepId, key: Option<usize>) -> Option<Instant>;
    /// Until when every key of the step is cooling (and the soonest key), if all are.
    fn step_cooling_until(
        &self,
        step: &StepId,
        keys: &[Option<usize>],
    ) -> Option<(Instant, Option<usize>)>;
    /// A passing failure; `true` when it made `failures_to_trip` in a row.
    fn record_failure(&self, step: &StepId, key: Option<usize>) -> bool;
    fn record_success(&self, step: &StepId, key: Option<usize>);
    fn cool_key(&self, step: &StepId, key: Option<usize>, until: Instant);
    /// Cools a key the provider refused (401/403): a cooldown that is no passing trouble.
    fn refuse_key(&self, step: &StepId, key: Option<usize>, until: Instant);
    /// Whether every key of the step cools because it was refused (see [`Self::refuse_key`]).
    fn step_refused(&self, step: &StepId, keys: &[Option<usize>]) -> bool;
    fn cool_step(&self, step: &StepId, until: Instant);

    // ---- budgets ----
    // `tokens` is what one request is expected to take from a tokens-per-minute budget
    // (0: it takes none, as a transcription).
    /// Until when this key's budget is spent for a request of `tokens`, if it is.
    fn budget_until(&self, step: &StepId, key: Option<usize>, tokens: u32) -> Option<Instant>;
    /// The soonest return of a key's budget, when no key of the step has budget now.
    fn step_budget_until(
        &self,
        step: &StepId,
        keys: &[Option<usize>],
        tokens: u32,
    ) -> Option<Instant>;
    /// When a request that waits for this step's budget now would be sent (the soonest
    /// key, counting the requests already waiting), when no key has room for it now.
    fn step_turn(
        &self,
        step: &StepId,
        keys: &[Option<usize>],
        tokens: u32,
    ) -> Option<(Instant, Option<usize>)>;
    /// A request starts (`join`) or stops waiting for this key's budget.
    fn queue(&self, step: &StepId, key: Option<usize>, join: bool);
    /// Takes one request from the budget, or says until when it is spent.
    fn admit(&self, step: &StepId, key: Option<usize>, tokens: u32) -> Result<Taken, Instant>;
    /// Counts what a request that [`SharedState::admit`] let through took of a
    /// tokens-per-minute budget: `used` from its answer, else its estimate.
    fn spend_tokens(&self, step: &StepId, key: Option<usize>, taken: Taken, used: Option<u64>);
    /// A request that [`SharedState::admit`] let through was not counted by the
    /// provider (a 429, a failure to serve it): where the shared database counted its
    /// estimate, it is given back there.
    fn uncounted(&self, _step: &StepId, _key: Option<usize>, _taken: Taken) {}
    /// Learns from one answer (`rate_limited`: a 429); how long it is now spent, if so.
    fn learn(
        &self,
        step: &StepId,
        key: Option<usize>,
        hint: &Hint,
        rate_limited: bool,
    ) -> Option<std::time::Duration>;
    /// Daily budgets spent since the last call (to be stored).
    fn take_new_daily(&self) -> Vec<SpentBudget>;
    /// Daily budgets stored before a restart.
    fn restore(&self, spent: &[SpentBudget]);
    /// Every budget known to be spent now (`true`: daily).
    fn spent_now(&self) -> Vec<(SpentBudget, bool)>;
    /// What this key's budget has left now (the budget gauge).
    fn budget_left(&self, step: &StepId, key: Option<usize>) -> BudgetLeft;

    // ---- several instances ----
    /// The check-and-spend in the database several instances share, for a request
    /// [`SharedState::admit`] just let through; `None` when nothing is shared (one
    /// instance), so the request goes at once. On a refusal the local state has
    /// already learned it (the budget held, the key or model cooling) and the local
    /// admission is given back.
    fn admit_shared<'a>(
        &'a self,
        _step: &'a StepId,
        _key: Option<usize>,
        _forced: bool,
        _taken: Taken,
    ) -> Option<BoxFuture<'a, Result<(), SharedRefusal>>> {
        None
    }
}

/// Why the shared database did not let a request through, and until when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SharedRefusal {
    /// The budget is spent (by any instance), or nobody can check it now.
    Budget(Instant),
    /// Another instance put the key or the model in cooldown (or found the key refused).
    Cooling(Instant),
}

/// How long a budget is held when the database cannot be asked about it: the request
/// is not sent, and the budget asked again after this.
pub const UNCHECKED_WAIT: Duration = Duration::from_secs(1);

/// The longest a check-and-spend may take before the database counts as unreachable.
const ADMIT_TIMEOUT: Duration = Duration::from_secs(2);

/// One request asking for a budget, as the database sees it: the budget (provider,
/// `scope`, key), the declared limits (the database scales them by what 429s taught),
/// and the cooldown slot (model, key) to look at unless the attempt is `forced`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission<'a> {
    pub provider: &'a str,
    /// The model where the provider counts per model, else ''.
    pub scope: &'a str,
    pub model: &'a str,
    /// The key's index; never the key.
    pub key_index: Option<usize>,
    /// One real attempt whatever is cooling (docs/behaviour.md, The cascade).
    pub forced: bool,
    pub per_second: Option<u32>,
    pub per_minute: Option<u32>,
    pub per_day: Option<u32>,
    /// Seconds after UTC midnight at which a free-tier day restarts.
    pub day_reset_secs: u64,
}

/// The tokens-per-minute part of an [`Admission`] (PostgreSQL's `daylog_admit_tokens`):
/// the budget's declared tokens a minute, the request's estimate, and the corrections
/// this instance carries for its earlier requests of the budget (what their answers
/// took beyond their estimates, `add`, or short of them, `give_back`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokensAsk {
    pub per_minute: u32,
    pub tokens: u32,
    pub add: u64,
    pub give_back: u64,
}

/// The database's answer to an [`Admission`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admitted {
    /// Counted in every window of the budget: send it.
    Yes,
    /// The budget is spent for this long.
    Budget(Duration),
    /// The key is cooling for this long.
    Cooling(Duration),
    /// The whole model (every key of it) is cooling for this long.
    ModelCooling(Duration),
    /// The key was refused by the provider (401/403) and cools for this long.
    Refused(Duration),
}

/// What one answer taught about a budget, written through for the other instances.
#[derive(Debug, Clone, PartialEq)]
pub struct Learned {
    pub provider: String,
    pub scope: String,
    pub key_index: Option<usize>,
    /// Spent for this long from now (a named reset, a penalty), if it is.
    pub spent_for: Option<Duration>,
    /// That spend is a per-day quota.
    pub daily: bool,
    /// The declared rates as 429s lowered them (1: as declared).
    pub factor: f64,
}

/// A cooldown, written through for the other instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cooled {
    pub provider: String,
    pub model: String,
    /// `None`: the whole model; `Some(key)`: one key (`key` `None`: no key list).
    pub key: Option<Option<usize>>,
    /// Cooling for this long from now.
    pub cool_for: Duration,
    /// The provider refused the key (401/403).
    pub refused: bool,
}

/// The database several instances share budgets and cooldowns through (the store on
/// PostgreSQL). `admit` is awaited before a request; the writes are sent behind it.
pub trait SharedLimits: Send + Sync {
    /// Check-and-spend in one atomic statement: counted in every window or in none.
    fn admit<'a>(&'a self, ask: Admission<'a>) -> BoxFuture<'a, Result<Admitted, String>>;
    /// [`SharedLimits::admit`] for up to `want` requests at once: counted in every
    /// window as many as there is room for (at least one), with how many; the first
    /// stamped now, the others `hold` later (the caller sends them within `hold`).
    fn admit_block<'a>(
        &'a self,
        ask: Admission<'a>,
        _want: u32,
        _hold: Duration,
    ) -> BoxFuture<'a, Result<(Admitted, u32), String>> {
        Box::pin(async move {
            self.admit(ask)
                .await
                .map(|admitted| (admitted, u32::from(admitted == Admitted::Yes)))
        })
    }
    /// [`SharedLimits::admit`] for one request of a budget that counts tokens a minute:
    /// the request's estimate is counted with it (in every window or in none), and the
    /// corrections `tokens` carries are applied whatever the answer.
    fn admit_tokens<'a>(
        &'a self,
        ask: Admission<'a>,
        tokens: TokensAsk,
    ) -> BoxFuture<'a, Result<Admitted, String>> {
        Box::pin(async move {
            self.admit_tokens_block(ask, tokens, 1, Duration::ZERO)
                .await
                .map(|(admitted, _)| admitted)
        })
    }
    /// [`SharedLimits::admit_tokens`] for up to `want` requests of `tokens.tokens`
    /// each, as [`SharedLimits::admit_block`] counts requests: as many as the minute's
    /// tokens and every request window have room for (at least one), with their
    /// tokens, and how many; those after the first are stamped `hold` later. Without
    /// it (a store that cannot count tokens) only the requests are counted.
    fn admit_tokens_block<'a>(
        &'a self,
        ask: Admission<'a>,
        _tokens: TokensAsk,
        want: u32,
        hold: Duration,
    ) -> BoxFuture<'a, Result<(Admitted, u32), String>> {
        self.admit_block(ask, want, hold)
    }
    /// Records what an answer taught about a budget.
    fn learned(&self, learned: Learned) -> BoxFuture<'static, Result<(), String>>;
    /// Records a cooldown.
    fn cooled(&self, cooled: Cooled) -> BoxFuture<'static, Result<(), String>>;
    /// Ends the cooldowns of a model and of one of its keys (`cooled.key`) that a usable
    /// answer proved over; a refused key stays refused.
    fn recovered(&self, cooled: Cooled) -> BoxFuture<'static, Result<(), String>>;
}

/// The shared database of several instances, as this process holds it.
pub(crate) struct Remote {
    limits: Arc<dyn SharedLimits>,
    /// Whether the last check-and-spend failed: a failure is logged when it starts and
    /// when it ends, not once per request.
    unreachable: AtomicBool,
    /// The blocks of each budget claimed and not yet spent, by budget and model (the
    /// model's cooldowns were looked at when the block was claimed).
    blocks: std::sync::Mutex<HashMap<(BudgetKey, String), SharedBlock>>,
    /// What answers took beyond or short of the estimates the database counted, by
    /// budget, carried with the budget's next admission from here.
    corrections: std::sync::Mutex<HashMap<BudgetKey, Correction>>,
}

/// One budget's tokens to set right in the shared database (see [`TokensAsk`]).
#[derive(Debug, Default, Clone, Copy)]
struct Correction {
    add: u64,
    give_back: u64,
    /// When the oldest request whose tokens are given back was admitted: its estimate
    /// leaves the database's minute a minute later, and so may what is given back.
    since: Option<Instant>,
}

/// A minute: the window of a tokens-per-minute budget.
const MINUTE: Duration = Duration::from_secs(60);

/// One budget's [`Block`], which its requests queue on while a claim is asked.
type SharedBlock = Arc<tokio::sync::Mutex<Block>>;

/// How long the requests of a block may be sent after it was claimed: the database
/// stamps them this late, so that no window opens before the provider's; also how
/// late this instance may learn of a cooldown another one set.
const BLOCK_HOLD: Duration = Duration::from_millis(100);

/// The most requests one claim asks for.
const BLOCK_MAX: u32 = 64;

/// A block is at most this fraction of the budget's smallest declared limit (as 429s
/// lowered it): a free tier's few requests are asked for one by one, since a slot
/// claimed and not used is lost to every instance until its window passes.
const BLOCK_SHARE: f64 = 16.0;

/// A day's budget counts as a limit this many times smaller (see [`block_cap`]).
const DAY_SHARE: u32 = 64;

/// Requests of one budget claimed from the shared database and not yet sent.
#[derive(Debug, Default)]
struct Block {
    /// Claimed and not sent yet.
    left: u32,
    /// Of a budget that counts tokens a minute: the tokens claimed with them and not
    /// yet taken by a request (each takes its own estimate), and when they were claimed.
    tokens_left: u64,
    claimed: Option<Instant>,
    /// They may be sent until then.
    until: Option<Instant>,
    /// The size the next claim asks for: doubled when a block was used up, halved
    /// when one expired with requests left.
    next: u32,
    /// The last claim was refused (or nobody could answer) until then: the requests
    /// that queued behind it are refused alike, without asking again.
    refused: Option<(Instant, SharedRefusal)>,
}

impl Remote {
    pub fn new(limits: Arc<dyn SharedLimits>) -> Self {
        Self {
            limits,
            unreachable: AtomicBool::new(false),
            blocks: std::sync::Mutex::default(),
            corrections: std::sync::Mutex::default(),
        }
    }

    fn corrections(&self) -> std::sync::MutexGuard<'_, HashMap<BudgetKey, Correction>> {
        self.corrections
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Carries what a request admitted at `admitted` took beyond its estimate
    /// (`took` − `estimate`) to the budget's next admission.
    fn correct(&self, budget: BudgetKey, admitted: Instant, estimate: u32, took: u64) {
        let estimate = u64::from(estimate);
        if took > estimate {
            let mut corrections = self.corrections();
            let c = corrections.entry(budget).or_default();
            c.add = c.add.saturating_add(took - estimate);
        } else {
            self.give_back(budget, admitted, estimate - took);
        }
    }

    /// Carries `tokens` counted at `counted` and not taken (an answer short of its
    /// estimate, a block's tokens no request took) to the budget's next admission, to
    /// be given back. Tokens counted over a minute ago have left the minute already:
    /// nothing to give back.
    fn give_back(&self, budget: BudgetKey, counted: Instant, tokens: u64) {
        if tokens == 0 || Instant::now().duration_since(counted) >= MINUTE {
            return;
        }
        let mut corrections = self.corrections();
        let c = corrections.entry(budget).or_default();
        c.give_back = c.give_back.saturating_add(tokens);
        c.since = Some(c.since.map_or(counted, |s| s.min(counted)));
    }

    /// Takes the budget's corrections to send with its admission now.
    fn take_correction(&self, budget: &BudgetKey) -> (u64, u64) {
        let Some(c) = self.corrections().remove(budget) else {
            return (0, 0);
        };
        let give_back = if c
            .since
            .is_some_and(|s| Instant::now().duration_since(s) < MINUTE)
        {
            c.give_back
        } else {
            0
        };
        (c.add, give_back)
    }

    /// Puts back what an admission that may not have reached the database carried:
    /// the tokens to add (counting them twice errs on the safe side), not those to give
    /// back (giving them back twice would not).
    fn restore_correction(&self, budget: BudgetKey, add: u64) {
        if add > 0 {
            let mut corrections = self.corrections();
            let c = corrections.entry(budget).or_default();
            c.add = c.add.saturating_add(add);
        }
    }

    fn block(&self, budget: &BudgetKey, model: &str) -> SharedBlock {
        let mut blocks = self
            .blocks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(
            blocks
                .entry((budget.clone(), model.to_owned()))
                .or_default(),
        )
    }

    /// Sends a write behind the request that caused it.
    fn write(write: BoxFuture<'static, Result<(), String>>) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        tokio::spawn(async move {
            if let Err(error) = write.await {
                tracing::warn!(%error, "could not share a cooldown or a learned limit");
            }
        });
    }

    fn reached(&self, ok: bool) {
        let was_unreachable = self.unreachable.swap(!ok, Ordering::Relaxed);
        if ok && was_unreachable {
            tracing::info!("the shared budgets can be checked again");
        }
    }
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote").finish_non_exhaustive()
    }
}

/// This process's shared state, in memory.
#[derive(Debug)]
pub(crate) struct LocalState {
    pub cooldowns: Cooldowns,
    pub budgets: Budgets,
    /// The database several instances share (PostgreSQL); `None` for one instance.
    pub remote: Option<Remote>,
}

impl LocalState {
    /// The shared database, where it counted the estimate of the request `taken` let
    /// through (a budget that counts tokens a minute, several instances).
    fn shared_tokens(&self, step: &StepId, taken: Taken) -> Option<&Remote> {
        let remote = self.remote.as_ref()?;
        let counts = self
            .budgets
            .declared(&step.provider)
            .is_some_and(|d| d.tokens_per_minute.is_some());
        (counts && taken.counts_tokens()).then_some(remote)
    }

    fn cooled(&self, step: &StepId, key: Option<Option<usize>>, until: Instant, refused: bool) {
        if let Some(remote) = &self.remote {
            Remote::write(remote.limits.cooled(Cooled {
                provider: step.provider.clone(),
                model: step.model.clone(),
                key,
                cool_for: until.saturating_duration_since(Instant::now()),
                refused,
            }));
        }
    }

    /// The check-and-spend in the shared database, and what its answer teaches here.
    /// A budget with room for many requests is claimed in blocks ([`Block`]): the
    /// request takes one left from the last claim, or claims a block for itself and the
    /// requests after it; the requests of one budget queue here while a claim is asked.
    /// A budget that counts tokens a minute claims each block's tokens with it, as
    /// many times this request's estimate as it claims requests: a later request
    /// takes its own estimate from them, and claims anew when they are too few (what
    /// no request took is given back with the next claim).
    async fn check_shared(
        &self,
        remote: &Remote,
        step: &StepId,
        key: Option<usize>,
        forced: bool,
        tokens: u32,
    ) -> Result<(), SharedRefusal> {
        let budget = self.budgets.key(step, key);
        let declared = self.budgets.declared(&step.provider);
        let per_minute = declared.and_then(|d| d.tokens_per_minute);
        let factor = self.budgets.factor(step, key);
        let cap = if forced {
            1
        } else {
            block_cap(declared, factor).min(tokens_block_cap(per_minute, tokens, factor))
        };
        if cap <= 1 {
            return self
                .claim(remote, step, key, forced, per_minute, tokens, 1)
                .await
                .map(|_| ());
        }
        let slot = remote.block(&budget, &step.model);
        let mut block = slot.lock().await;
        let now = Instant::now();
        let wanted = u64::from(tokens);
        // A block whose tokens are too few for this request is used up as one whose
        // requests are.
        let tokens_enough = per_minute.is_none() || block.tokens_left >= wanted;
        if block.left > 0 && tokens_enough && block.until.is_some_and(|until| until > now) {
            block.left -= 1;
            block.tokens_left -= wanted.min(block.tokens_left);
            return Ok(());
        }
        if let Some((until, refusal)) = block.refused
            && until > now
        {
            return Err(refusal);
        }
        if let Some(claimed) = block.claimed.take() {
            remote.give_back(
                budget.clone(),
                claimed,
                std::mem::take(&mut block.tokens_left),
            );
        }
        block.next = match (block.until, block.left > 0 && tokens_enough) {
            (None, _) => 1,
            (Some(_), false) => block.next.saturating_mul(2),
            (Some(_), true) => block.next / 2,
        }
        .clamp(1, cap);
        block.left = 0;
        block.until = Some(now + BLOCK_HOLD);
        match self
            .claim(remote, step, key, false, per_minute, tokens, block.next)
            .await
        {
            Ok(granted) => {
                block.refused = None;
                block.left = granted.saturating_sub(1);
                if per_minute.is_some() {
                    block.tokens_left = u64::from(block.left) * wanted;
                    block.claimed = Some(now);
                }
                Ok(())
            }
            Err(refusal) => {
                let until = match refusal {
                    SharedRefusal::Budget(until) | SharedRefusal::Cooling(until) => until,
                };
                block.refused = Some((until, refusal));
                block.until = None;
                Err(refusal)
            }
        }
    }

    /// One check-and-spend of up to `want` requests in the shared database, of
    /// `tokens` each where the budget counts `per_minute` tokens a minute (the
    /// budget's corrections carried from here go with it): how many were counted, or
    /// why none and until when (learned here too).
    #[expect(
        clippy::too_many_arguments,
        reason = "one request's admission, spelt out"
    )]
    async fn claim(
        &self,
        remote: &Remote,
        step: &StepId,
        key: Option<usize>,
        forced: bool,
        per_minute: Option<u32>,
        tokens: u32,
        want: u32,
    ) -> Result<u32, SharedRefusal> {
        let budget = self.budgets.key(step, key);
        let ask = self.admission(&budget, step, key, forced);
        let Some(per_minute) = per_minute else {
            let answer = tokio::time::timeout(
                ADMIT_TIMEOUT,
                remote.limits.admit_block(ask, want, BLOCK_HOLD),
            )
            .await
            .unwrap_or_else(|_| Err("no answer in time".to_owned()));
            return self.shared_answer(remote, step, key, answer);
        };
        let (add, give_back) = remote.take_correction(&budget);
        let tokens = TokensAsk {
            per_minute,
            tokens,
            add,
            give_back,
        };
        let answer = tokio::time::timeout(
            ADMIT_TIMEOUT,
            remote
                .limits
                .admit_tokens_block(ask, tokens, want, BLOCK_HOLD),
        )
        .await
        .unwrap_or_else(|_| Err("no answer in time".to_owned()));
        if answer.is_err() {
            remote.restore_correction(budget.clone(), add);
        }
        self.shared_answer(remote, step, key, answer)
    }

    /// The request a budget asks the shared database for.
    fn admission<'a>(
        &self,
        budget: &'a BudgetKey,
        step: &'a StepId,
        key: Option<usize>,
        forced: bool,
    ) -> Admission<'a> {
        let declared = self.budgets.declared(&step.provider);
        Admission {
            provider: &budget.provider,
            scope: &budget.scope,
            model: &step.model,
            key_index: key,
            forced,
            per_second: declared.and_then(|d| d.requests_per_second),
            per_minute: declared.and_then(|d| d.requests_per_minute),
            per_day: declared.and_then(|d| d.requests_per_day),
            day_reset_secs: crate::llm::budget::DAILY_RESET_UTC_SECS,
        }
    }

    /// What the shared database answered (or that it could not): how many requests
    /// were counted, or why none and until when (learned here too).
    fn shared_answer(
        &self,
        remote: &Remote,
        step: &StepId,
        key: Option<usize>,
        answer: Result<(Admitted, u32), String>,
    ) -> Result<u32, SharedRefusal> {
        let now = Instant::now();
        let refusal = match answer {
            Ok((Admitted::Yes, granted)) => {
                remote.reached(true);
                return Ok(granted.max(1));
            }
            Ok((Admitted::Budget(wait), _)) => {
                self.budgets.hold(step, key, now + wait);
                SharedRefusal::Budget(now + wait)
            }
            Ok((Admitted::Cooling(wait), _)) => {
                self.cooldowns.trip_key(step, key, now + wait);
                SharedRefusal::Cooling(now + wait)
            }
            Ok((Admitted::ModelCooling(wait), _)) => {
                self.cooldowns.trip_step(step, now + wait);
                SharedRefusal::Cooling(now + wait)
            }
            Ok((Admitted::Refused(wait), _)) => {
                self.cooldowns.refuse_key(step, key, now + wait);
                SharedRefusal::Cooling(now + wait)
            }
            Err(error) => {
                if !remote.unreachable.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        %error,
                        "the shared budgets cannot be checked: no request is sent until they can"
                    );
                }
                self.budgets.hold(step, key, now + UNCHECKED_WAIT);
                return Err(SharedRefusal::Budget(now + UNCHECKED_WAIT));
            }
        };
        remote.reached(true);
        Err(refusal)
    }
}

/// The most requests of one budget a claim may ask for: [`BLOCK_MAX`], at most a
/// [`BLOCK_SHARE`]th of its smallest declared limit as 429s lowered it (`factor`);
/// 1 (each request asked for alone) for a free tier's small limits.
fn block_cap(declared: Option<&BudgetSettings>, factor: f64) -> u32 {
    let smallest = declared
        .into_iter()
        .flat_map(|d| {
            [
                d.requests_per_second,
                d.requests_per_minute,
                // A day's slot claimed and not used is lost for the day: a day's
                // budget allows blocks only when it is very large.
                d.requests_per_day.map(|n| n / DAY_SHARE),
            ]
        })
        .flatten()
        .min();
    let Some(smallest) = smallest else {
        return BLOCK_MAX;
    };
    share_cap(f64::from(smallest) * factor.clamp(0.0, 1.0) / BLOCK_SHARE)
}

/// The most requests of a budget that counts `per_minute` tokens a minute one claim
/// may ask for, for requests of `tokens` each: as [`block_cap`], a [`BLOCK_SHARE`]th of
/// the minute's tokens as 429s lowered them (`factor`); [`BLOCK_MAX`] for a budget that
/// counts no tokens.
fn tokens_block_cap(per_minute: Option<u32>, tokens: u32, factor: f64) -> u32 {
    let Some(per_minute) = per_minute else {
        return BLOCK_MAX;
    };
    share_cap(
        f64::from(per_minute) * factor.clamp(0.0, 1.0) / (BLOCK_SHARE * f64::from(tokens.max(1))),
    )
}

/// A block's size from a budget's share of requests: that many whole requests, at
/// least 1, at most [`BLOCK_MAX`].
fn share_cap(share: f64) -> u32 {
    let share = share.floor();
    if share >= f64::from(BLOCK_MAX) {
        BLOCK_MAX
    } else if share >= 1.0 {
        // In range by the two comparisons.
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "1..BLOCK_MAX"
        )]
        let share = share as u32;
        share
    } else {
        1
    }
}

impl SharedState for LocalState {
    fn default_until(&self) -> Instant {
        self.cooldowns.default_until()
    }
    fn key_cooling_until(&self, step: &StepId, key: Option<usize>) -> Option<Instant> {
        self.cooldowns.key_blocked_until(step, key)
    }
    fn step_cooling_until(
        &self,
        step: &StepId,
        keys: &[Option<usize>],
    ) -> Option<(Instant, Option<usize>)> {
        self.cooldowns.step_blocked_until(step, keys)
    }
    fn record_failure(&self, step: &StepId, key: Option<usize>) -> bool {
        let tripped = self.cooldowns.record_failure(step, key);
        if tripped && let Some(until) = self.cooldowns.key_blocked_until(step, key) {
            self.cooled(step, Some(key), until, false);
        }
        tripped
    }
    fn record_success(&self, step: &StepId, key: Option<usize>) {
        // A cooldown this process had set (a hedge's stall mark, a trip) is ended for
        // the others too; one it never knew of runs its course.
        if self.cooldowns.record_success(step, key)
            && let Some(remote) = &self.remote
        {
            Remote::write(remote.limits.recovered(Cooled {
                provider: step.provider.clone(),
                model: step.model.clone(),
                key: Some(key),
                cool_for: Duration::ZERO,
                refused: false,
            }));
        }
    }
    fn cool_key(&self, step: &StepId, key: Option<usize>, until: Instant) {
        self.cooldowns.trip_key(step, key, until);
        self.cooled(step, Some(key), until, false);
    }
    fn refuse_key(&self, step: &StepId, key: Option<usize>, until: Instant) {
        self.cooldowns.refuse_key(step, key, until);
        self.cooled(step, Some(key), until, true);
    }
    fn step_refused(&self, step: &StepId, keys: &[Option<usize>]) -> bool {
        self.cooldowns.step_refused(step, keys)
    }
    fn cool_step(&self, step: &StepId, until: Instant) {
        self.cooldowns.trip_step(step, until);
        self.cooled(step, None, until, false);
    }
    fn budget_until(&self, step: &StepId, key: Option<usize>, tokens: u32) -> Option<Instant> {
        self.budgets.blocked_until(step, key, tokens)
    }
    fn step_budget_until(
        &self,
        step: &StepId,
        keys: &[Option<usize>],
        tokens: u32,
    ) -> Option<Instant> {
        self.budgets.step_blocked_until(step, keys, tokens)
    }
    fn step_turn(
        &self,
        step: &StepId,
        keys: &[Option<usize>],
        tokens: u32,
    ) -> Option<(Instant, Option<usize>)> {
        self.budgets.step_turn(step, keys, tokens)
    }
    fn queue(&self, step: &StepId, key: Option<usize>, join: bool) {
        self.budgets.queue(step, key, join);
    }
    fn admit(&self, step: &StepId, key: Option<usize>, tokens: u32) -> Result<Taken, Instant> {
        self.budgets.admit(step, key, tokens)
    }
    fn spend_tokens(&self, step: &StepId, key: Option<usize>, taken: Taken, used: Option<u64>) {
        self.budgets.spend_tokens(step, key, taken, used);
        if let Some(remote) = self.shared_tokens(step, taken) {
            let took = used.unwrap_or(u64::from(taken.tokens()));
            let budget = self.budgets.key(step, key);
            remote.correct(budget, taken.admitted_at(), taken.tokens(), took);
        }
    }
    fn uncounted(&self, step: &StepId, key: Option<usize>, taken: Taken) {
        if let Some(remote) = self.shared_tokens(step, taken) {
            let budget = self.budgets.key(step, key);
            remote.correct(budget, taken.admitted_at(), taken.tokens(), 0);
        }
    }
    fn learn(
        &self,
        step: &StepId,
        key: Option<usize>,
        hint: &Hint,
        rate_limited: bool,
    ) -> Option<std::time::Duration> {
        // One instance: nothing to write, nothing more to look up.
        let Some(remote) = &self.remote else {
            return self.budgets.learn(step, key, hint, rate_limited);
        };
        let factor_before = self.budgets.factor(step, key);
        let spent = self.budgets.learn(step, key, hint, rate_limited);
        if spent.is_some() || rate_limited || factor_before < 1.0 {
            let budget = self.budgets.key(step, key);
            Remote::write(remote.limits.learned(Learned {
                provider: budget.provider,
                scope: budget.scope,
                key_index: key,
                spent_for: spent,
                daily: rate_limited && hint.per_day,
                factor: self.budgets.factor(step, key),
            }));
        }
        spent
    }
    fn take_new_daily(&self) -> Vec<SpentBudget> {
        self.budgets.take_new_daily()
    }
    fn restore(&self, spent: &[SpentBudget]) {
        self.budgets.restore(spent);
    }
    fn spent_now(&self) -> Vec<(SpentBudget, bool)> {
        self.budgets.spent_now()
    }
    fn budget_left(&self, step: &StepId, key: Option<usize>) -> BudgetLeft {
        self.budgets.left(step, key)
    }
    fn admit_shared<'a>(
        &'a self,
        step: &'a StepId,
        key: Option<usize>,
        forced: bool,
        taken: Taken,
    ) -> Option<BoxFuture<'a, Result<(), SharedRefusal>>> {
        let remote = self.remote.as_ref()?;
        Some(Box::pin(async move {
            let checked = self
                .check_shared(remote, step, key, forced, taken.tokens())
                .await;
            if let Err(refusal) = &checked {
                // Not sent after all: this process's windows give the send back, and
                // the hold the refusal set stays (the give-back may have undone it).
                self.budgets.unadmit(step, key, taken);
                if let SharedRefusal::Budget(until) = refusal {
                    self.budgets.hold(step, key, *until);
                }
            }
            checked
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn declared(second: Option<u32>, minute: Option<u32>, day: Option<u32>) -> BudgetSettings {
        BudgetSettings {
            per: crate::config::BudgetPer::default(),
            requests_per_second: second,
            requests_per_minute: minute,
            requests_per_day: day,
            tokens_per_minute: None,
        }
    }

    /// A shared database that is never reached: the corrections are kept here only.
    struct Nowhere;

    impl SharedLimits for Nowhere {
        fn admit<'a>(&'a self, _: Admission<'a>) -> BoxFuture<'a, Result<Admitted, String>> {
            Box::pin(async { Err("nowhere".to_owned()) })
        }
        fn learned(&self, _: Learned) -> BoxFuture<'static, Result<(), String>> {
            Box::pin(async { Ok(()) })
        }
        fn cooled(&self, _: Cooled) -> BoxFuture<'static, Result<(), String>> {
            Box::pin(async { Ok(()) })
        }
        fn recovered(&self, _: Cooled) -> BoxFuture<'static, Result<(), String>> {
            Box::pin(async { Ok(()) })
        }
    }

    #[test]
    fn answers_corrections_are_carried_once_and_old_give_backs_dropped() {
        let remote = Remote::new(Arc::new(Nowhere));
        let budget = BudgetKey {
            provider: "groq".to_owned(),
            scope: "qwen".to_owned(),
            key: Some(0),
        };
        let now = Instant::now();
        // Took more than estimated, then another took less: both carried, once.
        remote.correct(budget.clone(), now, 300, 450);
        remote.correct(budget.clone(), now, 300, 100);
        remote.correct(budget.clone(), now, 300, 300);
        assert_eq!(remote.take_correction(&budget), (150, 200));
        assert_eq!(remote.take_correction(&budget), (0, 0), "taken once");
        // A call that may not have arrived: what was to be added is sent again, what
        // was to be given back is not.
        remote.restore_correction(budget.clone(), 150);
        assert_eq!(remote.take_correction(&budget), (150, 0));
        // A request whose estimate has left the minute has nothing to give back, nor
        // has one whose give-back waited until then.
        if let Some(long_ago) = now.checked_sub(Duration::from_secs(61)) {
            remote.correct(budget.clone(), long_ago, 300, 0);
            assert_eq!(remote.take_correction(&budget), (0, 0));
            remote.correct(budget.clone(), now, 300, 0);
            if let Some(c) = remote.corrections().get_mut(&budget) {
                c.since = Some(long_ago);
            }
            assert_eq!(remote.take_correction(&budget), (0, 0));
        }
    }

    #[test]
    fn free_tiers_are_asked_request_by_request_and_large_budgets_in_blocks() {
        let cap = |d: &BudgetSettings, factor| block_cap(Some(d), factor);
        // The shipped free tiers: Mistral 1/s, Groq 30/min and 1000/day, Gemini 15/min.
        assert_eq!(cap(&declared(Some(1), None, None), 1.0), 1);
        assert_eq!(cap(&declared(None, Some(30), Some(1000)), 1.0), 1);
        assert_eq!(cap(&declared(None, Some(15), Some(1000)), 1.0), 1);
        // A day's budget alone counts as a 64th of itself: 1000 a day is asked alone.
        assert_eq!(cap(&declared(None, None, Some(1000)), 1.0), 1);
        assert_eq!(cap(&declared(None, Some(1000), None), 1.0), 62);
        assert_eq!(cap(&declared(Some(1_000_000), None, None), 1.0), BLOCK_MAX);
        // What 429s taught lowers it.
        assert_eq!(cap(&declared(None, Some(64), None), 0.5), 2);
        // Nothing declared: only the cooldowns are asked about.
        assert_eq!(block_cap(None, 1.0), BLOCK_MAX);
    }
}
