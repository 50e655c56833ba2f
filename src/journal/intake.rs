//! Intake: a new entry is stored before anything else and claimed, then
//! handed back as an [`Accepted`] entry that [`Journal::answer_accepted`] analyses and
//! answers in its turn among the chat's entries. Text, voice notes, edits, and the
//! terminal's entries (numbered by the store, claimed after their insert).

use crate::frontend::{Messenger, Response, Target};
use crate::language::Language;
use crate::render::Reply;
use crate::store::{
    ChatId, DayLog, Inserted, LogId, LogStatus, NewLog, NewUser, NewVoiceLog, StoreError,
    UpdateKey, UserId,
};
use crate::texts::Texts;

use super::*;

impl Journal {
    /// A new text message: store, analyse, answer (docs/behaviour.md, The life of an entry), here and now.
    pub async fn on_text<M: Messenger>(
        &self,
        messenger: &M,
        msg: Incoming,
    ) -> Result<(), EntryError> {
        if let Some(accepted) = self.accept_text(msg).await? {
            self.answer_accepted(messenger, accepted, None).await;
        }
        Ok(())
    }

    /// A new text message, stored (docs/behaviour.md, The life of an entry); `None` when there is nothing to answer
    /// (a re-delivered update, or one being handled right now).
    pub async fn accept_text(&self, msg: Incoming) -> Result<Option<Accepted>, EntryError> {
        self.accept_text_for(msg, None).await
    }

    /// [`Journal::accept_text`] of the inbox's update `update`: it is marked handled in
    /// the transaction that stores the entry.
    pub async fn accept_text_for(
        &self,
        msg: Incoming,
        update: Option<UpdateKey>,
    ) -> Result<Option<Accepted>, EntryError> {
        // Claimed before the insert, so the worker cannot take a log that is seconds old.
        let Some(claim) = self.claim(msg.chat_id, msg.message_id) else {
            return Ok(None); // the same message is being handled right now
        };
        let user = self
            .store
            .upsert_user(&NewUser {
                user_id: msg.user_id,
                username: msg.username.as_deref(),
                language: Language::from_code(msg.language_code.as_deref()),
            })
            .await
            .map_err(EntryError::NotSaved)?;
        let zone = user.timezone.clone();
        let local_day = self.local_day(&zone, msg.sent_at.unwrap_or_else(|| self.now()));
        let author = Author {
            language: user.language(),
            zone,
        };
        let inserted = self
            .store
            .insert_log_for(
                &NewLog {
                    user_id: msg.user_id,
                    chat_id: msg.chat_id,
                    message_id: msg.message_id,
                    text: &msg.text,
                    local_day: Some(local_day),
                    written_at: msg.sent_at,
                },
                update,
            )
            .await
            .map_err(EntryError::NotSaved)?;
        let log = match inserted {
            Inserted::New(log) => {
                crate::observe::entry_stored(crate::observe::EntryKind::Text);
                *log
            }
            Inserted::Duplicate(id) => {
                // A re-delivered update: the first delivery (or the worker) answers.
                tracing::debug!(log_id = id.get(), "duplicate update ignored");
                return Ok(None);
            }
        };
        Ok(Some(self.accepted(
            log,
            author,
            Work::Text(Known::NEW_TEXT),
            claim,
        )))
    }

    /// A voice or audio message: refuse it if too long or too large (nothing stored,
    /// `None`); else store it. Its answer ([`Journal::answer_accepted`]) transcribes it,
    /// shows the transcript, analyses, answers.
    pub async fn accept_voice<M: Messenger>(
        &self,
        messenger: &M,
        voice: IncomingVoice,
    ) -> Result<Option<Accepted>, EntryError> {
        self.accept_voice_for(messenger, voice, None).await
    }

    /// [`Journal::accept_voice`] of the inbox's update `update`, marked handled in the
    /// transaction that stores the note.
    pub async fn accept_voice_for<M: Messenger>(
        &self,
        messenger: &M,
        voice: IncomingVoice,
        update: Option<UpdateKey>,
    ) -> Result<Option<Accepted>, EntryError> {
        let client = Language::from_code(voice.language_code.as_deref());
        let language = self.users.language_or(voice.user_id, client).await;
        if let Some(refusal) = self.voice_refusal(&voice, Texts(language)) {
            tracing::info!(
                chat_id = voice.chat_id.get(),
                duration_s = voice.duration_s,
                file_size = voice.file_size,
                "voice note refused: too long or too large"
            );
            let target = Target::reply(voice.chat_id, voice.message_id);
            let reply = Reply::new().text(refusal);
            if let Err(error) = messenger.send(target, vec![Response::Text(reply)]).await {
                tracing::warn!(%error, chat_id = voice.chat_id.get(), "refusal not delivered");
            }
            return Ok(None);
        }
        let Some(claim) = self.claim(voice.chat_id, voice.message_id) else {
            return Ok(None);
        };
        let user = self
            .store
            .upsert_user(&NewUser {
                user_id: voice.user_id,
                username: voice.username.as_deref(),
                language: Language::from_code(voice.language_code.as_deref()),
            })
            .await
            .map_err(EntryError::NotSaved)?;
        let author = Author {
            language: user.language(),
            zone: user.timezone.clone(),
        };
        let inserted = self
            .store
            .insert_voice_log_for(
                &NewVoiceLog {
                    user_id: voice.user_id,
                    chat_id: voice.chat_id,
                    message_id: voice.message_id,
                    file_id: &voice.file_id,
                    duration_s: voice.duration_s,
                    local_day: Some(
                        self.local_day(&author.zone, voice.sent_at.unwrap_or_else(|| self.now())),
                    ),
                    written_at: voice.sent_at,
                },
                update,
            )
            .await
            .map_err(EntryError::NotSaved)?;
        let log = match inserted {
            Inserted::New(log) => {
                crate::observe::entry_stored(crate::observe::EntryKind::Voice);
                *log
            }
            Inserted::Duplicate(id) => {
                tracing::debug!(log_id = id.get(), "duplicate voice update ignored");
                return Ok(None);
            }
        };
        let work = Work::Voice {
            file_id: voice.file_id,
        };
        Ok(Some(self.accepted(log, author, work, claim)))
    }

