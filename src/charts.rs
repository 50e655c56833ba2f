//! The `/stats` chart: mood, stress and energy per day as a PNG, drawn with plotters.
//!
//! The font is compiled in (DejaVu Sans, `assets/fonts/`, Bitstream Vera licence) and
//! registered with plotters' `ab_glyph` backend, so charts render the same on a bare
//! server with no system fonts, Cyrillic included. The picture is drawn into an RGB
//! buffer in memory and encoded to PNG with `image`; nothing touches the file system.
//!
//! Decisions the spec leaves open:
//! - `days` are plotted in the order given, one slot per element: the caller sorts them
//!   ascending and includes a day with all values `None` where it wants a visible gap in
//!   the calendar. A `None` value breaks that metric's line; it is never drawn as zero.
//!   Every value is also drawn as a dot, so a day between two gaps is still visible.
//! - Values are clamped into 1–5 and non-finite values are skipped.
//! - With no days, or no value at all, the chart is still rendered (axes, legend, title)
//!   with a "no data yet" note in the middle, so `/stats` can always send a picture.

use std::sync::OnceLock;

use image::ImageEncoder;
use image::codecs::png::PngEncoder;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::language::Language;

pub const WIDTH: u32 = 800;
pub const HEIGHT: u32 = 450;
const LEGEND_WIDTH: u32 = 140;

const FONT: &str = "sans-serif";
static FONT_BYTES: &[u8] = include_bytes!("../assets/fonts/DejaVuSans.ttf");

/// One day of the chart. `day` is `YYYY-MM-DD`; labels show `MM-DD`.
#[derive(Debug, Clone, PartialEq)]
pub struct ChartDay {
    pub day: String,
    pub mood: Option<f64>,
    pub stress: Option<f64>,
    pub energy: Option<f64>,
}

#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    #[error("the embedded chart font could not be loaded")]
    Font,
    #[error("the chart could not be drawn: {0}")]
    Draw(String),
    #[error("the chart could not be encoded as PNG: {0}")]
    Encode(#[from] image::ImageError),
}

/// Draws the `/stats` chart and returns it as PNG bytes ([`WIDTH`]×[`HEIGHT`]).
pub fn stats_chart(days: &[ChartDay], lang: Language) -> Result<Vec<u8>, ChartError> {
    ensure_font()?;
    let mut rgb = vec![0u8; (WIDTH * HEIGHT * 3) as usize];
    draw(days, lang, &mut rgb).map_err(|e| ChartError::Draw(e.to_string()))?;
    let mut png = Vec::new();
    PngEncoder::new(&mut png).write_image(&rgb, WIDTH, HEIGHT, image::ColorType::Rgb8)?;
    Ok(png)
}

/// plotters keeps fonts in a process-wide table; register ours once.
fn ensure_font() -> Result<(), ChartError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, FONT_BYTES).is_ok()
    });
    if ok { Ok(()) } else { Err(ChartError::Font) }
}

struct Texts {
    title: &'static str,
    mood: &'static str,
    stress: &'static str,
    energy: &'static str,
    no_data: &'static str,
}

fn texts(lang: Language) -> Texts {
    match lang {
        Language::En => Texts {
            title: "Mood, stress, energy",
            mood: "Mood",
            stress: "Stress",
            energy: "Energy",
            no_data: "No data yet",
        },
        Language::Ru => Texts {
            title: "Настроение, стресс, энергия",
            mood: "Настроение",
            stress: "Стресс",
            energy: "Энергия",
            no_data: "Пока нет данных",
        },
    }
}

const MOOD_COLOR: RGBColor = RGBColor(46, 160, 67);
const STRESS_COLOR: RGBColor = RGBColor(214, 57, 57);
const ENERGY_COLOR: RGBColor = RGBColor(45, 110, 210);

