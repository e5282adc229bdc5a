//! docs/architecture.md's module lists against the tree.
//!
//! The doc's fenced blocks marked `modules` name every `.rs` file under the `src/` folder of
//! every workspace member (the root Cargo.toml's `members`), one per line, by its path from
//! the repository root; `dir/` stands for `dir/mod.rs`, and a line that starts with
//! whitespace continues the description above it. This test fails when a file exists that
//! the doc does not name, or the doc names one that does not exist, so the page cannot fall
//! behind a file added, moved or removed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const DOC: &str = "docs/architecture.md";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cli/ has a parent")
        .to_path_buf()
}

/// The workspace members, from `members = [...]` in the root Cargo.toml.
fn members(cargo_toml: &str) -> Vec<String> {
    let start = cargo_toml
        .find("members")
        .expect("the root Cargo.toml has `members`");
    let rest = &cargo_toml[start..];
    let open = rest.find('[').expect("`members = [` opens a list");
    let close = rest.find(']').expect("`members` list is closed");
    rest[open + 1..close]
        .lines()
        .map(|l| l.split('#').next().unwrap_or_default())
        .flat_map(|l| l.split(','))
        .map(|m| m.trim().trim_matches('"').to_string())
        .filter(|m| !m.is_empty())
        .collect()
}

/// Every module file of `member`'s `src/`, as the doc names it: the path from the
/// repository root with `/` separators, `dir/` for `dir/mod.rs`.
fn tree_modules(root: &Path, member: &str, out: &mut BTreeSet<String>) {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(root, &path, out);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(root).expect("under the root");
            let rel: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            let name = if rel.last().is_some_and(|f| f == "mod.rs") {
                format!("{}/", rel[..rel.len() - 1].join("/"))
            } else {
                rel.join("/")
            };
            out.insert(name);
        }
    }
    let src = root.join(member).join("src");
    assert!(src.is_dir(), "workspace member {member} has no src/ folder");
    walk(root, &src, out);
}

/// What the doc's `modules` blocks hold.
#[derive(Debug, Default)]
struct DocModules {
    /// Each entry with the (1-based) line it is on.
    entries: BTreeMap<String, usize>,
    /// Problems with the blocks themselves: duplicates, entries that are not module paths,
    /// a block left open, no block at all.
    problems: Vec<String>,
}

fn doc_modules(text: &str) -> DocModules {
    let mut doc = DocModules::default();
    let mut blocks = 0;
    let mut open: Option<usize> = None;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let fence = line.trim();
        match open {
            None => {
                if fence == "```modules" {
                    open = Some(n);
                    blocks += 1;
                }
                continue;
            }
            Some(_) if fence.starts_with("```") => {
                open = None;
                continue;
            }
            Some(_) => {}
        }
        if line.trim().is_empty() || line.starts_with(char::is_whitespace) {
            continue; // a description continued
        }
        let path = line.split_whitespace().next().expect("not empty");
        if !(path.ends_with(".rs") || path.ends_with('/')) || path.starts_with('/') {
            doc.problems.push(format!(
                "line {n}: {path:?} is not a module path (a `.rs` file or a `folder/`)"
            ));
            continue;
        }
        if let Some(first) = doc.entries.insert(path.to_string(), n) {
            doc.problems.push(format!(
                "line {n}: {path} is listed again (first on line {first})"
            ));
        }
    }
    if let Some(start) = open {
        doc.problems.push(format!(
            "the ```modules block opened on line {start} is never closed"
        ));
    }
    if blocks == 0 {
        doc.problems
            .push("no ```modules block found: the module lists are fenced as ```modules".into());
    }
    doc
}

/// Everything wrong between the doc's lists and the tree, or `None` when they agree.
fn differences(doc: &DocModules, tree: &BTreeSet<String>) -> Option<String> {
    let missing: Vec<&String> = tree
        .iter()
        .filter(|m| !doc.entries.contains_key(*m))
        .collect();
    let stale: Vec<String> = doc
        .entries
        .iter()
        .filter(|(m, _)| !tree.contains(*m))
        .map(|(m, line)| format!("{m} (line {line})"))
        .collect();
    if missing.is_empty() && stale.is_empty() && doc.problems.is_empty() {
        return None;
    }
    let mut msg = format!("{DOC}'s module lists (its ```modules blocks) and the tree differ.\n");
    if !missing.is_empty() {
        msg.push_str("In the tree but not in the doc (add a line for each):\n");
        for m in missing {
            msg.push_str(&format!("  {m}\n"));
        }
    }
    if !stale.is_empty() {
        msg.push_str("In the doc but not in the tree (remove or rename them):\n");
        for m in stale {
            msg.push_str(&format!("  {m}\n"));
        }
    }
    for p in &doc.problems {
        msg.push_str(&format!("{p}\n"));
    }
    Some(msg)
}

