//! Daylio's backup file (`.daylio`): pure, no I/O. A zip whose member `backup.daylio`
//! is base64 of a JSON document (as observed in public importers' code and issue
//! threads; Daylio documents none of it):
//!
//! - `customMoods`: `{id, custom_name, mood_group_id, predefined_name_id}` — the group
//!   is the level, 1 the best ("rad") to 5 the worst ("awful"); `custom_name` is empty
//!   for a mood that kept its default name;
//! - `tags`: `{id, name}` — the activities;
//! - `dayEntries`: `{year, month (0-based), day, hour, minute, mood, note_title, note,
//!   tags: [id]}` — the wall-clock date and time the user saw, as the CSV gives them.
//!
//! So every mood has its level here, renamed or made by the user, which the CSV, naming
//! moods only, cannot give. Only the one member is read, and it may unpack to at most
//! [`MAX_UNPACKED_BYTES`]: a zip bomb is refused with a sentence, never unpacked.
//! Photos and other members are never read.

use std::collections::HashMap;
use std::io::Read as _;

use base64::Engine as _;
use jiff::civil::{Date, Time};
use serde::Deserialize;

use super::{DEFAULT_MOODS, ImportError, ImportRow, Parsed, mood_key};
use crate::domain::Metrics;

/// The member that holds the data.
const MEMBER: &str = "backup.daylio";

/// The most the data member may unpack to (its base64 text): years of entries are a
/// few MB; anything beyond is refused unread.
pub const MAX_UNPACKED_BYTES: u64 = 64 * 1024 * 1024;

