//! No import circles, in any crate of the workspace.
//!
//! A module's imports are read from its source: `use` declarations (groups expanded) and
//! every `crate::`, `super::` and `self::` path in its code, and, in a folder's `mod.rs`,
//! paths that start with one of its child modules. A name is followed through `pub use`
//! re-exports to the module that defines it, so a child that names `super::Thing` depends
//! on the module where `Thing` is written, not on the folder that re-exports it. Comments,
//! string literals and test-only modules (`#[cfg(test)] mod …`) are left out.
//!
//! Two rules, each a circle reported with the path that closes it:
//! - between files: no module reaches itself through the imports of others;
//! - between folders: inside every folder, its children (files and subfolders, each taken
//!   whole) import one another in one direction only.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;

/// A module path inside one crate: `["compute", "backend", "cpu"]`; empty for the root.
pub type ModPath = Vec<String>;

/// One module's source as the checker needs it.
pub struct Source {
    /// `mod.rs`, `lib.rs` or `main.rs`: its children are the modules of its folder.
    pub is_dir: bool,
    pub text: String,
}

/// Every module of `member`'s `src/` (the library's tree when there is one; `src/bin` and
/// test-only modules left out).
pub fn crate_sources(root: &Path, member: &str) -> BTreeMap<ModPath, Source> {
    let src = root.join(member).join("src");
    let has_lib = src.join("lib.rs").is_file();
    let mut files = Vec::new();
    walk(&src, &mut files);
    let mut out = BTreeMap::new();
    let mut test_only = BTreeSet::new();
    for file in files {
        let rel = file.strip_prefix(&src).expect("under src/");
        let mut parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if parts[0] == "bin" || (has_lib && parts == ["main.rs"]) {
            continue;
        }
        let name = parts.pop().expect("a file name");
        let is_dir = matches!(name.as_str(), "mod.rs" | "lib.rs" | "main.rs");
        if !is_dir {
            parts.push(name.trim_end_matches(".rs").to_string());
        }
        let raw = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{file:?}: {e}"));
        for (child, path_attr) in test_only_children(&raw) {
            // `#[path = "x_tests.rs"]` names a file beside the declaring one.
            let dir = if is_dir {
                parts.clone()
            } else {
                parts[..parts.len() - 1].to_vec()
            };
            let mut m = dir;
            match path_attr {
                Some(p) => m.push(p.trim_end_matches(".rs").to_string()),
                None if is_dir => m.push(child),
                None => {
                    m = parts.clone();
                    m.push(child);
                }
            }
            test_only.insert(m);
        }
        out.insert(
            parts,
            Source {
                is_dir,
                text: clean(&raw),
            },
        );
    }
    out.retain(|m, _| !test_only.contains(m));
    out
}

fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The children a file declares under `#[cfg(test)]`, with their `#[path]` when given.
fn test_only_children(raw: &str) -> Vec<(String, Option<String>)> {
    let text = clean_keep_cfg_test(raw);
    let mut out = Vec::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        rest = &rest[at + "#[cfg(test)]".len()..];
        let mut head = rest.trim_start();
        let mut path_attr = None;
        while let Some(attr) = head.strip_prefix("#[") {
            let end = attr.find(']').unwrap_or(attr.len());
            let inner = &attr[..end];
            if let Some(p) = inner.trim().strip_prefix("path") {
                path_attr = Some(
                    p.trim_start_matches([' ', '='])
                        .trim_matches('"')
                        .to_string(),
                );
            }
            head = attr[(end + 1).min(attr.len())..].trim_start();
        }
        let Some(decl) = head
            .strip_prefix("pub(crate) mod ")
            .or_else(|| head.strip_prefix("mod "))
        else {
            continue;
        };
        let name: String = decl
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if decl[name.len()..].trim_start().starts_with(';') {
            out.push((name, path_attr));
        }
    }
    out
}

