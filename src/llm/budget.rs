//! The shared budget registry (docs/behaviour.md, Budgets): for each key — or key and model, where
//! the provider counts per model — what may still be sent, from the limits declared in
//! config and what the provider's answers taught ([`Hint`]). A request asks
//! [`Budgets::admit`] before sending: a spent budget is never sent on. The lock is a
//! plain mutex held for a map lookup, never across an await.
//!
//! Learning: a reset the provider names (headers, Gemini's body) makes the budget spent
//! until then; a per-day quota until the daily reset. A 429 that names nothing lowers
//! the declared request rates (halved, down to a tenth) and pauses the budget for a growing
//! penalty (1 s, doubling to 60 s); each success raises the rates again by a twentieth
//! and clears the penalty — additive increase, multiplicative decrease.
//!
//! Tokens per minute, where declared, are a budget too, counted from what the answers'
//! `usage` reports ([`Hint::used_tokens`]; the estimate when an answer does not say): a
//! request is admitted when its estimate ([`request_tokens`]: the request's text and the
//! answer it may get) fits beside what the last minute's answers took. Requests
//! still in flight are not counted by a guess: in a burst, a guess that is too high
//! would send work elsewhere that the provider would have taken, and one that is too
//! low saves nothing; the provider's 429 says when, and is learned like any other. A 429
//! takes nothing; an attempt cancelled in flight (a hedge that lost, the deadline) takes
//! its estimate, since the provider counted it. A request larger than the whole minute
//! is sent once the minute has taken nothing: the provider then says what it thinks of
//! it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::config::{BudgetPer, BudgetSettings};
use crate::llm::budget_hint::Hint;
use crate::llm::cooldown::StepId;
use crate::llm_request::ChatRequest;

const SECOND: Duration = Duration::from_secs(1);
const MINUTE: Duration = Duration::from_secs(60);
const MIN_PENALTY: Duration = Duration::from_secs(1);
const MAX_PENALTY: Duration = Duration::from_secs(60);
const MIN_FACTOR: f64 = 0.1;

/// What one chat request is expected to take from a tokens-per-minute budget: a
/// cautious estimate of its text — a quarter of its UTF-8 bytes (English runs about four
/// bytes a token, Cyrillic more), plus a few for the messages' framing — and the answer
/// it may get: the step's `max_tokens`, else the metrics' JSON object (eight short
/// fields, 128) or an analysis of a few sentences (256). The answer's `usage` then says
/// what it took.
pub(crate) fn request_tokens(request: &ChatRequest, max_tokens: Option<u32>) -> u32 {
    let bytes = request.system.len() + request.user.len();
    let text = u32::try_from(bytes.div_ceil(4))
        .unwrap_or(u32::MAX)
        .saturating_add(16);
    let answer = max_tokens.unwrap_or(if request.json { 128 } else { 256 });
    text.saturating_add(answer)
}

/// One budget: a provider, the model where it counts per model ('' otherwise), a key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct BudgetKey {
    pub provider: String,
    pub scope: String,
    pub key: Option<usize>,
}

#[derive(Debug)]
struct State {
    /// Known spent until then (a named reset, a penalty).
    spent_until: Option<Instant>,
    /// Whether `spent_until` is a per-day quota (kept across restarts).
    daily: bool,
    /// Whether that daily spend was handed out to be stored.
    persisted: bool,
    /// Sends within the last minute, oldest first.
    sent: VecDeque<Instant>,
    /// Tokens the last minute's answers took, oldest first (only where requests count
    /// them: a declared `tokens_per_minute` and a chat request), and their sum.
    tokens: VecDeque<(Instant, u32)>,
    tokens_used: u64,
    /// Sends on the current UTC day: (day number, count).
    today: (u64, u32),
    /// Multiplies the declared rates; lowered by hintless 429s.
    factor: f64,
    penalty: Duration,
    /// Requests waiting for this budget to return (each is served one turn after the
    /// one before it): what a spill-over decision counts, not only the next return.
    waiting: usize,
}

impl Default for State {
    fn default() -> Self {
        Self {
            spent_until: None,
            daily: false,
            persisted: false,
            sent: VecDeque::new(),
            tokens: VecDeque::new(),
            tokens_used: 0,
            today: (0, 0),
            factor: 1.0,
            penalty: Duration::ZERO,
            waiting: 0,
        }
    }
}

/// A daily budget spent until a wall-clock time: what persists across restarts
/// (`llm_budgets`). `scope` is the model where the provider counts per model, else ''.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpentBudget {
    pub provider: String,
    pub scope: String,
    /// The key's index in the provider's key list; never the key.
    pub key_index: Option<usize>,
    pub until: SystemTime,
}

/// What [`Budgets::admit`] let through: handed back to [`Budgets::spend_tokens`] with
/// what the answer took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Taken {
    /// The request's estimate where its budget counts tokens, else 0.
    tokens: u32,
    /// What the admission changed, for [`Budgets::unadmit`].
    undo: Undo,
}

