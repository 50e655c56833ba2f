//! The pictures the bot sends, drawn with plotters: the `/stats` chart (mood, stress
//! and energy per day) and the `/year` year in pixels (a square per day, by mood).
//!
//! The font is compiled in (DejaVu Sans, `assets/fonts/`, Bitstream Vera licence) and
//! registered with plotters' `ab_glyph` backend, so charts render the same on a bare
//! server with no system fonts, Cyrillic included. The picture is drawn into an RGB
//! buffer in memory and encoded to PNG with `image`; nothing touches the file system.
//!
//! Decisions the spec leaves open for `/stats`:
//! - `days` are plotted in the order given, one slot per element: the caller sorts them
//!   ascending and includes a day with all values `None` where it wants a visible gap in
//!   the calendar. A `None` value breaks that metric's line; it is never drawn as zero.
//!   Every value is also drawn as a dot, so a day between two gaps is still visible.
//! - Values are clamped into 1–5 and non-finite values are skipped.
//! - With no days, or no value at all, the chart is still rendered (axes, legend, title)
//!   with a "no data yet" note in the middle, so `/stats` can always send a picture.
//!
//! And for `/year`: a day's colour is its average mood rounded to the nearest score
//! (3.5 → 4); grey is a day with no entry or only defaulted moods; a day the month does
//! not have (30 February) gets no square, so it never reads as a missed day.

use std::sync::OnceLock;

use image::ImageEncoder;
use image::codecs::png::PngEncoder;
use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::day::{DayMetrics, DayMood};
use crate::language::Language;

pub const WIDTH: u32 = 800;
pub const HEIGHT: u32 = 450;
const LEGEND_WIDTH: u32 = 140;
/// The Mini App's chart: narrower than the PNG, so that shown across a phone's width
/// (about 340 px) its labels keep a readable size.
pub const SVG_WIDTH: u32 = 480;
pub const SVG_HEIGHT: u32 = 360;

const FONT: &str = "sans-serif";
static FONT_BYTES: &[u8] = include_bytes!("../assets/fonts/DejaVuSans.ttf");

#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    #[error("the embedded chart font could not be loaded")]
    Font,
    #[error("the chart could not be drawn: {0}")]
    Draw(String),
    #[error("the chart could not be encoded as PNG: {0}")]
    Encode(#[from] image::ImageError),
}

/// The most days the `/stats` chart draws one by one: a longer period (`/stats 365`,
/// three lines of ~1.6 px a day) is drawn as weekly means ([`crate::day::weeks`]).
pub const MAX_DAILY_POINTS: usize = 92;

/// Draws the `/stats` chart and returns it as PNG bytes ([`WIDTH`]×[`HEIGHT`]).
pub fn stats_chart(days: &[DayMetrics], lang: Language) -> Result<Vec<u8>, ChartError> {
    ensure_font()?;
    let mut rgb = vec![0u8; (WIDTH * HEIGHT * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (WIDTH, HEIGHT)).into_drawing_area();
        draw_period(root, days, lang, Lines::Scores, &Palette::LIGHT)
            .map_err(|e| ChartError::Draw(e.to_string()))?;
    }
    let mut png = Vec::new();
    PngEncoder::new(&mut png).write_image(&rgb, WIDTH, HEIGHT, image::ColorType::Rgb8)?;
    Ok(png)
}

/// The same chart as [`stats_chart`], drawn by the same code, as an SVG document in
/// `palette`'s colours (the Mini App's, from Telegram's theme) with `lines` on it.
pub fn stats_svg(
    days: &[DayMetrics],
    lang: Language,
    lines: Lines,
    palette: &Palette,
) -> Result<String, ChartError> {
    ensure_font()?;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (SVG_WIDTH, SVG_HEIGHT)).into_drawing_area();
        draw_period(root, days, lang, lines, palette)
            .map_err(|e| ChartError::Draw(e.to_string()))?;
    }
    Ok(svg)
}

/// Which values a chart draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lines {
    /// Mood, stress and energy, 1–5 (the `/stats` picture).
    Scores,
    /// Hours of sleep, 0–12.
    Sleep,
}

/// The colours a chart is drawn in: the bot's PNGs use [`Palette::LIGHT`]; the Mini App
/// passes its theme's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Palette {
    pub background: RGBColor,
    pub ink: RGBColor,
    /// Mood (or sleep), stress, energy.
    pub lines: [RGBColor; 3],
}

impl Palette {
    pub const LIGHT: Self = Self {
        background: WHITE,
        ink: BLACK,
        lines: [MOOD_COLOR, STRESS_COLOR, ENERGY_COLOR],
    };
}

