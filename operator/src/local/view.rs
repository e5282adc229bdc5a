//! The live view of `ballast local`: per service, the replicas, the signals, the
//! recommendations and the last decision with its reason.
//!
//! On a terminal the view is redrawn in place after every change; otherwise (logs, CI)
//! each decision is printed once as a block.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write};

use ballast_crds::Decision;

#[derive(Default)]
struct Entry {
    replicas: (i32, i32, i32, i32, i32),
    decision: Option<Decision>,
}

/// What the view shows.
pub struct View {
    services: BTreeMap<String, Entry>,
    redraw: bool,
    enabled: bool,
    header: String,
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.digits$}"))
}

impl View {
    /// A view; `enabled: false` prints nothing (`--no-view`).
    pub fn new(enabled: bool, header: String) -> Self {
        Self {
            services: BTreeMap::new(),
            redraw: std::io::stdout().is_terminal(),
            enabled,
            header,
        }
    }

    /// Replica counts changed.
    pub fn replicas(
        &mut self,
        name: &str,
        ready: i32,
        starting: i32,
        draining: i32,
        accepting: i32,
        desired: i32,
    ) {
        let e = self.services.entry(name.to_string()).or_default();
        let new = (ready, starting, draining, accepting, desired);
        if e.replicas != new {
            e.replicas = new;
            if self.redraw {
                self.draw();
            }
        }
    }

    /// A decision was made.
    pub fn decision(&mut self, name: &str, d: &Decision) {
        self.services.entry(name.to_string()).or_default().decision = Some(d.clone());
        if self.redraw {
            self.draw();
        } else if self.enabled {
            println!("{}", self.block(name));
        }
    }

    fn block(&self, name: &str) -> String {
        let Some(e) = self.services.get(name) else {
            return String::new();
        };
        let (ready, starting, draining, accepting, desired) = e.replicas;
        let mut s = format!(
            "{name}: replicas ready {ready}, starting {starting}, draining {draining}, accepting {accepting}; desired {desired}"
        );
        if let Some(d) = &e.decision {
            let g = &d.signals;
            let _ = write!(
                s,
                "\n  signals   capacityWaiting {}  deferred {}  kvCacheUsage {}  rejections/s {}  ttftP99 {}s",
                opt(g.capacity_waiting, 0),
                opt(g.deferred_waiting, 0),
                opt(g.kv_cache_usage, 2),
                opt(g.admission_rejections_per_second, 2),
                opt(g.ttft_p99_seconds, 3),
            );
            let recs: Vec<String> = d
                .recommendations
                .iter()
                .map(|r| format!("{} → {}", r.signal, r.replicas))
                .collect();
            let _ = write!(
                s,
                "\n  recommend {}",
                if recs.is_empty() {
                    "-".into()
                } else {
                    recs.join(", ")
                }
            );
            let _ = write!(
                s,
                "\n  decision  {:?} ({}): {}",
                d.action, d.reason, d.message
            );
        }
        s
    }

    fn draw(&self) {
        if !self.enabled {
            return;
        }
        let mut out = String::from("\x1b[H\x1b[2J");
        out.push_str(&self.header);
        out.push('\n');
        for name in self.services.keys() {
            out.push('\n');
            out.push_str(&self.block(name));
            out.push('\n');
        }
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(out.as_bytes());
        let _ = stdout.flush();
    }
}
