//! The exchange, message by message, as Envoy would send them.

use std::collections::HashMap;

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, Metadata};
use envoy_types::pb::google::protobuf::ListValue;

use super::*;
use crate::pool::Endpoint;

fn shared(ports: &[u16], models: &[&str]) -> Shared {
    let pool = Pool::default();
    pool.set(
        ports
            .iter()
            .map(|&p| Endpoint::at(SocketAddr::from(([127, 0, 0, 1], p))))
            .collect(),
    );
    Shared::new(
        Arc::new(pool),
        ProcessorConfig {
            max_body_bytes: 1 << 20,
            models: models.iter().map(|m| m.to_string()).collect(),
            retry_after_secs: 2,
            priority_header: "x-ballast-priority".into(),
            queue_max: 2,
            queue_timeout: Duration::from_millis(50),
            hold_max: 2,
            hold_max_bytes: 1000,
            hold_timeout: Duration::from_millis(50),
            blocking: Blocking::default(),
        },
        Arc::new(GatewayMetrics::new()),
    )
}

fn headers(pairs: &[(&str, &str)], end_of_stream: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(In::RequestHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: pairs
                    .iter()
                    .map(|(k, v)| HeaderValue {
                        key: k.to_string(),
                        raw_value: v.as_bytes().to_vec(),
                        ..Default::default()
                    })
                    .collect(),
            }),
            end_of_stream,
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn post() -> ProcessingRequest {
    headers(&[(":method", "POST"), (":path", "/v1/completions")], false)
}

