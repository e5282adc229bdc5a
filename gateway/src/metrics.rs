//! The gateway's own metrics (`--metrics-port`, `GET /metrics`).

use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Every family the gateway exports.
pub struct GatewayMetrics {
    registry: Registry,
    /// `ballast_gateway_picks_total{endpoint, reason}`: requests routed.
    pub picks: IntCounterVec,
    /// `ballast_gateway_rank_picks_total{endpoint, rank}`: requests sent to a DP rank the
    /// gateway picked (`X-Data-Parallel-Rank`).
    pub rank_picks: IntCounterVec,
    /// `ballast_gateway_refusals_total{code, reason}`: requests the gateway answered
    /// itself (400, 404, 413, 429, 503), by HTTP status and the error's code.
    pub refusals: IntCounterVec,
    /// `ballast_gateway_streams_total{outcome}`: ext_proc streams by how they ended.
    pub streams: IntCounterVec,
    /// `ballast_gateway_pick_duration_seconds{outcome}`: from the request body's last
    /// chunk to the gateway's answer.
    pub pick_duration: HistogramVec,
    /// `ballast_gateway_prefix_match_ratio`: the prefix match where requests with a
    /// prompt of at least one block went.
    pub prefix_match: Histogram,
    /// `ballast_gateway_prefix_blocks`: prompt blocks remembered, over all endpoints.
    pub prefix_blocks: IntGauge,
    /// `ballast_gateway_endpoints`: endpoints in the pool.
    pub endpoints: IntGauge,
    /// `ballast_gateway_requests_in_flight`: requests picked whose response has not ended.
    pub in_flight: IntGauge,
    /// `ballast_gateway_queue_length`: requests held while the pool is saturated.
    pub queue_length: IntGauge,
    /// `ballast_gateway_queue_wait_seconds`: how long held requests were held.
    pub queue_wait: Histogram,
    /// `ballast_gateway_held_requests{pool}`: requests held now, by the InferencePool the
    /// gateway serves (`--pool`; empty otherwise). Demand the operator reads: requests
    /// waiting for capacity that no replica counts.
    pub held_requests: IntGaugeVec,
    /// `ballast_gateway_oldest_hold_seconds{pool}`: how long the longest-held request still
    /// held has been held (0 when none is).
    pub oldest_hold: GaugeVec,
    /// `ballast_gateway_scrapes_total{outcome}`: the gateway's scrapes of its endpoints.
    pub scrapes: IntCounterVec,
    /// `ballast_gateway_endpoints_stale`: endpoints whose data is stale (scored on the
    /// gateway's in-flight count alone).
    pub stale: IntGauge,
    /// `ballast_gateway_endpoints_unreachable`: endpoints whose last scrapes could not
    /// connect (not picked while another is reachable).
    pub unreachable: IntGauge,
}

impl std::fmt::Debug for GatewayMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayMetrics").finish_non_exhaustive()
    }
}

