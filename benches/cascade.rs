//! Cascade overhead per task: `Llm::run` against a zero-latency local fake, next to a bare
//! `reqwest` POST to the same fake with the same client. The goal is ≤ 1.10× the bare
//! request. Criterion measures both; an interleaved run at the end prints the ratio.
//! With `DAYLOG_BENCH_DATABASE_URL` set to a PostgreSQL URL the budgets are shared
//! through that database (several instances' way), so the ratio includes the shared
//! check-and-spend.

#![expect(
    clippy::expect_used,
    reason = "a benchmark that cannot start should stop"
)]
#![expect(
    clippy::print_stderr,
    reason = "the interleaved run reports its ratio on stderr, beside Criterion's output"
)]

use std::collections::HashMap;
use std::hint::black_box;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use criterion::Criterion;
use daylog::config::Settings;
use daylog::llm::{ChatRequest, Llm, NullSink, Task};
use tokio::runtime::Runtime;

const COMPLETION: &str = r#"{"id":"cmpl-1","object":"chat.completion","created":1702256327,"model":"mistral-small-2506","choices":[{"index":0,"message":{"role":"assistant","content":"A steady day. Try to be in bed by 23:00 tonight."},"finish_reason":"stop"}],"usage":{"prompt_tokens":16,"completion_tokens":14,"total_tokens":30}}"#;

struct Fixture {
    rt: Runtime,
    llm: Llm,
    client: reqwest::Client,
    url: String,
    body: serde_json::Value,
    request: ChatRequest,
}

fn fixture() -> Fixture {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let addr: SocketAddr = rt.block_on(async {
        let app = Router::new().route(
            "/v1/chat/completions",
            post(|| async { ([("content-type", "application/json")], COMPLETION) }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    });
    let base = format!("http://{addr}/v1");
    let env: HashMap<String, String> = [
        ("DAYLOG__PROVIDERS__MISTRAL__BASE_URL", base.as_str()),
        ("MISTRAL_API_KEY", "bench-key"),
        // The fake has no free tier: the shipped 1 request/s would make this measure
        // the budget's pace (1 s per task), not the cascade.
        (
            "DAYLOG__PROVIDERS__MISTRAL__BUDGET__REQUESTS_PER_SECOND",
            "1000000000",
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let settings = Settings::load_from(&env).expect("settings");
    let client = reqwest::Client::builder()
        .use_rustls_tls()
        .build()
        .expect("client");
    let llm = Llm::with_client(&settings, client.clone()).expect("llm");
    // `DAYLOG_BENCH_DATABASE_URL=postgres://…`: the budgets are shared through that
    // database, as several instances share them (one check-and-spend per task).
    let llm = match std::env::var("DAYLOG_BENCH_DATABASE_URL") {
        Ok(url) => {
            let store = rt
                .block_on(daylog::store::Store::open_and_migrate(
                    &url,
                    Duration::from_secs(5),
                ))
                .expect("the bench's database");
            eprintln!("budgets shared through PostgreSQL");
            llm.sharing(std::sync::Arc::new(store))
        }
        Err(_) => llm,
    };
    let request = ChatRequest {
        system: "You are a kind journaling assistant.".into(),
        user: "Slept badly, long day at work, went for a run.".into(),
        json: false,
    };
    let body = serde_json::json!({
        "model": "mistral-small-2506",
        "messages": [
            {"role": "system", "content": request.system},
            {"role": "user", "content": request.user},
        ],
    });
    Fixture {
        rt,
        llm,
        client,
        url: format!("{base}/chat/completions"),
        body,
        request,
    }
}

impl Fixture {
    async fn cascade(&self) {
        let answer = self
            .llm
            .run(Task::Analysis, &self.request, &NullSink)
            .await
            .expect("cascade answer");
        black_box(answer);
    }

    async fn bare(&self) {
        let response = self
            .client
            .post(&self.url)
            .bearer_auth("bench-key")
            .json(&self.body)
            .send()
            .await
            .expect("bare send");
        black_box(response.bytes().await.expect("bare body"));
    }
}

fn bench(c: &mut Criterion, f: &Fixture) {
    let mut group = c.benchmark_group("task_against_zero_latency_fake");
    group.bench_function("bare_reqwest_post", |b| {
        b.iter(|| f.rt.block_on(f.bare()));
    });
    group.bench_function("llm_cascade_run", |b| {
        b.iter(|| f.rt.block_on(f.cascade()));
    });
    group.finish();
}

/// Interleaved rounds so both sides see the same machine noise; the median of the
/// per-round ratios is reported.
fn ratio(f: &Fixture) {
    const ROUNDS: usize = 15;
    const PER_ROUND: u32 = 300;
    let mut ratios = Vec::with_capacity(ROUNDS);
    let (mut bare_total, mut cascade_total) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..ROUNDS {
        let start = Instant::now();
        f.rt.block_on(async {
            for _ in 0..PER_ROUND {
                f.bare().await;
            }
        });
        let bare = start.elapsed();
        let start = Instant::now();
        f.rt.block_on(async {
            for _ in 0..PER_ROUND {
                f.cascade().await;
            }
        });
        let cascade = start.elapsed();
        bare_total += bare;
        cascade_total += cascade;
        ratios.push(cascade.as_secs_f64() / bare.as_secs_f64());
    }
    ratios.sort_by(f64::total_cmp);
    let n = f64::from(PER_ROUND) * ROUNDS as f64;
    eprintln!(
        "cascade overhead: bare {:.1} µs/task, cascade {:.1} µs/task, median ratio {:.3}× (goal ≤ 1.10×)",
        bare_total.as_secs_f64() * 1e6 / n,
        cascade_total.as_secs_f64() * 1e6 / n,
        ratios[ROUNDS / 2],
    );
}

fn main() {
    let f = fixture();
    let mut criterion = Criterion::default().configure_from_args();
    bench(&mut criterion, &f);
    ratio(&f);
    criterion.final_summary();
}
