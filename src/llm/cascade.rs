//! The cascade executor (docs/behaviour.md, The cascade): one task walks its configured steps in order, each
//! step in rounds over its provider's keys (each key once per round, a backoff between
//! rounds, up to `max_attempts` rounds).
//!
//! What an attempt's error means is decided in [`LlmError`]; what the cascade does with
//! it is decided by the pure functions of [`decision`] (after an attempt, after a round),
//! which [`TaskRun::run_step`] carries out. State shared between requests — cooldowns
//! and budgets — lives behind [`SharedState`], read again before every attempt so that
//! concurrent requests pay for one dead provider once, and no request is sent on a
//! budget known to be spent: a step without budget is left for the next one at once
//! (spill-over) unless its budget returns within `budgets.spill_after_ms`, and when no
//! step has budget the task waits for the soonest. Hedging thresholds come from [`Hedging`]; with
//! `"auto"`, an attempt that passes its step's threshold marks the step stalled in the
//! registry until it answers (or would have timed out), so later requests start on the
//! next step.
//!
//! A task is one future: its steps (a hedged one included) are polled together, so
//! dropping the task — on the deadline, or when a hedged step wins — drops every attempt
//! still in flight, and each one records itself as `cancelled` on the way out.

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use reqwest::Client;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::config::ApiKey;
use crate::domain::ModelRef;
use crate::llm::attempt::{Attempt, AttemptSink, Outcome};
use crate::llm::budget::{Taken, request_tokens};
use crate::llm::cooldown::StepId;
use crate::llm::decision::{self, Cool, Facts, Next, Round, RoundFacts};
use crate::llm::error::{AttemptError, CascadeError, LlmError};
use crate::llm::hedge::{self, Hedging, Threshold};
use crate::llm::provider::Provider;
use crate::llm::retry::RetryPolicy;
use crate::llm::state::{SharedRefusal, SharedState};
use crate::llm::task::{Parsed, Task};
use crate::llm::wire::{Call, Input};

/// One step of a cascade: one model of one provider.
#[derive(Debug, Clone)]
pub(crate) struct Step {
    pub id: StepId,
    pub provider: Arc<Provider>,
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
}

/// What makes an answer usable, handed in by the caller: the answer parsed (once), or
/// why it is of no use — recorded as `unusable`, and the next model is asked.
pub(crate) type Parse<'a, T> = &'a (dyn Fn(&str) -> Result<T, String> + Sync);

/// The parts of [`crate::llm::Llm`] a task needs.
pub(crate) struct Engine<'a> {
    pub client: &'a Client,
    pub policy: &'a RetryPolicy,
    pub state: &'a dyn SharedState,
    pub hedging: &'a Hedging,
    /// `budgets.spill_after_ms`.
    pub spill_after: Duration,
}

/// Runs one task through `steps` (already limited to usable providers), leaving out
/// the models in `refused`: they refused this request's log on content
/// policy before and are never asked about it again (docs/behaviour.md, The cascade). When every step is
/// among them the task ends as blocked at once, without a request.
pub(crate) async fn run<T>(
    engine: Engine<'_>,
    steps: &[Step],
    task: Task,
    input: Input<'_>,
    parse: Parse<'_, T>,
    sink: &dyn AttemptSink,
    refused: &[ModelRef],
) -> Result<Parsed<T>, CascadeError> {
    if steps.is_empty() {
        return Err(CascadeError::NoUsableProvider);
    }
    let is_refused = |s: &Step| refused.iter().any(|r| s.id.is(r));
    // The first earlier refusal: the task's final word unless another step answers or
    // fails only for a passing reason.
    let refused_before = steps.iter().find(|s| is_refused(s)).map(|s| Refusal {
        provider: s.id.provider.clone(),
        model: s.id.model.clone(),
        reason: "refused this entry before".to_owned(),
    });
    let left: Vec<Step>;
    let steps = if refused_before.is_some() {
        left = steps.iter().filter(|s| !is_refused(s)).cloned().collect();
        &left[..]
    } else {
        steps
    };
    if let (true, Some(refusal)) = (steps.is_empty(), &refused_before) {
        tracing::info!(
            task = task.as_str(),
            "every step has refused this log before; not asked again"
        );
        return Err(refusal.clone().into_error(Vec::new()));
    }
    let deadline = Instant::now() + engine.policy.deadline;
    let (hedge_tx, mut hedge_rx) = mpsc::unbounded_channel();
    let run = TaskRun {
        client: engine.client,
        policy: engine.policy,
        state: engine.state,
        hedging: engine.hedging,
        spill_after: engine.spill_after,
        spent: Mutex::new(Vec::new()),
        task,
        input,
        parse,
        sink,
        deadline,
        hedge: hedge_tx,
        errors: Mutex::new(Vec::new()),
        real_attempts: AtomicU32::new(0),
        left_for_now: Mutex::new(HashSet::new()),
    };
    let result =
        tokio::time::timeout_at(deadline, run.drive(steps, &mut hedge_rx, refused_before)).await;
    match result {
        Ok(done) => done,
        Err(_) => {
            tracing::warn!(task = task.as_str(), "task deadline reached");
            Err(CascadeError::DeadlineExceeded {
                deadline_ms: duration_ms(engine.policy.deadline),
                errors: run.take_errors(),
            })
        }
    }
}

#[derive(Debug, Clone, Copy)]
/// The provider's `max_concurrency` cap has no free slot.
struct Full;

/// Why a key was not sent on after all: its budget is spent until then, or it began
/// to cool down until then.
#[derive(Debug, Clone, Copy)]
enum Unsent {
    Budget(Instant),
    Cooling(Instant),
}

