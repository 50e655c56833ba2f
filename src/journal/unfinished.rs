//! What the worker resumes: logs left pending by an outage or a crash,
//! and answers decided but never delivered. Each is claimed, given its turn in its
//! chat, and finished through the same stages as a new entry.

use std::collections::HashSet;

use crate::cluster::{ChatLease, Leases};
use crate::domain::{Failure, Outcome};
use crate::frontend::Messenger;
use crate::store::{DayLog, Fence, FrontEnd, LogId, LogStatus, StoreError, Unfinished, VoiceNote};

use super::*;

impl Journal {
    /// Completes when a log parked for lack of budget is due (the worker's wake-up).
    pub async fn budget_returned(&self) {
        self.llm.budget_returned().await;
    }

    /// What the worker of `front_end` should finish now, each log claimed for it (logs
    /// a handler is on are left out). Listing and claiming happen under the claim gate,
    /// so a terminal entry is never seen between its insert and its claim.
    /// Each is given its turn in its chat in the order of the logs (oldest first), so a
    /// chat's entries left over by a crash are answered in the order they came.
    pub async fn claim_unfinished(
        &self,
        front_end: FrontEnd,
        limit: i64,
    ) -> Result<Vec<Pickup>, StoreError> {
        Ok(self
            .claim_listed(front_end, None, limit)
            .await?
            .into_iter()
            .map(|(_, pickup)| pickup)
            .collect())
    }

    /// [`Journal::claim_unfinished`] for one instance among several on a database:
    /// each log is finished under its chat's lease as well (in hand, or taken now), so
    /// no two instances analyse or answer one entry; the logs of a chat another live
    /// instance holds are left to that one (their claims and turns let go here).
    pub async fn claim_unfinished_held(
        &self,
        front_end: FrontEnd,
        limit: i64,
        leases: &Leases,
    ) -> Result<Vec<(Pickup, ChatLease)>, StoreError> {
        let listed = self.claim_listed(front_end, None, limit).await?;
        Ok(Self::under_leases(listed, leases).await)
    }

    /// [`Journal::claim_unfinished_held`] for one chat, all its unfinished logs: what a
    /// chat taken over from another instance has left (the other chats' logs are not
    /// touched).
    pub async fn claim_unfinished_in_chat(
        &self,
        front_end: FrontEnd,
        chat_id: i64,
        leases: &Leases,
    ) -> Result<Vec<(Pickup, ChatLease)>, StoreError> {
        let listed = self
            .claim_listed(front_end, Some(chat_id), i64::MAX)
            .await?;
        Ok(Self::under_leases(listed, leases).await)
    }

    /// The claimed logs whose chats' leases this instance holds (or takes now), each
    /// with its lease; the others are let go.
    async fn under_leases(
        listed: Vec<(ChatId, Pickup)>,
        leases: &Leases,
    ) -> Vec<(Pickup, ChatLease)> {
        let mut held = Vec::new();
        let mut elsewhere: HashSet<ChatId> = HashSet::new();
        for (chat, pickup) in listed {
            if elsewhere.contains(&chat) {
                continue;
            }
            match leases.hold(chat.0).await {
                Ok(Some(lease)) => held.push((pickup, lease)),
                Ok(None) => {
                    elsewhere.insert(chat);
                }
                Err(error) => {
                    tracing::warn!(%error, chat_id = chat.0, "cannot take a chat's lease; its logs wait");
                    elsewhere.insert(chat);
                }
            }
        }
        held
    }

    /// Lists and claims (see [`Journal::claim_unfinished`]), each with its chat.
    async fn claim_listed(
        &self,
        front_end: FrontEnd,
        chat_id: Option<i64>,
        limit: i64,
    ) -> Result<Vec<(ChatId, Pickup)>, StoreError> {
        let _listing = self.claim_gate.write().await;
        let batch = match chat_id {
            Some(chat_id) => self.store.unfinished_in_chat(front_end, chat_id).await?,
            None => self.store.unfinished(front_end, limit).await?,
        };
        let now = tokio::time::Instant::now();
        let waiting: HashSet<LogId> = {
            let mut unrecorded = self.unrecorded();
            // Only the logs still unfinished are remembered (a deleted one is not).
            let listed = |id: &LogId| batch.iter().any(|(_, log)| log.id == *id);
            unrecorded.failed.retain(|id, _| listed(id));
            unrecorded.transcripts.retain(listed);
            unrecorded
                .failed
                .iter()
                .filter(|(_, (_, until))| *until > now)
                .map(|(id, _)| *id)
                .collect()
        };
        Ok(batch
            .into_iter()
            .filter(|(_, log)| !waiting.contains(&log.id))
            .filter_map(|(_, log)| {
                let claim = self.claim(log.chat_id, log.message_id)?;
                let turn = self.lanes.take(log.chat_id);
                Some((
                    log.chat_id,
                    Pickup {
                        id: log.id,
                        claim,
                        turn,
                    },
                ))
            })
            .collect())
    }

    /// The worker's try at a pending log: transcribe a recording never transcribed, or
    /// analyse the text again; answered when it succeeds.
    async fn try_unfinished<M: Messenger>(
        &self,
        messenger: &M,
        log: DayLog,
        voice: Option<VoiceNote>,
        author: &Author,
        under: Under<'_>,
    ) -> Result<(), StoreError> {
        let spoken = voice.is_some();
        if let Some(voice) = voice.filter(|_| log.text.is_empty()) {
            // Stored, never transcribed: start from the recording.
            return self
                .transcribe_and_answer(messenger, log, &voice.file_id, author, Timing::Late, under)
                .await;
        }
        let known = Known {
            spoken: Some(spoken),
            new: false,
        };
        self.analyse_and_answer(messenger, log, author, known, Timing::Late, under)
            .await
    }

