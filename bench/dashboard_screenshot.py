"""Send a little mixed traffic to a running kvproxy, then screenshot its dashboard.

    python -m bench.dashboard_screenshot --url http://127.0.0.1:8000 --out docs/dashboard.png

Needs headless Chromium (Debian: apt-get install chromium).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess

from bench.client import Client
from bench.shared_prefix import QUESTIONS, SYSTEM


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--out", default="docs/dashboard.png")
    args = parser.parse_args()

    client = Client(f"{args.url}/v1")
    questions = [*QUESTIONS, "What is the capital of France?", "Name one sorting algorithm."]
    for system in (SYSTEM, SYSTEM, SYSTEM[: len(SYSTEM) // 2] + " (edited) " + SYSTEM[len(SYSTEM) // 2 :]):
        for question in questions:
            messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
            client.chat(args.model, messages, 16)
    client.chat(args.model, [{"role": "user", "content": "Hi!"}], 8)
    chromium = shutil.which("chromium") or "chromium"
    subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--virtual-time-budget=5000",
            "--window-size=1200,1000",
            f"--screenshot={args.out}",
            f"{args.url}/dashboard",
        ],
        check=True,
        capture_output=True,
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
