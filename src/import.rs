//! Reading a Daylio CSV export (docs/behaviour.md, Search and Import): pure, no I/O. Each readable row becomes an
//! [`ImportRow`] with the local date and time of the entry, its text and its metrics
//! (mood from the mood name, activities from the `|` list, everything else defaulted).
//!
//! Choices where the spec is silent:
//! - A row whose date or time does not parse, or with too few fields, is *unreadable*
//!   and counted (with the first such line's number); a file in which not one row is
//!   readable is not a Daylio export and imports nothing.
//! - The older header's `date` is read as `Month day` or `day Month` with the `year`.
//! - Mood names are Daylio's English and Russian defaults, any case; any other name
//!   (a custom mood, a renamed one) leaves the mood defaulted, and the report names
//!   it and suggests the backup file, which has every mood's level ([`daylio`]).
//! - A row is the same row again by its date, time, text and mood *name* (custom moods
//!   at one minute are two entries), so a backup sent after the CSV finds the CSV's
//!   rows and gives them their moods.

pub mod daylio;

use std::collections::HashSet;

use jiff::civil::{Date, Time};

use crate::domain::Metrics;
use crate::language::Language;
use crate::store::{NewImportLog, Store, StoreError, UserId};
use crate::texts::Texts;
use crate::time::UserZone;
use crate::users::Users;

/// CSV files (and any one line) larger than this are refused before parsing.
pub const MAX_FILE_BYTES: usize = 10 * 1024 * 1024;

/// The largest file downloaded for an import: a backup holds its photos too, so it may
/// be Telegram's whole bot download limit (a CSV is still refused past
/// [`MAX_FILE_BYTES`]).
pub const MAX_DOWNLOAD_BYTES: usize = 20 * 1024 * 1024;

const NEW_HEADER: [&str; 8] = [
    "full_date",
    "date",
    "weekday",
    "time",
    "mood",
    "activities",
    "note_title",
    "note",
];
const OLD_HEADER: [&str; 7] = [
    "year",
    "date",
    "weekday",
    "time",
    "mood",
    "activities",
    "note",
];

/// One entry of the export.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportRow {
    pub date: Date,
    pub time: Time,
    pub text: String,
    /// `None` when the mood's level is not known (a CSV's custom mood name).
    pub mood: Option<u8>,
    /// The mood's name as the row is keyed by ([`mood_key`]).
    pub mood_name: String,
    pub metrics: Metrics,
}

/// A parsed export: its readable rows and the unreadable ones.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Parsed {
    pub rows: Vec<ImportRow>,
    pub unreadable: usize,
    /// The 1-based line number of the first unreadable row.
    pub first_unreadable_line: Option<u64>,
    /// Mood names of the file whose level is not known, as first written.
    pub unknown_moods: Vec<String>,
}

/// Why a whole file is refused; nothing of it is imported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ImportError {
    #[error("the file is larger than 10 MB")]
    TooLarge,
    #[error("the file is not UTF-8 text")]
    NotUtf8,
    #[error("the file is not CSV")]
    NotCsv,
    #[error("the header is not a Daylio export's")]
    WrongHeader,
    #[error("no row of the file has a date and time that parse")]
    NoReadableRow,
    #[error("the zip file is not a Daylio backup")]
    NotBackup,
    #[error("the backup unpacks to more than daylog reads")]
    BackupTooLarge,
}

impl ImportError {
    /// What the user is told: the file was refused as a whole, and why.
    pub fn sentence(self, language: Language) -> &'static str {
        let texts = Texts(language);
        match self {
            Self::TooLarge => texts.import_too_large(),
            Self::NotUtf8 => texts.import_not_utf8(),
            Self::NotCsv | Self::WrongHeader => texts.import_not_daylio(),
            Self::NoReadableRow => texts.import_no_readable_row(),
            Self::NotBackup => texts.import_not_backup(),
            Self::BackupTooLarge => texts.import_backup_too_large(),
        }
    }
}

#[derive(Clone, Copy)]
enum Layout {
    /// `full_date,date,weekday,time,mood,activities,note_title,note`
    New,
    /// `year,date,weekday,time,mood,activities,note`
    Old,
}

/// Daylio's default mood names, English and Russian.
pub fn mood_score(name: &str) -> Option<u8> {
    match name.trim().to_lowercase().as_str() {
        "rad" | "супер" => Some(5),
        "good" | "хорошо" => Some(4),
        "meh" | "так себе" => Some(3),
        "bad" | "плохо" => Some(2),
        "awful" | "ужасно" => Some(1),
        _ => None,
    }
}

