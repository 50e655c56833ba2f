//! The order of one chat's answers once their entries are stored.
//!
//! A front end's handler stores an entry and returns at once, so the chat's next update
//! is stored too instead of waiting in memory — teloxide has confirmed it to Telegram by
//! then, and a crash would lose it — behind an analysis that can take the whole deadline.
//! The analyses themselves still go one after another per chat, in the order the
//! entries came (docs/behaviour.md, What arrives): each [`Turn`] is taken, synchronously, by the handler that
//! stored its entry, and begins when the turn taken before it in that chat has ended
//! (dropped: finished, failed or cancelled alike; one dropped before it began still
//! waits for its own predecessor before it lets the next go). Different chats never
//! wait for each other.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

use crate::store::ChatId;

/// Each chat's last turn: its number and what ends when it ends.
type Tails = HashMap<ChatId, (u64, oneshot::Receiver<()>)>;

#[derive(Default)]
pub struct Lanes {
    tails: Arc<Mutex<Tails>>,
    taken: std::sync::atomic::AtomicU64,
}

impl Lanes {
    /// The next turn in `chat`, after every turn taken there before.
    pub fn take(&self, chat: ChatId) -> Turn {
        let number = self
            .taken
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (done, ended) = oneshot::channel();
        let before = lock(&self.tails)
            .insert(chat, (number, ended))
            .map(|(_, before)| before);
        Turn {
            chat,
            number,
            before,
            tails: Arc::clone(&self.tails),
            done: Some(done),
        }
    }

    /// Chats with a turn taken and not ended (a test's view that nothing is left over).
    #[cfg(test)]
    pub fn busy(&self) -> usize {
        lock(&self.tails).len()
    }
}

fn lock(tails: &Mutex<Tails>) -> std::sync::MutexGuard<'_, Tails> {
    tails.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One entry's place in its chat's order; the next turn begins when this one is dropped.
pub struct Turn {
    chat: ChatId,
    number: u64,
    before: Option<oneshot::Receiver<()>>,
    tails: Arc<Mutex<Tails>>,
    /// Dropped when the turn ends, which ends the wait of the turn after it.
    done: Option<oneshot::Sender<()>>,
}

impl Turn {
    /// Waits until every earlier turn of the chat has ended. `true` when there was one
    /// to wait for (what the entry's handler read of it may have changed meanwhile).
    /// Cancel-safe: a wait given up is waited for again by the next call.
    pub async fn begin(&mut self) -> bool {
        let Some(before) = &mut self.before else {
            return false;
        };
        // Err: the turn before was dropped, which is its only way to end.
        let _ = before.await;
        self.before = None;
        true
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        // Dropped before it began (its task cancelled): the turn after it — also one
        // taken later — must still wait for the one before it, so this one ends, and
        // leaves the chat's lane, only when that one has.
        if let (Some(before), Some(done)) = (self.before.take(), self.done.take())
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let (tails, chat, number) = (Arc::clone(&self.tails), self.chat, self.number);
            runtime.spawn(async move {
                let _ = before.await;
                leave(&tails, chat, number);
                drop(done);
            });
            return;
        }
        leave(&self.tails, self.chat, self.number);
    }
}

/// Turn `number` has ended: if it is still its chat's last, nobody waits for it, and
/// the chat leaves the map.
fn leave(tails: &Mutex<Tails>, chat: ChatId, number: u64) {
    let mut tails = lock(tails);
    if tails.get(&chat).is_some_and(|(n, _)| *n == number) {
        tails.remove(&chat);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn chat(id: i64) -> ChatId {
        ChatId(id)
    }

    #[tokio::test]
    async fn a_chats_turns_begin_in_the_order_they_were_taken() {
        let lanes = Lanes::default();
        let mut first = lanes.take(chat(1));
        let mut second = lanes.take(chat(1));
        let mut third = lanes.take(chat(1));
        assert!(!first.begin().await, "nothing before the first");

        let order = Arc::new(Mutex::new(Vec::new()));
        let third_done = tokio::spawn({
            let order = Arc::clone(&order);
            async move {
                assert!(third.begin().await);
                order.lock().expect("order").push(3);
            }
        });
        let second_done = tokio::spawn({
            let order = Arc::clone(&order);
            async move {
                assert!(second.begin().await);
                order.lock().expect("order").push(2);
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            order.lock().expect("order").is_empty(),
            "both wait for the first"
        );

        drop(first);
        second_done.await.expect("second");
        third_done.await.expect("third");
        assert_eq!(*order.lock().expect("order"), vec![2, 3]);
        assert_eq!(lanes.busy(), 0, "the chat leaves with its last turn");
    }

    #[tokio::test]
    async fn other_chats_do_not_wait() {
        let lanes = Lanes::default();
        let _busy = lanes.take(chat(1));
        let mut other = lanes.take(chat(2));
        assert!(!other.begin().await);
        assert_eq!(lanes.busy(), 2);
    }

    #[tokio::test]
    async fn a_turn_dropped_before_it_began_lets_the_next_one_go_after_the_one_before() {
        let lanes = Lanes::default();
        let first = lanes.take(chat(1));
        let second = lanes.take(chat(1)); // cancelled, never begun
        let mut third = lanes.take(chat(1));
        drop(second);
        let waiting = tokio::time::timeout(Duration::from_millis(20), third.begin()).await;
        assert!(waiting.is_err(), "the third still waits for the first");
        drop(first);
        assert!(third.begin().await);
        drop(third);
        assert_eq!(lanes.busy(), 0);
    }

    #[tokio::test]
    async fn a_last_turn_dropped_before_it_began_still_orders_the_turns_taken_after_it() {
        let lanes = Lanes::default();
        let running = lanes.take(chat(1));
        let cancelled = lanes.take(chat(1));
        drop(cancelled);
        let mut later = lanes.take(chat(1));
        let waiting = tokio::time::timeout(Duration::from_millis(20), later.begin()).await;
        assert!(waiting.is_err(), "the later one waits for the running one");
        drop(running);
        assert!(later.begin().await);
        drop(later);
        tokio::task::yield_now().await;
        assert_eq!(lanes.busy(), 0);
    }

    #[tokio::test]
    async fn a_turn_ending_early_does_not_free_the_chat_for_later_ones() {
        let lanes = Lanes::default();
        let first = lanes.take(chat(1));
        let mut second = lanes.take(chat(1));
        drop(first);
        assert_eq!(lanes.busy(), 1, "the second is still the chat's last");
        let mut third = lanes.take(chat(1));
        assert!(second.begin().await);
        let waiting = tokio::time::timeout(Duration::from_millis(20), third.begin()).await;
        assert!(waiting.is_err(), "the third waits for the second");
        drop(second);
        assert!(third.begin().await, "a wait given up is waited for again");
    }
}
