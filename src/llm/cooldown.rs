//! The shared cooldown registry: which keys and steps every request should skip for now.
//!
//! A slot is either one key of one step (provider, model, key index) or a whole step. A
//! key cools down when it exhausts its retries, asks for a wait longer than
//! `max_delay_ms`, is refused (401/403), or sees `failures_to_trip` failed attempts in a
//! row across all requests; a step cools down when its model stalls (timeout, connect
//! error). A step whose every key is cooling is cooling. The lock is a plain mutex held
//! for a map lookup, never across an await.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

/// A cascade step's identity: one model of one provider. `no` is the same for equal
/// (provider, model) pairs in any task, so the analysis and metrics cascades share the
/// health of a model; the registry keys on it alone, so a lookup allocates nothing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct StepId {
    pub no: usize,
    pub provider: String,
    pub model: String,
}

impl StepId {
    /// Whether this step is `model` (a model named as the rest of daylog names it).
    pub fn is(&self, model: &crate::domain::ModelRef) -> bool {
        self.provider == model.provider && self.model == model.model
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Slot {
    Step(usize),
    Key(usize, Option<usize>),
}

#[derive(Debug, Default)]
struct State {
    until: Option<Instant>,
    failures: u32,
    /// Cooling because the provider refused the key (401/403): not a passing trouble.
    refused: bool,
}

#[derive(Debug)]
pub(crate) struct Cooldowns {
    slots: Mutex<HashMap<Slot, State>>,
    duration: Duration,
    failures_to_trip: u32,
}

impl Cooldowns {
    pub fn new(duration: Duration, failures_to_trip: u32) -> Self {
        Self {
            slots: Mutex::new(HashMap::new()),
            duration,
            failures_to_trip: failures_to_trip.max(1),
        }
    }

    /// The standard cooldown, from now.
    pub fn default_until(&self) -> Instant {
        Instant::now() + self.duration
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Slot, State>> {
        // A panic elsewhere cannot leave the map inconsistent (every write is one field).
        self.slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Until when this key of this step is skipped, if it is (step or key cooling).
    pub fn key_blocked_until(&self, step: &StepId, key: Option<usize>) -> Option<Instant> {
        let now = Instant::now();
        let slots = self.lock();
        let step_until = slots.get(&Slot::Step(step.no)).and_then(|s| s.until);
        let key_until = slots.get(&Slot::Key(step.no, key)).and_then(|s| s.until);
        step_until.max(key_until).filter(|until| *until > now)
    }

    /// Until when the whole step is skipped: `None` if any key is free now, else the
    /// soonest moment one becomes free, and which key that is.
    pub fn step_blocked_until(
        &self,
        step: &StepId,
        keys: &[Option<usize>],
    ) -> Option<(Instant, Option<usize>)> {
        let mut soonest: Option<(Instant, Option<usize>)> = None;
        for key in keys {
            let until = self.key_blocked_until(step, *key)?;
            if soonest.is_none_or(|(s, _)| until < s) {
                soonest = Some((until, *key));
            }
        }
        soonest
    }

    /// Whether every key of the step is cooling because the provider refused it (and
    /// the step itself is not cooling): the step cannot answer, for now or later, until
    /// someone changes its keys. `false` for a step with no keys listed.
    pub fn step_refused(&self, step: &StepId, keys: &[Option<usize>]) -> bool {
        let now = Instant::now();
        let slots = self.lock();
        let step_cooling = slots
            .get(&Slot::Step(step.no))
            .and_then(|s| s.until)
            .is_some_and(|until| until > now);
        !keys.is_empty()
            && !step_cooling
            && keys.iter().all(|key| {
                slots
                    .get(&Slot::Key(step.no, *key))
                    .is_some_and(|s| s.refused && s.until.is_some_and(|until| until > now))
            })
    }

    /// One failed attempt; trips the key when it makes `failures_to_trip` in a row.
    /// Returns whether it tripped.
    pub fn record_failure(&self, step: &StepId, key: Option<usize>) -> bool {
        let mut slots = self.lock();
        let state = slots.entry(Slot::Key(step.no, key)).or_default();
        state.failures += 1;
        if state.failures >= self.failures_to_trip {
            state.failures = 0;
            let until = Instant::now() + self.duration;
            state.until = Some(state.until.map_or(until, |u| u.max(until)));
            state.refused = false;
            true
        } else {
            false
        }
    }

    /// A usable answer: the key and its step are healthy again. Returns whether either
    /// was cooling (a cooldown this answer ended).
    pub fn record_success(&self, step: &StepId, key: Option<usize>) -> bool {
        let mut slots = self.lock();
        let key = slots.remove(&Slot::Key(step.no, key));
        let step = slots.remove(&Slot::Step(step.no));
        [key, step]
            .into_iter()
            .flatten()
            .any(|state| state.until.is_some())
    }

    pub fn trip_key(&self, step: &StepId, key: Option<usize>, until: Instant) {
        Self::extend(
            self.lock().entry(Slot::Key(step.no, key)).or_default(),
            until,
        );
    }

    /// Cools a key the provider refused (401/403) until `until`.
    pub fn refuse_key(&self, step: &StepId, key: Option<usize>, until: Instant) {
        let mut slots = self.lock();
        let state = slots.entry(Slot::Key(step.no, key)).or_default();
        Self::extend(state, until);
        state.refused = true;
    }

    pub fn trip_step(&self, step: &StepId, until: Instant) {
        Self::extend(self.lock().entry(Slot::Step(step.no)).or_default(), until);
    }

    fn extend(state: &mut State, until: Instant) {
        state.failures = 0;
        state.until = Some(state.until.map_or(until, |u| u.max(until)));
        // A cooldown for a passing reason; `refuse_key` marks its own after this.
        state.refused = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step() -> StepId {
        StepId {
            no: 0,
            provider: "p".into(),
            model: "m".into(),
        }
    }

    #[test]
    fn failures_in_a_row_trip_and_expire() {
        let c = Cooldowns::new(Duration::from_millis(30), 3);
        assert!(!c.record_failure(&step(), Some(0)));
        assert!(!c.record_failure(&step(), Some(0)));
        assert!(c.record_failure(&step(), Some(0)));
        assert!(c.key_blocked_until(&step(), Some(0)).is_some());
        assert!(c.key_blocked_until(&step(), Some(1)).is_none());
        std::thread::sleep(Duration::from_millis(40));
        assert!(c.key_blocked_until(&step(), Some(0)).is_none());
    }

    #[test]
    fn success_resets_the_count() {
        let c = Cooldowns::new(Duration::from_secs(60), 2);
        c.record_failure(&step(), None);
        c.record_success(&step(), None);
        assert!(!c.record_failure(&step(), None));
    }

    #[test]
    fn a_step_cools_when_all_keys_do_or_it_stalls() {
        let c = Cooldowns::new(Duration::from_secs(60), 3);
        let keys = [Some(0), Some(1)];
        let now = Instant::now();
        c.trip_key(&step(), Some(0), now + Duration::from_secs(5));
        assert!(c.step_blocked_until(&step(), &keys).is_none());
        c.trip_key(&step(), Some(1), now + Duration::from_secs(2));
        assert_eq!(
            c.step_blocked_until(&step(), &keys),
            Some((now + Duration::from_secs(2), Some(1)))
        );
        let c = Cooldowns::new(Duration::from_secs(60), 3);
        c.trip_step(&step(), now + Duration::from_secs(9));
        assert!(c.key_blocked_until(&step(), Some(1)).is_some());
        assert!(c.step_blocked_until(&step(), &keys).is_some());
    }

    #[test]
    fn a_step_is_refused_only_when_every_key_is_and_it_does_not_stall() {
        let c = Cooldowns::new(Duration::from_secs(60), 3);
        let keys = [Some(0), Some(1)];
        let later = Instant::now() + Duration::from_secs(5);
        c.refuse_key(&step(), Some(0), later);
        assert!(!c.step_refused(&step(), &keys), "key 1 may answer");
        c.trip_key(&step(), Some(1), later);
        assert!(!c.step_refused(&step(), &keys), "key 1 only cools for now");
        c.refuse_key(&step(), Some(1), later);
        assert!(c.step_refused(&step(), &keys));
        c.trip_key(&step(), Some(1), later);
        assert!(!c.step_refused(&step(), &keys), "cooled again for now");
        c.refuse_key(&step(), Some(1), later);
        c.trip_step(&step(), later);
        assert!(!c.step_refused(&step(), &keys), "a stall passes");
        assert!(!c.step_refused(&step(), &[]));
    }
}
