//! Request traces over OTLP/gRPC to an in-process collector.

use crate::common;

use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use serde_json::{Value, json};
use tokio::sync::mpsc;

struct Collector(mpsc::UnboundedSender<Span>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        for rs in req.into_inner().resource_spans {
            for ss in rs.scope_spans {
                for span in ss.spans {
                    let _ = self.0.send(span);
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

async fn collector() -> (String, mpsc::UnboundedReceiver<Span>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Collector(tx)))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (url, rx)
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a AnyValue> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_continue_the_callers_trace_with_stage_children() {
    let (url, mut spans) = collector().await;
    let s = common::start(&["--otlp-traces-endpoint", &url]).await;
    let caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let resp = s
        .client
        .post(format!("{}/v1/completions", s.base))
        .header("traceparent", format!("00-{caller_trace}-{caller_span}-01"))
        .json(&json!({"prompt": "trace me", "max_tokens": 6, "ignore_eos": true}))
        .send()
        .await
        .unwrap();
    let returned = resp.headers()["traceparent"].to_str().unwrap().to_string();
    let body: Value = resp.json().await.unwrap();
    assert!(
        returned.starts_with(&format!("00-{caller_trace}-")),
        "{returned}"
    );
    let root_id = returned.split('-').nth(2).unwrap().to_string();
    assert_ne!(root_id, caller_span);

    let mut got: Vec<Span> = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), async {
        while got.len() < 4 {
            got.push(spans.recv().await.unwrap());
        }
    })
    .await
    .expect("four spans exported");
    let root = got
        .iter()
        .find(|s| s.name == "llm_request")
        .expect("root span");
    assert_eq!(hex(&root.trace_id), caller_trace);
    assert_eq!(hex(&root.span_id), root_id);
    assert_eq!(
        hex(&root.parent_span_id),
        caller_span,
        "root continues the caller's span"
    );
    for stage in ["queue", "prefill", "decode"] {
        let child = got
            .iter()
            .find(|s| s.name == stage)
            .unwrap_or_else(|| panic!("{stage} span"));
        assert_eq!(hex(&child.trace_id), caller_trace);
        assert_eq!(
            hex(&child.parent_span_id),
            root_id,
            "{stage} is a child of the root"
        );
        assert!(
            child.start_time_unix_nano >= root.start_time_unix_nano
                && child.end_time_unix_nano <= root.end_time_unix_nano
        );
    }
    let completion = body["usage"]["completion_tokens"].as_i64().unwrap();
    assert_eq!(
        attr(root, "gen_ai.usage.completion_tokens"),
        Some(&AnyValue::IntValue(completion))
    );
    for key in [
        "gen_ai.latency.time_to_first_token",
        "gen_ai.latency.e2e",
        "gen_ai.latency.time_in_model_prefill",
        "gen_ai.latency.time_in_model_decode",
    ] {
        assert!(
            matches!(attr(root, key), Some(AnyValue::DoubleValue(v)) if *v >= 0.0),
            "{key}"
        );
    }
    // Spans and metrics come from the same timestamps.
    let Some(AnyValue::DoubleValue(e2e)) = attr(root, "gen_ai.latency.e2e") else {
        unreachable!()
    };
    let span_secs = (root.end_time_unix_nano - root.start_time_unix_nano) as f64 / 1e9;
    assert!((span_secs - e2e).abs() < 1e-6, "{span_secs} vs {e2e}");
    let decode = got.iter().find(|s| s.name == "decode").unwrap();
    let Some(AnyValue::DoubleValue(d)) = attr(root, "gen_ai.latency.time_in_model_decode") else {
        unreachable!()
    };
    assert!(
        ((decode.end_time_unix_nano - decode.start_time_unix_nano) as f64 / 1e9 - d).abs() < 1e-6
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_trace_is_started_without_traceparent_and_none_without_the_flag() {
    let (url, mut spans) = collector().await;
    let traced = common::start(&["--otlp-traces-endpoint", &url]).await;
    let r = traced
        .client
        .post(format!("{}/v1/completions", traced.base))
        .json(&json!({"prompt": "x", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    let tp = r.headers()["traceparent"].to_str().unwrap().to_string();
    let span = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let s = spans.recv().await.unwrap();
            if s.name == "llm_request" {
                return s;
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(
        format!("00-{}-{}-01", hex(&span.trace_id), hex(&span.span_id)),
        tp
    );
    assert!(span.parent_span_id.is_empty(), "a new trace has no parent");
    let plain = common::start(&[]).await;
    let r = plain
        .client
        .post(format!("{}/v1/completions", plain.base))
        .json(&json!({"prompt": "x", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("traceparent").is_none());
}
