//! One module's tests at a time.
//!
//! The tests were a binary per file, and cargo runs binaries one after another: the cluster
//! e2e, the image build and the local fleet each had the machine to themselves (CI has two
//! cores). In one binary, libtest would run any two tests side by side. Each test starts
//! with [`group`]: tests of the module already running join it, others wait until its
//! last test ends. The order within a module, and its parallelism, are libtest's as before.

use std::sync::{Condvar, Mutex};

/// The module running now and how many of its tests are in flight.
static RUNNING: Mutex<(Option<String>, usize)> = Mutex::new((None, 0));
static ENDED: Condvar = Condvar::new();

/// Held for the length of one test; dropping it (also when the test panics) lets the next
/// module start once its module has no test left.
pub struct Group;

/// Waits until no other module's test runs, then counts this one in. `module` is the
/// caller's `module_path!()`; its module under the binary's root names the group.
pub fn group(module: &str) -> Group {
    let name = module.split("::").nth(1).unwrap_or(module).to_string();
    let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
    while running.0.as_ref().is_some_and(|g| *g != name) {
        running = ENDED.wait(running).unwrap_or_else(|e| e.into_inner());
    }
    running.0 = Some(name);
    running.1 += 1;
    Group
}

impl Drop for Group {
    fn drop(&mut self) {
        let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        running.1 -= 1;
        if running.1 == 0 {
            running.0 = None;
            ENDED.notify_all();
        }
    }
}
