//! The architecture rule, checked on the source: every module of `src/`
//! names only the modules the architecture's layer table lets it name; no
//! two files inside a module name each other, directly or round a longer
//! circle; no function in `src/` runs past 70 lines and no file past 800.
//!
//! The table is read from src/README.md (section "Layers", the crate's
//! rustdoc front page), so the rule a reader reads is the rule the build
//! keeps. A module "names" another
//! when its code (comments excluded, tests included) says `crate::other`,
//! `crate::{.., other, ..}`, or, in a top-level `mod.rs`, `super::other`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Longest function allowed, in lines from its `fn` line to its closing
/// brace, both included.
const FUNCTION_LINES_MAX: usize = 70;
/// Longest file allowed in `src/`, in lines: one concern per file.
const FILE_LINES_MAX: usize = 800;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `module -> modules it may name`, from src/README.md's layer table: rows
/// `| `module` | `a`, `b`, ... |` between the "## Layers" heading and the
/// next heading.
fn rule() -> BTreeMap<String, BTreeSet<String>> {
    let readme = std::fs::read_to_string(root().join("src/README.md")).expect("src/README.md");
    let section = readme
        .split("\n## Layers\n")
        .nth(1)
        .expect("src/README.md has a '## Layers' section");
    let section = section.split("\n#").next().unwrap_or(section);
    let mut rule = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        assert!(cells.len() >= 4, "layer row {line:?} has too few cells");
        let module = cells[1].trim_matches('`').to_string();
        let allowed = cells[2]
            .split(',')
            .map(|c| c.trim().trim_matches('`').to_string())
            .filter(|c| !c.is_empty() && c != "nothing")
            .collect();
        rule.insert(module, allowed);
    }
    assert!(rule.len() >= 10, "the layer table lists every module");
    rule
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable src dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`None`: the crate
/// root or the binary).
fn module_of(path: &Path) -> Option<String> {
    let rel = path.strip_prefix(root().join("src")).expect("under src");
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    match first.strip_suffix(".rs") {
        Some("lib" | "main") => None,
        Some(name) => Some(name.to_string()),
        None => Some(first),
    }
}

/// The code with comments, string and char literals blanked (newlines
/// kept), so that braces and names inside them do not count.
fn strip(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let end = if b[i..].starts_with(b"//") {
            Some(
                b[i..]
                    .iter()
                    .position(|c| *c == b'\n')
                    .map_or(b.len(), |p| i + p),
            )
        } else if b[i..].starts_with(b"/*") {
            Some(find_from(b, i + 2, b"*/").map_or(b.len(), |p| p + 2))
        } else if b[i] == b'r' && (b[i..].starts_with(b"r\"") || b[i..].starts_with(b"r#")) {
            raw_string_end(b, i)
        } else if b[i] == b'"' {
            Some(string_end(b, i))
        } else if b[i] == b'\'' {
            char_literal_end(b, i)
        } else {
            None
        };
        match end {
            Some(end) => {
                let end = end.min(b.len());
                out.extend(b[i..end].iter().map(|&c| if c == b'\n' { c } else { b' ' }));
                i = end;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8(out).expect("ASCII blanks keep UTF-8")
}

/// Where `needle` starts in `b` at or after `from`.
fn find_from(b: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    (from..b.len()).find(|&j| b[j..].starts_with(needle))
}

/// The end of the raw string `r"..."` or `r#"..."#` at `i` (`None`: an
/// identifier starting with `r`).
fn raw_string_end(b: &[u8], i: usize) -> Option<usize> {
    let hashes = b[i + 1..].iter().take_while(|c| **c == b'#').count();
    if b.get(i + 1 + hashes) != Some(&b'"') {
        return None;
    }
    let mut close = vec![b'"'];
    close.extend(std::iter::repeat_n(b'#', hashes));
    Some(find_from(b, i + 2 + hashes, &close).map_or(b.len(), |p| p + close.len()))
}

/// The end of the string literal at `i` (escapes skipped).
fn string_end(b: &[u8], i: usize) -> usize {
    let mut j = i + 1;
    while j < b.len() && b[j] != b'"' {
        j += if b[j] == b'\\' { 2 } else { 1 };
    }
    j + 1
}

/// The end of the char literal at `i` (`'x'`, `'\n'`, `'\u{..}'`), or
/// `None` for a lifetime (`'a`).
fn char_literal_end(b: &[u8], i: usize) -> Option<usize> {
    if b.get(i + 1) == Some(&b'\\') {
        // The escaped character itself may be a quote: `'\''`.
        b.get(i + 3..)?
            .iter()
            .position(|c| *c == b'\'')
            .map(|p| i + 4 + p)
    } else if b.get(i + 2) == Some(&b'\'') {
        Some(i + 3)
    } else {
        None
    }
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The crate modules a file's code names.
fn named(code: &str, is_top_mod_rs: bool) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut prefixes = vec!["crate::"];
    if is_top_mod_rs {
        prefixes.push("super::");
    }
    for prefix in prefixes {
        for (at, _) in code.match_indices(prefix) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            let rest = code[at + prefix.len()..].trim_start();
            if let Some(group) = rest.strip_prefix('{') {
                // Top-level names of a `{a, b::c, d::{e}}` group.
                let mut depth = 0;
                let mut item_start = true;
                for (j, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => item_start = true,
                        c if item_start && !c.is_whitespace() => {
                            item_start = false;
                            names.insert(ident_at(&group[j..]).to_string());
                        }
                        _ => {}
                    }
                }
            } else {
                names.insert(ident_at(rest).to_string());
            }
        }
    }
    names.retain(|n| !n.is_empty() && n != "self" && n != "super");
    names
}

