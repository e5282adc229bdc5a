//! Running the programs a cluster is made of: finding them, running one to completion,
//! starting one in the background with its log in a file, stopping it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The path of `cmd` on the PATH, if it is there.
pub fn which(cmd: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(cmd))
        .find(|p| p.is_file())
}

/// A free port on 127.0.0.1 (free when asked; another process may take it later).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Runs `cmd` to completion: its stdout, or the command and its stderr as the error.
pub fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Starts `cmd` with stdout and stderr appended to `logs/NAME.log`.
pub fn spawn_logged(logs: &Path, name: &str, cmd: &mut Command) -> Result<Child, String> {
    let log = || {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(logs.join(format!("{name}.log")))
            .map_err(|e| e.to_string())
    };
    cmd.stdin(Stdio::null())
        .stdout(log()?)
        .stderr(log()?)
        .spawn()
        .map_err(|e| format!("{name}: {e}"))
}

/// Stops a child: SIGTERM, then SIGKILL after `grace`.
pub fn stop_child(child: &mut Child, grace: Duration) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    // SAFETY: kill(2) on our own child's pid; at worst it fails with ESRCH.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}
