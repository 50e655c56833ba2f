//! The users service: what the commands, the digest, the reminders and the journal ask
//! about a user — their language, their zone and their "today", their streaks — read
//! from the store with the fallbacks every caller shares (English and the default zone
//! for a user not stored yet or when the store cannot say), and "now" from the one
//! clock.

use std::sync::Arc;

use crate::domain::UserId;
use crate::language::Language;
use crate::store::{NewUser, Store, StoreError};
use crate::streaks::Streaks;
use crate::time::{Clock, LocalTime, UserZone};

/// A user's language, zone, day and streaks, by their id.
#[derive(Clone)]
pub struct Users {
    store: Store,
    clock: Arc<dyn Clock>,
    default_zone: UserZone,
    day_starts_hour: u8,
}

impl Users {
    /// Users of `store`; a user without a zone is in `default_zone`, and a local day
    /// starts at `day_starts_hour` (`journal.*` settings).
    pub fn new(
        store: Store,
        clock: Arc<dyn Clock>,
        default_zone: UserZone,
        day_starts_hour: u8,
    ) -> Self {
        Self {
            store,
            clock,
            default_zone,
            day_starts_hour,
        }
    }

    /// The same users, reading "now" from `clock`.
    pub fn with_clock(self, clock: Arc<dyn Clock>) -> Self {
        Self { clock, ..self }
    }

    /// Now, by the one clock of the process.
    pub fn now(&self) -> jiff::Timestamp {
        self.clock.now()
    }

    /// The zone of a user who has not set one.
    pub fn default_zone(&self) -> &UserZone {
        &self.default_zone
    }

    /// The hour a local day starts at (an entry at 2:00 belongs to the day before).
    pub fn day_starts_hour(&self) -> u8 {
        self.day_starts_hour
    }

    /// Records a user seen for the first time (or again: a new name); commands,
    /// locations and documents may come before any entry, and the user must exist
    /// (with a language) for what they do to stick.
    pub async fn ensure(&self, user: &NewUser<'_>) -> Result<(), StoreError> {
        self.store.upsert_user(user).await.map(drop)
    }

    /// The user's zone (the default for a user not seen yet).
    pub async fn zone_of(&self, user_id: UserId) -> UserZone {
        match self.store.user(user_id).await {
            Ok(Some(user)) => user.timezone,
            Ok(None) => self.default_zone.clone(),
            Err(error) => {
                tracing::warn!(%error, user_id = user_id.get(), "could not read the user's zone");
                self.default_zone.clone()
            }
        }
    }

    /// The user's language, as stored (English when unknown).
    pub async fn language_of(&self, user_id: UserId) -> Language {
        self.language_or(user_id, Language::default()).await
    }

    /// The user's language, as stored; `fallback` (for Telegram, the client's
    /// `language_code`) for a user not stored yet or when the store cannot say.
    pub async fn language_or(&self, user_id: UserId, fallback: Language) -> Language {
        match self.store.user(user_id).await {
            Ok(Some(user)) => user.language(),
            Ok(None) => fallback,
            Err(error) => {
                tracing::warn!(%error, user_id = user_id.get(), "could not read the user's language");
                fallback
            }
        }
    }

    /// The local day `at` belongs to in `zone`.
    pub fn local_day(&self, zone: &UserZone, at: jiff::Timestamp) -> jiff::civil::Date {
        zone.local_day(at, self.day_starts_hour())
    }

    /// The local day of a moment scheduled for `time` in `zone` (a reminder, a digest):
    /// that of the time it was meant for ([`UserZone::local_day_of`]).
    pub fn local_day_of(
        &self,
        zone: &UserZone,
        at: jiff::Timestamp,
        time: LocalTime,
    ) -> jiff::civil::Date {
        zone.local_day_of(at, time, self.day_starts_hour())
    }

    /// The user's zone and their "today".
    pub async fn today_of(&self, user_id: UserId) -> (UserZone, jiff::civil::Date) {
        let zone = self.zone_of(user_id).await;
        let today = self.local_day(&zone, self.now());
        (zone, today)
    }

    /// The user's current and longest streak, in local days.
    pub async fn streaks(&self, user_id: UserId) -> Result<Streaks, StoreError> {
        let (_, today) = self.today_of(user_id).await;
        self.streaks_on(user_id, today).await
    }

    /// The user's streaks as they stand on `today` (a local day the caller already has).
    pub async fn streaks_on(
        &self,
        user_id: UserId,
        today: jiff::civil::Date,
    ) -> Result<Streaks, StoreError> {
        let days = self.store.entry_days(user_id).await?;
        Ok(Streaks::from_days(&days, today))
    }
}