/// Daylio's English default mood names, by score: `DEFAULT_MOODS[score - 1]`.
pub(crate) const DEFAULT_MOODS: [&str; 5] = ["awful", "bad", "meh", "good", "rad"];

/// The name a row's mood is keyed by: a default name in any of its languages as
/// Daylio's English one ("Супер" → "rad"), any other name lower-cased and trimmed.
pub fn mood_key(name: &str) -> String {
    match mood_score(name) {
        Some(score) => DEFAULT_MOODS[usize::from(score) - 1].to_owned(),
        None => name.trim().to_lowercase(),
    }
}

/// `21:14`, `8:02 pm`, `8:02 PM`, `12:05 am`.
pub fn parse_time(text: &str) -> Option<Time> {
    let text = text.trim().to_lowercase();
    let (clock, meridiem) = if let Some(rest) = text.strip_suffix("am") {
        (rest.trim_end(), Some(false))
    } else if let Some(rest) = text.strip_suffix("pm") {
        (rest.trim_end(), Some(true))
    } else {
        (text.as_str(), None)
    };
    let (h, m) = clock.split_once(':')?;
    let hour: i8 = h.trim().parse().ok()?;
    let minute: i8 = m.trim().parse().ok()?;
    let hour = match meridiem {
        None => hour,
        Some(_) if !(1..=12).contains(&hour) => return None,
        Some(false) => hour % 12,
        Some(true) => hour % 12 + 12,
    };
    Time::new(hour, minute, 0, 0).ok()
}

fn parse_old_date(year: &str, date: &str) -> Option<Date> {
    let text = format!("{} {}", year.trim(), date.trim());
    ["%Y %B %d", "%Y %d %B", "%Y %b %d", "%Y %d %b"]
        .iter()
        .find_map(|format| Date::strptime(format, &text).ok())
}

/// Parses a Daylio file, a backup ([`daylio`]) or a CSV export ([`parse`]).
pub fn parse_any(bytes: &[u8]) -> Result<Parsed, ImportError> {
    if daylio::is_zip(bytes) {
        if bytes.len() > MAX_DOWNLOAD_BYTES {
            return Err(ImportError::TooLarge);
        }
        return daylio::parse_backup(bytes);
    }
    parse(bytes)
}

/// Parses a whole CSV export. Errors refuse the file; single bad rows are counted.
pub fn parse(bytes: &[u8]) -> Result<Parsed, ImportError> {
    if bytes.len() > MAX_FILE_BYTES {
        return Err(ImportError::TooLarge);
    }
    let text = std::str::from_utf8(bytes).map_err(|_| ImportError::NotUtf8)?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(true)
        .from_reader(text.as_bytes());
    let header = reader.headers().map_err(|_| ImportError::NotCsv)?.clone();
    let names: Vec<String> = header.iter().map(|h| h.trim().to_lowercase()).collect();
    let layout = if names == NEW_HEADER {
        Layout::New
    } else if names == OLD_HEADER {
        Layout::Old
    } else {
        return Err(ImportError::WrongHeader);
    };
    let mut parsed = Parsed::default();
    let mut record = csv::StringRecord::new();
    // The keys of the unknown moods already named, so each is named once.
    let mut unknown = HashSet::new();
    loop {
        let line = reader.position().line();
        match reader.read_record(&mut record) {
            Ok(false) => break,
            Ok(true) => match row(layout, &record) {
                Some(row) => {
                    if row.mood.is_none()
                        && !row.mood_name.is_empty()
                        && unknown.insert(row.mood_name.clone())
                    {
                        let name = record.get(4).unwrap_or_default().trim();
                        parsed.unknown_moods.push(name.to_owned());
                    }
                    parsed.rows.push(row);
                }
                None => {
                    parsed.unreadable += 1;
                    parsed
                        .first_unreadable_line
                        .get_or_insert(record.position().map_or(line, csv::Position::line));
                }
            },
            // Broken quoting or the like: the rest of the file cannot be trusted.
            Err(_) => return Err(ImportError::NotCsv),
        }
    }
    if parsed.rows.is_empty() && parsed.unreadable > 0 {
        return Err(ImportError::NoReadableRow);
    }
    Ok(parsed)
}