    /// Finishes one log the worker found (docs/behaviour.md, The life of an entry): analyse a due pending log again, or
    /// send an answer that was decided but never delivered. One that fails on a write
    /// is left alone by [`Journal::claim_unfinished`] for a growing while. Among
    /// instances it is finished under its chat's `lease` (see [`Journal::claim_unfinished_held`]):
    /// nothing is sent, nor written of its outcome and answer, once that is taken over.
    pub async fn finish<M: Messenger>(
        &self,
        messenger: &M,
        pickup: Pickup,
        lease: Option<&ChatLease>,
    ) -> Result<(), StoreError> {
        let id = pickup.id;
        let finished = self.finish_claimed(messenger, pickup, lease).await;
        let mut unrecorded = self.unrecorded();
        if finished.is_err() {
            let tries = unrecorded.failed.get(&id).map_or(0, |(tries, _)| *tries);
            let until = tokio::time::Instant::now() + self.retry_delay(tries);
            unrecorded.failed.insert(id, (tries + 1, until));
        } else {
            unrecorded.failed.remove(&id);
        }
        finished
    }

    async fn finish_claimed<M: Messenger>(
        &self,
        messenger: &M,
        pickup: Pickup,
        lease: Option<&ChatLease>,
    ) -> Result<(), StoreError> {
        let Pickup {
            id,
            claim,
            mut turn,
        } = pickup;
        let under = Under::new(&claim, lease);
        turn.begin().await; // normally begun already (Pickup::wait_turn)
        // Read again under the claim: a handler may have finished it since the worker
        // listed it, and answering twice is what the claim is there to prevent.
        let Some((kind, log)) = self.store.unfinished_one(id).await? else {
            return Ok(());
        };
        let author = self.author_of(log.user_id).await;
        let language = author.language;
        let voice = self.store.voice_note(log.id).await?;
        // A transcript stored before a crash (or a lost delivery) is shown before anything
        // that follows from it.
        if let Some(VoiceNote {
            transcript_sent_at: None,
            ..
        }) = &voice
            && !log.text.is_empty()
            && !self.unrecorded().transcripts.contains(&log.id)
            && !self.show_transcript(messenger, &log, language, under).await
        {
            return self.postpone(&log, under).await;
        }
        match kind {
            Unfinished::Analyse => {
                self.try_or_give_up(messenger, log, voice, &author, under)
                    .await
            }
            Unfinished::Reply if self.unrecorded().replies.contains(&log.id) => {
                // Already delivered by this process: only the record is missing.
                self.record_after_all(log.id, under.fence()).await;
                Ok(())
            }
            Unfinished::Reply => {
                if let Some(outcome) = log.outcome() {
                    self.answer_outcome(messenger, &log, &outcome, &author, Timing::Late, under)
                        .await;
                }
                Ok(())
            }
        }
    }

    /// Records an answer this process sent and could not record then (under the chat's
    /// lease it was sent under, if any).
    async fn record_after_all(&self, id: LogId, fence: Option<Fence>) {
        match self.store.mark_replied_all(&[(id, fence)]).await {
            Ok(taken) if taken.is_empty() => {
                self.unrecorded().replies.remove(&id);
                tracing::info!(log_id = id.get(), "answer recorded after all");
            }
            Ok(_) => {
                // Another instance holds the chat now: the log is its to finish.
                self.unrecorded().replies.remove(&id);
                tracing::warn!(
                    log_id = id.get(),
                    "answer sent, but another instance took the chat over before it was recorded; the new holder may send it once more"
                );
            }
            Err(error) => {
                tracing::debug!(log_id = id.get(), %error, "answer still not recorded");
            }
        }
    }

    /// The worker's try at a pending log. Past `worker.max_age_hours` a log still gets
    /// this try: after a downtime longer than that, or when the first answer after a
    /// long outage makes the backlog due, a provider may well answer now. Only a log
    /// this try leaves pending is given up.
    async fn try_or_give_up<M: Messenger>(
        &self,
        messenger: &M,
        log: DayLog,
        voice: Option<VoiceNote>,
        author: &Author,
        under: Under<'_>,
    ) -> Result<(), StoreError> {
        let age = self.store.log_age(log.id).await?.unwrap_or_default();
        let id = log.id;
        // What the give-up compares with, kept only when it can come to that.
        let tried =
            (age > self.settings.worker.max_age()).then(|| (log.edited_at, log.text.clone()));
        self.try_unfinished(messenger, log, voice, author, under)
            .await?;
        let Some((tried_edit, tried_text)) = tried else {
            return Ok(());
        };
        // Still pending, and still the entry that was tried (a voice note's text is its
        // transcript, stored by the try): one edited during the try is young again (its
        // age counts from the edit), and the next poll analyses its new text.
        let Some(left) = self.store.log(id).await?.filter(|l| {
            l.status == LogStatus::Pending
                && l.edited_at == tried_edit
                && (tried_text.is_empty() || l.text == tried_text)
        }) else {
            return Ok(());
        };
        tracing::warn!(
            log_id = id.get(),
            age_h = age.as_secs() / 3600,
            "giving up on a pending log"
        );
        let gave_up = Outcome::Failed(Failure::GaveUp);
        let fence = under.fence();
        if !self
            .store
            .record_under(id, &left.text, &gave_up, fence.as_ref())
            .await?
        {
            // Edited meanwhile: the new text gets its chance (or the chat was taken over).
            return Ok(());
        }
        self.answer_outcome(messenger, &left, &gave_up, author, Timing::Late, under)
            .await;
        Ok(())
    }
}
