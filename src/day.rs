//! One local day of a user's metrics: the one type the store reads from the
//! `daily_metrics` view, the prompts describe and the charts draw (issue 9 item 6).

/// One row of the `daily_metrics` view: averages of that day's non-defaulted metrics
/// (`None` where every entry of the day left the metric defaulted).
#[derive(Debug, Clone, PartialEq, Default, sqlx::FromRow)]
pub struct DayMetrics {
    /// The local day, `YYYY-MM-DD`.
    pub day: String,
    pub mood: Option<f64>,
    pub stress: Option<f64>,
    pub energy: Option<f64>,
    pub productivity: Option<f64>,
    pub sleep_hours: Option<f64>,
    /// Entries that day.
    pub logs: i64,
}
