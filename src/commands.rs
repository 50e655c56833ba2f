//! The bot's commands (docs/behaviour.md, What arrives) and what each answers, independent of the front end:
//! Telegram and `daylog chat` parse the same [`Command`] and show the same
//! [`Response`]s.

use jiff::civil::Date;
use teloxide::utils::command::BotCommands;

use crate::charts;
use crate::domain::MetricField;
use crate::domain::Metrics;
use crate::frontend::{Response, truncate_chars};
use crate::language::Language;
use crate::render::Reply;
use crate::store::{DayLog, DayMetrics, DayMood, SearchHit, SnippetRun, Store, StoreError, UserId};
use crate::texts::Texts;
use crate::time::{UserZone, ZoneError};
use crate::users::Users;

/// Default and largest `/history` length.
const HISTORY_DEFAULT: u32 = 5;
const HISTORY_MAX: u32 = 50;
/// Default and largest `/stats` period in days.
const STATS_DEFAULT: u32 = 30;
const STATS_MAX: u32 = 365;
/// How much of an entry `/history` shows.
const HISTORY_EXCERPT_CHARS: usize = 300;

#[derive(BotCommands, Clone, Debug, PartialEq, Eq)]
#[command(rename_rule = "lowercase")]
pub enum Command {
    /// What this bot does, and how your data is kept.
    Start,
    /// This list of commands.
    Help,
    /// Your last entries with their metrics: /history [n]
    History(String),
    /// Averages, trend and a chart: /stats [days]
    Stats(String),
    /// All your entries and metrics as a CSV file.
    Export,
    /// Delete all your data (asks first).
    Delete,
    /// Answer language: /lang en or /lang ru
    Lang(String),
    /// Your time zone: /tz Europe/Berlin, /tz UTC+3, or share your location
    Tz(String),
    /// Days in a row with an entry: current and longest.
    Streak,
    /// A daily reminder at your local time: /remind 21:30, /remind off
    Remind(String),
    /// Find your entries with every word, in any of its forms: /search word…
    Search(String),
    /// Your year in pixels, a square per day coloured by mood: /year [YYYY]
    Year(String),
    /// Bring in a Daylio CSV export: send the file with the caption /import
    Import(String),
    /// A look back at your last 7 days, with their chart.
    Week,
    /// The weekly digest every Sunday evening: /digest on, /digest off
    Digest(String),
    /// Your journal as a page: calendar, charts, search, settings.
    App,
}

impl Command {
    /// Descriptions for `setMyCommands` in one language (English from the doc comments).
    pub fn menu(language: Language) -> Vec<(String, String)> {
        let english = Self::bot_commands();
        english
            .into_iter()
            .map(|c| {
                let name = c.command.trim_start_matches('/').to_owned();
                let description = match language {
                    Language::En => c.description,
                    Language::Ru => russian_description(&name).to_owned(),
                };
                (name, description)
            })
            .collect()
    }
}

fn russian_description(command: &str) -> &'static str {
    match command {
        "start" => "Что умеет бот и как хранятся данные.",
        "help" => "Этот список команд.",
        "history" => "Последние записи с метриками: /history [n]",
        "stats" => "Средние, тренд и график: /stats [дни]",
        "export" => "Все записи и метрики в CSV-файле.",
        "delete" => "Удалить все твои данные (с подтверждением).",
        "lang" => "Язык ответов: /lang ru или /lang en",
        "tz" => "Часовой пояс: /tz Europe/Moscow, /tz UTC+3 или геопозиция",
        "streak" => "Сколько дней подряд есть записи: сейчас и рекорд.",
        "remind" => "Ежедневное напоминание по местному времени: /remind 21:30, /remind off",
        "search" => "Найти записи, где есть все слова (в любой форме): /search слово…",
        "year" => "Год в пикселях, по квадрату на день по настроению: /year [ГГГГ]",
        "import" => "Перенести экспорт Daylio (CSV): пришли файл с подписью /import",
        "week" => "Обзор последних 7 дней с графиком.",
        "digest" => "Недельный обзор каждое воскресенье вечером: /digest on, /digest off",
        "app" => "Дневник страницей: календарь, графики, поиск, настройки.",
        _ => "",
    }
}

