//! The LLM layer: provider clients (one file per wire format behind the `wire` trait),
//! the errors, the decision table and the resilient cascade (docs/behaviour.md, The cascade). It does not know
//! about the store: attempts are reported through an [`AttemptSink`].
//!
//! [`Llm`] is built once per process from [`Settings`] and shared (`Arc<Llm>`): it owns
//! the one HTTP client, the providers with their keys and concurrency limits, the steps
//! of each task, the cooldown registry every request consults and the latencies that
//! set each step's hedging threshold.

mod anthropic;
mod attempt;
mod budget;
pub mod budget_hint;
mod cascade;
mod cooldown;
mod decision;
pub mod error;
mod gemini;
mod hedge;
mod openai;
mod provider;
mod retry;
pub mod retry_after;
mod state;
mod task;
mod wake;
mod wire;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;

pub use crate::llm_request::ChatRequest;
pub use attempt::{Attempt, AttemptSink, NullSink, Outcome};
pub use budget::{BudgetLeft, SpentBudget};
pub use error::{AttemptError, CascadeError, LlmError};
pub use hedge::LatencySample;
pub use state::{Admission, Admitted, Cooled, Learned, SharedLimits, TokensAsk, UNCHECKED_WAIT};
pub use task::{Audio, Completion, Parsed, Task};

use crate::config::{Settings, StepSettings};
use crate::domain::ModelRef;
use budget::Budgets;
use cascade::{Engine, Step};
use cooldown::{Cooldowns, StepId};
use hedge::Hedging;
use provider::Provider;
use retry::RetryPolicy;
use state::{LocalState, SharedState};
use wake::Alarms;
use wire::{Call, Input};

/// The LLM layer of one process. `Send + Sync`; share it as `Arc<Llm>`.
pub struct Llm {
    client: reqwest::Client,
    providers: BTreeMap<String, Arc<Provider>>,
    analysis: Vec<Step>,
    metrics: Vec<Step>,
    transcription: Vec<Step>,
    /// The first configured model of each provider, for `ping`.
    ping_models: BTreeMap<String, String>,
    policy: RetryPolicy,
    /// Cooldowns and budgets, shared by every request.
    state: LocalState,
    hedging: Hedging,
    spill_after: std::time::Duration,
    /// When logs parked for lack of budget are due: what wakes the worker.
    alarms: Alarms,
}