fn body(bytes: &[u8], end_of_stream: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(In::RequestBody(HttpBody {
            body: bytes.to_vec(),
            end_of_stream,
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn response_body(bytes: &[u8], end_of_stream: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(In::ResponseBody(HttpBody {
            body: bytes.to_vec(),
            end_of_stream,
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// The destination a headers response sets, in the header and the metadata; both must agree.
fn destination(r: &ProcessingResponse) -> String {
    let Some(Out::RequestHeaders(h)) = &r.response else {
        panic!("not a request headers response: {r:?}");
    };
    let common = h.response.as_ref().unwrap();
    assert!(common.clear_route_cache);
    let set = &common.header_mutation.as_ref().unwrap().set_headers;
    assert!(
        set.len() == 1 || rank_header(r).is_some(),
        "only the destination and the rank: {set:?}"
    );
    let header = set[0].header.as_ref().unwrap();
    assert_eq!(header.key, DESTINATION);
    let value = String::from_utf8(header.raw_value.clone()).unwrap();
    let meta = r.dynamic_metadata.as_ref().unwrap();
    let Some(Kind::StructValue(ns)) = &meta.fields[DESTINATION_NAMESPACE].kind else {
        panic!("no envoy.lb namespace");
    };
    assert_eq!(
        ns.fields[DESTINATION].kind,
        Some(Kind::StringValue(value.clone()))
    );
    value
}

/// The `X-Data-Parallel-Rank` a headers response sets, if any.
fn rank_header(r: &ProcessingResponse) -> Option<String> {
    let Some(Out::RequestHeaders(h)) = &r.response else {
        panic!("not a request headers response: {r:?}");
    };
    let set = &h.response.as_ref()?.header_mutation.as_ref()?.set_headers;
    let found: Vec<String> = set
        .iter()
        .filter_map(|o| o.header.as_ref())
        .filter(|h| h.key == DP_RANK)
        .map(|h| String::from_utf8(h.raw_value.clone()).unwrap())
        .collect();
    assert!(found.len() <= 1, "one rank header at most: {found:?}");
    found.into_iter().next()
}

/// The chunks of streamed body responses, each with its end-of-stream flag.
fn chunks(replies: &[ProcessingResponse]) -> Vec<(Vec<u8>, bool)> {
    replies
        .iter()
        .filter_map(|r| match &r.response {
            Some(Out::RequestBody(b) | Out::ResponseBody(b)) => {
                match &b.response.as_ref()?.body_mutation.as_ref()?.mutation {
                    Some(body_mutation::Mutation::StreamedResponse(s)) => {
                        Some((s.body.clone(), s.end_of_stream))
                    }
                    _ => None,
                }
            }
            _ => None,
        })
        .collect()
}

/// The status, headers and JSON body of an immediate response.
fn immediate_of(step: &Step) -> (i32, HashMap<String, String>, serde_json::Value) {
    assert!(step.done, "a refusal ends the stream");
    assert_eq!(step.replies.len(), 1);
    let Some(Out::ImmediateResponse(i)) = &step.replies[0].response else {
        panic!("not an immediate response: {:?}", step.replies[0]);
    };
    let headers = i
        .headers
        .as_ref()
        .unwrap()
        .set_headers
        .iter()
        .map(|h| {
            let h = h.header.as_ref().unwrap();
            (
                h.key.clone(),
                String::from_utf8(h.raw_value.clone()).unwrap(),
            )
        })
        .collect();
    (
        i.status.as_ref().unwrap().code,
        headers,
        serde_json::from_slice(&i.body).unwrap(),
    )
}

fn refused(s: &Shared, code: &str, reason: &str) -> u64 {
    s.metrics.refusals.with_label_values(&[code, reason]).get()
}

#[test]
fn a_body_is_routed_after_its_last_chunk_and_sent_back_whole() {
    let s = shared(&[8001, 8002], &[]);
    let mut x = Exchange::new(&s);
    let json = br#"{"model":"m","prompt":"hello there","max_tokens":8}"#;
    assert!(x.on(post()).replies.is_empty());
    assert!(x.on(body(&json[..10], false)).replies.is_empty());
    let step = x.on(body(&json[10..], true));
    assert!(!step.done);
    let dest = destination(&step.replies[0]);
    assert!(
        dest == "127.0.0.1:8001" || dest == "127.0.0.1:8002",
        "{dest}"
    );
    let got = chunks(&step.replies[1..]);
    assert_eq!(got, vec![(json.to_vec(), true)]);
    assert_eq!(s.metrics.in_flight.get(), 1);
    assert_eq!(
        s.metrics
            .picks
            .with_label_values(&[dest.as_str(), "in_flight"])
            .get(),
        1
    );
    // The response passes through; its end releases the endpoint.
    let step = x.on(response_body(b"data: {}\n\n", false));
    assert_eq!(
        chunks(&step.replies),
        vec![(b"data: {}\n\n".to_vec(), false)]
    );
    assert_eq!(s.metrics.in_flight.get(), 1);
    x.on(response_body(b"data: [DONE]\n\n", true));
    assert_eq!(s.metrics.in_flight.get(), 0);
    assert!(s.pool.endpoints().iter().all(|e| e.in_flight() == 0));
    assert_eq!(x.closed(), "routed");
}

#[test]
fn a_large_body_goes_back_in_chunks_of_at_most_62000_bytes() {
    let s = shared(&[8001], &[]);
    let mut x = Exchange::new(&s);
    let prompt = "x".repeat(150_000);
    let json = serde_json::to_vec(&serde_json::json!({"prompt": prompt})).unwrap();
    x.on(post());
    let mut step = Step::default();
    for (i, part) in json.chunks(16_384).enumerate() {
        step = x.on(body(part, (i + 1) * 16_384 >= json.len()));
    }
    let got = chunks(&step.replies[1..]);
    assert_eq!(got.len(), 3);
    assert!(got.iter().all(|(c, _)| c.len() <= MAX_CHUNK));
    let flags: Vec<bool> = got.iter().map(|(_, eos)| *eos).collect();
    assert_eq!(flags, vec![false, false, true]);
    let whole: Vec<u8> = got.into_iter().flat_map(|(c, _)| c).collect();
    assert_eq!(whole, json);
}

#[test]
fn a_body_past_the_cap_is_a_413_at_once() {
    let s = shared(&[8001], &[]);
    let mut x = Exchange::new(&s);
    x.on(post());
    assert!(x.on(body(&vec![b' '; 600_000], false)).replies.is_empty());
    let step = x.on(body(&vec![b' '; 600_000], false));
    let (status, headers, json) = immediate_of(&step);
    assert_eq!(status, 413);
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(json["error"]["code"], "body_too_large");
    // What Envoy still sends changes nothing.
    assert!(x.on(body(b"{}", true)).replies.is_empty());
    assert_eq!(refused(&s, "413", "body_too_large"), 1);
    assert_eq!(s.metrics.in_flight.get(), 0);
}

#[test]
fn malformed_json_is_a_400_and_an_unknown_model_a_404() {
    let s = shared(&[8001], &["smollm2"]);
    let mut x = Exchange::new(&s);
    x.on(post());
    let (status, _, json) = immediate_of(&x.on(body(b"{\"model\": ", true)));
    assert_eq!(
        (status, json["error"]["code"].as_str()),
        (400, Some("invalid_json"))
    );

    let mut x = Exchange::new(&s);
    x.on(post());
    let (status, _, json) = immediate_of(&x.on(body(br#"{"model":"gpt-4"}"#, true)));
    assert_eq!(status, 404);
    assert_eq!(json["error"]["param"], "model");

    let mut x = Exchange::new(&s);
    x.on(post());
    let step = x.on(body(br#"{"model":"smollm2","messages":[]}"#, true));
    assert_eq!(destination(&step.replies[0]), "127.0.0.1:8001");
    assert_eq!(refused(&s, "400", "invalid_json"), 1);
    assert_eq!(refused(&s, "404", "model_not_found"), 1);
}

#[test]
fn an_empty_pool_holds_within_its_bounds_and_sends_on_when_an_endpoint_comes() {
    let s = shared(&[], &[]);
    // Held: the pool may be scaling from zero. Two at most here (`--hold-max`).
    let mut a = Exchange::new(&s);
    a.on(post());
    let step = a.on(body(b"{}", true));
    assert!(step.hold && step.replies.is_empty());
    assert!(a.held_for_empty());
    let mut b = Exchange::new(&s);
    b.on(post());
    assert!(b.on(body(b"{}", true)).hold);
    assert_eq!(
        s.held.load(Ordering::Relaxed),
        2,
        "held requests are demand"
    );
    assert!(s.oldest_hold().is_some());
    let mut c = Exchange::new(&s);
    c.on(post());
    let (status, headers, json) = immediate_of(&c.on(body(b"{}", true)));
    assert_eq!(
        (status, json["error"]["code"].as_str()),
        (503, Some("hold_full"))
    );
    assert_eq!(headers["retry-after"], "2");
    // One that waited its longest is a 503 too, and leaves the hold.
    let step = b.expire(Instant::now());
    let (status, _, json) = immediate_of(&step);
    assert_eq!(
        (status, json["error"]["code"].as_str()),
        (503, Some("hold_timeout"))
    );
    assert_eq!(s.held.load(Ordering::Relaxed), 1);
    // More bytes than `--hold-max-bytes` (1000 here): refused, nothing held.
    let mut big = Exchange::new(&s);
    big.on(post());
    let large = format!("{{\"prompt\":\"{}\"}}", "x".repeat(1200));
    let (status, _, json) = immediate_of(&big.on(body(large.as_bytes(), true)));
    assert_eq!(
        (status, json["error"]["code"].as_str()),
        (503, Some("hold_full"))
    );
    assert_eq!(s.held.load(Ordering::Relaxed), 1);
    // An endpoint comes: the held request goes there, not counted as saturated.
    s.pool.set(vec![crate::pool::Endpoint::at(
        "127.0.0.1:8001".parse().unwrap(),
    )]);
    let step = a.release(Instant::now());
    assert_eq!(destination(&step.replies[0]), "127.0.0.1:8001");
    assert_eq!(chunks(&step.replies[1..]), vec![(b"{}".to_vec(), true)]);
    assert_eq!(s.held.load(Ordering::Relaxed), 0);
    assert_eq!(s.oldest_hold(), None);
    assert_eq!(
        s.metrics
            .picks
            .with_label_values(&["127.0.0.1:8001", "saturated"])
            .get(),
        0
    );
    assert_eq!(refused(&s, "503", "hold_full"), 2);
    assert_eq!(refused(&s, "503", "hold_timeout"), 1);
}

#[test]
fn the_subset_hint_is_honoured_from_metadata_or_header() {
    let s = shared(&[8001, 8002, 8003], &[]);
    let hint = |v: Value| {
        let mut m = Metadata::default();
        m.filter_metadata.insert(
            SUBSET_NAMESPACE.into(),
            Struct {
                fields: [(SUBSET.to_string(), v)].into(),
            },
        );
        m
    };
    let list = Value {
        kind: Some(Kind::ListValue(ListValue {
            values: vec![
                string_value("127.0.0.1:8003"),
                string_value("not an address"),
            ],
        })),
    };
    for _ in 0..3 {
        let mut x = Exchange::new(&s);
        let mut h = post();
        h.metadata_context = Some(hint(list.clone()));
        x.on(h);
        let step = x.on(body(b"{}", true));
        assert_eq!(destination(&step.replies[0]), "127.0.0.1:8003");
    }
    let mut x = Exchange::new(&s);
    x.on(headers(
        &[(":method", "POST"), (SUBSET, "127.0.0.1:8002")],
        false,
    ));
    assert_eq!(
        destination(&x.on(body(b"{}", true)).replies[0]),
        "127.0.0.1:8002"
    );

    let mut x = Exchange::new(&s);
    let mut h = post();
    h.metadata_context = Some(hint(string_value("10.9.9.9:80")));
    x.on(h);
    let (status, _, json) = immediate_of(&x.on(body(b"{}", true)));
    assert_eq!(
        (status, json["error"]["code"].as_str()),
        (503, Some("no_endpoint_in_subset"))
    );
    assert_eq!(
        s.metrics
            .picks
            .with_label_values(&["127.0.0.1:8003", "subset"])
            .get(),
        3
    );
}

#[test]
fn a_request_without_body_is_routed_at_its_headers() {
    let s = shared(&[8001], &[]);
    let mut x = Exchange::new(&s);
    let step = x.on(headers(
        &[(":method", "GET"), (":path", "/v1/models")],
        true,
    ));
    assert_eq!(step.replies.len(), 1);
    assert_eq!(destination(&step.replies[0]), "127.0.0.1:8001");
}

#[test]
fn request_trailers_end_the_body() {
    let s = shared(&[8001], &[]);
    let mut x = Exchange::new(&s);
    x.on(post());
    x.on(body(b"{}", false));
    let step = x.on(ProcessingRequest {
        request: Some(In::RequestTrailers(Default::default())),
        ..Default::default()
    });
    assert_eq!(chunks(&step.replies[1..]), vec![(b"{}".to_vec(), false)]);
    assert!(matches!(
        step.replies.last().unwrap().response,
        Some(Out::RequestTrailers(_))
    ));
}

#[test]
fn a_stream_that_ends_early_or_is_dropped_holds_nothing() {
    let s = shared(&[8001], &[]);
    let mut x = Exchange::new(&s);
    x.on(post());
    x.on(body(b"{\"pro", false));
    assert_eq!(x.closed(), "ended_early");
    {
        let mut x = Exchange::new(&s);
        x.on(post());
        x.on(body(b"{}", true));
        assert_eq!(s.pool.endpoints()[0].in_flight(), 1);
    }
    assert_eq!(s.pool.endpoints()[0].in_flight(), 0);
    assert_eq!(s.metrics.in_flight.get(), 0);
}

fn saturate(s: &Shared) {
    let now = Instant::now();
    for e in s.pool.endpoints() {
        let hot = ballast_operator::signals::ReplicaSample {
            waiting_capacity: Some(9.0),
            running: Some(8.0),
            kv_usage: Some(0.5),
            ..Default::default()
        };
        e.observe(now, &hot);
    }
    assert!(s.pool.saturated(None, now));
}

#[test]
fn a_saturated_pool_sheds_the_sheddable_and_holds_the_rest_within_bounds() {
    let s = shared(&[8001, 8002], &[]);
    saturate(&s);
    let mut x = Exchange::new(&s);
    x.on(headers(
        &[(":method", "POST"), ("x-ballast-priority", "-1")],
        false,
    ));
    let (status, answer_headers, json) = immediate_of(&x.on(body(b"{}", true)));
    assert_eq!(
        (status, json["error"]["code"].as_str()),
        (429, Some("shed"))
    );
    assert_eq!(answer_headers["retry-after"], "2");

    // Not sheddable: held, two at most (the queue's bound in these tests).
    assert_eq!(s.oldest_hold(), None);
    let mut a = Exchange::new(&s);
    a.on(post());
    let before_a = Instant::now();
    let step = a.on(body(b"{}", true));
    assert!(step.hold && step.replies.is_empty());
    let first = s.oldest_hold().expect("a request is held");
    assert!(first >= before_a);
    let mut b = Exchange::new(&s);
    b.on(headers(
        &[(":method", "POST"), ("x-ballast-priority", "3")],
        false,
    ));
    assert!(b.on(body(b"{}", true)).hold);
    assert_eq!(s.held.load(Ordering::Relaxed), 2);
    assert_eq!(s.metrics.queue_length.get(), 2);
    // The queue is full: the next one is sent on at once.
    let mut c = Exchange::new(&s);
    c.on(post());
    let step = c.on(body(b"{}", true));
    assert!(!step.hold);
    destination(&step.replies[0]);
    assert_eq!(
        s.oldest_hold(),
        Some(first),
        "the oldest hold is the first one's"
    );
    // A held request released is routed, as saturated.
    let step = a.release(Instant::now());
    let second = s.oldest_hold().expect("b is still held");
    assert!(second >= first, "the oldest hold is now b's");
    let dest = destination(&step.replies[0]);
    assert_eq!(chunks(&step.replies[1..]), vec![(b"{}".to_vec(), true)]);
    assert_eq!(
        s.metrics
            .picks
            .with_label_values(&[dest.as_str(), "saturated"])
            .get()
            + s.metrics
                .picks
                .with_label_values(&[
                    if dest.ends_with("8001") {
                        "127.0.0.1:8002"
                    } else {
                        "127.0.0.1:8001"
                    },
                    "saturated"
                ])
                .get(),
        2
    );
    // One whose client went away leaves the queue.
    assert_eq!(b.closed(), "abandoned");
    drop(b);
    assert_eq!(s.held.load(Ordering::Relaxed), 0);
    assert_eq!(s.oldest_hold(), None, "nothing held, no oldest hold");
    assert_eq!(s.metrics.queue_length.get(), 0);
    assert_eq!(s.metrics.queue_wait.get_sample_count(), 1);
    assert_eq!(refused(&s, "429", "shed"), 1);
}

#[test]
fn a_priority_that_is_not_an_integer_is_a_400() {
    let s = shared(&[8001], &[]);
    let mut x = Exchange::new(&s);
    let (status, _, json) = immediate_of(&x.on(headers(
        &[(":method", "POST"), ("x-ballast-priority", "high")],
        false,
    )));
    assert_eq!(
        (status, json["error"]["code"].as_str()),
        (400, Some("invalid_header"))
    );
}

#[test]
fn a_429_from_the_endpoint_counts_against_it() {
    let s = shared(&[8001], &[]);
    let mut x = Exchange::new(&s);
    x.on(post());
    x.on(body(b"{}", true));
    let mut h = headers(&[(":status", "429")], false);
    let Some(In::RequestHeaders(hh)) = h.request.take() else {
        unreachable!()
    };
    h.request = Some(In::ResponseHeaders(hh));
    x.on(h);
    let snap = s.pool.endpoints()[0].snapshot(Instant::now());
    assert!(snap.rejections_per_second > 0.5, "{snap:?}");
}

#[test]
fn the_rank_with_room_is_picked_and_sent_as_a_header() {
    use ballast_operator::signals::{RankLoad, ReplicaSample};
    let s = shared(&[8001], &[]);
    let e = &s.pool.endpoints()[0];
    // Rank 0 busy, rank 1 idle: the first picks go to rank 1 until what the gateway sent
    // there outweighs rank 0's load.
    let busy = RankLoad {
        running: 3.0,
        ..RankLoad::default()
    };
    let sample = ReplicaSample {
        running: Some(3.0),
        waiting_capacity: Some(0.0),
        ranks: vec![busy, RankLoad::default()],
        ..ReplicaSample::default()
    };
    e.scrape_began();
    e.observe(Instant::now(), &sample);
    let mut ranks = Vec::new();
    let mut held = Vec::new();
    for _ in 0..5 {
        let mut x = Exchange::new(&s);
        x.on(post());
        let step = x.on(body(b"{}", true));
        ranks.push(rank_header(&step.replies[0]).expect("a rank header"));
        held.push(x);
    }
    assert_eq!(ranks, ["1", "1", "1", "0", "1"]);
    let sent = |rank: &str| {
        s.metrics
            .rank_picks
            .with_label_values(&["127.0.0.1:8001", rank])
            .get()
    };
    assert_eq!((sent("0"), sent("1")), (1, 4));
    // The next scrape shows what was sent: the counts since it start again.
    e.scrape_began();
    e.observe(Instant::now(), &sample);
    let mut x = Exchange::new(&s);
    x.on(post());
    assert_eq!(
        rank_header(&x.on(body(b"{}", true)).replies[0]).as_deref(),
        Some("1")
    );
}

#[test]
fn one_rank_or_stale_data_sends_no_rank_header() {
    use ballast_operator::signals::{RankLoad, ReplicaSample};
    let s = shared(&[8001], &[]);
    let e = &s.pool.endpoints()[0];
    let one = ReplicaSample {
        running: Some(1.0),
        ranks: vec![RankLoad::default()],
        ..ReplicaSample::default()
    };
    e.observe(Instant::now(), &one);
    let mut x = Exchange::new(&s);
    x.on(post());
    assert_eq!(rank_header(&x.on(body(b"{}", true)).replies[0]), None);
    let two = ReplicaSample {
        ranks: vec![RankLoad::default(); 2],
        ..one
    };
    e.observe(Instant::now() - Duration::from_secs(10), &two);
    let mut x = Exchange::new(&s);
    x.on(post());
    assert_eq!(rank_header(&x.on(body(b"{}", true)).replies[0]), None);
}
