//! Front-door admission (429s), tenant deferral and data-parallel dispatch, observed through
//! the HTTP API and `/metrics` of a real engine.

use crate::common;

use std::time::Duration;

use common::start;
use serde_json::{Value, json};

const SLOW: [&str; 4] = ["--model", "synthetic:small", "--max-model-len", "2048"];

fn series(name: &str, rank: &str, extra: &str) -> String {
    format!("{name}{{engine=\"{rank}\",model_name=\"synthetic:small\"{extra}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_gets_exactly_the_429s_the_queue_limit_implies() {
    let s = start(
        &[
            &SLOW[..],
            &["--max-num-seqs", "1", "--max-queued-requests", "3"],
        ]
        .concat(),
    )
    .await;
    let holder = s.hold(None).await;
    let burst = futures::future::join_all((0..10).map(|i| {
        let s = &s;
        async move {
            let r = s
                .client
                .post(format!("{}/v1/completions", s.base))
                .json(&json!({"prompt": [1, 2, 3, i], "max_tokens": 1}))
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    }));
    let check_queue = async {
        let waiting = series(
            "ballast_num_requests_waiting_by_reason",
            "0",
            ",reason=\"capacity\"",
        );
        s.wait_metric(&waiting, Duration::from_secs(20), |v| v == 3.0)
            .await;
        drop(holder); // the three queued requests can now run
    };
    let (results, ()) = tokio::join!(burst, check_queue);
    let ok = results.iter().filter(|(st, _)| *st == 200).count();
    let rejected: Vec<_> = results.iter().filter(|(st, _)| *st == 429).collect();
    assert_eq!((ok, rejected.len()), (3, 7), "{results:?}");
    assert!(
        rejected
            .iter()
            .all(|(_, v)| v["error"]["code"] == "max_num_queued_reqs")
    );
    let metric = "ballast_admission_rejections_total{engine=\"0\",model_name=\"synthetic:small\",reason=\"max_num_queued_reqs\"}";
    assert_eq!(s.metric(metric).await, 7.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_token_limit_counts_prompt_tokens() {
    let s = start(
        &[
            &SLOW[..],
            &["--max-num-seqs", "1", "--max-queued-tokens", "30"],
        ]
        .concat(),
    )
    .await;
    let holder = s.hold(None).await;
    let mut pending = Vec::new();
    for i in 0..3u32 {
        let c = s.client.clone();
        let url = format!("{}/v1/completions", s.base);
        pending.push(tokio::spawn(async move {
            c.post(url)
                .json(&json!({"prompt": vec![i + 1; 10], "max_tokens": 1}))
                .send()
                .await
                .unwrap()
                .status()
        }));
    }
    let waiting = series("ballast_num_requests_waiting", "0", "}");
    s.wait_metric(&waiting, Duration::from_secs(20), |v| v == 3.0)
        .await;
    let (status, v) = s
        .post(
            "/v1/completions",
            &json!({"prompt": vec![9; 10], "max_tokens": 1}),
        )
        .await;
    assert_eq!(status, 429);
    assert_eq!(v["error"]["code"], "max_num_queued_tokens");
    // A smaller prompt would not fit either: 30 of 30 tokens are queued.
    let (status, _) = s
        .post("/v1/completions", &json!({"prompt": [5], "max_tokens": 1}))
        .await;
    assert_eq!(status, 429);
    drop(holder);
    for p in pending {
        assert_eq!(p.await.unwrap(), 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_cap_defers_without_blocking_other_tenants() {
    let s = start(&[&SLOW[..], &["--max-running-per-tenant", "1"]].concat()).await;
    let holder = s.hold(Some("alice")).await;
    let deferred: Vec<_> = (0..2)
        .map(|i| {
            let c = s.client.clone();
            let url = format!("{}/v1/completions", s.base);
            tokio::spawn(async move {
                // One names the tenant in the header, one in the OpenAI `user` field.
                let mut req = c.post(url);
                let mut body = json!({"prompt": "later", "max_tokens": 1});
                if i == 0 {
                    req = req.header("x-tenant", "alice");
                } else {
                    body["user"] = json!("alice");
                }
                req.json(&body).send().await.unwrap().status()
            })
        })
        .collect();
    let by_reason = |r: &str| {
        series(
            "ballast_num_requests_waiting_by_reason",
            "0",
            &format!(",reason=\"{r}\""),
        )
    };
    s.wait_metric(&by_reason("deferred"), Duration::from_secs(20), |v| {
        v == 2.0
    })
    .await;
    assert_eq!(
        s.metric(&by_reason("capacity")).await,
        0.0,
        "deferred is never capacity"
    );
    // Another tenant runs at once although alice's requests wait.
    let (status, _) = s
        .post(
            "/v1/completions",
            &json!({"prompt": "now", "max_tokens": 1, "user": "bob"}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(s.metric(&by_reason("deferred")).await, 2.0);
    drop(holder);
    for d in deferred {
        assert_eq!(d.await.unwrap(), 200);
    }
    s.wait_metric(&by_reason("deferred"), Duration::from_secs(10), |v| {
        v == 0.0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_parallel_ranks_take_turns_and_follow_weights() {
    let s = start(
        &[
            &SLOW[..],
            &[
                "--data-parallel-size",
                "2",
                "--dispatch-policy",
                "round-robin",
            ],
        ]
        .concat(),
    )
    .await;
    let running = |rank| series("ballast_num_requests_running", rank, "}");
    let a = s.hold(None).await;
    let b = s.hold(None).await;
    assert_eq!(s.metric(&running("0")).await, 1.0);
    assert_eq!(s.metric(&running("1")).await, 1.0);
    s.engine.dispatcher().set_weights(&[0.0, 1.0]).unwrap();
    let c = s.hold(None).await;
    assert_eq!(s.metric(&running("1")).await, 2.0);
    drop((a, b, c));
    s.wait_metric(&running("1"), Duration::from_secs(10), |v| v == 0.0)
        .await;
    // Both ranks compute with the same weights: greedy output does not depend on the rank.
    s.engine.dispatcher().set_weights(&[1.0, 1.0]).unwrap();
    let body =
        json!({"prompt": "same everywhere", "max_tokens": 8, "temperature": 0, "ignore_eos": true});
    let texts: Vec<Value> =
        futures::future::join_all((0..4).map(|_| s.post("/v1/completions", &body)))
            .await
            .into_iter()
            .map(|(_, v)| v["choices"][0]["text"].clone())
            .collect();
    assert!(texts.windows(2).all(|w| w[0] == w[1]), "{texts:?}");
}
