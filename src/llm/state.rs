//! The state requests share — cooldowns and budgets — behind one small interface
//! ([`SharedState`]), so that several daylog instances could later keep it in a common
//! store. [`LocalState`] is this process's, in memory; the cascade only ever sees the
//! trait. Every method is quick and synchronous: an implementation backed by a remote
//! store would cache and write behind, never make a request wait on it.

use tokio::time::Instant;

use crate::llm::budget::{BudgetLeft, Budgets, SpentBudget, Taken};
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
}

/// This process's shared state, in memory.
#[derive(Debug)]
pub(crate) struct LocalState {
    pub cooldowns: Cooldowns,
    pub budgets: Budgets,
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
        self.cooldowns.record_failure(step, key)
    }
    fn record_success(&self, step: &StepId, key: Option<usize>) {
        self.cooldowns.record_success(step, key);
    }
    fn cool_key(&self, step: &StepId, key: Option<usize>, until: Instant) {
        self.cooldowns.trip_key(step, key, until);
    }
    fn refuse_key(&self, step: &StepId, key: Option<usize>, until: Instant) {
        self.cooldowns.refuse_key(step, key, until);
    }
    fn step_refused(&self, step: &StepId, keys: &[Option<usize>]) -> bool {
        self.cooldowns.step_refused(step, keys)
    }
    fn cool_step(&self, step: &StepId, until: Instant) {
        self.cooldowns.trip_step(step, until);
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
    }
    fn learn(
        &self,
        step: &StepId,
        key: Option<usize>,
        hint: &Hint,
        rate_limited: bool,
    ) -> Option<std::time::Duration> {
        self.budgets.learn(step, key, hint, rate_limited)
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
}