fn row(layout: Layout, record: &csv::StringRecord) -> Option<ImportRow> {
    let field = |i: usize| record.get(i);
    let date = match layout {
        Layout::New => Date::strptime("%Y-%m-%d", field(0)?.trim()).ok()?,
        Layout::Old => parse_old_date(field(0)?, field(1)?)?,
    };
    let time = parse_time(field(3)?)?;
    let mood_name = mood_key(field(4)?);
    let mood = mood_score(&mood_name);
    let activities = field(5)?;
    let parts: Vec<&str> = match layout {
        Layout::New => vec![field(6)?, field(7)?],
        Layout::Old => vec![field(6)?],
    };
    let text = parts
        .iter()
        .map(|p| p.trim())
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    Some(ImportRow {
        date,
        time,
        text,
        mood,
        mood_name,
        metrics: Metrics::imported(mood, activities.split('|')),
    })
}

/// What one import did: the three numbers the user is told, and the zone its times
/// were read in.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Report {
    pub imported: u64,
    pub already: u64,
    pub unreadable: u64,
    pub first_unreadable_line: Option<u64>,
    /// The user's zone, which Daylio's wall-clock times were read in.
    pub zone: String,
    /// Of `already`, those whose times were read again in `zone` (it changed).
    pub retimed: u64,
    /// Mood names whose level the file did not give (a CSV's custom moods).
    pub unknown_moods: Vec<String>,
}

impl Report {
    pub fn sentence(&self, language: Language) -> String {
        let texts = Texts(language);
        let mut sentence = format!(
            "{} {}",
            texts.import_done(
                self.imported,
                self.already,
                self.unreadable,
                self.first_unreadable_line,
            ),
            texts.import_zone(&self.zone, self.retimed)
        );
        if !self.unknown_moods.is_empty() {
            sentence.push(' ');
            sentence.push_str(&texts.import_unknown_moods(&self.unknown_moods));
        }
        sentence
    }
}

/// Why an import stored nothing.
#[derive(Debug, thiserror::Error)]
pub enum ImportFailure {
    #[error("{0}")]
    File(#[from] ImportError),
    /// A write failed after `imported` entries were stored in earlier chunks.
    #[error("the import could not be stored ({imported} entries were): {error}")]
    Store { error: StoreError, imported: u64 },
}

impl ImportFailure {
    pub fn sentence(&self, language: Language) -> String {
        match self {
            Self::File(why) => why.sentence(language).to_owned(),
            Self::Store { imported: 0, .. } => Texts(language).import_failed().to_owned(),
            Self::Store { imported, .. } => Texts(language).import_failed_part_way(*imported),
        }
    }
}

/// Rows stored per transaction: a 10 MB export (~70 000 rows, ~20 s) written as one
/// would hold the only write connection, and every other user's entry, that long.
const IMPORT_CHUNK: usize = 500;

/// The rows as the store takes them: each date and time read in `zone`, then in UTC.
/// A wall-clock time that cannot exist there is resolved as jiff's `compatible` rule
/// does (a DST gap moves forward).
pub fn to_store<'a>(rows: &'a [ImportRow], zone: &UserZone) -> Vec<NewImportLog<'a>> {
    rows.iter()
        .filter_map(|row| {
            let at = zone.to_timestamp(row.date.to_datetime(row.time))?;
            Some(NewImportLog {
                created_at: at,
                local_day: row.date,
                local_time: row.time,
                text: &row.text,
                mood: row.mood,
                mood_name: &row.mood_name,
                metrics_json: row.metrics.to_json(),
            })
        })
        .collect()
}