#[test]
fn the_architecture_doc_lists_every_module_of_the_tree() {
    let _group = crate::common::group(module_path!());
    let root = repo_root();
    let cargo = std::fs::read_to_string(root.join("Cargo.toml")).expect("the root Cargo.toml");
    let members = members(&cargo);
    assert!(
        members.iter().any(|m| m == "engine") && members.iter().any(|m| m == "operator"),
        "members read from Cargo.toml: {members:?}"
    );
    let mut tree = BTreeSet::new();
    for m in &members {
        tree_modules(&root, m, &mut tree);
    }
    let text = std::fs::read_to_string(root.join(DOC)).expect("docs/architecture.md");
    if let Some(msg) = differences(&doc_modules(&text), &tree) {
        panic!("{msg}");
    }
}

#[test]
fn a_missing_or_stale_entry_is_named_on_its_side() {
    let _group = crate::common::group(module_path!());
    let doc = doc_modules(
        "intro\n\
         ```modules\n\
         engine/src/lib.rs     the root\n\
         \x20                     continued\n\
         engine/src/gone.rs    removed from the tree\n\
         engine/src/kv/        a folder\n\
         ```\n\
         ```\n\
         engine/src/ignored.rs not a modules block\n\
         ```\n",
    );
    assert!(doc.problems.is_empty(), "{:?}", doc.problems);
    let tree: BTreeSet<String> = ["engine/src/lib.rs", "engine/src/kv/", "engine/src/new.rs"]
        .into_iter()
        .map(String::from)
        .collect();
    let msg = differences(&doc, &tree).expect("they differ");
    let (missing, stale) = msg
        .split_once("In the doc but not in the tree")
        .expect("both sides named");
    assert!(missing.contains("  engine/src/new.rs\n"), "{msg}");
    assert!(stale.contains("  engine/src/gone.rs (line 5)\n"), "{msg}");
    assert!(
        !msg.contains("ignored.rs") && !msg.contains("lib.rs"),
        "{msg}"
    );
}

#[test]
fn broken_blocks_are_reported() {
    let _group = crate::common::group(module_path!());
    let doc = doc_modules("```modules\nengine/src/a.rs x\nengine/src/a.rs y\nREADME.md z\n");
    let all = doc.problems.join("\n");
    assert!(
        all.contains("line 3: engine/src/a.rs is listed again (first on line 2)"),
        "{all}"
    );
    assert!(
        all.contains("line 4: \"README.md\" is not a module path"),
        "{all}"
    );
    assert!(all.contains("opened on line 1 is never closed"), "{all}");
    assert!(
        doc_modules("no blocks here\n").problems[0].contains("no ```modules block"),
        "{:?}",
        doc_modules("").problems
    );
}

mod imports;

#[test]
fn no_crate_has_an_import_circle() {
    let _group = crate::common::group(module_path!());
    let root = repo_root();
    let cargo = std::fs::read_to_string(root.join("Cargo.toml")).expect("the root Cargo.toml");
    let mut found = Vec::new();
    let mut modules = 0;
    for member in members(&cargo) {
        let sources = imports::crate_sources(&root, &member);
        modules += sources.len();
        for circle in imports::circles(&imports::import_graph(&sources)) {
            found.push(format!("{member}: {circle}"));
        }
    }
    assert!(modules > 100, "read only {modules} modules");
    assert!(
        found.is_empty(),
        "import circles (docs/architecture.md says which way each arrow goes):\n{}",
        found.join("\n")
    );
}

/// An in-memory crate: (module path, is a folder, source).
fn sources(
    files: &[(&str, bool, &str)],
) -> std::collections::BTreeMap<imports::ModPath, imports::Source> {
    files
        .iter()
        .map(|(path, is_dir, text)| {
            let path = path
                .split("::")
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            let source = imports::Source {
                is_dir: *is_dir,
                text: imports::clean(text),
            };
            (path, source)
        })
        .collect()
}

