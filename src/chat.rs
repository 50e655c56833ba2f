//! `daylog chat`: the journal in a terminal. Each stdin line is a day log of a local
//! user (`--user`), commands work as in Telegram, replies are printed as plain text.
//! Charts and exports are written as files in the working directory. The background
//! worker runs too, so an analysis that had to wait still arrives while the chat is open.

use std::io::{IsTerminal, Write as _};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::Context as _;
use teloxide::utils::command::BotCommands;
use tokio::io::AsyncBufReadExt;
use tokio_util::sync::CancellationToken;

use crate::commands::{self, Command};
use crate::config::Settings;
use crate::journal::{Incoming, Journal, Messenger, Response, SendError, Target};
use crate::llm::Llm;
use crate::render;
use crate::store::Store;
use crate::texts::Texts;
use crate::worker;

/// Prints responses to stdout and writes files into a folder.
pub struct Terminal {
    out: Mutex<Box<dyn std::io::Write + Send>>,
    files: PathBuf,
}

impl Terminal {
    pub fn new(out: Box<dyn std::io::Write + Send>, files: PathBuf) -> Self {
        Self {
            out: Mutex::new(out),
            files,
        }
    }

    fn print(&self, text: &str) -> std::io::Result<()> {
        let mut out = self.out.lock().unwrap_or_else(PoisonError::into_inner);
        writeln!(out, "{text}")?;
        out.flush()
    }

    fn save(&self, name: &str, bytes: &[u8]) -> std::io::Result<PathBuf> {
        let path = self.files.join(name);
        std::fs::write(&path, bytes)?;
        Ok(path)
    }
}

impl Messenger for Terminal {
    async fn send(&self, _target: Target, responses: Vec<Response>) -> Result<(), SendError> {
        let fail = |e: std::io::Error| SendError::Transient(e.to_string());
        for response in responses {
            match response {
                Response::Text(reply) => self
                    .print(&render::to_plain(reply.pieces()))
                    .map_err(fail)?,
                Response::Photo {
                    png,
                    caption,
                    file_name,
                } => {
                    let path = self.save(&file_name, &png).map_err(fail)?;
                    self.print(&format!("[{caption}: {}]", path.display()))
                        .map_err(fail)?;
                }
                Response::Document {
                    bytes,
                    file_name,
                    caption,
                } => {
                    let path = self.save(&file_name, &bytes).map_err(fail)?;
                    self.print(&format!("[{caption} {}]", path.display()))
                        .map_err(fail)?;
                }
                Response::ConfirmDelete { language } => {
                    let texts = Texts(language);
                    self.print(&format!("{} (yes/no)", texts.delete_confirm()))
                        .map_err(fail)?;
                }
            }
        }
        Ok(())
    }

    async fn typing(&self, _chat_id: i64) {}
}

/// Runs the chat until stdin ends.
pub async fn run(settings: Settings, store: Store, user: i64) -> anyhow::Result<()> {
    let settings = Arc::new(settings);
    let client = crate::http_client().context("cannot build the HTTP client")?;
    let llm =
        Arc::new(Llm::with_client(&settings, client).context("cannot set up the LLM providers")?);
    let journal = Arc::new(Journal::new(Arc::clone(&settings), store.clone(), llm));
    let terminal = Arc::new(Terminal::new(
        Box::new(std::io::stdout()),
        std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
    ));
    converse(
        Arc::clone(&journal),
        terminal,
        tokio::io::BufReader::new(tokio::io::stdin()),
        user,
    )
    .await?;
    store.close().await;
    Ok(())
}

/// The conversation loop, over any line source (tests drive it with a byte slice).
pub async fn converse<R>(
    journal: Arc<Journal>,
    terminal: Arc<Terminal>,
    input: R,
    user: i64,
) -> anyhow::Result<()>
where
    R: tokio::io::AsyncBufRead + Unpin,
{
    let stop = CancellationToken::new();
    let worker = tokio::spawn(worker::run(
        Arc::clone(&journal),
        Arc::clone(&terminal),
        stop.clone(),
    ));
    if std::io::stdin().is_terminal() {
        let _ = writeln!(
            std::io::stderr(),
            "daylog chat: write how your day went, one entry per line; /help for commands, Ctrl-D to quit."
        );
    }
    let mut next_message = journal.store.last_message_id(user).await? + 1;
    let mut confirming_delete = false;
    let mut lines = input.lines();
    while let Some(line) = lines.next_line().await.context("cannot read stdin")? {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let target = Target {
            chat_id: user,
            reply_to: None,
        };
        let language = journal.language_of(user).await;
        if confirming_delete {
            confirming_delete = false;
            let reply = if matches!(line.to_lowercase().as_str(), "yes" | "y" | "да" | "д") {
                commands::delete_confirmed(&journal, user, language).await?
            } else {
                render::Reply::new().text(Texts(language).delete_cancelled())
            };
            terminal.send(target, vec![Response::Text(reply)]).await?;
            continue;
        }
        if line.starts_with('/') {
            let responses = match Command::parse(line, "") {
                Ok(command) => commands::respond(&journal, user, command).await?,
                Err(_) => vec![Response::Text(
                    render::Reply::new().text(Texts(language).unknown_command()),
                )],
            };
            confirming_delete = responses
                .iter()
                .any(|r| matches!(r, Response::ConfirmDelete { .. }));
            terminal.send(target, responses).await?;
            continue;
        }
        let incoming = Incoming {
            user_id: user,
            chat_id: user,
            message_id: next_message,
            username: None,
            language_code: None,
            text: line.to_owned(),
        };
        next_message += 1;
        if let Err(error) = journal.on_text(terminal.as_ref(), incoming).await {
            tracing::error!(%error, "entry failed");
            terminal.print(&error.to_string())?;
        }
    }
    stop.cancel();
    let _ = worker.await;
    Ok(())
}