/// Draws `days` one by one, or as weekly means past [`MAX_DAILY_POINTS`].
fn draw_period<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    days: &[DayMetrics],
    lang: Language,
    lines: Lines,
    palette: &Palette,
) -> Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    if days.len() > MAX_DAILY_POINTS {
        draw(
            root,
            &crate::day::weeks(days),
            lang,
            Period::Weeks,
            lines,
            palette,
        )
    } else {
        draw(root, days, lang, Period::Days, lines, palette)
    }
}

/// plotters keeps fonts in a process-wide table; register ours once.
fn ensure_font() -> Result<(), ChartError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, FONT_BYTES).is_ok()
    });
    if ok { Ok(()) } else { Err(ChartError::Font) }
}

/// What one point of the `/stats` chart is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Period {
    Days,
    /// A week's means, dated by its first day; labelled by year and month, since a
    /// long period crosses a new year.
    Weeks,
}

struct Texts {
    title: &'static str,
    title_weeks: &'static str,
    mood: &'static str,
    stress: &'static str,
    energy: &'static str,
    sleep: &'static str,
    sleep_title: &'static str,
    sleep_title_weeks: &'static str,
    no_data: &'static str,
}

fn texts(lang: Language) -> Texts {
    match lang {
        Language::En => Texts {
            title: "Mood, stress, energy",
            title_weeks: "Mood, stress, energy: weekly means",
            mood: "Mood",
            stress: "Stress",
            energy: "Energy",
            sleep: "Sleep, h",
            sleep_title: "Sleep, hours",
            sleep_title_weeks: "Sleep, hours: weekly means",
            no_data: "No data yet",
        },
        Language::Ru => Texts {
            title: "Настроение, стресс, энергия",
            title_weeks: "Настроение, стресс, энергия: в среднем за неделю",
            mood: "Настроение",
            stress: "Стресс",
            energy: "Энергия",
            sleep: "Сон, ч",
            sleep_title: "Сон, часов",
            sleep_title_weeks: "Сон, часов: в среднем за неделю",
            no_data: "Пока нет данных",
        },
    }
}

const MOOD_COLOR: RGBColor = RGBColor(46, 160, 67);
const STRESS_COLOR: RGBColor = RGBColor(214, 57, 57);
const ENERGY_COLOR: RGBColor = RGBColor(45, 110, 210);

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    days: &[DayMetrics],
    lang: Language,
    period: Period,
    lines: Lines,
    palette: &Palette,
) -> Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    let t = texts(lang);
    root.fill(&palette.background)?;
    let ink = palette.ink;

    let n = days.len();
    let labels: Vec<String> = days
        .iter()
        .map(|d| match period {
            Period::Days => short_day(d.day),
            Period::Weeks => format!("{}-{:02}", d.day.year(), d.day.month()),
        })
        .collect();
    let title = match (lines, period) {
        (Lines::Scores, Period::Days) => t.title,
        (Lines::Scores, Period::Weeks) => t.title_weeks,
        (Lines::Sleep, Period::Days) => t.sleep_title,
        (Lines::Sleep, Period::Weeks) => t.sleep_title_weeks,
    };
    // Half a slot of room on each side; the y range leaves room for the dots at the ends.
    let x_range = -0.5..(n.max(1) as f64 - 0.5);
    let (low, high) = match lines {
        Lines::Scores => (1.0, 5.0),
        Lines::Sleep => (0.0, 12.0),
    };
    let pad = (high - low) * 0.05;
    let y_range = (low - pad)..(high + pad);

    // The legend gets its own strip on the right so it never hides a line.
    let below_title = root
        .margin(12, 0, 0, 0)
        .titled(title, TextStyle::from((FONT, 26).into_font()).color(&ink))?;
    let width = below_title.dim_in_pixel().0;
    let (plot_area, legend_area) =
        below_title.split_horizontally(width.saturating_sub(LEGEND_WIDTH));
    let mut chart = ChartBuilder::on(&plot_area)
        .margin(16)
        .x_label_area_size(36)
        .y_label_area_size(36)
        .build_cartesian_2d(x_range, y_range)?;

    let label_of = |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 {
            labels.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    // plotters picks "nice" label positions (steps of 1, 2, 5, 10 days); positions
    // between two days get no label.
    chart
        .configure_mesh()
        .x_labels(n.clamp(1, if period == Period::Weeks { 8 } else { 12 }))
        .y_labels(match lines {
            Lines::Scores => 5,
            Lines::Sleep => 7,
        })
        .x_label_formatter(&label_of)
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style(TextStyle::from((FONT, 14).into_font()).color(&ink))
        .axis_style(ink.mix(0.5))
        .light_line_style(ink.mix(0.0))
        .bold_line_style(ink.mix(0.12))
        .draw()?;

    let [first, second, third] = palette.lines;
    let series: Vec<Series<'_>> = match lines {
        Lines::Scores => vec![
            (t.mood, first, days.iter().map(|d| d.mood).collect()),
            (t.stress, second, days.iter().map(|d| d.stress).collect()),
            (t.energy, third, days.iter().map(|d| d.energy).collect()),
        ],
        Lines::Sleep => vec![(t.sleep, first, days.iter().map(|d| d.sleep_hours).collect())],
    };
    // Dots stay visible for a lone day but do not turn two months into a bead string.
    let dot_radius = if n > 31 { 2 } else { 4 };
    let any_value = draw_lines(&mut chart, &series, dot_radius, (low, high))?;
    draw_legend(&legend_area, &series, ink)?;

    if !any_value {
        let grey = ink.mix(0.6);
        let style = TextStyle::from((FONT, 24).into_font())
            .color(&grey)
            .pos(Pos::new(HPos::Center, VPos::Center));
        let center = ((n.max(1) as f64 - 1.0) / 2.0, (low + high) / 2.0);
        chart.draw_series(std::iter::once(Text::new(t.no_data, center, style)))?;
    }

    root.present()?;
    Ok(())
}

