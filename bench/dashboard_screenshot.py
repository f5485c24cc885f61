"""Send a mixed chat workload to a running kvproxy, then screenshot its dashboard.

    python -m bench.dashboard_screenshot --url http://127.0.0.1:8000 --out docs/dashboard.png
    python -m bench.dashboard_screenshot --api-keys key-a,key-b --key ADMIN_KEY  # with API keys on

The workload gives every chart and table something to show, in about two minutes on the default
model and two CPU cores: conversations sharing a long system prompt (one miss, then hits),
the same prompt cut to a half and a quarter (shorter cached prefixes), a conversation growing
turn by turn (longer ones), an edited system prompt (a partial hit) and short one-off prompts
(misses). With ``--api-keys`` the conversations are spread over those tenants; ``--key`` is the
key the page reads ``/stats`` with (the admin key: every tenant, prompt text withheld).

Needs headless Chromium (Debian: apt-get install chromium).
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import time
from typing import Any

import httpx

from bench.client import Client
from bench.shared_prefix import QUESTIONS, SYSTEM

QUESTIONS_MORE = [*QUESTIONS, "Name one function of the last module.", "What does the second module do?"]
ONE_OFF = ["Hi!", "What is the capital of France?", "Name one sorting algorithm.", "Count to five."]


def conversations(system: str) -> list[list[list[dict[str, str]]]]:
    """Groups of chats around the system prompt ``system``, each group one tenant's: a chat is
    its list of messages."""

    def chat(system: str, question: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": system}, {"role": "user", "content": question}]

    half, quarter = system[: len(system) // 2], system[: len(system) // 4]
    edited = system[: len(system) // 2] + " (edited) " + system[len(system) // 2 :]
    turns = chat(quarter, QUESTIONS[0])
    growing = [turns]
    for question in QUESTIONS_MORE[1:]:
        turns = [*turns, {"role": "assistant", "content": "I will answer briefly."}]
        turns = [*turns, {"role": "user", "content": question}]
        growing.append(turns)
    return [
        [chat(system, q) for q in QUESTIONS_MORE] + [chat(half, q) for q in QUESTIONS],
        growing + [chat(edited, q) for q in QUESTIONS],
        [[{"role": "user", "content": q}] for q in ONE_OFF] + [chat(system, QUESTIONS[0])],
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--out", default="docs/dashboard.png")
    parser.add_argument("--api-keys", default="", help="comma-separated keys to send the traffic with")
    parser.add_argument("--key", default=None, help="the key the dashboard reads /stats with (#key=)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2, help="times the workload is sent")
    parser.add_argument(
        "--system-chars", type=int, default=None, help="cut the system prompt (a model of a short context)"
    )
    parser.add_argument(
        "--wait", type=float, default=31.0, help="seconds to wait before the screenshot (a usage sample)"
    )
    parser.add_argument("--window-size", default="1300,2500", help="browser window WIDTH,HEIGHT (pixels)")
    parser.add_argument(
        "--tenant-out", default=None, help="also screenshot the first --api-keys tenant's view to this file"
    )
    args = parser.parse_args()

    keys = [k.strip() for k in args.api_keys.split(",") if k.strip()] or ["unused"]
    clients = [Client(f"{args.url}/v1", api_key=key) for key in keys]
    print(f"{'round':>5} {'tenant':>6} {'prompt':>6} {'cached':>6} {'TTFT s':>7}")
    for round_ in range(args.rounds):
        for i, group in enumerate(conversations(SYSTEM[: args.system_chars])):
            client = clients[i % len(clients)]
            for messages in group:
                result, _ = client.chat(args.model, messages, args.max_tokens)
                print(
                    f"{round_ + 1:>5} {i % len(clients):>6} {result.prompt_tokens:>6} "
                    f"{result.cached_tokens:>6} {result.ttft_s:>7.3f}"
                )
    time.sleep(args.wait)
    views = [(args.key, args.out)]
    if args.tenant_out:
        views.append((keys[0], args.tenant_out))
    for key, out in views:
        checked = shoot(args.url, key, out, args.window_size)
        print(f"wrote {out}: {checked} figures on the page, each equal to /stats")


def chromium(*args: str) -> str:
    """Run headless Chromium with ``args``; its standard output."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser") or "chromium"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
    done = subprocess.run(
        [binary, *flags, "--virtual-time-budget=5000", "--hide-scrollbars", *args],
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout


def shoot(url: str, key: str | None, out: str, window_size: str) -> int:
    """Screenshot the dashboard as ``key`` sees it, after checking that every figure the page
    shows (its ``data-field``/``data-value`` pairs) equals ``/stats``; returns how many it shows.

    Raises:
        SystemExit: a figure differs from /stats twice in a row (not a moment's change).
    """
    page = f"{url}/dashboard" + (f"#key={key}" if key else "")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    for attempt in range(2):
        dom = chromium("--dump-dom", page)
        stats = httpx.get(f"{url}/stats", headers=headers, timeout=30).json()
        shown = dict(re.findall(r'data-field="([\w.]+)"[^>]*data-value="([^"]*)"', dom))
        differ = [
            f for f, raw in shown.items() if not same(json.loads(html.unescape(raw)), field(stats, f), f)
        ]
        if not differ:
            break
        if attempt:
            raise SystemExit(f"the page shows figures that differ from /stats: {differ}")
    chromium(f"--window-size={window_size}", f"--screenshot={out}", page)
    return len(shown)


def field(stats: dict[str, Any], path: str) -> Any:
    """The value at a dotted path of /stats (list items by index); None where it has none."""
    value: Any = stats
    for part in path.split("."):
        if isinstance(value, list):
            value = value[int(part)] if part.isdigit() and int(part) < len(value) else None
        else:
            value = value.get(part) if isinstance(value, dict) else None
    return value


def same(shown: Any, actual: Any, path: str) -> bool:
    """The page shows /stats' figure (a TTL, counting down between the two reads, to 5 s)."""
    if path.endswith(".ttl_seconds") and isinstance(shown, int) and isinstance(actual, int):
        return 0 <= shown - actual <= 5
    return bool(shown == actual)


if __name__ == "__main__":
    main()