/// Parses an optional count argument: empty → `default`, else 1..=`max`.
fn count_arg(arg: &str, default: u32, max: u32) -> Option<u32> {
    let arg = arg.trim();
    if arg.is_empty() {
        return Some(default);
    }
    arg.parse::<u32>().ok().filter(|n| (1..=max).contains(n))
}

/// Answers one command of `user_id`: each command has its handler below.
pub async fn respond(
    store: &Store,
    users: &Users,
    user_id: UserId,
    command: Command,
) -> Result<Vec<Response>, StoreError> {
    let language = users.language_of(user_id).await;
    let texts = Texts(language);
    match command {
        Command::Start => Ok(text(start(users, user_id, language).await)),
        Command::Help => Ok(text(help(language, HelpFor::Telegram))),
        Command::History(arg) => history(store, users, user_id, language, &arg).await,
        Command::Stats(arg) => stats(store, users, user_id, language, &arg).await,
        Command::Export => export(store, users, user_id, language).await,
        Command::Delete => Ok(vec![Response::ConfirmDelete { language, user_id }]),
        Command::Lang(arg) => Ok(text(lang(store, user_id, texts, &arg).await?)),
        Command::Tz(arg) => Ok(text(tz(store, users, user_id, texts, &arg).await?)),
        Command::Remind(arg) => Ok(text(remind(store, users, user_id, &arg).await?)),
        // `/week` writes through the cascade and sends by itself (`digest::week`, which
        // both front ends call instead); here it has nothing more to say.
        Command::Week => Ok(Vec::new()),
        Command::Digest(arg) => Ok(text(
            crate::digest::command(store, users, user_id, &arg).await?,
        )),
        Command::Streak => Ok(text(streak(users, user_id, texts).await?)),
        Command::Search(words) => search(store, user_id, language, &words).await,
        Command::Year(arg) => year(store, users, user_id, language, &arg).await,
        // The file itself comes as a document (the bot) or a path (`daylog chat`); the
        // command alone explains how.
        Command::Import(_) => Ok(text(Reply::new().text(texts.import_usage()))),
        // The page opens only inside Telegram; the bot answers it with [`open_app`].
        Command::App => Ok(text(Reply::new().text(texts.app_off()))),
    }
}

/// `/app`: a button that opens the Mini App at `url` in a private chat; in a group, a
/// pointer to the private chat (Telegram allows the button only there); without a
/// `webapp.url`, a sentence saying the page is not set up.
pub fn open_app(language: Language, url: Option<&url::Url>, private_chat: bool) -> Vec<Response> {
    let texts = Texts(language);
    match url {
        None => text(Reply::new().text(texts.app_off())),
        Some(_) if !private_chat => text(Reply::new().text(texts.app_in_group())),
        Some(url) => vec![Response::OpenApp {
            text: texts.app_open().to_owned(),
            button: texts.app_button().to_owned(),
            url: url.to_string(),
        }],
    }
}

/// One text reply as a command's answer.
fn text(reply: Reply) -> Vec<Response> {
    vec![Response::Text(reply)]
}

/// `/start`: what the bot does; a user still on the default zone is invited to set
/// theirs.
async fn start(users: &Users, user_id: UserId, language: Language) -> Reply {
    let texts = Texts(language);
    let mut reply = Reply::new()
        .bold(texts.start_title())
        .paragraph()
        .text(texts.start_body());
    let zone = users.zone_of(user_id).await;
    if zone == *users.default_zone() {
        reply = reply.paragraph().text(texts.start_tz_invite(zone.name()));
    }
    reply.paragraph().italic(texts.privacy())
}

