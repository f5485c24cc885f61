"""One run of every benchmark target, written to ``docs/benchmarks.md``.

Starts `kvproxy serve` processes (and, when given, llama-cpp-python's server) on the same model,
measures them one after the other on this machine, and writes the targets and tables:
``bench.engine_targets`` (kvproxy against llama.cpp, the formats, concurrency, the promise
sweep) and ``bench.cache_targets`` (cache on against ``--no-cache``).

    python -m bench.side_by_side --llama-python VENV/bin/python --gguf SmolLM2-135M-Instruct.Q4_1.gguf
    python -m bench.side_by_side --quick        # smaller prefixes, no llama.cpp, a few minutes
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

from bench.cache_targets import measure_cache
from bench.engine_targets import measure_engine
from bench.report import write_report
from bench.servers import running, serve

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="prefixes of 512 and 1024 tokens; no engine targets"
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--llama-python", default=None, help="python of a virtualenv with llama-cpp-python[server]"
    )
    parser.add_argument("--gguf", default=None, help="the GGUF file llama.cpp serves")
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="kvproxy-bench-"))
    prefix = f"kvpbench-{random.getrandbits(32):08x}:"
    llama = (args.llama_python, Path(args.gguf)) if args.llama_python and args.gguf else None
    engine = None if args.quick else measure_engine(work, prefix, llama)
    urls = {"cache": "http://127.0.0.1:8601", "no-cache": "http://127.0.0.1:8602"}
    with (
        running(serve(8601, work / "blobs", prefix)),
        running(serve(8602, work / "blobs-off", prefix + "off:", "--no-cache")),
    ):
        sizes = [512, 1024] if args.quick else [512, 1024, 2048, 4096]
        cache = measure_cache(urls, work, prefix, args.redis_url, sizes)
    write_report(Path(args.out), cache, engine)
    print(Path(args.out).read_text())


if __name__ == "__main__":
    main()
