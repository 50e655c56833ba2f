//! The page's own words, English and Russian side by side (as `texts` keeps the bot's),
//! handed to the page once as JSON inside its HTML. Everything about the user's data
//! the page shows comes from the API, in the user's language.

/// `(key, English, Russian)`.
const LABELS: &[(&str, &str, &str)] = &[
    ("title", "Journal", "Дневник"),
    ("tab_journal", "Journal", "Записи"),
    ("tab_calendar", "Calendar", "Год"),
    ("tab_charts", "Charts", "Графики"),
    ("tab_search", "Search", "Поиск"),
    ("tab_settings", "Settings", "Настройки"),
    ("loading", "Loading…", "Загрузка…"),
    (
        "no_entries",
        "No entries yet: write to the bot how your day went.",
        "Записей пока нет: напиши боту, как прошёл день.",
    ),
    (
        "streak",
        "Days in a row: {n} (longest {m})",
        "Дней подряд: {n} (рекорд {m})",
    ),
    (
        "goes_with_title",
        "What goes with good days",
        "Что бывает в хорошие дни",
    ),
    (
        "day_none",
        "No entries on this day.",
        "В этот день записей нет.",
    ),
    (
        "chart_scores",
        "Mood, stress, energy",
        "Настроение, стресс, энергия",
    ),
    ("chart_sleep", "Sleep", "Сон"),
    ("days", "{n} days", "{n} дней"),
    ("search_placeholder", "Words to find", "Слова для поиска"),
    ("search_none", "Nothing found.", "Ничего не нашлось."),
    ("search_found", "Found: {n}", "Найдено: {n}"),
    ("zone", "Time zone", "Часовой пояс"),
    (
        "zone_hint",
        "Europe/Berlin or UTC+3",
        "Europe/Moscow или UTC+3",
    ),
    ("reminder", "Daily reminder", "Ежедневное напоминание"),
    ("reminder_hint", "21:30, or off", "21:30 или off"),
    ("language", "Language", "Язык"),
    ("digest", "Sunday digest", "Воскресный обзор"),
    ("save", "Save", "Сохранить"),
    ("on", "on", "вкл"),
    ("off", "off", "выкл"),
    (
        "export",
        "Send me my data as CSV",
        "Прислать мои данные в CSV",
    ),
    ("delete", "Delete all my data…", "Удалить все мои данные…"),
    (
        "delete_ask",
        "The bot will ask you in the chat to confirm; nothing is deleted before you press the button there. Go on?",
        "Бот спросит подтверждение в чате; ничего не удаляется, пока ты не нажмёшь кнопку там. Продолжить?",
    ),
    (
        "no_auth",
        "This page opens from the bot: use the menu button in your chat with it, or send /app.",
        "Эта страница открывается из бота: нажми кнопку меню в чате с ним или отправь /app.",
    ),
    (
        "error",
        "Something went wrong; try again.",
        "Что-то пошло не так; попробуй ещё раз.",
    ),
];

/// The labels as `{"en": {…}, "ru": {…}}`, safe inside a `<script>` element.
pub fn json() -> String {
    let pick = |english: bool| {
        LABELS
            .iter()
            .map(|(key, en, ru)| {
                (
                    (*key).to_owned(),
                    serde_json::Value::from(if english { *en } else { *ru }),
                )
            })
            .collect::<serde_json::Map<_, _>>()
    };
    let all = serde_json::json!({ "en": pick(true), "ru": pick(false) });
    all.to_string().replace('<', "\\u003c")
}

#[cfg(test)]
mod tests {
    #[test]
    fn labels_are_json_that_cannot_close_the_script() {
        let text = super::json();
        assert!(!text.contains('<'));
        let value: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!(value["ru"]["save"], "Сохранить");
        assert_eq!(
            value["en"].as_object().map(|o| o.len()),
            value["ru"].as_object().map(|o| o.len())
        );
    }
}
