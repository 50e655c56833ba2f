//! When the background worker should look again before its poll interval: the moments
//! at which logs parked for lack of budget become due (docs/behaviour.md, The worker and Budgets: "the
//! worker is woken when budget returns"). Whoever parks a log sets an alarm at the
//! moment its budget returns; the worker waits for the soonest one.

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard};

use tokio::sync::Notify;
use tokio::time::Instant;

/// Alarms set by parked logs, rung in time order. Several alarms at the same moment
/// ring once.
#[derive(Debug, Default)]
pub(crate) struct Alarms {
    at: Mutex<BTreeSet<Instant>>,
    /// Tells a waiter that an alarm was set (perhaps sooner than the one it waits for).
    set: Notify,
}

impl Alarms {
    fn lock(&self) -> MutexGuard<'_, BTreeSet<Instant>> {
        self.at.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Rings at `at` (at once if it has passed).
    pub fn set(&self, at: Instant) {
        self.lock().insert(at);
        self.set.notify_waiters();
    }

    /// Completes when an alarm rings, and takes every alarm that has rung. Cancel-safe:
    /// dropping it loses no alarm (one that rang meanwhile rings at the next call).
    pub async fn ring(&self) {
        loop {
            let set = self.set.notified();
            tokio::pin!(set);
            // Registered before the alarms are read, so an alarm set in between is seen.
            set.as_mut().enable();
            let soonest = {
                let mut alarms = self.lock();
                let now = Instant::now();
                if alarms.first().is_some_and(|at| *at <= now) {
                    alarms.retain(|at| *at > now);
                    return;
                }
                alarms.first().copied()
            };
            match soonest {
                Some(at) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {}
                        () = &mut set => {}
                    }
                }
                None => set.await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn alarms_ring_in_order_not_before_their_time_and_once() {
        let alarms = Alarms::default();
        let start = Instant::now();
        alarms.set(start + Duration::from_millis(60));
        alarms.set(start + Duration::from_millis(20));
        alarms.set(start + Duration::from_millis(20));
        alarms.ring().await;
        assert!(start.elapsed() >= Duration::from_millis(20));
        // The two alarms at 20 ms rang once: the next ring is the 60 ms one.
        alarms.ring().await;
        assert!(start.elapsed() >= Duration::from_millis(60));
        let rang = tokio::time::timeout(Duration::from_millis(50), alarms.ring()).await;
        assert!(rang.is_err(), "no alarm left, no ring");
    }

    #[tokio::test]
    async fn a_sooner_alarm_set_while_waiting_rings_first() {
        let alarms = std::sync::Arc::new(Alarms::default());
        let start = Instant::now();
        alarms.set(start + Duration::from_secs(3600));
        let setter = std::sync::Arc::clone(&alarms);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            setter.set(Instant::now() + Duration::from_millis(20));
        });
        // Within the test's own time, which is far from the hour-long alarm.
        tokio::time::timeout(Duration::from_secs(30), alarms.ring())
            .await
            .unwrap_or_else(|_| panic!("the sooner alarm did not ring"));
        assert!(start.elapsed() >= Duration::from_millis(30));
    }
}
