//! Everything between a day log's text and the LLM layer: the prompts ([`prompt`], the one
//! place that builds them), and the metrics answer's repair ([`json_repair`]) and
//! validation ([`metrics`]).

pub mod json_repair;
pub mod metrics;
pub mod prompt;

pub use metrics::{Metrics, Score};
pub use prompt::{UserContext, WeekContext, analysis_request, digest_request, metrics_request};