/// One line of the chart: its legend name, its colour, a value per slot.
type Series<'a> = (&'a str, RGBColor, Vec<Option<f64>>);

type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Draws each series as lines between consecutive days and a dot per day; a missing
/// day breaks the line; values are clamped into `range`. Whether any value was drawn.
fn draw_lines<DB: DrawingBackend>(
    chart: &mut Chart<'_, DB>,
    series: &[Series<'_>],
    dot_radius: u32,
    (low, high): (f64, f64),
) -> Result<bool, Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    let mut any_value = false;
    for (_, color, values) in series {
        let points: Vec<Option<(f64, f64)>> = values
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.filter(|v| v.is_finite())
                    .map(|v| (i as f64, v.clamp(low, high)))
            })
            .collect();
        for segment in points.split(Option::is_none) {
            let line: Vec<(f64, f64)> = segment.iter().flatten().copied().collect();
            if line.len() > 1 {
                chart.draw_series(LineSeries::new(line, color.stroke_width(3)))?;
            }
        }
        let dots: Vec<(f64, f64)> = points.iter().flatten().copied().collect();
        any_value |= !dots.is_empty();
        chart.draw_series(
            dots.into_iter()
                .map(|p| Circle::new(p, dot_radius, color.filled())),
        )?;
    }
    Ok(any_value)
}

/// The legend, in its own strip so it never hides a line.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    series: &[Series<'_>],
    ink: RGBColor,
) -> Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    for (row, (name, color, _)) in (0i32..).zip(series) {
        let y = 40 + row * 28;
        area.draw(&PathElement::new(
            vec![(4, y), (28, y)],
            color.stroke_width(3),
        ))?;
        let style = TextStyle::from((FONT, 15).into_font())
            .color(&ink)
            .pos(Pos::new(HPos::Left, VPos::Center));
        area.draw(&Text::new(*name, (36, y), style))?;
    }
    Ok(())
}

// ---- the year in pixels (`/year`) ----

/// Side of one day's square and the gap between squares, in pixels.
const CELL: i32 = 30;
const PITCH: i32 = 34;
/// Room for the month names on the left and for the title and day numbers on top.
const YEAR_LEFT: i32 = 96;
const YEAR_TOP: i32 = 112;
const YEAR_MARGIN: i32 = 24;
const LEGEND_HEIGHT: i32 = 116;
pub const YEAR_WIDTH: u32 = (YEAR_LEFT + 31 * PITCH - (PITCH - CELL) + YEAR_MARGIN) as u32;
pub const YEAR_HEIGHT: u32 = (YEAR_TOP + 12 * PITCH - (PITCH - CELL) + LEGEND_HEIGHT) as u32;

/// Moods 1 to 5, red to teal: they differ in lightness as well as hue, so they stay
/// apart for the colour-blind and in a grey-scale screenshot.
pub const MOOD_COLORS: [RGBColor; 5] = [
    RGBColor(204, 40, 40),
    RGBColor(245, 140, 60),
    RGBColor(250, 215, 80),
    RGBColor(120, 195, 95),
    RGBColor(20, 120, 110),
];
/// A day with no entry, or only defaulted moods.
pub const NO_MOOD_COLOR: RGBColor = RGBColor(222, 222, 222);
const INK: RGBColor = RGBColor(40, 40, 40);
const SOFT_INK: RGBColor = RGBColor(110, 110, 110);