/// `(name, first line, length)` of every function longer than the limit.
fn long_functions(code: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut found = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let Some(at) = line.find("fn ") else {
            continue;
        };
        let before = line[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let name = ident_at(&line[at + 3..]).to_string();
        if name.is_empty() {
            continue;
        }
        // The body starts at the first `{` before any `;` outside brackets
        // (a declaration without a body ends at `;`; the `;` of an array
        // type such as `-> [u64; 2]` or `x: [u8; N]` does not).
        let mut depth = 0i32;
        let mut brackets = 0i32;
        let mut opened = false;
        let mut end = None;
        'scan: for (m, l) in lines.iter().enumerate().skip(n) {
            let from = if m == n { at } else { 0 };
            for c in l[from..].chars() {
                match c {
                    '(' | '[' if !opened => brackets += 1,
                    ')' | ']' if !opened => brackets -= 1,
                    ';' if !opened && brackets == 0 => break 'scan,
                    '{' => {
                        opened = true;
                        depth += 1;
                    }
                    '}' if opened => {
                        depth -= 1;
                        if depth == 0 {
                            end = Some(m);
                            break 'scan;
                        }
                    }
                    _ => {}
                }
            }
        }
        if let Some(end) = end {
            let len = end - n + 1;
            if len > FUNCTION_LINES_MAX {
                found.push((name, n + 1, len));
            }
        }
    }
    found
}

