//! The Argo CD health check of docs/gitops.md (`docs/gitops/argocd-health.lua`), run by a
//! real Lua interpreter over InferenceServices whose status the operator's own code
//! assembled, and the doc's copies of the script.
//!
//! Argo CD runs health scripts in gopher-lua (Lua 5.1) with only the base, table and package
//! libraries open and the live object in the global `obj`. Here the script runs under
//! `lua5.4` (and `lua5.1` too when it is installed) with `string`, `math`, `io` and `os`
//! removed first, so a script that needs a library Argo CD does not open fails here too.
//!
//! Skips, saying why, when `lua5.4` is not installed; `BALLAST_REQUIRE_LUA=1` makes that a
//! failure. Debian: `apt-get install lua5.4`.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use ballast_crds::InferenceService;
use ballast_operator::reconcile::report::{NewStatus, status};
use ballast_operator::status::{ConditionSet, ReplicaCounts};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

fn repo_file(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
}

fn script_path() -> PathBuf {
    repo_file("docs/gitops/argocd-health.lua")
}

fn script() -> String {
    std::fs::read_to_string(script_path()).unwrap()
}

/// A Lua string literal for `s`, valid in Lua 5.1 and 5.4.
fn lua_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\{:03}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `v` as a Lua expression: objects and arrays become tables, integers stay integers (as
/// Argo CD hands Kubernetes' int64 fields to Lua), null becomes nil.
fn lua_value(v: &Value) -> String {
    match v {
        Value::Null => "nil".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i.to_string(),
            (None, Some(u)) => u.to_string(),
            _ => format!("{:?}", n.as_f64().expect("JSON numbers are finite")),
        },
        Value::String(s) => lua_string(s),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(lua_value).collect();
            format!("{{{}}}", items.join(", "))
        }
        Value::Object(fields) => {
            let fields: Vec<String> = fields
                .iter()
                .map(|(k, v)| format!("[{}] = {}", lua_string(k), lua_value(v)))
                .collect();
            format!("{{{}}}", fields.join(", "))
        }
    }
}

/// The interpreters to run the script with: `lua5.4` (required unless skipping) and
/// `lua5.1` when installed. Empty when the test must skip.
fn interpreters() -> Vec<&'static str> {
    let works = |bin: &str| {
        Command::new(bin)
            .arg("-v")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !works("lua5.4") {
        assert!(
            std::env::var_os("BALLAST_REQUIRE_LUA").is_none(),
            "BALLAST_REQUIRE_LUA is set but lua5.4 cannot run (apt-get install lua5.4)"
        );
        eprintln!(
            "skipping the Argo CD health check test: lua5.4 not installed (apt-get install lua5.4)"
        );
        return Vec::new();
    }
    let mut found = vec!["lua5.4"];
    if works("lua5.1") {
        found.push("lua5.1");
    }
    found
}

/// Runs the health script on `obj` as Argo CD would: `(status, message)`.
fn health(lua: &str, obj: &Value) -> (String, String) {
    let path = script_path();
    let driver = format!(
        "local chunk = assert(loadfile({path}))\n\
         local write = io.write\n\
         string, math, io, os, utf8, coroutine, debug = nil, nil, nil, nil, nil, nil, nil\n\
         obj = {obj}\n\
         local hs = chunk()\n\
         write(tostring(hs.status), \"\\t\", tostring(hs.message))\n",
        path = lua_string(path.to_str().unwrap()),
        obj = lua_value(obj),
    );
    let mut child = Command::new(lua)
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(driver.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{lua} failed on {obj}:\n{}{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (status, message) = stdout
        .split_once('\t')
        .unwrap_or_else(|| panic!("{lua} printed {stdout:?}"));
    (status.to_string(), message.to_string())
}

fn isvc(spec: &str, generation: i64) -> InferenceService {
    let mut i = ballast_crds::parse_yaml(&format!(
        "apiVersion: ballast.dev/v1alpha1\nkind: InferenceService\nmetadata: {{name: chat, namespace: prod}}\nspec: {spec}\n"
    ))
    .unwrap()
    .remove(0);
    i.metadata.generation = Some(generation);
    i
}

const SPEC: &str = "{model: {source: 'synthetic:small'}}";
const MANUAL: &str =
    "{model: {source: 'synthetic:small'}, replicas: 4, autoscaling: {enabled: false}}";

fn at(secs: i64) -> Time {
    Time(Timestamp::from_second(secs).unwrap())
}

fn counts(ready: i32, starting: i32, draining: i32) -> ReplicaCounts {
    ReplicaCounts {
        ready,
        starting,
        draining,
        accepting: ready,
    }
}

fn cond(
    type_: &'static str,
    ok: bool,
    reason: &'static str,
    message: &str,
) -> ConditionSet<'static> {
    ConditionSet {
        type_,
        status: ok,
        reason,
        message: message.to_string(),
    }
}

/// `i` with the status the operator writes for these pods, wanted size and conditions
/// (merged into the status `i` already has, as the reconciler does).
fn observe(
    mut i: InferenceService,
    counts: ReplicaCounts,
    desired: i32,
    conditions: Vec<ConditionSet<'static>>,
    secs: i64,
) -> InferenceService {
    let s = status(NewStatus {
        isvc: &i,
        counts,
        desired,
        decision: None,
        conditions,
        scaled: false,
        now: at(secs),
    });
    i.status = Some(s);
    i
}

fn metrics_ok() -> Vec<ConditionSet<'static>> {
    vec![
        cond(
            "MetricsAvailable",
            true,
            "MetricsReported",
            "2 of 2 ready replicas reported",
        ),
        cond(
            "ScalingActive",
            true,
            "ValidMetricFound",
            "computed a size from capacityWaiting",
        ),
    ]
}

