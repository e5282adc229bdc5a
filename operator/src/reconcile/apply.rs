//! Step 5: make the cluster hold what step 4 built, writing nothing when it already does.
//!
//! Each object is applied with server-side apply under the operator's field manager, but
//! only when the live object of the snapshot does not already contain every field the
//! operator sets ([`contains`]): an unchanged spec, or an operator restart, produces no
//! write at all, and no read either (the snapshot came from the caches). Pods get two
//! small patches: before a scale-down a deletion cost, so the Deployment removes the
//! least-loaded pods first, and the accepting readiness-gate condition (rotation). DP
//! weights go over each pod's control API, with the service's control token, whose Secret
//! is read (and written when it is new or rotates) before the Deployment that mounts it.

use std::fmt::Debug;
use std::sync::Arc;

use ballast_crds::EngineKind;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::build::{Built, Desired};
use super::cache::CrdState;
use super::context::{Context, ServiceState};
use super::error::Error;
use super::gateway::GatewayObjects;
use super::names::{
    ACCEPTING_CONDITION, DELETION_COST, FIELD_MANAGER, inference_pool_resource, picker_name,
    service_monitor_resource,
};
use super::plan::Plan;
use super::snapshot::GatewayLive;

/// Step 5's output: the plan, and the Deployment as the cluster holds it now (the answer
/// of its apply when there was one, else the snapshot's).
#[derive(Debug)]
pub struct Applied<'a> {
    /// Step 3's plan.
    pub plan: Plan<'a>,
    /// The Deployment after this step.
    pub deployment: Option<Arc<Deployment>>,
}

/// Step 5: deletion costs first (so a scale-down removes the least-loaded pods), then the
/// objects, then rotation, then DP weights. Every write is counted in
/// `ballast_operator_api_writes_total`.
pub async fn apply<'a>(
    ctx: &Context,
    state: &mut ServiceState,
    built: Built<'a>,
) -> Result<Applied<'a>, Error> {
    let Built { plan, objects } = built;
    let ns = plan.isvc.namespace().unwrap_or_default();
    let name = plan.isvc.name_any();
    let client = &ctx.client;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for (pod, cost) in &plan.deletion_costs {
        set_deletion_cost(&pods, pod, *cost).await?;
        ctx.count_write(&ns, &name, "pod", true);
    }
    // The control token before the Deployment whose pods mount it.
    if super::build::uses_control_token(plan.isvc) {
        let (tokens, trust, wrote) = super::token::ensure(client, &ctx.cache, plan.isvc).await?;
        ctx.count_write(&ns, &name, "secret", wrote);
        state.period.set_control_tokens(tokens);
        state.period.set_control_trust(Some(trust));
    }
    let deployment = engine_objects(ctx, &plan, &objects).await?;
    gateway(
        ctx,
        plan.isvc,
        objects.gateway.as_ref(),
        &plan.snapshot.gateway,
    )
    .await?;
    rebalance(ctx, state, &plan, &pods).await?;
    Ok(Applied { plan, deployment })
}