/// Which front end `/help` is read in: they differ in how a file comes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HelpFor {
    /// A document sent with a caption.
    Telegram,
    /// A path on the command's line (`daylog chat`), and its `/voice`.
    Terminal,
}

/// `/help`: the command menu in the user's language, as `front` takes files.
pub fn help(language: Language, front: HelpFor) -> Reply {
    let texts = Texts(language);
    let mut reply = Reply::new().bold(texts.help_title()).newline();
    for (name, description) in Command::menu(language) {
        let description = match (front, name.as_str()) {
            (HelpFor::Terminal, "import") => texts.help_import_in_terminal().to_owned(),
            _ => description,
        };
        reply = reply
            .newline()
            .code(format!("/{name}"))
            .text(format!(" — {description}"));
    }
    if front == HelpFor::Terminal {
        reply = reply
            .newline()
            .code("/voice")
            .text(format!(" — {}", texts.help_voice_in_terminal()));
    }
    reply.paragraph().text(texts.help_footer())
}

/// `/history [n]`.
async fn history(
    store: &Store,
    users: &Users,
    user_id: UserId,
    language: Language,
    arg: &str,
) -> Result<Vec<Response>, StoreError> {
    let Some(n) = count_arg(arg, HISTORY_DEFAULT, HISTORY_MAX) else {
        return Ok(text(
            Reply::new().text(Texts(language).bad_number("history", HISTORY_MAX)),
        ));
    };
    let logs = store.history(user_id, i64::from(n)).await?;
    let zone = users.zone_of(user_id).await;
    Ok(text(history_reply(language, &zone, &logs)))
}

/// `/stats [days]`: averages and the chart, with the streak and what goes with good
/// days under them.
async fn stats(
    store: &Store,
    users: &Users,
    user_id: UserId,
    language: Language,
    arg: &str,
) -> Result<Vec<Response>, StoreError> {
    let texts = Texts(language);
    let Some(days) = count_arg(arg, STATS_DEFAULT, STATS_MAX) else {
        return Ok(text(
            Reply::new().text(texts.bad_number("stats", STATS_MAX)),
        ));
    };
    let (_, today) = users.today_of(user_id).await;
    let first = today
        .checked_sub(jiff::Span::new().days(i64::from(days) - 1))
        .unwrap_or(today);
    let rows = store.daily_metrics(user_id, first).await?;
    let streaks = users.streaks_on(user_id, today).await?;
    let activities = store.day_activities(user_id, first).await?;
    let goes_with = crate::good_days::goes_with_good_days(&crate::good_days::days_with_activities(
        rows.iter().map(|r| (r.day, r.mood)),
        activities,
    ));
    let mut responses = stats_responses(language, days, &rows, today);
    if let Some(Response::Text(reply)) = responses.first_mut() {
        let mut more = std::mem::take(reply);
        if streaks.longest > 0 {
            more = more
                .newline()
                .text(texts.streak_summary(streaks.current, streaks.longest));
        }
        if !goes_with.is_empty() {
            more = more.paragraph().bold(texts.goes_with_title());
            for found in &goes_with {
                more = more.newline().text(texts.goes_with_line(
                    &found.activity,
                    found.with,
                    found.without,
                ));
            }
        }
        *reply = more;
    }
    Ok(responses)
}

/// `/export`: every entry as a CSV file.
async fn export(
    store: &Store,
    users: &Users,
    user_id: UserId,
    language: Language,
) -> Result<Vec<Response>, StoreError> {
    let texts = Texts(language);
    let logs = store.export(user_id).await?;
    if logs.is_empty() {
        return Ok(text(Reply::new().text(texts.no_entries())));
    }
    let zone = users.zone_of(user_id).await;
    Ok(vec![Response::Document {
        bytes: export_csv(&logs, &zone),
        file_name: "daylog-export.csv".to_owned(),
        caption: texts.export_caption(logs.len()),
    }])
}