enum Mode {
    /// Every free key, each with the full retry budget.
    Normal,
    /// Everything is cooling down: one real attempt with the soonest-free key.
    Forced(Option<usize>),
    /// No step has budget: wait for this one's, however long (within the deadline).
    Patient,
}

enum StepEnd<'a, T> {
    Answer(Parsed<T>),
    Blocked {
        step: &'a Step,
        reason: String,
    },
    /// `transient`: the step could not answer for a passing reason (retries used up on
    /// 429/5xx, stalled): a content block elsewhere is then not the final word.
    Failed {
        no: usize,
        transient: bool,
    },
}

/// The step was left for lack of budget (recorded, remembered for a patient wait).
struct Spilled;

/// What one step carries from round to round (see [`TaskRun::run_step`]).
struct StepState {
    /// The keys in play this round.
    keys: Vec<Option<usize>>,
    rounds: u32,
    /// One real attempt whatever is cooling down.
    forced: bool,
    /// No other step can answer: wait for this one's budget or cap.
    patient: bool,
    /// Whether some key of this step failed for a passing reason.
    transient: bool,
    unusable_seen: bool,
    /// Keys that left the rounds on a 429 whose budget stays spent for a while.
    spent_keys: Vec<Option<usize>>,
    /// The pause before this round, recorded on its first attempt.
    wait: Duration,
}

impl StepState {
    fn new(step: &Step, mode: Mode, max_attempts: u32) -> Self {
        let (keys, rounds, forced) = match mode {
            Mode::Normal | Mode::Patient => (step.provider.key_slots(), max_attempts, false),
            Mode::Forced(key) => (vec![key], 1, true),
        };
        Self {
            keys,
            rounds,
            forced,
            patient: !matches!(mode, Mode::Normal),
            transient: false,
            unusable_seen: false,
            spent_keys: Vec::new(),
            wait: Duration::ZERO,
        }
    }
}

/// How one key's turn in a round ended.
enum KeyEnd<'a, T> {
    /// Not sent on (cooling, its budget spent); `again`: still in play next round.
    Unsent { again: bool },
    /// Sent and failed; tried again next round, after at least this.
    Again { wait_at_least: Option<Duration> },
    /// Sent and failed; done for this step.
    Retired,
    /// The step is over (an answer, a block, or no point in going on).
    Step(StepEnd<'a, T>),
}

/// What follows a round once its keys had their turn.
enum Flow {
    Spilled,
    /// Nothing was sent: the round does not count.
    Uncounted,
    Counted,
}

/// A content-policy refusal by one model (in this task, or of this log before).
#[derive(Debug, Clone)]
struct Refusal {
    provider: String,
    model: String,
    reason: String,
}

impl Refusal {
    fn into_error(self, errors: Vec<AttemptError>) -> CascadeError {
        CascadeError::Blocked {
            provider: self.provider,
            model: self.model,
            reason: self.reason,
            errors,
        }
    }
}

struct TaskRun<'a, T> {
    client: &'a Client,
    policy: &'a RetryPolicy,
    state: &'a dyn SharedState,
    hedging: &'a Hedging,
    spill_after: Duration,
    /// Steps left because their budget was spent (step number, when it returns): the
    /// ones to wait for when no step has budget.
    spent: Mutex<Vec<(usize, Instant)>>,
    task: Task,
    input: Input<'a>,
    parse: Parse<'a, T>,
    sink: &'a dyn AttemptSink,
    deadline: Instant,
    /// An attempt slower than `hedge_after` asks for the next step to start (with its
    /// step's number).
    hedge: mpsc::UnboundedSender<usize>,
    errors: Mutex<Vec<AttemptError>>,
    real_attempts: AtomicU32,
    /// Steps left without being asked for a passing reason (cooling, their budget
    /// spent), until they are asked after all and refuse or fail for good: while any
    /// is left, a content block is not the final word (see [`TaskRun::drive`]).
    left_for_now: Mutex<HashSet<usize>>,
}

impl<'a, T> TaskRun<'a, T> {
    async fn drive(
        &self,
        steps: &'a [Step],
        hedges: &mut mpsc::UnboundedReceiver<usize>,
        refused_before: Option<Refusal>,
    ) -> Result<Parsed<T>, CascadeError> {
        let mut running = FuturesUnordered::new();
        let mut next = 0;
        let mut forced_done = false;
        // Steps already waited for (each at most once per task).
        let mut waited: HashSet<usize> = HashSet::new();
        let mut blocked: Option<Refusal> = refused_before;
        let mut transient = false;
        // Numbers of the running steps, and of those whose attempt was slow.
        let mut running_steps: Vec<usize> = Vec::new();
        let mut slow: HashSet<usize> = HashSet::new();
        loop {
            if running.is_empty() {
                let Some((i, mode)) =
                    self.when_idle(steps, &mut next, &mut waited, &mut forced_done)
                else {
                    break;
                };
                running_steps.push(steps[i].id.no);
                running.push(self.run_step(&steps[i], mode));
            }
            let mut ended = None;
            tokio::select! {
                end = running.next() => match end {
                    Some(StepEnd::Answer(completion)) => return Ok(completion),
                    Some(StepEnd::Blocked { step, reason }) => {
                        // Asked after all (forced, or patiently): it has had its say.
                        self.lock_left().remove(&step.id.no);
                        blocked.get_or_insert(Refusal {
                            provider: step.id.provider.clone(),
                            model: step.id.model.clone(),
                            reason,
                        });
                        ended = Some(step.id.no);
                    }
                    Some(StepEnd::Failed { no, transient: passing }) => {
                        transient |= passing;
                        if !passing {
                            self.lock_left().remove(&no);
                        }
                        ended = Some(no);
                    }
                    None => {}
                },
                Some(no) = hedges.recv(), if next < steps.len() => {
                    slow.insert(no);
                    if let Some(i) = self.next_available(steps, &mut next) {
                        tracing::info!(
                            task = self.task.as_str(),
                            provider = %steps[i].id.provider,
                            model = %steps[i].id.model,
                            "slow attempt: hedging with the next step"
                        );
                        running_steps.push(steps[i].id.no);
                        running.push(self.run_step(&steps[i], Mode::Normal));
                    }
                }
            }
            let Some(no) = ended else { continue };
            if let Some(pos) = running_steps.iter().position(|n| *n == no) {
                running_steps.swap_remove(pos);
            }
            if !running_steps.contains(&no) {
                slow.remove(&no);
            }
            // A step ended while every step still running is slow: the hedge it was is
            // gone, so the next step starts now rather than after a slow one's timeout.
            if !running_steps.is_empty()
                && running_steps.iter().all(|n| slow.contains(n))
                && let Some(i) = self.next_available(steps, &mut next)
            {
                running_steps.push(steps[i].id.no);
                running.push(self.run_step(&steps[i], Mode::Normal));
            }
        }
        let errors = self.take_errors();
        // A block is final only when no other step is left that may answer later: none
        // failed for a passing reason, none was skipped while cooling or out of budget.
        let settled = !transient && self.lock_left().is_empty();
        let blocked = blocked.filter(|_| settled);
        Err(match blocked {
            Some(refusal) => refusal.into_error(errors),
            None => CascadeError::Exhausted { errors, settled },
        })
    }

