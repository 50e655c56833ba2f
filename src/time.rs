//! Time as a user lives it (docs/behaviour.md, Time zones and rhythm): the one clock the code reads "now" from, the
//! user's zone, the local day an entry belongs to, and the next moment a daily local
//! time comes round.
//!
//! - [`Clock`] is the seam: the system clock in production, [`ManualClock`] in tests,
//!   so a test can stand at 20:59:50 in Los Angeles without waiting for it.
//! - [`UserZone`] can only hold what docs/operations.md, Your data in plain SQL allows in `users.timezone`: an IANA name
//!   as the tz database spells it, or a fixed offset `UTC±HH:MM` within −12:00…+14:00
//!   (a zero offset is `UTC`). It is parsed from what a user types (`/tz moscow`,
//!   `/tz -5`) and from a shared location (embedded zone boundaries, no network). The
//!   tz database is compiled into the binary (jiff's `tzdb-bundle-always`), so the
//!   answer does not depend on the host's `/usr/share/zoneinfo`.
//! - A local day: the wall-clock date in the user's zone, where the hours before
//!   `journal.day_starts_hour` still belong to the day before (01:30 is last night).
//! - A daily time across daylight-saving changes: a time that does not exist that night
//!   (a gap) comes at the first valid minute after it; a time that happens twice (a fold)
//!   comes at its first occurrence.

use std::fmt;
use std::sync::{Mutex, OnceLock, PoisonError};

use jiff::civil::{Date, DateTime, Time};
use jiff::tz::{AmbiguousOffset, Offset, TimeZone};
use jiff::{SignedDuration, Timestamp, ToSpan};

/// Where "now" comes from. Everything that decides by the time of day reads it here.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    fn now(&self) -> Timestamp;
}

/// The real time.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that stands still until it is set or advanced (tests).
#[derive(Debug)]
pub struct ManualClock(Mutex<Timestamp>);

impl ManualClock {
    pub fn new(at: Timestamp) -> Self {
        Self(Mutex::new(at))
    }

    pub fn set(&self, at: Timestamp) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = at;
    }

    pub fn advance(&self, by: std::time::Duration) {
        let mut now = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let by = SignedDuration::try_from(by).unwrap_or(SignedDuration::MAX);
        *now = now.checked_add(by).unwrap_or(*now);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A moment as docs/operations.md, Your data in plain SQL stores it: UTC text `YYYY-MM-DD HH:MM:SS`.
pub fn sql_timestamp(at: Timestamp) -> String {
    at.strftime("%Y-%m-%d %H:%M:%S").to_string()
}

/// Reads a stored moment: the UTC `YYYY-MM-DD HH:MM:SS` that [`sql_timestamp`] writes,
/// or another ISO 8601 spelling of one such as SQLite's date functions also read (a
/// row edited by hand): `T` for the space, fractional seconds, no seconds, a trailing
/// `Z` or UTC offset; without an offset it is UTC. `None` for anything else.
pub fn parse_sql_timestamp(text: &str) -> Option<Timestamp> {
    let text = text.trim();
    if let Ok(civil) = DateTime::strptime("%Y-%m-%d %H:%M:%S", text) {
        return Offset::UTC.to_timestamp(civil).ok();
    }
    // A bare date is no moment here, although jiff would read it as midnight.
    if text.len() <= 10 {
        return None;
    }
    if let Ok(at) = text.parse::<Timestamp>() {
        return Some(at);
    }
    let civil = text.parse::<DateTime>().ok()?;
    Offset::UTC.to_timestamp(civil).ok()
}

/// Why a `/tz` argument was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ZoneError {
    #[error("not a time zone name, a city or an offset")]
    Unknown,
    #[error("offsets go from UTC-12:00 to UTC+14:00")]
    OutOfRange,
    /// A city name several zones end with.
    #[error("several time zones match: {0:?}")]
    Ambiguous(Vec<String>),
}

/// Old names that tzdb keeps as links beside a current name of the same depth.
const OLD_NAMES: [&str; 2] = ["Asia/Istanbul", "Europe/Nicosia"];