/// `/lang en|ru`.
async fn lang(
    store: &Store,
    user_id: UserId,
    texts: Texts,
    arg: &str,
) -> Result<Reply, StoreError> {
    Ok(match arg.trim().parse::<Language>() {
        Ok(chosen) => {
            store.set_language(user_id, chosen).await?;
            Reply::new().text(Texts(chosen).lang_set())
        }
        Err(()) => Reply::new().text(texts.lang_usage()),
    })
}

/// `/tz`: the zone and its clock, or a new zone.
async fn tz(
    store: &Store,
    users: &Users,
    user_id: UserId,
    texts: Texts,
    arg: &str,
) -> Result<Reply, StoreError> {
    if arg.trim().is_empty() {
        let zone = users.zone_of(user_id).await;
        let now = local_clock(&zone, users.now());
        return Ok(Reply::new()
            .text(texts.tz_current(zone.name(), &now))
            .newline()
            .text(texts.tz_how_to_change()));
    }
    match UserZone::parse(arg) {
        Ok(zone) => set_zone(store, users, user_id, &zone).await,
        Err(error) => Ok(Reply::new().text(zone_error(texts, &error))),
    }
}

/// `/remind`: the daily reminder; the Sunday digest comes at its time.
async fn remind(
    store: &Store,
    users: &Users,
    user_id: UserId,
    arg: &str,
) -> Result<Reply, StoreError> {
    let reply = crate::reminders::command(store, users, user_id, arg).await?;
    crate::digest::reschedule(store, users, user_id).await?;
    Ok(reply)
}

/// `/streak`: current and longest.
async fn streak(users: &Users, user_id: UserId, texts: Texts) -> Result<Reply, StoreError> {
    let streaks = users.streaks(user_id).await?;
    Ok(Reply::new().text(if streaks.longest == 0 {
        texts.streak_none().to_owned()
    } else {
        texts.streak_summary(streaks.current, streaks.longest)
    }))
}

/// `/search word…`.
async fn search(
    store: &Store,
    user_id: UserId,
    language: Language,
    words: &str,
) -> Result<Vec<Response>, StoreError> {
    if words.split_whitespace().next().is_none() {
        return Ok(text(Reply::new().text(Texts(language).search_usage())));
    }
    let hits = store.search(user_id, words).await?;
    Ok(text(search_reply(language, &hits)))
}

/// `/year [YYYY]`: the year in pixels.
async fn year(
    store: &Store,
    users: &Users,
    user_id: UserId,
    language: Language,
    arg: &str,
) -> Result<Vec<Response>, StoreError> {
    let today = users.today_of(user_id).await.1;
    let year = match arg.trim() {
        "" => i32::from(today.year()),
        given => match year_arg(given) {
            Some(year) => year,
            None => return Ok(text(Reply::new().text(Texts(language).year_usage()))),
        },
    };
    let moods = store.year_moods(user_id, year).await?;
    Ok(year_responses(language, year, &moods, today))
}

/// `HH:MM` on the user's wall clock.
fn local_clock(zone: &UserZone, at: jiff::Timestamp) -> String {
    zone.civil(at).strftime("%H:%M").to_string()
}

/// The sentence for a `/tz` argument that was not taken (nothing changes).
fn zone_error(texts: Texts, error: &ZoneError) -> String {
    match error {
        ZoneError::Unknown => texts.tz_unknown().to_owned(),
        ZoneError::OutOfRange => texts.tz_out_of_range().to_owned(),
        ZoneError::Ambiguous(candidates) => texts.tz_ambiguous(candidates),
    }
}

