//! Streaks (docs/behaviour.md, Time zones and rhythm): runs of consecutive local days with at least one entry.
//!
//! The current streak ends today, or yesterday while today has no entry yet (the
//! evening is still ahead); a gap of one day ends it. Days after today (an entry filed
//! under a later day before the user moved west) do not count towards the current
//! streak but are part of the longest one.

use jiff::civil::Date;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Streaks {
    pub current: u32,
    pub longest: u32,
}

impl Streaks {
    /// From the local days with entries (any order, repeats allowed) and the user's
    /// today.
    pub fn from_days(days: &[Date], today: Date) -> Self {
        let mut days = days.to_vec();
        days.sort_unstable();
        days.dedup();
        let mut longest = 0u32;
        let mut run = 0u32;
        let mut previous: Option<Date> = None;
        for &day in &days {
            run = match previous {
                Some(p) if p.tomorrow().ok() == Some(day) => run + 1,
                _ => 1,
            };
            longest = longest.max(run);
            previous = Some(day);
        }
        let mut current = 0u32;
        let yesterday = today.yesterday().ok();
        let mut expected = if days.binary_search(&today).is_ok() {
            Some(today)
        } else {
            yesterday
        };
        while let Some(day) = expected {
            if days.binary_search(&day).is_err() {
                break;
            }
            current += 1;
            expected = day.yesterday().ok();
        }
        Self { current, longest }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streaks(days: &[&str], today: &str) -> Streaks {
        let days: Vec<Date> = days.iter().map(|d| d.parse().expect("day")).collect();
        Streaks::from_days(&days, today.parse().expect("today"))
    }

    #[test]
    fn streak_table() {
        let table: [(&[&str], &str, u32, u32); 8] = [
            (&[], "2026-12-01", 0, 0),
            (&["2026-12-01"], "2026-12-01", 1, 1),
            // Yesterday counts while today has no entry yet.
            (&["2026-11-29", "2026-11-30"], "2026-12-01", 2, 2),
            (
                &["2026-11-29", "2026-11-30", "2026-12-01", "2026-12-01"],
                "2026-12-01",
                3,
                3,
            ),
            // A missed day ends the current streak but not the longest.
            (
                &["2026-11-20", "2026-11-21", "2026-11-22", "2026-11-29"],
                "2026-12-01",
                0,
                3,
            ),
            (
                &["2026-11-20", "2026-11-21", "2026-11-22", "2026-11-30"],
                "2026-12-01",
                1,
                3,
            ),
            // Across a month and a year end.
            (
                &["2026-12-30", "2026-12-31", "2027-01-01"],
                "2027-01-01",
                3,
                3,
            ),
            // Order does not matter (the store leaves out days that are no date).
            (&["2026-12-01", "2026-11-30"], "2026-12-01", 2, 2),
        ];
        for (days, today, current, longest) in table {
            assert_eq!(
                streaks(days, today),
                Streaks { current, longest },
                "{days:?} on {today}"
            );
        }
    }
}
