//! What the LLM layer writes to the log, captured from this test's thread by the one
//! process-wide test subscriber (`support::llm::install_test_subscriber`), so the tests
//! running beside it in the same binary neither add lines nor hide any.

use crate::support;

use daylog::llm::{Llm, LlmError, Task};
use support::llm::*;
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

#[tokio::test]
async fn logs_name_missing_keys_once_and_never_show_a_key_or_user_text() {
    let logs = LogCapture::this_thread();

    // A provider without keys is warned about once, at start-up.
    logs.clear();
    let toml = one_step("openai", "http://127.0.0.1:9/v1", "m1");

    let _llm = Llm::new(&settings(&toml, &[])).unwrap();

    let text = logs.text();
    assert_eq!(
        text.matches("no API key").count(),
        3,
        "p, groq and mistral: {text}"
    );
    assert!(text.contains("P_API_KEY"));

    // Keys never reach logs, errors or Debug output.
    logs.clear();
    // Arrange: a provider that echoes the key back in its error body, then fails hard.
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(401)
                .set_body_string(format!("{{\"message\":\"invalid api key {SECRET}\"}}")),
        )
        .mount(&server)
        .await;
    let toml = one_step("openai", &server.uri(), "m1");
    let settings = settings(&toml, &[("P_API_KEY", SECRET)]);
    let llm = Llm::new(&settings).unwrap();
    let sink = RecordingSink::default();

    // Act
    let err = llm
        .run(Task::Analysis, &request(false), &sink)
        .await
        .unwrap_err();
    let ping = llm.ping("p").await;

    // Assert
    let texts = [
        logs.text(),
        err.to_string(),
        format!("{err:?}"),
        format!("{llm:?}"),
        format!("{settings:?}"),
        format!("{:?}", ping[0].answer.as_ref().unwrap_err().to_string()),
        format!("{ping:?}"),
        format!("{:?}", sink.attempts()),
    ];
    for text in &texts {
        assert!(!text.contains(SECRET), "key leaked: {text}");
    }
    assert!(logs.text().contains("key_index"), "{}", logs.text());
    assert!(
        logs.text().contains("<redacted>"),
        "the echoed key was replaced"
    );
    assert!(
        !logs.text().contains("My day was fine"),
        "no user text in logs"
    );
    assert!(ping[0].answer.as_ref().is_err_and(LlmError::is_bad_key));
}