    /// The step to run when none is running: the next available one; else, when no step
    /// has budget now, the one whose budget returns first (rather than hammering a
    /// spent one or giving up); else, once and only before any real attempt, the one
    /// that leaves cooldown first: the user is never told "no provider" without one.
    fn when_idle(
        &self,
        steps: &[Step],
        next: &mut usize,
        waited: &mut HashSet<usize>,
        forced_done: &mut bool,
    ) -> Option<(usize, Mode)> {
        if let Some(i) = self.next_available(steps, next) {
            return Some((i, Mode::Normal));
        }
        if let Some(i) = self.soonest_budget(steps, waited) {
            return Some((i, Mode::Patient));
        }
        if *forced_done || self.real_attempts.load(Ordering::Relaxed) > 0 {
            return None;
        }
        *forced_done = true;
        let (i, key) = self.soonest_free(steps)?;
        Some((i, Mode::Forced(key)))
    }

    /// The next step from `*next` on that is not cooling down; cooling ones are recorded
    /// as skipped on the way.
    fn next_available(&self, steps: &[Step], next: &mut usize) -> Option<usize> {
        while *next < steps.len() {
            let i = *next;
            *next += 1;
            let step = &steps[i];
            let keys = step.provider.key_slots();
            match self.state.step_cooling_until(&step.id, &keys) {
                None => {}
                Some((until, _)) => {
                    self.record_skip(step, None, until);
                    // Cooling for now (not for a refused key): it may answer this log
                    // later, so a content block elsewhere is not the final word.
                    if !self.state.step_refused(&step.id, &keys) {
                        self.lock_left().insert(step.id.no);
                    }
                    continue;
                }
            }
            // Its turn counts the requests already waiting for the same budget: 39
            // requests waiting for a budget that returns in a second do not all get it
            // in a second.
            match self.state.step_turn(&step.id, &keys, self.tokens(step)) {
                // Back soon enough: the step waits for it at the start of its round.
                Some((until, _)) if until > Instant::now() + self.spill_after => {
                    self.spill(step, until);
                }
                _ => return Some(i),
            }
        }
        None
    }

    /// The step is left for lack of budget: recorded, and remembered in case no step
    /// has budget.
    fn spill(&self, step: &Step, until: Instant) {
        self.lock_left().insert(step.id.no);
        self.record_budget_skip(step, None, until);
        let mut spent = self.spent.lock().unwrap_or_else(|p| p.into_inner());
        spent.push((step.id.no, until));
    }

    /// A slot under the provider's optional `max_concurrency` cap (`None` when there is
    /// no cap). Never queued for in normal mode: a full cap is [`Full`], so the attempt
    /// spills over. A patient step (no other step could answer) waits, within the deadline.
    async fn permit(
        &self,
        step: &Step,
        patient: bool,
    ) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, Full> {
        let Some(permits) = &step.provider.permits else {
            return Ok(None);
        };
        let permits = Arc::clone(permits);
        if !patient {
            return permits.try_acquire_owned().map(Some).map_err(|_| Full);
        }
        match tokio::time::timeout_at(self.deadline, permits.acquire_owned()).await {
            Ok(Ok(permit)) => Ok(Some(permit)),
            Ok(Err(_)) | Err(_) => Err(Full),
        }
    }

    /// The step is left because its provider's cap is full: recorded as
    /// `skipped_budget`, and remembered as available again at once, so that it is
    /// waited for (patiently) if no other step answers.
    fn spill_capped(&self, step: &Step, key: Option<usize>) {
        let now = Instant::now();
        self.record(
            step,
            key,
            0,
            Outcome::SkippedBudget,
            None,
            Duration::ZERO,
            Duration::ZERO,
            Some("max_concurrency reached".to_owned()),
            None,
        );
        let mut spent = self.spent.lock().unwrap_or_else(|p| p.into_inner());
        spent.push((step.id.no, now));
    }

    /// The step whose budget returns first within the deadline, not waited for yet.
    fn soonest_budget(&self, steps: &[Step], waited: &mut HashSet<usize>) -> Option<usize> {
        let spent = self.spent.lock().unwrap_or_else(|p| p.into_inner());
        let (no, _) = spent
            .iter()
            .filter(|(no, until)| !waited.contains(no) && *until < self.deadline)
            .min_by_key(|(no, until)| (*until, *no))?;
        waited.insert(*no);
        steps.iter().position(|s| s.id.no == *no)
    }

