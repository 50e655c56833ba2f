//! A model's answer to the metrics' request, read: the JSON object found and mended
//! ([`json_repair`](super::json_repair)), then validated by [`Metrics`]'s own rules.

use crate::domain::Metrics;

use super::json_repair;

/// An answer to the metrics' request with no JSON object in it: of no use as metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the answer holds no JSON object")]
pub struct NoJsonObject;

/// What makes a metrics answer usable, handed to the cascade: the cascade asks the next
/// model when an answer holds no JSON object at all (an apology, reasoning cut by the
/// token limit) rather than defaulting every metric. An object with no metric in it
/// (`{}`) is an answer: a trivial entry gets one, and counting it as a failure would
/// cool the step down for everyone.
pub fn from_answer(raw: &str) -> Result<Metrics, NoJsonObject> {
    json_repair::repair(raw)
        .map(|value| Metrics::from_answer_value(&value))
        .ok_or(NoJsonObject)
}

/// [`from_answer`], or all defaults when the answer holds no JSON object.
pub fn from_llm_text(raw: &str) -> Metrics {
    from_answer(raw).unwrap_or_else(|NoJsonObject| Metrics::defaults())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_without_an_object_is_no_metrics_and_reads_as_defaults() {
        assert_eq!(from_answer("Sorry, I can't."), Err(NoJsonObject));
        assert!(from_llm_text("Sorry, I can't.").is_all_defaulted());
    }

    #[test]
    fn a_wrapped_object_is_read_through_its_wrapper() {
        let metrics =
            from_answer(r#"Sure! {"metrics": {"mood": 5, "stress": 1}}"#).expect("an object");
        assert_eq!(metrics.mood(), 5);
        assert_eq!(metrics.stress(), 1);
    }
}