    /// An edited message: new text, analysed again. A message never stored is a new log,
    /// unless the user erased their data (`/delete`) after sending it: its entry does
    /// not come back.
    pub async fn accept_edit(&self, msg: Incoming) -> Result<Option<Accepted>, EntryError> {
        self.accept_edit_for(msg, None).await
    }

    /// [`Journal::accept_edit`] of the inbox's update `update`, marked handled in the
    /// transaction that changes (or stores) the entry.
    pub async fn accept_edit_for(
        &self,
        msg: Incoming,
        update: Option<UpdateKey>,
    ) -> Result<Option<Accepted>, EntryError> {
        let Some(log) = self
            .store
            .update_text_for(msg.chat_id, msg.message_id, &msg.text, update)
            .await
            .map_err(EntryError::NotSaved)?
        else {
            if let Some(sent_at) = msg.sent_at
                && self
                    .store
                    .erased_after(msg.user_id, sent_at)
                    .await
                    .map_err(EntryError::NotSaved)?
            {
                tracing::info!(
                    user_id = msg.user_id.get(),
                    "edit of a message sent before the user's /delete; not stored again"
                );
                return Ok(None);
            }
            return self.accept_text_for(msg, update).await;
        };
        tracing::info!(log_id = log.id.get(), "day log edited");
        crate::observe::entry_stored(crate::observe::EntryKind::Edit);
        let Some(claim) = self.claim(msg.chat_id, msg.message_id) else {
            // Its entry waits for its turn (and reads the new text when it comes), or an
            // analysis of the old text is running: that result will not be stored (the
            // text changed), and the claim's holder analyses the new text after it.
            self.mark_edited(msg.chat_id, msg.message_id);
            return Ok(None);
        };
        let author = self.author_of(msg.user_id).await;
        Ok(Some(self.accepted(
            log,
            author,
            Work::Text(Known::default()),
            claim,
        )))
    }

    /// A log just stored and claimed, given its turn in the chat.
    fn accepted(&self, log: DayLog, author: Author, work: Work, claim: Claim) -> Accepted {
        let what = match work {
            Work::Text(_) => "day log stored",
            Work::Voice { .. } => "voice note stored",
        };
        tracing::info!(
            log_id = log.id.get(),
            user_id = log.user_id.get(),
            chars = log.text.chars().count(),
            "{what}"
        );
        let turn = self.lanes.take(log.chat_id);
        Accepted {
            log,
            author,
            work,
            claim,
            turn,
        }
    }

    /// Analyses and answers an accepted entry once the chat's earlier ones are done. A
    /// failure after the store is told to the user here, in the entry's turn. Among
    /// instances it is answered under its chat's `lease`: nothing is sent, nor written
    /// of its outcome and answer, once another instance took the chat over (which then
    /// answers it).
    pub async fn answer_accepted<M: Messenger>(
        &self,
        messenger: &M,
        accepted: Accepted,
        lease: Option<&ChatLease>,
    ) {
        let target = Target::reply(accepted.log.chat_id, accepted.log.message_id);
        let Accepted {
            log,
            author,
            work,
            claim,
            mut turn,
        } = accepted;
        let under = Under::new(&claim, lease);
        let waited = turn.begin().await;
        let id = log.id;
        if let Err(error) = self
            .answer_in_turn(messenger, log, &author, work, under, waited)
            .await
        {
            let error = EntryError::Later(error);
            tracing::error!(%error, chat_id = target.chat_id.get(), "day log handling failed");
            if !under.holds().await {
                tracing::info!(
                    log_id = id.get(),
                    "this instance no longer holds the chat's lease; its new holder answers the log"
                );
                return;
            }
            let reply = Reply::new().text(error.sentence(author.language));
            if let Err(error) = messenger.send(target, vec![Response::Text(reply)]).await {
                tracing::warn!(%error, chat_id = target.chat_id.get(), "reply not delivered");
            }
        }
        drop(turn); // the chat's next entry goes now
    }