/// Imports a Daylio export for `user_id` (who must exist): parses it, then stores every
/// readable row in one transaction. No AI call, no reply per entry.
pub async fn import_bytes(
    store: &Store,
    users: &Users,
    user_id: UserId,
    bytes: &[u8],
) -> Result<Report, ImportFailure> {
    let parsed = parse_any(bytes)?;
    let zone = users.zone_of(user_id).await;
    let logs = to_store(&parsed.rows, &zone);
    let out_of_range =
        u64::try_from(parsed.rows.len().saturating_sub(logs.len())).unwrap_or(u64::MAX);
    let mut counts = crate::store::ImportCounts::default();
    for chunk in logs.chunks(IMPORT_CHUNK) {
        // Each chunk is its own transaction: other writes go between them. A row of
        // a chunk stored before a failure is found again when the file comes again.
        let done =
            store
                .import_logs(user_id, chunk)
                .await
                .map_err(|error| ImportFailure::Store {
                    error,
                    imported: counts.imported,
                })?;
        counts.imported += done.imported;
        counts.already += done.already;
        counts.retimed += done.retimed;
    }
    let unreadable = u64::try_from(parsed.unreadable)
        .unwrap_or(u64::MAX)
        .saturating_add(out_of_range);
    tracing::info!(
        user_id = user_id.get(),
        imported = counts.imported,
        already = counts.already,
        retimed = counts.retimed,
        unreadable,
        "daylio import stored"
    );
    Ok(Report {
        imported: counts.imported,
        already: counts.already,
        unreadable,
        first_unreadable_line: parsed.first_unreadable_line,
        zone: zone.name().to_owned(),
        retimed: counts.retimed,
        unknown_moods: parsed.unknown_moods,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_in_both_clocks() {
        assert_eq!(parse_time("21:14"), Time::new(21, 14, 0, 0).ok());
        assert_eq!(parse_time("8:02 pm"), Time::new(20, 2, 0, 0).ok());
        assert_eq!(parse_time("12:05 AM"), Time::new(0, 5, 0, 0).ok());
        assert_eq!(parse_time("12:30 pm"), Time::new(12, 30, 0, 0).ok());
        assert_eq!(parse_time("13:00 pm"), None);
        assert_eq!(parse_time("noon"), None);
    }

    #[test]
    fn moods_any_case_and_russian() {
        assert_eq!(mood_score("RAD"), Some(5));
        assert_eq!(mood_score("Так себе"), Some(3));
        assert_eq!(mood_score("ужасно"), Some(1));
        assert_eq!(mood_score("sleepy"), None);
    }

    #[test]
    fn new_header_with_quotes_and_multiline_notes() {
        let csv = "full_date,date,weekday,time,mood,activities,note_title,note\n\
            2024-05-01,May 1,Wednesday,8:02 pm,Good,\" Friends | Reading \",Title,\"a, \"\"b\"\"\nsecond line\"\n\
            2024-05-02,May 2,Thursday,21:14,custom,,,\n\
            not-a-date,May 3,Friday,21:14,rad,,,x\n";
        let parsed = parse(csv.as_bytes()).expect("parses");
        assert_eq!(parsed.rows.len(), 2);
        assert_eq!(parsed.unreadable, 1);
        assert_eq!(parsed.first_unreadable_line, Some(5));
        let first = &parsed.rows[0];
        assert_eq!(first.text, "Title\na, \"b\"\nsecond line");
        assert_eq!(first.mood, Some(4));
        assert_eq!(first.metrics.mood(), 4);
        assert_eq!(first.metrics.activities(), ["friends", "reading"]);
        assert!(!first.metrics.is_defaulted(crate::domain::MetricField::Mood));
        let second = &parsed.rows[1];
        assert_eq!(second.text, "");
        assert!(
            second
                .metrics
                .is_defaulted(crate::domain::MetricField::Mood)
        );
        assert!(second.metrics.activities().is_empty());
    }

    #[test]
    fn old_header() {
        let csv = "year,date,weekday,time,mood,activities,note\n2019,May 1,Wednesday,8:02 am,meh,work,hi\n";
        let parsed = parse(csv.as_bytes()).expect("parses");
        assert_eq!(parsed.rows.len(), 1);
        assert_eq!(
            parsed.rows[0].date,
            Date::new(2019, 5, 1).ok().unwrap_or_default()
        );
        assert_eq!(
            parsed.rows[0].time,
            Time::new(8, 2, 0, 0).ok().unwrap_or_default()
        );
    }

    #[test]
    fn bad_files_are_refused() {
        assert_eq!(parse(b"hello,world\n1,2\n"), Err(ImportError::WrongHeader));
        assert_eq!(parse(b"\xff\xfe garbage"), Err(ImportError::NotUtf8));
        assert_eq!(
            parse(&vec![b'a'; MAX_FILE_BYTES + 1]),
            Err(ImportError::TooLarge)
        );
        let no_dates =
            "full_date,date,weekday,time,mood,activities,note_title,note\nx,y,z,w,rad,,,\n";
        assert_eq!(parse(no_dates.as_bytes()), Err(ImportError::NoReadableRow));
    }

    #[test]
    fn a_file_that_is_not_utf8_is_told_so_not_that_it_is_no_daylio_export() {
        for language in [Language::En, Language::Ru] {
            let said = ImportError::NotUtf8.sentence(language);
            assert!(said.contains("UTF-8"), "{said}");
            assert_ne!(said, ImportError::WrongHeader.sentence(language));
        }
    }
}