/// The service's own objects (Deployment, Service, PDB, ServiceMonitor); returns the
/// Deployment as the cluster holds it after them.
async fn engine_objects(
    ctx: &Context,
    plan: &Plan<'_>,
    objects: &Desired,
) -> Result<Option<Arc<Deployment>>, Error> {
    let ns = plan.isvc.namespace().unwrap_or_default();
    let name = plan.isvc.name_any();
    let client = &ctx.client;
    let snapshot = &plan.snapshot;
    let written = apply_object(
        &Api::namespaced(client.clone(), &ns),
        &name,
        snapshot.deployment.as_deref(),
        &objects.deployment,
    )
    .await?;
    ctx.count_write(&ns, &name, "deployment", written.is_some());
    let deployment = written
        .map(Arc::new)
        .or_else(|| snapshot.deployment.clone());
    let written = apply_object::<Service>(
        &Api::namespaced(client.clone(), &ns),
        &name,
        snapshot.service.as_deref(),
        &objects.service,
    )
    .await?;
    ctx.count_write(&ns, &name, "service", written.is_some());
    let written = apply_object::<PodDisruptionBudget>(
        &Api::namespaced(client.clone(), &ns),
        &name,
        snapshot.pdb.as_deref(),
        &objects.pdb,
    )
    .await?;
    ctx.count_write(&ns, &name, "pdb", written.is_some());
    let wrote = match service_monitor(
        client,
        &ns,
        &name,
        objects.service_monitor.as_ref(),
        &snapshot.service_monitor,
    )
    .await
    {
        // The resource itself is gone (the CRD was removed): ask discovery again next time.
        Err(kube::Error::Api(s)) if s.code == 404 => {
            ctx.cache.service_monitors_gone().await;
            false
        }
        other => other?,
    };
    ctx.count_write(&ns, &name, "servicemonitor", wrote);
    Ok(deployment)
}

/// The decision's rotation (the pods' accepting gates) and DP weights.
async fn rebalance(
    ctx: &Context,
    state: &mut ServiceState,
    plan: &Plan<'_>,
    pods: &Api<Pod>,
) -> Result<(), Error> {
    let ns = plan.isvc.namespace().unwrap_or_default();
    let name = plan.isvc.name_any();
    let snapshot = &plan.snapshot;
    for (pod, accepting) in &plan.rotation {
        let (reason, message) = if *accepting {
            ("InRotation", "taking new requests")
        } else {
            ("OutOfRotation", "hot: taken out of rotation by rebalancing")
        };
        set_accepting(pods, pod, *accepting, reason, message).await?;
        ctx.count_write(&ns, &name, "pod", true);
    }
    let e = &plan.isvc.spec.engine;
    if e.kind == EngineKind::Ballast && e.grpc_port > 0 && !plan.dp_weights.is_empty() {
        let ready = snapshot.ready_pods();
        let port = e.grpc_port;
        state
            .period
            .set_dp_weights(&ctx.metrics, &plan.dp_weights, |pod| {
                let p = ready.get(pod)?;
                let ip = p.ip.as_deref()?;
                // A pod from before the operator turned TLS on speaks plain HTTP/2 until
                // the rollout replaces it.
                Some(if p.control_tls {
                    crate::control::tls_address(ip, port)
                } else {
                    crate::control::address(ip, port)
                })
            })
            .await;
    }
    Ok(())
}

/// Whether `live` holds every field of `desired` with the same value: objects key by key
/// (extra keys in `live` are fields the API server defaulted or others own), arrays of the
/// same length element by element, scalars equal. `null` in `desired` means "not set".
pub fn contains(live: &Value, desired: &Value) -> bool {
    match (live, desired) {
        (_, Value::Null) => true,
        (Value::Object(l), Value::Object(d)) => d
            .iter()
            .all(|(k, dv)| dv.is_null() || l.get(k).is_some_and(|lv| contains(lv, dv))),
        (Value::Array(l), Value::Array(d)) => {
            l.len() == d.len() && l.iter().zip(d).all(|(lv, dv)| contains(lv, dv))
        }
        (Value::Number(l), Value::Number(d)) => l.as_f64() == d.as_f64(),
        (l, d) => l == d,
    }
}

/// Applies `desired` as `name` unless `live` (the object as the cluster holds it) already
/// contains it. The object the API server answered when it wrote, `None` when it did not.
pub async fn apply_object<K>(
    api: &Api<K>,
    name: &str,
    live: Option<&K>,
    desired: &K,
) -> Result<Option<K>, kube::Error>
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned,
{
    let want = serde_json::to_value(desired).map_err(kube::Error::SerdeError)?;
    if let Some(live) = live {
        let live = serde_json::to_value(live).map_err(kube::Error::SerdeError)?;
        if contains(&live, &want) {
            return Ok(None);
        }
    }
    let written = api
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&want),
        )
        .await?;
    Ok(Some(written))
}

