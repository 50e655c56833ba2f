//! What goes with good days (docs/behaviour.md, Time zones and rhythm): the activities whose days differ most in mood
//! from the days without them.
//!
//! A day's mood is the mean of its entries' non-defaulted moods (`daily_metrics`); days without one are
//! left out. A day "has" an activity when any of its entries lists it. An activity is
//! named only when it was seen on at least 3 such days and missing on at least 3, and
//! the two means differ by at least 0.3; at most 3 are named, the largest difference
//! first (good or bad: "work" going with worse days is worth knowing too).

use std::collections::{BTreeMap, BTreeSet};

use jiff::civil::Date;

const MIN_DAYS: usize = 3;
const MIN_DIFFERENCE: f64 = 0.3;
const MAX_NAMED: usize = 3;

/// One activity and the mean mood of the days with and without it.
#[derive(Debug, Clone, PartialEq)]
pub struct GoesWith {
    pub activity: String,
    pub with: f64,
    pub without: f64,
}

/// One local day: its mood (the mean of its non-defaulted moods, `None` when there is
/// none) and the activities any of its entries listed.
#[derive(Debug, Clone, PartialEq)]
pub struct DayMood {
    pub day: Date,
    pub mood: Option<f64>,
    pub activities: Vec<String>,
}

/// Joins the per-day moods (the `daily_metrics` rows) with the per-day activities.
pub fn days_with_activities(
    moods: impl IntoIterator<Item = (Date, Option<f64>)>,
    activities: Vec<(Date, String)>,
) -> Vec<DayMood> {
    let mut by_day: BTreeMap<Date, Vec<String>> = BTreeMap::new();
    for (day, activity) in activities {
        by_day.entry(day).or_default().push(activity);
    }
    moods
        .into_iter()
        .map(|(day, mood)| {
            let activities = by_day.remove(&day).unwrap_or_default();
            DayMood {
                day,
                mood,
                activities,
            }
        })
        .collect()
}

pub fn goes_with_good_days(days: &[DayMood]) -> Vec<GoesWith> {
    let days: Vec<(f64, BTreeSet<&str>)> = days
        .iter()
        .filter_map(|d| {
            let mood = d.mood.filter(|m| m.is_finite())?;
            Some((mood, d.activities.iter().map(String::as_str).collect()))
        })
        .collect();
    let all: BTreeSet<&str> = days.iter().flat_map(|(_, a)| a.iter().copied()).collect();
    let mut found: Vec<GoesWith> = all
        .into_iter()
        .filter_map(|activity| {
            let (with, without): (Vec<f64>, Vec<f64>) = {
                let mut with = Vec::new();
                let mut without = Vec::new();
                for (mood, activities) in &days {
                    if activities.contains(activity) {
                        with.push(*mood);
                    } else {
                        without.push(*mood);
                    }
                }
                (with, without)
            };
            if with.len() < MIN_DAYS || without.len() < MIN_DAYS {
                return None;
            }
            let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
            let (with, without) = (mean(&with), mean(&without));
            // The means are shown to a tenth: 3.8 against 3.5 is a difference of 0.3 to
            // the reader, though 3.8 − 3.5 is 0.29999… in floating point.
            ((with - without).abs() >= MIN_DIFFERENCE - 1e-9).then(|| GoesWith {
                activity: activity.to_owned(),
                with,
                without,
            })
        })
        .collect();
    found.sort_by(|a, b| {
        (b.with - b.without)
            .abs()
            .total_cmp(&(a.with - a.without).abs())
            .then_with(|| a.activity.cmp(&b.activity))
    });
    found.truncate(MAX_NAMED);
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(day: i8, mood: Option<f64>, activities: &[&str]) -> DayMood {
        DayMood {
            day: jiff::civil::date(2026, 11, day),
            mood,
            activities: activities.iter().map(|a| (*a).to_owned()).collect(),
        }
    }

    /// Days 1–3 with `run` at mood 4.5, days 4–6 without at 3.0.
    fn six_days() -> Vec<DayMood> {
        let mut entries = Vec::new();
        for d in 1..=3 {
            entries.push(entry(d, Some(4.5), &["run", "work"]));
        }
        for d in 4..=6 {
            entries.push(entry(d, Some(3.0), &["work"]));
        }
        entries
    }

    #[test]
    fn an_activity_on_three_good_days_is_named() {
        let found = goes_with_good_days(&six_days());
        assert_eq!(
            found,
            [GoesWith {
                activity: "run".into(),
                with: 4.5,
                without: 3.0
            }],
            "`work` is on every day: nothing to compare it with"
        );
    }

    #[test]
    fn the_thresholds_hold() {
        // Only two days with `run`: not enough.
        let mut entries = six_days();
        entries[2].activities = vec!["work".into()];
        assert!(goes_with_good_days(&entries).is_empty());
        // A difference below 0.3 is noise.
        let mut entries = six_days();
        for e in entries.iter_mut().take(3) {
            e.mood = Some(3.2);
        }
        assert!(goes_with_good_days(&entries).is_empty());
        // Defaulted moods are left out: a day with only a defaulted mood does not count.
        let mut entries = six_days();
        entries[0].mood = None;
        assert!(
            goes_with_good_days(&entries).is_empty(),
            "two days left with run"
        );
    }

    #[test]
    fn a_difference_of_three_tenths_counts_though_floating_point_says_less() {
        // 3.8 on the five `run` days, 3.5 on the four without: 3.8 − 3.5 is
        // 0.29999999999999982 in floating point.
        let mut entries = Vec::new();
        for (d, mood) in [(1, 4.0), (2, 4.0), (3, 4.0), (4, 4.0), (5, 3.0)] {
            entries.push(entry(d, Some(mood), &["run"]));
        }
        for (d, mood) in [(6, 4.0), (7, 4.0), (8, 3.0), (9, 3.0)] {
            entries.push(entry(d, Some(mood), &[]));
        }
        let found = goes_with_good_days(&entries);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].activity, "run");
    }

    #[test]
    fn at_most_three_largest_differences_first() {
        let mut entries = Vec::new();
        // Activities a..e on days 1–3 with decreasing moods; days 4–6 at 2.0 without.
        for d in 1..=3 {
            entries.push(entry(d, Some(4.0), &["a", "b", "c", "d"]));
        }
        for d in 4..=6 {
            entries.push(entry(d, Some(2.0), &[]));
        }
        entries.push(entry(7, Some(5.0), &["a"]));
        let found = goes_with_good_days(&entries);
        assert_eq!(found.len(), 3);
        assert_eq!(found[0].activity, "a");
    }

    #[test]
    fn moods_and_activities_join_by_day() {
        let days = days_with_activities(
            [
                (jiff::civil::date(2026, 11, 1), Some(4.0)),
                (jiff::civil::date(2026, 11, 2), None),
            ],
            vec![
                (jiff::civil::date(2026, 11, 1), "run".to_owned()),
                (jiff::civil::date(2026, 11, 1), "work".to_owned()),
                (jiff::civil::date(2026, 11, 2), "run".to_owned()),
            ],
        );
        assert_eq!(days[0].activities, ["run", "work"]);
        assert_eq!(days[1].mood, None);
        assert_eq!(days[1].activities, ["run"]);
    }
}
