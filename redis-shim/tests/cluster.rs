//! What only a Redis Cluster shows, each test on a three-master cluster of its own (they
//! count the function calls, move a slot or stop the nodes): a batch's requests bound for
//! one master are decided in one script, whatever their slots; a request whose slot moved
//! is decided slot by slot; checks fail fast once the cluster is gone. Requests spanning
//! masters, all or nothing, are in the suite (`suite/slots.rs`), on every backend.

mod support;

use serde_json::{json, Value};
use std::time::Duration;
use support::*;

fn cluster_and_shim() -> (RedisCluster, Shim) {
    cluster_and_shim_with(TEST_REDIS_TIMEOUT_MS)
}

fn cluster_and_shim_with(redis_timeout_ms: &str) -> (RedisCluster, Shim) {
    let cluster = RedisCluster::start();
    let shim = Shim::start(
        &cluster.urls(),
        &["--redis-mode", "cluster", "--redis-timeout-ms", redis_timeout_ms],
    );
    wait_until("shim ready on the cluster", Duration::from_secs(20), || {
        get(&shim.url("/readyz"), &[]).status == 200
    });
    (cluster, shim)
}

/// Two hash tags whose slots live on different masters.
fn tags_on_different_nodes(cluster: &RedisCluster) -> (String, String) {
    let mut first = tags_on_node(cluster, 0, 1);
    let mut second = tags_on_node(cluster, 1, 1);
    (first.remove(0), second.remove(0))
}

/// `count` hash tags in distinct slots of the `node`th master.
fn tags_on_node(cluster: &RedisCluster, node: u16, count: usize) -> Vec<String> {
    let mut slots = Vec::new();
    (0..)
        .map(|i| format!("node{node}-client-{i}"))
        .filter(|tag| {
            let slot = cluster.slot(&format!("{{{tag}}}"));
            // Slots are split evenly over three masters: 0..5461, 5461..10923, 10923..16384.
            let fresh = slot / 5461 == node && !slots.contains(&slot);
            slots.push(slot);
            fresh
        })
        .take(count)
        .collect()
}

/// Scripts run on the cluster while `url` answers `body` with 200.
fn scripts_for(cluster: &RedisCluster, url: &str, body: &str) -> (u64, Value) {
    let before = cluster.scripts_run();
    let reply = post(url, &[], body);
    assert_eq!(reply.status, 200, "{reply:?}");
    (
        cluster.scripts_run() - before,
        serde_json::from_str(&reply.body).unwrap(),
    )
}

/// A batch of one request per tag, each one check of `rule` keyed on its tag.
fn batch_of(rule: &str, tags: &[String], limit: u64) -> String {
    let requests: Vec<Value> = tags
        .iter()
        .map(|tag| json!({ "checks": [check_of(&format!("{rule}:{{{tag}}}"), "token_bucket", limit, 600_000)] }))
        .collect();
    json!({ "requests": requests }).to_string()
}

/// The shim reads the cluster's map of masters on first use, in the background: until
/// then it goes slot by slot. Waits until a fresh batch over `tags` costs `scripts`.
fn wait_for_scripts(cluster: &RedisCluster, url: &str, tags: &[String], scripts: u64) {
    let mut round = 0;
    wait_until("calls grouped by master", Duration::from_secs(10), || {
        round += 1;
        scripts_for(cluster, url, &batch_of(&format!("warm-{round}"), tags, 5)).0 == scripts
    });
}

#[test]
fn a_batch_runs_one_script_per_master_whatever_the_slots_of_its_requests() {
    let (cluster, shim) = cluster_and_shim();
    let url = shim.url("/v1/check-batch");
    // Thirty clients in thirty slots, ten on each master.
    let tags: Vec<String> = (0..3).flat_map(|node| tags_on_node(&cluster, node, 10)).collect();
    wait_for_scripts(&cluster, &url, &tags, 3);
    for allowed in [true, true, false] {
        let (scripts, answer) = scripts_for(&cluster, &url, &batch_of("rule", &tags, 2));
        assert_eq!(scripts, 3, "one script per master");
        for response in answer["responses"].as_array().unwrap() {
            assert_eq!(response["decided"]["allowed"], allowed, "{answer}");
        }
    }
    // A request whose keys lie in two slots of one master: one script, all or nothing,
    // nothing to refund (slot by slot, the loose slot would be charged, then refunded).
    let loose = check_of(&format!("loose:{{{}}}", tags[0]), "token_bucket", 10, 600_000);
    let tight = check_of(&format!("tight:{{{}}}", tags[1]), "token_bucket", 1, 600_000);
    let request = json!({ "requests": [{ "checks": [loose, tight] }] }).to_string();
    for (allowed, granted) in [(true, 1), (false, 0)] {
        let (scripts, answer) = scripts_for(&cluster, &url, &request);
        assert_eq!(scripts, 1);
        let decided = &answer["responses"][0]["decided"];
        assert_eq!(decided["allowed"], allowed, "{answer}");
        assert_eq!(decided["results"][0]["granted"], granted, "{answer}");
        assert_eq!(decided["results"][0]["remaining"], 9, "{answer}");
    }
    let metrics = get(&shim.url("/metrics"), &[]).body;
    assert!(metrics.contains("rlshim_slot_refunds_total 0\n"), "{metrics}");
}

