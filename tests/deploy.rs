//! The shipped deployment files, checked without Docker or Kubernetes: every YAML file
//! parses; docker-compose.yml references only files that exist; every shipped Envoy
//! configuration (compose's, and the shape Istio generates from `deploy/istio`'s
//! WasmPlugin) passes `envoy --mode validate` and runs against the real shim and Redis;
//! every one has Envoy replace a crashed VM, and Envoy does so with that setting; the
//! shim's Dockerfile builds with the Makefile's command; docs/ISTIO.md explains every
//! value the manifests hold; the suite's Envoys reach the shim with the shipped protocol.
//!
//! Container paths and hostnames are rewritten to local ones for these runs only.

mod support;

use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use support::*;

/// Where the compose file mounts the filter inside the Envoy container.
const CONTAINER_WASM: &str = "/etc/envoy/ratelimit_wasm.wasm";

fn read(relative: &str) -> String {
    fs::read_to_string(repo_root().join(relative)).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

fn compose() -> Value {
    yaml_file(&repo_root().join("docker-compose.yml"))
}

/// All `.yml`/`.yaml` files of the repository, skipping git's, build output and `.venv`.
fn yaml_files() -> Vec<PathBuf> {
    tracked_files(&["*.yml", "*.yaml"])
}

/// The repository's files matching git's `pathspecs` (a `*` matches across folders),
/// sorted: not what a run left beside them (bench/out, test runs).
fn tracked_files(pathspecs: &[&str]) -> Vec<PathBuf> {
    let listed = Command::new("git")
        .args(["ls-files", "-z", "--"])
        .args(pathspecs)
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(listed.status.success(), "git ls-files failed");
    let mut found: Vec<PathBuf> = String::from_utf8(listed.stdout)
        .unwrap()
        .split('\0')
        .filter(|name| !name.is_empty())
        .map(|name| repo_root().join(name))
        .collect();
    found.sort();
    found
}

/// `NAME := VALUE` from the Makefile.
fn make_variable(name: &str) -> String {
    read("Makefile")
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{name} :=")))
        .unwrap_or_else(|| panic!("no {name} in the Makefile"))
        .trim()
        .to_string()
}

/// Visits every object in a JSON tree.
fn visit_objects(value: &mut Value, f: &mut dyn FnMut(&mut serde_json::Map<String, Value>)) {
    match value {
        Value::Object(map) => {
            f(map);
            for child in map.values_mut() {
                visit_objects(child, f);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| visit_objects(item, f)),
        _ => {}
    }
}

/// The plugin configuration (parsed JSON) of the one wasm filter in an Envoy bootstrap.
fn plugin_config(bootstrap: &Value) -> Value {
    let mut found = Vec::new();
    let mut bootstrap = bootstrap.clone();
    visit_objects(&mut bootstrap, &mut |map| {
        if map.get("@type").and_then(Value::as_str)
            == Some("type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm")
        {
            let text = map["config"]["configuration"]["value"].as_str().unwrap();
            found.push(serde_json::from_str::<Value>(text).unwrap());
        }
    });
    assert_eq!(found.len(), 1, "one wasm filter expected");
    found.remove(0)
}

#[test]
fn every_yaml_file_in_the_repository_parses() {
    let files = yaml_files();
    let relative: Vec<String> = files
        .iter()
        .map(|p| p.strip_prefix(repo_root()).unwrap().display().to_string())
        .collect();
    for expected in [
        "docker-compose.yml",
        "envoy.yaml",
        "deploy/compose/envoy.yaml",
        "deploy/istio/wasmplugin.yaml",
        "deploy/istio/redis-shim.yaml",
        "deploy/istio/external-shim/serviceentry.yaml",
    ] {
        assert!(
            relative.iter().any(|r| r == expected),
            "{expected} not found in {relative:?}"
        );
    }
    for path in &files {
        let documents = yaml_documents(path);
        assert!(!documents.is_empty(), "{} is empty", path.display());
        for document in &documents {
            assert!(
                document.is_object(),
                "{}: a document is not a mapping",
                path.display()
            );
        }
        // Kubernetes manifests: each document names its API, kind and name.
        if path.starts_with(repo_root().join("deploy/istio")) {
            for document in &documents {
                for field in ["apiVersion", "kind"] {
                    assert!(document[field].is_string(), "{}: no {field}", path.display());
                }
                if document["kind"] != "Kustomization" {
                    assert!(
                        document["metadata"]["name"].is_string(),
                        "{}: a {} without metadata.name",
                        path.display(),
                        document["kind"]
                    );
                }
            }
        }
    }
}

#[test]
fn compose_references_only_files_that_exist() {
    let compose = compose();
    let root = repo_root();
    let wasm = make_variable("WASM");
    let mut checked = 0;
    for (name, service) in compose["services"].as_object().unwrap() {
        if let Some(build) = service.get("build") {
            let context = root.join(build["context"].as_str().unwrap());
            assert!(
                context.is_dir(),
                "{name}: build context {} missing",
                context.display()
            );
            let dockerfile = context.join(build["dockerfile"].as_str().unwrap_or("Dockerfile"));
            assert!(dockerfile.is_file(), "{name}: {} missing", dockerfile.display());
            checked += 1;
        }
        for volume in service["volumes"].as_array().into_iter().flatten() {
            let volume = volume.as_str().unwrap();
            let source = volume.split(':').next().unwrap();
            let relative = source
                .strip_prefix("./")
                .unwrap_or_else(|| panic!("{name}: mount {volume} is not a repository path"));
            if relative.starts_with("target/") {
                // Build output: only the filter `make build` (and `make compose-up`) makes.
                assert_eq!(
                    relative, wasm,
                    "{name}: mounts build output other than the filter"
                );
                wasm_path();
            } else {
                assert!(root.join(relative).is_file(), "{name}: {relative} missing");
                let ignored = Command::new("git")
                    .args(["check-ignore", "-q", relative])
                    .current_dir(&root)
                    .status()
                    .unwrap();
                assert!(!ignored.success(), "{name}: {relative} is ignored by git");
            }
            checked += 1;
        }
    }
    assert!(
        checked >= 3,
        "the shim's build and Envoy's two mounts, found {checked}"
    );
}

#[test]
fn compose_envoy_uses_the_pinned_version_and_its_mounts() {
    let compose = compose();
    let envoy = &compose["services"]["envoy"];
    let setup = read("scripts/setup.sh");
    let version = setup
        .lines()
        .find_map(|line| line.strip_prefix("ENVOY_VERSION="))
        .expect("ENVOY_VERSION in scripts/setup.sh");
    assert_eq!(
        envoy["image"],
        format!("envoyproxy/envoy:v{version}"),
        "the tested Envoy"
    );

    let mounts: Vec<(&str, &str)> = envoy["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            let parts: Vec<&str> = v.as_str().unwrap().split(':').collect();
            (parts[0], parts[1])
        })
        .collect();
    let config_target = mounts
        .iter()
        .find(|(source, _)| *source == "./deploy/compose/envoy.yaml")
        .expect("the compose Envoy config is mounted")
        .1;
    let command: Vec<&str> = envoy["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let config_arg = command.iter().position(|a| *a == "-c").map(|i| command[i + 1]);
    assert_eq!(config_arg, Some(config_target), "Envoy reads the mounted config");
    assert!(
        mounts.contains(&(&format!("./{}", make_variable("WASM")), CONTAINER_WASM)),
        "{mounts:?}"
    );
    assert!(read("deploy/compose/envoy.yaml").contains(CONTAINER_WASM));

    // The shim must listen beyond its container's loopback to be reachable.
    let shim_env = &compose["services"]["redis-shim"]["environment"];
    assert_eq!(shim_env["RLSHIM_LISTEN"], "0.0.0.0:8400");
}

#[test]
fn compose_plugin_config_is_the_demo_one() {
    let compose_envoy = yaml_file(&repo_root().join("deploy/compose/envoy.yaml"));
    let demo = yaml_file(&repo_root().join("envoy.yaml"));
    assert_eq!(plugin_config(&compose_envoy), plugin_config(&demo));
}

/// How an Envoy config reaches the shim: its cluster's protocol and connection options.
fn shim_protocol_options(bootstrap: &Value) -> Value {
    let clusters = bootstrap["static_resources"]["clusters"]
        .as_array()
        .expect("clusters");
    let shim = clusters
        .iter()
        .find(|cluster| cluster["name"] == "ratelimit_shim")
        .expect("a ratelimit_shim cluster");
    shim["typed_extension_protocol_options"].clone()
}

/// The suite's Envoys reach the shim the way the shipped configurations do (the protocol
/// is a measured choice, docs/SHIM.md): a change to one without the others fails here.
#[test]
fn the_tests_reach_the_shim_as_the_shipped_configs_do() {
    let demo = shim_protocol_options(&yaml_file(&repo_root().join("envoy.yaml")));
    let compose = shim_protocol_options(&yaml_file(&repo_root().join("deploy/compose/envoy.yaml")));
    let tests = shim_protocol_options(&envoy_config(8400, &json!({})));
    assert!(
        demo.is_object(),
        "envoy.yaml names the shim's protocol explicitly"
    );
    assert_eq!(compose, demo);
    assert_eq!(tests, demo);
}

/// Compose's Envoy config with the container's wasm path replaced by the built filter.
fn compose_envoy_config() -> Value {
    let mut config = yaml_file(&repo_root().join("deploy/compose/envoy.yaml"));
    let wasm = wasm_path().display().to_string();
    let mut replaced = 0;
    visit_objects(&mut config, &mut |map| {
        if map.get("filename").and_then(Value::as_str) == Some(CONTAINER_WASM) {
            map.insert("filename".into(), json!(wasm));
            replaced += 1;
        }
    });
    assert_eq!(replaced, 1);
    config
}

/// Every socket address moved to 127.0.0.1: listener and admin on ports Envoy picks, and
/// the shim's cluster.
fn localize(config: &mut Value, shim_port: u16) {
    config["static_resources"]["listeners"][0]["address"] = loopback(0);
    config["admin"]["address"] = loopback(0);
    let cluster = &mut config["static_resources"]["clusters"][0];
    cluster["type"] = json!("STATIC");
    cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"] =
        json!({ "address": "127.0.0.1", "port_value": shim_port });
}

fn validate(config: &Value) -> String {
    let path = scratch("validate").join("envoy.json");
    fs::write(&path, serde_json::to_vec_pretty(config).unwrap()).unwrap();
    let (ok, output) = envoy_validate(&path);
    assert!(
        ok,
        "envoy --mode validate failed for {}:\n{output}",
        path.display()
    );
    output
}

#[test]
fn compose_envoy_config_passes_envoy_validation() {
    let output = validate(&compose_envoy_config());
    assert!(output.contains("configured with 7 rule(s)"), "{output}");
}

/// A compose health check's shell command (`CMD bash -c COMMAND`).
fn health_command(service: &str) -> String {
    let test = &compose()["services"][service]["healthcheck"]["test"];
    let test: Vec<&str> = test
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    match test.as_slice() {
        ["CMD", "bash", "-c", command] | ["CMD-SHELL", command] => command.to_string(),
        other => panic!("{service}: unexpected health check {other:?}"),
    }
}

fn run_health_check(command: &str) -> bool {
    Command::new("bash")
        .args(["-c", &format!("timeout 5 bash -c {}", shell_quote(command))])
        .status()
        .unwrap()
        .success()
}

fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[test]
fn compose_stack_runs_locally_with_passing_health_checks() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let mut config = compose_envoy_config();
    localize(&mut config, shim.port);
    let envoy = Envoy::start_bootstrap(&config);

    // The health checks, pointed at the local processes' ports.
    let redis_check = health_command("redis").replace("redis-cli", &format!("redis-cli -p {}", redis.port));
    assert!(run_health_check(&redis_check), "{redis_check}");
    let shim_check = health_command("redis-shim");
    assert!(shim_check.contains("/8400"), "{shim_check}");
    assert!(run_health_check(
        &shim_check.replace("/8400", &format!("/{}", shim.port))
    ));
    assert!(
        !run_health_check(&shim_check.replace("/8400", &format!("/{}", refusing_port()))),
        "the shim's check must fail when nothing answers"
    );
    let envoy_check = health_command("envoy");
    assert!(envoy_check.contains("/9901"), "{envoy_check}");
    assert!(run_health_check(
        &envoy_check.replace("/9901", &format!("/{}", envoy.admin_port))
    ));

    // The demo rule: 10 per minute per x-api-key.
    let key = [("x-api-key", "compose-demo")];
    for i in 0..10 {
        let reply = get(&envoy.url("/"), &key);
        assert_eq!(
            reply.status,
            200,
            "request {i}: {reply:?}\n{}",
            envoy.process.log_text()
        );
        assert_eq!(reply.number("x-ratelimit-limit"), 10);
    }
    assert_eq!(get(&envoy.url("/"), &key).status, 429);
}

// ---- Istio ----

fn istio(file: &str) -> Vec<Value> {
    yaml_documents(&repo_root().join("deploy/istio").join(file))
}

fn find_kind<'a>(documents: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = documents.iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "one {kind} expected");
    found[0]
}

