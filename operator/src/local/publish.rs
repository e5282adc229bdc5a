//! Publishing one service of `ballast local`: what its supervisor knows, written where
//! the rest of the process reads it: the router's routes, `GET /status` and
//! `GET /replicas`, the operator's metrics, the live page's timeline and the terminal view.
//! It reads nothing back and decides nothing.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use ballast_crds::{AutoscalingSpec, Decision};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::admin::{
    LOCAL_NAMESPACE, OperatorMetrics, ReplicaInfo, ReplicaMap, StatusMap, TimelineHandle,
};
use super::replica::{Phase, Replica};
use super::router::{Backend, RouteTable, ServiceRoutes};
use super::timeline;
use super::view::View;
use crate::decide::Outcome;
use crate::period;
use crate::status::{self, ReplicaCounts, StatusParts};

/// Where the services of one `ballast local` publish.
#[derive(Clone)]
pub struct Outputs {
    /// The router's routes.
    pub routes: Arc<RouteTable>,
    /// Operator metrics.
    pub metrics: Arc<OperatorMetrics>,
    /// Statuses served on /status.
    pub status: StatusMap,
    /// Replicas served on /replicas.
    pub replicas: ReplicaMap,
    /// What the live page plots.
    pub timeline: TimelineHandle,
    /// The live view.
    pub view: Arc<Mutex<View>>,
}

/// One service's state, as its supervisor hands it over.
pub struct State<'a> {
    /// Replicas by state.
    pub counts: ReplicaCounts,
    /// Replicas wanted.
    pub desired: i32,
    /// The spec's generation.
    pub generation: Option<i64>,
    /// Conditions, merged.
    pub conditions: &'a [Condition],
    /// When `desired` last changed (RFC 3339).
    pub last_scale_time: Option<String>,
    /// The latest decision.
    pub last_decision: Option<&'a Decision>,
    /// Every replica, in start order.
    pub replicas: &'a [Replica],
    /// The router's backends: ready replicas in rotation.
    pub backends: Vec<Backend>,
    /// How many replicas the router may wait for.
    pub starting: usize,
    /// DP weights set per replica.
    pub dp_weights: &'a BTreeMap<String, Vec<f64>>,
    /// The autoscaling bounds.
    pub autoscaling: &'a AutoscalingSpec,
}

/// Publishes one service.
pub struct Publisher {
    name: String,
    served_name: String,
    out: Outputs,
}

fn phase_word(p: Phase) -> &'static str {
    match p {
        Phase::Starting => "Starting",
        Phase::Ready => "Ready",
        Phase::Draining => "Draining",
        Phase::Failed => "Failed",
    }
}

impl Publisher {
    /// A publisher of service `name` (clients send `served_name`); the live page knows
    /// the service from now on.
    pub fn new(name: &str, served_name: String, out: Outputs) -> Self {
        out.timeline
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add_service(name);
        Self {
            name: name.to_string(),
            served_name,
            out,
        }
    }

    /// The operator's metrics, which the control period records decisions in.
    pub fn metrics(&self) -> &OperatorMetrics {
        &self.out.metrics
    }

    /// Routes, status, replicas, metrics and the view from `s`.
    pub fn publish(&self, s: State<'_>) {
        self.out.routes.publish(ServiceRoutes {
            name: self.name.clone(),
            served_name: self.served_name.clone(),
            backends: s.backends,
            starting: s.starting,
        });
        period::record_state(
            &self.out.metrics,
            LOCAL_NAMESPACE,
            &self.name,
            s.counts,
            s.desired,
            s.autoscaling,
            s.conditions,
        );
        let status = status::assemble(StatusParts {
            name: &self.name,
            generation: s.generation,
            counts: s.counts,
            // One spec for the process's life: no replica runs an older one.
            updated: s.counts.ready + s.counts.starting,
            desired: s.desired,
            last_scale_time: s.last_scale_time,
            conditions: s.conditions,
            last_decision: s.last_decision,
        });
        self.out
            .status
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(self.name.clone(), status);
        let replicas = s
            .replicas
            .iter()
            .map(|r| ReplicaInfo {
                name: r.name.clone(),
                phase: phase_word(r.phase),
                accepting: r.phase == Phase::Ready && r.accepting,
                url: r.base_url(),
                grpc: r.grpc.map(|a| format!("http://{a}")),
                dp_weights: s.dp_weights.get(&r.name).cloned(),
            })
            .collect();
        self.out
            .replicas
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(self.name.clone(), replicas);
        let c = s.counts;
        self.out
            .view
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replicas(
                &self.name,
                c.ready,
                c.starting,
                c.draining,
                c.accepting,
                s.desired,
            );
    }

    /// A decision acted on: the view, and the live page's timeline with the replicas
    /// after acting.
    pub fn decision(
        &self,
        outcome: &Outcome,
        decision: &Decision,
        counts: ReplicaCounts,
        desired: i32,
    ) {
        self.out
            .view
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .decision(&self.name, decision);
        self.out
            .timeline
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record(
                &self.name,
                timeline::unix_now(),
                timeline::Replicas {
                    ready: counts.ready,
                    starting: counts.starting,
                    draining: counts.draining,
                    accepting: counts.accepting,
                    desired,
                },
                outcome,
            );
    }

    /// Takes the service out of the router (nothing to route to, nothing to wait for).
    pub fn withdraw(&self) {
        self.out.routes.publish(ServiceRoutes {
            name: self.name.clone(),
            served_name: self.served_name.clone(),
            backends: Vec::new(),
            starting: 0,
        });
    }
}