    /// The step (and key) that leaves cooldown first.
    fn soonest_free(&self, steps: &[Step]) -> Option<(usize, Option<usize>)> {
        steps
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let (until, key) = self
                    .state
                    .step_cooling_until(&s.id, &s.provider.key_slots())?;
                Some((until, i, key))
            })
            .min_by_key(|(until, i, _)| (*until, *i))
            .map(|(_, i, key)| (i, key))
    }

    /// One step, in rounds over its keys. What follows each failed attempt and each
    /// round is [`decision`]'s call; this only gathers the facts and carries it out.
    async fn run_step(&self, step: &'a Step, mode: Mode) -> StepEnd<'a, T> {
        let mut st = StepState::new(step, mode, self.policy.max_attempts);
        let no = step.id.no;
        let mut backoff = self.policy.backoff();
        let mut round = 0;
        while round < st.rounds {
            round += 1;
            let Ok(mut queued) = self.await_turn(step, &mut st).await else {
                return StepEnd::Failed {
                    no,
                    transient: true,
                };
            };
            let mut sent_any = false;
            let mut wait_at_least: Option<Duration> = None;
            // The keys still in play after this round.
            let mut again = Vec::with_capacity(st.keys.len());
            for key in std::mem::take(&mut st.keys) {
                match self.try_key(step, &mut st, key, round, &mut queued).await {
                    KeyEnd::Unsent { again: true } => again.push(key),
                    KeyEnd::Unsent { again: false } => {}
                    KeyEnd::Again { wait_at_least: ra } => {
                        sent_any = true;
                        again.push(key);
                        wait_at_least = wait_at_least.max(ra);
                    }
                    KeyEnd::Retired => sent_any = true,
                    KeyEnd::Step(end) => return end,
                }
            }
            st.keys = again;
            drop(queued);
            match self.after_keys(step, &st, sent_any) {
                Flow::Spilled => {
                    return StepEnd::Failed {
                        no,
                        transient: true,
                    };
                }
                // A round that sent nothing (every key's budget spent meanwhile) is no
                // round: the budget check at its start waits or spills over.
                Flow::Uncounted => {
                    round -= 1;
                    continue;
                }
                Flow::Counted => {}
            }
            let facts = RoundFacts {
                keys_left: st.keys.len(),
                backoff: backoff.next_wait(wait_at_least),
                time_left: self.deadline.saturating_duration_since(Instant::now()),
            };
            match decision::after_round(&facts) {
                Round::Wait(delay) => {
                    tokio::time::sleep(delay).await;
                    st.wait = delay;
                }
                Round::End => break,
            }
        }
        StepEnd::Failed {
            no,
            transient: st.transient,
        }
    }

    /// Never send on a spent budget: wait for its turn when it comes soon (or when no
    /// step has budget), else leave the step to the next one (spill-over, `Err`). While
    /// it waits it is counted in the budget's queue, up to its attempt.
    async fn await_turn(
        &self,
        step: &'a Step,
        st: &mut StepState,
    ) -> Result<Option<Queued<'a>>, Spilled> {
        let Some((until, key)) = self.state.step_turn(&step.id, &st.keys, self.tokens(step)) else {
            return Ok(None);
        };
        let now = Instant::now();
        if until >= self.deadline || (!st.patient && until > now + self.spill_after) {
            self.spill(step, until);
            return Err(Spilled);
        }
        let queued = Queued::join(self.state, &step.id, key);
        tokio::time::sleep_until(until).await;
        st.wait += until.saturating_duration_since(now);
        Ok(Some(queued))
    }

    /// Whether `key` of `step` is cooling down (never for a forced attempt).
    fn key_cooling(&self, step: &Step, forced: bool, key: Option<usize>) -> Option<Instant> {
        if forced {
            None
        } else {
            self.state.key_cooling_until(&step.id, key)
        }
    }

    /// One key's turn in a round: skipped while cooling, else one attempt under the
    /// provider's cap and the key's budget, and what the answer means for the step.
    async fn try_key(
        &self,
        step: &'a Step,
        st: &mut StepState,
        key: Option<usize>,
        round: u32,
        queued: &mut Option<Queued<'a>>,
    ) -> KeyEnd<'a, T> {
        let forced = st.forced;
        let cooling = |key| self.key_cooling(step, forced, key);
        if let Some(until) = cooling(key) {
            self.record_skip(step, key, until);
            // Cooling for now (not refused): this key may answer later.
            st.transient |= !self.state.step_refused(&step.id, &[key]);
            return KeyEnd::Unsent { again: false };
        }
        let Ok(permit) = self.permit(step, st.patient).await else {
            // The cap is full: the next step answers instead of a local queue; this
            // one is waited for only when no step is left (a patient step got here
            // only at the deadline).
            if !st.patient {
                self.spill_capped(step, key);
            }
            return KeyEnd::Step(StepEnd::Failed {
                no: step.id.no,
                transient: true,
            });
        };
        // Waiting for a permit can take a while: others may have given up on this key
        // meanwhile.
        if let Some(until) = cooling(key) {
            self.record_skip(step, key, until);
            return KeyEnd::Unsent { again: false };
        }
        // Only the key it queued for is its turn.
        let in_turn = queued.as_ref().is_some_and(|q| q.key == key);
        let taken = match self
            .admit_in_turn(step, key, in_turn, st.forced, &cooling)
            .await
        {
            Ok(taken) => {
                // Sent now, so no longer waiting: the budget counts this send itself,
                // and a request behind it must not count it twice.
                *queued = None;
                taken
            }
            Err(Unsent::Budget(until)) => {
                drop(permit);
                self.record_budget_skip(step, key, until);
                return KeyEnd::Unsent { again: true };
            }
            Err(Unsent::Cooling(until)) => {
                drop(permit);
                self.record_skip(step, key, until);
                return KeyEnd::Unsent { again: false };
            }
        };
        let result = self.attempt(step, key, taken, round, st.wait).await;
        st.wait = Duration::ZERO;
        drop(permit);
        match result {
            Ok((_, value)) => {
                self.state.record_success(&step.id, key);
                KeyEnd::Step(StepEnd::Answer(Parsed {
                    value,
                    provider: step.id.provider.clone(),
                    model: step.id.model.clone(),
                }))
            }
            Err(error) => self.after_failure(step, st, key, round, error),
        }
    }

    /// A failed attempt: [`decision::next`] on its facts, carried out.
    fn after_failure(
        &self,
        step: &'a Step,
        st: &mut StepState,
        key: Option<usize>,
        round: u32,
        error: LlmError,
    ) -> KeyEnd<'a, T> {
        let no = step.id.no;
        st.transient |= error.is_passing();
        // A passing failure counts towards the shared trip, whatever follows.
        let tripped = error.is_retryable() && self.state.record_failure(&step.id, key);
        let facts = Facts {
            error: &error,
            unusable_before: st.unusable_seen,
            tripped,
            key_cooling: self.key_cooling(step, st.forced, key).is_some(),
            last_round: round == st.rounds,
            max_delay: self.policy.max_delay,
            budget_spent: self
                .state
                .budget_until(&step.id, key, self.tokens(step))
                .is_some_and(|until| until > Instant::now() + self.spill_after),
        };
        let next = decision::next(&facts);
        st.unusable_seen |= matches!(error, LlmError::Unusable { .. });
        self.keep(step, key, round, error.clone());
        match next {
            Next::Again { wait_at_least } => KeyEnd::Again { wait_at_least },
            Next::Retire { cool } => {
                if cool.is_none() && facts.budget_spent {
                    st.spent_keys.push(key);
                }
                if let Some(cool) = cool {
                    let until = match cool {
                        Cool::Standard => self.state.default_until(),
                        Cool::For(asked) => Instant::now() + asked,
                    };
                    if error.is_bad_key() {
                        self.state.refuse_key(&step.id, key, until);
                    } else {
                        self.state.cool_key(&step.id, key, until);
                    }
                }
                KeyEnd::Retired
            }
            Next::CoolStep => {
                self.state.cool_step(&step.id, self.state.default_until());
                KeyEnd::Step(StepEnd::Failed {
                    no,
                    transient: st.transient,
                })
            }
            Next::Step => KeyEnd::Step(StepEnd::Failed {
                no,
                transient: st.transient,
            }),
            Next::Blocked => {
                let reason = match error {
                    LlmError::Blocked { reason } => reason,
                    other => other.to_string(),
                };
                KeyEnd::Step(StepEnd::Blocked { step, reason })
            }
        }
    }

    /// After every key of a round had its turn: whether the step spills over for lack
    /// of budget, or the round counts.
    fn after_keys(&self, step: &Step, st: &StepState, sent_any: bool) -> Flow {
        // Every key left on a spent budget: the step is left for lack of budget,
        // remembered for when no step has any (`soonest_budget`), as it would have
        // been had its budget been known before the request.
        if st.keys.is_empty()
            && let Some(until) =
                self.state
                    .step_budget_until(&step.id, &st.spent_keys, self.tokens(step))
        {
            self.spill(step, until);
            return Flow::Spilled;
        }
        if !sent_any && !st.keys.is_empty() {
            return Flow::Uncounted;
        }
        // Every key left has spent its budget (a 429 said so): spill over at once
        // unless it returns soon; no backoff on a budget known to be spent.
        if let Some(until) = self
            .state
            .step_budget_until(&step.id, &st.keys, self.tokens(step))
            && !st.patient
            && until > Instant::now() + self.spill_after
        {
            self.spill(step, until);
            return Flow::Spilled;
        }
        Flow::Counted
    }

    /// Takes one request from the key's budget. A request whose turn has come (it
    /// waited in the budget's queue) may find the budget still spent for a moment —
    /// the one before it sent a little late —: it waits for that moment and keeps its
    /// place, rather than joining the back of the queue and leaving the slot unused.
    ///
    /// A key that began to cool while it waited (another request's failure, a 429
    /// that named its wait) is not sent on: `cooling` is asked again after the wait.
    ///
    /// Where several instances share the budgets, the local admission is followed by
    /// the shared one (one atomic check-and-spend in the database); a refusal there is
    /// a spent budget (or one nobody can check) or a cooldown another instance found.
    async fn admit_in_turn(
        &self,
        step: &Step,
        key: Option<usize>,
        in_turn: bool,
        forced: bool,
        cooling: &impl Fn(Option<usize>) -> Option<Instant>,
    ) -> Result<Taken, Unsent> {
        let taken = self.admit_here(step, key, in_turn, cooling).await?;
        match self.state.admit_shared(&step.id, key, forced, taken) {
            None => Ok(taken),
            Some(shared) => match shared.await {
                Ok(()) => Ok(taken),
                Err(SharedRefusal::Budget(until)) => Err(Unsent::Budget(until)),
                Err(SharedRefusal::Cooling(until)) => Err(Unsent::Cooling(until)),
            },
        }
    }

    /// [`TaskRun::admit_in_turn`] in this process's own state.
    async fn admit_here(
        &self,
        step: &Step,
        key: Option<usize>,
        in_turn: bool,
        cooling: &impl Fn(Option<usize>) -> Option<Instant>,
    ) -> Result<Taken, Unsent> {
        let tokens = self.tokens(step);
        match self.state.admit(&step.id, key, tokens) {
            Err(until)
                if in_turn
                    && until <= Instant::now() + self.spill_after
                    && until < self.deadline =>
            {
                tokio::time::sleep_until(until).await;
                if let Some(cooling) = cooling(key) {
                    return Err(Unsent::Cooling(cooling));
                }
                self.state
                    .admit(&step.id, key, tokens)
                    .map_err(Unsent::Budget)
            }
            other => other.map_err(Unsent::Budget),
        }
    }

    /// What one request of this task on `step` is expected to take from a
    /// tokens-per-minute budget: the request's text and the answer it may get. A
    /// transcription counts none (its budgets are requests and audio seconds).
    fn tokens(&self, step: &Step) -> u32 {
        match self.input {
            Input::Chat(request) => request_tokens(request, step.max_tokens),
            Input::Audio(_) => 0,
        }
    }

    /// One HTTP attempt, recorded on every path (including being dropped).
    async fn attempt(
        &self,
        step: &Step,
        key: Option<usize>,
        taken: Taken,
        attempt: u32,
        wait: Duration,
    ) -> Result<(u16, T), LlmError> {
        self.real_attempts.fetch_add(1, Ordering::Relaxed);
        // Analyses and metrics are short answers whose latency the hedging learns; a
        // digest or a transcript takes as long as its week or its recording, and
        // neither teaches nor is judged by it.
        let learned = matches!(self.task, Task::Analysis | Task::Metrics);
        let hedge_after = if learned {
            self.hedging.threshold(step.id.no)
        } else {
            self.hedging.slow_threshold()
        };
        let started = Instant::now();
        let mut in_flight = InFlight {
            run: self,
            step,
            key,
            taken,
            attempt,
            wait,
            started,
            hedge_after,
            finished: false,
        };
        let response = self.ask(step, key, taken);
        let (result, used_tokens) = match hedge_after {
            None => response.await,
            Some(threshold) => {
                self.hedge_when_slow(step, started, threshold, learned, response)
                    .await
            }
        };
        if result.is_ok() {
            if learned {
                self.hedging.record(step.id.no, started.elapsed());
            } else {
                self.hedging.answered(step.id.no);
            }
        }
        // What the provider counted: every answer it gave (a 2xx, usable or not), and a
        // request it held until the timeout; not one it refused or failed to serve.
        let counted = matches!(
            result,
            Ok(_)
                | Err(LlmError::Unusable { .. } | LlmError::Blocked { .. } | LlmError::Timeout(_))
        );
        if counted {
            self.state.spend_tokens(&step.id, key, taken, used_tokens);
        } else {
            self.state.uncounted(&step.id, key, taken);
        }
        in_flight.finish(result.as_ref().map(|(status, _)| *status));
        result
    }

    /// The request itself: its answer parsed by the caller's function, and the tokens
    /// the provider said it took. What the answer said about the budget is learned.
    async fn ask(
        &self,
        step: &Step,
        key: Option<usize>,
        taken: Taken,
    ) -> (Result<(u16, T), LlmError>, Option<u64>) {
        let api_key = step.provider.key(key);
        let timeout = self.policy.request_timeout;
        let (result, hint) = match self.input {
            Input::Chat(request) => {
                let call = Call {
                    model: &step.id.model,
                    max_tokens: step.max_tokens,
                    temperature: step.temperature,
                    request,
                    count_tokens: taken.counts_tokens(),
                };
                step.provider
                    .complete_hinted(self.client, api_key, &call, timeout)
                    .await
            }
            Input::Audio(audio) => {
                step.provider
                    .transcribe_hinted(self.client, api_key, &step.id.model, audio, timeout)
                    .await
            }
        };
        let rate_limited = matches!(result, Err(LlmError::RateLimited { .. }));
        if (rate_limited || result.is_ok())
            && let Some(spent) = self.state.learn(&step.id, key, &hint, rate_limited)
        {
            tracing::debug!(
                provider = %step.id.provider, model = %step.id.model, key_index = ?key,
                spent_ms = duration_ms(spent), "budget spent for now"
            );
        }
        // An answer the caller cannot use (the metrics' request holds no JSON object:
        // an apology, reasoning cut by the token limit) is unusable, so the next model
        // is asked; one it can use is parsed here, once.
        let result = result.and_then(|(status, text)| match (self.parse)(&text) {
            Ok(value) => Ok((status, value)),
            Err(reason) => Err(LlmError::Unusable {
                status,
                reason,
                foreign: false,
            }),
        });
        (result, hint.used_tokens)
    }

    /// Awaits `response`; once it is slower than its threshold (or another attempt
    /// finds the step stalled), the next step is asked to start beside it.
    async fn hedge_when_slow<R>(
        &self,
        step: &Step,
        started: Instant,
        threshold: Threshold,
        learned: bool,
        response: impl Future<Output = R>,
    ) -> R {
        tokio::pin!(response);
        let after = threshold.after;
        // Its own threshold (`true`), or another attempt's finding that the step has
        // stalled (`false`), whichever comes first. The threshold counts the step's
        // silence, not the process's lag: a timer that wakes late means an answer may
        // be waiting its turn, so it is given that turn first (`hedge::wait_more`).
        let stall = std::pin::pin!(self.hedging.stall_signal(step.id.no));
        let slow = async move {
            let mut stall = stall;
            let mut due = started + after;
            loop {
                let own = match stall.as_mut().as_pin_mut() {
                    Some(stall) => tokio::select! {
                        () = tokio::time::sleep_until(due) => true,
                        () = stall => false,
                    },
                    None => {
                        tokio::time::sleep_until(due).await;
                        true
                    }
                };
                if !own {
                    return false;
                }
                let now = Instant::now();
                let lag = now.saturating_duration_since(due);
                match hedge::wait_more(after, now - started, lag) {
                    None => return true,
                    Some(more) => {
                        tracing::trace!(
                            provider = %step.id.provider, model = %step.id.model,
                            lag_ms = duration_ms(lag),
                            "hedge due, but the process is behind: the answer gets its turn"
                        );
                        due = now + more;
                    }
                }
            }
        };
        tokio::select! {
            answer = &mut response => answer,
            own = slow => {
                if own && learned && self.hedging.is_auto() {
                    // Slower than its own recent answers: stalled, as far as anyone can
                    // tell until this attempt times out. Later requests start
                    // elsewhere; an answer clears it. With no answer from the step
                    // since this attempt started, the attempts still waiting on it
                    // hedge now too.
                    self.state
                        .cool_step(&step.id, started + self.policy.request_timeout);
                    if self.hedging.passed(step.id.no, started) {
                        tracing::debug!(
                            provider = %step.id.provider, model = %step.id.model,
                            "step silent past its threshold: attempts waiting on it hedge"
                        );
                    }
                }
                tracing::debug!(
                    task = self.task.as_str(), provider = %step.id.provider,
                    model = %step.id.model, threshold_ms = duration_ms(after),
                    hedge_basis = threshold.basis.as_str(), own,
                    elapsed_ms = duration_ms(started.elapsed()), "attempt past its hedge threshold"
                );
                // Nobody listening means the task is over; nothing to do then.
                let _ = self.hedge.send(step.id.no);
                response.await
            }
        }
    }

    fn keep(&self, step: &Step, key: Option<usize>, attempt: u32, error: LlmError) {
        self.lock_errors().push(AttemptError {
            provider: step.id.provider.clone(),
            model: step.id.model.clone(),
            key_index: key,
            attempt,
            error,
        });
    }

    fn lock_errors(&self) -> std::sync::MutexGuard<'_, Vec<AttemptError>> {
        self.errors.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_left(&self) -> std::sync::MutexGuard<'_, HashSet<usize>> {
        self.left_for_now
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn take_errors(&self) -> Vec<AttemptError> {
        std::mem::take(&mut *self.lock_errors())
    }

    fn record_skip(&self, step: &Step, key: Option<usize>, until: Instant) {
        let left = until.saturating_duration_since(Instant::now());
        self.record(
            step,
            key,
            0,
            Outcome::SkippedCooldown,
            None,
            Duration::ZERO,
            Duration::ZERO,
            Some(format!("cooling down for {}ms more", duration_ms(left))),
            None,
        );
    }

    fn record_budget_skip(&self, step: &Step, key: Option<usize>, until: Instant) {
        let left = until.saturating_duration_since(Instant::now());
        self.record(
            step,
            key,
            0,
            Outcome::SkippedBudget,
            None,
            Duration::ZERO,
            Duration::ZERO,
            Some(format!("budget spent for {}ms more", duration_ms(left))),
            None,
        );
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "one row of llm_calls, field by field"
    )]
    fn record(
        &self,
        step: &Step,
        key: Option<usize>,
        attempt: u32,
        outcome: Outcome,
        http_status: Option<u16>,
        latency: Duration,
        wait: Duration,
        error: Option<String>,
        hedge: Option<Threshold>,
    ) {
        let (provider, model) = (&step.id.provider, &step.id.model);
        let task = self.task.as_str();
        let latency_ms = duration_ms(latency);
        let wait_ms = duration_ms(wait);
        // Which hedging threshold the attempt ran under, and where it came from.
        let hedge_ms = hedge.map(|t| duration_ms(t.after));
        let hedge_basis = hedge.map_or("none", |t| t.basis.as_str());
        match outcome {
            Outcome::Ok => tracing::debug!(
                task, %provider, %model, key_index = ?key, attempt, status = ?http_status,
                %outcome, latency_ms, wait_ms, hedge_ms, hedge_basis, "llm attempt"
            ),
            // The operator must act (a mistyped, revoked or unpaid key): an error, which
            // `daylog chat` shows on its terminal too, naming the variable to fix.
            Outcome::BadKey => tracing::error!(
                task, %provider, %model, key_index = ?key,
                key = step.provider.key(key).map_or("", ApiKey::origin),
                status = ?http_status, "the provider refused this API key; check it in .env"
            ),
            Outcome::SkippedCooldown | Outcome::SkippedBudget | Outcome::Cancelled => {
                tracing::debug!(
                    task, %provider, %model, key_index = ?key, %outcome, error = ?error,
                    latency_ms, hedge_ms, hedge_basis, "llm attempt"
                )
            }
            _ => tracing::info!(
                task, %provider, %model, key_index = ?key, attempt, status = ?http_status,
                %outcome, latency_ms, wait_ms, hedge_ms, hedge_basis, "llm attempt failed"
            ),
        }
        // A provider's error body can quote the request back, user text included: it
        // goes to `llm_calls.error` and, below info, to the log.
        if !matches!(
            outcome,
            Outcome::Ok | Outcome::SkippedCooldown | Outcome::SkippedBudget | Outcome::Cancelled
        ) {
            tracing::debug!(task, %provider, %model, key_index = ?key, error = ?error, "llm attempt error");
        }
        crate::observe::llm_attempt(task, provider, model, outcome.as_str());
        self.sink.record(Attempt {
            task: self.task,
            provider: provider.clone(),
            model: model.clone(),
            key_index: key,
            attempt,
            http_status,
            outcome,
            latency_ms,
            wait_ms,
            error,
        });
    }
}

