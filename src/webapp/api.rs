//! `/app/api/…`: the Mini App's data as JSON (a chart as SVG), each handler the
//! caller's ([`Caller`]) and nobody else's. Reads go through the store's functions the
//! commands use; settings through the commands' own handlers; the export and the
//! deletion through the bot's `/export` and `/delete` answers in the private chat.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::{Caller, Webapp, hardened};
use crate::charts::{Lines, Palette};
use crate::commands::{self, Command};
use crate::domain::{ChatId, LogId, MetricField, Metrics, UserId};
use crate::frontend::{Messenger, Response as Answer, Target};
use crate::language::Language;
use crate::store::{DayLog, NewUser, StoreError};
use crate::texts::Texts;
use crate::time::UserZone;

/// Entries per page of the journal, and the most one request may ask for.
const PAGE_DEFAULT: i64 = 20;
const PAGE_MAX: i64 = 100;
/// The periods the charts offer, in days.
const CHART_PERIODS: [u32; 3] = [30, 90, 365];
/// The period "what goes with good days" looks at.
const GOOD_DAYS_PERIOD: i64 = 90;

type Shared<M> = State<Arc<Webapp<M>>>;

/// A failure of ours (the store): 500, logged, with nothing of the user's in it.
fn failed(error: &StoreError) -> Response {
    tracing::error!(%error, "Mini App request failed");
    hardened(
        StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        "text/plain; charset=utf-8",
    )
}

/// A JSON answer with the page's headers.
fn json<T: Serialize>(value: &T) -> Response {
    hardened(Json(value).into_response(), "application/json")
}

fn not_found() -> Response {
    hardened(
        StatusCode::NOT_FOUND.into_response(),
        "text/plain; charset=utf-8",
    )
}

/// One entry as the page shows it.
#[derive(Debug, Serialize)]
pub struct EntryJson {
    id: i64,
    /// The local day it belongs to (`YYYY-MM-DD`), when known.
    day: Option<String>,
    /// When it was written, `HH:MM` on the clock of the zone it was written in.
    time: String,
    /// That zone, when it is not the user's zone today.
    zone: Option<String>,
    text: String,
    status: &'static str,
    analysis: Option<String>,
    metrics: Option<MetricsJson>,
}

#[derive(Debug, Serialize)]
struct MetricsJson {
    mood: Option<u8>,
    stress: Option<u8>,
    energy: Option<u8>,
    productivity: Option<u8>,
    sleep_hours: Option<f64>,
    activities: Vec<String>,
    emotions: Vec<String>,
    summary: String,
    /// The line `/history` shows under an entry.
    line: String,
}

fn metrics_json(metrics: &Metrics, language: Language) -> MetricsJson {
    let score = |field: MetricField, value: u8| (!metrics.is_defaulted(field)).then_some(value);
    MetricsJson {
        mood: score(MetricField::Mood, metrics.mood()),
        stress: score(MetricField::Stress, metrics.stress()),
        energy: score(MetricField::Energy, metrics.energy()),
        productivity: score(MetricField::Productivity, metrics.productivity()),
        sleep_hours: metrics.sleep_hours(),
        activities: metrics.activities().to_vec(),
        emotions: metrics.emotions().to_vec(),
        summary: metrics.summary().to_owned(),
        line: metrics.compact_line(language),
    }
}

fn entry_json(log: &DayLog, zone: &UserZone, language: Language) -> EntryJson {
    let written_in = log.written_in(zone);
    EntryJson {
        id: log.id.get(),
        day: log.local_day.map(|day| day.to_string()),
        time: written_in
            .civil(log.written())
            .strftime("%H:%M")
            .to_string(),
        zone: (*written_in != *zone).then(|| written_in.name().to_owned()),
        text: log.text.clone(),
        status: log.status.as_str(),
        analysis: log.analysis.clone(),
        metrics: log.metrics.as_ref().map(|m| metrics_json(m, language)),
    }
}

/// The caller's zone and language in one read of the store (defaults for a user the bot
/// has not met, or when the store cannot say).
async fn profile<M: Messenger>(app: &Webapp<M>, user_id: UserId) -> (UserZone, Language) {
    match app.store.user(user_id).await {
        Ok(Some(user)) => (user.timezone, user.language),
        Ok(None) => (app.users.default_zone().clone(), Language::default()),
        Err(error) => {
            tracing::warn!(%error, "Mini App: could not read the user's zone and language");
            (app.users.default_zone().clone(), Language::default())
        }
    }
}

/// What the page needs to know of the caller: language, zone, settings, streak and
/// what goes with good days.
#[derive(Debug, Serialize)]
struct Me {
    language: &'static str,
    zone: String,
    today: String,
    reminder: Option<String>,
    digest: bool,
    streak: u32,
    longest_streak: u32,
    goes_with: Vec<GoesWithJson>,
    /// The year in pixels' colours, worst mood first, and the colour of no mood.
    mood_colors: Vec<String>,
    no_mood_color: String,
}

