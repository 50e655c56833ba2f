//! The languages the bot speaks. A user's language comes from Telegram's `language_code`
//! and can be changed with `/lang`; the analysis is asked for in it.

use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Language {
    #[default]
    En,
    Ru,
}

impl Language {
    /// The language for a Telegram `language_code` (`ru`, `ru-RU`, `en-GB`, …); English
    /// for anything else.
    pub fn from_code(code: Option<&str>) -> Self {
        code.and_then(|c| c.parse().ok()).unwrap_or_default()
    }

    pub fn code(self) -> &'static str {
        match self {
            Self::En => "en",
            Self::Ru => "ru",
        }
    }

    /// The language's name in English, for prompts.
    pub fn english_name(self) -> &'static str {
        match self {
            Self::En => "English",
            Self::Ru => "Russian",
        }
    }
}

/// A stored code (`users.language`): the language it names, English for anything else.
impl From<String> for Language {
    fn from(code: String) -> Self {
        Self::from_code(Some(&code))
    }
}

impl FromStr for Language {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, ()> {
        let primary = s.trim().split(['-', '_']).next().unwrap_or("");
        match primary.to_ascii_lowercase().as_str() {
            "en" => Ok(Self::En),
            "ru" => Ok(Self::Ru),
            _ => Err(()),
        }
    }
}

impl fmt::Display for Language {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_languages() {
        assert_eq!(Language::from_code(Some("ru-RU")), Language::Ru);
        assert_eq!(Language::from_code(Some("en")), Language::En);
        assert_eq!(Language::from_code(Some("de")), Language::En);
        assert_eq!(Language::from_code(None), Language::En);
    }
}