/// A request waiting for a key's budget, counted in its queue until dropped.
struct Queued<'s> {
    state: &'s dyn SharedState,
    step: &'s StepId,
    key: Option<usize>,
}

impl<'s> Queued<'s> {
    fn join(state: &'s dyn SharedState, step: &'s StepId, key: Option<usize>) -> Self {
        state.queue(step, key, true);
        Self { state, step, key }
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.state.queue(self.step, self.key, false);
    }
}

/// An attempt in flight. If it is dropped before [`InFlight::finish`] — the task hit its
/// deadline, or a hedged step won — it records itself as `cancelled`.
struct InFlight<'r, 'a, T> {
    run: &'r TaskRun<'a, T>,
    step: &'r Step,
    key: Option<usize>,
    /// What its budget let through: a cancelled attempt still took its tokens.
    taken: Taken,
    attempt: u32,
    wait: Duration,
    started: Instant,
    /// The hedging threshold this attempt ran under.
    hedge_after: Option<Threshold>,
    finished: bool,
}

impl<T> InFlight<'_, '_, T> {
    fn finish(&mut self, result: Result<u16, &LlmError>) {
        self.finished = true;
        let (outcome, status, error) = match result {
            Ok(status) => (Outcome::Ok, Some(status), None),
            Err(e) => (e.outcome(), e.http_status(), Some(e.to_string())),
        };
        self.run.record(
            self.step,
            self.key,
            self.attempt,
            outcome,
            status,
            self.started.elapsed(),
            self.wait,
            error,
            self.hedge_after,
        );
    }
}

