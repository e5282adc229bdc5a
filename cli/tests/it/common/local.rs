//! `ballast local` as a child process on ports it picks, for the tests that drive a fleet.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `ballast local` on loopback ports; drained (SIGTERM) and then killed if it takes over
/// 30 s, and its directory removed, on drop.
pub struct Local {
    pub child: Child,
    /// The router, `http://127.0.0.1:PORT`.
    pub router: String,
    /// The admin port, `http://127.0.0.1:PORT`.
    pub admin: String,
    /// Fleet file, `local.log` (its stderr) and the replicas' `logs/`.
    pub dir: PathBuf,
}

impl Drop for Local {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A fresh directory `ballast-WHAT-PID-NANOS` under the system temp dir.
pub fn temp_dir(what: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dir = std::env::temp_dir().join(format!("ballast-{what}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

impl Local {
    /// Starts `ballast local` on the fleet `yaml` (in a new temp dir named after `what`)
    /// and returns once both ports are announced.
    pub fn start(what: &str, yaml: &str) -> Local {
        let dir = temp_dir(what);
        let file = dir.join("fleet.yaml");
        std::fs::write(&file, yaml).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_ballast"))
            .args([
                "local",
                "--port",
                "0",
                "--admin-port",
                "0",
                "--view",
                "none",
            ])
            .arg("--log-dir")
            .arg(dir.join("logs"))
            .arg(&file)
            .env("BALLAST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join("local.log")).unwrap())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut announced = |prefix: &str| {
            let line = lines.next().unwrap().unwrap();
            line.strip_prefix(prefix)
                .unwrap_or_else(|| panic!("unexpected line {line:?}"))
                .to_string()
        };
        let router = announced("ballast local router listening on ");
        let admin = announced("ballast local admin listening on ");
        std::thread::spawn(move || for _ in lines {});
        Local {
            child,
            router,
            admin,
            dir,
        }
    }
}
