//! Telegram's Mini App `initData`, checked as Telegram documents it: the data-check
//! string is every field but `hash` (so `signature` too), sorted by key, `key=value`
//! lines joined by `\n`; the secret is `HMAC_SHA256(key = "WebAppData", message = bot
//! token)`; `hash` is the hex HMAC of the data-check string under that secret, compared
//! in constant time. A duplicate key, a missing `user` or an `auth_date` out of range
//! is refused as well. Nothing here logs: initData is a credential.

use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::domain::UserId;
use crate::language::Language;

type HmacSha256 = Hmac<Sha256>;

/// How far ahead of our clock an `auth_date` may be (clocks differ a little).
const FUTURE_SLACK_S: i64 = 60;

/// Why initData was refused. The API answers every one with the same 401.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("not a query string")]
    Malformed,
    #[error("a key appears twice")]
    DuplicateKey,
    #[error("no hash")]
    NoHash,
    #[error("the hash does not match")]
    BadHash,
    #[error("no auth_date, or not a Unix time")]
    NoAuthDate,
    #[error("too old")]
    Expired,
    #[error("from the future")]
    Future,
    #[error("no user, or a user without a numeric id")]
    NoUser,
}

/// What a valid initData says that daylog uses: who it is (and, for a user the bot
/// has not met yet, their name and language).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    pub user_id: UserId,
    /// When Telegram signed it (Unix seconds).
    pub auth_date: i64,
    pub username: Option<String>,
    pub language: Language,
}

/// The secret key of a bot's initData: `HMAC_SHA256(key = "WebAppData", msg = token)`.
pub fn secret_key(bot_token: &str) -> [u8; 32] {
    let mut mac = HmacSha256::new_from_slice(b"WebAppData").unwrap_or_else(|_| {
        // HMAC takes keys of any length; this branch cannot be taken.
        HmacSha256::new(&Default::default())
    });
    mac.update(bot_token.as_bytes());
    mac.finalize().into_bytes().into()
}

/// The decoded `key=value` pairs of a query string; a key seen twice is refused.
fn pairs(raw: &str) -> Result<Vec<(String, String)>, Refused> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for (key, value) in url::form_urlencoded::parse(raw.as_bytes()) {
        if pairs.iter().any(|(seen, _)| *seen == key) {
            return Err(Refused::DuplicateKey);
        }
        pairs.push((key.into_owned(), value.into_owned()));
    }
    if pairs.is_empty() {
        return Err(Refused::Malformed);
    }
    Ok(pairs)
}

/// The data-check string of `pairs` (without `hash`): sorted, `key=value`, `\n`.
fn data_check_string(pairs: &[(String, String)]) -> String {
    let mut lines: Vec<String> = pairs
        .iter()
        .filter(|(key, _)| key != "hash")
        .map(|(key, value)| format!("{key}={value}"))
        .collect();
    lines.sort();
    lines.join("\n")
}

/// The hex `hash` Telegram would give `pairs` under `secret`.
fn sign(secret: &[u8; 32], pairs: &[(String, String)]) -> [u8; 32] {
    let mut mac = HmacSha256::new_from_slice(secret).unwrap_or_else(|_| {
        // As above: any key length is taken.
        HmacSha256::new(&Default::default())
    });
    mac.update(data_check_string(pairs).as_bytes());
    mac.finalize().into_bytes().into()
}

/// Checks `raw` initData against the bot's `secret` ([`secret_key`]) at `now` (Unix
/// seconds): the signature, then its age, then the user.
pub fn validate(
    raw: &str,
    secret: &[u8; 32],
    now: i64,
    max_age: Duration,
) -> Result<Signed, Refused> {
    let pairs = pairs(raw.trim())?;
    let field = |name: &str| {
        pairs
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    };
    let given = field("hash").ok_or(Refused::NoHash)?;
    let given = hex::decode(given).map_err(|_| Refused::BadHash)?;
    let expected = sign(secret, &pairs);
    if given.len() != expected.len() || !bool::from(given.as_slice().ct_eq(&expected)) {
        return Err(Refused::BadHash);
    }
    let auth_date: i64 = field("auth_date")
        .and_then(|value| value.parse().ok())
        .ok_or(Refused::NoAuthDate)?;
    let max_age = i64::try_from(max_age.as_secs()).unwrap_or(i64::MAX);
    if auth_date > now.saturating_add(FUTURE_SLACK_S) {
        return Err(Refused::Future);
    }
    if now.saturating_sub(auth_date) > max_age {
        return Err(Refused::Expired);
    }
    let user: serde_json::Value = field("user")
        .and_then(|user| serde_json::from_str(user).ok())
        .ok_or(Refused::NoUser)?;
    let id = user["id"].as_i64().ok_or(Refused::NoUser)?;
    Ok(Signed {
        user_id: UserId(id),
        auth_date,
        username: user["username"].as_str().map(str::to_owned),
        language: Language::from_code(user["language_code"].as_str()),
    })
}

