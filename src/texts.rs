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

    /// Every AI budget is spent for a while: the entry is saved, the analysis comes
    /// when budget returns, in about `minutes`.
    pub fn saved_budget(self, minutes: u64) -> String {
        match self.0 {
            Language::Ru => format!(
                "Сохранено. Бесплатные лимиты AI-сервисов сейчас исчерпаны; разбор придёт примерно через {minutes} мин."
            ),
            Language::En => format!(
                "Saved. The AI services' free limits are used up for now; your analysis should come in about {minutes} minute{}.",
                if minutes == 1 { "" } else { "s" }
            ),
        }
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

    /// `daylog chat`: a line had bytes that are not UTF-8; the rest of it is kept.
    pub fn invalid_bytes_replaced(self) -> &'static str {
        self.pick(
            "This line had bytes that are not valid UTF-8 text; they were replaced with \u{FFFD} and the rest was kept.",
            "В этой строке были байты, которые не являются текстом UTF-8; они заменены на \u{FFFD}, остальное сохранено.",
        )
    }

    /// `daylog chat`: a chart or an export could not be written as a file.
    pub fn file_not_written(self, path: &str, reason: &str) -> String {
        match self.0 {
            Language::En => format!(
                "Could not write the file {path} ({reason}). Nothing else changed; your entries are safe."
            ),
            Language::Ru => format!(
                "Не удалось записать файл {path} ({reason}). Больше ничего не изменилось; записи в сохранности."
            ),
        }
    }

    /// `daylog chat`: after `/delete`, a line that is not "yes" (and not "no").
    pub fn delete_not_confirmed(self) -> &'static str {
        self.pick(
            "Nothing was deleted: only \"yes\" confirms a deletion. Your line is handled as usual.",
            "Ничего не удалено: удаление подтверждает только «да». Твоя строка обработана как обычно.",
        )
    }
}
