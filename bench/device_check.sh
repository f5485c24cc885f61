#!/usr/bin/env bash
# The checks that need an accelerator, as one short run (under 5 minutes on one GPU): the tests
# marked `cuda`, then hit-vs-cold time to first token and decode speed of `kvproxy serve` on a
# randomly initialised model of the default model's shape, printed as one table.
#
#   bench/device_check.sh                # on the GPU
#   bench/device_check.sh --device cpu   # a dry run here: the cuda tests skip, a tiny model
set -euo pipefail
device=cuda
if [[ "${1:-}" == "--device" ]]; then device=$2; fi
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 -m pytest -q -p no:cacheprovider -m cuda tests/integration/engine/test_cuda.py

# Speed depends on shapes, not weights: the default model's shape (SmolLM2-135M) on a GPU, a
# tiny one for the dry run.
if [[ $device == cpu ]]; then
    shape='num_hidden_layers=2'
    tokens=256
else
    shape='hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
           num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192'
    tokens=2048
fi
python3 -c "from pathlib import Path; from tests.helpers import build_tiny_model; \
build_tiny_model(Path('$work/model'), $shape)" >/dev/null
python3 -m bench.device_bench --model "$work/model" --device "$device" --prompt-tokens "$tokens"