/// Whether `bytes` begin as a zip file does (a backup, not a CSV).
pub fn is_zip(bytes: &[u8]) -> bool {
    bytes.starts_with(b"PK\x03\x04")
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Backup {
    #[serde(rename = "customMoods")]
    custom_moods: Vec<Mood>,
    tags: Vec<Tag>,
    #[serde(rename = "dayEntries")]
    day_entries: Vec<Entry>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Mood {
    id: i64,
    custom_name: String,
    mood_group_id: i64,
    predefined_name_id: i64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Tag {
    id: i64,
    name: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Entry {
    year: i64,
    /// 0-based, as JavaScript's.
    month: i64,
    day: i64,
    hour: i64,
    minute: i64,
    mood: i64,
    note_title: String,
    note: String,
    tags: Vec<i64>,
}

/// Reads a backup. Errors refuse the file; an entry whose date or time does not exist
/// is counted unreadable (a backup has no line numbers).
pub fn parse_backup(bytes: &[u8]) -> Result<Parsed, ImportError> {
    parse_backup_capped(bytes, MAX_UNPACKED_BYTES)
}

/// [`parse_backup`] with the data member capped at `cap` bytes unpacked.
fn parse_backup_capped(bytes: &[u8], cap: u64) -> Result<Parsed, ImportError> {
    let mut archive =
        zip::ZipArchive::new(std::io::Cursor::new(bytes)).map_err(|_| ImportError::NotBackup)?;
    let member = archive
        .by_name(MEMBER)
        .map_err(|_| ImportError::NotBackup)?;
    // The declared size may lie: the read is capped all the same.
    if member.size() > cap {
        return Err(ImportError::BackupTooLarge);
    }
    let mut text = Vec::new();
    member
        .take(cap + 1)
        .read_to_end(&mut text)
        .map_err(|_| ImportError::NotBackup)?;
    if text.len() as u64 > cap {
        return Err(ImportError::BackupTooLarge);
    }
    text.retain(|b| !b.is_ascii_whitespace());
    let json = base64::engine::general_purpose::STANDARD
        .decode(&text)
        .map_err(|_| ImportError::NotBackup)?;
    drop(text);
    let backup: Backup = serde_json::from_slice(&json).map_err(|_| ImportError::NotBackup)?;
    Ok(rows(&backup))
}

/// A mood's level (5 the best, as daylog scores) and the name it is keyed by.
fn mood_of(mood: &Mood) -> (Option<u8>, String) {
    let group = usize::try_from(mood.mood_group_id)
        .ok()
        .filter(|g| (1..=5).contains(g));
    let score = group.and_then(|g| u8::try_from(6 - g).ok());
    let name = mood.custom_name.trim();
    let name = if name.is_empty() {
        usize::try_from(mood.predefined_name_id)
            .ok()
            .filter(|p| (1..=5).contains(p))
            .or(group)
            // Group and predefined name count from the best (1, "rad"); the default
            // names are listed by score, from the worst.
            .map_or("", |p| DEFAULT_MOODS[5 - p])
    } else {
        name
    };
    (score, mood_key(name))
}

fn rows(backup: &Backup) -> Parsed {
    let moods: HashMap<i64, (Option<u8>, String)> = backup
        .custom_moods
        .iter()
        .map(|mood| (mood.id, mood_of(mood)))
        .collect();
    let tags: HashMap<i64, &str> = backup
        .tags
        .iter()
        .map(|tag| (tag.id, tag.name.as_str()))
        .collect();
    let mut parsed = Parsed::default();
    for entry in &backup.day_entries {
        let when = || -> Option<(Date, Time)> {
            let small = |n: i64| i8::try_from(n).ok();
            let date = Date::new(
                i16::try_from(entry.year).ok()?,
                small(entry.month + 1)?,
                small(entry.day)?,
            )
            .ok()?;
            let time = Time::new(small(entry.hour)?, small(entry.minute)?, 0, 0).ok()?;
            Some((date, time))
        };
        let Some((date, time)) = when() else {
            parsed.unreadable += 1;
            continue;
        };
        let (mood, mood_name) = moods.get(&entry.mood).cloned().unwrap_or_default();
        let text = [entry.note_title.trim().to_owned(), note_text(&entry.note)]
            .into_iter()
            .filter(|part| !part.is_empty())
            .collect::<Vec<_>>()
            .join("\n");
        let activities = entry.tags.iter().filter_map(|id| tags.get(id).copied());
        parsed.rows.push(ImportRow {
            date,
            time,
            text,
            mood,
            mood_name,
            metrics: Metrics::imported(mood, activities),
        });
    }
    parsed
}

/// A note as text: newer Daylio versions keep some markup in the backup's notes
/// (`<br>`, `<div>`, `&amp;`), which the CSV gives as plain text.
fn note_text(note: &str) -> String {
    let mut out = String::with_capacity(note.len());
    let mut rest = note;
    while let Some(start) = rest.find('<') {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find('>') else {
            out.push_str(&rest[start..]);
            rest = "";
            break;
        };
        let tag = rest[start + 1..start + end].trim().to_ascii_lowercase();
        let name = tag.trim_start_matches('/');
        let name = name
            .split(|c: char| c.is_whitespace() || c == '/')
            .next()
            .unwrap_or("");
        let block = matches!(name, "p" | "div" | "li") && !out.is_empty() && !out.ends_with('\n');
        if name == "br" || block {
            out.push('\n');
        }
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    let out = out
        .replace("&nbsp;", " ")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&");
    out.trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    /// A backup as Daylio writes one: a zip with `backup.daylio` (base64 of `json`).
    pub(crate) fn backup(json: &str) -> Vec<u8> {
        let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default();
        zip.start_file(MEMBER, options).expect("member");
        zip.write_all(
            base64::engine::general_purpose::STANDARD
                .encode(json)
                .as_bytes(),
        )
        .expect("write");
        zip.start_file("assets/photo.jpg", options).expect("asset");
        zip.write_all(b"not read").expect("write");
        zip.finish().expect("zip").into_inner()
    }

    /// The zip with every uncompressed size it declares set to 100 bytes.
    fn lie_about_size(zip: &[u8]) -> Vec<u8> {
        let mut out = zip.to_vec();
        let small = 100u32.to_le_bytes();
        let mut i = 0;
        while i + 46 <= out.len() {
            match &out[i..i + 4] {
                b"PK\x03\x04" => out[i + 22..i + 26].copy_from_slice(&small),
                b"PK\x01\x02" => out[i + 24..i + 28].copy_from_slice(&small),
                _ => {}
            }
            i += 1;
        }
        out
    }

    #[test]
    fn notes_lose_their_markup() {
        assert_eq!(
            note_text("Rain<br>and &amp; wind<div>then sun</div>"),
            "Rain\nand & wind\nthen sun"
        );
        assert_eq!(note_text("a < b"), "a < b");
    }

    #[test]
    fn moods_have_their_level_whatever_their_name() {
        let json = r#"{"customMoods":[
              {"id":1,"custom_name":"","mood_group_id":1,"predefined_name_id":1},
              {"id":7,"custom_name":"Irritable","mood_group_id":4,"predefined_name_id":-1},
              {"id":8,"custom_name":"ok","mood_group_id":3,"predefined_name_id":-1}],
            "tags":[{"id":3,"name":"Friends"}],
            "dayEntries":[
              {"year":2021,"month":2,"day":27,"hour":20,"minute":39,"mood":7,"note":"","note_title":"","tags":[3]},
              {"year":2021,"month":2,"day":27,"hour":20,"minute":39,"mood":8,"note":"x","note_title":"T","tags":[]},
              {"year":2021,"month":1,"day":30,"hour":8,"minute":0,"mood":1,"note":"","tags":[]}]}"#;
        let parsed = parse_backup(&backup(json)).expect("a backup");
        assert_eq!(parsed.unreadable, 1, "30 February");
        let [first, second] = &parsed.rows[..] else {
            panic!("{:?}", parsed.rows)
        };
        assert_eq!(first.date, jiff::civil::date(2021, 3, 27));
        assert_eq!(
            (first.mood, first.mood_name.as_str()),
            (Some(2), "irritable")
        );
        assert_eq!(first.metrics.activities(), ["friends"]);
        assert_eq!((second.mood, second.mood_name.as_str()), (Some(3), "ok"));
        assert_eq!(second.text, "T\nx");
    }

    #[test]
    fn a_zip_that_is_no_backup_or_unpacks_too_far_is_refused() {
        assert_eq!(parse_backup(b"PK\x03\x04junk"), Err(ImportError::NotBackup));
        let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        zip.start_file(MEMBER, options).expect("member");
        zip.write_all(&vec![b'A'; 4 * 1024 * 1024]).expect("write");
        let bomb = zip.finish().expect("zip").into_inner();
        assert!(bomb.len() < 64 * 1024, "{} bytes", bomb.len());
        // Capped at 1 MB here: 4 MB of it is a bomb, refused by its declared size.
        assert_eq!(
            parse_backup_capped(&bomb, 1024 * 1024),
            Err(ImportError::BackupTooLarge)
        );
        // A header that claims less is read only up to the cap all the same (the zip
        // reader may find the lie first).
        let lying = lie_about_size(&bomb);
        assert!(matches!(
            parse_backup_capped(&lying, 1024 * 1024),
            Err(ImportError::BackupTooLarge | ImportError::NotBackup)
        ));
        let no_member = {
            let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
            zip.start_file("other.txt", zip::write::SimpleFileOptions::default())
                .expect("member");
            zip.finish().expect("zip").into_inner()
        };
        assert_eq!(parse_backup(&no_member), Err(ImportError::NotBackup));
    }
}
