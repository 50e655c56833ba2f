//! What a caller asks of the LLM layer and gets back: the [`Task`] (which cascade), the
//! [`Audio`] to transcribe (a chat request is [`crate::llm_request::ChatRequest`]), and
//! the answer with who gave it ([`Completion`], or [`Parsed`] when the caller said what
//! makes an answer usable).

use std::fmt;

/// Which cascade a request goes through (stored as `llm_calls.task`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Task {
    Analysis,
    Metrics,
    /// Speech to text of a voice note (docs/behaviour.md, Voice notes).
    Transcription,
    /// The weekly digest (docs/behaviour.md, Time zones and rhythm): its own prompt through the analysis steps.
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

/// A recording to transcribe, held in memory only (docs/behaviour.md, Voice notes: the audio is never written
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

/// An answer the caller's parse function accepted, parsed once, and who gave it.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed<T> {
    pub value: T,
    pub provider: String,
    pub model: String,
}

impl From<Parsed<String>> for Completion {
    fn from(parsed: Parsed<String>) -> Self {
        Self {
            text: parsed.value,
            provider: parsed.provider,
            model: parsed.model,
        }
    }
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
