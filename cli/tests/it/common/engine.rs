//! `ballast engine` as a child process on a free loopback port, for the tests that drive
//! one engine over HTTP.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What becomes of the engine's log (its stderr).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Log {
    /// Warnings and errors, to the test's own stderr.
    Inherit,
    /// Everything from `info` up, collected in [`EngineProcess::log`] as it comes.
    Capture,
}

/// The engine process, killed on drop.
pub struct EngineProcess {
    pub child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The log so far, with [`Log::Capture`]; empty otherwise.
    pub log: Arc<Mutex<String>>,
}

impl Drop for EngineProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `ballast engine --port 0 ARGS` and waits for its "listening on" line.
pub fn spawn_engine(args: &[&str], log: Log) -> EngineProcess {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ballast"))
        .args(["engine", "--port", "0"])
        .args(args)
        .env(
            "BALLAST_LOG",
            if log == Log::Capture { "info" } else { "warn" },
        )
        .stdout(Stdio::piped())
        .stderr(if log == Log::Capture {
            Stdio::piped()
        } else {
            Stdio::inherit()
        })
        .spawn()
        .expect("spawn ballast");
    let text = Arc::new(Mutex::new(String::new()));
    if let Some(mut stderr) = child.stderr.take() {
        let sink = text.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = stderr.read(&mut buf) {
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
    }
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let base = line
        .trim()
        .strip_prefix("ballast engine listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    EngineProcess {
        child,
        base,
        log: text,
    }
}

/// Waits for `child` to exit; panics after `timeout`.
pub fn wait_exit(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "process did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An HTTP client (rustls with ring).
pub fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

/// An HTTP client that keeps no idle connection: each request opens its own. What a test
/// of a draining server needs, which closes idle keep-alive connections: a request sent on
/// one at that moment is lost on the wire, a race of HTTP/1.1 keep-alive that real clients
/// avoid with the shutdown delay's `Connection: close`, not something the server can fix.
pub fn fresh_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("a client")
}
