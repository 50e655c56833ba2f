//! Everything between a day log's text and the LLM layer: the prompts ([`prompt`], the one
//! place that builds them), and the metrics answer's repair ([`json_repair`]) and
//! validation ([`metrics`]). It does not import the LLM layer, nor the LLM layer it: the
//! request type they share is [`crate::llm_request::ChatRequest`], and the caller hands
//! the cascade [`metrics::from_answer`] as what makes a metrics answer usable; the
//! [`Metrics`](crate::domain::Metrics) type itself is the domain's.

pub mod json_repair;
pub mod metrics;
pub mod prompt;

pub use metrics::NoJsonObject;
pub use prompt::{UserContext, WeekContext, analysis_request, digest_request, metrics_request};
