//! `daylog chat`: the journal in a terminal. Each stdin line is a day log of a local
//! user (`--user`), commands work as in Telegram, replies are printed as plain text.
//! Charts and exports are written as files in the working directory. The background
//! worker runs too, so an analysis that had to wait still arrives while the chat is open.
//! `/voice path/to/note.ogg` journals a recording through the same transcription path as
//! a Telegram voice note; the file is read into memory (again, should the worker resume
//! it), and its path is what the log stores as its `file_id`.
//!
//! Nothing a line does ends the session: bytes that are not UTF-8 are replaced (and the
//! user told), a file that cannot be written and a command that fails get a sentence,
//! and the next line is read. Only the end of stdin, or a stdout that cannot be written
//! any more (no one could read a reply), ends it.

use std::borrow::Cow;
use std::io::{IsTerminal, Write as _};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use teloxide::utils::command::BotCommands;
use tokio::io::AsyncBufReadExt;
use tokio_util::sync::CancellationToken;

use crate::commands::{self, Command};
use crate::digest::Digests;
use crate::domain::{ChatId, MessageId, UserId};
use crate::frontend::{FetchError, MAX_VOICE_BYTES, Messenger, Response, SendError, Target};
use crate::journal::{Accepted, EntryError, IncomingVoice, Journal};
use crate::language::Language;
use crate::llm::Audio;
use crate::render;
use crate::store::{FrontEnd, NewUser};
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

    /// Prints `text`, its lines as they are but for control characters and the marks
    /// that reorder text, which are shown escaped (`\x1b`), as `daylog sql`'s table
    /// does: what users and models wrote never drives the operator's terminal.
    fn print(&self, text: &str) -> std::io::Result<()> {
        let mut out = self.out.lock().unwrap_or_else(PoisonError::into_inner);
        for line in text.split('\n') {
            let line = line.strip_suffix('\r').unwrap_or(line);
            writeln!(out, "{}", crate::sqlcmd::escape_for_terminal(line))?;
        }
        out.flush()
    }

    /// Writes a file into the folder and says where it went, or says plainly that it
    /// could not be written. Only a failure to print is an error.
    fn save(&self, name: &str, bytes: &[u8], label: &str, texts: Texts) -> std::io::Result<()> {
        let path = self.files.join(name);
        match write_whole(&path, bytes) {
            Ok(()) => self.print(&format!("[{label} {}]", path.display())),
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "could not write a file");
                self.print(&texts.file_not_written(&path.display().to_string(), &error.to_string()))
            }
        }
    }

    /// Shows responses: text printed, charts and exports written as files.
    pub fn show(&self, responses: Vec<Response>, language: Language) -> std::io::Result<()> {
        let texts = Texts(language);
        for response in responses {
            match response {
                Response::Text(reply) => self.print(&render::to_plain(reply.pieces()))?,
                Response::Photo {
                    png,
                    caption,
                    file_name,
                } => {
                    self.save(&file_name, &png, &format!("{caption}:"), texts)?;
                }
                Response::Document {
                    bytes,
                    file_name,
                    caption,
                } => self.save(&file_name, &bytes, &caption, texts)?,
                Response::ConfirmDelete { language, .. } => {
                    let texts = Texts(language);
                    self.print(&format!("{} {}", texts.delete_confirm(), texts.yes_no()))?;
                }
                Response::OpenApp { text, url, .. } => self.print(&format!("{text}\n{url}"))?,
            }
        }
        Ok(())
    }
}