impl<T> Drop for InFlight<'_, '_, T> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        // The provider has it: it counts, at its estimate.
        self.run
            .state
            .spend_tokens(&self.step.id, self.key, self.taken, None);
        let why = if Instant::now() >= self.run.deadline {
            "cancelled: the task deadline passed"
        } else {
            "cancelled: another step answered first"
        };
        // An attempt that was already slow enough to hedge counts as a failure of its
        // key: otherwise a model that stalls but is always out-raced by the hedge would
        // never cool down, and every request would keep paying `hedge_after` for it.
        // (One merely cut short by the deadline right after it started does not.)
        let slow = self
            .hedge_after
            .is_some_and(|threshold| self.started.elapsed() >= threshold.after);
        if slow {
            self.run.state.record_failure(&self.step.id, self.key);
        }
        self.run.record(
            self.step,
            self.key,
            self.attempt,
            Outcome::Cancelled,
            None,
            self.started.elapsed(),
            self.wait,
            Some(why.to_owned()),
            self.hedge_after,
        );
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::config::{HedgeAfter, ProviderSettings};
    use crate::llm::attempt::NullSink;
    use crate::llm::budget::Budgets;
    use crate::llm::cooldown::Cooldowns;
    use crate::llm::state::LocalState;
    use crate::llm_request::ChatRequest;

    /// A request whose turn came finds its one-per-second budget taken a moment
    /// before, waits for it — and meanwhile the key began to cool down (another
    /// request's failure). It must not be sent then. (Real time: the budget returns
    /// within its second.)
    #[tokio::test]
    async fn a_key_that_cools_while_a_request_waits_for_its_budget_is_not_sent_on() {
        let settings: ProviderSettings = toml::from_str(
            "kind = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nrequire_key = false\n\
             budget = { requests_per_second = 1 }\n",
        )
        .unwrap_or_else(|e| panic!("provider settings: {e}"));
        let budget = settings.budget().clone();
        let step = Step {
            id: StepId {
                no: 0,
                provider: "a".to_owned(),
                model: "m".to_owned(),
            },
            provider: Arc::new(Provider::new("a", &settings, &[])),
            max_tokens: None,
            temperature: None,
        };
        let state = LocalState {
            cooldowns: Cooldowns::new(Duration::from_secs(60), 3),
            budgets: Budgets::new(HashMap::from([("a".to_owned(), budget)])),
            remote: None,
        };
        let policy = RetryPolicy {
            max_attempts: 1,
            min_delay: Duration::ZERO,
            max_delay: Duration::ZERO,
            request_timeout: Duration::from_secs(10),
            deadline: Duration::from_secs(60),
        };
        let hedging = Hedging::new(HedgeAfter::Off, policy.request_timeout, 1);
        let request = ChatRequest {
            system: String::new(),
            user: "a day".to_owned(),
            json: false,
        };
        let (hedge, _hedges) = mpsc::unbounded_channel();
        let client = Client::new();
        let run = TaskRun {
            client: &client,
            policy: &policy,
            state: &state,
            hedging: &hedging,
            spill_after: Duration::from_millis(1500),
            spent: Mutex::new(Vec::new()),
            task: Task::Analysis,
            input: Input::Chat(&request),
            parse: &|text| Ok(text.to_owned()),
            sink: &NullSink,
            deadline: Instant::now() + policy.deadline,
            hedge,
            errors: Mutex::new(Vec::new()),
            real_attempts: AtomicU32::new(0),
            left_for_now: Mutex::new(HashSet::new()),
        };
        // The request before it took this second's budget.
        assert!(state.admit(&step.id, None, run.tokens(&step)).is_ok());
        let cooling = |key| state.key_cooling_until(&step.id, key);
        let waiting = run.admit_in_turn(&step, None, true, false, &cooling);
        let cool = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            state.cool_key(&step.id, None, Instant::now() + Duration::from_secs(60));
        };
        let (admitted, ()) = tokio::join!(waiting, cool);

        assert!(
            matches!(admitted, Err(Unsent::Cooling(_))),
            "sent on a cooling key: {admitted:?}"
        );
    }
}