#[test]
fn modules_name_only_the_layers_beneath_them() {
    let rule = rule();
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    files.sort();
    let mut violations = Vec::new();
    for file in &files {
        let Some(module) = module_of(file) else {
            continue;
        };
        let Some(allowed) = rule.get(&module) else {
            violations.push(format!(
                "{}: module {module} is not in src/README.md's layer table",
                file.display()
            ));
            continue;
        };
        let code = strip(&std::fs::read_to_string(file).expect("source file"));
        let rel = file.strip_prefix(root().join("src")).expect("under src");
        let is_top_mod_rs = rel.components().count() == 2 && rel.ends_with("mod.rs");
        for name in named(&code, is_top_mod_rs) {
            if name != module && !allowed.contains(&name) {
                violations.push(format!("{}: {module} names {name}", rel.display()));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "{} layer violations:\n{}",
        violations.len(),
        violations.join("\n")
    );
}

#[test]
fn functions_are_at_most_70_lines() {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    files.sort();
    let mut long = Vec::new();
    for file in &files {
        let code = strip(&std::fs::read_to_string(file).expect("source file"));
        let rel = file.strip_prefix(root().join("src")).expect("under src");
        for (name, line, len) in long_functions(&code) {
            long.push(format!("{}:{line}: {name} is {len} lines", rel.display()));
        }
    }
    assert!(
        long.is_empty(),
        "{} functions over {FUNCTION_LINES_MAX} lines:\n{}",
        long.len(),
        long.join("\n")
    );
}

#[test]
fn the_checker_sees_what_it_must() {
    let code = strip("use crate::{a, b::c, d::{e, f}};\n// crate::hidden\nlet s = \"crate::str\";\nx = crate::g::h();\n");
    let got: Vec<String> = named(&code, false).into_iter().collect();
    assert_eq!(got, ["a", "b", "d", "g"]);
    let top = named("use super::shard::Shard;", true);
    assert!(top.contains("shard"));
    assert!(named("use super::x;", false).is_empty());
    let body: String = (0..71).map(|_| "    x();\n").collect();
    let long = format!("fn big() {{\n{body}}}\nfn small() {{ '{{'; }}\n");
    let found = long_functions(&strip(&long));
    assert_eq!(found, [("big".to_string(), 1, 73)]);
    assert!(long_functions(&strip("fn decl(x: u8);\nfn f<'a>(x: &'a str) {}\n")).is_empty());
    assert_eq!(
        strip("a('\\'', '\\n', '{', \"}\", 'x) {}"),
        "a(    ,     ,    ,    , 'x) {}"
    );
    // A `;` inside the signature's brackets does not end it (issue 20: a
    // function returning `[u64; 2]` escaped the rule).
    for signature in [
        "fn arr(x: &[u8]) -> [u64; 2] {",
        "fn arg(x: [u8; 4]) {",
        "fn gen<const N: usize>(\n    x: [u8; N],\n) -> ([u32; 4], u8) {",
    ] {
        let code = format!("fn decl(x: [u8; 4]);\n{signature}\n{body}}}\n");
        let lines = signature.lines().count() + 72;
        let name = ident_at(&signature[3..]).to_string();
        assert_eq!(
            long_functions(&strip(&code)),
            [(name, 2, lines)],
            "{signature}"
        );
    }
}

#[test]
fn files_are_at_most_800_lines() {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    files.sort();
    let long: Vec<String> = files
        .iter()
        .filter_map(|file| {
            let lines = std::fs::read_to_string(file)
                .expect("source file")
                .lines()
                .count();
            let rel = file.strip_prefix(root().join("src")).expect("under src");
            (lines > FILE_LINES_MAX).then(|| format!("{}: {lines} lines", rel.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "{} files over {FILE_LINES_MAX} lines:\n{}",
        long.len(),
        long.join("\n")
    );
}

/// A file's module path: `src/shard/mesh.rs` is `["shard", "mesh"]`,
/// `src/shard/mod.rs` is `["shard"]` (`None`: the crate root or binary).
fn module_path(path: &Path) -> Option<Vec<String>> {
    let rel = path.strip_prefix(root().join("src")).expect("under src");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_str().expect("UTF-8 path").to_string())
        .collect();
    let last = parts.pop()?;
    match last.strip_suffix(".rs")? {
        "mod" => {}
        "lib" | "main" if parts.is_empty() => return None,
        stem => parts.push(stem.to_string()),
    }
    Some(parts)
}

/// Every module path a file's code names through `crate::`, `super::` or
/// `self::` (groups `a::{b, c::d}` expanded), resolved against the file's
/// own module path `at` (`self` is `at`, `super` its parent: a `mod.rs`
/// has its folder's path). A file's inline test module (from its
/// `#[cfg(test)] mod`, to the end of the file) is left out: its `super` is
/// the file itself.
fn paths_named(code: &str, at: &[String]) -> Vec<Vec<String>> {
    let tests = code
        .match_indices("#[cfg(test)]")
        .map(|(p, _)| p)
        .find(|&p| code[p + 12..].trim_start().starts_with("mod "));
    let code = &code[..tests.unwrap_or(code.len())];
    let mut found = Vec::new();
    for (start, _) in code.match_indices("::") {
        let before = &code[..start];
        let head = before
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(before, |p| &before[p + 1..]);
        let prefix_start = start - head.len();
        if code[..prefix_start].ends_with("::") {
            continue;
        }
        let base = match head {
            "crate" => Vec::new(),
            "self" => at.to_vec(),
            "super" => at[..at.len().saturating_sub(1)].to_vec(),
            _ => continue,
        };
        expand(&code[start + 2..], base, &mut found);
    }
    found
}

/// The paths of `rest` (what follows `prefix::`) appended to `base`.
fn expand(rest: &str, mut base: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut rest = rest.trim_start();
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item_start = 0;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        expand(&group[item_start..j], base.clone(), out);
                        return;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand(&group[item_start..j], base.clone(), out);
                        item_start = j + 1;
                    }
                    _ => {}
                }
            }
            return;
        }
        let ident = ident_at(rest);
        if ident.is_empty() {
            break;
        }
        match ident {
            "super" => {
                base.pop();
            }
            "self" => {}
            _ => base.push(ident.to_string()),
        }
        match rest[ident.len()..].trim_start().strip_prefix("::") {
            Some(more) => rest = more.trim_start(),
            None => break,
        }
    }
    out.push(base);
}