fn draw(
    days: &[ChartDay],
    lang: Language,
    rgb: &mut [u8],
) -> Result<(), Box<dyn std::error::Error>> {
    let t = texts(lang);
    let root = BitMapBackend::with_buffer(rgb, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;

    let n = days.len();
    let labels: Vec<String> = days.iter().map(|d| short_day(&d.day)).collect();
    // Half a slot of room on each side; the y range leaves room for the dots at 1 and 5.
    let x_range = -0.5..(n.max(1) as f64 - 0.5);
    let y_range = 0.8..5.2;

    // The legend gets its own strip on the right so it never hides a line.
    let below_title = root.margin(12, 0, 0, 0).titled(t.title, (FONT, 26))?;
    let (plot_area, legend_area) = below_title.split_horizontally(WIDTH - LEGEND_WIDTH);
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
        .x_labels(n.clamp(1, 12))
        .y_labels(5)
        .x_label_formatter(&label_of)
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style((FONT, 14))
        .light_line_style(WHITE.mix(0.0))
        .bold_line_style(BLACK.mix(0.12))
        .draw()?;

    let series = [
        (
            t.mood,
            MOOD_COLOR,
            days.iter().map(|d| d.mood).collect::<Vec<_>>(),
        ),
        (
            t.stress,
            STRESS_COLOR,
            days.iter().map(|d| d.stress).collect(),
        ),
        (
            t.energy,
            ENERGY_COLOR,
            days.iter().map(|d| d.energy).collect(),
        ),
    ];
    // Dots stay visible for a lone day but do not turn two months into a bead string.
    let dot_radius = if n > 31 { 2 } else { 4 };
    let mut any_value = false;
    for (_, color, values) in &series {
        let points: Vec<Option<(f64, f64)>> = values
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.filter(|v| v.is_finite())
                    .map(|v| (i as f64, v.clamp(1.0, 5.0)))
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

    for (row, (name, color, _)) in (0i32..).zip(&series) {
        let y = 40 + row * 28;
        legend_area.draw(&PathElement::new(
            vec![(4, y), (28, y)],
            color.stroke_width(3),
        ))?;
        let style = TextStyle::from((FONT, 15).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
        legend_area.draw(&Text::new(*name, (36, y), style))?;
    }

    if !any_value {
        let grey = BLACK.mix(0.6);
        let style = TextStyle::from((FONT, 24).into_font())
            .color(&grey)
            .pos(Pos::new(HPos::Center, VPos::Center));
        let center = ((n.max(1) as f64 - 1.0) / 2.0, 3.0);
        chart.draw_series(std::iter::once(Text::new(t.no_data, center, style)))?;
    }

    root.present()?;
    Ok(())
}

/// `2024-11-28` → `11-28`; anything else is shown as given.
fn short_day(day: &str) -> String {
    match day.get(5..10) {
        Some(md) if day.len() == 10 && day.as_bytes()[4] == b'-' => md.to_string(),
        _ => day.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

    fn day(i: usize, mood: Option<f64>, stress: Option<f64>, energy: Option<f64>) -> ChartDay {
        ChartDay {
            day: format!("2024-{:02}-{:02}", 11 + i / 30, 1 + i % 30),
            mood,
            stress,
            energy,
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
        let days: Vec<ChartDay> = (0..7)
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
        let days: Vec<ChartDay> = (0..60)
            .map(|i| day(i, Some(1.0 + (i % 5) as f64), Some(2.5), Some(4.0)))
            .collect();

        assert_is_chart_png(&stats_chart(&days, Language::En).unwrap());
    }

    #[test]
    fn gaps_break_lines_instead_of_bridging_or_dropping_to_zero() {
        let full: Vec<ChartDay> = (0..5).map(|i| day(i, Some(4.0), None, None)).collect();
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
        let days: Vec<ChartDay> = (0..14)
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

    #[test]
    fn short_day_keeps_month_and_day() {
        assert_eq!(short_day("2024-11-28"), "11-28");
        assert_eq!(short_day("yesterday"), "yesterday");
        assert_eq!(short_day("2024-11-2я"), "2024-11-2я");
    }
}