/// The two conditions the reconciler sets for a spec it refuses.
fn invalid(message: &str) -> Vec<ConditionSet<'static>> {
    vec![
        cond("ScalingActive", false, "InvalidSpec", message),
        cond("Degraded", true, "InvalidSpec", message),
    ]
}

struct Case {
    name: &'static str,
    obj: InferenceService,
    status: &'static str,
    message: &'static str,
}

fn cases() -> Vec<Case> {
    let healthy = observe(isvc(SPEC, 3), counts(2, 0, 0), 2, metrics_ok(), 10);
    // A spec change the operator has not reconciled yet: the API server bumped the
    // generation, the status still describes the previous one.
    let mut edited = healthy.clone();
    edited.metadata.generation = Some(4);
    // An invalid spec at generation 5, then fixed at generation 6: the operator leaves the
    // Degraded condition of generation 5 where it was.
    let refused = observe(
        isvc(SPEC, 5),
        ReplicaCounts::default(),
        2,
        invalid("maxReplicas must be at least 1"),
        20,
    );
    let mut fixed = refused.clone();
    fixed.metadata.generation = Some(6);
    let fixed = observe(fixed, counts(2, 0, 0), 2, metrics_ok(), 30);
    // The operator followed `kubectl scale --replicas 4` (autoscaling off) this period.
    let manual_wanted = observe(
        isvc(MANUAL, 2),
        counts(2, 0, 0),
        2,
        vec![cond(
            "ScalingActive",
            false,
            "AutoscalingDisabled",
            "autoscaling disabled: following spec.replicas",
        )],
        10,
    );
    let manual_followed = observe(manual_wanted.clone(), counts(4, 0, 0), 4, vec![], 40);
    let mut unknown_reason = observe(isvc(SPEC, 2), counts(0, 0, 0), 2, metrics_ok(), 10);
    for c in &mut unknown_reason.status.as_mut().unwrap().conditions {
        if c.type_ == "Ready" {
            c.reason = "ReplicasCrashing".into();
            c.message = "2 replicas restarted 5 times".into();
        }
    }
    let stale_metrics = observe(
        isvc(SPEC, 3),
        counts(2, 0, 0),
        2,
        vec![
            cond(
                "MetricsAvailable",
                false,
                "MetricsStale",
                "only 0 of 2 ready replicas reported (minReportingFraction 0.5); holding at 2",
            ),
            cond(
                "ScalingActive",
                false,
                "MetricsStale",
                "only 0 of 2 ready replicas reported (minReportingFraction 0.5); holding at 2",
            ),
        ],
        10,
    );
    let mut status_without_generation = healthy.clone();
    status_without_generation
        .status
        .as_mut()
        .unwrap()
        .observed_generation = None;
    let mut no_conditions = healthy.clone();
    no_conditions.status.as_mut().unwrap().conditions.clear();

    vec![
        Case {
            name: "no status yet",
            obj: isvc(SPEC, 1),
            status: "Progressing",
            message: "Waiting for the operator to write a status",
        },
        Case {
            name: "status without observedGeneration",
            obj: status_without_generation,
            status: "Progressing",
            message: "Waiting for the operator to observe generation 3",
        },
        Case {
            name: "no conditions yet",
            obj: no_conditions,
            status: "Progressing",
            message: "Waiting for the Ready condition",
        },
        Case {
            name: "healthy",
            obj: healthy,
            status: "Healthy",
            message: "ReplicasReady: 2 of 2 replicas ready",
        },
        Case {
            name: "spec changed, observedGeneration stale",
            obj: edited,
            status: "Progressing",
            message: "Waiting for the operator to observe generation 4 (status is for 3)",
        },
        Case {
            name: "first replicas starting",
            obj: observe(isvc(SPEC, 1), counts(0, 2, 0), 2, vec![], 10),
            status: "Progressing",
            message: "ReplicasStarting: 0 of 2 replicas ready",
        },
        Case {
            name: "scaling up",
            obj: observe(isvc(SPEC, 3), counts(2, 2, 0), 4, metrics_ok(), 10),
            status: "Progressing",
            message: "Scaling up: 2 of 4 replicas ready",
        },
        Case {
            name: "scaling down, a replica draining",
            obj: observe(isvc(SPEC, 3), counts(2, 0, 1), 2, metrics_ok(), 10),
            status: "Progressing",
            message: "3 replicas for 2 desired: rolling out or draining",
        },
        Case {
            name: "rolling out, one surge replica starting",
            obj: observe(isvc(SPEC, 3), counts(2, 1, 0), 2, metrics_ok(), 10),
            status: "Progressing",
            message: "3 replicas for 2 desired: rolling out or draining",
        },
        Case {
            name: "degraded: invalid spec",
            obj: refused,
            status: "Degraded",
            message: "InvalidSpec: maxReplicas must be at least 1",
        },
        Case {
            name: "Degraded of an older generation is stale",
            obj: fixed,
            status: "Healthy",
            message: "ReplicasReady: 2 of 2 replicas ready",
        },
        Case {
            name: "Ready=False for a reason that is not starting",
            obj: unknown_reason,
            status: "Degraded",
            message: "ReplicasCrashing: 2 replicas restarted 5 times",
        },
        Case {
            name: "scaled to zero",
            obj: observe(isvc(SPEC, 2), counts(0, 0, 0), 0, vec![], 10),
            status: "Healthy",
            message: "Scaled to zero (desiredReplicas is 0)",
        },
        Case {
            name: "scaling to zero, a replica draining",
            obj: observe(isvc(SPEC, 2), counts(0, 0, 1), 0, vec![], 10),
            status: "Progressing",
            message: "Scaling to zero: 1 replicas leaving",
        },
        Case {
            name: "autoscaling off, spec.replicas not followed yet",
            obj: manual_wanted,
            status: "Progressing",
            message: "Waiting for the operator to follow spec.replicas 4 (desiredReplicas is 2)",
        },
        Case {
            name: "autoscaling off, spec.replicas followed",
            obj: manual_followed,
            status: "Healthy",
            message: "ReplicasReady: 4 of 4 replicas ready",
        },
        Case {
            name: "serving, autoscaling holding on stale metrics",
            obj: stale_metrics,
            status: "Healthy",
            message: "ReplicasReady: 2 of 2 replicas ready; autoscaling holds: MetricsStale: only 0 of 2 ready replicas reported (minReportingFraction 0.5); holding at 2",
        },
    ]
}

