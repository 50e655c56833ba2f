//! Everything the bot says, in English and Russian. One function per sentence keeps the
//! two languages side by side, so a new sentence cannot be added in one language only.

use crate::language::Language;

/// The texts of one language.
#[derive(Debug, Clone, Copy)]
pub struct Texts(pub Language);

/// `n` and the English noun that goes with it: "1 entry", "0 entries", "2 entries".
fn count_en(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `n` and the Russian noun form that goes with it: one for 1, 21, 101 (1 запись), few for
/// 2–4, 22–24 (2 записи), many for 0, 5–20, 25–30, 111–114 (5 записей).
fn count_ru(n: u64, one: &str, few: &str, many: &str) -> String {
    let form = match (n % 10, n % 100) {
        (_, 11..=14) => many,
        (1, _) => one,
        (2..=4, _) => few,
        _ => many,
    };
    format!("{n} {form}")
}

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
            "I only keep text entries and voice notes. Tell me about your day in words, or out loud.",
            "Я сохраняю только текстовые записи и голосовые. Расскажи о своём дне словами или голосом.",
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

    /// docs/behaviour.md, The life of an entry: no step of the analysis cascade has a provider with a key, so nothing
    /// can answer until the operator adds one; `key_env` names the first one to add.
    pub fn saved_no_provider(self, key_env: &str) -> String {
        match self.0 {
            Language::En => format!(
                "Saved. No AI provider has a key yet, so nothing can analyse your entry: add {key_env} or another provider's key to .env (`daylog doctor` shows what is set) and start daylog again; your entry is analysed then."
            ),
            Language::Ru => format!(
                "Сохранено. Ни у одного AI-провайдера пока нет ключа, поэтому разобрать запись некому: добавь {key_env} или ключ другого провайдера в .env (`daylog doctor` покажет, что задано) и запусти daylog заново — тогда запись будет разобрана."
            ),
        }
    }

    /// Every provider asked refused the bot's API key (401/403): nothing answers until
    /// the operator fixes it, which the user (often the operator) is told.
    pub fn saved_key_refused(self) -> &'static str {
        self.pick(
            "Saved. The AI provider refused this bot's API key, so nothing can analyse your entry for now: the key in .env needs checking (`daylog doctor --ping` tests each one). Your entry is analysed once daylog starts again with a key that works.",
            "Сохранено. AI-провайдер отклонил API-ключ бота, поэтому разобрать запись пока некому: ключ в .env нужно проверить (`daylog doctor --ping` проверит каждый). Запись будет разобрана, когда daylog запустят снова с рабочим ключом.",
        )
    }

    /// docs/behaviour.md, The life of an entry: the analysis has taken longer than `budgets.notify_after_ms` and is still
    /// on its way.
    pub fn saved_slow(self) -> &'static str {
        self.pick(
            "Saved. The analysis is taking longer than usual; it will follow here as soon as it is ready.",
            "Сохранено. Разбор занимает больше времени, чем обычно; он придёт сюда, как только будет готов.",
        )
    }

    /// Every AI budget is spent for a while: the entry is saved, the analysis comes
    /// when budget returns, in about `wait` ([`Texts::about`]).
    pub fn saved_budget(self, wait: std::time::Duration) -> String {
        let about = self.about(wait);
        match self.0 {
            Language::Ru => format!(
                "Сохранено. Бесплатные лимиты AI-сервисов сейчас исчерпаны; разбор придёт примерно через {about}."
            ),
            Language::En => format!(
                "Saved. The AI services' free limits are used up for now; your analysis should come in about {about}."
            ),
        }
    }

    /// Over `telegram.analyses_per_hour`: the entry waits `wait`, until the limit has
    /// room for it ([`Texts::about`]).
    pub fn saved_rate_limited(self, wait: std::time::Duration) -> String {
        let about = self.about(wait);
        match self.0 {
            Language::Ru => format!(
                "Сохранено. Лимит разборов на этот час исчерпан; эту запись я разберу примерно через {about}."
            ),
            Language::En => format!(
                "Saved. You have reached the hourly number of analyses; this entry will be analysed in about {about}."
            ),
        }
    }

    /// A wait as the sentences above say it: whole minutes, rounded up, at least one;
    /// past 90 minutes (a daily quota spent: up to a day) whole hours, rounded up.
    fn about(self, wait: std::time::Duration) -> String {
        let minutes = wait.as_secs().div_ceil(60).max(1);
        let hours = minutes.div_ceil(60);
        match (self.0, minutes > 90) {
            (Language::Ru, false) => format!("{minutes} мин."),
            (Language::Ru, true) => format!("{hours} ч."),
            (Language::En, false) => count_en(minutes, "minute", "minutes"),
            (Language::En, true) => format!("{hours} hours"),
        }
    }

    /// The title of an analysis that comes later than the entry's first answer: after a
    /// "will follow", but also after a crash or a short budget wait that promised
    /// nothing, so it promises nothing either.
    pub fn late_analysis_title(self) -> &'static str {
        self.pick("Here is your analysis:", "Вот разбор твоей записи:")
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

    /// "3 entries", "1 entry"; "3 записи", "5 записей".
    pub fn entries(self, n: u64) -> String {
        match self.0 {
            Language::En => count_en(n, "entry", "entries"),
            Language::Ru => count_ru(n, "запись", "записи", "записей"),
        }
    }

    /// "7 days", "1 day"; "7 дней", "1 день", "3 дня".
    pub fn days(self, n: u64) -> String {
        match self.0 {
            Language::En => count_en(n, "day", "days"),
            Language::Ru => count_ru(n, "день", "дня", "дней"),
        }
    }

    pub fn stats_period(self, days: u32, entries: i64) -> String {
        let (days, entries) = (self.days(days.into()), self.entries(entries.unsigned_abs()));
        match self.0 {
            Language::En => format!("Last {days}, {entries}"),
            Language::Ru => format!("За {days}: {entries}"),
        }
    }

    pub fn stats_no_data(self, days: u32) -> String {
        let days = self.days(days.into());
        match self.0 {
            Language::En => format!("No metrics in the last {days} yet."),
            Language::Ru => format!("За {days} метрик пока нет."),
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
        self.pick("steady", "стабильно")
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
        let entries = self.entries(entries);
        match self.0 {
            Language::En => format!(
                "Done: {entries} and all your data are deleted. Only the time of this deletion is kept, so that editing an old message does not bring it back."
            ),
            Language::Ru => format!(
                "Готово: {entries} и все твои данные удалены. Сохранено только время удаления — чтобы правка старого сообщения не вернула его обратно."
            ),
        }
    }

    /// An old `/delete` button (from before buttons named their user) pressed in a group.
    pub fn delete_expired(self) -> &'static str {
        self.pick(
            "This question has expired: send /delete again.",
            "Этот вопрос устарел: отправь /delete ещё раз.",
        )
    }

    /// A `/delete` button pressed by someone else than who asked (in a group).
    pub fn delete_not_yours(self) -> &'static str {
        self.pick(
            "Only the person who asked can answer this.",
            "Ответить может только тот, кто спросил.",
        )
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

    pub fn search_usage(self) -> &'static str {
        self.pick(
            "Usage: /search word… — I find your entries that contain every word, in any of its forms.",
            "Использование: /search слово… — я найду твои записи, где есть все эти слова в любой форме.",
        )
    }

    pub fn search_none(self) -> &'static str {
        self.pick(
            "None of your entries contains all of these words.",
            "Ни в одной твоей записи нет всех этих слов.",
        )
    }

    /// `shown` of `matched` entries (`or_more`: the count stopped there).
    pub fn search_title(self, shown: usize, matched: usize, or_more: bool) -> String {
        let all_shown = !or_more && shown == matched;
        let matched = match (self.0, or_more) {
            (_, false) => matched.to_string(),
            (Language::En, true) => format!("{matched} or more"),
            (Language::Ru, true) => format!("{matched} и больше"),
        };
        match (self.0, all_shown) {
            (Language::En, true) => format!("Found: {matched} (best matches first)"),
            (Language::Ru, true) => format!("Нашлось: {matched} (сначала самые подходящие)"),
            (Language::En, false) => format!("Found: {matched}; here are the {shown} best"),
            (Language::Ru, false) => format!("Нашлось: {matched}; вот {shown} самых подходящих"),
        }
    }

    pub fn year_usage(self) -> &'static str {
        self.pick(
            "Usage: /year for this year, or /year 2026 for another one (four digits).",
            "Использование: /year — этот год, /year 2026 — другой (четыре цифры).",
        )
    }

    pub fn year_caption(self, year: i32) -> String {
        match self.0 {
            Language::En => format!("Your {year} in pixels — a square per day, coloured by mood"),
            Language::Ru => {
                format!("Твой {year} год в пикселях — по квадрату на день, цвет по настроению")
            }
        }
    }

    pub fn not_saved(self) -> &'static str {
        self.pick(
            "I could not save this entry (a problem with my storage). Please send it again in a minute.",
            "Не удалось сохранить запись (проблема с хранилищем). Пожалуйста, отправь её ещё раз через минуту.",
        )
    }

    /// An update that could not be committed to the inbox (a full disk): it was not
    /// confirmed to Telegram, which gives it again, and it is taken once it can be stored.
    pub fn not_saved_yet(self) -> &'static str {
        self.pick(
            "I could not save this entry yet (a problem with my storage). No need to send it again: I will take it automatically as soon as I can.",
            "Пока не удалось сохранить эту запись (проблема с хранилищем). Отправлять заново не нужно: я приму её автоматически, как только смогу.",
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

    // ---- docs/behaviour.md, Time zones and rhythm: time zones, streaks, reminders ----

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
        let days = self.days(days.into());
        match self.0 {
            Language::En => format!("{days} in a row. Keep it going!"),
            Language::Ru => format!("{days} подряд. Так держать!"),
        }
    }

    pub fn streak_summary(self, current: u32, longest: u32) -> String {
        let (current, longest) = (self.days(current.into()), self.days(longest.into()));
        match self.0 {
            Language::En => format!("Current streak: {current}; longest: {longest}."),
            Language::Ru => format!("Текущая серия: {current} подряд; самая длинная: {longest}."),
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

    /// Said after `/remind` or `/digest` written in a group.
    /// The chat menu button that opens the Mini App (one text for every language:
    /// the default button has no language).
    pub fn app_menu_button(self) -> &'static str {
        self.pick("Journal", "Дневник")
    }

    pub fn app_open(self) -> &'static str {
        self.pick(
            "Your journal as a page: the calendar, charts, search and settings.",
            "Твой дневник одной страницей: календарь, графики, поиск и настройки.",
        )
    }

    pub fn app_button(self) -> &'static str {
        self.pick("Open the journal", "Открыть дневник")
    }

    pub fn app_off(self) -> &'static str {
        self.pick(
            "The journal page is not set up on this bot.",
            "Страница дневника у этого бота не настроена.",
        )
    }

    pub fn app_in_group(self) -> &'static str {
        self.pick(
            "The journal page opens in our private chat: open a chat with me and send /app there.",
            "Страница дневника открывается в личном чате: открой чат со мной и отправь там /app.",
        )
    }

    /// What the page shows after asking the bot for the export or the deletion.
    pub fn app_sent_to_chat(self) -> &'static str {
        self.pick(
            "Done: look in our chat with the bot.",
            "Готово: загляни в чат с ботом.",
        )
    }

    pub fn app_chat_unreachable(self) -> &'static str {
        self.pick(
            "The bot could not write to you: open the chat with it, press Start, and try again.",
            "Бот не смог тебе написать: открой чат с ним, нажми «Старт» и попробуй ещё раз.",
        )
    }

    pub fn scheduled_in_private_chat(self) -> &'static str {
        self.pick(
            "Reminders and the weekly digest come in our private chat, not in this group. If you have not yet, open a chat with me and press Start.",
            "Напоминания и недельный обзор приходят в личный чат, а не в эту группу. Если ещё не начинал, открой чат со мной и нажми «Старт».",
        )
    }

    pub fn remind_usage(self) -> &'static str {
        self.pick(
            "Usage: /remind 21:30 (24-hour, your time), /remind off, or /remind to see it. Nothing changed.",
            "Использование: /remind 21:30 (24 часа, твоё время), /remind off или просто /remind. Ничего не изменилось.",
        )
    }

    /// One of a few reminder texts (`variant` picks, modulo their number).
    /// The daily reminder; `evening` unless its time is in the day (from the day's
    /// start to 17:00), when a sentence about the evening or the day's end is untrue.
    pub fn reminder(self, variant: usize, evening: bool) -> &'static str {
        const EN_DAY: [&str; 2] = [
            "How is your day going? A few lines are enough.",
            "A minute for your journal? Tell me how the day is going.",
        ];
        const RU_DAY: [&str; 2] = [
            "Как проходит день? Хватит пары строк.",
            "Найдётся минута для дневника? Расскажи, как проходит день.",
        ];
        if !evening {
            return match self.0 {
                Language::En => EN_DAY[variant % EN_DAY.len()],
                Language::Ru => RU_DAY[variant % RU_DAY.len()],
            };
        }
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

    // ---- voice notes (docs/behaviour.md, Voice notes) ----

    /// A voice note over `voice.max_seconds`: refused, nothing stored.
    pub fn voice_too_long(self, max_seconds: u32) -> String {
        let minutes = max_seconds.div_ceil(60);
        match self.0 {
            Language::En => format!(
                "Sorry, this voice note is too long for me: I take notes of up to {minutes} min. Nothing was saved; please send a shorter one, or split it in two."
            ),
            Language::Ru => format!(
                "Извини, это голосовое слишком длинное: я принимаю до {minutes} мин. Ничего не сохранено; пришли покороче или раздели его на два."
            ),
        }
    }

    /// A voice note over Telegram's 20 MB download limit: refused, nothing stored.
    pub fn voice_too_large(self) -> &'static str {
        self.pick(
            "Sorry, this recording is larger than the 20 MB I can download. Nothing was saved; please send a shorter one.",
            "Извини, эта запись больше 20 МБ, которые я могу скачать. Ничего не сохранено; пришли покороче.",
        )
    }

    /// Above the transcript sent back to the user.
    pub fn transcript_title(self) -> &'static str {
        self.pick("I heard:", "Я услышал:")
    }

    /// The voice note is saved but could not be transcribed yet.
    pub fn saved_voice_pending(self) -> &'static str {
        self.pick(
            "Saved your voice note. The transcription service is not answering right now; the transcript and your analysis will follow as soon as it is back.",
            "Голосовое сохранено. Сервис расшифровки сейчас не отвечает; расшифровка и разбор придут, как только он заработает.",
        )
    }

    /// Telegram has not handed over the recording yet: no transcription service is at
    /// fault, and the bot tries again by itself.
    pub fn saved_voice_fetch_pending(self) -> &'static str {
        self.pick(
            "Saved your voice note. Telegram has not handed me the recording yet; I will keep trying, and the transcript and your analysis will follow.",
            "Голосовое сохранено. Telegram пока не отдал мне запись; я попробую ещё, и расшифровка с разбором придут следом.",
        )
    }

    /// docs/behaviour.md, The life of an entry for a voice note: no transcription step has a key; `key_env` names the
    /// first one to add.
    pub fn saved_voice_no_provider(self, key_env: &str) -> String {
        match self.0 {
            Language::En => format!(
                "Saved your voice note. No speech-to-text provider has a key yet, so nothing can turn it into text: add {key_env} to .env (`daylog doctor` shows what is set) and start daylog again; it is transcribed and analysed then."
            ),
            Language::Ru => format!(
                "Голосовое сохранено. Ни у одного сервиса расшифровки пока нет ключа, поэтому превратить его в текст некому: добавь {key_env} в .env (`daylog doctor` покажет, что задано) и запусти daylog заново — тогда оно будет расшифровано и разобрано."
            ),
        }
    }

    /// Every transcription step refused the recording itself (most often a format it
    /// cannot read); the note is kept and tried again.
    pub fn saved_voice_refused(self) -> &'static str {
        self.pick(
            "Saved your voice note, but the transcription service refused this recording (most often a format it cannot read). I will try again later; a voice message recorded in Telegram always works.",
            "Голосовое сохранено, но сервис расшифровки не принял эту запись (чаще всего это формат, который он не читает). Попробую ещё раз позже; голосовое сообщение, записанное в Telegram, читается всегда.",
        )
    }

    /// Every transcription provider asked refused the bot's API key (401/403): not an
    /// outage, the operator must fix the key; `key_env` names the first one to check.
    pub fn saved_voice_key_refused(self, key_env: &str) -> String {
        match self.0 {
            Language::En => format!(
                "Saved your voice note. The speech-to-text provider refused this bot's transcription key, so nothing can turn it into text for now: {key_env} in .env needs checking (`daylog doctor --ping` tests each key). Your voice note is transcribed and analysed once daylog starts again with a key that works."
            ),
            Language::Ru => format!(
                "Голосовое сохранено. Сервис расшифровки отклонил ключ бота для расшифровки, поэтому превратить его в текст пока некому: {key_env} в .env нужно проверить (`daylog doctor --ping` проверит каждый ключ). Голосовое будет расшифровано и разобрано, когда daylog запустят снова с рабочим ключом."
            ),
        }
    }

    /// Telegram kept refusing to hand over the recording (`voice.fetch_max_tries`
    /// tries): the note is given up, the user asked to send it again.
    pub fn voice_fetch_refused(self) -> &'static str {
        self.pick(
            "I saved your voice note, but Telegram kept refusing to hand me the recording, so I could not fetch it and there is no transcript. Please send it again (or tell me about your day in words).",
            "Я сохранил голосовое, но Telegram так и не отдал мне запись, поэтому скачать её не получилось и расшифровки нет. Пришли его ещё раз (или расскажи о дне текстом).",
        )
    }

    /// The recording cannot be fetched any more (deleted, or the file is gone).
    pub fn voice_unavailable(self) -> &'static str {
        self.pick(
            "I saved your voice note but can no longer download the recording, so there is no transcript for it. Please tell me about your day again, in words or a new voice note.",
            "Я сохранил голосовое, но больше не могу скачать запись, поэтому расшифровки не будет. Расскажи о дне ещё раз — текстом или новым голосовым.",
        )
    }

    /// `daylog chat`: the answers its delete question takes.
    pub fn yes_no(self) -> &'static str {
        self.pick("(yes/no)", "(да/нет)")
    }

    /// `daylog chat`: `/import` without a path.
    pub fn import_path_usage(self) -> &'static str {
        self.pick(
            "Usage: /import path/to/daylio.csv (a Daylio export: Settings → Export entries → CSV)",
            "Как пользоваться: /import путь/к/daylio.csv (экспорт Daylio: Настройки → Экспорт записей → CSV)",
        )
    }

    /// `daylog chat`'s `/help`: how `/import` works there (a path, not a document).
    pub fn help_import_in_terminal(self) -> &'static str {
        self.pick(
            "Bring in a Daylio CSV export from a file: /import path/to/file.csv",
            "Перенести экспорт Daylio (CSV) из файла: /import путь/к/файлу.csv",
        )
    }

    /// `daylog chat`'s `/help`: the terminal's own `/voice`.
    pub fn help_voice_in_terminal(self) -> &'static str {
        self.pick(
            "A recording from a file, journaled like a voice note: /voice path/to/note.ogg",
            "Запись из файла — как голосовое: /voice путь/к/записи.ogg",
        )
    }

    /// `daylog chat`: the line above a late answer (a backlog resumed at start-up, an
    /// analysis that had to wait), naming the entry it answers: when it was written and
    /// its first words (`None`: a voice note with no transcript).
    pub fn answering_entry(self, when: &str, first_words: Option<&str>) -> String {
        match (self.0, first_words) {
            (Language::En, Some(words)) => format!("About your entry of {when}, “{words}”:"),
            (Language::En, None) => format!("About your voice note of {when}:"),
            (Language::Ru, Some(words)) => format!("О записи от {when}, «{words}»:"),
            (Language::Ru, None) => format!("О голосовом от {when}:"),
        }
    }

    /// `daylog chat`: `/voice` without a path.
    pub fn voice_usage(self) -> &'static str {
        self.pick(
            "Usage: /voice path/to/note.ogg",
            "Как пользоваться: /voice путь/к/записи.ogg",
        )
    }

    /// `daylog chat`: `/voice` with a path that is not a readable file.
    pub fn voice_file_unreadable(self, path: &str) -> String {
        match self.0 {
            Language::En => format!("Cannot read the recording {path}: nothing was saved."),
            Language::Ru => format!("Не могу прочитать запись {path}: ничего не сохранено."),
        }
    }

    /// A voice note given up on without a transcript (the transcription services stayed
    /// away, or the recording could not be read): there is no text to point to.
    pub fn voice_failed(self) -> &'static str {
        self.pick(
            "I could not turn your voice note into text, so there is nothing of it to analyse or keep. Please tell me about your day again, in words or a new voice note.",
            "Мне не удалось превратить голосовое в текст, поэтому разбирать и хранить нечего. Расскажи о дне ещё раз — текстом или новым голосовым.",
        )
    }

    /// The transcription heard no words in a voice note (silence, noise).
    pub fn voice_no_words(self) -> &'static str {
        self.pick(
            "I saved your voice note, but I could not make out any words in it. Please try again, a little closer to the microphone, or write to me.",
            "Я сохранил голосовое, но не смог разобрать в нём ни слова. Попробуй ещё раз, чуть ближе к микрофону, или напиши текстом.",
        )
    }

    pub fn import_usage(self) -> &'static str {
        self.pick(
            "Send your Daylio export (Settings → Export entries → CSV) or its backup file (.daylio, which knows the level of moods you renamed or added) as a file with the caption /import, or right after /import. Entries come in with their own dates and moods; sending the same file again adds nothing.",
            "Пришли экспорт Daylio (Настройки → Экспорт записей → CSV) или файл резервной копии (.daylio — в нём уровень переименованных и своих настроений) файлом с подписью /import или сразу после /import. Записи придут со своими датами и настроением; повторная отправка того же файла ничего не добавит.",
        )
    }

    /// The three numbers of an import (docs/behaviour.md, Search and Import).
    pub fn import_done(
        self,
        imported: u64,
        already: u64,
        unreadable: u64,
        first_line: Option<u64>,
    ) -> String {
        let line = first_line.map_or(String::new(), |line| match self.0 {
            Language::En => format!(" (first on line {line})"),
            Language::Ru => format!(" (первая в строке {line})"),
        });
        match self.0 {
            Language::En => format!(
                "Imported: {imported}. Already there: {already}. Unreadable: {unreadable}{line}."
            ),
            Language::Ru => format!(
                "Перенесено: {imported}. Уже были: {already}. Не прочитано: {unreadable}{line}."
            ),
        }
    }

    /// The zone an import's times were read in, and how to change it; `retimed`: entries
    /// already there whose times were read again in it.
    pub fn import_zone(self, zone: &str, retimed: u64) -> String {
        match (self.0, retimed) {
            (Language::En, 0) => format!(
                "Times were read in {zone}; if that is not your time zone, set it with /tz and send the file again."
            ),
            (Language::Ru, 0) => format!(
                "Время прочитано в поясе {zone}; если он не твой, укажи его через /tz и пришли файл ещё раз."
            ),
            (Language::En, _) => format!(
                "Times were read in {zone}: {} already there now have their times in it.",
                self.entries(retimed)
            ),
            (Language::Ru, _) => format!(
                "Время прочитано в поясе {zone}: у уже перенесённых записей ({retimed}) время исправлено."
            ),
        }
    }

    /// An import refused as a whole (larger than 10 MB); nothing was imported.
    pub fn import_too_large(self) -> &'static str {
        self.pick(
            "This file is larger than 10 MB, so nothing was imported.",
            "Файл больше 10 МБ, поэтому ничего не перенесено.",
        )
    }

    /// An import refused as a whole because it is not UTF-8: Daylio writes UTF-8, so
    /// the file was most likely opened and saved again (Excel on Windows does this).
    pub fn import_not_utf8(self) -> &'static str {
        self.pick(
            "This file is not UTF-8 text, so nothing was imported. Daylio writes UTF-8: if the export was opened and saved again (Excel does this), send the file Daylio made, or save it as \"CSV UTF-8\".",
            "Этот файл не в кодировке UTF-8, поэтому ничего не перенесено. Daylio сохраняет UTF-8: если экспорт открывали и сохраняли заново (так делает Excel), пришли файл, который сделал Daylio, или сохрани его как «CSV UTF-8».",
        )
    }

    /// An import refused as a whole (not CSV, not Daylio's header).
    pub fn import_not_daylio(self) -> &'static str {
        self.pick(
            "This is not a Daylio CSV export, so nothing was imported.",
            "Это не CSV-экспорт Daylio, поэтому ничего не перенесено.",
        )
    }

    /// An import refused as a whole (no row has a readable date and time).
    pub fn import_no_readable_row(self) -> &'static str {
        self.pick(
            "No row of this file has a date and time I can read, so nothing was imported.",
            "Ни в одной строке файла не читаются дата и время, поэтому ничего не перенесено.",
        )
    }

    /// A write failed after `imported` entries of the file were stored.
    pub fn import_failed_part_way(self, imported: u64) -> String {
        let entries = self.entries(imported);
        match self.0 {
            Language::En => format!(
                "The import could not be saved to the end: {entries} came in, the rest did not. Please send the file again later; what is already there is not imported twice."
            ),
            Language::Ru => format!(
                "Перенос не удалось сохранить до конца: добавлено {entries}, остальное нет. Пришли файл ещё раз позже — то, что уже есть, не добавится дважды."
            ),
        }
    }

    /// A CSV's mood names whose level it does not give (custom or renamed moods): their
    /// entries came in without a mood; the backup file has every mood's level.
    pub fn import_unknown_moods(self, names: &[String]) -> String {
        const SHOWN: usize = 10;
        let mut list = names
            .iter()
            .take(SHOWN)
            .map(|name| format!("\"{name}\""))
            .collect::<Vec<_>>()
            .join(", ");
        if names.len() > SHOWN {
            list.push_str(", …");
        }
        match self.0 {
            Language::En => format!(
                "These moods are not Daylio's default names, so their entries came in without a mood: {list}. Daylio's backup file (Settings → Backup & Restore → Export backup, a .daylio file) knows every mood's level: send it the same way, and those entries get their moods without being doubled."
            ),
            Language::Ru => format!(
                "Эти настроения — не стандартные названия Daylio, поэтому их записи перенесены без настроения: {list}. В файле резервной копии Daylio (Настройки → Резервное копирование → Экспорт, файл .daylio) есть уровень каждого настроения: пришли его так же, и эти записи получат настроение, не задвоившись."
            ),
        }
    }

    /// A zip sent to `/import` that is not a Daylio backup.
    pub fn import_not_backup(self) -> &'static str {
        self.pick(
            "This zip file is not a Daylio backup, so nothing was imported.",
            "Этот zip-файл — не резервная копия Daylio, ничего не перенесено.",
        )
    }

    /// A backup whose data would unpack past what daylog reads (a zip bomb, or none).
    pub fn import_backup_too_large(self) -> &'static str {
        self.pick(
            "This backup unpacks to far more than a Daylio journal holds, so it was not read and nothing was imported.",
            "Эта резервная копия распаковывается в гораздо больший объём, чем бывает у дневника Daylio, поэтому она не прочитана и ничего не перенесено.",
        )
    }

    pub fn import_failed(self) -> &'static str {
        self.pick(
            "The import could not be saved; nothing was imported. Please try again later.",
            "Не удалось сохранить перенос, ничего не добавлено. Попробуй позже.",
        )
    }

    pub fn import_download_failed(self) -> &'static str {
        self.pick(
            "I could not download the file from Telegram; nothing was imported. Please send it again.",
            "Не удалось скачать файл из Telegram, ничего не перенесено. Пришли его ещё раз.",
        )
    }

    pub fn import_file_unreadable(self, path: &str) -> String {
        match self.0 {
            Language::En => format!("Cannot read the file {path}."),
            Language::Ru => format!("Не получается прочитать файл {path}."),
        }
    }

    // ---- weekly digest (docs/behaviour.md, Time zones and rhythm) ----

    /// The heading of a digest: the 7 local days it covers.
    pub fn digest_title(self, first: &str, last: &str) -> String {
        match self.0 {
            Language::En => format!("Your week, {first} – {last}"),
            Language::Ru => format!("Твоя неделя, {first} – {last}"),
        }
    }

    pub fn digest_chart_caption(self) -> &'static str {
        self.pick("Your week", "Твоя неделя")
    }

    pub fn week_empty(self) -> &'static str {
        self.pick(
            "There are no entries in the last 7 days yet, so there is nothing to look back on. Write a few lines about today and try /week again in a few days.",
            "За последние 7 дней записей пока нет, так что оглядываться не на что. Напиши пару строк про сегодня и загляни в /week через несколько дней.",
        )
    }

    pub fn digest_will_follow(self) -> &'static str {
        self.pick(
            "The AI services are not answering right now. Your weekly digest is saved and will follow as soon as one is back.",
            "ИИ-сервисы сейчас не отвечают. Недельный обзор сохранён и придёт, как только один из них снова заработает.",
        )
    }

    /// A `/week` digest that was to follow could not be written within
    /// `worker.max_age_hours`.
    pub fn digest_given_up(self) -> &'static str {
        self.pick(
            "Sorry: the AI services stayed away too long, so this week's digest was not written. Your entries are all saved; send /week to try again.",
            "Извини: ИИ-сервисы слишком долго не отвечали, и обзор этой недели так и не был написан. Все записи сохранены; отправь /week, чтобы попробовать снова.",
        )
    }

    pub fn digest_on_its_way(self) -> &'static str {
        self.pick(
            "Your weekly digest is being written; it comes in a moment.",
            "Недельный обзор уже пишется и вот-вот придёт.",
        )
    }

    pub fn digest_refused(self) -> &'static str {
        self.pick(
            "The AI refused to write this week's digest. Your entries are all saved; /stats 7 shows your week.",
            "ИИ отказался писать обзор этой недели. Все записи сохранены; /stats 7 покажет неделю.",
        )
    }

    /// `after_midnight`: the time is before the day's start, so Sunday's moment is in the
    /// night into Monday (a 00:30 reminder's Sunday ends then).
    pub fn digest_on(self, time: &str, zone: &str, after_midnight: bool) -> String {
        match (self.0, after_midnight) {
            (Language::En, false) => format!(
                "The weekly digest is on: every Sunday at {time} your time ({zone}), when the week has at least 2 entries. /digest off stops it."
            ),
            (Language::En, true) => format!(
                "The weekly digest is on: every Sunday night at {time} your time ({zone}), Monday by the calendar, when the week has at least 2 entries. /digest off stops it."
            ),
            (Language::Ru, false) => format!(
                "Недельный обзор включён: каждое воскресенье в {time} по твоему времени ({zone}), если за неделю есть хотя бы 2 записи. /digest off — отключить."
            ),
            (Language::Ru, true) => format!(
                "Недельный обзор включён: каждую ночь с воскресенья на понедельник в {time} по твоему времени ({zone}), если за неделю есть хотя бы 2 записи. /digest off — отключить."
            ),
        }
    }

    pub fn digest_off(self) -> &'static str {
        self.pick(
            "The weekly digest is off. /digest on sends it every Sunday; /week shows one now.",
            "Недельный обзор отключён. /digest on — присылать по воскресеньям; /week — обзор сейчас.",
        )
    }

    pub fn digest_usage(self) -> &'static str {
        self.pick(
            "Usage: /digest on, /digest off, or /digest to see it. Nothing changed.",
            "Использование: /digest on, /digest off или просто /digest. Ничего не изменилось.",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reminder_in_the_day_says_nothing_of_the_evening() {
        for language in [Language::En, Language::Ru] {
            for variant in 0..4 {
                let said = Texts(language).reminder(variant, false).to_lowercase();
                for evening in ["evening", "day ends", "вечер", "закончился"] {
                    assert!(!said.contains(evening), "{said}");
                }
            }
        }
        assert!(Texts(Language::En).reminder(1, true).contains("Evening"));
    }

    #[test]
    fn russian_counts_take_one_of_three_forms() {
        let ru = Texts(Language::Ru);
        for (n, form) in [
            (0, "записей"),
            (1, "запись"),
            (2, "записи"),
            (4, "записи"),
            (5, "записей"),
            (11, "записей"),
            (12, "записей"),
            (14, "записей"),
            (20, "записей"),
            (21, "запись"),
            (22, "записи"),
            (25, "записей"),
            (101, "запись"),
            (111, "записей"),
            (112, "записей"),
            (122, "записи"),
        ] {
            assert_eq!(ru.entries(n), format!("{n} {form}"));
        }
        assert_eq!(ru.days(1), "1 день");
        assert_eq!(ru.days(3), "3 дня");
        assert_eq!(ru.days(7), "7 дней");
    }

    #[test]
    fn english_counts_are_singular_only_for_one() {
        let en = Texts(Language::En);
        assert_eq!(en.entries(0), "0 entries");
        assert_eq!(en.entries(1), "1 entry");
        assert_eq!(en.entries(2), "2 entries");
        assert_eq!(en.entries(21), "21 entries");
        assert_eq!(en.days(1), "1 day");
        assert_eq!(en.days(30), "30 days");
    }

    #[test]
    fn a_wait_for_budget_is_said_in_minutes_then_in_hours() {
        use std::time::Duration;
        let (en, ru) = (Texts(Language::En), Texts(Language::Ru));
        assert!(
            en.saved_budget(Duration::from_secs(30))
                .contains("in about 1 minute.")
        );
        assert!(
            en.saved_budget(Duration::from_secs(90 * 60))
                .contains("in about 90 minutes.")
        );
        // A daily quota spent at 00:10 UTC comes back in 23 h 50 min.
        let a_day = Duration::from_secs(23 * 3600 + 50 * 60);
        assert!(
            en.saved_budget(a_day).contains("in about 24 hours."),
            "{}",
            en.saved_budget(a_day)
        );
        assert!(ru.saved_budget(a_day).contains("примерно через 24 ч."));
    }

    #[test]
    fn counted_sentences_agree_with_their_numbers() {
        let (en, ru) = (Texts(Language::En), Texts(Language::Ru));
        assert_eq!(en.stats_period(1, 1), "Last 1 day, 1 entry");
        assert_eq!(en.stats_period(7, 5), "Last 7 days, 5 entries");
        assert_eq!(ru.stats_period(7, 3), "За 7 дней: 3 записи");
        assert_eq!(ru.stats_period(21, 21), "За 21 день: 21 запись");
        assert!(
            en.deleted(1)
                .starts_with("Done: 1 entry and all your data are deleted.")
        );
        assert!(
            ru.deleted(5)
                .starts_with("Готово: 5 записей и все твои данные удалены.")
        );
        assert_eq!(en.stats_no_data(1), "No metrics in the last 1 day yet.");
        assert_eq!(ru.stats_no_data(2), "За 2 дня метрик пока нет.");
    }
}
