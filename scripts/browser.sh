#!/usr/bin/env bash
# Installs Debian's `chromium` for the browser tests (tests/integration/gateway/test_browser.py)
# when /usr/bin/chromium is missing. Quiet, and never fatal: without Chromium those tests are
# skipped with a message saying so. Playwright drives this system Chromium through
# `executable_path`; `playwright install` (a download from outside the package registries) is
# never used. (On Ubuntu the apt package is only a snap shim; install Chromium another way there.)
set -u

CHROMIUM=/usr/bin/chromium
say() { echo "browser.sh: $*" >&2; }

if [ -x "$CHROMIUM" ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    say "no apt-get on this machine; browser tests will be skipped (install Chromium as $CHROMIUM to run them)"
    exit 0
fi
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then
        SUDO=(sudo -n)
    else
        say "not root and no password-less sudo; browser tests will be skipped (apt-get install chromium to run them)"
        exit 0
    fi
fi
say "installing Debian's chromium for the browser tests (once)..."
export DEBIAN_FRONTEND=noninteractive
if "${SUDO[@]}" apt-get update -qq >/dev/null 2>&1 \
    && "${SUDO[@]}" apt-get install -y -qq chromium >/dev/null 2>&1 \
    && [ -x "$CHROMIUM" ]; then
    say "installed: $("$CHROMIUM" --version 2>/dev/null || echo chromium)"
else
    say "could not install chromium; browser tests will be skipped"
fi
exit 0