#[test]
fn the_argocd_health_check_reads_status_as_the_operator_writes_it() {
    let _group = crate::common::group(module_path!());
    let lua = interpreters();
    if lua.is_empty() {
        return;
    }
    let mut failures = Vec::new();
    for case in cases() {
        let obj = serde_json::to_value(&case.obj).unwrap();
        for interp in &lua {
            let got = health(interp, &obj);
            let want = (case.status.to_string(), case.message.to_string());
            if got != want {
                failures.push(format!(
                    "{}, {interp}: got {got:?}, want {want:?}",
                    case.name
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_json_to_lua_converter_keeps_every_value() {
    let _group = crate::common::group(module_path!());
    let lua = interpreters();
    if lua.is_empty() {
        return;
    }
    let v = serde_json::json!({
        "s": "quote \" backslash \\ newline \n tab \t bell \u{7} é",
        "n": [0, -3, 2.5, 1e-7, 9007199254740993i64],
        "b": [true, false],
        "nested": {"empty": {}, "list": []},
    });
    let check = format!(
        "local v = {}\n\
         assert(v.s == \"quote \\\" backslash \\\\ newline \\n tab \\t bell \\007 \\195\\169\")\n\
         assert(v.n[1] == 0 and v.n[2] == -3 and v.n[3] == 2.5 and v.n[4] == 1e-7)\n\
         assert(tostring(v.n[2]) == \"-3\")\n\
         assert(v.b[1] == true and v.b[2] == false)\n\
         assert(next(v.nested.empty) == nil and #v.nested.list == 0)\n",
        lua_value(&v)
    );
    for interp in lua {
        let mut child = Command::new(interp)
            .arg("-")
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(check.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{interp}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn docs_gitops_md_includes_the_script_verbatim() {
    let _group = crate::common::group(module_path!());
    let doc = std::fs::read_to_string(repo_file("docs/gitops.md")).unwrap();
    let script = script();
    assert!(
        doc.contains(&format!("```lua\n{script}```\n")),
        "docs/gitops.md must include docs/gitops/argocd-health.lua verbatim in a ```lua block"
    );
    // The argocd-cm snippet holds it as a YAML block scalar, indented by four spaces.
    let indented: String = script
        .lines()
        .map(|l| {
            if l.is_empty() {
                "\n".to_string()
            } else {
                format!("    {l}\n")
            }
        })
        .collect();
    let key = "  resource.customizations.health.ballast.dev_InferenceService: |\n";
    assert!(
        doc.contains(&format!("{key}{indented}")),
        "the argocd-cm snippet in docs/gitops.md must hold docs/gitops/argocd-health.lua, indented by four spaces"
    );
}
