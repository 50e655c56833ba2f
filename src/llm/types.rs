//! The types the rest of daylog uses to talk to the LLM layer.

use std::fmt;

/// Which cascade a request goes through (stored as `llm_calls.task`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Task {
    Analysis,
    Metrics,
    /// Speech to text of a voice note (SPEC §11).
    Transcription,
    /// The weekly digest (SPEC §10): its own prompt through the analysis steps.
    Digest,
}

impl Task {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Analysis => "analysis",
            Self::Metrics => "metrics",
            Self::Transcription => "transcription",
            Self::Digest => "digest",
        }
    }
}

/// One chat request. User text goes only into `user`, never into `system`.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub system: String,
    pub user: String,
    /// Ask for one JSON object (JSON mode where the provider has it).
    pub json: bool,
}

impl ChatRequest {
    /// A cautious estimate of the tokens the request's text takes: a quarter of its
    /// UTF-8 bytes (English runs about four bytes a token, Cyrillic more), plus a few
    /// for the messages' framing. Budgets count it before sending; the answer's `usage`
    /// then says what it took.
    pub fn estimated_tokens(&self) -> u32 {
        let bytes = self.system.len() + self.user.len();
        u32::try_from(bytes.div_ceil(4))
            .unwrap_or(u32::MAX)
            .saturating_add(16)
    }

    /// The tokens its answer is expected to take when the step sets no `max_tokens`:
    /// the metrics' JSON object (eight short fields) or an analysis of a few sentences.
    pub fn expected_answer_tokens(&self) -> u32 {
        if self.json { 128 } else { 256 }
    }
}

/// A recording to transcribe, held in memory only (SPEC §11: the audio is never written
/// to disk). Cloning shares the bytes.
#[derive(Clone, PartialEq)]
pub struct Audio {
    pub bytes: bytes::Bytes,
    /// The name the upload carries (`voice.ogg`); providers tell the format by it.
    pub file_name: String,
    /// `audio/ogg` for Telegram voice notes.
    pub mime: String,
}

impl Audio {
    /// A recording named after the file it came from. Telegram stores voice notes as
    /// `.oga`, which Whisper endpoints do not list: the upload is named `.ogg` (the same
    /// container). The MIME type follows the extension.
    pub fn named(source_name: &str, bytes: bytes::Bytes) -> Self {
        let base = source_name
            .rsplit(['/', '\\'])
            .next()
            .filter(|b| !b.is_empty())
            .unwrap_or("voice.ogg");
        let (stem, ext) = match base.rsplit_once('.') {
            Some((stem, ext)) if !stem.is_empty() => (stem, ext.to_ascii_lowercase()),
            _ => (base, "ogg".to_owned()),
        };
        let ext = if ext == "oga" || ext == "opus" {
            "ogg".to_owned()
        } else {
            ext
        };
        let mime = match ext.as_str() {
            "ogg" => "audio/ogg",
            "mp3" | "mpeg" | "mpga" => "audio/mpeg",
            "m4a" | "mp4" => "audio/mp4",
            "wav" => "audio/wav",
            "flac" => "audio/flac",
            "webm" => "audio/webm",
            _ => "application/octet-stream",
        };
        Self {
            bytes,
            file_name: format!("{stem}.{ext}"),
            mime: mime.to_owned(),
        }
    }
}

impl fmt::Debug for Audio {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Audio")
            .field("bytes", &self.bytes.len())
            .field("file_name", &self.file_name)
            .field("mime", &self.mime)
            .finish()
    }
}

/// A usable answer and who gave it.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub text: String,
    pub provider: String,
    pub model: String,
}

/// The outcome of one attempt, as stored in `llm_calls.outcome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    Ok,
    Retryable,
    BadKey,
    BadRequest,
    Blocked,
    Timeout,
    SkippedCooldown,
    /// The budget of the key (or of every key of the step) is known to be spent: no
    /// request was sent.
    SkippedBudget,
    Unusable,
    /// A hedged attempt that lost the race.
    Cancelled,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Retryable => "retryable",
            Self::BadKey => "bad_key",
            Self::BadRequest => "bad_request",
            Self::Blocked => "blocked",
            Self::Timeout => "timeout",
            Self::SkippedCooldown => "skipped_cooldown",
            Self::SkippedBudget => "skipped_budget",
            Self::Unusable => "unusable",
            Self::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One recorded attempt (a row of `llm_calls`, without the log it belongs to).
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    pub task: Task,
    pub provider: String,
    pub model: String,
    /// Index of the key in the provider's key list; never the key.
    pub key_index: Option<usize>,
    /// 1-based attempt number on this key and step.
    pub attempt: u32,
    pub http_status: Option<u16>,
    pub outcome: Outcome,
    pub latency_ms: u64,
    /// How long the cascade waited before this attempt (backoff, Retry-After).
    pub wait_ms: u64,
    /// A short, key-free description of what went wrong.
    pub error: Option<String>,
}

/// Where the cascade reports attempts. `record` must not block: the store's sink queues.
pub trait AttemptSink: Send + Sync {
    fn record(&self, attempt: Attempt);
}

/// A sink that drops every attempt.
pub struct NullSink;

impl AttemptSink for NullSink {
    fn record(&self, _attempt: Attempt) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audio_is_named_for_the_transcription_upload() {
        let table = [
            ("voice/file_12.oga", "file_12.ogg", "audio/ogg"),
            ("music/file_3.MP3", "file_3.mp3", "audio/mpeg"),
            ("/home/me/notes/today.ogg", "today.ogg", "audio/ogg"),
            ("clip.m4a", "clip.m4a", "audio/mp4"),
            ("noext", "noext.ogg", "audio/ogg"),
            ("", "voice.ogg", "audio/ogg"),
            ("odd.xyz", "odd.xyz", "application/octet-stream"),
        ];
        for (source, name, mime) in table {
            let audio = Audio::named(source, bytes::Bytes::new());
            assert_eq!(
                (audio.file_name.as_str(), audio.mime.as_str()),
                (name, mime),
                "{source}"
            );
        }
    }
}
