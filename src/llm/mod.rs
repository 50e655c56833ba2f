//! The LLM layer: provider clients (one file per wire format), error classification and
//! the resilient cascade of SPEC §5. It does not know about the store: attempts are
//! reported through an [`AttemptSink`].

pub mod types;

pub use types::{Attempt, AttemptSink, ChatRequest, Completion, NullSink, Outcome, Task};