fn wasm_plugin() -> Value {
    find_kind(&istio("wasmplugin.yaml"), "WasmPlugin").clone()
}

/// The filter as istiod configures it from a WasmPlugin (pilot's
/// `buildWasmPluginConfigCommon`), after istio-agent has fetched the module and put a
/// local file in place of the remote URL.
fn istio_wasm_filter(plugin: &Value) -> Value {
    let spec = &plugin["spec"];
    let name = format!(
        "{}.{}",
        plugin["metadata"]["namespace"].as_str().unwrap(),
        plugin["metadata"]["name"].as_str().unwrap()
    );
    let mut env = json!({ "ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION": "1" });
    if let Some(policy) = spec["imagePullPolicy"].as_str() {
        env["ISTIO_META_WASM_IMAGE_PULL_POLICY"] = json!(policy);
    }
    let failure_policy = match spec["failStrategy"].as_str().unwrap_or("FAIL_CLOSE") {
        "FAIL_OPEN" => "FAIL_OPEN",
        "FAIL_RELOAD" => "FAIL_RELOAD",
        "FAIL_CLOSE" => "FAIL_CLOSED",
        other => panic!("unknown failStrategy {other}"),
    };
    json!({
        "name": name,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "name": name,
                "root_id": spec["pluginName"].as_str().unwrap_or(""),
                "vm_config": {
                    "runtime": "envoy.wasm.runtime.v8",
                    "code": { "local": { "filename": wasm_path() } },
                    "environment_variables": { "key_values": env }
                },
                "configuration": {
                    "@type": "type.googleapis.com/google.protobuf.StringValue",
                    "value": serde_json::to_string(&spec["pluginConfig"]).unwrap()
                },
                "failure_policy": failure_policy
            }
        }
    })
}