impl Default for GatewayMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl GatewayMetrics {
    /// Registers every family.
    pub fn new() -> Self {
        let registry = Registry::new();
        let picks = IntCounterVec::new(
            Opts::new(
                "ballast_gateway_picks_total",
                "Requests the gateway routed, by endpoint and the reason it was picked.",
            ),
            &["endpoint", "reason"],
        )
        .expect("valid");
        let rank_picks = IntCounterVec::new(
            Opts::new(
                "ballast_gateway_rank_picks_total",
                "Requests the gateway sent to a data-parallel rank it picked (X-Data-Parallel-Rank), by endpoint and rank.",
            ),
            &["endpoint", "rank"],
        )
        .expect("valid");
        let refusals = IntCounterVec::new(
            Opts::new(
                "ballast_gateway_refusals_total",
                "Requests the gateway answered itself instead of routing, by HTTP status and error code.",
            ),
            &["code", "reason"],
        )
        .expect("valid");
        let streams = IntCounterVec::new(
            Opts::new(
                "ballast_gateway_streams_total",
                "ext_proc streams by how they ended: routed, refused, ended_early (before the request body ended), error (reset by Envoy).",
            ),
            &["outcome"],
        )
        .expect("valid");
        let pick_duration = HistogramVec::new(
            HistogramOpts::new(
                "ballast_gateway_pick_duration_seconds",
                "Time from a request body's last chunk to the gateway's answer (routed or refused).",
            )
            .buckets(vec![
                0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05,
            ]),
            &["outcome"],
        )
        .expect("valid");
        let prefix_match = Histogram::with_opts(
            HistogramOpts::new(
                "ballast_gateway_prefix_match_ratio",
                "Fraction of a request's prompt blocks, from the first, that the gateway had sent before to where it sent the request (requests with at least one whole block).",
            )
            .buckets(vec![0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0]),
        )
        .expect("valid");
        let prefix_blocks = IntGauge::new(
            "ballast_gateway_prefix_blocks",
            "Prompt blocks the gateway remembers having sent, over all endpoints (about 24 bytes each).",
        )
        .expect("valid");
        let endpoints =
            IntGauge::new("ballast_gateway_endpoints", "Endpoints in the pool.").expect("valid");
        let in_flight = IntGauge::new(
            "ballast_gateway_requests_in_flight",
            "Requests the gateway routed whose response has not ended.",
        )
        .expect("valid");
        let queue_length = IntGauge::new(
            "ballast_gateway_queue_length",
            "Requests held in the gateway while every endpoint is saturated.",
        )
        .expect("valid");
        let queue_wait = Histogram::with_opts(
            HistogramOpts::new(
                "ballast_gateway_queue_wait_seconds",
                "How long requests were held while every endpoint was saturated.",
            )
            .buckets(vec![
                0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
        )
        .expect("valid");
        let held_requests = IntGaugeVec::new(
            Opts::new(
                "ballast_gateway_held_requests",
                "Requests held in the gateway now, waiting for an endpoint with capacity: demand no engine counts yet.",
            ),
            &["pool"],
        )
        .expect("valid");
        let oldest_hold = GaugeVec::new(
            Opts::new(
                "ballast_gateway_oldest_hold_seconds",
                "How long the longest-held request still held has been held (0 when none is).",
            ),
            &["pool"],
        )
        .expect("valid");
        let scrapes = IntCounterVec::new(
            Opts::new(
                "ballast_gateway_scrapes_total",
                "The gateway's scrapes of its endpoints' metrics, by outcome (ok, or why not).",
            ),
            &["outcome"],
        )
        .expect("valid");
        let stale = IntGauge::new(
            "ballast_gateway_endpoints_stale",
            "Endpoints whose metrics are stale or never read: scored on the gateway's own in-flight count.",
        )
        .expect("valid");
        let unreachable = IntGauge::new(
            "ballast_gateway_endpoints_unreachable",
            "Endpoints whose last scrapes could not connect: not picked while another endpoint is reachable.",
        )
        .expect("valid");
        for c in [
            Box::new(picks.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(rank_picks.clone()),
            Box::new(refusals.clone()),
            Box::new(streams.clone()),
            Box::new(pick_duration.clone()),
            Box::new(prefix_match.clone()),
            Box::new(prefix_blocks.clone()),
            Box::new(endpoints.clone()),
            Box::new(in_flight.clone()),
            Box::new(queue_length.clone()),
            Box::new(queue_wait.clone()),
            Box::new(held_requests.clone()),
            Box::new(oldest_hold.clone()),
            Box::new(scrapes.clone()),
            Box::new(stale.clone()),
            Box::new(unreachable.clone()),
        ] {
            registry.register(c).expect("names are unique");
        }
        GatewayMetrics {
            registry,
            picks,
            rank_picks,
            refusals,
            streams,
            pick_duration,
            prefix_match,
            prefix_blocks,
            endpoints,
            in_flight,
            queue_length,
            queue_wait,
            held_requests,
            oldest_hold,
            scrapes,
            stale,
            unreachable,
        }
    }

    /// Drops the per-endpoint series (picks, rank picks) of endpoints not in `present`,
    /// so a gateway that outlives many pods (a fleet that scales and rolls) exports the
    /// pods that exist, not every pod it ever routed to.
    pub fn forget_endpoints_except(&self, present: &std::collections::HashSet<&str>) {
        use prometheus::core::Collector;
        for vec in [&self.picks, &self.rank_picks] {
            for family in vec.collect() {
                for m in family.get_metric() {
                    let labels: std::collections::HashMap<&str, &str> = m
                        .get_label()
                        .iter()
                        .map(|l| (l.name(), l.value()))
                        .collect();
                    if labels.get("endpoint").is_some_and(|e| !present.contains(e)) {
                        let _ = vec.remove(&labels);
                    }
                }
            }
        }
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding into memory cannot fail");
        String::from_utf8(out).expect("the text format is UTF-8")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_series_of_an_endpoint_that_left_are_dropped() {
        let m = GatewayMetrics::new();
        m.picks.with_label_values(&["pod-a", "score"]).inc();
        m.picks.with_label_values(&["pod-b", "prefix"]).inc();
        m.rank_picks.with_label_values(&["pod-b", "0"]).inc();
        m.forget_endpoints_except(&["pod-a"].into());
        let text = m.render();
        assert!(
            text.contains(r#"ballast_gateway_picks_total{endpoint="pod-a",reason="score"} 1"#),
            "{text}"
        );
        assert!(!text.contains("pod-b"), "{text}");
    }
}
