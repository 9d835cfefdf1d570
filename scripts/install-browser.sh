#!/usr/bin/env bash
# Installs Debian's headless Chromium and its chromedriver for the dashboard's browser tests.
# Idempotent: does nothing when both are already on PATH. Needs root (or passwordless sudo) to install;
# otherwise it prints what to run and exits 0, and the browser tests skip with a clear reason.
#
#   scripts/install-browser.sh          # from the Makefile's `test` target or by hand
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }

if have chromium && have chromedriver; then
    exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
elif have sudo && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
else
    echo "install-browser: chromium/chromedriver missing and not root; run:" >&2
    echo "  sudo apt-get install -y chromium chromium-driver" >&2
    exit 0
fi

if ! have apt-get; then
    echo "install-browser: no apt-get here; install chromium and chromedriver yourself" >&2
    exit 0
fi

echo "install-browser: installing chromium + chromium-driver (Debian packages)"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core >/dev/null
chromium --version
chromedriver --version
