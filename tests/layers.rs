//! The filter's two host-facing folders keep their order: each file of `src/host/` and
//! `src/dispatch/` imports, from its own folder, only the modules listed below it in the
//! folder's `mod.rs` ("In order, each importing only from those below it"), and that list
//! names every module of the folder. Unit tests (`tests.rs`) may use anything.

use std::fs;
use std::path::Path;

/// The modules `mod.rs` lists, top first.
fn listed(module_doc: &str) -> Vec<String> {
    module_doc
        .lines()
        .filter_map(|line| line.strip_prefix("//! "))
        .filter_map(|item| {
            let (number, rest) = item.split_once(". ")?;
            number.parse::<usize>().ok()?;
            let name = rest.trim_start_matches("[`").trim_start_matches('`');
            Some(name.split('`').next()?.to_string())
        })
        .collect()
}

/// The sibling modules a file's code (comments left out) names: `super::NAME`, or
/// `crate::FOLDER::NAME`.
fn siblings_used(code: &str, folder: &str) -> Vec<String> {
    let prefixes = ["super::".to_string(), format!("crate::{folder}::")];
    let mut used = Vec::new();
    for line in code.lines().filter(|line| !line.trim_start().starts_with("//")) {
        for prefix in &prefixes {
            for (at, _) in line.match_indices(prefix.as_str()) {
                let rest = &line[at + prefix.len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    used.push(name);
                }
            }
        }
    }
    used
}

/// Every violation in `src/<folder>`: a module not listed, or one naming a module
/// listed above it (or itself through its folder).
fn violations(folder: &str) -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(folder);
    let order = listed(&fs::read_to_string(dir.join("mod.rs")).unwrap());
    assert!(order.len() >= 4, "src/{folder}/mod.rs lists {order:?}");
    let mut found = Vec::new();
    for entry in fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let Some(name) = path.file_stem().map(|s| s.to_string_lossy().into_owned()) else {
            continue;
        };
        if path.extension().is_none_or(|ext| ext != "rs") || name == "mod" {
            continue;
        }
        let Some(rank) = order.iter().position(|listed| *listed == name) else {
            found.push(format!("src/{folder}/{name}.rs is not in mod.rs's list"));
            continue;
        };
        let code = fs::read_to_string(&path).unwrap();
        for used in siblings_used(&code, folder) {
            match order.iter().position(|listed| *listed == used) {
                Some(used_rank) if used_rank > rank => {}
                Some(_) => found.push(format!("{name} imports {used}, which is not below it")),
                // `super::*` in a unit test, or a name that is no module.
                None => {}
            }
        }
    }
    found
}

#[test]
fn the_host_layer_imports_only_downwards() {
    assert_eq!(violations("host"), Vec::<String>::new());
}

#[test]
fn the_dispatch_folder_imports_only_downwards() {
    assert_eq!(violations("dispatch"), Vec::<String>::new());
}

#[test]
fn an_upward_import_is_found() {
    let code = "use super::rounds::CallAnswer;\n// use super::steps::x; (a comment)\nuse crate::dispatch::host::Host;";
    assert_eq!(siblings_used(code, "dispatch"), vec!["rounds", "host"]);
    let doc = "//! 1. [`root`]: a\n//! 2. `fake`: b\n//! 10. [`x`]: c\n//! not 3. a list";
    assert_eq!(listed(doc), vec!["root", "fake", "x"]);
}
