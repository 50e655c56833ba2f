//! [`ChatRequest`]: what a chat model is asked, as every provider takes it. `analysis`
//! builds it (its prompts), `llm` sends it; it lives below both so that neither imports
//! the other — the caller joins them, and hands the LLM layer what makes an answer
//! usable (a parse function, see `llm::Llm::run_parsed`).

/// One chat request. User text goes only into `user`, never into `system`.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub system: String,
    pub user: String,
    /// Ask for one JSON object (JSON mode where the provider has it).
    pub json: bool,
}