/// What one [`Budgets::admit`] changed in its budget: the send it counted, the day it
/// counted it on, and, when it took the day's last request, the spend it marked and
/// what was there before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Undo {
    sent_at: Instant,
    day: u64,
    marked: Option<Marked>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Marked {
    until: Instant,
    spent_until: Option<Instant>,
    daily: bool,
    persisted: bool,
}

impl Taken {
    /// Whether the request's budget counts tokens (so its answer's `usage` is wanted).
    pub fn counts_tokens(self) -> bool {
        self.tokens > 0
    }

    /// The request's estimate where its budget counts tokens, else 0.
    pub fn tokens(self) -> u32 {
        self.tokens
    }

    /// When this process admitted it.
    pub fn admitted_at(self) -> Instant {
        self.undo.sent_at
    }
}

#[derive(Debug)]
pub(crate) struct Budgets {
    declared: HashMap<String, BudgetSettings>,
    states: Mutex<HashMap<BudgetKey, State>>,
}

/// Seconds after UTC midnight at which the free tiers' days restart: Gemini's quotas
/// reset at midnight Pacific time, 08:00 UTC (07:00 in summer: then one hour late,
/// which spends nothing).
pub(crate) const DAILY_RESET_UTC_SECS: u64 = 8 * 3600;

/// The wait until the next daily reset, from `now`.
pub(crate) fn until_daily_reset(now: SystemTime) -> Duration {
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let into_day = (secs + 86_400 - DAILY_RESET_UTC_SECS) % 86_400;
    Duration::from_secs(86_400 - into_day)
}

fn day_number(now: SystemTime) -> u64 {
    now.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
        .saturating_sub(DAILY_RESET_UTC_SECS)
        / 86_400
}

/// A declared rate as 429s lowered it (`factor`): at least one request per window, since
/// a budget is slowed, never closed.
fn scaled_limit(limit: u32, factor: f64) -> usize {
    let limit = (f64::from(limit) * factor).floor();
    if limit < 1.0 { 1 } else { limit as usize }
}

/// What a budget has left now, in requests (the budget gauge): this minute — the
/// declared per-minute rate as 429s lowered it, less the last minute's sends — and today
/// — the declared daily quota less today's sends; both 0 while it is known spent (a
/// named reset, a penalty). `None` where nothing is declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetLeft {
    pub minute: Option<u64>,
    pub day: Option<u64>,
}

/// When a request of `tokens` fits in a minute's budget of `limit` tokens, given what
/// the last minute took; `None` when it fits now. A request larger than the whole budget
/// fits once the minute has taken nothing.
fn tokens_room(state: &State, limit: u64, tokens: u64) -> Option<Instant> {
    if state.tokens_used + tokens <= limit || state.tokens_used == 0 {
        return None;
    }
    let mut left = state.tokens_used;
    for (at, taken) in &state.tokens {
        left = left.saturating_sub(u64::from(*taken));
        if left + tokens <= limit {
            return Some(*at + MINUTE);
        }
    }
    state.tokens.back().map(|(at, _)| *at + MINUTE)
}