/// The colour of a day's average mood: rounded to the nearest score, clamped to 1–5.
pub fn mood_color(mood: Option<f64>) -> RGBColor {
    match mood.filter(|m| m.is_finite()) {
        Some(m) => MOOD_COLORS[(m.round().clamp(1.0, 5.0) as usize) - 1],
        None => NO_MOOD_COLOR,
    }
}

/// Days in `month` (1–12) of `year`, Gregorian.
pub fn days_in_month(year: i32, month: u32) -> u32 {
    match month {
        4 | 6 | 9 | 11 => 30,
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        _ => 31,
    }
}

/// The top-left pixel of the square of `month` (1–12) and `day` (1–31).
pub fn year_cell_origin(month: u32, day: u32) -> (i32, i32) {
    (
        YEAR_LEFT + (day as i32 - 1) * PITCH,
        YEAR_TOP + (month as i32 - 1) * PITCH,
    )
}

struct YearTexts {
    title: &'static str,
    months: [&'static str; 12],
    moods: [&'static str; 5],
    no_mood: &'static str,
}

fn year_texts(lang: Language) -> YearTexts {
    match lang {
        Language::En => YearTexts {
            title: "mood by day",
            months: [
                "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
            ],
            moods: ["1 awful", "2 bad", "3 so-so", "4 good", "5 great"],
            no_mood: "no entry or no mood",
        },
        Language::Ru => YearTexts {
            title: "настроение по дням",
            months: [
                "янв", "фев", "мар", "апр", "май", "июн", "июл", "авг", "сен", "окт", "ноя", "дек",
            ],
            moods: ["1 ужасно", "2 плохо", "3 так себе", "4 хорошо", "5 отлично"],
            no_mood: "нет записи или настроения",
        },
    }
}

/// Draws the year in pixels of `year` ([`YEAR_WIDTH`]×[`YEAR_HEIGHT`] PNG): a row per
/// month, a square per day, coloured by [`mood_color`]; days of other years are
/// ignored. Days a month does not have (30 February) get no square at all, so they
/// never read as "no entry". Days after `today` (the user's) are only outlined: they
/// have not come yet, which grey ("no entry") would say otherwise.
pub fn year_chart(
    year: i32,
    days: &[DayMood],
    today: jiff::civil::Date,
    lang: Language,
) -> Result<Vec<u8>, ChartError> {
    ensure_font()?;
    let mut moods = [[None::<f64>; 31]; 12];
    for d in days.iter().filter(|d| i32::from(d.day.year()) == year) {
        // A `Date`'s month is 1–12 and its day 1–31: every one has its cell.
        let index = |n: i8| usize::from(n.unsigned_abs()).checked_sub(1);
        if let Some(cell) = index(d.day.month())
            .and_then(|month| moods.get_mut(month))
            .and_then(|row| row.get_mut(index(d.day.day())?))
        {
            *cell = d.mood;
        }
    }
    let (width, height) = (YEAR_WIDTH, YEAR_HEIGHT);
    let mut rgb = vec![0u8; (width * height * 3) as usize];
    draw_year(year, &moods, today, lang, &mut rgb).map_err(|e| ChartError::Draw(e.to_string()))?;
    let mut png = Vec::new();
    PngEncoder::new(&mut png).write_image(&rgb, width, height, image::ColorType::Rgb8)?;
    Ok(png)
}

fn draw_year(
    year: i32,
    moods: &[[Option<f64>; 31]; 12],
    today: jiff::civil::Date,
    lang: Language,
    rgb: &mut [u8],
) -> Result<(), Box<dyn std::error::Error>> {
    let t = year_texts(lang);
    let root = BitMapBackend::with_buffer(rgb, (YEAR_WIDTH, YEAR_HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let text = |size: u32, color: &'static RGBColor, h: HPos| {
        TextStyle::from((FONT, size).into_font())
            .color(color)
            .pos(Pos::new(h, VPos::Center))
    };

    root.draw(&Text::new(
        format!("{year} · {}", t.title),
        (YEAR_LEFT, 36),
        text(36, &INK, HPos::Left),
    ))?;
    for day in [1u32, 5, 10, 15, 20, 25, 31] {
        let (x, _) = year_cell_origin(1, day);
        root.draw(&Text::new(
            day.to_string(),
            (x + CELL / 2, YEAR_TOP - 18),
            text(22, &SOFT_INK, HPos::Center),
        ))?;
    }
    for (month, row) in (1u32..).zip(moods) {
        let (_, y) = year_cell_origin(month, 1);
        root.draw(&Text::new(
            t.months[month as usize - 1],
            (YEAR_LEFT - 12, y + CELL / 2),
            text(26, &INK, HPos::Right),
        ))?;
        for (day, mood) in (1u32..).zip(row).take(days_in_month(year, month) as usize) {
            let (x, y) = year_cell_origin(month, day);
            let to_come = (
                i32::from(today.year()),
                today.month() as u32,
                today.day() as u32,
            ) < (year, month, day);
            if to_come {
                root.draw(&Rectangle::new(
                    [(x + 1, y + 1), (x + CELL - 1, y + CELL - 1)],
                    NO_MOOD_COLOR.stroke_width(2),
                ))?;
            } else {
                root.draw(&Rectangle::new(
                    [(x, y), (x + CELL, y + CELL)],
                    mood_color(*mood).filled(),
                ))?;
            }
        }
    }

    // Legend: the five moods on one line, "no entry" under them.
    let top = YEAR_TOP + 12 * PITCH + 18;
    let item = (31 * PITCH) / 5;
    for (i, (label, color)) in (0i32..).zip(t.moods.iter().zip(MOOD_COLORS)) {
        let x = YEAR_LEFT + i * item;
        root.draw(&Rectangle::new(
            [(x, top), (x + CELL, top + CELL)],
            color.filled(),
        ))?;
        root.draw(&Text::new(
            *label,
            (x + CELL + 10, top + CELL / 2),
            text(25, &INK, HPos::Left),
        ))?;
    }
    let top = top + PITCH + 12;
    root.draw(&Rectangle::new(
        [(YEAR_LEFT, top), (YEAR_LEFT + CELL, top + CELL)],
        NO_MOOD_COLOR.filled(),
    ))?;
    root.draw(&Text::new(
        t.no_mood,
        (YEAR_LEFT + CELL + 10, top + CELL / 2),
        text(25, &INK, HPos::Left),
    ))?;

    root.present()?;
    Ok(())
}

/// The label of a day under the `/stats` chart: 2024-11-28 → `11-28`.
fn short_day(day: jiff::civil::Date) -> String {
    format!("{:02}-{:02}", day.month(), day.day())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";
    /// A `today` after every year the tests draw: no day is still to come.
    const LATER: jiff::civil::Date = jiff::civil::date(2100, 1, 1);

    fn day(i: usize, mood: Option<f64>, stress: Option<f64>, energy: Option<f64>) -> DayMetrics {
        // From 2024-11-01 on, one day after another.
        let first = jiff::civil::date(2024, 11, 1);
        DayMetrics {
            day: first.checked_add(jiff::Span::new().days(i as i64)).unwrap(),
            mood,
            stress,
            energy,
            ..DayMetrics::default()
        }
    }

    fn assert_is_chart_png(png: &[u8]) {
        assert!(png.starts_with(PNG_SIGNATURE), "not a PNG");
        assert!(
            png.len() > 2048,
            "suspiciously small PNG: {} bytes",
            png.len()
        );
        let decoded = image::load_from_memory_with_format(png, image::ImageFormat::Png).unwrap();
        assert_eq!((decoded.width(), decoded.height()), (WIDTH, HEIGHT));
    }

    /// Pixels that are clearly the given colour: proof that a series was drawn.
    fn count_pixels(png: &[u8], color: RGBColor) -> usize {
        let img = image::load_from_memory(png).unwrap().to_rgb8();
        img.pixels()
            .filter(|p| {
                p.0.iter()
                    .zip([color.0, color.1, color.2])
                    .all(|(a, b)| a.abs_diff(b) < 8)
            })
            .count()
    }

    #[test]
    fn a_week_renders_as_a_png_of_the_right_size_with_all_three_lines() {
        let days: Vec<DayMetrics> = (0..7)
            .map(|i| {
                let v = 1.0 + (i % 5) as f64;
                day(i, Some(v), Some(6.0 - v), Some(3.0))
            })
            .collect();

        let png = stats_chart(&days, Language::En).unwrap();

        assert_is_chart_png(&png);
        assert!(count_pixels(&png, MOOD_COLOR) > 200);
        assert!(count_pixels(&png, STRESS_COLOR) > 200);
        assert!(count_pixels(&png, ENERGY_COLOR) > 200);
    }

    #[test]
    fn one_day_renders() {
        let png = stats_chart(&[day(0, Some(4.0), Some(2.0), Some(3.0))], Language::En).unwrap();

        assert_is_chart_png(&png);
        assert!(
            count_pixels(&png, MOOD_COLOR) > 20,
            "the single day is drawn as dots"
        );
    }

    #[test]
    fn no_days_render_an_empty_chart_with_a_note() {
        let png = stats_chart(&[], Language::Ru).unwrap();

        assert_is_chart_png(&png);
    }

    #[test]
    fn sixty_days_render() {
        let days: Vec<DayMetrics> = (0..60)
            .map(|i| day(i, Some(1.0 + (i % 5) as f64), Some(2.5), Some(4.0)))
            .collect();

        assert_is_chart_png(&stats_chart(&days, Language::En).unwrap());
    }

    /// `/stats 365`: a year of days that swing between 1 and 5 would be a solid band of
    /// colour drawn day by day; drawn as weekly means it is a line near 3.
    #[test]
    fn a_year_is_drawn_as_weekly_means_not_a_tangle_of_days() {
        let year: Vec<DayMetrics> = (0..365)
            .map(|i| {
                let swing = if i % 2 == 0 { 1.0 } else { 5.0 };
                day(i, Some(swing), None, None)
            })
            .collect();
        ensure_font().unwrap();
        let mut daily = vec![0u8; (WIDTH * HEIGHT * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut daily, (WIDTH, HEIGHT)).into_drawing_area();
            draw(
                root,
                &year,
                Language::En,
                Period::Days,
                Lines::Scores,
                &Palette::LIGHT,
            )
            .unwrap();
        }
        let mut daily_png = Vec::new();
        PngEncoder::new(&mut daily_png)
            .write_image(&daily, WIDTH, HEIGHT, image::ColorType::Rgb8)
            .unwrap();

        let png = stats_chart(&year, Language::En).unwrap();
        std::fs::write(std::env::temp_dir().join("daylog-stats-year.png"), &png).unwrap();

        assert_is_chart_png(&png);
        let (weekly_px, daily_px) = (
            count_pixels(&png, MOOD_COLOR),
            count_pixels(&daily_png, MOOD_COLOR),
        );
        assert!(weekly_px > 200, "the weekly line is drawn: {weekly_px}");
        assert!(
            weekly_px * 4 < daily_px,
            "weekly {weekly_px} px against {daily_px} px day by day"
        );
    }

    #[test]
    fn gaps_break_lines_instead_of_bridging_or_dropping_to_zero() {
        let full: Vec<DayMetrics> = (0..5).map(|i| day(i, Some(4.0), None, None)).collect();
        let mut gappy = full.clone();
        for i in [1, 3] {
            gappy[i].mood = None;
        }

        let full_png = stats_chart(&full, Language::En).unwrap();
        let gappy_png = stats_chart(&gappy, Language::En).unwrap();

        assert_is_chart_png(&gappy_png);
        // A bridged or zero-dropped line would draw at least as much as the full one;
        // a broken line leaves only the three dots.
        let (full_px, gappy_px) = (
            count_pixels(&full_png, MOOD_COLOR),
            count_pixels(&gappy_png, MOOD_COLOR),
        );
        assert!(
            gappy_px > 0 && gappy_px * 3 < full_px,
            "{gappy_px} vs {full_px}"
        );
    }

    #[test]
    fn out_of_range_and_non_finite_values_do_not_fail() {
        let odd = vec![
            day(0, Some(f64::NAN), Some(9.0), Some(-3.0)),
            day(1, Some(f64::INFINITY), Some(3.0), Some(3.0)),
        ];

        assert_is_chart_png(&stats_chart(&odd, Language::En).unwrap());
    }

    #[test]
    fn russian_chart_is_written_for_a_look() {
        let days: Vec<DayMetrics> = (0..14)
            .map(|i| {
                let gap = i == 5 || i == 6;
                day(
                    i,
                    (!gap).then_some(2.0 + (i % 3) as f64),
                    (i != 9).then_some(4.0 - (i % 2) as f64),
                    Some(1.5 + (i % 4) as f64),
                )
            })
            .collect();

        let png = stats_chart(&days, Language::Ru).unwrap();

        assert_is_chart_png(&png);
        std::fs::write(std::env::temp_dir().join("daylog-chart.png"), &png).unwrap();
    }

    /// The colour in the middle of the square of `month`/`day`.
    fn cell_color(png: &[u8], month: u32, day: u32) -> RGBColor {
        let img = image::load_from_memory(png).unwrap().to_rgb8();
        let (x, y) = year_cell_origin(month, day);
        let p = img
            .get_pixel((x + CELL / 2) as u32, (y + CELL / 2) as u32)
            .0;
        RGBColor(p[0], p[1], p[2])
    }

    fn year_day(day: &str, mood: Option<f64>) -> DayMood {
        DayMood {
            day: day.parse().unwrap(),
            mood,
        }
    }

    #[test]
    fn each_day_is_coloured_by_its_rounded_mood_and_grey_without_one() {
        let days = [
            year_day("2026-01-01", Some(1.0)),
            year_day("2026-01-02", Some(2.4)),
            year_day("2026-01-03", Some(2.6)),
            year_day("2026-01-04", Some(4.0)),
            year_day("2026-12-31", Some(5.0)),
            year_day("2026-06-15", None),
            year_day("2025-03-03", Some(5.0)),
        ];

        let png = year_chart(2026, &days, LATER, Language::En).unwrap();

        let decoded = image::load_from_memory(&png).unwrap();
        assert_eq!(
            (decoded.width(), decoded.height()),
            (YEAR_WIDTH, YEAR_HEIGHT)
        );
        assert_eq!(cell_color(&png, 1, 1), MOOD_COLORS[0]);
        assert_eq!(cell_color(&png, 1, 2), MOOD_COLORS[1]);
        assert_eq!(cell_color(&png, 1, 3), MOOD_COLORS[2]);
        assert_eq!(cell_color(&png, 1, 4), MOOD_COLORS[3]);
        assert_eq!(cell_color(&png, 12, 31), MOOD_COLORS[4]);
        assert_eq!(cell_color(&png, 6, 15), NO_MOOD_COLOR, "a defaulted mood");
        assert_eq!(cell_color(&png, 3, 3), NO_MOOD_COLOR, "another year's day");
        assert_eq!(cell_color(&png, 7, 7), NO_MOOD_COLOR, "no entry");
    }

    /// Days that have not come yet are outlined, not grey: grey says "no entry".
    #[test]
    fn days_still_to_come_are_not_drawn_as_missed() {
        let today = jiff::civil::date(2026, 6, 15);

        let png = year_chart(
            2026,
            &[year_day("2026-06-15", Some(4.0))],
            today,
            Language::En,
        )
        .unwrap();

        assert_eq!(cell_color(&png, 6, 15), MOOD_COLORS[3], "today, written");
        assert_eq!(cell_color(&png, 6, 14), NO_MOOD_COLOR, "a day missed");
        assert_eq!(
            cell_color(&png, 6, 16),
            RGBColor(255, 255, 255),
            "tomorrow: only its outline"
        );
        assert_eq!(cell_color(&png, 12, 31), RGBColor(255, 255, 255));
    }

    #[test]
    fn days_a_month_does_not_have_get_no_square() {
        let leap = year_chart(2024, &[], LATER, Language::En).unwrap();
        // No day of 2026 is 29 February: a `DayMood` cannot name one.
        let common = year_chart(
            2026,
            &[year_day("2026-03-01", Some(5.0))],
            LATER,
            Language::Ru,
        )
        .unwrap();

        assert_eq!(cell_color(&leap, 2, 29), NO_MOOD_COLOR);
        assert_eq!(cell_color(&leap, 2, 30), WHITE);
        assert_eq!(cell_color(&common, 2, 29), WHITE);
        assert_eq!(cell_color(&common, 4, 31), WHITE);
        assert_eq!(cell_color(&common, 5, 31), NO_MOOD_COLOR);
    }

    #[test]
    fn mood_colors_round_and_clamp() {
        assert_eq!(mood_color(Some(0.2)), MOOD_COLORS[0]);
        assert_eq!(mood_color(Some(3.5)), MOOD_COLORS[3]);
        assert_eq!(mood_color(Some(9.0)), MOOD_COLORS[4]);
        assert_eq!(mood_color(Some(f64::NAN)), NO_MOOD_COLOR);
        assert_eq!(mood_color(None), NO_MOOD_COLOR);
    }

    #[test]
    fn a_year_is_written_for_a_look() {
        // A made-up year: better in summer, a bad week in November, gaps.
        let mut days = Vec::new();
        for month in 1..=12u32 {
            for day in 1..=days_in_month(2026, month) {
                if (day * 7 + month * 3) % 9 == 0 || (month == 12 && day > 20) {
                    continue;
                }
                let base = 2.5 + 1.5 * (f64::from(month) - 1.0).min(12.0 - f64::from(month)) / 5.5;
                let wobble = f64::from((day * 13 + month * 5) % 7) / 3.0 - 1.0;
                let bad_week = month == 11 && (10..17).contains(&day);
                let mood = if bad_week { 1.2 } else { base + wobble };
                let defaulted = (day + month) % 17 == 0;
                days.push(year_day(
                    &format!("2026-{month:02}-{day:02}"),
                    (!defaulted).then_some(mood),
                ));
            }
        }

        let mut pngs = Vec::new();
        for (lang, name) in [(Language::En, "en"), (Language::Ru, "ru")] {
            let png = year_chart(2026, &days, LATER, lang).unwrap();
            std::fs::write(
                std::env::temp_dir().join(format!("daylog-year-{name}.png")),
                &png,
            )
            .unwrap();
            let img = image::load_from_memory(&png).unwrap().to_rgb8();
            assert_eq!((img.width(), img.height()), (YEAR_WIDTH, YEAR_HEIGHT));
            let at = |x: i32, y: i32| {
                let p = img.get_pixel(x as u32, y as u32).0;
                RGBColor(p[0], p[1], p[2])
            };
            // Every square of the year has its day's colour: gaps and defaulted moods
            // grey, the bad November week awful.
            for month in 1..=12u32 {
                for day in 1..=days_in_month(2026, month) {
                    let date = format!("2026-{month:02}-{day:02}");
                    let mood = days
                        .iter()
                        .find(|d| d.day.to_string() == date)
                        .and_then(|d| d.mood);
                    let (x, y) = year_cell_origin(month, day);
                    assert_eq!(
                        at(x + CELL / 2, y + CELL / 2),
                        mood_color(mood),
                        "{name}: {date}"
                    );
                }
            }
            let (x, y) = year_cell_origin(11, 13);
            assert_eq!(at(x + CELL / 2, y + CELL / 2), MOOD_COLORS[0]);
            let (x, y) = year_cell_origin(12, 25);
            assert_eq!(at(x + CELL / 2, y + CELL / 2), NO_MOOD_COLOR);
            // The legend: the five colours in order, on one line under the months.
            let top = YEAR_TOP + 12 * PITCH + 18;
            for (i, color) in (0i32..).zip(MOOD_COLORS) {
                let x = YEAR_LEFT + i * (31 * PITCH) / 5;
                assert_eq!(
                    at(x + CELL / 2, top + CELL / 2),
                    color,
                    "{name}: legend {i}"
                );
            }
            // The title and the month names are written (ink left of and above the
            // squares, which are all the colour there is below the title).
            let inked = |xs: std::ops::Range<i32>, ys: std::ops::Range<i32>| {
                xs.flat_map(|x| ys.clone().map(move |y| (x, y)))
                    .any(|(x, y)| at(x, y) == INK)
            };
            assert!(inked(YEAR_LEFT..YEAR_LEFT + 200, 20..52), "{name}: title");
            let (_, jan) = year_cell_origin(1, 1);
            assert!(inked(0..YEAR_LEFT - 8, jan..jan + CELL), "{name}: month");
            pngs.push(png);
        }
        assert_ne!(pngs[0], pngs[1], "each language's own labels");
    }

    /// The Mini App's chart is the same drawing in SVG, in the colours it is given.
    #[test]
    fn the_svg_chart_is_the_same_chart_in_the_theme_colours() {
        let days: Vec<DayMetrics> = (0..7)
            .map(|i| DayMetrics {
                sleep_hours: Some(7.5),
                ..day(i, Some(4.0), Some(2.0), Some(3.0))
            })
            .collect();
        let dark = Palette {
            background: RGBColor(0x12, 0x34, 0x56),
            ink: RGBColor(0xee, 0xee, 0xee),
            lines: [RGBColor(0xab, 0xcd, 0xef), STRESS_COLOR, ENERGY_COLOR],
        };
        let svg = stats_svg(&days, Language::En, Lines::Scores, &dark).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..40]);
        let svg_lower = svg.to_lowercase();
        assert!(svg_lower.contains("#123456"), "the theme's background");
        assert!(svg_lower.contains("#abcdef"), "the theme's first line");
        assert!(svg.contains("Mood") && svg.contains("Stress"));
        let sleep = stats_svg(&days, Language::Ru, Lines::Sleep, &dark).unwrap();
        assert!(sleep.contains("Сон") && !sleep.contains("Стресс"));
    }

    #[test]
    fn short_day_keeps_month_and_day() {
        assert_eq!(short_day(jiff::civil::date(2024, 11, 28)), "11-28");
        assert_eq!(short_day(jiff::civil::date(2025, 3, 9)), "03-09");
    }
}
