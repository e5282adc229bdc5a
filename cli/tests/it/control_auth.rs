//! The control token on the real `ballast engine` process, driven by the operator's own
//! control client (`ballast_operator::control`) over real gRPC on loopback: calls without,
//! and with a wrong, token are refused and counted; a rotation in which the engine's file
//! still holds only the old token keeps the operator's calls working; a token file that is
//! missing or empty stops the engine at start, naming the file; without one the engine
//! warns that its control API is open. No token ever reaches the log or `/metrics`.

use crate::common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ballast_engine::api::control::proto::engine_control_client::EngineControlClient;
use ballast_engine::api::control::proto::{DrainRequest, GetStatsRequest};
use ballast_operator::control::{ControlClients, ControlTokens, address, result_label};
use common::engine::wait_exit;

const OLD: &str = "ctl-old-6a0e93b4f1d2";
const NEW: &str = "ctl-new-2c7d18e5a9b0";

/// A `ballast engine` with its control API, killed on drop.
struct Engine {
    child: Child,
    /// `http://127.0.0.1:PORT` of the HTTP API.
    base: String,
    /// `http://127.0.0.1:PORT` of the control API.
    control: String,
    log: Arc<Mutex<String>>,
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `ballast engine` with two DP ranks, a control API and `args`, and waits for both
/// "listening" lines.
fn start(args: &[&str]) -> Engine {
    let grpc = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ballast"))
        .args([
            "engine",
            "--model",
            "synthetic:tiny",
            "--port",
            "0",
            "--data-parallel-size",
            "2",
            "--grpc-port",
            &grpc.to_string(),
        ])
        .args(args)
        .env("BALLAST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = Arc::new(Mutex::new(String::new()));
    let mut stderr = child.stderr.take().unwrap();
    let sink = Arc::clone(&log);
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = stderr.read(&mut buf) {
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut announced = |prefix: &str| {
        let line = lines.next().unwrap().unwrap();
        line.strip_prefix(prefix)
            .unwrap_or_else(|| panic!("unexpected line {line:?}"))
            .to_string()
    };
    let control = announced("ballast engine control API listening on ");
    let base = announced("ballast engine listening on ");
    std::thread::spawn(move || for _ in lines {});
    Engine {
        child,
        base,
        control,
        log,
    }
}

/// `ballast engine` with `args` must stop at start with exit code 2; its stderr.
fn refused_at_start(args: &[&std::ffi::OsStr]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ballast"))
        .args(["engine", "--port", "0", "--grpc-port", "0"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_exit(&mut child, Duration::from_secs(30));
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(2), "{err}");
    err
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The engine's `/metrics`.
fn metrics(e: &Engine) -> String {
    common::get(&format!("{}/metrics", e.base)).unwrap()
}

fn refused(text: &str, reason: &str) -> f64 {
    let series = format!(
        "ballast_control_requests_refused_total{{model_name=\"synthetic:tiny\",reason=\"{reason}\"}} "
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .unwrap_or_else(|| panic!("no {series} in /metrics"))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn the_operators_calls_carry_the_token_and_survive_a_rotation() {
    let _group = crate::common::group(module_path!());
    let dir = common::local::temp_dir("control-auth");
    let file = dir.join("token");
    std::fs::write(&file, format!("{OLD}\n")).unwrap();
    let e = start(&["--control-token-file", file.to_str().unwrap()]);
    let port: i32 = e.control.rsplit_once(':').unwrap().1.parse().unwrap();
    let at = address("127.0.0.1", port);
    let rt = runtime();

    // A client that is not the operator: refused, whatever it asks.
    rt.block_on(async {
        let mut c = EngineControlClient::connect(e.control.clone())
            .await
            .unwrap();
        let s = c.drain(DrainRequest {}).await.unwrap_err();
        assert_eq!(s.code(), tonic::Code::Unauthenticated, "{s:?}");
        let s = c.get_stats(GetStatsRequest {}).await.unwrap_err();
        assert_eq!(s.code(), tonic::Code::Unauthenticated, "{s:?}");
    });
    let health = rt
        .block_on(
            common::engine::client()
                .get(format!("{}/health", e.base))
                .send(),
        )
        .unwrap()
        .status();
    assert_eq!(health, 200, "a refused drain drained nothing");

    // The operator's pool with a wrong token: refused, and labelled so.
    let mut pool = ControlClients::new();
    pool.set_tokens(ControlTokens::new(vec!["ctl-guess".into()]));
    let out = rt.block_on(pool.set_dp_weights(vec![("r0".into(), at.clone(), vec![0.25, 0.75])]));
    assert_eq!(result_label(&out[0].2), "unauthenticated", "{out:?}");

    // Mid-rotation: the operator already holds the new token first, the engine's file
    // only the old one (the kubelet has not refreshed it yet). The call still lands.
    pool.set_tokens(ControlTokens::new(vec![NEW.into(), OLD.into()]));
    let out = rt.block_on(pool.set_dp_weights(vec![("r0".into(), at.clone(), vec![0.25, 0.75])]));
    assert_eq!(result_label(&out[0].2), "ok", "{out:?}");
    let weights = rt.block_on(async {
        let mut c = EngineControlClient::connect(e.control.clone())
            .await
            .unwrap();
        let mut req = tonic::Request::new(GetStatsRequest {});
        req.metadata_mut()
            .insert("authorization", format!("Bearer {OLD}").parse().unwrap());
        let stats = c.get_stats(req).await.unwrap().into_inner();
        stats
            .ranks
            .iter()
            .map(|r| r.dispatch_weight)
            .collect::<Vec<_>>()
    });
    assert_eq!(weights, [0.25, 0.75], "the weights the operator set");

    // The file rotates on the engine's side too: new first, then old gone. The pool,
    // holding only the new token once the grace is over, still lands its calls.
    std::fs::write(&file, format!("{NEW}\n")).unwrap();
    pool.set_tokens(ControlTokens::new(vec![NEW.into()]));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let out = rt.block_on(pool.set_dp_weights(vec![("r0".into(), at.clone(), vec![0.5, 0.5])]));
        if result_label(&out[0].2) == "ok" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the engine never read the new token: {out:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    pool.set_tokens(ControlTokens::new(vec![OLD.into()]));
    let out = rt.block_on(pool.set_dp_weights(vec![("r0".into(), at.clone(), vec![0.5, 0.5])]));
    assert_eq!(
        result_label(&out[0].2),
        "unauthenticated",
        "the old token outlived the file: {out:?}"
    );

    let text = metrics(&e);
    assert_eq!(refused(&text, "missing"), 2.0, "{text}");
    assert!(refused(&text, "wrong") >= 3.0, "{text}");
    let log = e.log.lock().unwrap().clone();
    for secret in [OLD, NEW, "ctl-guess"] {
        assert!(!log.contains(secret), "a token in the log:\n{log}");
        assert!(!text.contains(secret), "a token in /metrics");
    }
    assert!(
        !log.contains("the control API is open"),
        "warned with a token file:\n{log}"
    );
    drop(e);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unusable_token_file_stops_the_engine_and_none_warns_that_the_api_is_open() {
    let _group = crate::common::group(module_path!());
    let dir = common::local::temp_dir("control-auth-bad");
    let empty = dir.join("empty");
    std::fs::write(&empty, "\n \n").unwrap();
    let missing = dir.join("missing");
    for (file, says) in [(&empty, "holds no key"), (&missing, "cannot be read")] {
        let err = refused_at_start(&["--control-token-file".as_ref(), file.as_os_str()]);
        assert!(
            err.contains("control-token-file")
                && err.contains(file.to_str().unwrap())
                && err.to_lowercase().contains(says),
            "{err}"
        );
    }
    let e = start(&[]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !e.log.lock().unwrap().contains("the control API is open") {
        assert!(
            std::time::Instant::now() < deadline,
            "no warning that the control API is open:\n{}",
            e.log.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(e);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--control-tls-cert`/`--control-tls-key` on the real process, called by the operator's
/// pool: plain HTTP/2 gets nowhere, TLS that trusts another CA or expects another name is
/// refused, the right CA and name land the call (with the token still required), and a
/// renewed pair from a new CA serves new connections without a restart. A bad file stops
/// the engine at start, naming it.
#[test]
fn the_control_api_over_tls_trusts_its_ca_only_and_follows_a_renewed_pair() {
    let _group = crate::common::group(module_path!());
    use ballast_operator::control::{ControlTrust, tls_address};
    use ballast_operator::metrics_api::certs::{Renewal, issue};

    const NAME: &str = "control.chat.ml.ballast";
    let dir = common::local::temp_dir("control-tls");
    let now = std::time::SystemTime::now();
    let first = issue(None, Renewal::All, &[NAME.to_string()], now).unwrap();
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&cert, &first.tls_crt).unwrap();
    std::fs::write(&key, &first.tls_key).unwrap();
    let token = dir.join("token");
    std::fs::write(&token, format!("{OLD}\n")).unwrap();
    let e = start(&[
        "--control-token-file",
        token.to_str().unwrap(),
        "--control-tls-cert",
        cert.to_str().unwrap(),
        "--control-tls-key",
        key.to_str().unwrap(),
    ]);
    assert!(e.control.starts_with("https://"), "{}", e.control);
    let port: i32 = e.control.rsplit_once(':').unwrap().1.parse().unwrap();
    let rt = runtime();
    let call = |pool: &mut ControlClients, at: &str| {
        let out =
            rt.block_on(pool.set_dp_weights(vec![("r0".into(), at.to_string(), vec![0.5, 0.5])]));
        out.into_iter().next().unwrap().2
    };
    let trusting = |ca: &str, name: &str| {
        let mut pool = ControlClients::new();
        pool.set_tokens(ControlTokens::new(vec![OLD.into()]));
        pool.set_trust(Some(ControlTrust {
            ca_pem: ca.to_string(),
            server_name: name.to_string(),
        }));
        pool
    };

    // Plain HTTP/2 to the TLS port: no answer at all, let alone a call.
    let plain = call(
        &mut trusting(&first.ca_crt, NAME),
        &address("127.0.0.1", port),
    );
    assert_eq!(result_label(&plain), "error", "{plain:?}");
    // TLS without anything to trust is an error that says so, not a silent plain call.
    let mut bare = ControlClients::new();
    let e0 = call(&mut bare, &tls_address("127.0.0.1", port)).unwrap_err();
    assert!(e0.message.contains("no CA to trust"), "{e0:?}");
    // Another CA, or another name: the handshake fails.
    let other = issue(None, Renewal::All, &[NAME.to_string()], now).unwrap();
    let at = tls_address("127.0.0.1", port);
    let r = call(&mut trusting(&other.ca_crt, NAME), &at);
    assert_eq!(result_label(&r), "error", "another CA: {r:?}");
    let r = call(
        &mut trusting(&first.ca_crt, "control.other.ml.ballast"),
        &at,
    );
    assert_eq!(result_label(&r), "error", "another name: {r:?}");
    // The right CA and name: the call lands; over TLS the token is still required.
    let mut pool = trusting(&first.ca_crt, NAME);
    assert_eq!(result_label(&call(&mut pool, &at)), "ok");
    pool.set_tokens(ControlTokens::new(vec!["ctl-guess".into()]));
    assert_eq!(result_label(&call(&mut pool, &at)), "unauthenticated");

    // Renewed from a new CA: new connections that trust it land within a few reloads.
    let renewed = issue(None, Renewal::All, &[NAME.to_string()], now).unwrap();
    std::fs::write(&key, &renewed.tls_key).unwrap();
    std::fs::write(&cert, &renewed.tls_crt).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = call(&mut trusting(&renewed.ca_crt, NAME), &at);
        if result_label(&r) == "ok" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the renewed pair never served: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // A pair that breaks later keeps the last good one (once the engine has read it).
    std::fs::write(&cert, "not a certificate").unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !e
        .log
        .lock()
        .unwrap()
        .contains("keeping the last good certificate")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the broken file was never noticed:\n{}",
            e.log.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let r = call(&mut trusting(&renewed.ca_crt, NAME), &at);
    assert_eq!(result_label(&r), "ok", "{r:?}");
    drop(e);

    // At start a bad file is exit 2, naming it.
    for (c, k, says) in [
        (dir.join("missing.crt"), key.clone(), "missing.crt"),
        (
            cert.clone(),
            key.clone(),
            "tls.crt holds no PEM certificate",
        ),
    ] {
        let err = refused_at_start(&[
            "--control-tls-cert".as_ref(),
            c.as_os_str(),
            "--control-tls-key".as_ref(),
            k.as_os_str(),
        ]);
        assert!(
            err.contains("control-tls-cert") && err.contains(says),
            "{err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
