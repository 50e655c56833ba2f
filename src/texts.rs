//! Everything the bot says, in English and Russian. One function per sentence keeps the
//! two languages side by side, so a new sentence cannot be added in one language only.

use crate::language::Language;

/// The texts of one language.
#[derive(Debug, Clone, Copy)]
pub struct Texts(pub Language);

impl Texts {
    fn pick(self, en: &'static str, ru: &'static str) -> &'static str {
        match self.0 {
            Language::En => en,
            Language::Ru => ru,
        }
    }

    pub fn start_title(self) -> &'static str {
        self.pick("Hi! I am your day journal.", "Привет! Я твой дневник.")
    }

    pub fn start_body(self) -> &'static str {
        self.pick(
            "Write me how your day went, in your own words. I keep every entry, answer with a short analysis and one concrete suggestion, and track mood, stress, energy and sleep over time.\n\nTry /stats after a few days, /history to look back, /help for everything.",
            "Напиши, как прошёл твой день, своими словами. Я сохраню каждую запись, отвечу коротким разбором с одним конкретным советом и буду следить за настроением, стрессом, энергией и сном.\n\nЧерез несколько дней попробуй /stats, /history — чтобы оглянуться назад, /help — всё остальное.",
        )
    }

    pub fn privacy(self) -> &'static str {
        self.pick(
            "Privacy: your entries are stored only in this bot's database and sent to the AI providers for analysis; /export gives you all of it, /delete erases all of it.",
            "Приватность: записи хранятся только в базе этого бота и отправляются AI-провайдерам для разбора; /export выдаст всё, /delete сотрёт всё.",
        )
    }

    pub fn help_title(self) -> &'static str {
        self.pick("What I can do", "Что я умею")
    }

    pub fn help_footer(self) -> &'static str {
        self.pick(
            "Any other text is a journal entry.",
            "Любой другой текст — запись в дневник.",
        )
    }

    pub fn not_allowed(self) -> &'static str {
        self.pick(
            "Sorry, this is a private journal bot and it is not open to you.",
            "Извините, это личный бот-дневник, и он вам недоступен.",
        )
    }

    pub fn only_text(self) -> &'static str {
        self.pick(
            "I only keep text entries. Tell me about your day in words.",
            "Я сохраняю только текстовые записи. Расскажи о своём дне словами.",
        )
    }

    pub fn analysis_title(self) -> &'static str {
        self.pick("Saved.", "Сохранено.")
    }

    pub fn saved_pending(self) -> &'static str {
        self.pick(
            "Saved. The AI services are not answering right now; your analysis will follow as soon as one is back.",
            "Сохранено. AI-сервисы сейчас не отвечают; разбор придёт, как только один из них заработает.",
        )
    }

    pub fn saved_rate_limited(self) -> &'static str {
        self.pick(
            "Saved. You have reached the hourly number of analyses; this entry will be analysed a bit later.",
            "Сохранено. Лимит разборов на этот час исчерпан; эту запись я разберу чуть позже.",
        )
    }

    pub fn late_analysis_title(self) -> &'static str {
        self.pick("Your analysis, as promised:", "Обещанный разбор:")
    }

    pub fn blocked(self) -> &'static str {
        self.pick(
            "Your entry is saved. The AI refused to analyse this one (its content filter), so there is no analysis for it.",
            "Запись сохранена. AI отказался её разбирать (сработал его фильтр содержимого), поэтому разбора не будет.",
        )
    }

    pub fn failed(self) -> &'static str {
        self.pick(
            "Your entry is saved, but the AI services stayed unavailable for too long, so I gave up analysing it. Its text is in /history and /export.",
            "Запись сохранена, но AI-сервисы слишком долго были недоступны, и я перестал пытаться её разобрать. Текст есть в /history и /export.",
        )
    }

    pub fn truncated_note(self) -> &'static str {
        self.pick(
            "Your entry was long: it is saved whole, but only its beginning was analysed.",
            "Запись длинная: она сохранена целиком, но разобрано только её начало.",
        )
    }

    pub fn edited_title(self) -> &'static str {
        self.pick("Updated.", "Обновлено.")
    }

    pub fn no_entries(self) -> &'static str {
        self.pick(
            "No entries yet. Tell me how your day went!",
            "Записей пока нет. Расскажи, как прошёл день!",
        )
    }

    pub fn history_title(self) -> &'static str {
        self.pick("Your last entries", "Последние записи")
    }

    pub fn stats_title(self) -> &'static str {
        self.pick("Your statistics", "Твоя статистика")
    }

    pub fn stats_period(self, days: u32, entries: i64) -> String {
        match self.0 {
            Language::En => format!("Last {days} days, {entries} entries"),
            Language::Ru => format!("Последние {days} дн., записей: {entries}"),
        }
    }

    pub fn stats_no_data(self, days: u32) -> String {
        match self.0 {
            Language::En => format!("No metrics in the last {days} days yet."),
            Language::Ru => format!("За последние {days} дн. метрик пока нет."),
        }
    }

    pub fn metric_name(self, field: &str) -> &'static str {
        match (field, self.0) {
            ("mood", Language::En) => "mood",
            ("mood", Language::Ru) => "настроение",
            ("stress", Language::En) => "stress",
            ("stress", Language::Ru) => "стресс",
            ("energy", Language::En) => "energy",
            ("energy", Language::Ru) => "энергия",
            ("productivity", Language::En) => "productivity",
            ("productivity", Language::Ru) => "продуктивность",
            ("sleep_hours", Language::En) => "sleep",
            ("sleep_hours", Language::Ru) => "сон",
            (_, _) => "?",
        }
    }

    pub fn hours_unit(self) -> &'static str {
        self.pick("h", "ч")
    }

    pub fn trend_up(self) -> &'static str {
        self.pick("rising", "растёт")
    }

    pub fn trend_down(self) -> &'static str {
        self.pick("falling", "снижается")
    }

    pub fn trend_flat(self) -> &'static str {
        self.pick("steady", "ровно")
    }

    pub fn chart_caption(self) -> &'static str {
        self.pick(
            "Mood, stress and energy per day",
            "Настроение, стресс и энергия по дням",
        )
    }

    pub fn export_caption(self, entries: usize) -> String {
        match self.0 {
            Language::En => format!("All your entries ({entries}) with their metrics."),
            Language::Ru => format!("Все твои записи ({entries}) с метриками."),
        }
    }

    pub fn delete_confirm(self) -> &'static str {
        self.pick(
            "Delete ALL your entries, metrics and settings? This cannot be undone.",
            "Удалить ВСЕ твои записи, метрики и настройки? Это нельзя отменить.",
        )
    }

    pub fn delete_yes(self) -> &'static str {
        self.pick("Yes, delete everything", "Да, удалить всё")
    }

    pub fn delete_no(self) -> &'static str {
        self.pick("Cancel", "Отмена")
    }

    pub fn deleted(self, entries: u64) -> String {
        match self.0 {
            Language::En => format!("Done: {entries} entries and all your data are deleted."),
            Language::Ru => format!("Готово: удалено записей — {entries}, и все твои данные."),
        }
    }

    pub fn delete_cancelled(self) -> &'static str {
        self.pick("Nothing was deleted.", "Ничего не удалено.")
    }

    pub fn lang_set(self) -> &'static str {
        self.pick(
            "From now on I answer in English.",
            "Теперь я отвечаю по-русски.",
        )
    }

    pub fn lang_usage(self) -> &'static str {
        self.pick(
            "Usage: /lang en or /lang ru",
            "Использование: /lang ru или /lang en",
        )
    }

    pub fn bad_number(self, command: &str, max: u32) -> String {
        match self.0 {
            Language::En => format!("Usage: /{command} [a number from 1 to {max}]"),
            Language::Ru => format!("Использование: /{command} [число от 1 до {max}]"),
        }
    }

    pub fn not_saved(self) -> &'static str {
        self.pick(
            "I could not save this entry (a problem with my storage). Please send it again in a minute.",
            "Не удалось сохранить запись (проблема с хранилищем). Пожалуйста, отправь её ещё раз через минуту.",
        )
    }

    pub fn unknown_command(self) -> &'static str {
        self.pick(
            "I do not know that command; /help lists the ones I have.",
            "Такой команды нет; /help покажет список.",
        )
    }

    pub fn internal_error(self) -> &'static str {
        self.pick(
            "Something went wrong on my side. If you sent an entry, it is safe; please try the command again later.",
            "У меня что-то сломалось. Если ты прислал запись, она в сохранности; попробуй команду позже.",
        )
    }

    // ---- SPEC §10: time zones, streaks, reminders ----

    pub fn tz_current(self, zone: &str, local_time: &str) -> String {
        match self.0 {
            Language::En => format!("Your time zone: {zone} (local time {local_time})."),
            Language::Ru => format!("Твой часовой пояс: {zone} (местное время {local_time})."),
        }
    }

    pub fn tz_how_to_change(self) -> &'static str {
        self.pick(
            "To change it: /tz Europe/Berlin, /tz Berlin, /tz UTC+3 or /tz -5, or share your location (📎 → Location).",
            "Чтобы сменить: /tz Europe/Moscow, /tz Moscow, /tz UTC+3 или /tz -5, либо отправь геопозицию (📎 → Геопозиция).",
        )
    }

    pub fn tz_set(self, zone: &str, local_time: &str) -> String {
        match self.0 {
            Language::En => format!(
                "Time zone set: {zone}. Your local time is {local_time}. Entries you already wrote keep their day."
            ),
            Language::Ru => format!(
                "Часовой пояс установлен: {zone}. Местное время {local_time}. Уже сделанные записи остаются в своих днях."
            ),
        }
    }

    pub fn tz_unknown(self) -> &'static str {
        self.pick(
            "I do not know that time zone, so nothing changed. Examples: /tz Europe/Moscow, /tz Moscow, /tz UTC+3, /tz +05:30, /tz -5.",
            "Не знаю такого часового пояса, ничего не изменилось. Примеры: /tz Europe/Moscow, /tz Moscow, /tz UTC+3, /tz +05:30, /tz -5.",
        )
    }

    pub fn tz_out_of_range(self) -> &'static str {
        self.pick(
            "Offsets go from UTC-12:00 to UTC+14:00, so nothing changed. Examples: /tz UTC+3, /tz -5, /tz +05:30.",
            "Смещения бывают от UTC-12:00 до UTC+14:00, ничего не изменилось. Примеры: /tz UTC+3, /tz -5, /tz +05:30.",
        )
    }

    pub fn tz_ambiguous(self, candidates: &[String]) -> String {
        let list = candidates.join(", ");
        let first = candidates
            .first()
            .map(String::as_str)
            .unwrap_or("Europe/Moscow");
        match self.0 {
            Language::En => format!(
                "Several time zones match: {list}. Send the full name, e.g. /tz {first}. Nothing changed."
            ),
            Language::Ru => format!(
                "Подходит несколько поясов: {list}. Отправь полное имя, например /tz {first}. Ничего не изменилось."
            ),
        }
    }

    pub fn location_unknown(self) -> &'static str {
        self.pick(
            "I could not find a time zone for that place, so nothing changed. Send it as text instead: /tz Europe/Berlin or /tz UTC+3.",
            "Не удалось определить часовой пояс для этого места, ничего не изменилось. Отправь его текстом: /tz Europe/Moscow или /tz UTC+3.",
        )
    }

    pub fn start_tz_invite(self, zone: &str) -> String {
        match self.0 {
            Language::En => format!(
                "Your days follow {zone} for now. Tell me your time zone, so that a late evening counts for the right day: /tz Europe/Berlin, /tz -5, or share your location."
            ),
            Language::Ru => format!(
                "Пока твои дни считаются по {zone}. Укажи свой часовой пояс, чтобы поздний вечер попадал в нужный день: /tz Europe/Moscow, /tz +3 или отправь геопозицию."
            ),
        }
    }

    pub fn streak_note(self, days: u32) -> String {
        match self.0 {
            Language::En => format!("{days} days in a row. Keep it going!"),
            Language::Ru => format!("{days} {} подряд. Так держать!", ru_days(days)),
        }
    }

    pub fn streak_summary(self, current: u32, longest: u32) -> String {
        match self.0 {
            Language::En => format!(
                "Current streak: {current} {}; longest: {longest} {}.",
                en_days(current),
                en_days(longest)
            ),
            Language::Ru => format!(
                "Текущая серия: {current} {} подряд; самая длинная: {longest} {}.",
                ru_days(current),
                ru_days(longest)
            ),
        }
    }

    pub fn remind_set(self, time: &str, zone: &str) -> String {
        match self.0 {
            Language::En => format!(
                "I will remind you at {time} your time ({zone}) on days you have not written yet. /remind off stops it."
            ),
            Language::Ru => format!(
                "Напомню в {time} по твоему времени ({zone}) в те дни, когда записи ещё нет. /remind off — отключить."
            ),
        }
    }

    pub fn remind_show(self, time: &str, zone: &str) -> String {
        match self.0 {
            Language::En => format!(
                "Daily reminder at {time} your time ({zone}), on days without an entry. /remind 21:30 changes it, /remind off stops it."
            ),
            Language::Ru => format!(
                "Ежедневное напоминание в {time} по твоему времени ({zone}), если записи ещё нет. /remind 21:30 — изменить, /remind off — отключить."
            ),
        }
    }

    pub fn remind_none(self) -> &'static str {
        self.pick(
            "No reminder is set. /remind 21:30 sets a daily one at that time, your time.",
            "Напоминание не задано. /remind 21:30 — ежедневное напоминание в это время по твоему часовому поясу.",
        )
    }

    pub fn remind_off(self) -> &'static str {
        self.pick(
            "Reminders are off. /remind 21:30 turns them on again.",
            "Напоминания отключены. /remind 21:30 — включить снова.",
        )
    }

    pub fn remind_usage(self) -> &'static str {
        self.pick(
            "Usage: /remind 21:30 (24-hour, your time), /remind off, or /remind to see it. Nothing changed.",
            "Использование: /remind 21:30 (24 часа, твоё время), /remind off или просто /remind. Ничего не изменилось.",
        )
    }

    /// One of a few reminder texts (`variant` picks, modulo their number).
    pub fn reminder(self, variant: usize) -> &'static str {
        const EN: [&str; 4] = [
            "How was your day? A few lines are enough.",
            "Evening check-in: what stood out today?",
            "Before the day ends: how did it go?",
            "A minute for your journal? Tell me about today.",
        ];
        const RU: [&str; 4] = [
            "Как прошёл день? Хватит пары строк.",
            "Вечерняя заметка: что сегодня запомнилось?",
            "Пока день не закончился: как он прошёл?",
            "Найдётся минута для дневника? Расскажи про сегодня.",
        ];
        match self.0 {
            Language::En => EN[variant % EN.len()],
            Language::Ru => RU[variant % RU.len()],
        }
    }

    pub fn goes_with_title(self) -> &'static str {
        self.pick("What goes with your mood:", "Что связано с настроением:")
    }

    pub fn goes_with_line(self, activity: &str, with: f64, without: f64) -> String {
        match self.0 {
            Language::En => {
                format!("{activity}: mood {with:.1} on those days, {without:.1} without")
            }
            Language::Ru => {
                format!("{activity}: настроение {with:.1} в такие дни, {without:.1} без")
            }
        }
    }

    pub fn streak_none(self) -> &'static str {
        self.pick(
            "No streak yet: write today, and tomorrow makes two.",
            "Серии пока нет: напиши сегодня, а завтра будет уже два дня.",
        )
    }
}

fn en_days(n: u32) -> &'static str {
    if n == 1 { "day" } else { "days" }
}

/// Russian plural of "day": 1 день, 2–4 дня, 5–20 дней, 21 день, …
fn ru_days(n: u32) -> &'static str {
    match (n % 10, n % 100) {
        (_, 11..=14) => "дней",
        (1, _) => "день",
        (2..=4, _) => "дня",
        _ => "дней",
    }
}