/// A bootstrap with Istio's filter and a cluster carrying the name Istio gives the shim's
/// Service, its endpoint on 127.0.0.1.
fn istio_bootstrap(shim_port: u16) -> Value {
    let plugin = wasm_plugin();
    let cluster = plugin["spec"]["pluginConfig"]["shim_cluster"].as_str().unwrap();
    let mut config = envoy_config(shim_port, &json!({}));
    let hcm =
        &mut config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
    hcm["http_filters"][0] = istio_wasm_filter(&plugin);
    let clusters = &mut config["static_resources"]["clusters"][0];
    clusters["name"] = json!(cluster);
    clusters["load_assignment"]["cluster_name"] = json!(cluster);
    config
}

#[test]
fn istio_wasm_plugin_shape_passes_envoy_validation() {
    let output = validate(&istio_bootstrap(refusing_port()));
    let rules = wasm_plugin()["spec"]["pluginConfig"]["rules"]
        .as_array()
        .unwrap()
        .len();
    assert!(rules >= 2, "a layered policy has several rules");
    assert!(
        output.contains(&format!("configured with {rules} rule(s)")),
        "{output}"
    );
}

#[test]
fn istio_shape_runs_every_rule_through_the_shim() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let envoy = Envoy::start_bootstrap(&istio_bootstrap(shim.port));
    let reply = get(&envoy.url("/"), &[("x-api-key", "istio-client")]);
    assert_eq!(reply.status, 200, "{reply:?}");
    // Headers come only from a shim answer: failing open would leave them out.
    assert!(
        reply.header("x-ratelimit-limit").is_some(),
        "{reply:?}\n{}",
        envoy.process.log_text()
    );
    // The login rule matches POST /login only.
    let login = post(&envoy.url("/login"), &[("x-api-key", "istio-client")], "");
    assert_eq!(login.status, 200, "{login:?}");
    let keys = redis.cli(&["--scan", "--pattern", "*"]);
    for rule in wasm_plugin()["spec"]["pluginConfig"]["rules"].as_array().unwrap() {
        let prefix = format!("rl:{}/", rule["name"].as_str().unwrap());
        assert!(
            keys.lines().any(|k| k.starts_with(&prefix)),
            "no {prefix} key in {keys}"
        );
    }
}

