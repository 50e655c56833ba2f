//! The configuration reference (`docs/configuration.md`) against the shipped defaults
//! (`config/default.toml`), so that neither can change without the other.
//!
//! The page's convention, stated at its end: a *key row* is a table row whose first cell
//! is one dotted name in backticks; a list of tables is written `[]`
//! (`analysis.steps[].model`); a segment in capitals (`NAME`, `TASK`) stands for any
//! provider or cascade. Every key of the defaults needs a key row, and every key row must
//! name something the defaults have.

#![expect(
    clippy::expect_used,
    reason = "the repository's own files; a missing one is a broken checkout"
)]

use std::collections::BTreeSet;
use std::path::Path;

fn read(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    std::fs::read_to_string(path).expect("a file of the repository")
}

/// Every key of a TOML tree as a dotted path, tables, inline tables and lists of tables
/// walked (an element of a list of tables is `[]`): `(leaves, every node)`.
fn toml_keys(text: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    fn walk(
        table: &toml::Table,
        prefix: &str,
        leaves: &mut BTreeSet<String>,
        nodes: &mut BTreeSet<String>,
    ) {
        for (key, value) in table {
            let path = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            nodes.insert(path.clone());
            match value {
                toml::Value::Table(inner) => walk(inner, &path, leaves, nodes),
                toml::Value::Array(items)
                    if !items.is_empty() && items.iter().all(toml::Value::is_table) =>
                {
                    let element = format!("{path}[]");
                    nodes.insert(element.clone());
                    for item in items.iter().filter_map(toml::Value::as_table) {
                        walk(item, &element, leaves, nodes);
                    }
                }
                _ => {
                    leaves.insert(path);
                }
            }
        }
    }
    let tree: toml::Table = text.parse().expect("the TOML parses");
    let (mut leaves, mut nodes) = (BTreeSet::new(), BTreeSet::new());
    walk(&tree, "", &mut leaves, &mut nodes);
    (leaves, nodes)
}

/// The key rows of a Markdown page: the first cell of a table row, when it is one dotted
/// name in backticks.
fn key_rows(markdown: &str) -> BTreeSet<String> {
    markdown
        .lines()
        .filter_map(|line| line.trim().strip_prefix('|'))
        .filter_map(|row| row.split('|').next())
        .filter_map(|cell| {
            cell.trim()
                .strip_prefix('`')
                .and_then(|cell| cell.strip_suffix('`'))
        })
        .filter(|name| looks_like_a_key(name))
        .map(str::to_owned)
        .collect()
}

