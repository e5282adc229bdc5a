//! The control cycle at fleet scale: 1,000 and 10,000 replicas on loopback, each serving a
//! realistic exposition, scraped, aggregated and decided on by the operator's own code.
//!
//! The replicas are served by child processes (this benchmark re-executed), so the
//! operator side's CPU time is this process's alone: per cycle it reports the wall time,
//! the CPU seconds (user + system) this process spent, and at the end the resident memory.
//! Two expositions:
//!
//! - **vLLM, 8 DP ranks**: what prometheus_client renders for vLLM V1 with 8 engine cores
//!   and one model (the `parse` bench's generator), about 300 KB;
//! - **Ballast, 8 DP ranks**: `tests/fixtures/ballast_dp8_loaded.prom`, saved from a real
//!   `ballast engine --data-parallel-size 8` under load, about 300 KB.
//!
//! `cargo bench -p ballast-operator --bench fleet_scale` (goals: 1,000 targets ≤ 200 ms,
//! 10,000 ≤ 2 s per cycle on 2 cores). `-- 1000` runs one size only, `-- vllm-dp8` or
//! `-- ballast-dp8` one exposition only.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ballast_operator::decide::{DecideInput, History, decide};
use ballast_operator::scrape::{ScrapeConfig, Scraper, Target, Tracker};
use ballast_operator::signals::Dialect;

#[path = "common/vllm.rs"]
mod vllm;

/// Replicas one server process holds: a listener and a connection each, well inside the
/// usual 20,000 open files.
const PER_SERVER: usize = 5_000;
const CYCLES: usize = 5;
const SERVE_ENV: &str = "BALLAST_FLEET_SERVE";

fn main() {
    raise_open_files();
    if let Ok(spec) = std::env::var(SERVE_ENV) {
        serve(&spec);
        return;
    }
    let sizes: Vec<usize> = match std::env::args().skip(1).find_map(|a| a.parse().ok()) {
        Some(n) => vec![n],
        None => vec![1_000, 10_000],
    };
    let kinds: Vec<&'static str> = ["vllm-dp8", "ballast-dp8"]
        .into_iter()
        .filter(|k| {
            let named: Vec<String> = std::env::args()
                .skip(1)
                .filter(|a| a.parse::<usize>().is_err())
                .collect();
            named.is_empty() || named.iter().any(|a| a == k)
        })
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let _ = rustls::crypto::ring::default_provider().install_default();
    println!(
        "{:<22} {:>7} {:>9} {:>9} {:>9} {:>7} {:>11} {:>8}",
        "exposition", "targets", "median", "worst", "CPU s", "kernel", "CPU/target", "RSS MiB"
    );
    for &n in &sizes {
        for &kind in &kinds {
            // In a task, as the operator's control loop runs: the scrapes spread over the
            // runtime's two threads and nothing runs on this one.
            let r = runtime
                .block_on(async move { tokio::spawn(run(kind, n)).await })
                .expect("benchmark task");
            println!(
                "{:<22} {:>7} {:>7.0}ms {:>7.0}ms {:>9.3} {:>6.0}% {:>9.0}µs {:>8.0}",
                format!("{kind} ({} KB)", r.body_bytes / 1000),
                n,
                r.median.as_secs_f64() * 1e3,
                r.worst.as_secs_f64() * 1e3,
                r.cpu_per_cycle,
                r.system_share * 100.0,
                r.cpu_per_cycle / n as f64 * 1e6,
                r.rss_mib
            );
        }
    }
}

struct Report {
    body_bytes: usize,
    median: Duration,
    worst: Duration,
    cpu_per_cycle: f64,
    system_share: f64,
    rss_mib: f64,
}

fn body(kind: &str) -> Vec<u8> {
    match kind {
        "vllm-dp8" => vllm::exposition(8, 1).into_bytes(),
        _ => include_bytes!("../tests/fixtures/ballast_dp8_loaded.prom").to_vec(),
    }
}

