//! Small typed ids, so that a user id, a chat id, a message id, a log id and a digest id
//! cannot be passed for one another (`recent_use(user, log)`, `claim(chat, message)`,
//! `insert_digest(user, chat, …)`, a reply's [`crate::frontend::Target`]). They are
//! built where an id enters daylog (a Telegram update, a row, a button's data) and stay
//! typed from there; the schema stores the plain integers (`sqlx(transparent)`).

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, sqlx::Type,
        )]
        #[sqlx(transparent)]
        pub struct $name(pub i64);

        impl $name {
            /// The integer as stored (and as Telegram numbers it).
            pub const fn get(self) -> i64 {
                self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.fmt(f)
            }
        }

        impl From<$name> for i64 {
            fn from(id: $name) -> i64 {
                id.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = std::num::ParseIntError;

            /// The decimal integer, as [`Display`](std::fmt::Display) writes it.
            fn from_str(text: &str) -> Result<Self, Self::Err> {
                text.parse().map(Self)
            }
        }
    };
}

id_type!(
    /// A Telegram user id (`users.user_id`); a terminal user has one too.
    UserId
);
id_type!(
    /// A Telegram chat id (`day_logs.chat_id`, `users.chat_id`). In a private chat (and
    /// in `daylog chat`) it is the user's id: [`ChatId::private`].
    ChatId
);
id_type!(
    /// A message id within its chat (`day_logs.message_id`); negative for terminal and
    /// imported entries.
    MessageId
);
id_type!(
    /// A day log (`day_logs.id`).
    LogId
);
id_type!(
    /// A weekly digest (`digests.id`).
    DigestId
);

impl ChatId {
    /// The private chat of `user` (Telegram numbers it as the user; so does the
    /// terminal).
    pub const fn private(user: UserId) -> Self {
        Self(user.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_reads_back_what_it_writes() {
        let id = LogId(-42);
        assert_eq!(id.to_string().parse::<LogId>(), Ok(id));
        assert_eq!(i64::from(id), -42);
        assert_eq!(id.get(), -42);
    }

    #[test]
    fn an_id_is_parsed_whole_or_not_at_all() {
        assert!("12x".parse::<UserId>().is_err());
        assert!("".parse::<UserId>().is_err());
        assert!(" 1".parse::<UserId>().is_err());
    }

    #[test]
    fn a_private_chat_is_numbered_as_its_user() {
        assert_eq!(ChatId::private(UserId(7)), ChatId(7));
    }
}