    async fn answer_in_turn<M: Messenger>(
        &self,
        messenger: &M,
        mut log: DayLog,
        author: &Author,
        work: Work,
        under: Under<'_>,
        waited: bool,
    ) -> Result<(), StoreError> {
        let claim = under.claim();
        if waited {
            // It waited behind an earlier entry: it may have been edited (the edit could
            // not claim it, and this read has its text) or deleted meanwhile.
            claim.take_edited();
            match self.still_pending(log.id).await? {
                Some(now) => log = now,
                None => return Ok(()),
            }
        }
        let mut known = match work {
            Work::Text(known) => known,
            Work::Voice { file_id } => {
                return self
                    .transcribe_and_answer(messenger, log, &file_id, author, Timing::Live, under)
                    .await;
            }
        };
        loop {
            let id = log.id;
            self.analyse_and_answer(messenger, log, author, known, Timing::Live, under)
                .await?;
            // Edited while it was analysed: the old text's result was not stored, and
            // the new text is answered now, as the edit itself would have been.
            if !claim.take_edited() {
                return Ok(());
            }
            match self.still_pending(id).await? {
                Some(now) => log = now,
                None => return Ok(()),
            }
            known = Known::default();
        }
    }

    /// The log as stored now, if it is still waiting for its analysis (not deleted, not
    /// finished by someone else). Read as written: it was stored moments ago.
    async fn still_pending(&self, id: LogId) -> Result<Option<DayLog>, StoreError> {
        Ok(self
            .store
            .log_as_written(id)
            .await?
            .filter(|log| log.status == LogStatus::Pending))
    }

    /// A line typed in `daylog chat` by its terminal user, stored; the store numbers
    /// terminal entries itself (`source = 'chat'`), so its claim follows
    /// the insert, under the claim gate. `None` when there is nothing to answer.
    pub async fn accept_terminal_text(
        &self,
        user_id: UserId,
        text: &str,
        read_at: jiff::Timestamp,
    ) -> Result<Option<Accepted>, EntryError> {
        let author = self.terminal_author(user_id).await?;
        let local_day = self.local_day(&author.zone, read_at);
        let (log, claim) = {
            let _storing = self.claim_gate.read().await;
            let log = self
                .store
                .insert_chat_log(user_id, text, Some(local_day))
                .await
                .map_err(EntryError::NotSaved)?;
            crate::observe::entry_stored(crate::observe::EntryKind::Text);
            let claim = self.claim(log.chat_id, log.message_id);
            (log, claim)
        };
        Ok(self.accepted_terminal(log, author, Work::Text(Known::NEW_TEXT), claim))
    }

    /// A voice note given to `daylog chat` (`/voice path`): refused as Telegram's are
    /// (told through `messenger`, `None`), else stored; the file is read again from
    /// `voice.file_id` (its path) whenever it is transcribed.
    pub async fn accept_terminal_voice<M: Messenger>(
        &self,
        messenger: &M,
        voice: IncomingVoice,
    ) -> Result<Option<Accepted>, EntryError> {
        let author = self.terminal_author(voice.user_id).await?;
        if let Some(refusal) = self.voice_refusal(&voice, Texts(author.language)) {
            let target = Target::chat(ChatId::private(voice.user_id));
            let reply = Reply::new().text(refusal);
            if let Err(error) = messenger.send(target, vec![Response::Text(reply)]).await {
                tracing::warn!(%error, "refusal not shown");
            }
            return Ok(None);
        }
        let local_day = self.local_day(&author.zone, voice.sent_at.unwrap_or_else(|| self.now()));
        let (log, claim) = {
            let _storing = self.claim_gate.read().await;
            let log = self
                .store
                .insert_chat_voice_log(
                    voice.user_id,
                    &voice.file_id,
                    voice.duration_s,
                    Some(local_day),
                )
                .await
                .map_err(EntryError::NotSaved)?;
            crate::observe::entry_stored(crate::observe::EntryKind::Voice);
            let claim = self.claim(log.chat_id, log.message_id);
            (log, claim)
        };
        let work = Work::Voice {
            file_id: voice.file_id,
        };
        Ok(self.accepted_terminal(log, author, work, claim))
    }

    /// The terminal user, stored if new (English until `/lang`).
    async fn terminal_author(&self, user_id: UserId) -> Result<Author, EntryError> {
        let user = self
            .store
            .upsert_user(&NewUser {
                user_id,
                username: None,
                language: Language::default(),
            })
            .await
            .map_err(EntryError::NotSaved)?;
        Ok(Author {
            language: user.language(),
            zone: user.timezone.clone(),
        })
    }

    /// A terminal entry just stored, with the claim taken after its insert.
    fn accepted_terminal(
        &self,
        log: DayLog,
        author: Author,
        work: Work,
        claim: Option<Claim>,
    ) -> Option<Accepted> {
        let Some(claim) = claim else {
            // A fresh id nobody else can know; should it be taken, its holder answers.
            tracing::warn!(
                log_id = log.id.get(),
                "a new terminal entry was already claimed"
            );
            return None;
        };
        Some(self.accepted(log, author, work, claim))
    }
}
