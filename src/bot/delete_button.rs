//! The `/delete` confirmation buttons' callback data, typed: written by
//! [`DeleteButton::data`] and read back by [`DeleteButton::parse`], the one place that
//! knows its text (`delete:yes:<user id>`, `delete:no:<user id>`).

use crate::domain::UserId;

/// What a `/delete` button says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteAnswer {
    Yes,
    No,
}

impl DeleteAnswer {
    fn prefix(self) -> &'static str {
        match self {
            Self::Yes => "delete:yes",
            Self::No => "delete:no",
        }
    }
}

/// One `/delete` button: its answer, and the user who asked (only they may press it;
/// `None` for a button sent before buttons named their user).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeleteButton {
    pub answer: DeleteAnswer,
    pub asked_by: Option<UserId>,
}

impl DeleteButton {
    /// The button `answer` for `asked_by`'s question.
    pub fn new(answer: DeleteAnswer, asked_by: UserId) -> Self {
        Self {
            answer,
            asked_by: Some(asked_by),
        }
    }

    /// The callback data Telegram carries for it.
    pub fn data(self) -> String {
        match self.asked_by {
            Some(user) => format!("{}:{user}", self.answer.prefix()),
            None => self.answer.prefix().to_owned(),
        }
    }

    /// The button whose callback data is `data`; `None` for any other data.
    pub fn parse(data: &str) -> Option<Self> {
        [DeleteAnswer::Yes, DeleteAnswer::No]
            .into_iter()
            .find_map(|answer| {
                let rest = data.strip_prefix(answer.prefix())?;
                let asked_by = match rest {
                    "" => None,
                    _ => Some(rest.strip_prefix(':')?.parse().ok()?),
                };
                Some(Self { answer, asked_by })
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delete_buttons_name_their_user() {
        let button = |answer, asked_by: Option<i64>| {
            Some(DeleteButton {
                answer,
                asked_by: asked_by.map(UserId),
            })
        };
        let table = [
            ("delete:yes:19", button(DeleteAnswer::Yes, Some(19))),
            ("delete:no:-5", button(DeleteAnswer::No, Some(-5))),
            // Buttons sent before they named their user.
            ("delete:yes", button(DeleteAnswer::Yes, None)),
            ("delete:no", button(DeleteAnswer::No, None)),
            ("delete:yes:", None),
            ("delete:yes:x", None),
            ("delete:yesno", None),
            ("delete:maybe:19", None),
            ("", None),
        ];
        for (data, expected) in table {
            assert_eq!(DeleteButton::parse(data), expected, "{data}");
        }
    }

    #[test]
    fn a_button_reads_back_what_it_writes() {
        for answer in [DeleteAnswer::Yes, DeleteAnswer::No] {
            let button = DeleteButton::new(answer, UserId(-1_001_234));
            assert_eq!(DeleteButton::parse(&button.data()), Some(button));
        }
    }
}
