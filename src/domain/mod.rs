//! The ground floor every layer uses: the typed ids ([`ids`]), a model as daylog names
//! it ([`ModelRef`]), what became of a log ([`Outcome`]) and the metrics' field names
//! ([`MetricField`]), and a log's [`Metrics`], which can only be built by their clamping
//! constructors. Nothing here talks to the store, a provider or a front end; each type is
//! parsed where a value enters daylog and has its tests beside it.

pub mod ids;
pub mod metric_field;
pub mod metrics;
pub mod model;
pub mod outcome;

pub use ids::{ChatId, DigestId, LogId, MessageId, UserId};
pub use metric_field::MetricField;
pub use metrics::{Metrics, Score};
pub use model::ModelRef;
pub use outcome::{Failure, Outcome, Wait};
