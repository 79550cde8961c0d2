//! Loading `--rls-config` whole, as the shim does at start (before anything listens) and
//! at each reload (`transport::grpc::reload`): [`load`] reads every file and returns every
//! file's error, each naming its file and the field's path; [`describe`] makes them one
//! message; [`snapshot`] is what the files hold, to see that they changed.

use super::{config, filter_rule};
use std::path::PathBuf;

/// The files the rate-limit service is configured from: `--rls-config` (a file or a
/// directory) and `--rls-filter-config`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigFiles {
    pub config_path: PathBuf,
    pub filter_config_path: Option<PathBuf>,
    /// `--rls-merge-domains`: a domain in several files is merged, not refused.
    pub merge_domains: bool,
}

/// `--rls-config`, with `--rls-filter-config` for the `filter_rule`s it names, or every
/// error found in them, each naming its file. Not async: the filter's configuration is
/// not `Send` and is dropped once the limits are linked.
pub fn load(options: &ConfigFiles) -> Result<config::RlsConfig, Vec<String>> {
    let filter = match &options.filter_config_path {
        Some(path) => Some(
            filter_rule::load_filter_config(path).map_err(|e| vec![format!("--rls-filter-config: {e}")])?,
        ),
        None => None,
    };
    filter_rule::load(&options.config_path, filter.as_ref(), options.merge_domains)
}

/// The errors of [`load`] as one message: `--rls-config: ` and the one error, or how many
/// and each on its own line.
pub fn describe(errors: &[String]) -> String {
    match errors {
        [one] if one.starts_with("--rls-filter-config") => one.clone(),
        [one] => format!("--rls-config: {one}"),
        many => format!("--rls-config: {} errors:\n  {}", many.len(), many.join("\n  ")),
    }
}

/// What the configuration's files held when read ([`snapshot`]).
pub type Snapshot = Vec<(PathBuf, Result<Vec<u8>, String>)>;

/// What the configuration's files hold now: each file's path and contents (or why it
/// could not be read), the filter's configuration last.
pub fn snapshot(options: &ConfigFiles) -> Snapshot {
    let mut files = match config::config_files(&options.config_path) {
        Ok(files) => files,
        Err(e) => return vec![(options.config_path.clone(), Err(e))],
    };
    files.extend(options.filter_config_path.clone());
    files
        .into_iter()
        .map(|file| {
            let read = std::fs::read(&file).map_err(|e| e.to_string());
            (file, read)
        })
        .collect()
}

/// Refuses a `--rls-config` the shim cannot run, with every error of every file
/// ([`describe`]): the binary checks this before it binds any listener.
pub fn check(options: &ConfigFiles) -> Result<(), String> {
    load(options).map(drop).map_err(|errors| describe(&errors))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(dir: &std::path::Path) -> ConfigFiles {
        ConfigFiles {
            config_path: dir.to_path_buf(),
            filter_config_path: None,
            merge_domains: false,
        }
    }

    #[test]
    fn every_file_is_read_and_each_bad_one_named() {
        let dir = std::env::temp_dir().join(format!("rls-loading-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("a.yaml"),
            "domain: a\ndescriptors: [{ key: k, metadata: [1] }]",
        )
        .unwrap();
        std::fs::write(dir.join("b.yml"), "domain: b\ndescriptors: [{ key: k }]").unwrap();
        std::fs::write(dir.join("c.yaml"), "domain: b\n").unwrap();
        std::fs::write(
            dir.join("d.yaml"),
            "domain: d\ndescriptors: [{ key: k, share_threshold: true }]",
        )
        .unwrap();
        std::fs::write(dir.join("notes.txt"), "not a configuration").unwrap();
        let errors = load(&options(&dir)).unwrap_err();
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(
            errors[0].contains("a.yaml: descriptors[0].metadata"),
            "{errors:?}"
        );
        assert!(
            errors[1].contains("c.yaml: domain: \"b\" is already configured"),
            "{errors:?}"
        );
        assert!(
            errors[2].contains("d.yaml: descriptors[0].share_threshold"),
            "{errors:?}"
        );
        let message = describe(&errors);
        assert!(message.starts_with("--rls-config: 3 errors:\n  "), "{message}");
        assert_eq!(message.lines().count(), 4, "{message}");
        assert!(check(&options(&dir)).is_err());

        let before = snapshot(&options(&dir));
        for bad in ["a.yaml", "c.yaml", "d.yaml"] {
            std::fs::remove_file(dir.join(bad)).unwrap();
        }
        assert!(check(&options(&dir)).is_ok());
        assert_ne!(snapshot(&options(&dir)), before);
        assert_eq!(snapshot(&options(&dir)), snapshot(&options(&dir)));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn one_error_is_one_line() {
        assert_eq!(
            describe(&["x.yaml: domain: why".into()]),
            "--rls-config: x.yaml: domain: why"
        );
    }
}