/// Abbreviations that name a zone with summer time as people use them, and what they
/// may mean (one: taken; several: the user chooses).
const ABBREVIATIONS: [(&str, &[&str]); 8] = [
    ("EST", &["America/New_York", "UTC-05:00"]),
    ("EDT", &["America/New_York"]),
    ("CST", &["America/Chicago", "Asia/Shanghai"]),
    ("CDT", &["America/Chicago"]),
    ("MST", &["America/Denver", "America/Phoenix"]),
    ("MDT", &["America/Denver"]),
    ("PST", &["America/Los_Angeles"]),
    ("PDT", &["America/Los_Angeles"]),
];

/// Whether two zones show the same clock at every moment users write in: their offsets
/// every six hours from 1990 to 2040 (a link and its zone always do).
fn same_clock(a: &TimeZone, b: &TimeZone) -> bool {
    const FROM: i64 = 631_152_000; // 1990-01-01T00:00:00Z
    const TO: i64 = 2_240_611_200; // 2041-01-01T00:00:00Z
    (FROM..TO).step_by(6 * 3600).all(|second| {
        Timestamp::from_second(second).is_ok_and(|at| a.to_offset(at) == b.to_offset(at))
    })
}

/// Fixed offsets allowed in `users.timezone`, in minutes.
const MIN_OFFSET_MINUTES: i32 = -12 * 60;
const MAX_OFFSET_MINUTES: i32 = 14 * 60;

/// Areas whose zones are named after a city (`Europe/Moscow`): what `/tz Moscow` searches.
const CITY_AREAS: [&str; 9] = [
    "Africa",
    "America",
    "Antarctica",
    "Asia",
    "Atlantic",
    "Australia",
    "Europe",
    "Indian",
    "Pacific",
];

/// A user's time zone, valid by construction (see the module doc).
#[derive(Clone, PartialEq, Eq)]
pub struct UserZone {
    name: String,
    tz: TimeZone,
}

impl fmt::Debug for UserZone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UserZone({})", self.name)
    }
}

impl fmt::Display for UserZone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl Default for UserZone {
    fn default() -> Self {
        Self::utc()
    }
}

impl UserZone {
    pub fn utc() -> Self {
        Self {
            name: "UTC".to_owned(),
            tz: TimeZone::UTC,
        }
    }

    /// What a user typed after `/tz`: an IANA name in any case (`europe/moscow`), the
    /// city part of one when only one zone has it (`Moscow`, `new york`), or a fixed
    /// offset (`UTC+3`, `+03:00`, `-5`, `UTC+05:30`, `GMT-4`).
    pub fn parse(input: &str) -> Result<Self, ZoneError> {
        let input = input.trim();
        if input.is_empty() {
            return Err(ZoneError::Unknown);
        }
        if let Some(minutes) = parse_offset(input) {
            return Self::fixed(minutes?);
        }
        let wanted = input.replace(' ', "_");
        // Abbreviations people write for a zone that keeps summer time: tzdb's `EST`
        // and `MST` are fixed offsets all year, so a New Yorker who wrote `EST` would
        // get reminders an hour late from March to November. They choose.
        if let Some((_, meant)) = ABBREVIATIONS
            .iter()
            .find(|(abbreviation, _)| abbreviation.eq_ignore_ascii_case(&wanted))
        {
            return match meant {
                [only] => Self::named(only).ok_or(ZoneError::Unknown),
                several => Err(ZoneError::Ambiguous(
                    several.iter().map(|s| (*s).to_owned()).collect(),
                )),
            };
        }
        if let Some(name) = zone_names()
            .iter()
            .find(|name| name.eq_ignore_ascii_case(&wanted))
        {
            return Self::named(name).ok_or(ZoneError::Unknown);
        }
        if wanted.contains('/') {
            return Err(ZoneError::Unknown);
        }
        let mut matches: Vec<&String> = zone_names()
            .iter()
            .filter(|name| {
                name.split_once('/').is_some_and(|(area, _)| {
                    CITY_AREAS.contains(&area)
                        && name
                            .rsplit('/')
                            .next()
                            .is_some_and(|city| city.eq_ignore_ascii_case(&wanted))
                })
            })
            .collect();
        // The old names tzdb keeps as links (`Asia/Istanbul` beside `Europe/Istanbul`,
        // `America/Buenos_Aires` beside `America/Argentina/Buenos_Aires`) are one zone:
        // no choice to make. The current name comes first and is kept: the longer path,
        // or the one that is not in [`OLD_NAMES`].
        matches.sort_by_key(|name| {
            (
                std::cmp::Reverse(name.matches('/').count()),
                OLD_NAMES.contains(&name.as_str()),
                name.as_str(),
            )
        });
        matches.dedup();
        let mut distinct: Vec<(&String, TimeZone)> = Vec::new();
        for name in matches {
            let Ok(tz) = TimeZone::get(name) else {
                continue;
            };
            if !distinct.iter().any(|(_, seen)| same_clock(seen, &tz)) {
                distinct.push((name, tz));
            }
        }
        let mut matches: Vec<&String> = distinct.into_iter().map(|(name, _)| name).collect();
        matches.sort();
        match matches.as_slice() {
            [] => Err(ZoneError::Unknown),
            [only] => Self::named(only).ok_or(ZoneError::Unknown),
            several => Err(ZoneError::Ambiguous(
                several.iter().map(|s| (*s).clone()).collect(),
            )),
        }
    }

