//! Hedging judges the step, not the process (docs/behaviour.md, "Hedging"; issue 31
//! item 7): an answer that reached the socket within the threshold, while this process's
//! own runtime was too busy to read it, does not start the next step. In a burst of 200
//! chats the bot's busy cores made 17 % of tasks hedge on healthy 200 ms providers.
//!
//! Deterministic: the test's runtime has one thread, and the fake provider (wiremock,
//! on its own thread) wakes a task of that runtime which holds the thread for a second,
//! and answers once it does. When the runtime runs again, the answer is in the socket
//! and the hedge timer is long overdue: the old rule hedged every time (the task's own
//! future is polled before the connection's task reads the answer).

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use daylog::llm::{Llm, Task};
use support::llm::*;
use tokio::sync::Notify;
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

/// Answers at once; from its `quiet + 1`th request on, only once the test's runtime
/// is busy (it wakes the task that makes it so, and waits until it has).
struct Answered {
    arrived: Arc<Notify>,
    busy: Arc<Barrier>,
    quiet: usize,
    seen: AtomicUsize,
}

impl Respond for Answered {
    fn respond(&self, _request: &Request) -> ResponseTemplate {
        if self.seen.fetch_add(1, Ordering::SeqCst) >= self.quiet {
            self.arrived.notify_one();
            self.busy.wait();
        }
        json_reply(200, "openai/chat_completion.json")
    }
}

/// Provider `a` (model m1) before `b` (m2), hedging after `hedge_after_ms`.
fn two_steps(primary: &MockServer, next: &MockServer, hedge_after_ms: &str) -> Llm {
    let mut toml = FAST_RETRY.replace(
        "hedge_after_ms = 0",
        &format!("hedge_after_ms = {hedge_after_ms}"),
    );
    toml.push_str(&provider("a", "openai", &format!("{}/v1", primary.uri())));
    toml.push_str(&provider("b", "openai", &format!("{}/v1", next.uri())));
    toml.push_str(&analysis_steps(&[("a", "m1"), ("b", "m2")]));
    Llm::new(&settings(
        &toml,
        &[("A_API_KEY", "key-a"), ("B_API_KEY", "key-b")],
    ))
    .unwrap_or_else(|e| panic!("llm: {e}"))
}

/// Holds this runtime's only thread for a second once the primary has the request,
/// from before it answers.
fn busy_when_asked(arrived: &Arc<Notify>, busy: &Arc<Barrier>) -> tokio::task::JoinHandle<()> {
    let (arrived, busy) = (Arc::clone(arrived), Arc::clone(busy));
    tokio::spawn(async move {
        arrived.notified().await;
        busy.wait();
        std::thread::sleep(Duration::from_secs(1));
    })
}

async fn answered_by_the_primary_while_busy(hedge_after_ms: &str, teach: usize) {
    // Arrange
    let arrived = Arc::new(Notify::new());
    let busy = Arc::new(Barrier::new(2));
    let primary = MockServer::start().await;
    Mock::given(wiremock::matchers::method("POST"))
        .respond_with(Answered {
            arrived: Arc::clone(&arrived),
            busy: Arc::clone(&busy),
            quiet: teach,
            seen: AtomicUsize::new(0),
        })
        .mount(&primary)
        .await;
    let next = ok_server().await;
    let llm = two_steps(&primary, &next, hedge_after_ms);
    let sink = RecordingSink::default();
    // Answers of an idle process first: under auto, its threshold is learned from them.
    for _ in 0..teach {
        let answer = llm.run(Task::Analysis, &request(false), &sink).await;
        assert_eq!(answer.map(|a| a.model).ok().as_deref(), Some("m1"));
    }
    // The next request makes the runtime busy before it is answered.
    let busy = busy_when_asked(&arrived, &busy);
    let logs = LogCapture::this_thread();

    // Act
    let answer = llm.run(Task::Analysis, &request(false), &sink).await;

    // Assert: the primary's answer, read once the runtime ran again, and no hedge.
    let _ = busy.await;
    assert_eq!(answer.map(|a| a.model).ok().as_deref(), Some("m1"));
    let text = logs.text();
    assert!(
        !text.contains("hedging with the next step"),
        "a busy process hedged a step that had answered: {text}"
    );
    assert_eq!(calls(&next).await, 0, "{:?}", sink.attempts());
}

#[tokio::test]
async fn a_fixed_threshold_does_not_hedge_an_answer_the_busy_process_had_not_read_yet() {
    answered_by_the_primary_while_busy("300", 0).await;
}

#[tokio::test]
async fn a_learned_threshold_does_not_hedge_an_answer_the_busy_process_had_not_read_yet() {
    // Five quick answers teach the floor, 100 ms.
    answered_by_the_primary_while_busy("\"auto\"", 5).await;
}