/// `raw` with comments blanked but strings kept (for `#[path = "…"]`).
fn clean_keep_cfg_test(raw: &str) -> String {
    strip(raw, false)
}

/// `raw` with comments, string and char literals blanked and inline test modules removed.
pub fn clean(raw: &str) -> String {
    let text = strip(raw, true);
    remove_inline_test_modules(&text)
}

fn strip(raw: &str, strings: bool) -> String {
    let b = raw.as_bytes();
    let mut out = String::with_capacity(raw.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == b'r'
            && matches!(b.get(i + 1), Some(b'"' | b'#'))
            && (i == 0 || !is_ident(b[i - 1]))
        {
            // A raw string: r"…", r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(c as char);
                i += 1;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            let body = j + 1;
            let end = raw[body..]
                .find(std::str::from_utf8(&close).expect("ascii"))
                .map_or(b.len(), |e| body + e + close.len());
            push_literal(&mut out, &raw[i..end], strings);
            i = end;
        } else if c == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(b.len());
            push_literal(&mut out, &raw[i..end], strings);
            i = end;
        } else if c == b'\'' {
            // A char literal ('a', '\n', '\u{1F600}') or a lifetime ('a).
            let end = if b.get(i + 1) == Some(&b'\\') {
                raw[i + 2..].find('\'').map(|e| i + 2 + e + 1)
            } else {
                let ch = raw[i + 1..].chars().next();
                ch.and_then(|ch| {
                    let after = i + 1 + ch.len_utf8();
                    (b.get(after) == Some(&b'\'')).then_some(after + 1)
                })
            };
            match end {
                Some(end) => {
                    out.push_str("' '");
                    i = end;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            let ch = raw[i..].chars().next().expect("in bounds");
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

fn push_literal(out: &mut String, literal: &str, blank: bool) {
    if blank {
        out.push_str("\"\"");
    } else {
        out.push_str(literal);
    }
}

fn ends_with_word(text: &str, word: &str) -> bool {
    text.strip_suffix(word)
        .is_some_and(|rest| !rest.ends_with(|c: char| c.is_alphanumeric() || c == '_'))
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Removes `#[cfg(test)] mod name { … }` blocks.
fn remove_inline_test_modules(text: &str) -> String {
    const CFG: &str = "#[cfg(test)]";
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while let Some(found) = text[at..].find(CFG) {
        let cfg = at + found;
        let after = cfg + CFG.len();
        // `mod name {` next, with only whitespace between.
        let head = &text[after..];
        let skipped = head.len() - head.trim_start().len();
        let decl = head.trim_start();
        let name_at = ["pub(crate) mod ", "mod "]
            .iter()
            .find_map(|k| decl.starts_with(k).then_some(k.len()));
        let open = name_at.and_then(|n| {
            let name_end = n + decl[n..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(decl.len() - n);
            let gap = decl[name_end..].len() - decl[name_end..].trim_start().len();
            decl[name_end + gap..]
                .starts_with('{')
                .then_some(after + skipped + name_end + gap)
        });
        out.push_str(&text[at..cfg]);
        let Some(open) = open else {
            out.push_str(CFG);
            at = after;
            continue;
        };
        let mut depth = 0;
        let mut end = text.len();
        for (k, ch) in text[open..].char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + k + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        at = end;
    }
    out.push_str(&text[at..]);
    out
}

/// The paths of every `use` declaration, groups expanded, each with whether it is a
/// re-export (`pub use`, `pub(crate) use`, …) and the name it binds.
fn use_paths(text: &str) -> Vec<(bool, String, String)> {
    let inline = inline_modules(text);
    let mut out = Vec::new();
    let b = text.as_bytes();
    let mut from = 0;
    while let Some(at) = text[from..].find("use ") {
        let at = from + at;
        from = at + 4;
        if at > 0 && is_ident(b[at - 1]) {
            continue;
        }
        let before = text[..at].trim_end();
        let public = if let Some(group) = before.strip_suffix(')') {
            // `pub(crate) use`, `pub(super) use`
            group
                .rfind('(')
                .is_some_and(|open| ends_with_word(&group[..open], "pub"))
        } else {
            ends_with_word(before, "pub")
        };
        let Some(end) = text[at..].find(';') else {
            break;
        };
        // `a as b` becomes `a@b` before the whitespace goes.
        let words: Vec<&str> = text[at + 4..at + end].split_whitespace().collect();
        let body = words.join(" ").replace(" as ", "@").replace(' ', "");
        for path in expand("", &body) {
            let (path, name) = match path.split_once('@') {
                Some((p, n)) => (p.to_string(), n.to_string()),
                None => {
                    let name = path.rsplit("::").next().unwrap_or_default().to_string();
                    (path.clone(), name)
                }
            };
            if let Some(path) = from_inline(&path, depth_at(&inline, at)) {
                out.push((public, path, name));
            }
        }
    }
    out
}

/// `a::{b, c::{d, self}}` (whitespace removed) as `a::b`, `a::c::d`, `a::c`.
fn expand(prefix: &str, body: &str) -> Vec<String> {
    let join = |p: &str, s: &str| {
        if p.is_empty() {
            s.to_string()
        } else if s == "self" {
            p.to_string()
        } else {
            format!("{p}::{s}")
        }
    };
    let mut out = Vec::new();
    let mut depth = 0;
    let mut item = String::new();
    for ch in body.chars().chain(std::iter::once(',')) {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => {}
        }
        if ch == ',' && depth == 0 {
            if let Some(open) = item.find("::{") {
                let inner = &item[open + 3..item.len() - 1];
                out.extend(expand(&join(prefix, &item[..open]), inner));
            } else if let Some(inner) = item.strip_prefix('{') {
                out.extend(expand(prefix, &inner[..inner.len() - 1]));
            } else if !item.is_empty() {
                out.push(join(prefix, &item));
            }
            item.clear();
        } else {
            item.push(ch);
        }
    }
    out
}

/// Every `crate::…`, `super::…` and `self::…` path in the code, and (`children` given)
/// every path that starts with one of them.
fn code_paths(text: &str, children: &[String]) -> Vec<String> {
    let inline = inline_modules(text);
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if !is_ident(b[i]) || (i > 0 && (is_ident(b[i - 1]) || b[i - 1] == b':')) {
            i += 1;
            continue;
        }
        let mut j = i;
        let mut segments = Vec::new();
        loop {
            let start = j;
            while j < b.len() && is_ident(b[j]) {
                j += 1;
            }
            segments.push(&text[start..j]);
            if text[j..].starts_with("::") && b.get(j + 2).is_some_and(|c| is_ident(*c)) {
                j += 2;
            } else {
                break;
            }
        }
        let first = segments[0];
        if segments.len() > 1
            && (matches!(first, "crate" | "super" | "self") || children.iter().any(|c| c == first))
        {
            out.extend(from_inline(&segments.join("::"), depth_at(&inline, i)));
        }
        i = j.max(i + 1);
    }
    out
}

/// The bodies of the file's inline modules (`mod name { … }`), as byte ranges.
fn inline_modules(text: &str) -> Vec<(usize, usize)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(found) = text[from..].find("mod ") {
        let at = from + found;
        from = at + 4;
        if at > 0 && is_ident(b[at - 1]) {
            continue;
        }
        let rest = &text[at + 4..];
        let name = rest.len()
            - rest
                .trim_start_matches(|c: char| c.is_alphanumeric() || c == '_' || c == '$')
                .len();
        let after = rest[name..].trim_start();
        if name == 0 || !after.starts_with('{') {
            continue;
        }
        let open = text.len() - after.len();
        let mut depth = 0;
        for (k, ch) in text[open..].char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        out.push((open, open + k));
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    out
}

fn depth_at(inline: &[(usize, usize)], at: usize) -> usize {
    inline.iter().filter(|(a, b)| *a < at && at < *b).count()
}

/// A path written `depth` inline modules deep, as the file module would write it: the
/// first `depth` `super`s stay in the file. `None` when it names something inside the file.
fn from_inline(path: &str, depth: usize) -> Option<String> {
    if depth == 0 || path.starts_with("crate::") {
        return Some(path.to_string());
    }
    let mut rest = path;
    for _ in 0..depth {
        rest = rest.strip_prefix("super::")?;
    }
    Some(format!("self::{rest}"))
}

/// `path`, as written in `module`, from the crate root; `None` for another crate's path.
fn absolute(module: &ModPath, is_dir: bool, children: &[String], path: &str) -> Option<ModPath> {
    let parts: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let (mut base, mut rest) = match parts.first().copied()? {
        "crate" => (Vec::new(), &parts[1..]),
        "self" => (module.clone(), &parts[1..]),
        "super" => (
            module[..module.len().saturating_sub(1)].to_vec(),
            &parts[1..],
        ),
        first if is_dir && children.iter().any(|c| c == first) => (module.clone(), &parts[..]),
        _ => return None,
    };
    while rest.first() == Some(&"super") {
        base.pop();
        rest = &rest[1..];
    }
    base.extend(rest.iter().map(|s| s.to_string()));
    Some(base)
}

fn children_of(modules: &BTreeMap<ModPath, Source>, module: &ModPath) -> Vec<String> {
    modules
        .keys()
        .filter(|k| k.len() == module.len() + 1 && k.starts_with(module))
        .map(|k| k.last().expect("not the root").clone())
        .collect()
}

/// The crate's import graph: module → the modules it uses, each with a path that shows it.
pub fn import_graph(
    modules: &BTreeMap<ModPath, Source>,
) -> BTreeMap<ModPath, BTreeMap<ModPath, String>> {
    // Where each re-exported name really lives.
    let mut reexports: BTreeMap<&ModPath, BTreeMap<String, ModPath>> = BTreeMap::new();
    for (m, src) in modules {
        let children = children_of(modules, m);
        for (public, path, name) in use_paths(&src.text) {
            if !public || name == "*" {
                continue;
            }
            if let Some(target) = absolute(m, src.is_dir, &children, &path) {
                reexports.entry(m).or_default().insert(name, target);
            }
        }
    }
    let resolve = |full: &ModPath| -> Option<ModPath> {
        let mut full = full.clone();
        for _ in 0..16 {
            let k = (0..=full.len())
                .rev()
                .find(|k| modules.contains_key(&full[..*k]))?;
            let module = full[..k].to_vec();
            match full.get(k).and_then(|n| reexports.get(&module)?.get(n)) {
                Some(target) => {
                    let mut next = target.clone();
                    next.extend_from_slice(&full[k + 1..]);
                    full = next;
                }
                None => return Some(module),
            }
        }
        None
    };
    let mut graph = BTreeMap::new();
    for (m, src) in modules {
        let children = children_of(modules, m);
        let mut paths: Vec<String> = use_paths(&src.text)
            .into_iter()
            .map(|(_, p, _)| p)
            .collect();
        paths.extend(code_paths(
            &src.text,
            if src.is_dir { &children } else { &[] },
        ));
        let mut edges = BTreeMap::new();
        for p in paths {
            let Some(target) = absolute(m, src.is_dir, &children, &p).and_then(|a| resolve(&a))
            else {
                continue;
            };
            if &target != m {
                edges.entry(target).or_insert(p);
            }
        }
        graph.insert(m.clone(), edges);
    }
    graph
}

fn name(m: &[String]) -> String {
    if m.is_empty() {
        "(root)".into()
    } else {
        m.join("::")
    }
}

/// Every circle, file by file and folder by folder, each as one line naming its path.
pub fn circles(graph: &BTreeMap<ModPath, BTreeMap<ModPath, String>>) -> Vec<String> {
    let mut out = Vec::new();
    // Between files.
    let nodes: Vec<ModPath> = graph.keys().cloned().collect();
    let edges = |n: &ModPath| -> Vec<(ModPath, String)> {
        graph[n]
            .iter()
            .map(|(t, p)| (t.clone(), format!("`{p}`")))
            .collect()
    };
    for cycle in cycles(&nodes, edges) {
        out.push(format!("between files: {}", render(&cycle)));
    }
    // Between the children of each folder, each child taken whole.
    let folders: BTreeSet<ModPath> = graph
        .keys()
        .filter(|k| !k.is_empty())
        .map(|k| k[..k.len() - 1].to_vec())
        .collect();
    for folder in folders {
        let child_of = |m: &ModPath| -> Option<ModPath> {
            (m.len() > folder.len() && m.starts_with(&folder))
                .then(|| m[..folder.len() + 1].to_vec())
        };
        let mut contracted: BTreeMap<ModPath, BTreeMap<ModPath, String>> = BTreeMap::new();
        for (from, to) in graph {
            let Some(a) = child_of(from) else { continue };
            contracted.entry(a.clone()).or_default();
            for (t, p) in to {
                match child_of(t) {
                    Some(b) if b != a => {
                        contracted
                            .entry(a.clone())
                            .or_default()
                            .entry(b)
                            .or_insert_with(|| format!("{}: `{p}`", name(from)));
                    }
                    _ => {}
                }
            }
        }
        let nodes: Vec<ModPath> = contracted.keys().cloned().collect();
        let edges = |n: &ModPath| -> Vec<(ModPath, String)> {
            contracted[n]
                .iter()
                .map(|(t, p)| (t.clone(), p.clone()))
                .collect()
        };
        for cycle in cycles(&nodes, edges) {
            if cycle.len() > 1 {
                out.push(format!(
                    "between the parts of {}: {}",
                    name(&folder),
                    render(&cycle)
                ));
            }
        }
    }
    out
}

/// One shortest circle through each group of mutually reachable nodes.
fn cycles(
    nodes: &[ModPath],
    edges: impl Fn(&ModPath) -> Vec<(ModPath, String)>,
) -> Vec<Vec<(ModPath, String)>> {
    let reach = |from: &ModPath| -> BTreeMap<ModPath, (ModPath, String)> {
        // Breadth first: each reached node with the node and path it was reached by.
        let mut seen: BTreeMap<ModPath, (ModPath, String)> = BTreeMap::new();
        let mut queue = VecDeque::from([from.clone()]);
        while let Some(n) = queue.pop_front() {
            for (t, p) in edges(&n) {
                if !seen.contains_key(&t) {
                    seen.insert(t.clone(), (n.clone(), p));
                    queue.push_back(t);
                }
            }
        }
        seen
    };
    let mut done: BTreeSet<ModPath> = BTreeSet::new();
    let mut out = Vec::new();
    for n in nodes {
        if done.contains(n) {
            continue;
        }
        let from_n = reach(n);
        if !from_n.contains_key(n) {
            continue;
        }
        // Walk back from n to itself along the breadth-first tree.
        let mut cycle = Vec::new();
        let mut at = n.clone();
        loop {
            let (prev, p) = from_n[&at].clone();
            cycle.push((at.clone(), p));
            at = prev;
            if &at == n {
                break;
            }
        }
        cycle.reverse();
        // Everything on a circle with n is reported by this one.
        for m in from_n.keys() {
            if reach(m).contains_key(n) {
                done.insert(m.clone());
            }
        }
        out.push(cycle);
    }
    out
}

/// `a → b (the path by which a uses b) → a (…)`.
fn render(cycle: &[(ModPath, String)]) -> String {
    let start = cycle.last().map(|(m, _)| name(m)).unwrap_or_default();
    let mut s = start;
    for (m, p) in cycle {
        s.push_str(&format!(" → {} ({p})", name(m)));
    }
    s
}