/// Writes `path` through a temporary file beside it, renamed over it once complete: a
/// write that fails part-way (a full disk) leaves the earlier file (the user's previous
/// export) whole, and no half-written one.
fn write_whole(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut partial = path.as_os_str().to_owned();
    partial.push(format!(".partial-{}", std::process::id()));
    let partial = PathBuf::from(partial);
    let written = std::fs::write(&partial, bytes).and_then(|()| std::fs::rename(&partial, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written
}

impl Messenger for Terminal {
    async fn send(&self, _target: Target, responses: Vec<Response>) -> Result<(), SendError> {
        // The journal sends only text; a file in it would be named in English.
        self.show(responses, Language::default())
            .map_err(|e| SendError::Transient(e.to_string()))
    }

    async fn typing(&self, _chat_id: ChatId) {}

    /// Replies are printed one after another, quoting nothing: a late one names its entry.
    fn shows_what_a_reply_answers(&self) -> bool {
        false
    }

    async fn fetch_audio(&self, file_id: &str) -> Result<Audio, FetchError> {
        let path = std::path::Path::new(file_id);
        let bytes = read_recording(path).await?;
        Ok(Audio::named(file_id, bytes.into()))
    }
}

/// Reads a recording into memory, refusing one over the download limit before reading.
async fn read_recording(path: &std::path::Path) -> Result<Vec<u8>, FetchError> {
    let gone_or_not = |error: std::io::Error| match error.kind() {
        std::io::ErrorKind::NotFound
        | std::io::ErrorKind::PermissionDenied
        | std::io::ErrorKind::IsADirectory => FetchError::Gone(error.to_string()),
        _ => FetchError::Transient(error.to_string()),
    };
    let size = tokio::fs::metadata(path).await.map_err(gone_or_not)?.len();
    if size > MAX_VOICE_BYTES {
        return Err(FetchError::Gone(format!("{size} bytes, over 20 MB")));
    }
    tokio::fs::read(path).await.map_err(gone_or_not)
}

/// The length of an Ogg (Opus or Vorbis) recording in whole seconds, rounded up: the
/// last page's granule position over the sample rate. `None` for anything else.
pub fn ogg_duration_s(bytes: &[u8]) -> Option<u32> {
    const CAPTURE: &[u8] = b"OggS";
    let rate = if find(bytes, b"OpusHead").is_some() {
        // Opus granule positions always count 48 kHz samples.
        48_000
    } else {
        let at = find(bytes, b"\x01vorbis")? + 7;
        let raw = bytes.get(at + 5..at + 9)?;
        u64::from(u32::from_le_bytes(raw.try_into().ok()?))
    };
    if rate == 0 {
        return None;
    }
    let last = bytes.windows(CAPTURE.len()).rposition(|w| w == CAPTURE)?;
    let granule = bytes.get(last + 6..last + 14)?;
    let samples = u64::from_le_bytes(granule.try_into().ok()?);
    if samples == u64::MAX {
        return None; // a page with no packet end: no position
    }
    u32::try_from(samples.div_ceil(rate)).ok()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Runs the chat on stdin and stdout until stdin ends.
pub async fn run(journal: Arc<Journal>, user: UserId) -> anyhow::Result<()> {
    let terminal = Arc::new(Terminal::new(
        Box::new(std::io::stdout()),
        std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
    ));
    converse(
        journal,
        terminal,
        tokio::io::BufReader::new(tokio::io::stdin()),
        user,
    )
    .await
}

/// The conversation loop, over any byte source (tests drive it with a byte slice).
pub async fn converse<R>(
    journal: Arc<Journal>,
    terminal: Arc<Terminal>,
    mut input: R,
    user: UserId,
) -> anyhow::Result<()>
where
    R: tokio::io::AsyncBufRead + Unpin,
{
    let stop = CancellationToken::new();
    let digests = Digests::of(&journal);
    let worker = tokio::spawn(worker::run(
        Arc::clone(&journal),
        Arc::clone(&digests),
        Arc::clone(&terminal),
        FrontEnd::Terminal { user_id: user },
        None, // its own user's entries only: no chat is another instance's
        stop.clone(),
    ));
    if std::io::stdin().is_terminal() {
        let _ = writeln!(
            std::io::stderr(),
            "daylog chat: write how your day went, one entry per line; /help for commands, Ctrl-D to quit."
        );
    }
    let mut session = Session {
        journal,
        digests,
        terminal,
        user,
        confirming_delete: false,
    };
    let mut raw = Vec::new();
    let talked = loop {
        raw.clear();
        match input.read_until(b'\n', &mut raw).await {
            Ok(0) => break Ok(()),
            Ok(_) => {}
            Err(error) => break Err(anyhow::Error::new(error).context("cannot read stdin")),
        }
        if let Err(error) = session.line(&raw).await {
            break Err(anyhow::Error::new(error).context("cannot write to stdout"));
        }
    };
    stop.cancel();
    let _ = worker.await;
    talked
}

/// One terminal conversation: what the lines so far have left open.
struct Session {
    journal: Arc<Journal>,
    digests: Arc<Digests>,
    terminal: Arc<Terminal>,
    user: UserId,
    /// `/delete` asked for a confirmation; the next line answers it.
    confirming_delete: bool,
}

/// An answer to "delete everything? (yes/no)".
enum Confirmation {
    Yes,
    No,
    /// Anything else: not a confirmation, and a line in its own right.
    Other,
}

impl Confirmation {
    fn of(line: &str) -> Self {
        match line.to_lowercase().as_str() {
            "yes" | "y" | "да" | "д" => Self::Yes,
            "no" | "n" | "нет" | "н" => Self::No,
            _ => Self::Other,
        }
    }
}

impl Session {
    /// Handles one raw line of stdin. An error means stdout is gone.
    async fn line(&mut self, raw: &[u8]) -> std::io::Result<()> {
        // The moment the line was read decides its local day (docs/behaviour.md, Time zones and rhythm).
        let read_at = self.journal.now();
        let decoded = String::from_utf8_lossy(raw);
        let language = self.journal.users().language_of(self.user).await;
        let texts = Texts(language);
        if matches!(decoded, Cow::Owned(_)) {
            tracing::warn!(
                user_id = self.user.get(),
                "stdin line with invalid UTF-8 replaced"
            );
            self.terminal.print(texts.invalid_bytes_replaced())?;
        }
        let line = decoded.trim();
        if line.is_empty() {
            return Ok(());
        }
        if std::mem::take(&mut self.confirming_delete) {
            match Confirmation::of(line) {
                Confirmation::Yes => {
                    let reply =
                        match commands::delete_confirmed(self.journal.store(), self.user, language)
                            .await
                        {
                            Ok(reply) => reply,
                            Err(error) => {
                                tracing::error!(%error, user_id = self.user.get(), "delete failed");
                                render::Reply::new().text(commands::failure_sentence(language))
                            }
                        };
                    return self.terminal.show(vec![Response::Text(reply)], language);
                }
                Confirmation::No => return self.terminal.print(texts.delete_cancelled()),
                Confirmation::Other => self.terminal.print(texts.delete_not_confirmed())?,
            }
        }
        if line.starts_with('/') {
            return self.command(line, language).await;
        }
        let accepted = self
            .journal
            .accept_terminal_text(self.user, line, read_at)
            .await;
        self.answer(accepted, language, "day log handling failed")
            .await
    }

    /// Answers what the journal accepted, or says why it could not store it.
    async fn answer(
        &mut self,
        accepted: Result<Option<Accepted>, EntryError>,
        language: Language,
        failed: &'static str,
    ) -> std::io::Result<()> {
        match accepted {
            Ok(Some(accepted)) => {
                self.journal
                    .answer_accepted(self.terminal.as_ref(), accepted, None)
                    .await;
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(error) => {
                tracing::error!(%error, user_id = self.user.get(), "{failed}");
                self.terminal.print(error.sentence(language))
            }
        }
    }

    /// `/voice path`: a recording journaled like a Telegram voice note.
    async fn voice(&mut self, path: &str, language: Language) -> std::io::Result<()> {
        let texts = Texts(language);
        if path.is_empty() {
            return self.terminal.print(texts.voice_usage());
        }
        let path = std::path::absolute(path).unwrap_or_else(|_| PathBuf::from(path));
        let size = match tokio::fs::metadata(&path).await {
            Ok(meta) if meta.is_file() => meta.len(),
            Ok(_) | Err(_) => {
                return self
                    .terminal
                    .print(&texts.voice_file_unreadable(&path.display().to_string()));
            }
        };
        // Read once here for its length; the journal reads it again to transcribe it, as
        // the worker would after a restart.
        let duration_s = match read_recording(&path).await {
            Ok(bytes) => ogg_duration_s(&bytes),
            Err(_) => None,
        };
        let voice = IncomingVoice {
            user_id: self.user,
            chat_id: ChatId::private(self.user),
            message_id: MessageId(0),
            username: None,
            language_code: None,
            file_id: path.display().to_string(),
            duration_s,
            file_size: Some(size),
            sent_at: Some(self.journal.now()),
        };
        let accepted = self
            .journal
            .accept_terminal_voice(self.terminal.as_ref(), voice)
            .await;
        self.answer(accepted, language, "voice note handling failed")
            .await
    }

    /// `/import path`: a Daylio export read from disk (docs/behaviour.md, Search and
    /// Import): a CSV of at most 10 MB, or a backup as large as Telegram would hand one
    /// over (20 MB: it carries its photos).
    async fn import(&mut self, path: &str, language: Language) -> std::io::Result<()> {
        let texts = Texts(language);
        let too_large = match tokio::fs::metadata(path).await {
            Ok(meta) => meta.len() > crate::import::MAX_DOWNLOAD_BYTES as u64,
            Err(error) => {
                tracing::warn!(%error, user_id = self.user.get(), "import file unreadable");
                return self.terminal.print(&texts.import_file_unreadable(path));
            }
        };
        if too_large {
            return self
                .terminal
                .print(crate::import::ImportError::TooLarge.sentence(language));
        }
        let bytes = match tokio::fs::read(path).await {
            Ok(bytes) => bytes,
            Err(error) => {
                tracing::warn!(%error, user_id = self.user.get(), "import file unreadable");
                return self.terminal.print(&texts.import_file_unreadable(path));
            }
        };
        match crate::import::import_bytes(
            self.journal.store(),
            self.journal.users(),
            self.user,
            &bytes,
        )
        .await
        {
            Ok(report) => self.terminal.print(&report.sentence(language)),
            Err(error) => {
                tracing::warn!(%error, user_id = self.user.get(), "import refused");
                self.terminal.print(&error.sentence(language))
            }
        }
    }

    async fn command(&mut self, line: &str, language: Language) -> std::io::Result<()> {
        let texts = Texts(language);
        // A command may come before any entry: the user must exist for `/lang` to stick.
        let new_user = NewUser {
            user_id: self.user,
            username: None,
            language,
        };
        if let Err(error) = self.journal.users().ensure(&new_user).await {
            tracing::error!(%error, user_id = self.user.get(), "could not store the terminal user");
        }
        if let Some(rest) = line.strip_prefix("/voice")
            && (rest.is_empty() || rest.starts_with(char::is_whitespace))
        {
            return self.voice(rest.trim(), language).await;
        }
        if let Some(rest) = line.strip_prefix("/import")
            && (rest.is_empty() || rest.starts_with(char::is_whitespace))
        {
            if rest.trim().is_empty() {
                // Telegram's usage (a file with the caption) means nothing here.
                return self.terminal.print(Texts(language).import_path_usage());
            }
            return self.import(rest.trim(), language).await;
        }
        let responses = match Command::parse(line, "") {
            // Files come as paths here, not as Telegram's captioned documents.
            Ok(Command::Help) => vec![Response::Text(commands::help(
                language,
                commands::HelpFor::Terminal,
            ))],
            Ok(Command::Week) => {
                let done = self
                    .digests
                    .week(
                        self.terminal.as_ref(),
                        self.user,
                        Target::chat(ChatId::private(self.user)),
                        FrontEnd::Terminal { user_id: self.user },
                    )
                    .await;
                let Err(error) = done else {
                    return Ok(());
                };
                tracing::error!(%error, user_id = self.user.get(), "weekly digest failed");
                vec![Response::Text(
                    render::Reply::new().text(commands::failure_sentence(language)),
                )]
            }
            Ok(command) => match commands::respond(
                self.journal.store(),
                self.journal.users(),
                self.user,
                command,
            )
            .await
            {
                Ok(responses) => responses,
                Err(error) => {
                    tracing::error!(%error, user_id = self.user.get(), "command failed");
                    vec![Response::Text(
                        render::Reply::new().text(commands::failure_sentence(language)),
                    )]
                }
            },
            Err(_) => vec![Response::Text(
                render::Reply::new().text(texts.unknown_command()),
            )],
        };
        self.confirming_delete = responses
            .iter()
            .any(|r| matches!(r, Response::ConfirmDelete { .. }));
        self.terminal.show(responses, language)
    }
}

#[cfg(test)]
mod tests {
    use super::ogg_duration_s;

    /// An Ogg page header: capture pattern, version, flags, granule position, serial,
    /// sequence, checksum (not checked here), one segment of `body`.
    fn page(granule: u64, body: &[u8]) -> Vec<u8> {
        let mut page = b"OggS\x00\x00".to_vec();
        page.extend_from_slice(&granule.to_le_bytes());
        page.extend_from_slice(&[0; 12]);
        page.push(1);
        page.push(u8::try_from(body.len()).unwrap_or(u8::MAX));
        page.extend_from_slice(body);
        page
    }

    #[test]
    fn ogg_duration_is_the_last_granule_over_the_rate() {
        let mut opus = page(0, b"OpusHead\x01\x01\x38\x01\x80\xbb\x00\x00\x00\x00\x00");
        opus.extend(page(48_000 * 3 + 1, b"audio"));
        assert_eq!(ogg_duration_s(&opus), Some(4));

        let mut vorbis = page(0, b"\x01vorbis\x00\x00\x00\x00\x01\x44\xac\x00\x00");
        vorbis.extend(page(44_100 * 2, b"audio"));
        assert_eq!(ogg_duration_s(&vorbis), Some(2));

        assert_eq!(ogg_duration_s(b"RIFF....WAVE"), None);
        assert_eq!(ogg_duration_s(b""), None);
        assert_eq!(ogg_duration_s(b"OpusHead"), None, "no page");
    }

    #[test]
    fn the_fixture_voice_note_lasts_three_seconds() {
        // 2.8 s of speech (espeak-ng, opusenc), rounded up.
        let note = include_bytes!("../tests/fixtures/audio/note.ogg");
        assert_eq!(ogg_duration_s(note), Some(3));
    }
}