/// Applies the ServiceMonitor when one is wanted, deletes one the operator owns when not
/// (none when the CRD is not installed). True when it wrote.
pub async fn service_monitor(
    client: &Client,
    namespace: &str,
    name: &str,
    desired: Option<&Value>,
    live: &CrdState,
) -> Result<bool, kube::Error> {
    let CrdState::Installed(live) = live else {
        return Ok(false);
    };
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &service_monitor_resource());
    match (desired, live) {
        (Some(want), live) => {
            if let Some(live) = live {
                let live = serde_json::to_value(&**live).map_err(kube::Error::SerdeError)?;
                if contains(&live, want) {
                    return Ok(false);
                }
            }
            api.patch(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(want),
            )
            .await?;
            Ok(true)
        }
        (None, Some(live)) if managed_by_us(&live.metadata) => {
            api.delete(name, &Default::default()).await?;
            Ok(true)
        }
        (None, _) => Ok(false),
    }
}

/// The gateway's objects: applied where they differ, the picker's account and Role before
/// its pods and the InferencePool last (a gateway that reads it finds the picker there);
/// or, with no gateway wanted, those the operator owns deleted. A pool someone else edited
/// is put back, with a Warning Event saying so.
async fn gateway(
    ctx: &Context,
    isvc: &ballast_crds::InferenceService,
    desired: Option<&GatewayObjects>,
    live: &GatewayLive,
) -> Result<(), Error> {
    let ns = isvc.namespace().unwrap_or_default();
    let name = isvc.name_any();
    let picker = picker_name(&name);
    let client = &ctx.client;
    let Some(want) = desired else {
        return remove_gateway(ctx, &ns, &name, live).await;
    };
    // Another service's objects hold the picker's name: yield (the condition says why).
    if live
        .taken(isvc.uid().as_deref().unwrap_or_default())
        .is_some()
    {
        return Ok(());
    }
    macro_rules! put {
        ($kind:literal, $live:expr, $want:expr) => {{
            let written =
                apply_object(&Api::namespaced(client.clone(), &ns), &picker, $live, $want).await?;
            ctx.count_write(&ns, &name, $kind, written.is_some());
        }};
    }
    put!(
        "serviceaccount",
        live.service_account.as_deref(),
        &want.service_account
    );
    put!("role", live.role.as_deref(), &want.role);
    put!(
        "rolebinding",
        live.role_binding.as_deref(),
        &want.role_binding
    );
    put!("service", live.service.as_deref(), &want.service);
    put!("pdb", live.pdb.as_deref(), &want.pdb);
    put!("deployment", live.deployment.as_deref(), &want.deployment);
    let current = match live.pool.object() {
        Some(o) => Some(serde_json::to_value(o).map_err(kube::Error::SerdeError)?),
        None => None,
    };
    if current.as_ref().is_some_and(|c| contains(c, &want.pool)) {
        ctx.count_write(&ns, &name, "inferencepool", false);
        return Ok(());
    }
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &inference_pool_resource());
    match api
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&want.pool),
        )
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 404 => {
            ctx.cache.inference_pools_gone().await;
            return Ok(());
        }
        other => other?,
    };
    ctx.count_write(&ns, &name, "inferencepool", true);
    if let Some(c) = current.filter(|c| super::gateway::edited_by_hand(c, &want.pool, contains)) {
        let spec = c.get("spec").cloned().unwrap_or_default();
        ctx.event(
            isvc,
            EventType::Warning,
            "InferencePoolReverted",
            format!(
                "InferencePool {ns}/{name} was edited outside the InferenceService and has been put back (the edited spec was {spec}); change spec.gateway or spec.engine instead"
            ),
        )
        .await;
    }
    Ok(())
}