    /// A stored `users.timezone` (or the configured default): exactly the canonical
    /// spelling this type writes. `None` for anything else.
    pub fn from_stored(stored: &str) -> Option<Self> {
        if stored.starts_with("UTC") && stored.len() > 3 {
            let zone = Self::fixed(parse_offset(stored)?.ok()?).ok()?;
            return (zone.name == stored).then_some(zone);
        }
        let zone = Self::named(stored)?;
        (zone.name == stored).then_some(zone)
    }

    /// The zone at a point on Earth, from embedded boundary data (no network). `None`
    /// for coordinates that are not on Earth or where no zone is known.
    pub fn from_location(latitude: f64, longitude: f64) -> Option<Self> {
        // Ranges exclude NaN, so this also refuses non-numbers.
        let on_earth = (-90.0..=90.0).contains(&latitude) && (-180.0..=180.0).contains(&longitude);
        if !on_earth {
            return None;
        }
        static FINDER: OnceLock<tzf_rs::EmbeddedFinder> = OnceLock::new();
        let finder = FINDER.get_or_init(tzf_rs::EmbeddedFinder::new);
        let name = finder.get_tz_name(longitude, latitude);
        if name.is_empty() {
            return None;
        }
        Self::named(name)
    }

    fn named(name: &str) -> Option<Self> {
        let tz = TimeZone::get(name).ok()?;
        let name = tz.iana_name()?.to_owned();
        Some(Self { name, tz })
    }

    fn fixed(minutes: i32) -> Result<Self, ZoneError> {
        if !(MIN_OFFSET_MINUTES..=MAX_OFFSET_MINUTES).contains(&minutes) {
            return Err(ZoneError::OutOfRange);
        }
        if minutes == 0 {
            return Ok(Self::utc());
        }
        let offset = Offset::from_seconds(minutes * 60).map_err(|_| ZoneError::OutOfRange)?;
        let sign = if minutes < 0 { '-' } else { '+' };
        let abs = minutes.abs();
        Ok(Self {
            name: format!("UTC{sign}{:02}:{:02}", abs / 60, abs % 60),
            tz: TimeZone::fixed(offset),
        })
    }

    /// The canonical spelling, as stored in `users.timezone`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The moment the local clock here shows `civil` (a gap or fold resolves as jiff's
    /// `compatible` rule does); `None` only out of jiff's range.
    pub fn to_timestamp(&self, civil: DateTime) -> Option<Timestamp> {
        self.tz.to_timestamp(civil).ok()
    }