impl fmt::Debug for Llm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let steps = |steps: &[Step]| -> Vec<String> {
            steps
                .iter()
                .map(|s| format!("{}/{}", s.id.provider, s.id.model))
                .collect()
        };
        f.debug_struct("Llm")
            .field("providers", &self.providers.values().collect::<Vec<_>>())
            .field("analysis", &steps(&self.analysis))
            .field("metrics", &steps(&self.metrics))
            .field("transcription", &steps(&self.transcription))
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Llm {
    /// How long one task's cascade may take at most (`retry.deadline_ms`).
    pub fn deadline(&self) -> std::time::Duration {
        self.policy.deadline
    }

    /// Builds the layer with its own HTTP client (rustls). Logs once, as a warning, each
    /// provider a cascade step needs that has no key and will therefore be skipped.
    pub fn new(settings: &Settings) -> Result<Self, LlmError> {
        let client = reqwest::Client::builder()
            .use_rustls_tls()
            .connect_timeout(settings.retry.request_timeout())
            .build()
            .map_err(|e| LlmError::Client(e.without_url().to_string()))?;
        Self::with_client(settings, client)
    }

    /// Builds the layer around an existing client (the process's one client, or a test's).
    pub fn with_client(settings: &Settings, client: reqwest::Client) -> Result<Self, LlmError> {
        let providers: BTreeMap<String, Arc<Provider>> = settings
            .providers
            .iter()
            .map(|(name, p)| {
                let provider = Provider::new(name, p, settings.keys(name));
                (name.clone(), Arc::new(provider))
            })
            .collect();
        let mut ping_models = BTreeMap::new();
        for step in settings
            .analysis
            .steps()
            .iter()
            .chain(settings.metrics.steps())
        {
            ping_models
                .entry(step.provider().to_owned())
                .or_insert_with(|| step.model().to_owned());
        }
        let transcribes = |name: &String| {
            settings
                .transcription
                .steps()
                .iter()
                .any(|s| s.provider() == *name)
        };
        for (name, provider) in &providers {
            if !provider.usable() && (ping_models.contains_key(name) || transcribes(name)) {
                tracing::warn!(
                    provider = %name,
                    key_env = %provider.key_env,
                    "no API key for this provider: its cascade steps are skipped"
                );
            }
        }
        let mut numbers: BTreeMap<(String, String), usize> = BTreeMap::new();
        let analysis = usable_steps(settings.analysis.steps(), &providers, &mut numbers);
        let metrics = usable_steps(settings.metrics.steps(), &providers, &mut numbers);
        let transcription = usable_steps(settings.transcription.steps(), &providers, &mut numbers);
        let hedging = Hedging::new(
            settings.retry.hedge_after(),
            settings.retry.request_timeout(),
            numbers.len(),
        );
        Ok(Self {
            client,
            providers,
            analysis,
            metrics,
            transcription,
            ping_models,
            policy: RetryPolicy::new(&settings.retry),
            state: LocalState {
                cooldowns: Cooldowns::new(
                    settings.cooldown.duration(),
                    settings.cooldown.failures_to_trip(),
                ),
                budgets: Budgets::new(
                    settings
                        .providers
                        .iter()
                        .map(|(name, p)| (name.clone(), p.budget().clone()))
                        .collect(),
                ),
                remote: None,
            },
            hedging,
            spill_after: settings.budgets.spill_after(),
            alarms: Alarms::default(),
        })
    }

    /// The same layer, sharing its budgets, learned limits and cooldowns with other
    /// instances through `limits` (the store on PostgreSQL): every request is checked
    /// and counted there before it is sent (docs/behaviour.md, Several instances).
    #[must_use]
    pub fn sharing(mut self, limits: Arc<dyn SharedLimits>) -> Self {
        self.state.remote = Some(state::Remote::new(limits));
        self
    }

    /// Runs one task through its cascade. Every attempt is reported to `sink`.
    pub async fn run(
        &self,
        task: Task,
        request: &ChatRequest,
        sink: &dyn AttemptSink,
    ) -> Result<Completion, CascadeError> {
        self.run_excluding(task, request, sink, &[]).await
    }

    /// [`Llm::run`] without the models in `refused`: those that refused
    /// this request's log on content policy before (docs/behaviour.md, The cascade). When no other step is
    /// left, the task ends as [`CascadeError::Blocked`] without sending anything.
    pub async fn run_excluding(
        &self,
        task: Task,
        request: &ChatRequest,
        sink: &dyn AttemptSink,
        refused: &[ModelRef],
    ) -> Result<Completion, CascadeError> {
        let any_text = |text: &str| Ok::<_, Infallible>(text.to_owned());
        self.run_parsed(task, request, sink, refused, any_text)
            .await
            .map(Completion::from)
    }

    /// [`Llm::run_excluding`] for an answer of a given form: `parse` says what makes an
    /// answer usable (the metrics: one JSON object) and is the one place it is parsed.
    /// An answer it refuses is recorded as `unusable`, with its error as the reason, and
    /// the next model is asked.
    pub async fn run_parsed<T, E: fmt::Display>(
        &self,
        task: Task,
        request: &ChatRequest,
        sink: &dyn AttemptSink,
        refused: &[ModelRef],
        parse: impl Fn(&str) -> Result<T, E> + Sync,
    ) -> Result<Parsed<T>, CascadeError> {
        let steps = match task {
            Task::Analysis | Task::Digest => &self.analysis,
            Task::Metrics => &self.metrics,
            // A chat request has no audio; the transcription steps never see one.
            Task::Transcription => return Err(CascadeError::NoUsableProvider),
        };
        let parse = |text: &str| parse(text).map_err(|reason| reason.to_string());
        cascade::run(
            self.engine(),
            steps,
            task,
            Input::Chat(request),
            &parse,
            sink,
            refused,
        )
        .await
    }

    /// Whether any transcription step has a provider with a key.
    pub fn can_transcribe(&self) -> bool {
        !self.transcription.is_empty()
    }

    /// Transcribes a voice note through the `[[transcription.steps]]` cascade, with the
    /// retries, rounds, cooldowns and hedging of every other task (docs/behaviour.md, Voice notes).
    pub async fn transcribe(
        &self,
        audio: &Audio,
        sink: &dyn AttemptSink,
    ) -> Result<Completion, CascadeError> {
        cascade::run(
            self.engine(),
            &self.transcription,
            Task::Transcription,
            Input::Audio(audio),
            &|text| Ok(text.to_owned()),
            sink,
            &[],
        )
        .await
        .map(Completion::from)
    }

    fn engine(&self) -> Engine<'_> {
        Engine {
            client: &self.client,
            policy: &self.policy,
            state: &self.state,
            hedging: &self.hedging,
            spill_after: self.spill_after,
        }
    }

    /// One tiny request with each of the provider's keys to its first configured model,
    /// for `daylog doctor --ping`. Reaching the model and being accepted is success, even
    /// if the tiny answer is empty or filtered; a 2xx that is not the provider's API is
    /// not.
    pub async fn ping(&self, provider: &str) -> Vec<KeyPing> {
        let Some(p) = self.providers.get(provider) else {
            return vec![KeyPing::about_provider(LlmError::UnknownProvider(
                provider.to_owned(),
            ))];
        };
        let slots = p.key_slots();
        if slots.is_empty() {
            return vec![KeyPing::about_provider(LlmError::MissingKey {
                provider: provider.to_owned(),
                key_env: p.key_env.clone(),
            })];
        }
        let Some(model) = self.ping_models.get(provider) else {
            return vec![KeyPing::about_provider(LlmError::NoModel(
                provider.to_owned(),
            ))];
        };
        let request = ChatRequest {
            system: String::new(),
            user: "ping".to_owned(),
            json: false,
        };
        let call = Call {
            model,
            max_tokens: Some(16),
            temperature: None,
            request: &request,
            count_tokens: false,
        };
        let mut pings = Vec::with_capacity(slots.len());
        for slot in slots {
            let key = p.key(slot);
            let answer = p
                .complete(&self.client, key, &call, self.policy.request_timeout)
                .await;
            pings.push(KeyPing {
                key: slot
                    .zip(key)
                    .map(|(index, key)| (index, key.origin().to_owned())),
                // A refusal on content policy, or an empty answer (a thinking model
                // spends 16 tokens before its first word), is still the model
                // answering; a 2xx that is not the API at all (a proxy's page, a wrong
                // `base_url`) is not.
                answer: answer.map(|_| ()).or_else(|error| match error {
                    LlmError::Blocked { .. } => Ok(()),
                    LlmError::Unusable { .. } if !error.is_not_the_api() => Ok(()),
                    other => Err(other),
                }),
            });
        }
        pings
    }

    /// How long until some step of `task` has budget again, when none has it now
    /// (`None`: some step has budget, or a step is held back by something else).
    pub fn budget_wait(&self, task: Task) -> Option<std::time::Duration> {
        self.budget_wait_excluding(task, &[])
    }

    /// [`Llm::budget_wait`] for one log, leaving out the models in `refused`
    /// that refused it: they will not be asked again, so their budget is not
    /// what the log waits for.
    pub fn budget_wait_excluding(
        &self,
        task: Task,
        refused: &[ModelRef],
    ) -> Option<std::time::Duration> {
        let steps = match task {
            Task::Analysis | Task::Digest => &self.analysis,
            Task::Metrics => &self.metrics,
            Task::Transcription => &self.transcription,
        };
        let now = tokio::time::Instant::now();
        let mut soonest: Option<tokio::time::Instant> = None;
        let asked = steps
            .iter()
            .filter(|step| !refused.iter().any(|r| step.id.is(r)));
        for step in asked {
            // Its turn: the requests already waiting for the same budget go first.
            // Tokens are left out: the wait for any request, not for one of a given size
            // (the analysis steps shipped declare no tokens per minute).
            let (until, _) = self
                .state
                .step_turn(&step.id, &step.provider.key_slots(), 0)?;
            soonest = Some(soonest.map_or(until, |s| s.min(until)));
        }
        soonest.map(|until| until.saturating_duration_since(now))
    }

    /// A log was parked until `at`, when a budget returns: [`Llm::budget_returned`]
    /// completes then.
    pub fn wake_at(&self, at: tokio::time::Instant) {
        self.alarms.set(at);
    }

    /// Completes when a log parked for lack of budget becomes due (the soonest
    /// [`Llm::wake_at`]); the worker waits for it beside its poll interval, so that a
    /// backlog drains at the budgets' pace. Cancel-safe.
    pub async fn budget_returned(&self) {
        self.alarms.ring().await;
    }

    /// Daily budgets that became spent since the last call: store them (docs/behaviour.md, The cascade), so a
    /// restart does not spend a dead daily quota again.
    pub fn take_new_daily_budgets(&self) -> Vec<SpentBudget> {
        self.state.take_new_daily()
    }

    /// Restores the daily budgets stored before a restart.
    pub fn restore_budgets(&self, spent: &[SpentBudget]) {
        self.state.restore(spent);
    }

    /// Teaches the automatic hedging the latencies stored before a restart (oldest
    /// first; each step keeps its last few), so a fresh process does not hedge a step
    /// it already knows at the start value, nor wait that long on one that was slow.
    /// Samples of steps no cascade has any more are ignored.
    pub fn learn_latencies(&self, samples: &[LatencySample]) {
        let steps: Vec<&StepId> = self
            .analysis
            .iter()
            .chain(&self.metrics)
            .chain(&self.transcription)
            .map(|step| &step.id)
            .collect();
        for sample in samples {
            if let Some(step) = steps
                .iter()
                .find(|id| id.provider == sample.provider && id.model == sample.model)
            {
                self.hedging.restore(step.no, sample.latency);
            }
        }
    }

    /// Every budget this process knows to be spent now (`true`: a daily one).
    pub fn spent_budgets(&self) -> Vec<(SpentBudget, bool)> {
        self.state.spent_now()
    }

    /// Whether each key of each step cools now (the cooldown gauge): `(provider, model,
    /// key index, cooling)`, each (provider, model) once, since the tasks share it.
    pub fn cooling_now(&self) -> Vec<(String, String, Option<usize>, bool)> {
        self.step_keys()
            .into_iter()
            .map(|(step, key)| {
                let cooling = self.state.key_cooling_until(step, key).is_some();
                (step.provider.clone(), step.model.clone(), key, cooling)
            })
            .collect()
    }

    /// What each key of each step has left of its budget now (the budget gauge):
    /// `(provider, model, key index, left)`, each (provider, model) once. Models that
    /// share a budget (one counted per key) show the same numbers.
    pub fn budgets_left_now(&self) -> Vec<(String, String, Option<usize>, BudgetLeft)> {
        self.step_keys()
            .into_iter()
            .map(|(step, key)| {
                let left = self.state.budget_left(step, key);
                (step.provider.clone(), step.model.clone(), key, left)
            })
            .collect()
    }

    /// Every key of every step, each step once (the tasks share a step's state).
    fn step_keys(&self) -> Vec<(&StepId, Option<usize>)> {
        let mut seen = std::collections::BTreeSet::new();
        let mut keys = Vec::new();
        for step in self
            .analysis
            .iter()
            .chain(&self.metrics)
            .chain(&self.transcription)
        {
            if seen.insert(step.id.no) {
                keys.extend(
                    step.provider
                        .key_slots()
                        .into_iter()
                        .map(|key| (&step.id, key)),
                );
            }
        }
        keys
    }

    /// Names of the configured providers and whether each can be called.
    pub fn providers(&self) -> impl Iterator<Item = (&str, bool)> {
        self.providers
            .iter()
            .map(|(name, p)| (name.as_str(), p.usable()))
    }
}

