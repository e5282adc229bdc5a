//! OTLP trace export (`--otlp-traces-endpoint`): one root span per request with child
//! spans for queue, prefill and decode, built when the request finishes from the same
//! timeline the metrics use, so spans and metrics agree to the nanosecond.
//!
//! The root span continues an incoming W3C `traceparent` when there is one; its own
//! `traceparent` is returned in the response before the request runs, which is why span
//! ids are chosen at arrival and spans are assembled (not started) at the end.

use std::borrow::Cow;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SpanData, SpanProcessor};

use crate::step::events::FinishReason;
use crate::telemetry::stats::timeline::{FinishedRequestStats, RequestTimeline};
use ballast_rng::SplitMix64;

/// Where a request's spans go in a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    /// Trace id: the caller's, or a new one.
    pub trace_id: u128,
    /// This request's root span.
    pub span_id: u64,
    /// The caller's span, when a `traceparent` came in.
    pub parent_span_id: Option<u64>,
    /// Whether to export (the caller's sampled flag; new traces are sampled).
    pub sampled: bool,
}

fn random_u64() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let seed = *SEED.get_or_init(|| {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        nanos ^ (std::process::id() as u64).rotate_left(32)
    });
    // Never zero: zero ids are invalid in W3C trace context.
    SplitMix64::derive(seed, NEXT.fetch_add(1, Ordering::Relaxed))
        .next_u64()
        .max(1)
}

impl TraceContext {
    /// Continues `traceparent` when it is a valid W3C header, else starts a new trace.
    pub fn from_traceparent(header: Option<&str>) -> Self {
        let span_id = random_u64();
        if let Some((trace_id, parent, flags)) = header.and_then(parse_traceparent) {
            return Self {
                trace_id,
                span_id,
                parent_span_id: Some(parent),
                sampled: flags & 1 == 1,
            };
        }
        Self {
            trace_id: ((random_u64() as u128) << 64) | random_u64() as u128,
            span_id,
            parent_span_id: None,
            sampled: true,
        }
    }

    /// The `traceparent` header naming this request's root span.
    pub fn traceparent(&self) -> String {
        format!(
            "00-{:032x}-{:016x}-{:02x}",
            self.trace_id, self.span_id, self.sampled as u8
        )
    }

    /// A sibling context for another choice of the same HTTP request: same trace and
    /// parent, its own root span.
    pub fn sibling(&self) -> Self {
        Self {
            span_id: random_u64(),
            ..*self
        }
    }
}

