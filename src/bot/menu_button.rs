//! The Mini App's two doors in Telegram (docs/operations.md, The Mini App): the chat
//! menu button, set at start-up to open the page when `webapp.url` is set and back to
//! Telegram's default when it is not; and the `web_app` button `/app` answers with.

use teloxide::RequestError;
use teloxide::prelude::*;
use teloxide::types::{
    InlineKeyboardButton, InlineKeyboardMarkup, MenuButton, ReplyParameters, WebAppInfo,
};

use super::{TgBot, with_retry_after};
use crate::language::Language;
use crate::texts::Texts;

/// Sets the bot's default menu button (every private chat without its own): the page
/// at `url`, or Telegram's default when the Mini App is off. A failure is logged, not
/// fatal: the `/app` command still opens the page.
pub async fn set_menu_button<B: TgBot>(bot: &B, url: Option<&url::Url>) {
    let button = match url {
        Some(url) => MenuButton::WebApp {
            text: Texts(Language::En).app_menu_button().to_owned(),
            web_app: WebAppInfo { url: url.clone() },
        },
        None => MenuButton::Default,
    };
    let on = url.is_some();
    match with_retry_after("setChatMenuButton", || {
        bot.set_chat_menu_button()
            .menu_button(button.clone())
            .into_future()
    })
    .await
    {
        Ok(_) => tracing::info!(mini_app = on, "chat menu button set"),
        Err(error) => tracing::warn!(%error, "could not set the chat menu button"),
    }
}

/// `/app`'s answer in a private chat: `text` with a button that opens `url`.
pub(super) async fn send_open_app<B: TgBot>(
    bot: &B,
    chat: ChatId,
    text: &str,
    button: &str,
    url: &str,
    reply: Option<ReplyParameters>,
) -> Result<(), RequestError> {
    let Ok(url) = url::Url::parse(url) else {
        tracing::error!("the Mini App's URL does not parse; sending the sentence alone");
        bot.send_message(chat, text).await?;
        return Ok(());
    };
    let keyboard =
        InlineKeyboardMarkup::new([[InlineKeyboardButton::web_app(button, WebAppInfo { url })]]);
    with_retry_after("sendMessage", || {
        let mut request = bot.send_message(chat, text).reply_markup(keyboard.clone());
        if let Some(r) = reply.clone() {
            request = request.reply_parameters(r);
        }
        request.into_future()
    })
    .await?;
    Ok(())
}