#[derive(Debug, Serialize)]
struct GoesWithJson {
    activity: String,
    with: f64,
    without: f64,
    /// The sentence `/stats` says about it.
    line: String,
}

fn hex(color: plotters::style::RGBColor) -> String {
    format!("#{:02x}{:02x}{:02x}", color.0, color.1, color.2)
}

/// `GET /app/api/me`.
pub async fn me<M: Messenger>(State(app): Shared<M>, Caller(caller): Caller) -> Response {
    match read_me(&app, caller.user_id).await {
        Ok(me) => json(&me),
        Err(error) => failed(&error),
    }
}

async fn read_me<M: Messenger>(app: &Webapp<M>, user_id: UserId) -> Result<Me, StoreError> {
    let language = app.users.language_of(user_id).await;
    let texts = Texts(language);
    let (zone, today) = app.users.today_of(user_id).await;
    let reminder = app
        .store
        .reminder(user_id)
        .await?
        .filter(|r| r.enabled)
        .and_then(|r| r.local_time)
        .map(|t| t.to_string());
    let digest = app.store.digest_enabled(user_id).await?;
    let streaks = app.users.streaks_on(user_id, today).await?;
    let first = today
        .checked_sub(jiff::Span::new().days(GOOD_DAYS_PERIOD - 1))
        .unwrap_or(today);
    let rows = app.store.daily_metrics(user_id, first).await?;
    let activities = app.store.day_activities(user_id, first).await?;
    let goes_with = crate::good_days::goes_with_good_days(&crate::good_days::days_with_activities(
        rows.iter().map(|r| (r.day, r.mood)),
        activities,
    ));
    Ok(Me {
        language: language.code(),
        zone: zone.name().to_owned(),
        today: today.to_string(),
        reminder,
        digest,
        streak: streaks.current,
        longest_streak: streaks.longest,
        goes_with: goes_with
            .into_iter()
            .map(|g| GoesWithJson {
                line: texts.goes_with_line(&g.activity, g.with, g.without),
                activity: g.activity,
                with: g.with,
                without: g.without,
            })
            .collect(),
        mood_colors: crate::charts::MOOD_COLORS.iter().map(|c| hex(*c)).collect(),
        no_mood_color: hex(crate::charts::NO_MOOD_COLOR),
    })
}

#[derive(Debug, Deserialize)]
pub struct PageQuery {
    before: Option<i64>,
    limit: Option<i64>,
}

#[derive(Debug, Serialize)]
struct EntriesJson {
    entries: Vec<EntryJson>,
    /// Whether older entries are there (ask again with `before` = the last id).
    more: bool,
}

/// `GET /app/api/entries?before=ID&limit=N`: the journal, newest first.
pub async fn entries<M: Messenger>(
    State(app): Shared<M>,
    Caller(caller): Caller,
    Query(query): Query<PageQuery>,
) -> Response {
    let user_id = caller.user_id;
    let limit = query.limit.unwrap_or(PAGE_DEFAULT).clamp(1, PAGE_MAX);
    let page = app
        .store
        .entries_page(user_id, query.before.map(LogId), limit + 1)
        .await;
    let mut logs = match page {
        Ok(logs) => logs,
        Err(error) => return failed(&error),
    };
    let more = logs.len() as i64 > limit;
    logs.truncate(usize::try_from(limit).unwrap_or(0));
    let (zone, language) = profile(&app, user_id).await;
    json(&EntriesJson {
        entries: logs
            .iter()
            .map(|log| entry_json(log, &zone, language))
            .collect(),
        more,
    })
}