async fn run(kind: &'static str, n: usize) -> Report {
    let dialect = if kind.starts_with("vllm") {
        Dialect::Vllm
    } else {
        Dialect::Ballast
    };
    let mut servers = Vec::new();
    let mut targets = Vec::with_capacity(n);
    for first in (0..n).step_by(PER_SERVER) {
        let count = PER_SERVER.min(n - first);
        let (child, ports) = start_server(kind, count);
        servers.push(child);
        targets.extend(ports.into_iter().enumerate().map(|(i, port)| {
            Target::new(
                format!("replica-{}", first + i),
                format!("http://127.0.0.1:{port}"),
            )
        }));
    }
    // What an InferenceService's spec gives the operator (16 scrapes in flight), with a
    // timeout that tolerates this machine being busy.
    let scraper = Scraper::new(ScrapeConfig {
        timeout: Duration::from_secs(10),
        ..ScrapeConfig::default()
    });
    let spec: ballast_crds::InferenceServiceSpec = serde_json::from_value(serde_json::json!({
        "model": {"source": "synthetic:tiny"},
        "autoscaling": {"maxReplicas": 20000}
    }))
    .expect("spec");
    let mut tracker = Tracker::new();
    let history = History::default();
    let epoch = Instant::now();
    let mut walls = Vec::new();
    let mut cpus = Vec::new();
    // Cycle 0 opens the connections; the others reuse them, as a running operator does.
    for cycle in 0..=CYCLES {
        let cpu0 = cpu_seconds();
        let t0 = Instant::now();
        let outcomes = scraper.scrape(dialect, &targets).await;
        let fleet = tracker.observe_outcomes(Instant::now(), &outcomes, 0);
        let reporting = fleet.reporting();
        let outcome = decide(
            &DecideInput::new(&spec, n as i32, fleet),
            &history,
            epoch.elapsed(),
        );
        let wall = t0.elapsed();
        let cpu1 = cpu_seconds();
        let cpu = (cpu1.0 - cpu0.0, cpu1.1 - cpu0.1);
        let failed: Vec<_> = outcomes
            .iter()
            .filter_map(|o| o.result.as_ref().err())
            .collect();
        assert!(
            failed.is_empty(),
            "{} of {n} scrapes failed, e.g. {}",
            failed.len(),
            failed[0]
        );
        assert_eq!(reporting, n);
        std::hint::black_box(outcome);
        if cycle > 0 {
            walls.push(wall);
            cpus.push(cpu);
        }
    }
    let rss_mib = resident_mib();
    drop(scraper);
    for mut s in servers {
        let _ = s.kill();
        let _ = s.wait();
    }
    walls.sort();
    cpus.sort_by(|a: &(f64, f64), b| a.0.total_cmp(&b.0));
    Report {
        body_bytes: body(kind).len(),
        median: walls[walls.len() / 2],
        worst: *walls.last().expect("cycles"),
        cpu_per_cycle: cpus[cpus.len() / 2].0,
        system_share: cpus[cpus.len() / 2].1 / cpus[cpus.len() / 2].0,
        rss_mib,
    }
}

/// Starts a child serving `count` replicas of `kind`; returns it and their ports.
fn start_server(kind: &str, count: usize) -> (Child, Vec<u16>) {
    let mut child = Command::new(std::env::current_exe().expect("own path"))
        .env(SERVE_ENV, format!("{kind}:{count}"))
        .stdout(Stdio::piped())
        .stdin(Stdio::piped())
        .spawn()
        .expect("start the fleet server");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let ports: Vec<u16> = (0..count)
        .map(|_| {
            lines
                .next()
                .expect("a port")
                .expect("read")
                .parse()
                .expect("port")
        })
        .collect();
    (child, ports)
}

/// The child: `count` loopback listeners, each answering every request on a connection
/// with the same prebuilt response (HTTP/1.1, keep-alive). One thread, so the servers take
/// at most one of the two cores from the operator side. Exits when its stdin closes.
fn serve(spec: &str) {
    let (kind, count) = spec.split_once(':').expect("kind:count");
    let count: usize = count.parse().expect("count");
    let body = body(kind);
    let mut response = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    response.extend_from_slice(&body);
    let response: &'static [u8] = response.leak();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let mut out = std::io::stdout().lock();
        for _ in 0..count {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            writeln!(out, "{}", listener.local_addr().expect("addr").port()).expect("stdout");
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    tokio::spawn(answer(stream, response));
                }
            });
        }
        out.flush().expect("stdout");
        drop(out);
        // The parent holds our stdin; when it goes (or dies), so do we.
        tokio::task::spawn_blocking(|| {
            let _ = std::io::stdin().read(&mut [0u8; 1]);
        })
        .await
        .expect("stdin watch");
    });
}

async fn answer(mut stream: tokio::net::TcpStream, response: &'static [u8]) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = stream.set_nodelay(true);
    let mut buf = vec![0u8; 8192];
    let mut have = 0;
    loop {
        match stream.read(&mut buf[have..]).await {
            Ok(0) | Err(_) => return,
            Ok(k) => have += k,
        }
        // A request ends with an empty line; the scraper sends GETs without bodies.
        if buf[..have].windows(4).any(|w| w == b"\r\n\r\n") {
            if stream.write_all(response).await.is_err() {
                return;
            }
            have = 0;
        } else if have == buf.len() {
            return;
        }
    }
}

/// User + system CPU seconds of this process so far (all its threads), and the system part.
fn cpu_seconds() -> (f64, f64) {
    // SAFETY: getrusage only writes the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage for RUSAGE_SELF.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return (f64::NAN, f64::NAN);
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let system = secs(usage.ru_stime);
    (secs(usage.ru_utime) + system, system)
}

/// This process's resident memory now, from /proc.
fn resident_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// 10,000 connections need more than the common 1,024 open files: raise the soft limit to
/// the hard one.
fn raise_open_files() {
    // SAFETY: getrlimit/setrlimit read and write the struct they are given.
    unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}