/// Sets the user's zone (`/tz …` or a shared location) and says so. Entries already
/// stored keep their local day; a reminder moves to the new zone's wall clock.
pub async fn set_zone(
    store: &Store,
    users: &Users,
    user_id: UserId,
    zone: &UserZone,
) -> Result<Reply, StoreError> {
    let before = users.zone_of(user_id).await;
    store.set_timezone(user_id, zone).await?;
    // The same zone again moves nothing (a reminder due this very moment stays due);
    // a new one moves the reminder and the digest to its wall clock.
    if before.name() != zone.name() {
        crate::reminders::zone_changed(store, users, user_id, zone).await?;
        crate::digest::reschedule(store, users, user_id).await?;
    }
    tracing::info!(user_id = user_id.get(), zone = zone.name(), "time zone set");
    let language = users.language_of(user_id).await;
    let now = local_clock(zone, users.now());
    Ok(Reply::new().text(Texts(language).tz_set(zone.name(), &now)))
}

/// A shared location: the zone at those coordinates, or a sentence when there is none.
pub async fn set_zone_from_location(
    store: &Store,
    users: &Users,
    user_id: UserId,
    latitude: f64,
    longitude: f64,
) -> Result<Reply, StoreError> {
    match UserZone::from_location(latitude, longitude) {
        Some(zone) => set_zone(store, users, user_id, &zone).await,
        None => {
            let language = users.language_of(user_id).await;
            Ok(Reply::new().text(Texts(language).location_unknown()))
        }
    }
}

/// How much of an entry one search result shows at most.
const SEARCH_SNIPPET_CHARS: usize = 300;

fn search_reply(language: Language, hits: &[SearchHit]) -> Reply {
    let texts = Texts(language);
    if hits.is_empty() {
        return Reply::new().text(texts.search_none());
    }
    // Every hit carries the same count of the search's matches.
    let matched = usize::try_from(hits.first().map_or(0, |hit| hit.matched))
        .unwrap_or(usize::MAX)
        .max(hits.len());
    let more = matched >= crate::store::SEARCH_CANDIDATES as usize;
    let mut reply = Reply::new().bold(texts.search_title(hits.len(), matched, more));
    for hit in hits {
        // A stored day that is no date (the store logged it): the entry, without it.
        let heading = match hit.day {
            Some(day) => reply.paragraph().bold(day.to_string()).newline(),
            None => reply.paragraph(),
        };
        reply = snippet(heading, hit.snippet());
    }
    reply
}

/// A search snippet with its matches bold, at most [`SEARCH_SNIPPET_CHARS`] long: FTS5
/// cuts the entry to a few words, but one "word" can be thousands of characters long.
fn snippet(mut reply: Reply, runs: Vec<SnippetRun>) -> Reply {
    let mut room = SEARCH_SNIPPET_CHARS;
    for run in runs {
        let shown = truncate_chars(&run.text, room);
        let cut = shown.len() < run.text.len();
        room -= shown.chars().count();
        let shown = shown.to_owned();
        reply = if run.matched {
            reply.bold(shown)
        } else {
            reply.text(shown)
        };
        if cut {
            return reply.text("…");
        }
    }
    reply
}

/// A `/year` argument: a year written with four digits.
fn year_arg(arg: &str) -> Option<i32> {
    (arg.len() == 4 && arg.bytes().all(|b| b.is_ascii_digit()))
        .then(|| arg.parse().ok())
        .flatten()
        .filter(|year| *year >= 1000)
}

fn year_responses(language: Language, year: i32, moods: &[DayMood], today: Date) -> Vec<Response> {
    let texts = Texts(language);
    match charts::year_chart(year, moods, today, language) {
        Ok(png) => vec![Response::Photo {
            png,
            caption: texts.year_caption(year),
            file_name: format!("daylog-year-{year}.png"),
        }],
        Err(error) => {
            tracing::error!(%error, year, "year chart failed");
            vec![Response::Text(Reply::new().text(texts.internal_error()))]
        }
    }
}

/// `/delete` confirmed: every row of the user goes.
pub async fn delete_confirmed(
    store: &Store,
    user_id: UserId,
    language: Language,
) -> Result<Reply, StoreError> {
    delete_pressed(store, user_id, language, None).await
}

