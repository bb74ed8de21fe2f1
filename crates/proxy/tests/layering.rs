//! The module layering of `weir` that lib.rs states, checked on the source:
//! each top-level module may name (`crate::x`) only modules of a lower layer.
//! A grep, not a build step: it fails when a lower layer imports a higher one.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Top-level modules by layer, lowest first. A module may use those of
/// lower layers only (its own layer's neighbours neither).
const LAYERS: &[&[&str]] = &[
    &["protocol", "params", "signal", "ratelog", "span", "verbosity"],
    &["wire", "config"],
    &["tls"],
    &["auth"],
    &["server"],
    &["pool", "cancel_keys"],
    &["state"],
    &["client"],
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

/// The top-level modules named as `crate::x` in the code (not the comments)
/// of `module`'s files.
fn uses(module: &str) -> BTreeSet<String> {
    let mut files = Vec::new();
    rust_files(&src().join(module), &mut files);
    rust_files(&src().join(format!("{module}.rs")), &mut files);
    assert!(!files.is_empty(), "no source for module {module}");
    let mut used = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (i, _) in line.match_indices("crate::") {
                let name: String = line[i + 7..].chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
                if !name.is_empty() && name != module {
                    used.insert(name);
                }
            }
        }
    }
    used
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
    for (a, b) in [("client", "admin"), ("client", "app"), ("admin", "app"), ("state", "client")] {
        assert!(!uses(a).contains(b), "{a} uses {b}: the circle is back");
    }
}
