//! `make dist` (scripts/dist.sh) run into a temporary folder and read back: the filter and
//! its checksum, the shim, the OCI image layout of the filter (every blob against its
//! digest and size, the media types Istio's image fetcher reads; and read by skopeo, a
//! tool we did not write), the WasmPlugin and compose file pinned to the image's digest,
//! and the release notes from CHANGELOG.md. Needs the built .wasm and shim (`make build`).

use serde_json::Value;
use sha2::{Digest, Sha256};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const VERSION: &str = env!("CARGO_PKG_VERSION");
const REGISTRY: &str = "registry.test:5000";

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn hex_sha256(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

fn json(path: &Path) -> Value {
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Reads the blob a descriptor names, checking it against the descriptor's digest and size.
fn blob(layout: &Path, descriptor: &Value, media_type: &str) -> Vec<u8> {
    assert_eq!(descriptor["mediaType"], media_type, "{descriptor}");
    let digest = descriptor["digest"].as_str().unwrap();
    let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
    let data = fs::read(layout.join("blobs/sha256").join(hex)).unwrap();
    assert_eq!(
        hex_sha256(&data),
        hex,
        "blob {digest}: content does not match its name"
    );
    assert_eq!(
        descriptor["size"].as_u64(),
        Some(data.len() as u64),
        "blob {digest}: size"
    );
    data
}

/// CHANGELOG.md's section for `version`, without its heading.
fn changelog_section(version: &str) -> String {
    let changelog = fs::read_to_string(repo_root().join("CHANGELOG.md")).unwrap();
    let headings = [format!("## {version}"), format!("## Unreleased ({version})")];
    let mut lines = Vec::new();
    let mut inside = false;
    for line in changelog.lines() {
        if line.starts_with("## ") {
            if inside {
                break;
            }
            inside = headings
                .iter()
                .any(|heading| line == heading || line.starts_with(&format!("{heading} ")));
            continue;
        }
        if inside {
            lines.push(line);
        }
    }
    lines.join("\n").trim().to_string()
}

fn yaml(path: &Path) -> serde_yaml::Value {
    serde_yaml::from_str(&fs::read_to_string(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn a_release_folder_holds_the_pinned_filter_image_the_shim_and_its_notes() {
    let root = repo_root();
    let wasm_path = root.join("target/wasm32-wasip1/release/ratelimit_wasm.wasm");
    let shim_path = root.join("target/shim/redis-shim");
    let native_path = root.join("target/shim/libratelimit_native.so");
    assert!(
        wasm_path.exists() && shim_path.exists() && native_path.exists(),
        "run `make build` and `make native` first: the release packs the built filters and shim"
    );
    let out = std::env::temp_dir().join(format!("ratelimit-dist-{}", std::process::id()));
    let _ = fs::remove_dir_all(&out);
    let run = Command::new("bash")
        .arg("scripts/dist.sh")
        .arg(&out)
        .env("REGISTRY", REGISTRY)
        .current_dir(&root)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "scripts/dist.sh: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let folder = out.join(format!("ratelimit-wasm-{VERSION}"));

    // The filter, and its checksum in sha256sum's format.
    let wasm = fs::read(folder.join("ratelimit_wasm.wasm")).unwrap();
    assert_eq!(wasm, fs::read(&wasm_path).unwrap());
    assert_eq!(
        fs::read_to_string(folder.join("ratelimit_wasm.wasm.sha256")).unwrap(),
        format!("{}  ratelimit_wasm.wasm\n", hex_sha256(&wasm))
    );

    // The dynamic module, and its checksum.
    let native = fs::read(folder.join("libratelimit_native.so")).unwrap();
    assert_eq!(native, fs::read(&native_path).unwrap());
    assert_eq!(
        fs::read_to_string(folder.join("libratelimit_native.so.sha256")).unwrap(),
        format!("{}  libratelimit_native.so\n", hex_sha256(&native))
    );

    // The shim, which says its version.
    let shim = Command::new(folder.join("redis-shim"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&shim.stdout).contains(VERSION),
        "redis-shim --version: {}",
        String::from_utf8_lossy(&shim.stdout)
    );

    // The OCI image layout: one image tagged VERSION, in the layout Istio reads.
    let layout = folder.join("oci");
    assert_eq!(json(&layout.join("oci-layout"))["imageLayoutVersion"], "1.0.0");
    let index = json(&layout.join("index.json"));
    assert_eq!(index["schemaVersion"], 2);
    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 1, "{index}");
    assert_eq!(
        manifests[0]["annotations"]["org.opencontainers.image.ref.name"],
        VERSION
    );
    let manifest_bytes = blob(
        &layout,
        &manifests[0],
        "application/vnd.oci.image.manifest.v1+json",
    );
    let digest = manifests[0]["digest"].as_str().unwrap().to_string();
    let manifest: Value = serde_json::from_slice(&manifest_bytes).unwrap();
    assert_eq!(manifest["schemaVersion"], 2);
    assert_eq!(
        manifest["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    let config: Value = serde_json::from_slice(&blob(
        &layout,
        &manifest["config"],
        "application/vnd.oci.image.config.v1+json",
    ))
    .unwrap();
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1, "{manifest}");
    let layer = blob(&layout, &layers[0], "application/vnd.oci.image.layer.v1.tar+gzip");
    // Istio unpacks plugin.wasm from the layer: it must be the release's .wasm, and the
    // config's diff_id the digest of the uncompressed tar.
    let layer_path = out.join("layer.tar.gz");
    fs::write(&layer_path, &layer).unwrap();
    let unpacked = Command::new("python3")
        .arg("-c")
        .arg(
            "import gzip, hashlib, sys, tarfile, io\n\
             plain = gzip.decompress(open(sys.argv[1], 'rb').read())\n\
             names = tarfile.open(fileobj=io.BytesIO(plain)).getnames()\n\
             wasm = tarfile.open(fileobj=io.BytesIO(plain)).extractfile('plugin.wasm').read()\n\
             print(hashlib.sha256(plain).hexdigest(), hashlib.sha256(wasm).hexdigest(), ','.join(names))",
        )
        .arg(&layer_path)
        .output()
        .unwrap();
    assert!(
        unpacked.status.success(),
        "reading the layer: {}",
        String::from_utf8_lossy(&unpacked.stderr)
    );
    let unpacked = String::from_utf8(unpacked.stdout).unwrap();
    let fields: Vec<&str> = unpacked.split_whitespace().collect();
    assert_eq!(
        fields.get(1).copied(),
        Some(hex_sha256(&wasm).as_str()),
        "plugin.wasm in the layer"
    );
    assert_eq!(fields.get(2).copied(), Some("plugin.wasm"), "the layer's files");
    assert_eq!(
        config["rootfs"]["diff_ids"][0],
        format!("sha256:{}", fields[0]),
        "{config}"
    );

    // skopeo reads the layout and finds the same manifest under the tag.
    let skopeo = Command::new("skopeo")
        .args(["inspect", "--raw"])
        .arg(format!("oci:{}:{VERSION}", layout.display()))
        .output()
        .unwrap();
    assert!(
        skopeo.status.success(),
        "skopeo inspect: {}",
        String::from_utf8_lossy(&skopeo.stderr)
    );
    assert_eq!(skopeo.stdout, manifest_bytes, "skopeo's manifest differs");

    // The WasmPlugin pinned to the image's digest, the rest as in deploy/istio/.
    let pinned_url = format!("oci://{REGISTRY}/ratelimit-wasm/filter:{VERSION}@{digest}");
    let mut plugin = yaml(&folder.join("wasmplugin.yaml"));
    assert_eq!(plugin["spec"]["url"].as_str(), Some(pinned_url.as_str()));
    let mut original = yaml(&root.join("deploy/istio/wasmplugin.yaml"));
    plugin["spec"]["url"] = serde_yaml::Value::Null;
    original["spec"]["url"] = serde_yaml::Value::Null;
    assert_eq!(plugin, original, "the rendered WasmPlugin differs beyond its url");

    // The compose file mounts the release's .wasm and names its digests.
    let compose_text = fs::read_to_string(folder.join("docker-compose.yml")).unwrap();
    assert!(compose_text.contains(&pinned_url), "{compose_text}");
    assert!(compose_text.contains(&hex_sha256(&wasm)));
    let compose = yaml(&folder.join("docker-compose.yml"));
    let volumes: Vec<&str> = compose["services"]["envoy"]["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|volume| volume.as_str())
        .collect();
    let mounted = format!(
        "{}:/etc/envoy/ratelimit_wasm.wasm:ro",
        folder.join("ratelimit_wasm.wasm").display()
    );
    assert!(volumes.contains(&mounted.as_str()), "{volumes:?}");

    // The release notes: CHANGELOG.md's section for this version.
    let notes = fs::read_to_string(folder.join("RELEASE-NOTES.md")).unwrap();
    let section = changelog_section(VERSION);
    assert!(!section.is_empty(), "CHANGELOG.md has no section for {VERSION}");
    assert_eq!(notes, format!("# ratelimit-wasm {VERSION}\n\n{section}\n"));

    fs::remove_dir_all(&out).unwrap();
}
