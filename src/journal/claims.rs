//! In-memory claims: "someone in this process is on this", released when the claim is
//! dropped, so a handler, the worker and a re-delivery never work on one thing at once.
//! The journal claims messages (with whether an edit came meanwhile); the digests claim
//! a user's week.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The keys claimed now, each with a value its holder may be told about (`()` for none).
pub struct ClaimSet<K, V = ()>(Arc<Mutex<HashMap<K, V>>>);

impl<K, V> Default for ClaimSet<K, V> {
    fn default() -> Self {
        Self(Arc::default())
    }
}

impl<K, V> Clone for ClaimSet<K, V> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<K: Eq + Hash + Clone, V: Default> ClaimSet<K, V> {
    fn lock(&self) -> MutexGuard<'_, HashMap<K, V>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Claims `key`; `None` when someone in this process holds it already.
    pub fn claim(&self, key: K) -> Option<Claim<K, V>> {
        let mut set = self.lock();
        if set.contains_key(&key) {
            return None;
        }
        set.insert(key.clone(), V::default());
        Some(Claim {
            key,
            set: self.clone(),
        })
    }

    /// Changes the value of `key` while it is claimed (nothing when it is not).
    pub fn update(&self, key: &K, change: impl FnOnce(&mut V)) {
        if let Some(value) = self.lock().get_mut(key) {
            change(value);
        }
    }
}

/// A claim on one key, released on drop.
pub struct Claim<K: Eq + Hash + Clone, V: Default = ()> {
    key: K,
    set: ClaimSet<K, V>,
}

impl<K: Eq + Hash + Clone, V: Default> Claim<K, V> {
    /// Takes the claim's value, leaving the default in its place.
    pub fn take(&self) -> V {
        self.set
            .lock()
            .get_mut(&self.key)
            .map(std::mem::take)
            .unwrap_or_default()
    }
}

impl<K: Eq + Hash + Clone, V: Default> Drop for Claim<K, V> {
    fn drop(&mut self) {
        self.set.lock().remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_held_once_until_its_claim_is_dropped() {
        let set: ClaimSet<u8, bool> = ClaimSet::default();
        let first = set.claim(1).expect("free");
        assert!(set.claim(1).is_none());
        set.update(&1, |edited| *edited = true);
        assert!(first.take());
        assert!(!first.take());
        drop(first);
        assert!(set.claim(1).is_some());
    }
}