/// initData as Telegram would send it for `fields` (in this order), signed with
/// `bot_token`: the test helper, and what `daylog`'s own tests open the page with.
pub fn signed_query(bot_token: &str, fields: &[(&str, &str)]) -> String {
    let pairs: Vec<(String, String)> = fields
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let hash = hex::encode(sign(&secret_key(bot_token), &pairs));
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    for (key, value) in &pairs {
        query.append_pair(key, value);
    }
    query.append_pair("hash", &hash);
    query.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The initData of docs.telegram-mini-apps.com's validation example, signed with a
    /// token of our own (the page's example token has a real token's shape, so it is not
    /// kept here): the hash was computed outside Rust (Python's `hmac`, Telegram's
    /// algorithm), and that same script gives the page's published hash for its token.
    const EXAMPLE: &str = "query_id=AAHdF6IQAAAAAN0XohDhrOrc&user=%7B%22id%22%3A279058397%2C%22first_name%22%3A%22Vladislav%22%2C%22last_name%22%3A%22Kibenko%22%2C%22username%22%3A%22vdkfrost%22%2C%22language_code%22%3A%22ru%22%2C%22is_premium%22%3Atrue%7D&auth_date=1662771648&hash=8ed6af6611a85f760eb5e7b2b16447e8c792d4183911339dcea8b832379320a8";
    const EXAMPLE_TOKEN: &str = "123456:known-answer-token";
    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn the_published_example_is_valid_with_its_token_only() {
        let secret = secret_key(EXAMPLE_TOKEN);
        let now = 1_662_771_648 + 10;
        assert_eq!(
            validate(EXAMPLE, &secret, now, DAY),
            Ok(Signed {
                user_id: UserId(279_058_397),
                auth_date: 1_662_771_648,
                username: Some("vdkfrost".to_owned()),
                language: Language::Ru,
            })
        );
        let other = secret_key("123456:known-answer-tokem");
        assert_eq!(validate(EXAMPLE, &other, now, DAY), Err(Refused::BadHash));
    }

    #[test]
    fn age_future_duplicates_and_missing_fields_are_refused() {
        let secret = secret_key(EXAMPLE_TOKEN);
        assert_eq!(
            validate(EXAMPLE, &secret, 1_662_771_648 + 86_401, DAY),
            Err(Refused::Expired)
        );
        assert_eq!(
            validate(EXAMPLE, &secret, 1_662_771_648 - 61, DAY),
            Err(Refused::Future)
        );
        let doubled = format!("{EXAMPLE}&auth_date=1662771648");
        assert_eq!(
            validate(&doubled, &secret, 1_662_771_650, DAY),
            Err(Refused::DuplicateKey)
        );
        let no_user = signed_query(EXAMPLE_TOKEN, &[("auth_date", "1662771648")]);
        assert_eq!(
            validate(&no_user, &secret, 1_662_771_650, DAY),
            Err(Refused::NoUser)
        );
        let no_hash = EXAMPLE.split("&hash=").next().unwrap_or_default();
        assert_eq!(
            validate(no_hash, &secret, 1_662_771_650, DAY),
            Err(Refused::NoHash)
        );
        assert_eq!(validate("", &secret, 0, DAY), Err(Refused::Malformed));
    }

    #[test]
    fn the_signature_field_is_part_of_the_check() {
        let token = "123456:TEST-token";
        let fields = [
            ("auth_date", "1700000000"),
            ("signature", "abc"),
            ("user", r#"{"id":7,"first_name":"A"}"#),
        ];
        let good = signed_query(token, &fields);
        let secret = secret_key(token);
        assert_eq!(
            validate(&good, &secret, 1_700_000_000, DAY).map(|s| s.user_id),
            Ok(UserId(7))
        );
        let tampered = good.replace("signature=abc", "signature=abd");
        assert_eq!(
            validate(&tampered, &secret, 1_700_000_000, DAY),
            Err(Refused::BadHash)
        );
        let other_user = good.replace("%22id%22%3A7", "%22id%22%3A8");
        assert_ne!(other_user, good);
        assert_eq!(
            validate(&other_user, &secret, 1_700_000_000, DAY),
            Err(Refused::BadHash)
        );
    }
}
