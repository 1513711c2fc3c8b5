#!/usr/bin/env bash
# The default job of `make run`. Until the training job lands, it runs a short
# transport benchmark over tcp (two processes, the whole actor path: encode,
# send, receive, decode, dispatch, reply) as a demonstration; a few seconds.
set -euo pipefail
BUILD=${1:-build}
exec "$BUILD/baton" bench transport --transport tcp --iters 2000 --sizes 4K,1M,16M
