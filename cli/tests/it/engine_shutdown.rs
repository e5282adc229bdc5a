//! `ballast engine --shutdown-delay` as a real process: SIGTERM, then requests over
//! loopback during the delay and after it, the in-flight stream, the exit code and the log
//! of each phase.

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::engine::{Log, client, spawn_engine as spawn, wait_exit};
use futures::StreamExt;
use serde_json::{Value, json};

fn closes(r: &reqwest::Response) -> bool {
    r.headers()
        .get("connection")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_keeps_serving_for_the_shutdown_delay_then_drains_and_exits_zero() {
    let _group = crate::common::group(module_path!());
    let delay = Duration::from_secs(3);
    let mut engine = spawn(
        &[
            "--model",
            "synthetic:small",
            "--max-model-len",
            "2100",
            "--shutdown-delay",
            "3",
        ],
        Log::Capture,
    );
    let c = client();
    let url = |path: &str| format!("{}{path}", engine.base);
    let short = json!({"prompt": "short", "max_tokens": 2});
    let r = c.get(url("/health")).send().await.unwrap();
    assert_eq!((r.status().as_u16(), closes(&r)), (200, false));

    // A stream accepted before the signal, long enough to outlast the delay on its own
    // (about 10 s here): a shorter one can finish during the delay when the socket
    // buffers hold its whole body, and the engine then exits before the drain is seen.
    let tokens = 2000;
    let body = json!({
        "prompt": "finish me", "max_tokens": tokens, "ignore_eos": true,
        "stream": true, "stream_options": {"include_usage": true},
    });
    let resp = c
        .post(url("/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let mut text = String::from_utf8(stream.next().await.unwrap().unwrap().to_vec()).unwrap();

    let pid = engine.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let signalled = Instant::now();
    // /health turns 503 `terminating` at once...
    let deadline = signalled + delay;
    loop {
        let r = c.get(url("/health")).send().await.unwrap();
        if r.status() == 503 {
            assert!(closes(&r));
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["error"]["code"], "terminating", "{v}");
            break;
        }
        assert!(Instant::now() < deadline, "/health never said terminating");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // ...while new requests are still served, each with Connection: close.
    for _ in 0..3 {
        let r = c
            .post(url("/v1/completions"))
            .json(&short)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert!(closes(&r), "{:?}", r.headers());
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["usage"]["completion_tokens"], 2, "{v}");
    }
    let r = c
        .post(url("/v1/completions"))
        .json(&json!({"prompt": "s", "max_tokens": 2, "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(closes(&r), "streams too: {:?}", r.headers());
    assert!(r.text().await.unwrap().trim_end().ends_with("data: [DONE]"));
    assert!(
        signalled.elapsed() < delay,
        "the requests above took longer than the delay ({:?}); they prove nothing",
        signalled.elapsed()
    );

    // After the delay: new requests get 503 `draining`.
    let deadline = signalled + delay + Duration::from_secs(10);
    loop {
        let r = c
            .post(url("/v1/completions"))
            .json(&short)
            .send()
            .await
            .unwrap();
        if r.status() == 503 {
            assert!(
                signalled.elapsed() >= delay - Duration::from_millis(100),
                "drained after {:?}, before the delay",
                signalled.elapsed()
            );
            assert!(closes(&r));
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["error"]["code"], "draining", "{v}");
            break;
        }
        assert_eq!(r.status(), 200);
        assert!(Instant::now() < deadline, "never started draining");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        engine.child.try_wait().unwrap().is_none(),
        "exited with the stream in flight"
    );
    // The stream accepted before the signal runs to its end.
    while let Some(chunk) = stream.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    assert!(
        text.trim_end().ends_with("data: [DONE]"),
        "stream cut short: {text}"
    );
    let usage_line = text
        .lines()
        .rev()
        .find(|l| l.contains("\"usage\":{"))
        .expect("usage chunk");
    let usage: Value = serde_json::from_str(usage_line.strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], tokens);
    let status = wait_exit(&mut engine.child, Duration::from_secs(30));
    assert_eq!(status.code(), Some(0));

    // Each phase is in the log, in order.
    std::thread::sleep(Duration::from_millis(100));
    let log = engine.log.lock().unwrap().clone();
    let at = |needle: &str| {
        log.find(needle)
            .unwrap_or_else(|| panic!("no {needle:?} in the log:\n{log}"))
    };
    assert!(at("shutting down: still admitting") < at("draining: new requests get 503"));
    assert!(at("draining: new requests get 503") < at("drained"));
}
