//! The names of the metrics an entry is scored on: one enum instead of strings such as
//! `"sleep_hours"` at every place that asks whether a field was defaulted, charts it or
//! names it. The names are those of the metrics JSON and of `day_logs`' columns.

use std::fmt;
use std::str::FromStr;

/// One field of an entry's metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetricField {
    Mood,
    Stress,
    Energy,
    Productivity,
    SleepHours,
    Activities,
    Emotions,
    Summary,
}

impl MetricField {
    /// Every field, in the order of the metrics JSON.
    pub const ALL: [Self; 8] = [
        Self::Mood,
        Self::Stress,
        Self::Energy,
        Self::Productivity,
        Self::SleepHours,
        Self::Activities,
        Self::Emotions,
        Self::Summary,
    ];

    /// Its name in the metrics JSON and the schema.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Mood => "mood",
            Self::Stress => "stress",
            Self::Energy => "energy",
            Self::Productivity => "productivity",
            Self::SleepHours => "sleep_hours",
            Self::Activities => "activities",
            Self::Emotions => "emotions",
            Self::Summary => "summary",
        }
    }
}

impl fmt::Display for MetricField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for MetricField {
    type Err = ();

    /// The field named `name` exactly (as [`MetricField::name`] writes it).
    fn from_str(name: &str) -> Result<Self, ()> {
        Self::ALL
            .into_iter()
            .find(|field| field.name() == name)
            .ok_or(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_are_those_the_metrics_are_stored_under() {
        let names = MetricField::ALL.map(MetricField::name);
        assert_eq!(names, super::super::metrics::FIELDS);
    }

    #[test]
    fn a_field_reads_back_from_its_name_only() {
        for field in MetricField::ALL {
            assert_eq!(field.name().parse(), Ok(field));
        }
        assert_eq!("Mood".parse::<MetricField>(), Err(()));
        assert_eq!("sleep".parse::<MetricField>(), Err(()));
    }
}