/// The configured steps of one cascade whose provider can be called. Each (provider,
/// model) gets one number in `numbers` across every cascade: its cooldown, budget and
/// hedging are shared by the tasks that use it.
fn usable_steps(
    configured: &[StepSettings],
    providers: &BTreeMap<String, Arc<Provider>>,
    numbers: &mut BTreeMap<(String, String), usize>,
) -> Vec<Step> {
    configured
        .iter()
        .filter_map(|s| {
            let provider = providers.get(s.provider())?;
            let next = numbers.len();
            let no = *numbers
                .entry((s.provider().to_owned(), s.model().to_owned()))
                .or_insert(next);
            provider.usable().then(|| Step {
                id: StepId {
                    no,
                    provider: s.provider().to_owned(),
                    model: s.model().to_owned(),
                },
                provider: Arc::clone(provider),
                max_tokens: s.max_tokens(),
                temperature: s.temperature(),
            })
        })
        .collect()
}

/// What one key's ping got (`daylog doctor --ping`).
#[derive(Debug)]
pub struct KeyPing {
    /// The key's index and where it was read from ([`crate::config::ApiKey::origin`]);
    /// `None` for a provider used without a key, or when the provider could not be
    /// pinged at all.
    pub key: Option<(usize, String)>,
    pub answer: Result<(), LlmError>,
}

impl KeyPing {
    fn about_provider(error: LlmError) -> Self {
        Self {
            key: None,
            answer: Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn llm_is_shareable() {
        assert_send_sync::<Llm>();
        assert_send_sync::<CascadeError>();
    }
}
