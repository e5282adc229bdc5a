//! `--help` is the reference the docs quote: every flag the binary accepts must be
//! documented, so a new flag cannot ship undocumented.

use std::process::Command;

fn flags(subcommand: &str) -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_ballast"))
        .args([subcommand, "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    let mut flags: Vec<String> = help
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("--"))
        .map(|l| format!("--{}", l.split([' ', ',', '<']).next().unwrap()))
        .filter(|f| f != "--help" && f != "--version")
        .collect();
    flags.dedup();
    // Every subcommand with flags has `--json` or more than a handful: a parse that finds
    // fewer read the help wrong.
    assert!(
        flags.len() > 5 || flags.iter().any(|f| f == "--json"),
        "parsed too few flags from:\n{help}"
    );
    flags
}

fn doc(name: &str) -> String {
    std::fs::read_to_string(format!("{}/../docs/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[test]
fn every_engine_flag_is_documented() {
    let _group = crate::common::group(module_path!());
    let docs = doc("engine.md");
    let missing: Vec<_> = flags("engine")
        .into_iter()
        .filter(|f| !docs.contains(f.as_str()))
        .collect();
    assert!(missing.is_empty(), "docs/engine.md lacks {missing:?}");
}

#[test]
fn every_bench_flag_is_documented() {
    let _group = crate::common::group(module_path!());
    let docs = doc("bench.md");
    let missing: Vec<_> = flags("bench")
        .into_iter()
        .filter(|f| !docs.contains(f.as_str()))
        .collect();
    assert!(missing.is_empty(), "docs/bench.md lacks {missing:?}");
}

#[test]
fn every_local_flag_is_documented() {
    let _group = crate::common::group(module_path!());
    let docs = doc("local.md");
    let missing: Vec<_> = flags("local")
        .into_iter()
        .filter(|f| !docs.contains(f.as_str()))
        .collect();
    assert!(missing.is_empty(), "docs/local.md lacks {missing:?}");
}

#[test]
fn every_operator_flag_is_documented() {
    let _group = crate::common::group(module_path!());
    let docs = doc("operator.md");
    let missing: Vec<_> = flags("operator")
        .into_iter()
        .filter(|f| !docs.contains(f.as_str()))
        .collect();
    assert!(missing.is_empty(), "docs/operator.md lacks {missing:?}");
}

#[test]
fn every_signals_flag_is_documented() {
    let _group = crate::common::group(module_path!());
    let docs = doc("cli.md");
    let flags = flags("signals");
    assert_eq!(flags.len(), 4, "{flags:?}");
    let missing: Vec<_> = flags
        .into_iter()
        .filter(|f| !docs.contains(f.as_str()))
        .collect();
    assert!(missing.is_empty(), "docs/cli.md lacks {missing:?}");
}

#[test]
fn every_gateway_flag_is_documented() {
    let _group = crate::common::group(module_path!());
    let docs = doc("gateway.md");
    let missing: Vec<_> = flags("gateway")
        .into_iter()
        .filter(|f| !docs.contains(f.as_str()))
        .collect();
    assert!(missing.is_empty(), "docs/gateway.md lacks {missing:?}");
}

#[test]
fn ballast_crd_prints_the_committed_crd() {
    let _group = crate::common::group(module_path!());
    let out = Command::new(env!("CARGO_BIN_EXE_ballast"))
        .arg("crd")
        .output()
        .unwrap();
    assert!(out.status.success());
    let committed = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../crds/inferenceservices.ballast.dev.yaml"
    ))
    .unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), committed);
}

/// docs/benchmarks.md's comparisons with llama-server are generated from the committed
/// records of `scripts/bench-anchor.sh` runs (`docs/bench-results/`), never typed: a figure
/// edited by hand, or records changed without regenerating, fail here.
#[test]
fn the_llama_server_tables_are_generated_from_their_records() {
    let _group = crate::common::group(module_path!());
    let root = format!("{}/..", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .current_dir(&root)
        .args([
            "scripts/anchor_summary.py",
            "docs",
            "--check",
            "docs/benchmarks.md",
        ])
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("tables match their records"), "{said}");
    // Both kinds of machine are reported, each by a generated table.
    let doc = std::fs::read_to_string(format!("{root}/docs/benchmarks.md")).unwrap();
    let runs: Vec<&str> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("<!-- anchor-table "))
        .collect();
    for isa in ["avx512", "avx2"] {
        assert!(
            runs.iter()
                .any(|r| r.trim_end_matches(" -->").ends_with(isa)),
            "no generated table of a {isa} run: {runs:?}"
        );
    }
}
