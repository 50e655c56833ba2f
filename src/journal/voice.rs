//! Voice notes: refused before anything is stored when too long or too
//! large; else transcribed (the recording fetched into memory, never written to disk),
//! the transcript shown once, then analysed as text. Each stage leaves what it did in
//! the store, so the worker resumes from there.

use crate::domain::{Failure, Outcome, Wait};
use crate::frontend::{FetchError, MAX_VOICE_BYTES, Messenger, Response, SendError, Target};
use crate::language::Language;
use crate::render::Reply;
use crate::store::{DayLog, LogStatus, StoreError};
use crate::texts::Texts;

use super::reply::with_typing;
use super::*;

/// What became of one transcription round.
enum Transcribed {
    /// The transcript is stored: the log, with it as its text.
    Text(Box<DayLog>),
    /// Not a text: what the store now holds about the log (a wait, or a give-up).
    Decided(Outcome),
    /// Someone else stored a transcript meanwhile (or the log is no longer pending).
    Superseded,
}

impl Journal {
    /// Why a voice note is refused before anything is stored, if it is: longer than
    /// `voice.max_seconds()` or larger than Telegram lets a bot download.
    pub(super) fn voice_refusal(&self, voice: &IncomingVoice, texts: Texts) -> Option<String> {
        let max_seconds = self.settings.voice.max_seconds();
        if voice.duration_s.is_some_and(|d| d > max_seconds) {
            return Some(texts.voice_too_long(max_seconds));
        }
        if voice.file_size.is_some_and(|size| size > MAX_VOICE_BYTES) {
            return Some(texts.voice_too_large().to_owned());
        }
        None
    }

    /// Transcribes a stored voice note, shows the transcript, then analyses it as text.
    /// Each stage leaves what it did in the store, so the worker resumes from there.
    pub(super) async fn transcribe_and_answer<M: Messenger>(
        &self,
        messenger: &M,
        log: DayLog,
        file_id: &str,
        author: &Author,
        timing: Timing,
        under: Under<'_>,
    ) -> Result<(), StoreError> {
        let transcribed = with_typing(
            messenger,
            log.chat_id,
            self.transcribe(messenger, &log, file_id, under),
        )
        .await?;
        match transcribed {
            Transcribed::Text(log) => {
                if !self
                    .show_transcript(messenger, &log, author.language, under)
                    .await
                {
                    // The analysis follows the transcript, never overtakes it.
                    return self.postpone(&log, under).await;
                }
                self.analyse_and_answer(messenger, *log, author, Known::default(), timing, under)
                    .await
            }
            Transcribed::Decided(outcome) => {
                self.answer_outcome(messenger, &log, &outcome, author, timing, under)
                    .await;
                Ok(())
            }
            Transcribed::Superseded => Ok(()),
        }
    }

    /// One transcription round: fetch the recording (in memory), run the cascade, store
    /// the transcript only if the log has none yet.
    async fn transcribe<M: Messenger>(
        &self,
        messenger: &M,
        log: &DayLog,
        file_id: &str,
        under: Under<'_>,
    ) -> Result<Transcribed, StoreError> {
        if !self.llm.can_transcribe() {
            // Not worth a download (up to 20 MB at every try) that nothing can use.
            tracing::warn!(
                log_id = log.id.get(),
                "no transcription provider has a key; voice note stays pending"
            );
            return self
                .wait_for_transcription(log, Wait::NoTranscriber, under)
                .await;
        }
        let audio = match messenger.fetch_audio(file_id).await {
            Ok(audio) => audio,
            Err(FetchError::Gone(reason)) => {
                tracing::warn!(log_id = log.id.get(), %reason, "voice note recording unavailable");
                return self.give_up_voice(log, Failure::RecordingGone, under).await;
            }
            Err(FetchError::Refused(reason)) => {
                // Counted in the log's tries (this one included): a file id Telegram
                // keeps refusing is given up after `voice.fetch_max_tries`, not at the
                // worker's max age.
                let tries = log.attempts.saturating_add(1);
                if tries >= self.settings.voice.fetch_max_tries() {
                    tracing::warn!(log_id = log.id.get(), tries, %reason, "Telegram kept refusing the voice note's recording; given up");
                    return self
                        .give_up_voice(log, Failure::RecordingRefused, under)
                        .await;
                }
                tracing::warn!(log_id = log.id.get(), tries, %reason, "Telegram refused the voice note's recording for now; log stays pending");
                return self
                    .wait_for_transcription(log, Wait::Recording, under)
                    .await;
            }
            Err(FetchError::Transient(reason)) => {
                tracing::warn!(log_id = log.id.get(), %reason, "voice note download failed; log stays pending");
                return self
                    .wait_for_transcription(log, Wait::Recording, under)
                    .await;
            }
        };
        let sink = self.store.call_sink(Some(log.id));
        let transcribed = self.llm.transcribe(&audio, &sink).await;
        super::analyse::keep_spent_budgets(&self.llm, &self.store).await;
        match transcribed {
            Ok(completion) if completion.text.is_empty() => {
                tracing::info!(log_id = log.id.get(), provider = %completion.provider, model = %completion.model, "voice note has no words");
                self.give_up_voice(log, Failure::NoWords, under).await
            }
            Ok(completion) => match self
                .store
                .store_transcript(log.id, &completion.text)
                .await?
            {
                Some(log) => {
                    tracing::info!(log_id = log.id.get(), provider = %completion.provider, model = %completion.model, chars = log.text.chars().count(), "voice note transcribed");
                    Ok(Transcribed::Text(Box::new(log)))
                }
                None => Ok(Transcribed::Superseded),
            },
            Err(error) => {
                tracing::warn!(log_id = log.id.get(), %error, "transcription cascade failed; log stays pending");
                // A refused key is the operator's to fix (the cascade's error names its
                // variable), not an outage to wait out.
                let wait = if error.every_key_refused() {
                    Wait::TranscriberKeysRefused
                } else {
                    Wait::Transcription {
                        refused: error.every_attempt_refused(),
                    }
                };
                self.wait_for_transcription(log, wait, under).await
            }
        }
    }

