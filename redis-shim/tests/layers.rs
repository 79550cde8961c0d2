//! The shim's layers hold: every `crate::` and `super::` path in `src/` leads to the
//! module's own folder or to a folder listed below it in `src/lib.rs`'s "Layers" list,
//! and that list names every folder of `src/`.

use std::fs;
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The layers as `lib.rs` lists them, top first: "" for the crate root, else the folder.
fn layers(lib: &str) -> Vec<String> {
    let mut layers = Vec::new();
    let mut in_list = false;
    for line in lib.lines().map_while(|line| line.strip_prefix("//!")) {
        let line = line.trim();
        if line == "## Layers" {
            in_list = true;
            continue;
        }
        if in_list && line.starts_with("## ") {
            break;
        }
        let Some((number, item)) = line.split_once(". ") else {
            continue;
        };
        if !in_list || number.parse::<usize>() != Ok(layers.len() + 1) {
            continue;
        }
        if item.starts_with("the crate root") {
            layers.push(String::new());
        } else {
            let folder = item
                .strip_prefix("[`")
                .and_then(|rest| rest.split_once('`'))
                .map(|(folder, _)| folder.to_string())
                .unwrap_or_else(|| panic!("layer {number} names no folder: {item}"));
            layers.push(folder);
        }
    }
    layers
}

/// The module path of a file under `src/` (`transport/http/check.rs` is
/// `["transport", "http", "check"]`; a `mod.rs` is its folder; `lib.rs` the root).
fn module_path(relative: &Path) -> Vec<String> {
    let mut path: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let file = path.pop().unwrap();
    let stem = file.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") {
        path.push(stem.to_string());
    }
    path
}

/// The first segment of each path a `crate::` or `super::` in `code` leads to,
/// resolved from the module `module`: `crate::{a, b::c}` leads to `a` and `b`.
fn targets(code: &str, module: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    for (start, _) in code.match_indices("crate::").chain(code.match_indices("super::")) {
        // Not part of a longer name (`redis_crate::`), nor the tail of a `super::super::`.
        let before = code[..start].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let mut rest = &code[start..];
        let mut base: Vec<String> = Vec::new();
        if let Some(after) = rest.strip_prefix("crate::") {
            rest = after;
        } else {
            base = module.to_vec();
            while let Some(after) = rest.strip_prefix("super::") {
                base.pop();
                rest = after;
            }
        }
        let firsts: Vec<String> = match rest.strip_prefix('{') {
            Some(group) => {
                let mut depth = 0;
                let end = group
                    .char_indices()
                    .find(|&(_, c)| {
                        depth += match c {
                            '{' => 1,
                            '}' => -1,
                            _ => 0,
                        };
                        depth < 0
                    })
                    .map_or(group.len(), |(i, _)| i);
                let mut items = Vec::new();
                let mut depth = 0;
                let mut item = String::new();
                for c in group[..end].chars() {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        ',' if depth == 0 => items.push(std::mem::take(&mut item)),
                        _ if depth == 0 => item.push(c),
                        _ => {}
                    }
                }
                items.push(item);
                items.iter().map(|item| first_segment(item)).collect()
            }
            None => vec![first_segment(rest)],
        };
        for first in firsts.into_iter().filter(|first| !first.is_empty()) {
            // `self` names the base module itself.
            found.push(
                base.first()
                    .cloned()
                    .unwrap_or(if first == "self" { String::new() } else { first }),
            );
        }
    }
    found
}

/// [`targets`] of a file's code, read from the module at `module`: what follows an
/// inline `mod name {` (a file's tests, at its end) is read from `module::name`.
fn imports(code: &str, module: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    let mut module = module.to_vec();
    let mut rest = code;
    while let Some((at, name)) = rest.lines().find_map(|line| {
        let name = line.trim().strip_prefix("mod ")?.strip_suffix(" {")?;
        Some((line.as_ptr() as usize - rest.as_ptr() as usize, name.to_string()))
    }) {
        found.extend(targets(&rest[..at], &module));
        module.push(name);
        rest = &rest[at + 1..];
    }
    found.extend(targets(rest, &module));
    found
}