/// The file (index into `modules`) a named path resolves to: the longest
/// module path that begins it.
fn resolve(path: &[String], modules: &[Vec<String>]) -> Option<usize> {
    (1..=path.len())
        .rev()
        .find_map(|n| modules.iter().position(|m| m[..] == path[..n]))
}

/// The circles (each a list of files) in a graph given as edges per node.
fn circles(edges: &[BTreeSet<usize>]) -> Vec<Vec<usize>> {
    // Two nodes are on one circle when each reaches the other.
    let reach: Vec<BTreeSet<usize>> = (0..edges.len())
        .map(|from| {
            let mut seen = BTreeSet::new();
            let mut stack: Vec<usize> = edges[from].iter().copied().collect();
            while let Some(n) = stack.pop() {
                if seen.insert(n) {
                    stack.extend(edges[n].iter().copied());
                }
            }
            seen
        })
        .collect();
    let mut found: Vec<Vec<usize>> = Vec::new();
    for a in 0..edges.len() {
        if found.iter().any(|c| c.contains(&a)) {
            continue;
        }
        let circle: Vec<usize> = (0..edges.len())
            .filter(|&b| {
                b == a && reach[a].contains(&a) || reach[a].contains(&b) && reach[b].contains(&a)
            })
            .collect();
        if circle.len() > 1 {
            found.push(circle);
        }
    }
    found
}

/// Inside one top-level module, the files name each other one way only. A
/// module's front (its `mod.rs`, or the `x.rs` beside an `x/` folder) and
/// the files beneath it may name each other: the front declares its
/// children and re-exports, the children take its shared types. Between
/// any other two files a circle is refused.
#[test]
fn no_import_circle_inside_a_module() {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    files.sort();
    let files: Vec<PathBuf> = files
        .into_iter()
        .filter(|f| module_path(f).is_some())
        .collect();
    let modules: Vec<Vec<String>> = files
        .iter()
        .map(|f| module_path(f).expect("kept"))
        .collect();
    let fronts: Vec<bool> = modules
        .iter()
        .map(|m| {
            modules
                .iter()
                .any(|o| o.len() > m.len() && o.starts_with(m))
        })
        .collect();
    let mut edges = vec![BTreeSet::new(); files.len()];
    for (i, file) in files.iter().enumerate() {
        let code = strip(&std::fs::read_to_string(file).expect("source file"));
        for path in paths_named(&code, &modules[i]) {
            let Some(j) = resolve(&path, &modules) else {
                continue;
            };
            let (a, b) = (&modules[i], &modules[j]);
            let related = (fronts[j] && a.starts_with(b)) || (fronts[i] && b.starts_with(a));
            if i != j && a[0] == b[0] && !related {
                edges[i].insert(j);
            }
        }
    }
    let found: Vec<String> = circles(&edges)
        .iter()
        .map(|c| {
            let names: Vec<String> = c.iter().map(|&n| modules[n].join("::")).collect();
            names.join(" <-> ")
        })
        .collect();
    assert!(
        found.is_empty(),
        "{} import circles inside a module:\n{}",
        found.len(),
        found.join("\n")
    );
}

#[test]
fn the_circle_checker_sees_what_it_must() {
    let at: Vec<String> = ["shard", "mesh"].map(String::from).to_vec();
    let got = paths_named(
        &strip("use super::{resync::{Page, serve}, Shard};\nlet x = crate::http::client::Client::new();\n#[cfg(test)]\nmod tests { use super::*; }\n"),
        &at,
    );
    let want: Vec<Vec<String>> = [
        vec!["shard", "resync", "Page"],
        vec!["shard", "resync", "serve"],
        vec!["shard", "Shard"],
        vec!["http", "client", "Client", "new"],
    ]
    .iter()
    .map(|p| p.iter().map(|s| s.to_string()).collect())
    .collect();
    assert_eq!(got, want);
    let modules: Vec<Vec<String>> = [vec!["shard"], vec!["shard", "resync"]]
        .iter()
        .map(|p| p.iter().map(|s| s.to_string()).collect())
        .collect();
    assert_eq!(resolve(&want[0], &modules), Some(1));
    assert_eq!(resolve(&want[2], &modules), Some(0));
    let edges = vec![
        BTreeSet::from([1]),
        BTreeSet::from([2]),
        BTreeSet::from([0]),
        BTreeSet::from([0]),
    ];
    assert_eq!(circles(&edges), [vec![0, 1, 2]]);
    assert!(circles(&[BTreeSet::from([1]), BTreeSet::new()]).is_empty());
}
