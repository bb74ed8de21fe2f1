//! The module layering of `weir` that lib.rs states, checked on the source:
//! each top-level module may name (`crate::x`, `crate::{x, ..}`, or a
//! `super::` path up to the crate root) only modules of a lower layer.
//! A scan of the source, not a build step: it fails when a lower layer
//! imports a higher one.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Top-level modules by layer, lowest first. A module may use those of
/// lower layers only (its own layer's neighbours neither).
const LAYERS: &[&[&str]] = &[
    &["protocol", "params", "signal", "ratelog", "span", "verbosity", "timer"],
    &["wire", "config"],
    &["tls"],
    &["auth"],
    &["server"],
    &["pool", "cancel_keys"],
    &["state"],
    &["login"],
    &["client", "replication"],
    &["admin"],
    &["app"],
    // Test hooks for the fuzz targets (hidden), and the binary's parts.
    &["fuzzing", "cli"],
];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            rust_files(&entry.unwrap().path(), out);
        }
    } else if path.is_file() && path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_owned());
    }
}

/// The top-level modules named in the code (not the comments or string
/// literals) of `module`'s files: as `crate::x`, in a group
/// `crate::{x, y::z}`, or through `super::` paths that climb to the crate
/// root (`super::super::x` from `src/m/file.rs`, `super::x` from
/// `src/m/mod.rs`), inline `mod name { ... }` blocks counted.
fn uses(module: &str) -> BTreeSet<String> {
    let mut files = Vec::new();
    rust_files(&src().join(module), &mut files);
    rust_files(&src().join(format!("{module}.rs")), &mut files);
    assert!(!files.is_empty(), "no source for module {module}");
    let mut used = BTreeSet::new();
    for file in files {
        let text = code(&std::fs::read_to_string(&file).unwrap());
        for name in named_modules(&text, &module_path(&file)) {
            if name != module {
                used.insert(name);
            }
        }
    }
    used
}

/// A file's module path below the crate root: `src/client/session.rs` is
/// `[client, session]`, `src/client/mod.rs` is `[client]`.
fn module_path(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src()).unwrap().with_extension("");
    let mut path: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
    if path.last().is_some_and(|l| l == "mod") {
        path.pop();
    }
    path
}

/// `text` with comments, string literals and char literals blanked (newlines
/// kept), so that neither a path in a comment nor a `'{'` counts.
fn code(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, span: &[char]| {
        out.extend(span.iter().map(|&c| if c == '\n' { '\n' } else { ' ' }));
    };
    let mut i = 0;
    while i < chars.len() {
        let rest = &chars[i..];
        let end = if rest.starts_with(&['/', '/']) {
            i + rest.iter().position(|&c| c == '\n').unwrap_or(rest.len())
        } else if rest.starts_with(&['/', '*']) {
            let mut depth = 0;
            let mut j = i;
            loop {
                if chars[j..].starts_with(&['/', '*']) {
                    depth += 1;
                    j += 2;
                } else if chars[j..].starts_with(&['*', '/']) {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break j;
                    }
                } else {
                    j += 1;
                }
            }
        } else if let Some(hashes) = raw_string_start(rest).filter(|_| i == 0 || !is_ident(chars[i - 1])) {
            let open = i + rest.iter().position(|&c| c == '"').unwrap() + 1;
            let close: Vec<char> = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            open + chars[open..].windows(close.len()).position(|w| w == close.as_slice()).unwrap() + close.len()
        } else if rest[0] == '"' {
            let mut j = i + 1;
            while chars[j] != '"' {
                j += if chars[j] == '\\' { 2 } else { 1 };
            }
            j + 1
        } else if rest[0] == '\'' && rest.get(1) == Some(&'\\') {
            i + 3 + rest[3..].iter().position(|&c| c == '\'').unwrap() + 1
        } else if rest[0] == '\'' && rest.get(2) == Some(&'\'') {
            i + 3
        } else {
            out.push(rest[0]);
            i += 1;
            continue;
        };
        blank(&mut out, &chars[i..end]);
        i = end;
    }
    out
}

