"""``kvproxy bench``: measure TTFT, latency, throughput and cache hits of reproducible workloads
against any OpenAI-compatible server."""

from __future__ import annotations

from pathlib import Path

import click
import httpx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench import client as bench_client
from bench import workloads as bench_workloads

COLUMNS = (
    "workload",
    "requests",
    "TTFT p50 s",
    "TTFT p95 s",
    "latency p50 s",
    "latency p95 s",
    "output tok/s",
    "prompt tok",
    "cached tok",
    "hit rate",
)


def _sizes(value: str) -> list[int]:
    """``--prefix-tokens``: comma-separated positive token counts."""
    try:
        sizes = [int(n) for n in value.split(",") if n.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of token counts") from None
    if not sizes or min(sizes) < 1:
        raise click.BadParameter("give at least one positive token count")
    return sizes


@click.command()
@click.option(
    "--base-url", default="http://127.0.0.1:8000/v1", show_default=True, help="Any OpenAI-compatible /v1 URL."
)
@click.option("--model", default="smollm2-135m-instruct", show_default=True)
@click.option("--api-key", default="unused", envvar="OPENAI_API_KEY", help="Bearer key [env OPENAI_API_KEY]")
@click.option(
    "--workload",
    "names",
    multiple=True,
    default=["all"],
    show_default=True,
    type=click.Choice(["all", "shared", "multiturn", "docqa", "control"]),
)
@click.option(
    "--prefix-tokens",
    default="512,1024,2048,4096",
    show_default=True,
    callback=lambda _ctx, _param, value: _sizes(value),
    help="Shared-prefix sizes, comma-separated token counts.",
)
@click.option(
    "--order", default="all", show_default=True, type=click.Choice(["all", "random", "tile", "interleave"])
)
@click.option("--concurrency", default=1, show_default=True, type=click.IntRange(1, 64))
@click.option("--max-tokens", default=16, show_default=True, type=click.IntRange(1))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--json",
    "json_path",
    default=None,
    type=click.Path(dir_okay=False, writable=True),
    help="Also write the results (every request) as JSON here.",
)
def bench(
    base_url: str,
    model: str,
    api_key: str,
    names: tuple[str, ...],
    prefix_tokens: list[int],
    order: str,
    concurrency: int,
    max_tokens: int,
    seed: int,
    json_path: str | None,
) -> None:
    """Measure TTFT, latency, throughput and cache hits of reproducible workloads."""
    if json_path is not None and not Path(json_path).resolve().parent.is_dir():
        raise click.BadParameter(f"no directory for {json_path}", param_hint="--json")
    chosen = bench_workloads.workloads(list(names), seed, prefix_tokens, order)
    client = bench_client.Client(base_url, api_key)
    summaries = []
    with Progress(console=Console(stderr=True)) as progress:
        for workload in chosen:
            task = progress.add_task(workload.name, total=sum(len(s.turns) for s in workload.sessions))
            try:
                summary = bench_client.run(
                    client,
                    model,
                    workload,
                    concurrency=concurrency,
                    max_tokens=max_tokens,
                    on_result=lambda _, t=task: progress.advance(t),  # type: ignore[misc]
                )
            except (bench_client.BenchError, httpx.HTTPError, OSError) as exc:
                raise click.ClickException(f"{workload.name}: {base_url}: {exc}") from exc
            summaries.append(summary)
    table = Table(title=f"kvproxy bench: {base_url} (concurrency {concurrency}, seed {seed})")
    for column in COLUMNS:
        table.add_column(column, justify="left" if column == "workload" else "right")
    for s in summaries:
        table.add_row(
            s.workload,
            str(s.requests),
            f"{s.ttft_p50_s:.3f}",
            f"{s.ttft_p95_s:.3f}",
            f"{s.latency_p50_s:.3f}",
            f"{s.latency_p95_s:.3f}",
            f"{s.output_tokens_per_s:.1f}",
            str(s.prompt_tokens),
            str(s.cached_tokens),
            f"{s.hit_rate:.1%}",
        )
    Console(width=max(160, Console().width)).print(table)
    if json_path:
        Path(json_path).write_text(bench_client.to_json(summaries))
