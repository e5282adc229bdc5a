//! The values tables of docs/chart.md and the chart's README name every value of
//! values.schema.json, and only those.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value as Json;

/// The schema's leaf values: paths to schemas without `properties`.
fn leaves(schema: &Json, prefix: &str, out: &mut BTreeSet<String>) {
    match schema.get("properties").and_then(Json::as_object) {
        Some(props) => {
            for (k, sub) in props {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(sub, &path, out);
            }
        }
        None => {
            out.insert(prefix.to_string());
        }
    }
}

/// The first cell of each table row, when it is a `code` span.
fn documented(markdown: &str) -> BTreeSet<String> {
    markdown
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`'))
        .map(|(path, _)| path.to_string())
        .filter(|p| !p.contains(' ') && !p.contains('/'))
        .collect()
}

#[test]
fn every_value_is_documented_in_both_tables() {
    let dir = common::chart_dir();
    let schema: Json =
        serde_json::from_str(&std::fs::read_to_string(dir.join("values.schema.json")).unwrap())
            .unwrap();
    let mut schema_leaves = BTreeSet::new();
    leaves(&schema, "", &mut schema_leaves);
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/chart.md");
    for file in [dir.join("README.md"), docs] {
        let rows = documented(&std::fs::read_to_string(&file).unwrap());
        // A documented object covers its children (operator.resources).
        let uncovered: Vec<_> = schema_leaves
            .iter()
            .filter(|leaf| {
                !rows
                    .iter()
                    .any(|r| *leaf == r || leaf.starts_with(&format!("{r}.")))
            })
            .collect();
        assert!(
            uncovered.is_empty(),
            "{}: not documented: {uncovered:?}",
            file.display()
        );
        let stale: Vec<_> = rows
            .iter()
            .filter(|r| {
                !schema_leaves
                    .iter()
                    .any(|leaf| leaf == *r || leaf.starts_with(&format!("{r}.")))
            })
            .collect();
        assert!(
            stale.is_empty(),
            "{}: not a value: {stale:?}",
            file.display()
        );
    }
}

#[test]
fn values_yaml_and_the_schema_name_the_same_values() {
    // Every default is a value of the schema (additionalProperties false refuses the
    // others anyway), and every value of the schema has a default in values.yaml.
    fn walk(v: &Json, prefix: &str, out: &mut BTreeSet<String>) {
        match v {
            Json::Object(m) if !m.is_empty() => {
                for (k, child) in m {
                    let path = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(child, &path, out);
                }
            }
            _ => {
                out.insert(prefix.to_string());
            }
        }
    }
    // The defaults as Helm reads values.yaml.
    let values = common::helm()
        .values(common::chart_dir(), "")
        .unwrap_or_else(|e| panic!("{e}"));
    let mut defaults = BTreeSet::new();
    walk(&values, "", &mut defaults);
    assert!(defaults.len() > 20, "{defaults:?}");
    let schema: Json = serde_json::from_str(
        &std::fs::read_to_string(common::chart_dir().join("values.schema.json")).unwrap(),
    )
    .unwrap();
    for path in &defaults {
        let mut s = &schema;
        for key in path.split('.') {
            if s.get("properties").is_none() {
                // An open map (resources.limits, nodeSelector…): any key.
                break;
            }
            s = s
                .get("properties")
                .and_then(|p| p.get(key))
                .unwrap_or_else(|| panic!("values.yaml has {path}, the schema does not"));
        }
    }
    let mut schema_leaves = BTreeSet::new();
    leaves(&schema, "", &mut schema_leaves);
    for leaf in &schema_leaves {
        assert!(
            defaults.iter().any(|d| d == leaf
                || leaf.starts_with(&format!("{d}."))
                || d.starts_with(&format!("{leaf}."))),
            "the schema has {leaf}, values.yaml has no default for it"
        );
    }
}