#[test]
fn istio_shim_cluster_is_the_one_istio_builds_for_the_service() {
    let manifests = istio("redis-shim.yaml");
    let service = find_kind(&manifests, "Service");
    let host = format!(
        "{}.{}.svc.cluster.local",
        service["metadata"]["name"].as_str().unwrap(),
        service["metadata"]["namespace"].as_str().unwrap()
    );
    let port = &service["spec"]["ports"][0];
    assert_eq!(port["appProtocol"], "http");
    let plugin = wasm_plugin();
    let config = &plugin["spec"]["pluginConfig"];
    assert_eq!(
        config["shim_cluster"],
        format!("outbound|{}||{host}", port["port"])
    );
    assert_eq!(config["shim_authority"], host);

    // The Service reaches the port the shim listens on.
    let deployment = find_kind(&manifests, "Deployment");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let container_port = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == port["targetPort"])
        .expect("the Service's targetPort names a container port");
    let listen = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "RLSHIM_LISTEN")
        .expect("RLSHIM_LISTEN is set")["value"]
        .as_str()
        .unwrap();
    assert_eq!(listen, format!("0.0.0.0:{}", container_port["containerPort"]));
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(
        deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"],
        true
    );

    // Only the gateway the plugin runs in may call the check endpoints, the batched one
    // (what the filter uses) included.
    let policy = find_kind(&manifests, "AuthorizationPolicy");
    let rule = &policy["spec"]["rules"][0];
    let principal = rule["from"][0]["source"]["principals"][0].as_str().unwrap();
    let gateway_namespace = plugin["metadata"]["namespace"].as_str().unwrap();
    assert!(
        principal.starts_with(&format!("cluster.local/ns/{gateway_namespace}/sa/")),
        "{principal}"
    );
    let paths = rule["to"][0]["operation"]["paths"].as_array().unwrap();
    for path in [
        ratelimit_wasm::wire::CHECK_PATH,
        ratelimit_wasm::wire::CHECK_BATCH_PATH,
    ] {
        assert!(paths.iter().any(|p| p == path), "{path} missing from {paths:?}");
    }

    // The external alternative: its cluster name is the one its comments give.
    let entry = find_kind(&istio("external-shim/serviceentry.yaml"), "ServiceEntry").clone();
    let cluster = format!(
        "outbound|{}||{}",
        entry["spec"]["ports"][0]["number"],
        entry["spec"]["hosts"][0].as_str().unwrap()
    );
    assert!(read("deploy/istio/external-shim/serviceentry.yaml").contains(&cluster));
    assert!(
        read("docs/ISTIO.md").contains(&cluster),
        "docs/ISTIO.md should name {cluster}"
    );
}