#[test]
fn a_request_whose_slot_moved_after_the_map_was_read_is_decided_slot_by_slot() {
    let (cluster, shim) = cluster_and_shim();
    let url = shim.url("/v1/check-batch");
    let tags = tags_on_node(&cluster, 0, 2);
    wait_for_scripts(&cluster, &url, &tags, 1);
    // The second client's slot (no key in it yet) moves to the second master; the shim's
    // map still puts it on the first.
    let moving = format!("rl:rule:{{{}}}", tags[1]);
    cluster.move_empty_slot(cluster.slot(&moving), 0, 1);
    for remaining in [4, 3] {
        let (_, answer) = scripts_for(&cluster, &url, &batch_of("rule", &tags, 5));
        for response in answer["responses"].as_array().unwrap() {
            assert_eq!(response["decided"]["allowed"], true, "{answer}");
            assert_eq!(
                response["decided"]["results"][0]["remaining"], remaining,
                "{answer}"
            );
        }
    }
    assert_eq!(
        redis_cli(cluster.ports[1], &["EXISTS", &moving]).as_deref(),
        Some("1")
    );
    // The map is read again: one script per master, the two clients now on two.
    wait_for_scripts(&cluster, &url, &tags, 2);
    let metrics = get(&shim.url("/metrics"), &[]).body;
    assert!(metrics.contains("rlshim_slot_refunds_total 0\n"), "{metrics}");
}

#[test]
fn a_batch_runs_one_script_per_master_and_each_request_on_its_own() {
    let (cluster, shim) = cluster_and_shim();
    let (tag_a, tag_b) = tags_on_different_nodes(&cluster);
    let client = |rule: &str, tag: &str, limit: u64| {
        check_of(&format!("{rule}:{{{tag}}}"), "fixed_window", limit, 600_000)
    };
    let batch = |rule: &str| {
        let one_client = json!({ "checks": [client(&format!("{rule}-minute"), &tag_a, 2), client(&format!("{rule}-day"), &tag_a, 10)] });
        let other_client = json!({ "checks": [client(&format!("{rule}-minute"), &tag_b, 5)] });
        // Keyed on different parts: its keys span two slots on two masters.
        let spanning = json!({ "checks": [client(&format!("{rule}-key"), &tag_a, 5), client(&format!("{rule}-ip"), &tag_b, 5)] });
        json!({ "requests": [one_client.clone(), other_client.clone(), one_client.clone(), spanning, one_client, other_client] }).to_string()
    };
    let url = shim.url("/v1/check-batch");
    // Loads the library on every master (a missing function costs a second call).
    assert_eq!(post(&url, &[], &batch("warm")).status, 200);
    let before = cluster.scripts_run();
    let reply = post(&url, &[], &batch("rule"));
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(
        cluster.scripts_run(),
        before + 4,
        "one script for client a's three requests, one for client b's two (each on its own master), one per slot of the spanning request"
    );
    let answer: Value = serde_json::from_str(&reply.body).unwrap();
    let allowed: Vec<&Value> = answer["responses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|response| &response["decided"]["allowed"])
        .collect();
    assert_eq!(allowed, [true, true, true, true, false, true], "{answer}");
    // The refused third request of client a charged neither of its rules.
    let day = &answer["responses"][4]["decided"]["results"][1];
    assert_eq!(
        (day["granted"].as_u64(), day["remaining"].as_u64()),
        (Some(0), Some(8)),
        "{answer}"
    );
}

#[test]
fn cluster_checks_fail_fast_when_the_cluster_is_gone() {
    let (mut cluster, shim) = cluster_and_shim_with("1000");
    let body = checks_body(&[check_of("k:{gone}", "token_bucket", 5, 60_000)]);
    assert_eq!(post(&shim.url("/v1/check"), &[], &body).status, 200);
    cluster.stop();
    let started = std::time::Instant::now();
    let reply = post(&shim.url("/v1/check"), &[], &body);
    assert_eq!(reply.status, 503, "{reply:?}");
    // The cluster is gone: the shim's commands fail on refused connections or after
    // its 1 s Redis timeout, a few attempts at most. A hang would wait for the client's
    // 30 s; five timeouts' worth tells the two apart on a loaded machine.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(get(&shim.url("/readyz"), &[]).status, 503);
    assert_eq!(get(&shim.url("/healthz"), &[]).status, 200);
}
