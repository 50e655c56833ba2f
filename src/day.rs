//! One local day of a user's metrics: the types the store reads from the
//! `daily_metrics` view, the prompts describe and the charts draw (issue 9 item 6).
//! The store parses the day once; what shows it formats the `Date` itself.

use jiff::civil::Date;

/// One row of the `daily_metrics` view: averages of that day's non-defaulted metrics
/// (`None` where every entry of the day left the metric defaulted).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DayMetrics {
    /// The local day.
    pub day: Date,
    pub mood: Option<f64>,
    pub stress: Option<f64>,
    pub energy: Option<f64>,
    pub productivity: Option<f64>,
    pub sleep_hours: Option<f64>,
    /// Entries that day.
    pub logs: i64,
}

/// One day of the year in pixels (`/year`): `mood` is the average of the day's moods
/// that were not defaulted (`None` when every one was, or no metrics yet).
#[derive(Debug, Clone, PartialEq)]
pub struct DayMood {
    pub day: Date,
    pub mood: Option<f64>,
}

/// `days` (ascending, as the store reads them) with every calendar day from `first` to
/// `last` in its place: a day without entries is there with no values, so a chart
/// breaks its lines over it instead of joining the days around it. Days outside the
/// range are left out.
pub fn calendar(days: &[DayMetrics], first: Date, last: Date) -> Vec<DayMetrics> {
    let mut known = days
        .iter()
        .filter(|d| d.day >= first && d.day <= last)
        .peekable();
    let mut out = Vec::new();
    for day in first.series(jiff::Span::new().days(1)) {
        if day > last {
            break;
        }
        match known.next_if(|d| d.day == day) {
            Some(found) => out.push(found.clone()),
            None => out.push(DayMetrics {
                day,
                ..DayMetrics::default()
            }),
        }
        // A day the store listed twice (it does not) would be dropped, not shift the rest.
        while known.next_if(|d| d.day == day).is_some() {}
    }
    out
}

/// The average of the present, finite values, if any.
pub fn mean(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let present: Vec<f64> = values.flatten().filter(|v| v.is_finite()).collect();
    (!present.is_empty()).then(|| present.iter().sum::<f64>() / present.len() as f64)
}

/// A calendar (as [`calendar`] lays it out) in weeks of 7 days, the last week ending on
/// the last day: each week one [`DayMetrics`] dated by its first day, with the mean of
/// its days' present values (`None` where none of them has one) and all their entries.
/// The first week may be shorter. A long period drawn day by day is a tangle; its weeks
/// show the trend.
pub fn weeks(days: &[DayMetrics]) -> Vec<DayMetrics> {
    let mut out: Vec<DayMetrics> = days
        .rchunks(7)
        .map(|week| {
            let of = |field: fn(&DayMetrics) -> Option<f64>| mean(week.iter().map(field));
            DayMetrics {
                day: week[0].day,
                mood: of(|d| d.mood),
                stress: of(|d| d.stress),
                energy: of(|d| d.energy),
                productivity: of(|d| d.productivity),
                sleep_hours: of(|d| d.sleep_hours),
                logs: week.iter().map(|d| d.logs).sum(),
            }
        })
        .collect();
    out.reverse();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weeks_end_on_the_last_day_and_average_what_is_there() {
        let day = |n: i8, mood: Option<f64>| DayMetrics {
            day: jiff::civil::date(2026, 1, 1) + jiff::Span::new().days(i64::from(n)),
            mood,
            logs: i64::from(mood.is_some()),
            ..DayMetrics::default()
        };
        // Nine days: a first week of two days, then one of seven; one day without values.
        let mut days: Vec<DayMetrics> =
            (0..9).map(|n| day(n, Some(f64::from(n % 5 + 1)))).collect();
        days[4].mood = None;
        days[4].logs = 0;

        let weeks = weeks(&days);

        assert_eq!(weeks.len(), 2);
        assert_eq!(weeks[0].day, jiff::civil::date(2026, 1, 1));
        assert_eq!(weeks[0].mood, Some(1.5), "days 0 and 1: 1 and 2");
        assert_eq!(weeks[1].day, jiff::civil::date(2026, 1, 3));
        // Days 2..=8 without day 4: 3, 4, 1, 2, 3, 4 (day 4 had none).
        assert_eq!(weeks[1].mood, Some(17.0 / 6.0));
        assert_eq!(weeks[1].logs, 6);
        assert_eq!(weeks[1].stress, None);
        assert!(super::weeks(&[]).is_empty());
    }

    fn metrics(day: Date, mood: f64) -> DayMetrics {
        DayMetrics {
            day,
            mood: Some(mood),
            logs: 1,
            ..DayMetrics::default()
        }
    }

    #[test]
    fn the_calendar_has_every_day_and_only_the_range() {
        let d = |day: i8| jiff::civil::date(2026, 11, day);
        let stored = [metrics(d(1), 4.0), metrics(d(2), 3.0), metrics(d(5), 5.0)];
        let days = calendar(&stored, d(2), d(6));
        let shown: Vec<(Date, Option<f64>, i64)> =
            days.iter().map(|m| (m.day, m.mood, m.logs)).collect();
        assert_eq!(
            shown,
            [
                (d(2), Some(3.0), 1),
                (d(3), None, 0),
                (d(4), None, 0),
                (d(5), Some(5.0), 1),
                (d(6), None, 0),
            ]
        );
        assert!(calendar(&stored, d(6), d(5)).is_empty(), "an empty range");
        // Across a month's end.
        let days = calendar(
            &[],
            jiff::civil::date(2026, 2, 27),
            d(2).with().month(3).build().unwrap(),
        );
        assert_eq!(days.len(), 4, "27, 28 February, 1, 2 March");
    }
}