/// Deletes the gateway objects of service `name` that the operator owns.
async fn remove_gateway(
    ctx: &Context,
    ns: &str,
    name: &str,
    live: &GatewayLive,
) -> Result<(), Error> {
    if !live.any() {
        return Ok(());
    }
    let client = &ctx.client;
    let picker = picker_name(name);
    let dp = Default::default();
    macro_rules! drop_owned {
        ($kind:literal, $ty:ty, $live:expr) => {
            if $live.is_some_and(|o| managed_by_us(o.meta())) {
                match Api::<$ty>::namespaced(client.clone(), ns)
                    .delete(&picker, &dp)
                    .await
                {
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    other => {
                        other?;
                    }
                }
                ctx.count_write(ns, name, $kind, true);
            }
        };
    }
    if live
        .pool
        .object()
        .is_some_and(|o| managed_by_us(&o.metadata))
    {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), ns, &inference_pool_resource());
        match api.delete(name, &dp).await {
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            other => {
                other?;
            }
        }
        ctx.count_write(ns, name, "inferencepool", true);
    }
    drop_owned!("deployment", Deployment, live.deployment.as_deref());
    drop_owned!("service", Service, live.service.as_deref());
    drop_owned!("pdb", PodDisruptionBudget, live.pdb.as_deref());
    drop_owned!("rolebinding", RoleBinding, live.role_binding.as_deref());
    drop_owned!("role", Role, live.role.as_deref());
    drop_owned!(
        "serviceaccount",
        ServiceAccount,
        live.service_account.as_deref()
    );
    Ok(())
}

fn managed_by_us(meta: &kube::core::ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(crate::labels::MANAGED_BY))
        .is_some_and(|v| v == crate::labels::OPERATOR)
}

/// Sets a pod's accepting condition (its readiness gate): True keeps or puts it in its
/// Service's rotation, False takes it out.
pub async fn set_accepting(
    pods: &Api<Pod>,
    pod: &str,
    accepting: bool,
    reason: &str,
    message: &str,
) -> Result<(), kube::Error> {
    let patch = json!({"status": {"conditions": [{
        "type": ACCEPTING_CONDITION,
        "status": if accepting { "True" } else { "False" },
        "reason": reason,
        "message": message,
        "lastTransitionTime": Timestamp::now().to_string(),
    }]}});
    pods.patch_status(pod, &PatchParams::default(), &Patch::Strategic(&patch))
        .await?;
    Ok(())
}

/// Sets a pod's deletion cost (lower goes first on scale-down).
pub async fn set_deletion_cost(pods: &Api<Pod>, pod: &str, cost: i32) -> Result<(), kube::Error> {
    let patch = json!({"metadata": {"annotations": {DELETION_COST: cost.to_string()}}});
    pods.patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containment_ignores_what_the_server_adds_and_sees_what_changed() {
        let desired = json!({
            "spec": {"replicas": 2, "template": {"spec": {"containers": [
                {"name": "engine", "ports": [{"containerPort": 8000, "name": "http"}]}
            ]}}},
            "status": null,
        });
        let live = json!({
            "metadata": {"resourceVersion": "7", "managedFields": []},
            "spec": {"replicas": 2, "revisionHistoryLimit": 10, "template": {"spec": {
                "dnsPolicy": "ClusterFirst",
                "containers": [{"name": "engine", "imagePullPolicy": "IfNotPresent",
                    "ports": [{"containerPort": 8000, "name": "http", "protocol": "TCP"}]}]
            }}},
            "status": {"replicas": 2},
        });
        assert!(
            contains(&live, &desired),
            "defaults and status are not changes"
        );
        let mut scaled = desired.clone();
        scaled["spec"]["replicas"] = json!(3);
        assert!(!contains(&live, &scaled));
        let mut more = live.clone();
        more["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "sidecar"}));
        assert!(
            !contains(&more, &desired),
            "a list of another length differs"
        );
        assert!(
            contains(&json!({"a": 1.0}), &json!({"a": 1})),
            "numbers by value"
        );
        assert!(
            !contains(&json!({}), &json!({"a": "x"})),
            "a missing field differs"
        );
    }
}