    /// The voice note waits for its transcription again, on the retry schedule
    /// (superseded when the log moved on meanwhile: edited, answered, or its chat taken
    /// over by another instance).
    async fn wait_for_transcription(
        &self,
        log: &DayLog,
        wait: Wait,
        under: Under<'_>,
    ) -> Result<Transcribed, StoreError> {
        let outcome = Outcome::Waiting {
            wait,
            retry_in: self.retry_delay(log.attempts),
            metrics: None,
        };
        self.decided(log, outcome, under).await
    }

    /// A voice note that can never be transcribed is given up on, with its reason.
    async fn give_up_voice(
        &self,
        log: &DayLog,
        why: Failure,
        under: Under<'_>,
    ) -> Result<Transcribed, StoreError> {
        self.decided(log, Outcome::Failed(why), under).await
    }

    /// `outcome` recorded for the voice note (under its chat's lease): decided, or
    /// superseded when the store did not take it.
    async fn decided(
        &self,
        log: &DayLog,
        outcome: Outcome,
        under: Under<'_>,
    ) -> Result<Transcribed, StoreError> {
        let fence = under.fence();
        Ok(
            if self
                .store
                .record_under(log.id, &log.text, &outcome, fence.as_ref())
                .await?
            {
                Transcribed::Decided(outcome)
            } else {
                Transcribed::Superseded
            },
        )
    }

    /// The worker comes back to this log later without counting an attempt (a
    /// transcript that could not be delivered yet). Nothing when the chat was taken
    /// over meanwhile: its new holder has the log.
    pub(super) async fn postpone(&self, log: &DayLog, under: Under<'_>) -> Result<(), StoreError> {
        if !under.holds().await {
            return Ok(());
        }
        let retry_in = self.settings.worker.retry_min();
        if log.status == LogStatus::Pending {
            self.store.postpone(log.id, retry_in).await
        } else {
            self.store.delay_reply(log.id, retry_in).await
        }
    }

    /// Shows a voice note's transcript as a reply to it, once: it is recorded as shown
    /// when it went out (or never can). `false` when delivery failed for now: then
    /// nothing that follows from the transcript is sent before it.
    pub(super) async fn show_transcript<M: Messenger>(
        &self,
        messenger: &M,
        log: &DayLog,
        language: Language,
        under: Under<'_>,
    ) -> bool {
        if !under.may_send(log).await {
            return false;
        }
        let reply = Reply::new()
            .italic(Texts(language).transcript_title())
            .paragraph()
            .text(&log.text);
        let target = Target::reply(log.chat_id, log.message_id);
        let shown = match messenger.send(target, vec![Response::Text(reply)]).await {
            Ok(()) => true,
            Err(SendError::Gone(reason) | SendError::Refused(reason)) => {
                tracing::warn!(log_id = log.id.get(), %reason, "transcript undeliverable; not retried");
                true
            }
            Err(SendError::Transient(reason)) => {
                tracing::warn!(log_id = log.id.get(), %reason, "transcript not delivered; shown later");
                false
            }
        };
        if shown {
            match self.store.mark_transcript_sent(log.id).await {
                Ok(()) => {
                    self.unrecorded().transcripts.remove(&log.id);
                }
                Err(error) => {
                    tracing::error!(log_id = log.id.get(), %error, "transcript sent but not recorded; it is not sent again");
                    self.unrecorded().transcripts.insert(log.id);
                }
            }
        }
        shown
    }

    /// The key a voice note needs: that of the first transcription step.
    pub(super) fn transcription_key_env(&self) -> String {
        self.first_key_env_of(self.settings.transcription.steps(), "GROQ_API_KEY")
    }
}