    /// The wall-clock date and time here at `at`.
    pub fn civil(&self, at: Timestamp) -> DateTime {
        self.tz.to_datetime(at)
    }

    /// The local day `at` belongs to: its date here, or the day before when the local
    /// hour is earlier than `day_starts_hour`.
    pub fn local_day(&self, at: Timestamp, day_starts_hour: u8) -> Date {
        let civil = self.civil(at);
        let date = civil.date();
        if i16::from(civil.hour()) < i16::from(day_starts_hour) {
            date.yesterday().unwrap_or(date)
        } else {
            date
        }
    }

    /// The local day of a moment scheduled for `time` on this wall clock (a reminder, a
    /// digest): as [`UserZone::local_day`], but judged by the time it was meant for, so
    /// one that a DST gap moved past the day's start (03:30 → 04:00 in Helsinki on the
    /// spring night) stays on the day it was meant for.
    pub fn local_day_of(&self, at: Timestamp, time: LocalTime, day_starts_hour: u8) -> Date {
        let date = self.civil(at).date();
        if time.is_before_day_start(day_starts_hour) {
            date.yesterday().unwrap_or(date)
        } else {
            date
        }
    }

    /// The first moment strictly after `after` at which the local clock shows `time`
    /// (see the module doc for DST gaps and folds).
    pub fn next_at(&self, after: Timestamp, time: LocalTime) -> Timestamp {
        let start = self.civil(after).date();
        for days in -1..=3i32 {
            let Ok(date) = start.checked_add(days.days()) else {
                continue;
            };
            let at = self.resolve(date.to_datetime(time.0));
            if at > after {
                return at;
            }
        }
        after
            .checked_add(SignedDuration::from_hours(24))
            .unwrap_or(after)
    }

    /// The last moment at or before `at` at which the local clock shows `time`: the
    /// occurrence a scheduler that was away for a while still owes (see [`next_at`]).
    ///
    /// [`next_at`]: UserZone::next_at
    pub fn last_at_or_before(&self, at: Timestamp, time: LocalTime) -> Timestamp {
        let start = self.civil(at).date();
        for days in (-3..=1i32).rev() {
            let Ok(date) = start.checked_add(days.days()) else {
                continue;
            };
            let moment = self.resolve(date.to_datetime(time.0));
            if moment <= at {
                return moment;
            }
        }
        at.checked_sub(SignedDuration::from_hours(24)).unwrap_or(at)
    }

    /// The moment a schedule owes at a look that found `due_at` due, and the time it was
    /// meant for: `latest` (the last moment of `time` up to now) when a downtime left
    /// `due_at` behind it, else `due_at` as it was scheduled ([`UserZone::time_meant`]).
    pub fn owed(
        &self,
        due_at: Timestamp,
        latest: Timestamp,
        time: LocalTime,
    ) -> (Timestamp, LocalTime) {
        if latest > due_at {
            (latest, time)
        } else {
            (due_at, self.time_meant(due_at, time))
        }
    }

    /// The wall-clock time a moment of a schedule was meant for: `time` when `at` is one
    /// of its moments (a DST gap may have moved it to a later minute), else the time the
    /// clock showed at `at` (the schedule was made for another time, since changed).
    pub fn time_meant(&self, at: Timestamp, time: LocalTime) -> LocalTime {
        let just_before = at.checked_sub(SignedDuration::from_secs(1)).unwrap_or(at);
        if self.next_at(just_before, time) == at {
            time
        } else {
            LocalTime(self.civil(at).time())
        }
    }