impl Budgets {
    pub fn new(declared: HashMap<String, BudgetSettings>) -> Self {
        Self {
            declared,
            states: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<BudgetKey, State>> {
        self.states.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The budget a request of `step` with `key` is sent on.
    pub fn key(&self, step: &StepId, key: Option<usize>) -> BudgetKey {
        let per = self
            .declared
            .get(&step.provider)
            .map(|d| d.per)
            .unwrap_or_default();
        BudgetKey {
            provider: step.provider.clone(),
            scope: match per {
                BudgetPer::Key => String::new(),
                BudgetPer::Model => step.model.clone(),
            },
            key,
        }
    }

    /// When the budget has room again for a request of `tokens`, or `None` if it has
    /// room now.
    fn spent_until(
        &self,
        budget: &BudgetKey,
        state: &mut State,
        now: Instant,
        tokens: u32,
    ) -> Option<Instant> {
        while state
            .sent
            .front()
            .is_some_and(|t| now.duration_since(*t) >= MINUTE)
        {
            state.sent.pop_front();
        }
        while let Some((at, taken)) = state.tokens.front()
            && now.duration_since(*at) >= MINUTE
        {
            state.tokens_used = state.tokens_used.saturating_sub(u64::from(*taken));
            state.tokens.pop_front();
        }
        let mut until = state.spent_until.filter(|u| *u > now);
        if until.is_none() {
            state.spent_until = None;
            state.daily = false;
        }
        let Some(declared) = self.declared.get(&budget.provider) else {
            return until;
        };
        let scaled = |limit: u32| scaled_limit(limit, state.factor);
        let windows = [
            (declared.requests_per_second, SECOND),
            (declared.requests_per_minute, MINUTE),
        ];
        for (limit, window) in windows {
            let Some(limit) = limit.map(scaled) else {
                continue;
            };
            // Fewer sends in the last minute than the limit: room (O(1) for large,
            // paid-tier limits; otherwise at most `limit` sends are looked at).
            if state.sent.len() < limit {
                continue;
            }
            let filling = state
                .sent
                .iter()
                .rev()
                .take_while(|t| now.duration_since(**t) < window)
                .nth(limit - 1);
            if let Some(oldest) = filling {
                // Room again when the oldest send that fills the window leaves it.
                until = until.max(Some(*oldest + window));
            }
        }
        // Measured, not guessed: the tokens are what the answers said they took, so a
        // 429 does not scale them down (it pauses the budget until when it says).
        if let Some(limit) = declared.tokens_per_minute
            && tokens > 0
        {
            until = until.max(tokens_room(state, u64::from(limit), u64::from(tokens)));
        }
        if let Some(per_day) = declared.requests_per_day {
            let wall = SystemTime::now();
            if state.today.0 == day_number(wall) && state.today.1 >= per_day {
                until = until.max(Some(now + until_daily_reset(wall)));
            }
        }
        until
    }

    /// The pace of a budget for requests of `tokens`: the shortest time between two of
    /// them its declared rates allow (the slowest window binds). Zero when no rate is
    /// declared.
    fn interval(&self, budget: &BudgetKey, state: &State, tokens: u32) -> Duration {
        let Some(declared) = self.declared.get(&budget.provider) else {
            return Duration::ZERO;
        };
        let tokens_pace = declared
            .tokens_per_minute
            .filter(|_| tokens > 0)
            .map(|limit| MINUTE.mul_f64(f64::from(tokens) / f64::from(limit.max(1))));
        [
            (declared.requests_per_second, SECOND),
            (declared.requests_per_minute, MINUTE),
        ]
        .into_iter()
        .filter_map(|(limit, window)| {
            let limit = (f64::from(limit?) * state.factor).floor().max(1.0);
            Some(window.div_f64(limit))
        })
        .chain(tokens_pace)
        .max()
        .unwrap_or(Duration::ZERO)
    }

    /// When a request of `tokens` that joins the queue of this budget now would be
    /// sent: its next return, plus one interval for each request already waiting for
    /// it. `None` when it has room now and nobody waits.
    pub fn turn(&self, step: &StepId, key: Option<usize>, tokens: u32) -> Option<Instant> {
        let budget = self.key(step, key);
        let now = Instant::now();
        let mut states = self.lock();
        let state = states.entry(budget.clone()).or_default();
        let free = self.spent_until(&budget, state, now, tokens);
        if free.is_none() && state.waiting == 0 {
            return None;
        }
        let ahead = u32::try_from(state.waiting).unwrap_or(u32::MAX);
        let behind = self
            .interval(&budget, state, tokens)
            .saturating_mul(ahead)
            .min(crate::llm::retry_after::MAX_WAIT);
        let turn = free.unwrap_or(now) + behind;
        (turn > now).then_some(turn)
    }

    /// The soonest [`Budgets::turn`] over the step's keys, when no key is free now.
    pub fn step_turn(
        &self,
        step: &StepId,
        keys: &[Option<usize>],
        tokens: u32,
    ) -> Option<(Instant, Option<usize>)> {
        let mut soonest: Option<(Instant, Option<usize>)> = None;
        for key in keys {
            let turn = self.turn(step, *key, tokens)?;
            if soonest.is_none_or(|(s, _)| turn < s) {
                soonest = Some((turn, *key));
            }
        }
        soonest
    }

    /// A request starts (`true`) or stops (`false`) waiting for this budget.
    pub fn queue(&self, step: &StepId, key: Option<usize>, join: bool) {
        let budget = self.key(step, key);
        let mut states = self.lock();
        let state = states.entry(budget).or_default();
        state.waiting = if join {
            state.waiting.saturating_add(1)
        } else {
            state.waiting.saturating_sub(1)
        };
    }

    /// Until when this budget is spent for a request of `tokens`, if it is (nothing is
    /// recorded).
    pub fn blocked_until(&self, step: &StepId, key: Option<usize>, tokens: u32) -> Option<Instant> {
        let budget = self.key(step, key);
        let mut states = self.lock();
        let state = states.entry(budget.clone()).or_default();
        self.spent_until(&budget, state, Instant::now(), tokens)
    }

    /// What the budget of this key of this step has left now.
    pub fn left(&self, step: &StepId, key: Option<usize>) -> BudgetLeft {
        let budget = self.key(step, key);
        let now = Instant::now();
        let mut states = self.lock();
        let state = states.entry(budget.clone()).or_default();
        // Asked for what it prunes: the sends older than a minute, a spend that is over.
        let _room_again_at = self.spent_until(&budget, state, now, 0);
        let spent = state.spent_until.is_some_and(|until| until > now);
        let Some(declared) = self.declared.get(&budget.provider) else {
            return BudgetLeft {
                minute: None,
                day: None,
            };
        };
        let minute = declared.requests_per_minute.map(|limit| {
            let limit = scaled_limit(limit, state.factor);
            u64::try_from(limit.saturating_sub(state.sent.len())).unwrap_or(u64::MAX)
        });
        let day = declared.requests_per_day.map(|quota| {
            let sent_today = if state.today.0 == day_number(SystemTime::now()) {
                state.today.1
            } else {
                0
            };
            u64::from(quota.saturating_sub(sent_today))
        });
        let zero_if_spent = |left: Option<u64>| left.map(|n| if spent { 0 } else { n });
        BudgetLeft {
            minute: zero_if_spent(minute),
            day: zero_if_spent(day),
        }
    }

    /// The soonest moment a key of the step has budget, when none has it now.
    pub fn step_blocked_until(
        &self,
        step: &StepId,
        keys: &[Option<usize>],
        tokens: u32,
    ) -> Option<Instant> {
        let mut soonest: Option<Instant> = None;
        for key in keys {
            let until = self.blocked_until(step, *key, tokens)?;
            soonest = Some(soonest.map_or(until, |s| s.min(until)));
        }
        soonest
    }

    /// Takes one request of `tokens` (0: none counted) from the budget, or says until
    /// when it is spent.
    pub fn admit(&self, step: &StepId, key: Option<usize>, tokens: u32) -> Result<Taken, Instant> {
        let budget = self.key(step, key);
        let now = Instant::now();
        let mut states = self.lock();
        let state = states.entry(budget.clone()).or_default();
        if let Some(until) = self.spent_until(&budget, state, now, tokens) {
            return Err(until);
        }
        state.sent.push_back(now);
        let counts_tokens = self
            .declared
            .get(&budget.provider)
            .is_some_and(|d| d.tokens_per_minute.is_some());
        let tokens = if counts_tokens { tokens } else { 0 };
        let wall = SystemTime::now();
        let day = day_number(wall);
        if state.today.0 == day {
            state.today.1 = state.today.1.saturating_add(1);
        } else {
            state.today = (day, 1);
        }
        let mut marked = None;
        if let Some(per_day) = self
            .declared
            .get(&budget.provider)
            .and_then(|d| d.requests_per_day)
            && state.today.1 >= per_day
        {
            // The day's last request: the budget is spent until the daily reset, and
            // stored like one the provider reported, so a restart does not spend it again.
            let until = now + until_daily_reset(wall);
            let until = state.spent_until.map_or(until, |u| u.max(until));
            marked = Some(Marked {
                until,
                spent_until: state.spent_until,
                daily: state.daily,
                persisted: state.persisted,
            });
            state.spent_until = Some(until);
            state.daily = true;
            state.persisted = false;
        }
        Ok(Taken {
            tokens,
            undo: Undo {
                sent_at: now,
                day,
                marked,
            },
        })
    }

    /// What is declared for `provider`'s budgets, if anything.
    pub fn declared(&self, provider: &str) -> Option<&BudgetSettings> {
        self.declared.get(provider)
    }

    /// The declared rates of this budget as 429s lowered them (1: as declared).
    pub fn factor(&self, step: &StepId, key: Option<usize>) -> f64 {
        let budget = self.key(step, key);
        self.lock().get(&budget).map_or(1.0, |s| s.factor)
    }

    /// Holds the budget spent until `until`: the shared database said so (another
    /// instance spent it), or cannot say (nothing is sent on a budget nobody checked).
    /// Not a daily spend, and no lesson about the rate.
    pub fn hold(&self, step: &StepId, key: Option<usize>, until: Instant) {
        let budget = self.key(step, key);
        let mut states = self.lock();
        let state = states.entry(budget).or_default();
        if state.spent_until.is_none_or(|u| u < until) {
            state.spent_until = Some(until);
            state.daily = false;
        }
    }

    /// Gives back what the [`Budgets::admit`] that let `taken` through took: the
    /// request was not sent after all (the shared database refused it). Its send, its
    /// count for the day, and the daily spend it marked if it took the day's last
    /// request (unless something later moved that spend) — nothing of others' sends.
    pub fn unadmit(&self, step: &StepId, key: Option<usize>, taken: Taken) {
        let budget = self.key(step, key);
        let mut states = self.lock();
        let Some(state) = states.get_mut(&budget) else {
            return;
        };
        let undo = taken.undo;
        if let Some(at) = state.sent.iter().rposition(|t| *t == undo.sent_at) {
            state.sent.remove(at);
        }
        if state.today.0 == undo.day {
            state.today.1 = state.today.1.saturating_sub(1);
        }
        if let Some(marked) = undo.marked
            && state.spent_until == Some(marked.until)
        {
            state.spent_until = marked.spent_until;
            state.daily = marked.daily;
            state.persisted = marked.persisted;
        }
    }

    /// Counts what one request `taken` let through cost its tokens-per-minute budget:
    /// `used` as its answer's `usage` says, or its estimate when nothing says (a
    /// cancelled attempt, an answer without `usage`). A request the provider refused
    /// (a 429) is not counted.
    pub fn spend_tokens(&self, step: &StepId, key: Option<usize>, taken: Taken, used: Option<u64>) {
        if !taken.counts_tokens() {
            return;
        }
        let used = used.map_or(taken.tokens, |n| u32::try_from(n).unwrap_or(u32::MAX));
        let budget = self.key(step, key);
        let mut states = self.lock();
        let state = states.entry(budget).or_default();
        // Taken under the lock, so the ledger stays oldest first.
        state.tokens.push_back((Instant::now(), used));
        state.tokens_used += u64::from(used);
    }

    /// Learns from one answer: `rate_limited` for a 429. Returns how long the budget is
    /// now known to be spent, if it is.
    pub fn learn(
        &self,
        step: &StepId,
        key: Option<usize>,
        hint: &Hint,
        rate_limited: bool,
    ) -> Option<Duration> {
        let budget = self.key(step, key);
        let now = Instant::now();
        let daily_reset = until_daily_reset(SystemTime::now());
        let mut states = self.lock();
        let state = states.entry(budget).or_default();
        let spent = hint.spent_for(rate_limited, daily_reset);
        match (spent, rate_limited) {
            (Some(wait), _) => {
                let until = now + wait;
                // A 429 that says until when is that budget spent, not a sign that its
                // rate is lower than declared: it pauses, it does not slow.
                if state.spent_until.is_none_or(|u| u < until) {
                    state.spent_until = Some(until);
                    state.daily = rate_limited && hint.per_day;
                    state.persisted = false;
                }
            }
            (None, true) => {
                // Nothing said: slow down, and pause for a growing while.
                state.factor = (state.factor * 0.5).max(MIN_FACTOR);
                state.penalty = (state.penalty * 2).clamp(MIN_PENALTY, MAX_PENALTY);
                let until = now + state.penalty;
                state.spent_until = Some(state.spent_until.map_or(until, |u| u.max(until)));
            }
            (None, false) => {
                state.factor = (state.factor + 0.05).min(1.0);
                state.penalty = Duration::ZERO;
            }
        }
        spent.or_else(|| rate_limited.then_some(state.penalty))
    }

    /// Daily budgets that became spent since the last call, in wall-clock time: the
    /// ones to store so that a restart does not spend them again.
    pub fn take_new_daily(&self) -> Vec<SpentBudget> {
        let now = Instant::now();
        let wall = SystemTime::now();
        self.lock()
            .iter_mut()
            .filter(|(_, s)| s.daily && !s.persisted)
            .filter_map(|(budget, s)| {
                let left = s.spent_until?.checked_duration_since(now)?;
                s.persisted = true;
                Some(SpentBudget {
                    provider: budget.provider.clone(),
                    scope: budget.scope.clone(),
                    key_index: budget.key,
                    until: wall + left,
                })
            })
            .collect()
    }

    /// Restores daily budgets spent before a restart (those already over are ignored).
    pub fn restore(&self, spent: &[SpentBudget]) {
        let now = Instant::now();
        let wall = SystemTime::now();
        let mut states = self.lock();
        for s in spent {
            let Ok(left) = s.until.duration_since(wall) else {
                continue;
            };
            let budget = BudgetKey {
                provider: s.provider.clone(),
                scope: s.scope.clone(),
                key: s.key_index,
            };
            let state = states.entry(budget).or_default();
            state.spent_until = Some(now + left.min(crate::llm::retry_after::MAX_WAIT));
            state.daily = true;
            state.persisted = true;
        }
    }

    /// Every budget known to be spent now, in wall-clock time, for `daylog doctor`.
    pub fn spent_now(&self) -> Vec<(SpentBudget, bool)> {
        let now = Instant::now();
        let wall = SystemTime::now();
        let mut all: Vec<(SpentBudget, bool)> = self
            .lock()
            .iter()
            .filter_map(|(budget, s)| {
                let left = s.spent_until?.checked_duration_since(now)?;
                Some((
                    SpentBudget {
                        provider: budget.provider.clone(),
                        scope: budget.scope.clone(),
                        key_index: budget.key,
                        until: wall + left,
                    },
                    s.daily,
                ))
            })
            .collect();
        all.sort_by(|a, b| {
            (&a.0.provider, &a.0.scope, a.0.key_index).cmp(&(
                &b.0.provider,
                &b.0.scope,
                b.0.key_index,
            ))
        });
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(provider: &str, model: &str) -> StepId {
        StepId {
            no: 0,
            provider: provider.to_owned(),
            model: model.to_owned(),
        }
    }

    fn budgets(provider: &str, settings: BudgetSettings) -> Budgets {
        Budgets::new(HashMap::from([(provider.to_owned(), settings)]))
    }

    #[test]
    fn a_declared_rate_admits_that_many_then_says_when() {
        let b = budgets(
            "mistral",
            BudgetSettings {
                requests_per_second: Some(1),
                ..BudgetSettings::default()
            },
        );
        let s = step("mistral", "small");
        assert!(b.admit(&s, Some(0), 0).is_ok());
        let until = b.admit(&s, Some(0), 0).expect_err("spent for a second");
        assert!(until > Instant::now());
        // Per key: one workspace, every model; another key is another budget.
        assert!(b.admit(&step("mistral", "other"), Some(0), 0).is_err());
        assert!(b.admit(&s, Some(1), 0).is_ok());
    }

    #[test]
    fn a_send_given_back_frees_its_slot_and_a_hold_spends_the_budget_until_then() {
        let b = budgets(
            "mistral",
            BudgetSettings {
                requests_per_minute: Some(1),
                requests_per_day: Some(5),
                ..BudgetSettings::default()
            },
        );
        let s = step("mistral", "small");
        let first = b.admit(&s, Some(0), 0).expect("room");
        assert!(b.admit(&s, Some(0), 0).is_err(), "the minute is spent");
        // The shared database refused it after all: not sent, not counted.
        b.unadmit(&s, Some(0), first);
        assert_eq!(b.left(&s, Some(0)).day, Some(5));
        let again = b.admit(&s, Some(0), 0).expect("the slot is free again");
        b.unadmit(&s, Some(0), again);
        let until = Instant::now() + Duration::from_secs(30);
        b.hold(&s, Some(0), until);
        assert_eq!(b.admit(&s, Some(0), 0), Err(until), "held until then");
        assert!(b.take_new_daily().is_empty(), "a hold is no daily spend");
        assert!(
            (b.factor(&s, Some(0)) - 1.0).abs() < f64::EPSILON,
            "nor a lesson"
        );
    }

    #[test]
    fn the_days_last_request_given_back_leaves_the_budget_unspent() {
        let b = budgets(
            "mistral",
            BudgetSettings {
                requests_per_day: Some(2),
                ..BudgetSettings::default()
            },
        );
        let s = step("mistral", "small");
        let first = b.admit(&s, Some(0), 0).expect("room");
        let last = b.admit(&s, Some(0), 0).expect("the day's last");
        assert!(b.admit(&s, Some(0), 0).is_err(), "the day is spent");
        // The shared database refused the last one: the day is not spent after all,
        // and nothing is handed out to be stored as spent until the reset.
        b.unadmit(&s, Some(0), last);
        assert_eq!(b.left(&s, Some(0)).day, Some(1));
        assert!(b.take_new_daily().is_empty(), "no daily spend to store");
        let again = b
            .admit(&s, Some(0), 0)
            .expect("the last slot is free again");
        // Giving back the first one leaves the later one's count and spend alone.
        b.unadmit(&s, Some(0), first);
        assert_eq!(b.left(&s, Some(0)).day, Some(0));
        b.unadmit(&s, Some(0), again);
        assert_eq!(b.left(&s, Some(0)).day, Some(2));
    }

    #[test]
    fn a_turn_counts_the_requests_already_waiting() {
        let b = budgets(
            "mistral",
            BudgetSettings {
                requests_per_second: Some(1),
                ..BudgetSettings::default()
            },
        );
        let s = step("mistral", "small");
        assert_eq!(b.turn(&s, Some(0), 0), None, "room now, nobody waits");
        assert!(b.admit(&s, Some(0), 0).is_ok());
        let first = b.turn(&s, Some(0), 0).expect("spent for a second");
        b.queue(&s, Some(0), true);
        b.queue(&s, Some(0), true);
        let third = b.turn(&s, Some(0), 0).expect("two ahead");
        assert_eq!(
            third - first,
            Duration::from_secs(2),
            "one second per request ahead"
        );
        b.queue(&s, Some(0), false);
        b.queue(&s, Some(0), false);
        assert_eq!(b.turn(&s, Some(0), 0), Some(first), "they left the queue");
        assert_eq!(
            b.step_turn(&s, &[Some(0), Some(1)], 0),
            None,
            "another key has room"
        );
    }

    #[test]
    fn what_is_left_counts_the_sends_and_is_nothing_while_spent() {
        let b = budgets(
            "mistral",
            BudgetSettings {
                requests_per_minute: Some(3),
                requests_per_day: Some(10),
                ..BudgetSettings::default()
            },
        );
        let s = step("mistral", "small");
        let left = |key| b.left(&s, key);
        assert_eq!(
            left(Some(0)),
            BudgetLeft {
                minute: Some(3),
                day: Some(10)
            }
        );
        assert!(b.admit(&s, Some(0), 0).is_ok());
        assert!(b.admit(&s, Some(0), 0).is_ok());
        assert_eq!(
            left(Some(0)),
            BudgetLeft {
                minute: Some(1),
                day: Some(8)
            }
        );
        assert_eq!(left(Some(1)).minute, Some(3), "another key, another budget");
        // A 429 that names nothing pauses the budget: nothing left until it returns.
        assert!(b.learn(&s, Some(0), &Hint::default(), true).is_some());
        assert_eq!(
            left(Some(0)),
            BudgetLeft {
                minute: Some(0),
                day: Some(0)
            }
        );
        // Where nothing is declared, nothing is said.
        assert_eq!(
            b.left(&step("groq", "x"), None),
            BudgetLeft {
                minute: None,
                day: None
            }
        );
    }

    #[test]
    fn per_model_budgets_are_separate() {
        let b = budgets(
            "groq",
            BudgetSettings {
                per: BudgetPer::Model,
                requests_per_minute: Some(1),
                ..BudgetSettings::default()
            },
        );
        assert!(b.admit(&step("groq", "a"), Some(0), 0).is_ok());
        assert!(b.admit(&step("groq", "a"), Some(0), 0).is_err());
        assert!(b.admit(&step("groq", "b"), Some(0), 0).is_ok());
    }

    #[test]
    fn a_named_reset_spends_the_budget_and_a_success_does_not() {
        let b = Budgets::new(HashMap::new());
        let s = step("groq", "m");
        let hint = Hint {
            remaining_requests: Some(0),
            reset_requests: Some(Duration::from_secs(30)),
            ..Hint::default()
        };
        assert_eq!(
            b.learn(&s, Some(0), &hint, false),
            Some(Duration::from_secs(30))
        );
        assert!(b.admit(&s, Some(0), 0).is_err());
        assert!(
            b.take_new_daily().is_empty(),
            "a minute's reset is not daily"
        );
    }

    #[test]
    fn a_per_day_quota_is_spent_until_the_reset_and_survives_a_restart() {
        let b = Budgets::new(HashMap::new());
        let s = step("gemini", "flash");
        let hint = Hint {
            retry_after: Some(Duration::from_secs(20)),
            per_day: true,
            ..Hint::default()
        };
        let spent = b.learn(&s, Some(0), &hint, true).expect("spent");
        assert!(spent >= Duration::from_secs(20));
        let daily = b.take_new_daily();
        assert_eq!(daily.len(), 1);
        assert!(b.take_new_daily().is_empty(), "handed out once");
        let restarted = Budgets::new(HashMap::new());
        restarted.restore(&daily);
        assert!(restarted.admit(&s, Some(0), 0).is_err());
        assert!(restarted.take_new_daily().is_empty(), "already stored");
    }

    #[test]
    fn hintless_429s_slow_down_and_successes_speed_up_again() {
        let b = budgets(
            "mistral",
            BudgetSettings {
                requests_per_minute: Some(10),
                ..BudgetSettings::default()
            },
        );
        let s = step("mistral", "m");
        assert_eq!(
            b.learn(&s, Some(0), &Hint::default(), true),
            Some(MIN_PENALTY)
        );
        assert_eq!(
            b.learn(&s, Some(0), &Hint::default(), true),
            Some(MIN_PENALTY * 2)
        );
        assert!(b.admit(&s, Some(0), 0).is_err(), "paused");
        {
            let states = b.lock();
            let state = states.get(&b.key(&s, Some(0))).expect("state");
            assert!((state.factor - 0.25).abs() < 1e-9);
        }
        assert_eq!(b.learn(&s, Some(0), &Hint::default(), false), None);
        let states = b.lock();
        let state = states.get(&b.key(&s, Some(0))).expect("state");
        assert!((state.factor - 0.30).abs() < 1e-9);
        assert_eq!(state.penalty, Duration::ZERO);
    }

    /// A declared daily budget, used up by this process's own requests, is spent until
    /// the daily reset — and is handed out to be stored like one a provider reported, so
    /// that a restart does not spend it again (issue 10 item 4).
    #[test]
    fn a_declared_daily_budget_used_up_is_spent_until_the_reset_and_stored() {
        let b = budgets(
            "groq",
            BudgetSettings {
                per: BudgetPer::Model,
                requests_per_day: Some(2),
                ..BudgetSettings::default()
            },
        );
        let s = step("groq", "m");
        assert!(b.admit(&s, Some(0), 0).is_ok());
        assert!(b.take_new_daily().is_empty(), "one of two left");
        assert!(b.admit(&s, Some(0), 0).is_ok());
        let until = b.admit(&s, Some(0), 0).expect_err("the day's two are used");
        let reset = until_daily_reset(SystemTime::now());
        assert!(
            until.saturating_duration_since(Instant::now()) + MINUTE > reset,
            "spent until the daily reset"
        );
        assert!(
            b.admit(&step("groq", "other"), Some(0), 0).is_ok(),
            "per model"
        );
        let daily = b.take_new_daily();
        assert_eq!(daily.len(), 1, "{daily:?}");
        assert_eq!(
            (daily[0].provider.as_str(), daily[0].scope.as_str()),
            ("groq", "m")
        );
        let restarted = budgets(
            "groq",
            BudgetSettings {
                per: BudgetPer::Model,
                requests_per_day: Some(2),
                ..BudgetSettings::default()
            },
        );
        restarted.restore(&daily);
        assert!(
            restarted.admit(&s, Some(0), 0).is_err(),
            "still spent after a restart"
        );
    }

    /// A 429 that says nothing lowers what the budget admits (not only a number inside
    /// it), and successes raise it again a little at a time. The penalty pauses are
    /// cleared by hand: they are what `hintless_429s_slow_down…` tests.
    #[test]
    fn hintless_429s_lower_the_admitted_rate_and_successes_raise_it_slowly() {
        let b = budgets(
            "mistral",
            BudgetSettings {
                requests_per_minute: Some(8),
                ..BudgetSettings::default()
            },
        );
        let s = step("mistral", "m");
        let admitted = |b: &Budgets| {
            {
                let mut states = b.lock();
                let state = states.entry(b.key(&s, Some(0))).or_default();
                state.sent.clear();
                state.spent_until = None;
            }
            std::iter::from_fn(|| b.admit(&s, Some(0), 0).ok())
                .take(100)
                .count()
        };
        assert_eq!(admitted(&b), 8, "the declared rate");
        for _ in 0..2 {
            b.learn(&s, Some(0), &Hint::default(), true);
        }
        assert_eq!(admitted(&b), 2, "two hintless 429s: a quarter");
        b.learn(&s, Some(0), &Hint::default(), false);
        assert_eq!(admitted(&b), 2, "one success is not enough to go up");
        for _ in 0..5 {
            b.learn(&s, Some(0), &Hint::default(), false);
        }
        assert_eq!(admitted(&b), 4, "raised slowly: a twentieth per success");
        for _ in 0..20 {
            b.learn(&s, Some(0), &Hint::default(), false);
        }
        assert_eq!(admitted(&b), 8, "and never above the declared rate");
    }

    fn groq_tokens(per_minute: u32) -> (Budgets, StepId) {
        let b = budgets(
            "groq",
            BudgetSettings {
                per: BudgetPer::Model,
                tokens_per_minute: Some(per_minute),
                ..BudgetSettings::default()
            },
        );
        (b, step("groq", "qwen"))
    }

    /// One request of `estimate` tokens through the budget, answered having taken
    /// `used` (`None`: the answer does not say).
    fn answered(b: &Budgets, s: &StepId, estimate: u32, used: Option<u64>) -> Result<(), Instant> {
        let taken = b.admit(s, Some(0), estimate)?;
        b.spend_tokens(s, Some(0), taken, used);
        Ok(())
    }

    #[test]
    fn declared_tokens_per_minute_count_what_the_answers_took() {
        let (b, s) = groq_tokens(1000);
        let start = Instant::now();
        assert!(answered(&b, &s, 300, Some(450)).is_ok());
        assert!(answered(&b, &s, 300, Some(450)).is_ok());
        // 900 taken: a request estimated at 300 waits for the first answer's minute.
        let until = b.admit(&s, Some(0), 300).expect_err("900 + 300 > 1000");
        assert!(until >= start + MINUTE && until <= Instant::now() + MINUTE);
        assert!(
            b.admit(&s, Some(0), 100).is_ok(),
            "a smaller one still fits"
        );
        assert_eq!(b.turn(&s, Some(0), 300), Some(until));
        // Per model: another model's minute is its own.
        assert!(b.admit(&step("groq", "llama"), Some(0), 300).is_ok());
        // A request that takes no tokens (a transcription) is not held back by them,
        // even when the minute is over-full.
        assert!(answered(&b, &s, 100, Some(1200)).is_ok());
        assert!(b.admit(&s, Some(0), 1).is_err());
        assert!(b.admit(&s, Some(0), 0).is_ok());
    }

    #[test]
    fn an_answer_that_does_not_say_counts_its_estimate_and_a_429_nothing() {
        let (b, s) = groq_tokens(1000);
        assert!(answered(&b, &s, 600, None).is_ok());
        assert!(
            b.admit(&s, Some(0), 600).is_err(),
            "600 counted + 600 > 1000"
        );

        // A 429 that says when pauses the budget; it does not lower its tokens or rate.
        let (b, s) = groq_tokens(1000);
        let _refused = b.admit(&s, Some(0), 600).expect("room");
        let hint = Hint {
            retry_after: Some(Duration::from_millis(1)),
            ..Hint::default()
        };
        b.learn(&s, Some(0), &hint, true);
        let mut states = b.lock();
        let state = states.entry(b.key(&s, Some(0))).or_default();
        assert_eq!(state.tokens_used, 0, "the provider did not count it");
        assert!((state.factor - 1.0).abs() < f64::EPSILON, "not slowed");
    }

    #[test]
    fn requests_in_flight_are_not_held_back_by_a_guess() {
        let (b, s) = groq_tokens(1000);
        let in_flight: Vec<Taken> = (0..3)
            .map(|_| b.admit(&s, Some(0), 400).expect("nothing answered yet"))
            .collect();
        assert_eq!(in_flight.len(), 3);
    }

    #[test]
    fn a_request_larger_than_the_minute_goes_alone() {
        let (b, s) = groq_tokens(1000);
        assert!(
            answered(&b, &s, 5000, Some(5000)).is_ok(),
            "an empty minute sends it"
        );
        let until = b.admit(&s, Some(0), 5000).expect_err("not beside another");
        assert!(until > Instant::now() + Duration::from_secs(59));
        assert!(b.admit(&s, Some(0), 10).is_err(), "the minute is over-full");
    }

    #[test]
    fn the_pace_of_tokens_counts_in_a_turn() {
        let (b, s) = groq_tokens(6000);
        let before = Instant::now();
        assert!(answered(&b, &s, 6000, Some(6000)).is_ok());
        // Two wait before a third: each 750-token request is 7.5 s of the minute.
        b.queue(&s, Some(0), true);
        b.queue(&s, Some(0), true);
        let turn = b.turn(&s, Some(0), 750).expect("spent");
        let pace = Duration::from_millis(15_000);
        assert!(turn >= before + MINUTE + pace && turn <= Instant::now() + MINUTE + pace);
    }

    #[test]
    fn the_daily_reset_is_within_a_day() {
        for secs in [
            0,
            1,
            8 * 3600 - 1,
            8 * 3600,
            8 * 3600 + 1,
            86_399,
            1_764_576_000,
        ] {
            let now = SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
            let wait = until_daily_reset(now);
            assert!(
                wait > Duration::ZERO && wait <= Duration::from_secs(86_400),
                "{secs}"
            );
            let at = secs + wait.as_secs();
            assert_eq!(at % 86_400, 8 * 3600, "{secs}");
        }
    }
}