#[test]
fn kustomization_lists_existing_manifests() {
    let kustomization = yaml_file(&repo_root().join("deploy/istio/kustomization.yaml"));
    let resources = kustomization["resources"].as_array().unwrap();
    assert!(resources.iter().any(|r| r == "wasmplugin.yaml"));
    for resource in resources {
        let path = repo_root().join("deploy/istio").join(resource.as_str().unwrap());
        assert!(path.is_file(), "{} missing", path.display());
    }
}

#[test]
fn istio_doc_explains_every_value_of_the_manifests() {
    let doc = read("docs/ISTIO.md");
    let plugin = wasm_plugin();
    let mut names: BTreeSet<String> = BTreeSet::new();
    names.extend(plugin["spec"].as_object().unwrap().keys().cloned());
    names.extend(
        plugin["spec"]["pluginConfig"]
            .as_object()
            .unwrap()
            .keys()
            .cloned(),
    );
    names.insert("sha256".into());
    for document in istio("redis-shim.yaml") {
        if document["kind"] == "Deployment" {
            for env in document["spec"]["template"]["spec"]["containers"][0]["env"]
                .as_array()
                .unwrap()
            {
                names.insert(env["name"].as_str().unwrap().to_string());
            }
        }
    }
    for name in &names {
        assert!(
            doc.contains(&format!("`{name}`")),
            "docs/ISTIO.md does not explain `{name}`"
        );
    }
    // Every placeholder a reader must replace is named in the doc.
    for placeholder in [
        "registry.example.com",
        "redis-shim.example.internal",
        "cluster.local",
        "istio-ingressgateway-service-account",
    ] {
        assert!(
            doc.contains(placeholder),
            "docs/ISTIO.md does not mention {placeholder}"
        );
    }
    // And every file it tells the reader to use exists.
    for file in ["deploy/istio/wasm-image.Dockerfile", "redis-shim/Dockerfile"] {
        assert!(doc.contains(file), "docs/ISTIO.md does not name {file}");
        assert!(repo_root().join(file).is_file(), "{file} missing");
    }
}

// ---- Crash recovery ----

/// Envoy's `PluginConfig` (the `config` object) of the one wasm filter in a bootstrap.
fn wasm_plugin_settings(bootstrap: &Value) -> Value {
    let mut found = Vec::new();
    let mut bootstrap = bootstrap.clone();
    visit_objects(&mut bootstrap, &mut |map| {
        if map.get("@type").and_then(Value::as_str)
            == Some("type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm")
        {
            found.push(map["config"].clone());
        }
    });
    assert_eq!(found.len(), 1, "one wasm filter expected");
    found.remove(0)
}