/// `GET /app/api/entries/{id}`: one entry of the caller's; 404 for a missing one and
/// another user's alike.
pub async fn entry<M: Messenger>(
    State(app): Shared<M>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Response {
    let Ok(id) = id.parse::<i64>() else {
        return not_found();
    };
    match app.store.entry_of(caller.user_id, LogId(id)).await {
        Ok(Some(log)) => {
            let (zone, language) = profile(&app, caller.user_id).await;
            json(&entry_json(&log, &zone, language))
        }
        Ok(None) => not_found(),
        Err(error) => failed(&error),
    }
}

/// `GET /app/api/days/{YYYY-MM-DD}`: the entries of one local day, in writing order.
pub async fn day<M: Messenger>(
    State(app): Shared<M>,
    Caller(caller): Caller,
    Path(day): Path<String>,
) -> Response {
    let Ok(day) = day.parse::<jiff::civil::Date>() else {
        return not_found();
    };
    match app.store.entries_on(caller.user_id, day).await {
        Ok(logs) => {
            let (zone, language) = profile(&app, caller.user_id).await;
            json(&EntriesJson {
                entries: logs
                    .iter()
                    .map(|log| entry_json(log, &zone, language))
                    .collect(),
                more: false,
            })
        }
        Err(error) => failed(&error),
    }
}

#[derive(Debug, Deserialize)]
pub struct YearQuery {
    year: Option<i32>,
}

#[derive(Debug, Serialize)]
struct YearJson {
    year: i32,
    today: String,
    /// Each day with entries: its day, its mean mood, and its colour in `/year`'s PNG.
    days: Vec<YearDay>,
}

#[derive(Debug, Serialize)]
struct YearDay {
    day: String,
    mood: Option<f64>,
    color: String,
}

/// `GET /app/api/year?year=YYYY`: the year in pixels (the year of today by default).
pub async fn year<M: Messenger>(
    State(app): Shared<M>,
    Caller(caller): Caller,
    Query(query): Query<YearQuery>,
) -> Response {
    let (_, today) = app.users.today_of(caller.user_id).await;
    let year = query
        .year
        .filter(|y| (1000..=9999).contains(y))
        .unwrap_or(i32::from(today.year()));
    match app.store.year_moods(caller.user_id, year).await {
        Ok(days) => json(&YearJson {
            year,
            today: today.to_string(),
            days: days
                .into_iter()
                .map(|d| YearDay {
                    day: d.day.to_string(),
                    mood: d.mood,
                    color: hex(crate::charts::mood_color(d.mood)),
                })
                .collect(),
        }),
        Err(error) => failed(&error),
    }
}

#[derive(Debug, Deserialize)]
pub struct ChartQuery {
    days: Option<u32>,
    lines: Option<String>,
    /// The theme's colours, `rrggbb`: background, text, and the three lines.
    bg: Option<String>,
    ink: Option<String>,
    c1: Option<String>,
    c2: Option<String>,
    c3: Option<String>,
}

/// A colour written `rrggbb` (or `#rrggbb`); anything else is `fallback`.
fn color(given: Option<&str>, fallback: plotters::style::RGBColor) -> plotters::style::RGBColor {
    let Some(text) = given.map(|t| t.trim_start_matches('#')) else {
        return fallback;
    };
    if text.len() != 6 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return fallback;
    }
    let channel =
        |i: usize| u8::from_str_radix(text.get(i..i + 2).unwrap_or("00"), 16).unwrap_or(0);
    plotters::style::RGBColor(channel(0), channel(2), channel(4))
}