/// The number of `#` of a raw string literal starting here (`r"`, `r#"`,
/// `br##"`...).
fn raw_string_start(rest: &[char]) -> Option<usize> {
    let after_b = if rest.first() == Some(&'b') { &rest[1..] } else { rest };
    if after_b.first() != Some(&'r') {
        return None;
    }
    let hashes = after_b[1..].iter().take_while(|&&c| c == '#').count();
    (after_b.get(1 + hashes) == Some(&'"')).then_some(hashes)
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The identifier starting at `chars[i]`, and the index after it.
fn ident(chars: &[char], mut i: usize) -> (String, usize) {
    while chars.get(i).is_some_and(|c| c.is_whitespace()) {
        i += 1;
    }
    let start = i;
    while chars.get(i).is_some_and(|&c| is_ident(c)) {
        i += 1;
    }
    (chars[start..i].iter().collect(), i)
}

/// The first segment of each item of the group `{a, b::c, d::{e}}` whose
/// `{` is at `chars[open]`.
fn group_heads(chars: &[char], open: usize) -> Vec<String> {
    let mut heads = Vec::new();
    let (mut depth, mut i, mut at_item) = (0, open, true);
    loop {
        match chars[i] {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return heads;
                }
            }
            ',' if depth == 1 => at_item = true,
            c if depth == 1 && at_item && is_ident(c) => {
                let (name, next) = ident(chars, i);
                heads.push(name);
                at_item = false;
                i = next;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
}

/// Top-level modules that `text` (blanked by `code`, from the file whose
/// module path is `file_path`) names through `crate::` or a `super::` chain
/// that reaches the crate root. Only lower-case names: modules, not the
/// items lib.rs re-exports.
fn named_modules(text: &str, file_path: &[String]) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut names = Vec::new();
    // Inline `mod name {` blocks open at this point: (name, brace depth).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '{' {
            depth += 1;
        } else if c == '}' {
            depth -= 1;
            if inline.last().is_some_and(|(_, d)| *d == depth) {
                inline.pop();
            }
        }
        if !is_ident(c) || (i > 0 && is_ident(chars[i - 1])) {
            i += 1;
            continue;
        }
        let (word, mut next) = ident(&chars, i);
        if word == "mod" {
            let (name, after) = ident(&chars, next);
            let (_, brace) = ident(&chars, after);
            if !name.is_empty() && chars.get(brace) == Some(&'{') {
                inline.push((name, depth));
            }
        } else if word == "crate" || word == "super" {
            let mut climbs = 0;
            let mut at_root = word == "crate";
            let mut word = word;
            while chars[next..].starts_with(&[':', ':']) {
                if word == "super" {
                    climbs += 1;
                }
                let (following, after) = ident(&chars, next + 2);
                if following != "super" {
                    break;
                }
                (word, next) = (following, after);
            }
            let depth_of_module = file_path.len() + inline.len();
            at_root |= climbs >= depth_of_module && climbs > 0;
            if at_root && chars[next..].starts_with(&[':', ':']) {
                let mut j = next + 2;
                while chars.get(j).is_some_and(|c| c.is_whitespace()) {
                    j += 1;
                }
                if chars.get(j) == Some(&'{') {
                    names.extend(group_heads(&chars, j));
                } else {
                    names.push(ident(&chars, j).0);
                }
            }
        }
        i = next.max(i + 1);
    }
    names.retain(|n| n.starts_with(|c: char| c.is_ascii_lowercase()) && n != "self" && n != "super");
    names
}

#[test]
fn every_module_is_in_a_layer() {
    for entry in std::fs::read_dir(src()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if name == "lib" || name == "main" {
            continue;
        }
        assert!(layer(&name).is_some(), "module {name} is in no layer: add it to LAYERS");
    }
}

#[test]
fn modules_use_only_lower_layers() {
    let mut wrong = Vec::new();
    for module in LAYERS.iter().flat_map(|l| l.iter()) {
        let own = layer(module).unwrap();
        for used in uses(module) {
            match layer(&used) {
                Some(l) if l < own => {}
                _ => wrong.push(format!("{module} uses crate::{used}")),
            }
        }
    }
    assert!(wrong.is_empty(), "imports against the layering: {wrong:?}");
}

#[test]
fn the_named_rules_hold() {
    assert!(uses("protocol").is_empty(), "protocol uses nothing: {:?}", uses("protocol"));
    let auth = uses("auth");
    for higher in ["server", "pool", "state", "app", "client"] {
        assert!(!auth.contains(higher), "auth uses {higher}");
    }
    for (a, b) in [("client", "admin"), ("client", "app"), ("admin", "app"), ("state", "client"), ("admin", "client")] {
        assert!(!uses(a).contains(b), "{a} uses {b}: the circle is back");
    }
}

/// The scan itself: the forms a `crate::x` grep misses are seen, and what
/// stays inside a module, or sits in a comment or a literal, is not.
#[test]
fn the_scan_sees_groups_and_paths_up_to_the_root() {
    let names = |text: &str, file: &[&str]| {
        let file: Vec<String> = file.iter().map(|s| s.to_string()).collect();
        named_modules(&code(text), &file)
    };
    assert_eq!(names("use crate::{app, pool::Lease};", &["state"]), ["app", "pool"]);
    assert_eq!(names("use crate::{\n    admin::X,\n    server::{a, b},\n};", &["client", "x"]), ["admin", "server"]);
    assert_eq!(names("let c = '{'; use crate::app;", &["pool"]), ["app"], "a char literal brace");
    assert_eq!(names("let e = '\\''; use crate::app;", &["pool"]), ["app"], "an escaped char literal");
    assert_eq!(names("fn f<'a>(x: &'a str) { crate::app::f() }", &["pool"]), ["app"], "lifetimes");
    assert_eq!(names("use super::super::app::X;", &["client", "session"]), ["app"]);
    assert_eq!(names("use super::state::X;", &["client"]), ["state"], "super from a mod.rs");
    assert!(names("use super::X; use super::super::Y;", &["client", "prepared", "sql"]).is_empty());
    assert!(names("use super::login::X;", &["client", "session"]).is_empty(), "a sibling");
    let inline = "mod tests {\n    use super::super::PoolKey;\n}\nuse super::super::app::Y;";
    assert_eq!(names(inline, &["pool", "state"]), ["app"], "an inline module adds a level, and ends");
    assert!(names("// crate::app\n/* crate::{admin} */ let s = \"crate::app\"; let r = r#\"crate::app\"#;", &["pool"])
        .is_empty());
    assert!(names("pub(crate) fn f() {} pub(super) fn g() {}", &["pool", "x"]).is_empty());
}