/// `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`, ids not all zero.
fn parse_traceparent(h: &str) -> Option<(u128, u64, u8)> {
    let mut parts = h.trim().split('-');
    let (version, trace, parent, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version.len() != 2
        || version == "ff"
        || trace.len() != 32
        || parent.len() != 16
        || flags.len() != 2
    {
        return None;
    }
    if version == "00" && parts.next().is_some() {
        return None;
    }
    let trace = u128::from_str_radix(trace, 16).ok().filter(|t| *t != 0)?;
    let parent = u64::from_str_radix(parent, 16).ok().filter(|p| *p != 0)?;
    Some((trace, parent, u8::from_str_radix(flags, 16).ok()?))
}

/// Exports request spans over OTLP/gRPC in batches.
#[derive(Debug)]
pub struct SpanExporter {
    processor: BatchSpanProcessor,
    scope: InstrumentationScope,
}

/// `--otlp-traces-endpoint` could not be used.
#[derive(Debug, thiserror::Error)]
#[error("cannot export traces to {endpoint}: {reason}")]
pub struct ExporterError {
    endpoint: String,
    reason: String,
}

impl SpanExporter {
    /// An exporter to `endpoint` (`http://host:4317`). Must be called inside a tokio
    /// runtime (the gRPC client lives there).
    pub fn new(endpoint: &str, service_name: &str) -> Result<Self, ExporterError> {
        let err = |reason: String| ExporterError {
            endpoint: endpoint.to_string(),
            reason,
        };
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(err(
                "the endpoint must start with http:// or https://".into()
            ));
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .build()
            .map_err(|e| err(e.to_string()))?;
        let mut processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(
                BatchConfigBuilder::default()
                    .with_scheduled_delay(Duration::from_millis(500))
                    .build(),
            )
            .build();
        processor.set_resource(
            &Resource::builder()
                .with_service_name(service_name.to_string())
                .build(),
        );
        Ok(Self {
            processor,
            scope: InstrumentationScope::builder("ballast-engine")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        })
    }

    /// Queues the spans of a finished request.
    pub fn export(
        &self,
        ctx: &TraceContext,
        request_id: u64,
        model: &str,
        tl: &RequestTimeline,
        f: &FinishedRequestStats,
    ) {
        if !ctx.sampled {
            return;
        }
        let trace_id = TraceId::from(ctx.trace_id);
        let secs = |d: Duration| d.as_secs_f64();
        let mut attributes = vec![
            KeyValue::new("gen_ai.request.id", request_id as i64),
            KeyValue::new("gen_ai.response.model", model.to_string()),
            KeyValue::new("gen_ai.request.max_tokens", tl.max_tokens as i64),
            KeyValue::new("gen_ai.usage.prompt_tokens", f.prompt_tokens as i64),
            KeyValue::new("gen_ai.usage.completion_tokens", f.generation_tokens as i64),
            KeyValue::new("gen_ai.usage.cached_tokens", f.cached_tokens as i64),
            KeyValue::new("gen_ai.response.finish_reasons", f.finish_reason.as_str()),
            KeyValue::new("gen_ai.latency.e2e", secs(f.e2e)),
            KeyValue::new("gen_ai.latency.time_in_queue", secs(f.queue)),
            KeyValue::new("gen_ai.latency.time_in_model_prefill", secs(f.prefill)),
            KeyValue::new("gen_ai.latency.time_in_model_decode", secs(f.decode)),
            KeyValue::new("gen_ai.latency.time_in_model_inference", secs(f.inference)),
            KeyValue::new("ballast.num_preemptions", f.num_preemptions as i64),
        ];
        if let Some(first) = tl.first_token_wall {
            let ttft = first.duration_since(tl.arrival).unwrap_or(Duration::ZERO);
            attributes.push(KeyValue::new(
                "gen_ai.latency.time_to_first_token",
                secs(ttft),
            ));
        }
        let status = match f.finish_reason {
            FinishReason::Abort => Status::error("aborted"),
            _ => Status::Ok,
        };
        let root = self.span(
            trace_id,
            ctx.span_id,
            ctx.parent_span_id,
            "llm_request",
            SpanKind::Server,
            (tl.arrival, tl.arrival + f.e2e),
            attributes,
            status,
        );
        self.processor.on_end(root);
        let stages = [
            ("queue", tl.queued_ts, tl.scheduled_ts),
            ("prefill", tl.scheduled_ts, tl.first_token_ts),
            ("decode", tl.first_token_ts, tl.last_token_ts),
        ];
        for (name, start, end) in stages {
            let (Some(start), Some(end)) = (start, end) else {
                continue;
            };
            let child = self.span(
                trace_id,
                random_u64(),
                Some(ctx.span_id),
                name,
                SpanKind::Internal,
                (tl.wall(start), tl.wall(end)),
                Vec::new(),
                Status::Unset,
            );
            self.processor.on_end(child);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn span(
        &self,
        trace_id: TraceId,
        span_id: u64,
        parent: Option<u64>,
        name: &'static str,
        kind: SpanKind,
        (start_time, end_time): (SystemTime, SystemTime),
        attributes: Vec<KeyValue>,
        status: Status,
    ) -> SpanData {
        SpanData {
            span_context: SpanContext::new(
                trace_id,
                SpanId::from(span_id),
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            parent_span_id: parent.map_or(SpanId::INVALID, SpanId::from),
            parent_span_is_remote: false,
            span_kind: kind,
            name: Cow::Borrowed(name),
            start_time,
            end_time,
            attributes,
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status,
            instrumentation_scope: self.scope.clone(),
        }
    }

    /// Sends what is queued and stops (at shutdown).
    pub fn shutdown(&self) {
        let _ = self.processor.force_flush();
        let _ = self.processor.shutdown_with_timeout(Duration::from_secs(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_is_continued_or_started() {
        let c = TraceContext::from_traceparent(Some(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ));
        assert_eq!(c.trace_id, 0x0af7651916cd43dd8448eb211c80319c);
        assert_eq!(c.parent_span_id, Some(0xb7ad6b7169203331));
        assert!(c.sampled);
        assert_ne!(c.span_id, 0xb7ad6b7169203331);
        let tp = c.traceparent();
        assert!(
            tp.starts_with("00-0af7651916cd43dd8448eb211c80319c-"),
            "{tp}"
        );
        assert!(tp.ends_with("-01"));
        let unsampled = TraceContext::from_traceparent(Some(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
        ));
        assert!(!unsampled.sampled);
        for bad in [
            "",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "zz",
            "00-abc-def-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ] {
            let c = TraceContext::from_traceparent(Some(bad));
            assert_eq!(c.parent_span_id, None, "{bad}");
            assert!(c.sampled && c.trace_id != 0);
        }
        assert_ne!(
            TraceContext::from_traceparent(None).trace_id,
            TraceContext::from_traceparent(None).trace_id
        );
    }
}