#[test]
fn a_circle_through_a_reexport_is_named_with_its_paths() {
    let _group = crate::common::group(module_path!());
    let crate_ = sources(&[
        ("", true, "pub mod a;\npub mod b;\n"),
        ("a", false, "use crate::b::Thing;\npub struct Local;\n"),
        (
            "b",
            true,
            "mod inner;\npub use inner::Other;\npub struct Thing;\n",
        ),
        ("b::inner", false, "pub struct Other(crate::a::Local);\n"),
    ]);
    let circles = imports::circles(&imports::import_graph(&crate_));
    let all = circles.join("\n");
    assert!(
        all.contains(
            "between files: a → b (`crate::b::Thing`) → b::inner (`inner::Other`) \
             → a (`crate::a::Local`)"
        ),
        "{all}"
    );
    assert!(
        all.contains(
            "between the parts of (root): a → b (a: `crate::b::Thing`) \
             → a (b::inner: `crate::a::Local`)"
        ),
        "{all}"
    );
}

#[test]
fn reexports_comments_strings_and_test_modules_make_no_circle() {
    let _group = crate::common::group(module_path!());
    let crate_ = sources(&[
        ("", true, "pub mod a;\npub mod b;\n"),
        // The folder re-exports its children; a child names a sibling through it.
        (
            "a",
            true,
            "mod x;\nmod y;\npub use x::X;\npub(crate) use y::{Y as Why, self};\n",
        ),
        ("a::x", false, "pub struct X;\n"),
        ("a::y", false, "use super::X;\npub struct Y(X);\n"),
        (
            "b",
            false,
            "// crate::a::nothing\nconst S: &str = \"crate::a::X\";\n\
             use crate::a::Why;\n\
             #[cfg(test)]\nmod tests {\n    use crate::b::*;\n    fn f() { crate::a::x::X; }\n}\n",
        ),
    ]);
    let graph = imports::import_graph(&crate_);
    let circles = imports::circles(&graph);
    assert!(circles.is_empty(), "{circles:?}");
    // The arrows that are there were seen, through the re-exports to where things live.
    let targets = |m: &[&str]| -> Vec<String> {
        let m: Vec<String> = m.iter().map(|s| s.to_string()).collect();
        graph[&m].keys().map(|k| k.join("::")).collect()
    };
    assert_eq!(targets(&["a", "y"]), ["a::x"]);
    assert_eq!(targets(&["b"]), ["a::y"]);
    assert_eq!(targets(&["a"]), ["a::x", "a::y"]);
}

/// The engine's rooms, in the order docs/architecture.md draws them: each uses only rooms
/// to its right.
const ENGINE_ROOMS: [&str; 6] = ["api", "runtime", "telemetry", "config", "compute", "step"];

#[test]
fn the_engines_rooms_point_one_way() {
    let _group = crate::common::group(module_path!());
    let root = repo_root();
    let graph = imports::import_graph(&imports::crate_sources(&root, "engine"));
    let rank = |m: &imports::ModPath| {
        let first = m.first()?;
        ENGINE_ROOMS.iter().position(|r| r == first)
    };
    let mut rooms = BTreeSet::new();
    let mut wrong = Vec::new();
    for (from, to) in &graph {
        let Some(a) = rank(from) else { continue };
        rooms.insert(a);
        for (target, path) in to {
            match rank(target) {
                Some(b) if b < a => wrong.push(format!(
                    "{} uses {} (`{path}`): {} is left of {}",
                    from.join("::"),
                    target.join("::"),
                    ENGINE_ROOMS[b],
                    ENGINE_ROOMS[a]
                )),
                _ => {}
            }
        }
    }
    assert_eq!(rooms.len(), ENGINE_ROOMS.len(), "rooms found: {rooms:?}");
    let top: BTreeSet<String> = graph
        .keys()
        .filter(|m| m.len() == 1)
        .map(|m| m[0].clone())
        .collect();
    let expected: BTreeSet<String> = ENGINE_ROOMS.iter().map(|r| r.to_string()).collect();
    assert_eq!(top, expected, "engine/src/lib.rs's modules are the rooms");
    assert!(
        wrong.is_empty(),
        "arrows against the rooms' order ({}):\n{}",
        ENGINE_ROOMS.join(" → "),
        wrong.join("\n")
    );
}