/// `GET /app/api/chart?days=30|90|365&lines=scores|sleep&bg=…`: the `/stats` chart,
/// drawn by the same code, as SVG in the theme's colours.
pub async fn chart<M: Messenger>(
    State(app): Shared<M>,
    Caller(caller): Caller,
    Query(query): Query<ChartQuery>,
) -> Response {
    let days = query
        .days
        .filter(|d| CHART_PERIODS.contains(d))
        .unwrap_or(CHART_PERIODS[0]);
    let lines = match query.lines.as_deref() {
        Some("sleep") => Lines::Sleep,
        _ => Lines::Scores,
    };
    let light = Palette::LIGHT;
    let palette = Palette {
        background: color(query.bg.as_deref(), light.background),
        ink: color(query.ink.as_deref(), light.ink),
        lines: [
            color(query.c1.as_deref(), light.lines[0]),
            color(query.c2.as_deref(), light.lines[1]),
            color(query.c3.as_deref(), light.lines[2]),
        ],
    };
    let user_id = caller.user_id;
    let language = app.users.language_of(user_id).await;
    let (_, today) = app.users.today_of(user_id).await;
    let first = today
        .checked_sub(jiff::Span::new().days(i64::from(days) - 1))
        .unwrap_or(today);
    let rows = match app.store.daily_metrics(user_id, first).await {
        Ok(rows) => rows,
        Err(error) => return failed(&error),
    };
    // As `/stats`: from the period's first day with an entry, gaps as gaps.
    let start = rows.first().map_or(today, |row| row.day);
    let calendar = crate::day::calendar(&rows, start, today);
    match crate::charts::stats_svg(&calendar, language, lines, &palette) {
        Ok(svg) => hardened(svg.into_response(), "image/svg+xml"),
        Err(error) => {
            tracing::error!(%error, "Mini App chart failed");
            hardened(
                StatusCode::INTERNAL_SERVER_ERROR.into_response(),
                "text/plain; charset=utf-8",
            )
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct SearchQuery {
    q: Option<String>,
}

#[derive(Debug, Serialize)]
struct SearchJson {
    hits: Vec<HitJson>,
    /// How many of the caller's entries matched, shown or not.
    matched: i64,
}

#[derive(Debug, Serialize)]
struct HitJson {
    id: i64,
    day: Option<String>,
    /// The snippet as runs; `matched` runs are the words found.
    runs: Vec<RunJson>,
}

#[derive(Debug, Serialize)]
struct RunJson {
    text: String,
    matched: bool,
}

/// `GET /app/api/search?q=words`: `/search`, by the same function.
pub async fn search<M: Messenger>(
    State(app): Shared<M>,
    Caller(caller): Caller,
    Query(query): Query<SearchQuery>,
) -> Response {
    let words = query.q.unwrap_or_default();
    match app.store.search(caller.user_id, &words).await {
        Ok(hits) => json(&SearchJson {
            matched: hits
                .first()
                .map_or(0, |hit| hit.matched)
                .max(hits.len() as i64),
            hits: hits
                .iter()
                .map(|hit| HitJson {
                    id: hit.id.get(),
                    day: hit.day.map(|d| d.to_string()),
                    runs: hit
                        .snippet()
                        .into_iter()
                        .map(|run| RunJson {
                            text: run.text,
                            matched: run.matched,
                        })
                        .collect(),
                })
                .collect(),
        }),
        Err(error) => failed(&error),
    }
}

#[derive(Debug, Deserialize)]
pub struct SettingChange {
    setting: String,
    value: String,
}

#[derive(Debug, Serialize)]
struct Said {
    /// What the bot says to the change, as `/tz`, `/remind`, … would.
    message: String,
}

/// The user as initData names them, recorded before a change (the bot may not have
/// met them yet; a setting of a user who is not stored would not stick).
async fn ensure_caller<M: Messenger>(
    app: &Webapp<M>,
    caller: &super::init_data::Signed,
) -> Result<(), StoreError> {
    app.users
        .ensure(&NewUser {
            user_id: caller.user_id,
            username: caller.username.as_deref(),
            language: caller.language,
        })
        .await
}

/// `POST /app/api/settings` `{"setting": "tz"|"remind"|"lang"|"digest", "value": …}`:
/// the command's own handler, so the value is read by the command's own rules.
pub async fn settings<M: Messenger>(
    State(app): Shared<M>,
    Caller(caller): Caller,
    Json(change): Json<SettingChange>,
) -> Response {
    let command = match change.setting.as_str() {
        "tz" => Command::Tz(change.value),
        "remind" => Command::Remind(change.value),
        "lang" => Command::Lang(change.value),
        "digest" => Command::Digest(change.value),
        _ => return not_found(),
    };
    if let Err(error) = ensure_caller(&app, &caller).await {
        return failed(&error);
    }
    match commands::respond(&app.store, &app.users, caller.user_id, command).await {
        Ok(answers) => json(&Said {
            message: plain(&answers),
        }),
        Err(error) => failed(&error),
    }
}

/// The text of a command's answers, as the terminal prints it.
fn plain(answers: &[Answer]) -> String {
    answers
        .iter()
        .filter_map(|answer| match answer {
            Answer::Text(reply) => Some(crate::render::to_plain(reply.pieces())),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `POST /app/api/export`: `/export`'s file, sent to the private chat by the bot.
pub async fn export<M: Messenger>(State(app): Shared<M>, Caller(caller): Caller) -> Response {
    to_private_chat(&app, &caller, Command::Export).await
}

/// `POST /app/api/delete`: `/delete`'s question and its buttons, sent to the private
/// chat; nothing is deleted until the user presses "yes" there.
pub async fn delete<M: Messenger>(State(app): Shared<M>, Caller(caller): Caller) -> Response {
    to_private_chat(&app, &caller, Command::Delete).await
}

/// Runs `command` as the bot does and sends its answers to the caller's private chat
/// (whose id in Telegram is the user's).
async fn to_private_chat<M: Messenger>(
    app: &Webapp<M>,
    caller: &super::init_data::Signed,
    command: Command,
) -> Response {
    if let Err(error) = ensure_caller(app, caller).await {
        return failed(&error);
    }
    let user_id = caller.user_id;
    let answers = match commands::respond(&app.store, &app.users, user_id, command).await {
        Ok(answers) => answers,
        Err(error) => return failed(&error),
    };
    let texts = Texts(app.users.language_of(user_id).await);
    let target = Target::chat(ChatId(user_id.get()));
    let message = match app.messenger.send(target, answers).await {
        Ok(()) => texts.app_sent_to_chat(),
        Err(error) => {
            tracing::warn!(%error, user_id = user_id.get(), "Mini App: could not write to the private chat");
            texts.app_chat_unreachable()
        }
    };
    json(&Said {
        message: message.to_owned(),
    })
}

/// Any other `/app/api/…` path: 401 without valid initData (as every API path), else 404.
pub async fn unknown<M: Messenger>(State(_app): Shared<M>, Caller(_caller): Caller) -> Response {
    not_found()
}
