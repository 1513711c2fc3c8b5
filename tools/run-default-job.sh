#!/usr/bin/env bash
# The default job of `make run`. Until the training job lands, it runs the
# transport benchmark as a demonstration of the actor path.
set -euo pipefail
BUILD=${1:-build}
exec "$BUILD/baton" bench transport --transport tcp