/// `retry.max_attempts`, `analysis.steps[].model`, `providers.NAME.kind`: a letter first,
/// at least one dot, nothing but letters, digits, `_`, `.` and `[]`.
fn looks_like_a_key(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name.contains('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '[' | ']'))
}

/// A segment that stands for any name (`NAME`, `TASK`).
fn is_placeholder(segment: &str) -> bool {
    let bare = segment.trim_end_matches("[]");
    !bare.is_empty() && bare.chars().all(|c| c.is_ascii_uppercase())
}

/// Whether a key row with placeholders names a key that the tree has for some name.
fn matches_some(row: &str, nodes: &BTreeSet<String>) -> bool {
    let pattern: Vec<&str> = row.split('.').collect();
    nodes.iter().any(|node| {
        let path: Vec<&str> = node.split('.').collect();
        path.len() == pattern.len()
            && pattern.iter().zip(&path).all(|(want, have)| {
                want == have
                    || (is_placeholder(want) && want.ends_with("[]") == have.ends_with("[]"))
            })
    })
}

/// Whether the defaults' comments show `key = …` (the optional keys they describe).
fn shown_in_comments(defaults: &str, key: &str) -> bool {
    defaults
        .lines()
        .filter_map(|line| line.split_once('#').map(|(_, comment)| comment))
        .any(|comment| {
            let words: Vec<&str> = comment.split_whitespace().collect();
            words.windows(2).any(|pair| pair == [key, "="])
        })
}

/// What is wrong between a reference page and the defaults; empty when nothing is.
fn mismatches(reference: &str, defaults: &str) -> Vec<String> {
    let (leaves, nodes) = toml_keys(defaults);
    let rows = key_rows(reference);
    let mut wrong = Vec::new();
    for key in &leaves {
        if !rows.contains(key) {
            wrong.push(format!(
                "`{key}` is in config/default.toml but has no key row"
            ));
        }
    }
    for row in &rows {
        let placeholder = row.split('.').any(is_placeholder);
        let exists = if placeholder {
            let last = row.rsplit('.').next().unwrap_or(row);
            matches_some(row, &nodes) || shown_in_comments(defaults, last)
        } else {
            nodes.contains(row)
        };
        if !exists {
            wrong.push(format!(
                "`{row}` has a key row but config/default.toml has no such key"
            ));
        }
    }
    wrong
}

#[test]
fn every_default_key_is_documented_and_every_documented_key_exists() {
    let wrong = mismatches(&read("docs/configuration.md"), &read("config/default.toml"));
    assert!(
        wrong.is_empty(),
        "docs/configuration.md:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_key_of_the_shipped_examples_is_documented() {
    let rows = key_rows(&read("docs/configuration.md"));
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/examples");
    let mut wrong = Vec::new();
    for entry in std::fs::read_dir(&folder).expect("config/examples") {
        let path = entry.expect("an example").path();
        let text = std::fs::read_to_string(&path).expect("the example reads");
        for key in toml_keys(&text).0 {
            let this_key = BTreeSet::from([key.clone()]);
            let covered = rows.contains(&key)
                || rows
                    .iter()
                    .filter(|row| row.split('.').any(is_placeholder))
                    .any(|row| matches_some(row, &this_key));
            if !covered {
                wrong.push(format!("{}: `{key}` has no key row", path.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/configuration.md:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_variable_of_the_env_example_is_documented() {
    let reference = read("docs/configuration.md");
    let mut missing = Vec::new();
    for line in read(".env.example").lines() {
        let line = line.trim_start_matches(['#', ' ']);
        let Some((name, _)) = line.split_once('=') else {
            continue;
        };
        let is_name = name.starts_with(|c: char| c.is_ascii_uppercase())
            && name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        if !is_name {
            continue;
        }
        // `MISTRAL_API_KEY_2` is documented with its first: `NAME_2`, `NAME_3`, … add more.
        let base = name
            .rsplit_once('_')
            .filter(|(_, n)| n.bytes().all(|b| b.is_ascii_digit()))
            .map_or(name, |(base, _)| base);
        if !reference.contains(base) {
            missing.push(name.to_owned());
        }
    }
    assert!(
        missing.is_empty(),
        "variables of .env.example missing from docs/configuration.md: {missing:?}"
    );
}

/// The check itself fails both ways: a key only in the defaults, a key only in the page.
#[test]
fn a_key_on_one_side_only_is_found() {
    let defaults = "[retry]\nmax_attempts = 3 # rounds\n# also: key_env = \"X\"\n\n[[analysis.steps]]\nprovider = \"p\"\n";
    let page = "| key | default |\n|---|---|\n| `retry.max_attempts` | `3` |\n| `analysis.steps[].provider` | `p` |\n| `providers.NAME.key_env` | unset |\n";
    assert!(
        mismatches(page, defaults).is_empty(),
        "{:?}",
        mismatches(page, defaults)
    );

    let more_defaults = format!("{defaults}[voice]\nmax_seconds = 1\n");
    assert_eq!(
        mismatches(page, &more_defaults),
        ["`voice.max_seconds` is in config/default.toml but has no key row"]
    );

    let more_page =
        format!("{page}| `retry.max_tries` | `3` |\n| `TASK.steps[].nonsense` | unset |\n");
    assert_eq!(
        mismatches(&more_page, defaults),
        [
            "`TASK.steps[].nonsense` has a key row but config/default.toml has no such key",
            "`retry.max_tries` has a key row but config/default.toml has no such key",
        ]
    );
}