/// What Envoy does with a VM that crashed, as each shipped configuration sets it (the
/// Istio one as istiod translates the WasmPlugin).
fn shipped_crash_policies() -> Vec<(&'static str, Value)> {
    let policy = |config: Value| {
        json!({
            "failure_policy": config["failure_policy"],
            "reload_config": config["reload_config"],
        })
    };
    vec![
        (
            "envoy.yaml",
            policy(wasm_plugin_settings(&yaml_file(&repo_root().join("envoy.yaml")))),
        ),
        (
            "deploy/compose/envoy.yaml",
            policy(wasm_plugin_settings(&yaml_file(
                &repo_root().join("deploy/compose/envoy.yaml"),
            ))),
        ),
        (
            "deploy/istio/wasmplugin.yaml",
            policy(istio_wasm_filter(&wasm_plugin())["typed_config"]["config"].clone()),
        ),
    ]
}

#[test]
fn every_shipped_config_replaces_a_crashed_vm() {
    for (file, policy) in shipped_crash_policies() {
        assert_eq!(
            policy["failure_policy"], "FAIL_RELOAD",
            "{file}: a crashed VM must be replaced (docs/ISTIO.md, \"Crash recovery\")"
        );
        // The WasmPlugin has no field for the backoff, so the gateway has Envoy's default
        // (1 s): the other configurations set the same, explicitly.
        let expected = if file.starts_with("deploy/istio") {
            Value::Null
        } else {
            json!({ "backoff": { "base_interval": "1s" } })
        };
        assert_eq!(policy["reload_config"], expected, "{file}");
    }
}

/// A proxy-wasm module, assembled here so no toolchain is needed, whose VM lets its first
/// request through and traps (`unreachable`) on its second: a fresh VM's first request
/// passes again. Just what Envoy needs to run it: the ABI version marker, `malloc`,
/// `memory` and the context callbacks; its root context accepts any configuration.
fn module_trapping_on_its_second_request() -> Vec<u8> {
    fn leb(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    fn vector(items: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        leb(items.len(), &mut out);
        items.iter().for_each(|item| out.extend(item));
        out
    }
    fn section(id: u8, payload: Vec<u8>, module: &mut Vec<u8>) {
        module.push(id);
        leb(payload.len(), module);
        module.extend(payload);
    }
    const I32: u8 = 0x7f;
    let func_type = |params: &[u8], results: &[u8]| {
        let mut out = vec![0x60];
        out.extend(vector(&params.iter().map(|p| vec![*p]).collect::<Vec<_>>()));
        out.extend(vector(&results.iter().map(|r| vec![*r]).collect::<Vec<_>>()));
        out
    };
    let types = [
        func_type(&[], &[]),
        func_type(&[I32, I32], &[]),
        func_type(&[I32, I32], &[I32]),
        func_type(&[I32, I32, I32], &[I32]),
        func_type(&[I32], &[I32]),
    ];
    // (export name, type, body without locals or the final `end`)
    let functions: [(&str, usize, &[u8]); 6] = [
        ("proxy_abi_version_0_2_1", 0, &[]),
        ("proxy_on_context_create", 1, &[]),
        ("proxy_on_vm_start", 2, &[0x41, 0x01]),  // true
        ("proxy_on_configure", 2, &[0x41, 0x01]), // true
        (
            "proxy_on_request_headers",
            3,
            &[
                0x23, 0x00, 0x41, 0x01, 0x46, // requests_seen == 1
                0x04, 0x40, 0x00, 0x0b, // if so: unreachable (the trap)
                0x23, 0x00, 0x41, 0x01, 0x6a, 0x24, 0x00, // requests_seen += 1
                0x41, 0x00, // Continue
            ],
        ),
        ("malloc", 4, &[0x41, 0x80, 0x08]), // a fixed buffer at 1024
    ];
    let mut module = b"\0asm\x01\0\0\0".to_vec();
    section(1, vector(&types), &mut module);
    let indices: Vec<Vec<u8>> = functions.iter().map(|f| vec![f.1 as u8]).collect();
    section(3, vector(&indices), &mut module);
    section(5, vector(&[vec![0x00, 0x01]]), &mut module); // one page of memory
    section(6, vector(&[vec![I32, 0x01, 0x41, 0x00, 0x0b]]), &mut module); // requests_seen
    let mut exports: Vec<Vec<u8>> = functions
        .iter()
        .enumerate()
        .map(|(index, (name, _, _))| {
            let mut export = vector(&name.bytes().map(|b| vec![b]).collect::<Vec<_>>());
            export.extend([0x00, index as u8]);
            export
        })
        .collect();
    exports.push(b"\x06memory\x02\x00".to_vec());
    section(7, vector(&exports), &mut module);
    let bodies: Vec<Vec<u8>> = functions
        .iter()
        .map(|(_, _, code)| {
            let mut body = vec![0x00]; // no locals
            body.extend(*code);
            body.push(0x0b);
            let mut sized = Vec::new();
            leb(body.len(), &mut sized);
            sized.extend(body);
            sized
        })
        .collect();
    section(10, vector(&bodies), &mut module);
    module
}

#[test]
fn the_shipped_crash_policy_gives_a_crashed_vm_a_fresh_one() {
    let policies = shipped_crash_policies();
    let (_, policy) = &policies[0];
    let dir = scratch("crash");
    let module = dir.join("traps-on-second-request.wasm");
    fs::write(&module, module_trapping_on_its_second_request()).unwrap();
    let mut config = envoy_config(refusing_port(), &json!({}));
    config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        ["http_filters"][0] = json!({
        "name": "envoy.filters.http.wasm",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "name": "ratelimit",
                "root_id": "ratelimit",
                "vm_config": {
                    "runtime": "envoy.wasm.runtime.v8",
                    "code": { "local": { "filename": module } }
                },
                "failure_policy": policy["failure_policy"],
                "reload_config": policy["reload_config"]
            }
        }
    });
    let envoy = Envoy::start_bootstrap(&config);
    let reloads = || envoy.stat("wasm.ratelimit.vm_reload_success");
    let client = agent();

    // Each worker's VM traps on its second request: with two workers, one has by the third.
    let statuses: Vec<u16> = (0..3)
        .map(|_| get_with(&client, &envoy.url("/"), &[]).status)
        .collect();
    assert_eq!(statuses[0], 200, "{statuses:?}");
    assert!(
        statuses.contains(&503),
        "no VM crashed: {statuses:?}\n{}",
        envoy.process.log_text()
    );
    assert_eq!(reloads(), 0);

    // Requests go on; the one for which Envoy replaces the crashed VM is decided by the
    // fresh VM (its first request: 200). Until then that worker answers 503.
    let mut decided_by_fresh_vm = None;
    wait_until("a fresh VM for the crashed one", Duration::from_secs(60), || {
        let status = get_with(&client, &envoy.url("/"), &[]).status;
        if reloads() == 0 {
            return false;
        }
        decided_by_fresh_vm = Some(status);
        true
    });
    assert_eq!(decided_by_fresh_vm, Some(200), "{}", envoy.process.log_text());
    assert!(envoy
        .process
        .log_text()
        .contains("proxy_on_request_headers failed"));
}