/// [`delete_confirmed`] by the button press `pressed` (an inbox row), which is erased
/// and marked handled with the deletion.
pub async fn delete_pressed(
    store: &Store,
    user_id: UserId,
    language: Language,
    pressed: Option<crate::store::UpdateKey>,
) -> Result<Reply, StoreError> {
    let entries = store.delete_user_pressing(user_id, pressed).await?;
    tracing::info!(
        user_id = user_id.get(),
        entries,
        "user data deleted on request"
    );
    Ok(Reply::new().text(Texts(language).deleted(entries)))
}

/// What the user is told when a command (or a confirmed `/delete`) fails: the store error
/// is logged, and this is the one sentence both front ends show for it.
pub fn failure_sentence(language: Language) -> &'static str {
    Texts(language).internal_error()
}

/// A moment on the user's wall clock (`YYYY-MM-DD HH:MM`).
fn local_moment(zone: &UserZone, at: jiff::Timestamp) -> String {
    zone.civil(at).strftime("%Y-%m-%d %H:%M").to_string()
}

fn history_reply(language: Language, zone: &UserZone, logs: &[DayLog]) -> Reply {
    let texts = Texts(language);
    if logs.is_empty() {
        return Reply::new().text(texts.no_entries());
    }
    let mut reply = Reply::new().bold(texts.history_title());
    for log in logs.iter().rev() {
        let excerpt = truncate_chars(&log.text, HISTORY_EXCERPT_CHARS);
        let more = if excerpt.len() < log.text.len() {
            "…"
        } else {
            ""
        };
        reply = reply
            .paragraph()
            .bold(history_heading(zone, log))
            .newline()
            .text(format!("{excerpt}{more}"));
        let line = log
            .metrics
            .as_ref()
            .map(|m| m.compact_line(language))
            .unwrap_or_default();
        if !line.is_empty() {
            reply = reply.newline().italic(line);
        }
    }
    reply
}

/// The local day an entry belongs to, and when it was written on the user's clock
/// (`2026-11-30 · 01:30` for an entry of the night after the 30th) — the clock of the
/// zone it was written in, named when the user has moved since (`2026-11-30 21:10
/// (Europe/Moscow)`), so a `/tz` after a move shifts no hour of the past.
fn history_heading(zone: &UserZone, log: &DayLog) -> String {
    let written_in = log.written_in(zone);
    let written = local_moment(&written_in, log.written());
    let heading = match log.local_day.map(|day| day.to_string()) {
        Some(day) if !written.starts_with(&day) => {
            format!("{day} · {}", written.get(11..).unwrap_or(&written))
        }
        _ => written,
    };
    if *written_in == *zone {
        heading
    } else {
        format!("{heading} ({})", written_in.name())
    }
}

/// Trend over the period: the mean of the later half minus the mean of the earlier half.
fn trend(values: &[Option<f64>]) -> Option<f64> {
    let present: Vec<f64> = values.iter().flatten().copied().collect();
    if present.len() < 2 {
        return None;
    }
    let half = present.len() / 2;
    let early = present[..half].iter().sum::<f64>() / half as f64;
    let late = present[half..].iter().sum::<f64>() / (present.len() - half) as f64;
    Some(late - early)
}

