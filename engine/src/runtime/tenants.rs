//! Per-tenant running caps (`--max-running-per-tenant`), shared by every rank of the engine.
//!
//! A request whose tenant is at its cap is *deferred*: it waits although capacity may exist,
//! and adding replicas would not start it. The scheduler takes a slot when it first runs a
//! request and gives it back when the request stops running (finish, abort, preemption).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A tenant name (OpenAI `user`, or header `x-tenant`).
pub type Tenant = Arc<str>;

/// Running requests per tenant, with the cap.
#[derive(Debug, Default)]
pub struct TenantLedger {
    cap: Option<u32>,
    running: Mutex<HashMap<Tenant, u32>>,
}

impl TenantLedger {
    /// A ledger with `cap` running requests per tenant (`None`: no cap).
    pub fn new(cap: Option<u32>) -> Self {
        Self {
            cap,
            running: Mutex::new(HashMap::new()),
        }
    }

    /// The cap.
    pub fn cap(&self) -> Option<u32> {
        self.cap
    }

    /// Takes a running slot for `tenant` if it is under its cap.
    pub fn try_acquire(&self, tenant: &Tenant) -> bool {
        let Some(cap) = self.cap else { return true };
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let n = running.entry(Arc::clone(tenant)).or_default();
        if *n >= cap {
            return false;
        }
        *n += 1;
        true
    }

    /// Gives back a slot taken by [`Self::try_acquire`].
    pub fn release(&self, tenant: &Tenant) {
        if self.cap.is_none() {
            return;
        }
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = running.get_mut(tenant) {
            *n -= 1;
            if *n == 0 {
                running.remove(tenant);
            }
        }
    }

    /// Counts how many of `tenants` are at their cap (one lock for the whole batch).
    pub fn count_at_cap<'a>(&self, tenants: impl Iterator<Item = Option<&'a Tenant>>) -> usize {
        let Some(cap) = self.cap else { return 0 };
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        tenants
            .filter(|t| t.is_some_and(|t| running.get(t).copied().unwrap_or(0) >= cap))
            .count()
    }

    /// Running requests of `tenant`.
    pub fn running(&self, tenant: &str) -> u32 {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        running.get(tenant).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_is_enforced_and_released() {
        let l = TenantLedger::new(Some(2));
        let a: Tenant = "a".into();
        let b: Tenant = "b".into();
        assert!(l.try_acquire(&a) && l.try_acquire(&a));
        assert!(!l.try_acquire(&a));
        assert!(l.try_acquire(&b));
        assert_eq!(
            l.count_at_cap([Some(&a), Some(&b), None, Some(&a)].into_iter()),
            2
        );
        l.release(&a);
        assert!(l.try_acquire(&a));
        assert_eq!(l.running("a"), 2);
    }

    #[test]
    fn no_cap_never_defers() {
        let l = TenantLedger::new(None);
        let a: Tenant = "a".into();
        assert!((0..100).all(|_| l.try_acquire(&a)));
        assert_eq!(l.count_at_cap([Some(&a)].into_iter()), 0);
    }
}
