//! `--rls-config` refused at start with every error: a directory of two bad files (one
//! with two bad descriptors) and a good one is refused naming both files and each
//! field, by `redis_shim::run`
//! and by the binary, which says so before it logs that it listens.

mod support;

use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use support::*;

/// A directory of three files: `a-quota.yaml` (a switch that is not a boolean), `b-good.yaml`, and
/// `c-unit.yaml` (a unit it does not know, two levels down, and a count that is not a
/// number in the next descriptor).
fn two_bad_files_and_a_good_one() -> PathBuf {
    let dir = scratch("rls-config").join("config");
    fs::create_dir_all(&dir).unwrap();
    fs::write(
        dir.join("a-quota.yaml"),
        "domain: one\ndescriptors:\n  - key: api_key\n    quota_mode: sometimes\n    rate_limit: { unit: day, requests_per_unit: 3 }\n",
    )
    .unwrap();
    fs::write(
        dir.join("b-good.yaml"),
        "domain: two\ndescriptors:\n  - key: api_key\n    rate_limit: { unit: day, requests_per_unit: 3 }\n",
    )
    .unwrap();
    fs::write(
        dir.join("c-unit.yaml"),
        "domain: three\ndescriptors:\n  - key: tenant\n    descriptors:\n      - key: user\n        rate_limit: { unit: fortnight, requests_per_unit: 3 }\n\
         \x20 - key: region\n    rate_limit: { unit: hour, requests_per_unit: many }\n",
    )
    .unwrap();
    dir
}

fn assert_names_both(refused: &str) {
    assert!(refused.contains("3 errors"), "{refused}");
    assert!(
        refused.contains("a-quota.yaml: descriptors[0].quota_mode: must be true or false"),
        "{refused}"
    );
    assert!(
        refused.contains("c-unit.yaml: descriptors[0].descriptors[0].rate_limit.unit"),
        "{refused}"
    );
    assert!(
        refused.contains("c-unit.yaml: descriptors[1].rate_limit.requests_per_unit"),
        "{refused}"
    );
    assert!(!refused.contains("b-good.yaml"), "{refused}");
}

#[test]
fn every_bad_file_is_named_with_its_field_when_run_refuses() {
    let dir = two_bad_files_and_a_good_one();
    let refused = Shim::refusal(&[
        "--grpc-listen",
        "127.0.0.1:0",
        "--rls-config",
        dir.to_str().unwrap(),
    ]);
    assert_names_both(&refused);
}

#[test]
fn the_binary_refuses_every_bad_file_before_it_listens() {
    let dir = two_bad_files_and_a_good_one();
    let mut process = Process::spawn(
        Command::new(shim_path()).args([
            "--listen",
            "127.0.0.1:0",
            "--redis-url",
            "redis://127.0.0.1:1",
            "--grpc-listen",
            "127.0.0.1:0",
            "--rls-config",
            dir.to_str().unwrap(),
        ]),
        scratch("rls-config-binary").join("shim.log"),
    );
    let status = process
        .wait_exit(Duration::from_secs(20))
        .expect("the shim refuses to start");
    let log = process.log_text();
    assert!(!status.success(), "{log}");
    assert_names_both(&log);
    assert!(
        !log.contains("listening"),
        "nothing listens before the refusal:\n{log}"
    );
}

/// `tests/rls-upstream/` of the repository: limits in envoyproxy/ratelimit's format using
/// each of its features, one domain in two files.
fn upstream_format_limits() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/rls-upstream")
}

#[test]
fn limits_using_every_upstream_feature_load_merged_and_are_refused_unmerged() {
    use redis_shim::decide::rls::loading::{check, load, ConfigFiles};
    let files = |merge_domains| ConfigFiles {
        config_path: upstream_format_limits(),
        filter_config_path: None,
        merge_domains,
    };
    let config = load(&files(true)).unwrap_or_else(|errors| panic!("{errors:?}"));
    let edge = &config.domains["edge"];
    assert!(edge.children.contains_key("path_/api/*/items"), "the first file");
    assert!(edge.children.contains_key("service_svc-*"), "the second file");
    assert!(edge.children["file_files/*"].share_threshold);
    let limits = config.limits();
    assert!(limits
        .iter()
        .any(|limit| limit.quota_mode && limit.metadata.is_some()));
    let refused = check(&files(false)).unwrap_err();
    assert!(refused.contains("edge-services.yaml: domain"), "{refused}");
}