// ---- The shim's container image ----

/// The arguments of the first `cargo build` in `text`, up to the end of its command.
fn cargo_build_args(text: &str) -> Vec<String> {
    let start = text.find("cargo build").expect("a cargo build command") + "cargo build".len();
    let line = text[start..].lines().next().unwrap_or("");
    line.split_whitespace()
        .take_while(|word| !["&&", "\\", ";"].contains(word) && !word.starts_with('@'))
        .map(str::to_string)
        .collect()
}

/// Flags that change how cargo talks, not what it builds.
fn build_affecting(args: Vec<String>) -> BTreeSet<String> {
    args.into_iter()
        .filter(|a| !["--quiet", "-q", "--locked", "--verbose", "-v"].contains(&a.as_str()))
        .collect()
}

#[test]
fn dockerfile_builds_the_shim_with_the_makefiles_command() {
    let dockerfile = read("redis-shim/Dockerfile");
    let makefile = read("Makefile");
    let shim_recipe = &makefile[makefile.find("\nshim:").expect("a shim target")..];
    let make_args = build_affecting(cargo_build_args(shim_recipe));
    let instructions: String = dockerfile
        .lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let docker_args = build_affecting(cargo_build_args(&instructions));
    assert!(
        make_args.contains("--profile") && make_args.contains("shim"),
        "`make shim` builds with the shim's profile: {make_args:?}"
    );
    assert_eq!(
        docker_args, make_args,
        "the Dockerfile's cargo build differs from `make shim`"
    );

    // Nothing else changes the profile: no flags from the environment.
    for variable in [
        "RUSTFLAGS",
        "CARGO_PROFILE",
        "CARGO_BUILD",
        "CARGO_ENCODED_RUSTFLAGS",
    ] {
        assert!(!dockerfile.contains(variable), "the Dockerfile sets {variable}");
        assert!(!makefile.contains(variable), "the Makefile sets {variable}");
    }
    // The binary it installs is the one `make build` produces.
    assert!(
        dockerfile.contains(&make_variable("SHIM")),
        "the Dockerfile takes another binary"
    );
}

