//! The gRPC control API against a real engine.

use crate::common;

use std::time::Duration;

use ballast_engine::api::control::ControlService;
use ballast_engine::api::control::proto::engine_control_client::EngineControlClient;
use ballast_engine::api::control::proto::{
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

/// A request with `authorization` metadata, if any.
fn with_token<T>(msg: T, auth: Option<&str>) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    if let Some(a) = auth {
        req.metadata_mut()
            .insert("authorization", a.parse().unwrap());
    }
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_token_file_guards_every_call_and_rotates_without_a_restart() {
    const OLD: &str = "ctl-old-8c1f0b7a2e";
    const NEW: &str = "ctl-new-1d9e4a6b30";
    let dir = std::env::temp_dir().join(format!("ballast-control-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("token");
    std::fs::write(&file, format!("{OLD}\n")).unwrap();
    let s = start(&["--control-token-file", file.to_str().unwrap()]).await;
    let mut c = control(&s).await;

    let refused = |r: Result<tonic::Response<_>, tonic::Status>| {
        let status = r
            .map(|_: tonic::Response<ballast_engine::api::control::proto::DrainResponse>| ())
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
        assert!(!status.message().contains(OLD) && !status.message().contains(NEW));
        status.message().to_string()
    };
    // Without a token, with a malformed one, with a wrong one: refused, nothing drained.
    let m = refused(c.drain(with_token(DrainRequest {}, None)).await);
    assert!(m.contains("missing control token"), "{m}");
    let m = refused(c.drain(with_token(DrainRequest {}, Some(OLD))).await);
    assert!(m.contains("malformed"), "{m}");
    let m = refused(
        c.drain(with_token(DrainRequest {}, Some("Bearer ctl-guess")))
            .await,
    );
    assert!(m.contains("invalid control token"), "{m}");
    assert!(!s.engine.is_draining(), "a refused drain drained");
    let stats = c.get_stats(with_token(GetStatsRequest {}, None)).await;
    assert_eq!(stats.unwrap_err().code(), tonic::Code::Unauthenticated);
    let series = |reason: &str| {
        format!(
            "ballast_control_requests_refused_total{{model_name=\"synthetic:tiny\",reason=\"{reason}\"}}"
        )
    };
    assert_eq!(s.metric(&series("missing")).await, 2.0);
    assert_eq!(s.metric(&series("malformed")).await, 1.0);
    assert_eq!(s.metric(&series("wrong")).await, 1.0);
    let metrics = s.metrics().await;
    assert!(!metrics.contains(OLD) && !metrics.contains("ctl-guess"));

    // With the right one: served.
    let bearer_old = format!("Bearer {OLD}");
    c.drain(with_token(DrainRequest {}, Some(&bearer_old)))
        .await
        .unwrap();
    assert!(s.engine.is_draining());
    c.resume(with_token(ResumeRequest {}, Some(&bearer_old)))
        .await
        .unwrap();

    // Rotation: the file gains the new token, then loses the old; the engine follows
    // within its poll (2 s) and never restarts.
    let bearer_new = format!("Bearer {NEW}");
    std::fs::write(&file, format!("{NEW}\n{OLD}\n")).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while c
        .get_stats(with_token(GetStatsRequest {}, Some(&bearer_new)))
        .await
        .is_err()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the new token was never read"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    c.get_stats(with_token(GetStatsRequest {}, Some(&bearer_old)))
        .await
        .expect("both tokens are valid while the file holds both");
    std::fs::write(&file, format!("{NEW}\n")).unwrap();
    while c
        .get_stats(with_token(GetStatsRequest {}, Some(&bearer_old)))
        .await
        .is_ok()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the old token stayed valid"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A file that becomes unreadable keeps the last good token.
    std::fs::remove_file(&file).unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    c.get_stats(with_token(GetStatsRequest {}, Some(&bearer_new)))
        .await
        .expect("the last good token is kept");
    let stats = c.get_stats(with_token(GetStatsRequest {}, None)).await;
    assert_eq!(stats.unwrap_err().code(), tonic::Code::Unauthenticated);
}
