//! Helpers shared by the tests that run the `ballast` binary.

#![allow(dead_code)]

use std::process::Command;

pub mod engine;
mod group;
pub mod local;

pub use group::group;

/// `GET url` with curl (5 s limit): the body of any HTTP answer, `None` when none came.
pub fn get(url: &str) -> Option<String> {
    let out = Command::new("curl")
        .args(["-s", "-m", "5", url])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Connections a test holds open against a server's limits (a slow-loris flood), and
/// which of them the server has closed.
pub struct Held {
    conns: Vec<std::net::TcpStream>,
    closed: Vec<bool>,
}

impl Held {
    /// Holds `conns`; reads on them no longer block.
    pub fn new(conns: Vec<std::net::TcpStream>) -> Held {
        for c in &conns {
            c.set_nonblocking(true).unwrap();
        }
        let closed = vec![false; conns.len()];
        Held { conns, closed }
    }

    /// How many connections there are.
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// How many the server has closed so far (an end of stream or a reset; a closed one
    /// stays counted). One pass costs a non-blocking read per open connection.
    pub fn closed(&mut self) -> usize {
        use std::io::Read;
        for (c, closed) in self.conns.iter().zip(self.closed.iter_mut()) {
            if *closed {
                continue;
            }
            let mut buf = [0u8; 1];
            *closed = match (&*c).read(&mut buf) {
                Ok(0) => true,
                Ok(_) => false,
                Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
            };
        }
        self.closed.iter().filter(|c| **c).count()
    }
}