    /// The moment of a wall-clock time: the first occurrence in a fold, the first valid
    /// minute after it in a gap. Only a date at the very end of jiff's range cannot be
    /// converted; such a time is never due (`Timestamp::MAX`).
    fn resolve(&self, civil: DateTime) -> Timestamp {
        let ambiguous = self.tz.to_ambiguous_timestamp(civil);
        match ambiguous.offset() {
            AmbiguousOffset::Unambiguous { offset }
            | AmbiguousOffset::Fold { before: offset, .. } => {
                offset.to_timestamp(civil).unwrap_or(Timestamp::MAX)
            }
            AmbiguousOffset::Gap { .. } => {
                let mut minute = civil;
                // Gaps are an hour or so; a day bounds the search whatever the data says.
                for _ in 0..24 * 60 {
                    let Ok(next) = minute.checked_add(1.minute()) else {
                        break;
                    };
                    minute = next;
                    if let AmbiguousOffset::Unambiguous { offset } =
                        self.tz.to_ambiguous_timestamp(minute).offset()
                        && let Ok(at) = offset.to_timestamp(minute)
                    {
                        return at;
                    }
                }
                ambiguous.compatible().unwrap_or(Timestamp::MAX)
            }
        }
    }
}

/// Every zone name the bundled tz database knows.
fn zone_names() -> &'static [String] {
    static NAMES: OnceLock<Vec<String>> = OnceLock::new();
    NAMES.get_or_init(|| {
        jiff::tz::db()
            .available()
            .map(|name| name.as_str().to_owned())
            .collect()
    })
}

/// A fixed offset in minutes east of UTC: `None` when `input` is not shaped like one,
/// `Some(Err)` when it is but lies outside −12:00…+14:00.
fn parse_offset(input: &str) -> Option<Result<i32, ZoneError>> {
    let upper = input.trim().to_ascii_uppercase();
    let (prefixed, rest) = match upper
        .strip_prefix("UTC")
        .or_else(|| upper.strip_prefix("GMT"))
    {
        Some(rest) => (true, rest.trim_start()),
        None => (false, upper.as_str()),
    };
    if rest.is_empty() {
        return prefixed.then_some(Ok(0));
    }
    let (sign, digits) = if let Some(d) = rest.strip_prefix('+') {
        (1, d)
    } else if let Some(d) = rest
        .strip_prefix('-')
        .or_else(|| rest.strip_prefix('\u{2212}'))
    {
        (-1, d)
    } else {
        return None;
    };
    let digits = digits.trim();
    let (hours, minutes) = match digits.split_once(':') {
        Some((h, m)) => (h, m),
        // Not at a character boundary: not digits, so no offset (`+3 (Москва)`).
        None if digits.len() > 2 => digits.split_at_checked(digits.len() - 2)?,
        None => (digits, "0"),
    };
    let all_digits =
        |s: &str| !s.is_empty() && s.len() <= 2 && s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(hours) || !all_digits(minutes) {
        return None;
    }
    let (hours, minutes): (i32, i32) = (hours.parse().ok()?, minutes.parse().ok()?);
    if minutes >= 60 {
        return Some(Err(ZoneError::Unknown));
    }
    let total = sign * (hours * 60 + minutes);
    if !(MIN_OFFSET_MINUTES..=MAX_OFFSET_MINUTES).contains(&total) {
        return Some(Err(ZoneError::OutOfRange));
    }
    Some(Ok(total))
}

/// A daily wall-clock time, to the minute (`/remind 21:30`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalTime(Time);

impl LocalTime {
    /// 19:00: when the Sunday digest comes for a user without a reminder (docs/behaviour.md, Time zones and rhythm).
    pub const EVENING: Self = Self(jiff::civil::time(19, 0, 0, 0));

    /// `21:30`, `9:05` (24-hour).
    pub fn parse(input: &str) -> Option<Self> {
        let (hours, minutes) = input.trim().split_once([':', '.'])?;
        let ok = |s: &str, max: u8| -> Option<i8> {
            if s.is_empty() || s.len() > 2 || !s.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let n: u8 = s.parse().ok()?;
            (n <= max).then(|| i8::try_from(n).ok()).flatten()
        };
        if minutes.len() != 2 {
            return None;
        }
        Time::new(ok(hours, 23)?, ok(minutes, 59)?, 0, 0)
            .ok()
            .map(Self)
    }