/// `today`: the user's, where the chart's calendar ends.
fn stats_responses(
    language: Language,
    days: u32,
    rows: &[DayMetrics],
    today: Date,
) -> Vec<Response> {
    let texts = Texts(language);
    let entries: i64 = rows.iter().map(|r| r.logs).sum();
    type Field = fn(&DayMetrics) -> Option<f64>;
    let fields: [(MetricField, Field); 4] = [
        (MetricField::Mood, |r| r.mood),
        (MetricField::Stress, |r| r.stress),
        (MetricField::Energy, |r| r.energy),
        (MetricField::SleepHours, |r| r.sleep_hours),
    ];
    let mut lines = Vec::new();
    for (field, get) in fields {
        let values: Vec<Option<f64>> = rows.iter().map(get).collect();
        let Some(avg) = crate::day::mean(values.iter().copied()) else {
            continue;
        };
        let value = if field == MetricField::SleepHours {
            format!("{avg:.1} {}", texts.hours_unit())
        } else {
            format!("{avg:.1}/5")
        };
        let direction = match trend(&values) {
            Some(t) if t > 0.25 => format!(" · {} ↑", texts.trend_up()),
            Some(t) if t < -0.25 => format!(" · {} ↓", texts.trend_down()),
            Some(_) => format!(" · {}", texts.trend_flat()),
            None => String::new(),
        };
        lines.push(format!(
            "{}: {value}{direction}",
            texts.metric_name(field.name())
        ));
    }
    let mut reply = Reply::new()
        .bold(texts.stats_title())
        .newline()
        .italic(texts.stats_period(days, entries));
    if lines.is_empty() {
        return vec![Response::Text(
            reply.paragraph().text(texts.stats_no_data(days)),
        )];
    }
    for line in lines {
        reply = reply.newline().text(line);
    }
    let mut responses = vec![Response::Text(reply)];
    // From the period's first day with an entry: a newcomer's two days are not drawn
    // at the edge of a month of nothing; a day without an entry after it is a gap.
    let first = rows.first().map_or(today, |row| row.day);
    match charts::stats_chart(&crate::day::calendar(rows, first, today), language) {
        Ok(png) => responses.push(Response::Photo {
            png,
            caption: texts.chart_caption().to_owned(),
            file_name: "daylog-stats.png".to_owned(),
        }),
        Err(error) => tracing::error!(%error, "stats chart failed; sending the text alone"),
    }
    responses
}

/// A cell of free text as a spreadsheet should show it: one that begins like a formula
/// (`=`, `+`, `-`, `@`, or a tab or carriage return before one) gets a leading `'`, so
/// that "- ran 5 km" or "=) a good day" is shown as written instead of being run as a
/// formula (OWASP's advice on CSV injection; `daylog sql --format csv` stays exact).
fn spreadsheet_text(text: String) -> String {
    if text.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{text}")
    } else {
        text
    }
}

