"""Writes the release folder scripts/dist.sh describes: OUT REGISTRY WASM SHIM."""

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"


def fail(message):
    sys.exit(f"dist: {message}")


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def version():
    with open("Cargo.toml", "rb") as file:
        return tomllib.load(file)["workspace"]["package"]["version"]


def release_notes(changelog, version):
    """The section of CHANGELOG.md headed "## VERSION ..." or "## Unreleased (VERSION)"."""
    heading = re.compile(rf"^## (?:{re.escape(version)}\b|Unreleased \({re.escape(version)}\))")
    lines, inside = [], False
    for line in changelog.splitlines():
        if line.startswith("## "):
            if inside:
                break
            inside = bool(heading.match(line))
        if inside:
            lines.append(line)
    body = "\n".join(lines[1:]).strip()
    if not body:
        fail(f"CHANGELOG.md has no section for {version} (## {version} or ## Unreleased ({version}))")
    return f"# ratelimit-wasm {version}\n\n{body}\n"


def layer(wasm):
    """plugin.wasm in a tar.gz with fixed times and owners: the same .wasm, the same digest."""
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("plugin.wasm")
        info.size, info.mode, info.mtime = len(wasm), 0o644, 0
        tar.addfile(info, io.BytesIO(wasm))
    plain = tar_bytes.getvalue()
    return plain, gzip.compress(plain, mtime=0)


def oci_layout(directory, wasm, version):
    """An OCI image layout holding one image tagged VERSION; returns its manifest digest."""
    blobs = os.path.join(directory, "blobs", "sha256")
    os.makedirs(blobs)

    def blob(data, media_type):
        digest = sha256(data)
        with open(os.path.join(blobs, digest), "wb") as file:
            file.write(data)
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}

    plain, compressed = layer(wasm)
    config = {
        "architecture": "wasm",
        "os": "wasip1",
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{sha256(plain)}"]},
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": blob(json.dumps(config, sort_keys=True).encode(), CONFIG_TYPE),
        "layers": [blob(compressed, LAYER_TYPE)],
    }
    descriptor = blob(json.dumps(manifest, sort_keys=True).encode(), MANIFEST_TYPE)
    descriptor["annotations"] = {"org.opencontainers.image.ref.name": version}
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [descriptor]}
    with open(os.path.join(directory, "index.json"), "w") as file:
        json.dump(index, file, sort_keys=True)
    with open(os.path.join(directory, "oci-layout"), "w") as file:
        json.dump({"imageLayoutVersion": "1.0.0"}, file)
    return descriptor["digest"]


def replace_once(text, old, new, file):
    if text.count(old) != 1:
        fail(f"{file}: expected one {old!r} to replace, found {text.count(old)}")
    return text.replace(old, new)


def main():
    out, registry, wasm_path, shim_path, native_path = sys.argv[1:]
    release = version()
    notes = release_notes(open("CHANGELOG.md").read(), release)
    folder = os.path.join(out, f"ratelimit-wasm-{release}")
    if os.path.exists(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)

    # A shim left from an earlier build would ship under this release's name.
    said = subprocess.run([shim_path, "--version"], capture_output=True, text=True).stdout.split()
    if said[-1:] != [release]:
        fail(f"{shim_path} --version says {' '.join(said)!r}, not {release}: run 'make build'")

    wasm = open(wasm_path, "rb").read()
    shutil.copyfile(wasm_path, os.path.join(folder, "ratelimit_wasm.wasm"))
    with open(os.path.join(folder, "ratelimit_wasm.wasm.sha256"), "w") as file:
        file.write(f"{sha256(wasm)}  ratelimit_wasm.wasm\n")
    shutil.copy2(shim_path, os.path.join(folder, "redis-shim"))
    native = open(native_path, "rb").read()
    shutil.copyfile(native_path, os.path.join(folder, "libratelimit_native.so"))
    with open(os.path.join(folder, "libratelimit_native.so.sha256"), "w") as file:
        file.write(f"{sha256(native)}  libratelimit_native.so\n")
    digest = oci_layout(os.path.join(folder, "oci"), wasm, release)

    plugin = open("deploy/istio/wasmplugin.yaml").read()
    url = re.search(r"^  url: oci://\S+$", plugin, re.MULTILINE)
    if not url:
        fail("deploy/istio/wasmplugin.yaml: no '  url: oci://...' line to pin")
    plugin = plugin.replace(url.group(0), f"  url: oci://{registry}/ratelimit-wasm/filter:{release}@{digest}")
    with open(os.path.join(folder, "wasmplugin.yaml"), "w") as file:
        file.write(plugin)

    # Envoy in compose reads the module from a file: the release's, whose sha256 is stated.
    compose = open("docker-compose.yml").read()
    mounted = os.path.relpath(os.path.join(folder, "ratelimit_wasm.wasm"))
    mounted = os.path.abspath(mounted) if mounted.startswith("..") else f"./{mounted}"
    compose = replace_once(
        compose,
        "./target/wasm32-wasip1/release/ratelimit_wasm.wasm:",
        f"{mounted}:",
        "docker-compose.yml",
    )
    header = (
        f"# ratelimit-wasm {release}: the filter is the release's ratelimit_wasm.wasm,\n"
        f"# sha256:{sha256(wasm)}, the module of oci://{registry}/ratelimit-wasm/filter:{release}@{digest}.\n"
        f"# Run from the repository root: docker compose -f {os.path.relpath(folder)}/docker-compose.yml "
        "--project-directory . up --build --wait\n"
    )
    with open(os.path.join(folder, "docker-compose.yml"), "w") as file:
        file.write(header + compose)

    with open(os.path.join(folder, "RELEASE-NOTES.md"), "w") as file:
        file.write(notes)
    print(f"dist: {folder} (filter image {digest})")


main()