    /// The hour, 0 to 23.
    pub fn hour(self) -> u8 {
        u8::try_from(self.0.hour()).unwrap_or(0)
    }

    /// A time after midnight but before the day's start (00:30 with the day starting at
    /// 04:00): it belongs to the day before.
    pub fn is_before_day_start(self, day_starts_hour: u8) -> bool {
        self.hour() < day_starts_hour
    }

    /// As stored in `reminders.local_time`: `HH:MM`.
    pub fn from_stored(stored: &str) -> Option<Self> {
        Self::parse(stored).filter(|t| t.to_string() == stored)
    }
}

impl fmt::Display for LocalTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:02}:{:02}", self.0.hour(), self.0.minute())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(text: &str) -> Timestamp {
        text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn what_users_type_after_tz() {
        let table: [(&str, Result<&str, ZoneError>); 31] = [
            ("Europe/Moscow", Ok("Europe/Moscow")),
            ("europe/moscow", Ok("Europe/Moscow")),
            ("AMERICA/NEW_YORK", Ok("America/New_York")),
            ("america/new york", Ok("America/New_York")),
            ("Moscow", Ok("Europe/Moscow")),
            ("moscow", Ok("Europe/Moscow")),
            ("new york", Ok("America/New_York")),
            ("Los_Angeles", Ok("America/Los_Angeles")),
            ("UTC", Ok("UTC")),
            ("utc", Ok("UTC")),
            ("UTC+3", Ok("UTC+03:00")),
            ("utc+3", Ok("UTC+03:00")),
            ("+03:00", Ok("UTC+03:00")),
            ("-5", Ok("UTC-05:00")),
            ("UTC+05:30", Ok("UTC+05:30")),
            ("GMT-4", Ok("UTC-04:00")),
            ("+0545", Ok("UTC+05:45")),
            ("UTC+0", Ok("UTC")),
            ("-00:00", Ok("UTC")),
            ("+14", Ok("UTC+14:00")),
            ("-12:00", Ok("UTC-12:00")),
            ("Mars/Olympus", Err(ZoneError::Unknown)),
            // Not digits after the sign, whatever their bytes (these once panicked).
            ("+3 (Москва)", Err(ZoneError::Unknown)),
            ("+3 🇷🇺", Err(ZoneError::Unknown)),
            ("UTC+3…", Err(ZoneError::Unknown)),
            // A city whose old name tzdb keeps as a link is one zone, not a choice.
            ("Istanbul", Ok("Europe/Istanbul")),
            ("nicosia", Ok("Asia/Nicosia")),
            ("buenos aires", Ok("America/Argentina/Buenos_Aires")),
            // Abbreviations: tzdb's `EST` has no summer time; what people mean does.
            (
                "EST",
                Err(ZoneError::Ambiguous(vec![
                    "America/New_York".into(),
                    "UTC-05:00".into(),
                ])),
            ),
            ("pst", Ok("America/Los_Angeles")),
            ("UTC-05:00", Ok("UTC-05:00")),
        ];
        for (input, want) in table {
            let got = UserZone::parse(input).map(|z| z.name().to_owned());
            assert_eq!(got, want.map(str::to_owned), "/tz {input}");
        }
    }

    #[test]
    fn bad_zones_are_refused() {
        for input in [
            "",
            "  ",
            "+15",
            "-13",
            "UTC+14:30",
            "+3:75",
            "3",
            "banana",
            "+",
            "UTC++3",
            "Moscow/Europe",
        ] {
            assert!(
                UserZone::parse(input).is_err(),
                "/tz {input:?} was accepted"
            );
        }
        assert_eq!(UserZone::parse("+15"), Err(ZoneError::OutOfRange));
    }

    #[test]
    fn stored_zones_read_back_only_in_canonical_spelling() {
        for name in [
            "UTC",
            "Europe/Moscow",
            "UTC+03:00",
            "UTC-05:00",
            "UTC+05:30",
        ] {
            assert_eq!(
                UserZone::from_stored(name).map(|z| z.name().to_owned()),
                Some(name.to_owned())
            );
        }
        for name in ["europe/moscow", "UTC+3", "+03:00", "UTC+00:00", "nowhere"] {
            assert_eq!(UserZone::from_stored(name), None, "{name}");
        }
    }

    #[test]
    fn a_shared_location_finds_its_zone() {
        assert_eq!(
            UserZone::from_location(55.7558, 37.6173).map(|z| z.name().to_owned()),
            Some("Europe/Moscow".to_owned())
        );
        assert_eq!(
            UserZone::from_location(34.05, -118.24).map(|z| z.name().to_owned()),
            Some("America/Los_Angeles".to_owned())
        );
        assert_eq!(UserZone::from_location(91.0, 0.0), None);
        assert_eq!(UserZone::from_location(f64::NAN, 0.0), None);
    }

    #[test]
    fn local_days_around_midnight_and_the_day_start() {
        let la = UserZone::parse("America/Los_Angeles").expect("zone");
        // 18:00 in Los Angeles is 02:00 UTC the next day: still the Los Angeles evening.
        assert_eq!(
            la.local_day(ts("2026-12-02T02:00:00Z"), 4).to_string(),
            "2026-12-01"
        );
        // 01:30 local belongs to the day before; 04:00 starts the new day.
        assert_eq!(
            la.local_day(ts("2026-12-02T09:30:00Z"), 4).to_string(),
            "2026-12-01"
        );
        assert_eq!(
            la.local_day(ts("2026-12-02T12:00:00Z"), 4).to_string(),
            "2026-12-02"
        );
        assert_eq!(
            la.local_day(ts("2026-12-02T09:30:00Z"), 0).to_string(),
            "2026-12-02"
        );
        let utc = UserZone::utc();
        assert_eq!(
            utc.local_day(ts("2026-12-02T03:59:59Z"), 4).to_string(),
            "2026-12-01"
        );
        assert_eq!(
            utc.local_day(ts("2026-12-02T04:00:00Z"), 4).to_string(),
            "2026-12-02"
        );
        let plus3 = UserZone::parse("UTC+3").expect("zone");
        assert_eq!(
            plus3.local_day(ts("2026-12-01T22:00:00Z"), 0).to_string(),
            "2026-12-02"
        );
    }

    #[test]
    fn a_scheduled_time_moved_by_a_dst_gap_stays_on_its_day() {
        // Helsinki jumps from 03:00 to 04:00 on Sunday 29 March 2026: a 03:30 reminder
        // comes at 04:00, which by the clock starts Sunday, but it is Saturday's.
        let helsinki = UserZone::parse("Europe/Helsinki").expect("zone");
        let half_past_three = LocalTime::parse("03:30").expect("time");
        let moved = helsinki.next_at(ts("2026-03-28T12:00:00Z"), half_past_three);
        assert_eq!(moved, ts("2026-03-29T01:00:00Z"), "04:00 EEST");
        assert_eq!(helsinki.local_day(moved, 4).to_string(), "2026-03-29");
        assert_eq!(
            helsinki.local_day_of(moved, half_past_three, 4).to_string(),
            "2026-03-28"
        );
        // Any other night it is the day before, as by the clock.
        let night = helsinki.next_at(ts("2026-03-29T12:00:00Z"), half_past_three);
        assert_eq!(
            helsinki.local_day_of(night, half_past_three, 4).to_string(),
            "2026-03-29"
        );
        assert_eq!(helsinki.local_day(night, 4).to_string(), "2026-03-29");
        // In the evening both agree.
        let nine = LocalTime::parse("21:00").expect("time");
        let evening = helsinki.next_at(ts("2026-03-29T12:00:00Z"), nine);
        assert_eq!(
            helsinki.local_day_of(evening, nine, 4).to_string(),
            "2026-03-29"
        );
    }

    #[test]
    fn the_next_daily_time_keeps_to_the_wall_clock_across_dst() {
        let la = UserZone::parse("America/Los_Angeles").expect("zone");
        let t = |s: &str| LocalTime::parse(s).expect("time");
        // Winter: 21:00 PST is 05:00 UTC.
        assert_eq!(
            la.next_at(ts("2026-12-02T04:59:50Z"), t("21:00")),
            ts("2026-12-02T05:00:00Z")
        );
        // Strictly after: at the moment itself, the next is a day later.
        assert_eq!(
            la.next_at(ts("2026-12-02T05:00:00Z"), t("21:00")),
            ts("2026-12-03T05:00:00Z")
        );
        // Across the spring change (2026-03-08): 21:00 stays 21:00, now PDT.
        assert_eq!(
            la.next_at(ts("2026-03-08T06:00:00Z"), t("21:00")),
            ts("2026-03-09T04:00:00Z")
        );
        // 02:30 does not exist on 2026-03-08: the first valid minute after it is 03:00 PDT.
        assert_eq!(
            la.next_at(ts("2026-03-08T08:00:00Z"), t("02:30")),
            ts("2026-03-08T10:00:00Z")
        );
        // 01:30 happens twice on 2026-11-01: the first (PDT) one.
        assert_eq!(
            la.next_at(ts("2026-11-01T07:00:00Z"), t("01:30")),
            ts("2026-11-01T08:30:00Z")
        );
        // And after the first, the next is the following night, not the repeat.
        assert_eq!(
            la.next_at(ts("2026-11-01T08:30:00Z"), t("01:30")),
            ts("2026-11-02T09:30:00Z")
        );
    }

    #[test]
    fn reminder_times() {
        assert_eq!(
            LocalTime::parse("21:30").map(|t| t.to_string()),
            Some("21:30".into())
        );
        assert_eq!(
            LocalTime::parse("9:05").map(|t| t.to_string()),
            Some("09:05".into())
        );
        assert_eq!(
            LocalTime::parse("00:00").map(|t| t.to_string()),
            Some("00:00".into())
        );
        for bad in [
            "24:00", "21:60", "21", "21:3", "abc", "-1:00", "21:30pm", "",
        ] {
            assert_eq!(LocalTime::parse(bad), None, "{bad}");
        }
        assert_eq!(LocalTime::from_stored("9:05"), None);
    }

    #[test]
    fn stored_timestamps_round_trip() {
        let at = ts("2026-12-01T20:59:50Z");
        assert_eq!(sql_timestamp(at), "2026-12-01 20:59:50");
        assert_eq!(parse_sql_timestamp("2026-12-01 20:59:50"), Some(at));
        assert_eq!(parse_sql_timestamp("yesterday"), None);
    }

    #[test]
    fn other_spellings_of_a_stored_moment_are_read_as_that_moment() {
        let at = ts("2026-12-01T20:59:50Z");
        for text in [
            " 2026-12-01 20:59:50 ",
            "2026-12-01T20:59:50",
            "2026-12-01T20:59:50Z",
            "2026-12-01 20:59:50Z",
            "2026-12-01 23:59:50+03:00",
        ] {
            assert_eq!(parse_sql_timestamp(text), Some(at), "{text:?}");
        }
        assert_eq!(
            parse_sql_timestamp("2026-12-01 20:59:50.250"),
            Some(ts("2026-12-01T20:59:50.25Z"))
        );
        assert_eq!(
            parse_sql_timestamp("2026-12-01 20:59"),
            Some(ts("2026-12-01T20:59:00Z"))
        );
        for garbage in [
            "",
            "soon",
            "2026-12-01",
            "2026-13-01 20:59:50",
            "2026-12-01 25:00:00",
            "20:59:50",
            "1764622790",
        ] {
            assert_eq!(parse_sql_timestamp(garbage), None, "{garbage:?}");
        }
    }

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(ts("2026-12-01T00:00:00Z"));
        assert_eq!(clock.now(), ts("2026-12-01T00:00:00Z"));
        clock.advance(std::time::Duration::from_secs(90));
        assert_eq!(clock.now(), ts("2026-12-01T00:01:30Z"));
    }
}