fn first_segment(text: &str) -> String {
    text.trim()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// The layer (index into `layers`) a module whose first segment is `first` stands in.
fn layer_of(first: &str, layers: &[String]) -> usize {
    layers.iter().position(|layer| layer == first).unwrap_or(0)
}

/// Each import in `code` of the module at `relative` that runs back up a layer.
fn upward_imports(relative: &Path, code: &str, layers: &[String]) -> Vec<String> {
    let module = module_path(relative);
    let own = layer_of(module.first().map_or("", String::as_str), layers);
    let code: String = code
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    imports(&code, &module)
        .into_iter()
        .filter(|first| layer_of(first, layers) < own)
        .map(|first| {
            let layer = &layers[layer_of(&first, layers)];
            let layer = if layer.is_empty() { "the crate root" } else { layer };
            format!(
                "{} imports `{first}` from {layer}, above its own layer",
                relative.display()
            )
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn lib_lists_every_folder_of_src_as_a_layer() {
    let layers = layers(&fs::read_to_string(src().join("lib.rs")).unwrap());
    assert_eq!(
        layers.first().map(String::as_str),
        Some(""),
        "the crate root is the top layer: {layers:?}"
    );
    let mut folders: Vec<String> = fs::read_dir(src())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_dir())
        .map(|path| path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    folders.sort();
    let mut listed: Vec<String> = layers[1..].to_vec();
    listed.sort();
    assert_eq!(listed, folders, "lib.rs's layers and src/'s folders differ");
}

#[test]
fn no_import_runs_back_up_a_layer() {
    let layers = layers(&fs::read_to_string(src().join("lib.rs")).unwrap());
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut imports = 0;
    let mut upward = Vec::new();
    for path in &files {
        let relative = path.strip_prefix(src()).unwrap();
        let code = fs::read_to_string(path).unwrap();
        imports += self::imports(&code, &module_path(relative)).len();
        upward.extend(upward_imports(relative, &code, &layers));
    }
    // The scan reads the imports it checks (a parser that found none would pass).
    assert!(
        imports > 100,
        "only {imports} crate paths found in {} files",
        files.len()
    );
    assert!(
        upward.is_empty(),
        "imports that run back up a layer:\n{}",
        upward.join("\n")
    );
}

#[test]
fn an_import_back_up_a_layer_is_found() {
    let layers: Vec<String> = ["", "ops", "transport", "decide", "store"]
        .map(String::from)
        .to_vec();
    let store = Path::new("store/redis_store.rs");
    assert_eq!(
        upward_imports(store, "use crate::decide::answer::respond;", &layers).len(),
        1
    );
    assert_eq!(
        upward_imports(store, "use crate::{store::scripts, transport::Shim};", &layers).len(),
        1
    );
    assert_eq!(
        upward_imports(store, "let shim = crate::ShimConfig::default();", &layers).len(),
        1
    );
    let nested = Path::new("store/redis_store/admin_ops.rs");
    assert_eq!(
        upward_imports(nested, "use super::super::super::routes;", &layers).len(),
        1
    );
    assert!(upward_imports(
        nested,
        "use super::super::scripts::Row;\nuse super::RedisStore;",
        &layers
    )
    .is_empty());
    assert!(upward_imports(store, "// use crate::transport::Shim;", &layers).is_empty());
    let tests = "use crate::store::scripts::Row;\n#[cfg(test)]\nmod tests {\n    use super::Store;\n}";
    assert!(upward_imports(Path::new("store/mod.rs"), tests, &layers).is_empty());
    assert_eq!(
        upward_imports(Path::new("store/mod.rs"), "use super::routes;", &layers).len(),
        1
    );
    let top = Path::new("ops/admin.rs");
    assert!(upward_imports(
        top,
        "use crate::transport::{http::endpoint::error, Shim};",
        &layers
    )
    .is_empty());
}