#[test]
fn dockerfile_copies_what_the_shim_is_built_from_and_runs_unprivileged() {
    let dockerfile = read("redis-shim/Dockerfile");
    let copied: Vec<String> = dockerfile
        .lines()
        .filter_map(|line| line.strip_prefix("COPY "))
        .filter(|line| !line.starts_with("--from"))
        .flat_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            words[..words.len() - 1]
                .iter()
                .map(|w| w.to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    // The manifest (with the shim's profile) and the lockfile, then the sources of every
    // crate the shim is built from, and no more: not the filter's (nor proxy-wasm).
    for needed in ["Cargo.toml", "Cargo.lock", "redis-shim"] {
        assert!(
            copied.iter().any(|c| c == needed),
            "the Dockerfile does not copy {needed}"
        );
    }
    let tree = Command::new("cargo")
        .args([
            "tree",
            "-p",
            "redis-shim",
            "-e",
            "normal,build",
            "--prefix",
            "none",
        ])
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(tree.status.success());
    let tree = String::from_utf8(tree.stdout).unwrap();
    for absent in ["ratelimit-wasm ", "proxy-wasm "] {
        assert!(!tree.contains(absent), "the shim depends on {absent}:\n{tree}");
    }
    let root = repo_root().display().to_string();
    let built_from: BTreeSet<String> = tree
        .lines()
        .filter_map(|line| {
            line.split_once(&format!("({root}/"))?
                .1
                .split(')')
                .next()
                .map(str::to_string)
        })
        .collect();
    assert!(
        built_from.contains("rules") && built_from.contains("wire"),
        "{built_from:?}"
    );
    for crate_dir in &built_from {
        assert!(
            copied.contains(crate_dir),
            "{crate_dir}, which the shim is built from, is not copied"
        );
    }
    // Cargo loads every member's manifest: the filter's sources are a stand-in.
    assert!(
        !copied.iter().any(|c| c == "src"),
        "the Dockerfile copies the filter's sources"
    );
    assert!(dockerfile.contains("RUN mkdir src && touch src/lib.rs"));
    // Files compiled in with include_str!/include_bytes! lie inside what is copied.
    let mut included = 0;
    for path in tracked_files(&["rules/src/*.rs", "wire/src/*.rs", "redis-shim/src/*.rs"]) {
        let text = fs::read_to_string(&path).unwrap_or_default();
        for (i, _) in text.match_indices("include_") {
            let rest = &text[i..];
            if !(rest.starts_with("include_str!(\"") || rest.starts_with("include_bytes!(\"")) {
                continue;
            }
            let quoted = rest.split('"').nth(1).unwrap();
            let target = path.parent().unwrap().join(quoted);
            let target = fs::canonicalize(&target).unwrap_or(target);
            let relative = target
                .strip_prefix(fs::canonicalize(repo_root()).unwrap())
                .unwrap();
            let first = relative
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy();
            assert!(
                copied.iter().any(|c| *c == first),
                "{} is not copied",
                relative.display()
            );
            included += 1;
        }
    }
    // The shim's Lua library, at least, is compiled in: a walk that found none is broken.
    assert!(included > 0, "no include_str! found below the crates' sources");
    // .dockerignore keeps build output out and copied files in.
    let ignored: Vec<String> = read(".dockerignore")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect();
    assert!(ignored.iter().any(|l| l == "target"), "{ignored:?}");
    for path in &copied {
        assert!(!ignored.contains(path), ".dockerignore drops {path}");
    }

    // The final stage runs as a numeric, non-root user, on the builder's Debian release
    // (the binary links against its glibc).
    let last_stage = &dockerfile[dockerfile.rfind("\nFROM ").unwrap()..];
    let user = last_stage
        .lines()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("a USER in the final stage");
    let uid: u32 = user.split(':').next().unwrap().parse().expect("a numeric USER");
    assert_ne!(uid, 0);
    assert!(last_stage.contains("bookworm") && dockerfile.contains("slim-bookworm AS build"));
    assert!(last_stage.contains("RLSHIM_LISTEN=0.0.0.0:8400"));

    // The Rust it pins is at least the workspace's rust-version.
    let pinned = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("ARG RUST_VERSION="))
        .expect("ARG RUST_VERSION");
    let minimum = read("Cargo.toml")
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .unwrap()
        .trim_matches('"')
        .to_string();
    let version = |v: &str| -> Vec<u32> { v.split('.').map(|n| n.parse().unwrap()).collect() };
    assert!(
        version(pinned) >= version(&minimum),
        "Rust {pinned} < rust-version {minimum}"
    );
}
