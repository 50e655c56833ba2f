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
