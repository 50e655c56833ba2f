//! A model as daylog names it: the provider it is reached through and the model's own
//! name (`mistral` / `mistral-small-latest`). What a refusal is recorded against and
//! what a later round leaves out.

use std::fmt;

/// One model of one provider.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ModelRef {
    pub provider: String,
    pub model: String,
}

impl ModelRef {
    pub fn new(provider: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            provider: provider.into(),
            model: model.into(),
        }
    }
}

impl From<(String, String)> for ModelRef {
    fn from((provider, model): (String, String)) -> Self {
        Self { provider, model }
    }
}

impl fmt::Display for ModelRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.provider, self.model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_is_its_provider_and_name() {
        let model = ModelRef::new("groq", "llama-3.3-70b");
        assert_eq!(model.to_string(), "groq/llama-3.3-70b");
        assert_eq!(
            ModelRef::from(("groq".to_owned(), "llama-3.3-70b".to_owned())),
            model
        );
    }
}
