//! The gRPC control API against a real engine.

mod common;

use std::time::Duration;

use ballast_engine::control::ControlService;
use ballast_engine::control::proto::engine_control_client::EngineControlClient;
use ballast_engine::control::proto::{
    DrainRequest, GetStatsRequest, ResetPrefixCacheRequest, ResumeRequest, SetDpWeightsRequest,
    StreamStatsRequest,
};
use common::{TestServer, start};
use futures::StreamExt;
use serde_json::json;
use tonic::transport::Channel;

async fn control(s: &TestServer) -> EngineControlClient<Channel> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ControlService::server(s.engine.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    EngineControlClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

const SLOW: [&str; 4] = ["--model", "synthetic:small", "--max-model-len", "2048"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_and_dp_weights() {
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
    let mut c = control(&s).await;
    let idle = c.get_stats(GetStatsRequest {}).await.unwrap().into_inner();
    assert_eq!(idle.ranks.len(), 2);
    assert_eq!(idle.model_name, "synthetic:small");
    assert!(
        idle.ranks
            .iter()
            .all(|r| r.running == 0 && r.kv_blocks_total > 0)
    );
    // Weights 0:1 send new requests to rank 1 only.
    let w = c
        .set_dp_weights(SetDpWeightsRequest {
            weights: vec![0.0, 1.0],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(w.weights, vec![0.0, 1.0]);
    let held = s.hold(None).await;
    let busy = c.get_stats(GetStatsRequest {}).await.unwrap().into_inner();
    assert_eq!((busy.ranks[0].running, busy.ranks[1].running), (0, 1));
    assert!(busy.ranks[1].kv_usage > 0.0 && busy.ranks[1].tokens_scheduled > 0);
    assert_eq!(busy.in_flight, 1);
    drop(held);
    let bad = c
        .set_dp_weights(SetDpWeightsRequest {
            weights: vec![0.0, 0.0],
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    let bad = c
        .set_dp_weights(SetDpWeightsRequest { weights: vec![1.0] })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    // The stream delivers snapshots until dropped.
    let mut stream = c
        .stream_stats(StreamStatsRequest { interval_ms: 50 })
        .await
        .unwrap()
        .into_inner();
    for _ in 0..3 {
        let snap = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(snap.ranks.len(), 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_and_resume_admission() {
    let s = start(&[]).await;
    let mut c = control(&s).await;
    c.drain(DrainRequest {}).await.unwrap();
    let (status, v) = s
        .post("/v1/completions", &json!({"prompt": "x", "max_tokens": 1}))
        .await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (503, Some("draining"))
    );
    assert_eq!(s.get("/health").await.status(), 503);
    assert!(
        c.get_stats(GetStatsRequest {})
            .await
            .unwrap()
            .into_inner()
            .draining
    );
    c.resume(ResumeRequest {}).await.unwrap();
    let (status, _) = s
        .post("/v1/completions", &json!({"prompt": "x", "max_tokens": 1}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(s.get("/health").await.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_cache_reset_is_refused_while_blocks_are_in_use() {
    let s = start(&SLOW).await;
    let mut c = control(&s).await;
    let prompt = "a long shared prefix that fills a few blocks of sixteen tokens each";
    let body = json!({"prompt": prompt, "max_tokens": 1});
    s.post("/v1/completions", &body).await;
    let (_, second) = s.post("/v1/completions", &body).await;
    assert!(
        second["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    let held = s.hold(None).await;
    assert!(
        !c.reset_prefix_cache(ResetPrefixCacheRequest {})
            .await
            .unwrap()
            .into_inner()
            .ok
    );
    drop(held);
    s.wait_metric(
        "ballast_num_requests_running{engine=\"0\",model_name=\"synthetic:small\"}",
        Duration::from_secs(10),
        |v| v == 0.0,
    )
    .await;
    assert!(
        c.reset_prefix_cache(ResetPrefixCacheRequest {})
            .await
            .unwrap()
            .into_inner()
            .ok
    );
    let (_, after) = s.post("/v1/completions", &body).await;
    assert_eq!(
        after["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
        "the cache was forgotten"
    );
}