/// All of a user's entries with their metrics, one row each, for a spreadsheet: UTF-8
/// with a byte-order mark (without one, Excel reads the file in the system's code page
/// and every Cyrillic letter turns into two others), free text as [`spreadsheet_text`].
pub fn export_csv(logs: &[DayLog], zone: &UserZone) -> Vec<u8> {
    let mut writer = csv::Writer::from_writer("\u{feff}".as_bytes().to_vec());
    let header = ["id", "created_at", "status", "text", "analysis"]
        .into_iter()
        .chain(crate::domain::metrics::FIELDS)
        .chain([
            "defaulted",
            // docs/behaviour.md, Time zones and rhythm, added last so that existing
            // column positions keep their meaning.
            "local_day",
            "local_time",
            // The zone of local_time: the one the entry was written in.
            "local_zone",
        ]);
    let _ = writer.write_record(header);
    for log in logs {
        let metrics = log.metrics.as_ref();
        let written_in = log.written_in(zone);
        let score = |f: fn(&Metrics) -> u8, field: MetricField| {
            metrics
                .filter(|m| !m.is_defaulted(field))
                .map(|m| f(m).to_string())
                .unwrap_or_default()
        };
        let _ = writer.write_record([
            log.id.to_string(),
            crate::time::sql_timestamp(log.created_at),
            log.status.as_str().to_owned(),
            spreadsheet_text(log.text.clone()),
            spreadsheet_text(log.analysis.clone().unwrap_or_default()),
            score(Metrics::mood, MetricField::Mood),
            score(Metrics::stress, MetricField::Stress),
            score(Metrics::energy, MetricField::Energy),
            score(Metrics::productivity, MetricField::Productivity),
            metrics
                .and_then(Metrics::sleep_hours)
                .map(|h| h.to_string())
                .unwrap_or_default(),
            spreadsheet_text(
                metrics
                    .map(|m| m.activities().join("; "))
                    .unwrap_or_default(),
            ),
            spreadsheet_text(metrics.map(|m| m.emotions().join("; ")).unwrap_or_default()),
            spreadsheet_text(metrics.map(|m| m.summary().to_owned()).unwrap_or_default()),
            metrics
                .map(|m| m.defaulted().join("; "))
                .unwrap_or_default(),
            log.local_day.map(|day| day.to_string()).unwrap_or_default(),
            local_moment(&written_in, log.written()),
            written_in.name().to_owned(),
        ]);
    }
    writer.into_inner().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_arguments() {
        assert_eq!(count_arg("", 5, 50), Some(5));
        assert_eq!(count_arg(" 7 ", 5, 50), Some(7));
        assert_eq!(count_arg("0", 5, 50), None);
        assert_eq!(count_arg("51", 5, 50), None);
        assert_eq!(count_arg("many", 5, 50), None);
    }

    #[test]
    fn trend_compares_halves() {
        assert_eq!(trend(&[Some(1.0), None, Some(3.0)]), Some(2.0));
        assert_eq!(trend(&[Some(1.0)]), None);
    }

    #[test]
    fn commands_parse_with_and_without_arguments() {
        assert_eq!(
            Command::parse("/stats 7", "").ok(),
            Some(Command::Stats("7".into()))
        );
        assert_eq!(
            Command::parse("/history", "").ok(),
            Some(Command::History(String::new()))
        );
        assert_eq!(
            Command::parse("/lang ru", "").ok(),
            Some(Command::Lang("ru".into()))
        );
        assert!(Command::parse("/nope", "").is_err());
    }

    #[test]
    fn search_and_year_take_the_rest_of_the_line() {
        assert_eq!(
            Command::parse("/search NEAR(\"a\" -b) c:*", "").ok(),
            Some(Command::Search("NEAR(\"a\" -b) c:*".into()))
        );
        assert_eq!(
            Command::parse("/search", "").ok(),
            Some(Command::Search(String::new()))
        );
        assert_eq!(
            Command::parse("/year 2025", "").ok(),
            Some(Command::Year("2025".into()))
        );
    }

    #[test]
    fn a_search_hit_of_one_huge_word_is_cut() {
        let run = |text: &str, matched| SnippetRun {
            text: text.to_owned(),
            matched,
        };
        let long = "a".repeat(5000);
        let runs = vec![run("x ", false), run(&long, true), run(" y", false)];
        let whole = vec![run("x ", false), run("aaa", true), run(" y", false)];

        let cut = snippet(Reply::new(), runs);
        let kept = snippet(Reply::new(), whole);

        let shown = crate::render::to_plain(cut.pieces());
        assert_eq!(shown.chars().count(), SEARCH_SNIPPET_CHARS + 1, "{shown}");
        assert!(shown.ends_with("a…"), "{shown}");
        assert_eq!(crate::render::to_plain(kept.pieces()), "x aaa y");
        assert_eq!(kept.pieces()[1], crate::render::Piece::Bold("aaa".into()));
    }

    #[test]
    fn year_arguments_are_four_digits() {
        assert_eq!(year_arg("2026"), Some(2026));
        assert_eq!(year_arg("1999"), Some(1999));
        for bad in [
            "26",
            "20260",
            "-202",
            "+202",
            "year",
            "０２０２",
            "0999",
            "２０２６",
        ] {
            assert_eq!(year_arg(bad), None, "{bad}");
        }
    }

    #[test]
    fn every_command_has_a_russian_description() {
        for (name, description) in Command::menu(Language::Ru) {
            assert!(!description.is_empty(), "{name}");
        }
    }
}
