//! Dashboards, alert rules and runbooks (`charts/ballast/files/`, `docs/runbooks.md`)
//! proved against the real tools: `promtool` checks and unit-tests the rules, and a real
//! Prometheus server scraping a running `ballast local` fleet under `ballast bench` load
//! (and the vLLM / SGLang exposition fixtures) evaluates every dashboard expression.
//!
//! `promtool` and `prometheus` come from Debian's `prometheus` package, which `.ci/run`
//! installs; with `BALLAST_REQUIRE_PROMTOOL` set (CI) a missing tool fails the test,
//! otherwise it is skipped with a message.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::get;
use common::local::{Local, temp_dir};
use serde_json::Value;

const RUNBOOKS_URL: &str = "https://github.com/ballast-dev/ballast/blob/main/docs/runbooks.md";
const ALERTS: &str = "charts/ballast/files/alerts.yaml";
const ALERTS_TEST: &str = "e2e/prometheus/alerts_test.yaml";
const DASHBOARDS: &str = "charts/ballast/files/dashboards";
/// The dashboards whose every expression must have data from a live Ballast fleet.
const BALLAST_DASHBOARDS: [&str; 3] = [
    "ballast-fleet-overview.json",
    "ballast-engine-detail.json",
    "ballast-dp-balance.json",
];
/// The dashboard evaluated against a live `ballast gateway` behind Envoy.
const GATEWAY_DASHBOARD: &str = "ballast-gateway.json";
/// The dashboards evaluated against the vLLM and SGLang exposition fixtures.
const FIXTURE_DASHBOARDS: [&str; 2] = ["vllm-fleet.json", "sglang-fleet.json"];
/// What Grafana's built-in variables become when the test evaluates an expression: a
/// 15 s rate window holds 15 samples at the test's 1 s scrape interval.
const BUILTINS: [(&str, &str); 5] = [
    ("__rate_interval", "15s"),
    ("__interval", "5s"),
    ("__range", "1m"),
    ("__range_s", "60"),
    ("__interval_ms", "5000"),
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn yaml(path: &str) -> Value {
    serde_saphyr::from_str(&read(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Whether `tool` can run; `false` (skip) unless BALLAST_REQUIRE_PROMTOOL is set, which
/// turns a missing tool into a failure.
fn have(tool: &str) -> bool {
    match Command::new(tool).arg("--version").output() {
        Ok(out) if out.status.success() => true,
        other => {
            assert!(
                std::env::var_os("BALLAST_REQUIRE_PROMTOOL").is_none(),
                "{tool} is required here but cannot run: {other:?}"
            );
            eprintln!("skipping: {tool} not installed (apt-get install prometheus)");
            false
        }
    }
}

// ---------------------------------------------------------------------------------------
// Alert rules
// ---------------------------------------------------------------------------------------

/// Every rule of alerts.yaml.
fn alert_rules() -> Vec<Value> {
    let doc = yaml(ALERTS);
    let groups = doc["groups"].as_array().expect("top-level groups");
    assert!(!groups.is_empty());
    groups
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").clone())
        .collect()
}

fn seconds(duration: &str) -> u64 {
    let (n, unit) = duration.split_at(duration.len() - 1);
    let n: u64 = n.parse().unwrap_or_else(|_| panic!("duration {duration}"));
    n * match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => panic!("duration {duration}"),
    }
}

/// GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of every heading of a Markdown file (code blocks skipped).
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in markdown.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.insert(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

#[test]
fn every_alert_is_complete_and_links_to_its_runbook_section() {
    let _group = crate::common::group(module_path!());
    let runbooks = read("docs/runbooks.md");
    let sections = anchors(&runbooks);
    let rules = alert_rules();
    let mut names = BTreeSet::new();
    for rule in &rules {
        let name = rule["alert"].as_str().expect("only alerting rules");
        assert!(names.insert(name), "{name} defined twice");
        assert!(
            !rule["expr"].as_str().unwrap_or_default().trim().is_empty(),
            "{name}: no expr"
        );
        let hold = seconds(rule["for"].as_str().unwrap_or("0s"));
        assert!(hold >= 300, "{name}: `for` under 5m flaps");
        let severity = rule["labels"]["severity"].as_str().unwrap_or_default();
        assert!(
            ["critical", "warning", "info"].contains(&severity),
            "{name}: severity {severity:?}"
        );
        for a in ["summary", "description"] {
            assert!(
                !rule["annotations"][a]
                    .as_str()
                    .unwrap_or_default()
                    .is_empty(),
                "{name}: no {a}"
            );
        }
        let url = rule["annotations"]["runbook_url"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: no runbook_url"));
        let (page, section) = url
            .split_once('#')
            .unwrap_or_else(|| panic!("{name}: {url} has no anchor"));
        assert_eq!(page, RUNBOOKS_URL, "{name}");
        assert_eq!(
            section,
            anchor(name),
            "{name}: the section is named after it"
        );
        assert!(
            sections.contains(section),
            "{name}: docs/runbooks.md has no section #{section}"
        );
    }
    // And no runbook section for an alert that does not exist.
    for line in runbooks.lines().filter(|l| l.starts_with("## Ballast")) {
        let heading = line.trim_start_matches("## ");
        assert!(
            names.contains(heading),
            "runbook for unknown alert {heading}"
        );
    }
    assert_eq!(names.len(), 8, "{names:?}");
}

#[test]
fn every_alert_has_unit_tests_that_fire_it_and_a_healthy_fleet_that_does_not() {
    let _group = crate::common::group(module_path!());
    let tests = yaml(ALERTS_TEST);
    let files: Vec<PathBuf> = tests["rule_files"]
        .as_array()
        .expect("rule_files")
        .iter()
        .map(|f| {
            root()
                .join("e2e/prometheus")
                .join(f.as_str().unwrap())
                .canonicalize()
                .unwrap()
        })
        .collect();
    assert_eq!(files, [root().join(ALERTS).canonicalize().unwrap()]);
    let mut fires = BTreeSet::new();
    let mut silent_when_healthy = BTreeSet::new();
    for group in tests["tests"].as_array().expect("tests") {
        let healthy = group["name"].as_str().unwrap_or_default() == "A healthy fleet fires nothing";
        for case in group["alert_rule_test"].as_array().into_iter().flatten() {
            let name = case["alertname"].as_str().unwrap().to_string();
            let expected = case["exp_alerts"].as_array().map_or(0, Vec::len);
            if expected > 0 {
                fires.insert(name);
            } else if healthy {
                silent_when_healthy.insert(name);
            }
        }
    }
    for rule in alert_rules() {
        let name = rule["alert"].as_str().unwrap();
        assert!(fires.contains(name), "no unit test fires {name}");
        assert!(
            silent_when_healthy.contains(name),
            "{name} is not checked silent on the healthy fleet"
        );
    }
}

#[test]
fn alert_rules_pass_promtool_check_and_their_unit_tests() {
    let _group = crate::common::group(module_path!());
    if !have("promtool") {
        return;
    }
    for args in [["check", "rules", ALERTS], ["test", "rules", ALERTS_TEST]] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(root())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

// ---------------------------------------------------------------------------------------
// Dashboards
// ---------------------------------------------------------------------------------------

fn dashboard(file: &str) -> Value {
    serde_json::from_str(&read(&format!("{DASHBOARDS}/{file}")))
        .unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn dashboard_files() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(root().join(DASHBOARDS))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|f| f.ends_with(".json"))
        .collect();
    files.sort();
    files
}

/// Every panel, rows' nested panels included.
fn panels(d: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().expect("panels") {
        out.push(p);
        out.extend(p["panels"].as_array().into_iter().flatten());
    }
    out
}

/// Every (panel title, expression) of a dashboard.
fn expressions(d: &Value) -> Vec<(String, String)> {
    panels(d)
        .into_iter()
        .flat_map(|p| {
            let title = p["title"].as_str().unwrap_or_default().to_string();
            p["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |t| (title.clone(), t["expr"].as_str().unwrap_or_default().into()))
        })
        .collect()
}

/// The names of the variables `text` references (`$x`, `${x}`, `${x:fmt}`, `[[x]]`).
fn references(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut rest = text;
    while let Some(i) = rest.find(['$', '[']) {
        let after = &rest[i + 1..];
        if rest[i..].starts_with("${") || rest[i..].starts_with("[[") {
            out.push(ident(&after[1..]));
        } else if rest[i..].starts_with('$') {
            let name = ident(after);
            if !name.is_empty() {
                out.push(name);
            }
        }
        rest = after;
    }
    out
}

/// `expr` with every variable replaced as the test evaluates it: Grafana's built-ins by
/// [`BUILTINS`], a dashboard variable by `.*` (its "All" value).
fn substitute(expr: &str, variables: &BTreeSet<String>) -> String {
    let mut out = String::new();
    let mut rest = expr;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let (name, len) = if let Some(braced) = after.strip_prefix('{') {
            let end = braced.find('}').expect("closing brace");
            (braced[..end].split(':').next().unwrap(), end + 2)
        } else {
            let n = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..n], n)
        };
        match BUILTINS.iter().find(|(b, _)| *b == name) {
            Some((_, v)) => out.push_str(v),
            None => {
                assert!(variables.contains(name), "undefined variable ${name}");
                out.push_str(".*");
            }
        }
        rest = &after[len..];
    }
    out.push_str(rest);
    out
}

fn variables(d: &Value) -> BTreeMap<String, Value> {
    d["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .map(|v| (v["name"].as_str().unwrap().to_string(), v.clone()))
        .collect()
}

/// The query of a `query` variable.
fn variable_query(v: &Value) -> String {
    v["query"]["query"]
        .as_str()
        .or(v["query"].as_str())
        .or(v["definition"].as_str())
        .unwrap_or_default()
        .to_string()
}

fn is_ds(ds: &Value) -> bool {
    ds["uid"] == "${datasource}" && ds["type"] == "prometheus"
}

#[test]
fn dashboards_are_structurally_valid() {
    let _group = crate::common::group(module_path!());
    let files = dashboard_files();
    for f in BALLAST_DASHBOARDS
        .iter()
        .chain(&FIXTURE_DASHBOARDS)
        .chain(&[GATEWAY_DASHBOARD])
    {
        assert!(files.iter().any(|x| x == f), "no {f}");
    }
    let mut uids = BTreeSet::new();
    for file in &files {
        let d = dashboard(file);
        let mut problems = Vec::new();
        let uid = d["uid"].as_str().unwrap_or_default();
        assert!(!uid.is_empty() && uid.len() <= 40, "{file}: uid {uid:?}");
        assert!(uids.insert(uid.to_string()), "{file}: uid {uid} reused");
        assert!(d["title"].as_str().is_some_and(|t| !t.is_empty()), "{file}");
        let schema = d["schemaVersion"].as_i64().unwrap_or(0);
        assert!(
            (36..=41).contains(&schema),
            "{file}: schemaVersion {schema}"
        );

        let vars = variables(&d);
        let ds = &vars["datasource"];
        assert_eq!(ds["type"], "datasource", "{file}");
        assert_eq!(ds["query"], "prometheus", "{file}");
        for name in ["namespace", "service"] {
            let v = vars
                .get(name)
                .unwrap_or_else(|| panic!("{file}: no ${name}"));
            assert_eq!(v["type"], "query", "{file}: ${name}");
            assert_eq!(v["includeAll"], true, "{file}: ${name} has no All option");
            assert!(
                variable_query(v).starts_with("label_values("),
                "{file}: ${name} is not from label_values"
            );
        }
        let names: BTreeSet<String> = vars.keys().cloned().collect();
        for (name, v) in &vars {
            if v["type"] != "query" {
                continue;
            }
            if !is_ds(&v["datasource"]) {
                problems.push(format!("${name}: datasource is not ${{datasource}}"));
            }
            for r in references(&variable_query(v)) {
                if !names.contains(&r) {
                    problems.push(format!("${name} references undefined ${r}"));
                }
            }
        }

        let mut ids = BTreeSet::new();
        let mut cells: Vec<(String, [i64; 4])> = Vec::new();
        for p in panels(&d) {
            let title = p["title"].as_str().unwrap_or("?").to_string();
            match p["id"].as_i64() {
                Some(id) if ids.insert(id) => {}
                id => problems.push(format!("{title}: id {id:?} missing or reused")),
            }
            let g = &p["gridPos"];
            let pos = ["x", "y", "w", "h"].map(|k| g[k].as_i64().unwrap_or(-1));
            if pos.iter().any(|v| *v < 0) || pos[2] == 0 || pos[0] + pos[2] > 24 {
                problems.push(format!("{title}: gridPos {g}"));
            }
            for (other, o) in &cells {
                let overlap = pos[0] < o[0] + o[2]
                    && o[0] < pos[0] + pos[2]
                    && pos[1] < o[1] + o[3]
                    && o[1] < pos[1] + pos[3];
                if overlap {
                    problems.push(format!("{title} overlaps {other}"));
                }
            }
            cells.push((title.clone(), pos));
            if p["type"] == "row" {
                continue;
            }
            if !is_ds(&p["datasource"]) {
                problems.push(format!("{title}: datasource is not ${{datasource}}"));
            }
            if p["fieldConfig"]["defaults"]["unit"]
                .as_str()
                .is_none_or(str::is_empty)
            {
                problems.push(format!("{title}: no unit"));
            }
            let targets = p["targets"].as_array().cloned().unwrap_or_default();
            if targets.is_empty() {
                problems.push(format!("{title}: no targets"));
            }
            let mut refs = BTreeSet::new();
            for t in &targets {
                let expr = t["expr"].as_str().unwrap_or_default();
                if expr.trim().is_empty() {
                    problems.push(format!("{title}: a target without expr"));
                }
                if !is_ds(&t["datasource"]) {
                    problems.push(format!(
                        "{title}: a target's datasource is not ${{datasource}}"
                    ));
                }
                if !refs.insert(t["refId"].as_str().unwrap_or_default().to_string()) {
                    problems.push(format!("{title}: refId reused"));
                }
                for r in references(expr) {
                    if !names.contains(&r) && !BUILTINS.iter().any(|(b, _)| *b == r) {
                        problems.push(format!("{title}: undefined variable ${r}"));
                    }
                }
                // Rate windows follow the scrape interval and the time range, never a
                // hard-coded duration.
                for window in expr.split('[').skip(1) {
                    let window = window.split(']').next().unwrap_or_default();
                    if window != "$__rate_interval" && window != "$__range" {
                        problems.push(format!("{title}: window [{window}] in {expr}"));
                    }
                }
            }
        }
        assert!(problems.is_empty(), "{file}:\n{}", problems.join("\n"));
    }
}

#[test]
fn docs_dashboards_are_relative_links_to_the_chart_files() {
    let _group = crate::common::group(module_path!());
    let docs = root().join("docs/dashboards");
    let readme =
        std::fs::read_to_string(docs.join("README.md")).expect("docs/dashboards/README.md");
    let files = dashboard_files();
    for file in &files {
        let link = docs.join(file);
        let target = std::fs::read_link(&link)
            .unwrap_or_else(|e| panic!("docs/dashboards/{file} is not a symlink: {e}"));
        assert!(target.is_relative(), "{file} -> {}", target.display());
        assert_eq!(
            link.canonicalize().unwrap(),
            root().join(DASHBOARDS).join(file).canonicalize().unwrap(),
            "{file}"
        );
        assert!(readme.contains(file), "README.md does not describe {file}");
    }
    for e in std::fs::read_dir(&docs).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        assert!(
            name == "README.md" || files.contains(&name),
            "docs/dashboards/{name} links to no chart dashboard"
        );
    }
}

// ---------------------------------------------------------------------------------------
// A real Prometheus
// ---------------------------------------------------------------------------------------

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `prometheus` server on loopback with its own config and storage, stopped on drop.
struct Prometheus {
    child: Child,
    url: String,
    dir: PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Prometheus {
    fn start(config: &str) -> Prometheus {
        let dir = temp_dir("prometheus");
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let port = free_port();
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
            .spawn()
            .expect("prometheus runs");
        let p = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while get(&format!("{}/-/ready", p.url)).is_none_or(|b| !b.contains("Ready")) {
            assert!(
                Instant::now() < deadline,
                "prometheus not ready:\n{}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        p
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// An instant query's result vector, or the error Prometheus gave.
    fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let out = Command::new("curl")
            .args(["-s", "-m", "5", "-G", "--data-urlencode"])
            .arg(format!("query={expr}"))
            .arg(format!("{}/api/v1/query", self.url))
            .output()
            .map_err(|e| e.to_string())?;
        let body: Value = serde_json::from_slice(&out.stdout)
            .map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&out.stdout)))?;
        if body["status"] != "success" {
            return Err(format!("{}: {}", body["errorType"], body["error"]));
        }
        Ok(body["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }
}

/// The sample value of one element of a query result (`NaN` for `"NaN"`).
fn sample(v: &Value) -> f64 {
    v["value"][1]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(f64::NAN)
}

/// One expression to evaluate: where it comes from, and the PromQL sent.
struct Check {
    what: String,
    promql: String,
}

/// Every target expression and every `label_values` variable of the given dashboards,
/// with variables substituted. A `label_values(selector, label)` variable becomes
/// `count by (label) (selector)`: empty exactly when its drop-down would be.
fn checks(files: &[&str]) -> Vec<Check> {
    let mut out = Vec::new();
    for file in files {
        let d = dashboard(file);
        let vars = variables(&d);
        let names: BTreeSet<String> = vars.keys().cloned().collect();
        for (name, v) in &vars {
            let q = variable_query(v);
            if let Some(args) = q
                .strip_prefix("label_values(")
                .and_then(|a| a.strip_suffix(')'))
            {
                let (selector, label) = args
                    .rsplit_once(',')
                    .expect("label_values(selector, label)");
                out.push(Check {
                    what: format!("{file} ${name}"),
                    promql: substitute(
                        &format!("count by ({}) ({selector})", label.trim()),
                        &names,
                    ),
                });
            }
        }
        for (title, expr) in expressions(&d) {
            out.push(Check {
                what: format!("{file} \"{title}\""),
                promql: substitute(&expr, &names),
            });
        }
    }
    out
}

/// Evaluates `checks` until each has data, or panics after `deadline` naming those that
/// never had. With `finite`, data means at least one finite sample (the fleet is under
/// load, so every rate, ratio and quantile has a value); otherwise any sample, NaN
/// included, counts (a quantile of a counter that does not move is NaN).
fn evaluate(prom: &Prometheus, checks: &[Check], finite: bool, deadline: Instant) -> usize {
    let mut pending: Vec<&Check> = checks.iter().collect();
    let mut last: BTreeMap<String, String> = BTreeMap::new();
    loop {
        pending.retain(|c| match prom.query(&c.promql) {
            Ok(result) => {
                let ok = if finite {
                    result.iter().any(|r| sample(r).is_finite())
                } else {
                    !result.is_empty()
                };
                if !ok {
                    last.insert(c.promql.clone(), format!("{result:?}"));
                }
                !ok
            }
            Err(e) => {
                last.insert(c.promql.clone(), e);
                true
            }
        });
        if pending.is_empty() {
            return checks.len();
        }
        if Instant::now() > deadline {
            let list: Vec<String> = pending
                .iter()
                .map(|c| {
                    format!(
                        "- {}\n    {}\n    got {}",
                        c.what, c.promql, last[&c.promql]
                    )
                })
                .collect();
            panic!(
                "{} of {} expressions have no data:\n{}\nprometheus log:\n{}",
                pending.len(),
                checks.len(),
                list.join("\n"),
                prom.log()
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

// ---------------------------------------------------------------------------------------
// A live Ballast fleet
// ---------------------------------------------------------------------------------------

impl Local {
    fn wait_ready(&self, services: &[&str]) {
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            let status: Value = get(&format!("{}/status", self.admin))
                .and_then(|s| serde_json::from_str(&s).ok())
                .unwrap_or(Value::Null);
            if services
                .iter()
                .all(|s| status[s]["readyReplicas"].as_i64() >= Some(1))
            {
                return;
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(self.dir.join("local.log")).unwrap_or_default();
                panic!("replicas not ready: {status:#}\n{log}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// `chat`: one replica with two DP ranks (so the DP panels have data), every autoscaling
/// target set (so each signal panel has an observed value and a target), 1 s periods.
/// `unscraped`: a replica whose metrics path is wrong, so every operator scrape of it
/// fails (`http_status`): the scrape-error panel and MetricsAvailable=False have data too.
const FLEET: &str = r#"
apiVersion: ballast.dev/v1alpha1
kind: InferenceService
metadata: {name: chat}
spec:
  model: {source: "synthetic:tiny"}
  engine: {dataParallelSize: 2, maxNumSeqs: 4}
  autoscaling:
    minReplicas: 1
    maxReplicas: 1
    targets:
      capacityWaitingPerReplica: 2
      kvCacheUsage: 0.85
      admissionRejectionsPerSecond: 0.05
      ttftP99Seconds: 2
  metrics: {scrapeIntervalSeconds: 1, scrapeTimeoutSeconds: 1}
---
apiVersion: ballast.dev/v1alpha1
kind: InferenceService
metadata: {name: unscraped}
spec:
  model: {source: "synthetic:tiny"}
  autoscaling: {minReplicas: 1, maxReplicas: 1}
  metrics: {path: /not-metrics, scrapeIntervalSeconds: 1, scrapeTimeoutSeconds: 1}
"#;

#[test]
fn ballast_dashboards_have_data_from_a_live_fleet_in_prometheus() {
    let _group = crate::common::group(module_path!());
    if !have("prometheus") {
        return;
    }
    let started = Instant::now();
    let local = Local::start("observability", FLEET);
    let admin = local.admin.trim_start_matches("http://").to_string();
    let prom = Prometheus::start(&format!(
        r#"
global: {{scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}}
scrape_configs:
  - job_name: ballast-engines
    http_sd_configs:
      - url: http://{admin}/prometheus/targets
        refresh_interval: 1s
  - job_name: ballast-operator
    static_configs:
      - targets: ['{admin}']
"#
    ));
    local.wait_ready(&["chat", "unscraped"]);
    let load_secs = 20;
    let mut bench = Command::new(env!("CARGO_BIN_EXE_ballast"))
        .args([
            "bench",
            "--url",
            &local.router,
            "--no-progress",
            "--ignore-eos",
        ])
        .args(["--model", "chat", "--concurrency", "8"])
        .args(["--duration", &load_secs.to_string()])
        .args(["--input-len", "48", "--output-len", "24"])
        .args(["--shared-prefix-len", "32"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let load_start = Instant::now();
    let checks = checks(&BALLAST_DASHBOARDS);
    // Rate windows need a few scrapes under load before every expression has a value;
    // everything must have one before the load (plus one window) is over.
    std::thread::sleep(Duration::from_secs(5));
    let n = evaluate(
        &prom,
        &checks,
        true,
        load_start + Duration::from_secs(load_secs + 10),
    );
    let _ = bench.kill();
    let _ = bench.wait();
    eprintln!(
        "{n} expressions of {} dashboards have data; {:.1} s in all",
        BALLAST_DASHBOARDS.len(),
        started.elapsed().as_secs_f64()
    );
}

/// `ballast gateway` behind a real Envoy in front of two engines (one with two DP ranks,
/// so the gateway picks ranks), under load whose prompts share prefixes, plus one body
/// that is not JSON (a refusal): every expression of the gateway dashboard has data in a
/// real Prometheus scraping the gateway, and all but the hold-time quantiles (nothing is
/// held: the pool is never saturated) have a finite value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_dashboard_has_data_from_a_live_gateway_in_prometheus() {
    use crate::gateway::{addr_of, envoy, spawn_envoy, spawn_gateway};
    use common::engine::{Log, spawn_engine};
    let _group = crate::common::group(module_path!());
    if !have("prometheus") {
        return;
    }
    let Some(envoy) = envoy() else { return };
    let started = Instant::now();
    let dir = temp_dir("gateway-dashboard");
    let engines = [
        spawn_engine(&["--data-parallel-size", "2"], Log::Inherit),
        spawn_engine(&[], Log::Inherit),
    ];
    let addrs: Vec<std::net::SocketAddr> = engines.iter().map(addr_of).collect();
    let (_gateway, grpc, metrics) =
        spawn_gateway(&["--endpoints", &format!("{},{}", addrs[0], addrs[1])]);
    let proxy = spawn_envoy(&envoy, &dir, grpc, false, &addrs);
    let target = metrics
        .trim_start_matches("http://")
        .trim_end_matches("/metrics");
    let prom = Prometheus::start(&format!(
        "global: {{scrape_interval: 1s, scrape_timeout: 1s}}\nscrape_configs:\n  - job_name: gateway\n    static_configs:\n      - targets: ['{target}']\n        labels: {{namespace: local, service: chat, pod: gateway-0}}\n"
    ));
    let bad = common::engine::client()
        .post(format!("{}/v1/completions", proxy.url))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let load_secs = 20;
    let mut bench = Command::new(env!("CARGO_BIN_EXE_ballast"))
        .args([
            "bench",
            "--url",
            &proxy.url,
            "--no-progress",
            "--ignore-eos",
        ])
        .args(["--concurrency", "4", "--duration", &load_secs.to_string()])
        .args(["--input-len", "48", "--output-len", "16"])
        .args(["--shared-prefix-len", "32", "--shared-prefixes", "4"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let load_start = Instant::now();
    let all = checks(&[GATEWAY_DASHBOARD]);
    let deadline = load_start + Duration::from_secs(load_secs + 5);
    std::thread::sleep(Duration::from_secs(4));
    let n = evaluate(&prom, &all, false, deadline);
    let moving: Vec<Check> = all
        .into_iter()
        .filter(|c| !c.what.contains("Hold time"))
        .collect();
    evaluate(&prom, &moving, true, deadline);
    let _ = bench.kill();
    let _ = bench.wait();
    eprintln!(
        "{n} expressions of the gateway dashboard have data ({} finite); {:.1} s in all",
        moving.len(),
        started.elapsed().as_secs_f64()
    );
}

/// Serves the operator's exposition fixtures (`operator/tests/fixtures/*.prom`) on a
/// loopback port, one file per path, until the test process ends.
fn serve_fixtures() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let dir = root().join("operator/tests/fixtures");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let dir = dir.clone();
            std::thread::spawn(move || answer(&mut stream, &dir));
        }
    });
    port
}

fn answer(stream: &mut TcpStream, dir: &Path) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let head = String::from_utf8_lossy(&head);
    let path = head.split_whitespace().nth(1).unwrap_or("/");
    let name = path.trim_start_matches('/');
    let body = (name.ends_with(".prom") && !name.contains('/'))
        .then(|| std::fs::read(dir.join(name)).ok())
        .flatten();
    let response = match body {
        Some(body) => {
            let mut r = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            )
            .into_bytes();
            r.extend(body);
            r
        }
        None => {
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec()
        }
    };
    let _ = stream.write_all(&response);
}

#[test]
fn vllm_and_sglang_dashboards_have_data_from_their_exposition_in_prometheus() {
    let _group = crate::common::group(module_path!());
    if !have("prometheus") {
        return;
    }
    let started = Instant::now();
    let port = serve_fixtures();
    let target = |file: &str, service: &str| {
        format!(
            "      - targets: ['127.0.0.1:{port}']\n        labels: {{__metrics_path__: /{file}, namespace: fixtures, service: {service}, pod: {service}-0}}\n"
        )
    };
    let prom = Prometheus::start(&format!(
        "global: {{scrape_interval: 1s, scrape_timeout: 1s}}\nscrape_configs:\n  - job_name: fixtures\n    static_configs:\n{}{}{}",
        target("vllm_v1_dp2.prom", "vllm-v1"),
        target("vllm_v0_single.prom", "vllm-v0"),
        target("sglang_dp4.prom", "sglang"),
    ));
    let checks = checks(&FIXTURE_DASHBOARDS);
    let n = evaluate(
        &prom,
        &checks,
        false,
        Instant::now() + Duration::from_secs(30),
    );
    // The KV panel falls back to V0's gauge: both vLLM generations are on it.
    let kv = checks
        .iter()
        .find(|c| c.what.contains("KV cache usage (fullest engine)"))
        .unwrap();
    let pods: BTreeSet<String> = prom
        .query(&kv.promql)
        .unwrap()
        .iter()
        .map(|r| r["metric"]["pod"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        pods,
        BTreeSet::from(["vllm-v0-0".to_string(), "vllm-v1-0".to_string()])
    );
    eprintln!(
        "{n} expressions of {} dashboards have data; {:.1} s in all",
        FIXTURE_DASHBOARDS.len(),
        started.elapsed().as_secs_f64()
    );
}
