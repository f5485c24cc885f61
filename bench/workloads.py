"""Reproducible prefix-caching workloads.

Workloads are built from text that ships with Python (module docstrings), from a seed, so the
same command sends the same prompts anywhere. Each workload is a list of *sessions*; a session's
turns run in order (a multi-turn chat needs the previous answer); ``bench.client`` sends them.
"""

from __future__ import annotations

import inspect
import json
import random
import textwrap
from dataclasses import dataclass

CHARS_PER_TOKEN = 4  # NOTE: only to size prompts; reported token counts come from usage
CORPUS_MODULES = (
    "argparse",
    "difflib",
    "subprocess",
    "heapq",
    "json",
    "collections",
    "functools",
    "itertools",
    "logging",
    "pathlib",
    "re",
    "typing",
    "unittest",
    "asyncio",
    "csv",
    "datetime",
    "sqlite3",
    "email",
    "textwrap",
    "string",
    "decimal",
    "fractions",
    "statistics",
    "random",
    "shutil",
)
QUESTIONS = (
    "Summarize the text above in one sentence.",
    "What is the main purpose described above?",
    "Name one function or class mentioned above.",
    "What would a beginner find hardest here?",
    "Give a one-line example of using this.",
    "Which detail above is most surprising?",
    "List two keywords from the text.",
    "What problem does this solve?",
)
ORDERS = ("random", "tile", "interleave")


def corpus() -> list[str]:
    """Paragraphs of the docstrings of standard-library modules and their public members."""
    import importlib
    import warnings

    paragraphs: list[str] = []
    for name in CORPUS_MODULES:
        module = importlib.import_module(name)
        docs = [inspect.getdoc(module) or ""]
        with warnings.catch_warnings():  # some public members are deprecated aliases
            warnings.simplefilter("ignore", DeprecationWarning)
            members = [getattr(module, a) for a in sorted(dir(module)) if not a.startswith("_")]
            docs += [inspect.getdoc(m) or "" for m in members]
        for doc in docs:
            paragraphs += [p.strip() for p in doc.split("\n\n") if len(p.strip()) > 80]
    return list(dict.fromkeys(paragraphs))  # deduplicated, order kept


def text(rng: random.Random, tokens: int, paragraphs: list[str]) -> str:
    """About ``tokens`` tokens of prose: consecutive paragraphs from a random starting point."""
    start, out = rng.randrange(len(paragraphs)), list[str]()
    while sum(len(p) for p in out) < tokens * CHARS_PER_TOKEN:
        out.append(paragraphs[(start + len(out)) % len(paragraphs)])
    return "\n\n".join(out)[: tokens * CHARS_PER_TOKEN]


@dataclass
class Session:
    """Turns sent in order; with ``chat`` each turn extends the conversation with the last answer."""

    system: str
    turns: list[str]
    chat: bool = False


@dataclass
class Workload:
    name: str
    sessions: list[Session]


def shared_prefix(seed: int, prefix_tokens: int, questions: int = 4) -> Workload:
    """One system prompt of ``prefix_tokens`` tokens, short distinct questions."""
    rng, paragraphs = random.Random(seed), corpus()
    system = text(rng, prefix_tokens, paragraphs)
    asked = rng.sample(QUESTIONS, min(questions, len(QUESTIONS)))
    return Workload(f"shared-prefix-{prefix_tokens}", [Session(system, [q]) for q in asked])


def multi_turn(seed: int, users: int = 2, rounds: int = 3, system_tokens: int = 256) -> Workload:
    """``users`` conversations of ``rounds`` rounds; each prompt = the history + a new question."""
    rng, paragraphs = random.Random(seed), corpus()
    return Workload(
        f"multi-turn-{users}x{rounds}",
        [
            Session(text(rng, system_tokens, paragraphs), rng.sample(QUESTIONS, rounds), chat=True)
            for _ in range(users)
        ],
    )


def document_qa(
    seed: int, docs: int = 3, questions: int = 2, doc_tokens: int = 1024, order: str = "tile"
) -> Workload:
    """``docs`` documents, ``questions`` each, in ``random``, ``tile`` (A B C A B C) or
    ``interleave`` (A A B B C C) order."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}")
    rng, paragraphs = random.Random(seed), corpus()
    documents = [text(rng, doc_tokens, paragraphs) for _ in range(docs)]
    asked = [rng.sample(QUESTIONS, questions) for _ in range(docs)]
    pairs = [(d, q) for q in range(questions) for d in range(docs)]  # tile
    if order == "interleave":
        pairs = [(d, q) for d in range(docs) for q in range(questions)]
    elif order == "random":
        rng.shuffle(pairs)
    return Workload(
        f"doc-qa-{docs}x{questions}-{order}", [Session(documents[d], [asked[d][q]]) for d, q in pairs]
    )


def zero_reuse(seed: int, requests: int = 4, prompt_tokens: int = 1024) -> Workload:
    """A control: every prompt is unique from its first token (nothing to reuse)."""
    rng, paragraphs = random.Random(seed), corpus()
    sessions = [
        Session(f"[{rng.getrandbits(64):016x}] " + text(rng, prompt_tokens, paragraphs), [QUESTIONS[0]])
        for _ in range(requests)
    ]
    return Workload("zero-reuse", sessions)


def workloads(names: list[str], seed: int, prefix_tokens: list[int], order: str) -> list[Workload]:
    """The named workloads (``shared``, ``multiturn``, ``docqa``, ``control``; ``all``)."""
    chosen = ["shared", "multiturn", "docqa", "control"] if "all" in names else names
    out: list[Workload] = []
    for name in chosen:
        if name == "shared":
            out += [shared_prefix(seed, n) for n in prefix_tokens]
        elif name == "multiturn":
            out.append(multi_turn(seed))
        elif name == "docqa":
            out += [document_qa(seed, order=o) for o in (ORDERS if order == "all" else (order,))]
        elif name == "control":
            out.append(zero_reuse(seed))
        else:
            raise ValueError(f"unknown workload {name!r}")
    return out


Messages = list[dict[str, str]]


def _user(content: str) -> Messages:
    return [{"role": "user", "content": content}]


def copy_heavy(seed: int = 0) -> dict[str, list[str | Messages]]:
    """Three prompts per kind, for ``bench.speculation`` (see its docstring): chat messages for prose; for the
    copy-heavy kinds, raw completion prompts that start the copy (a 135M model asked in a chat to
    quote or echo mostly does something else), so the answer is the copy a larger model writes."""
    rng, paragraphs = random.Random(seed), corpus()
    docs = [text(rng, 250, paragraphs) for _ in range(3)]
    sources = [inspect.getsource(f)[:1400] for f in (textwrap.dedent, textwrap.indent, json.dumps)]
    listings = [
        "\n".join(
            f"-rw-r--r-- 1 dev dev {rng.randrange(200, 90000):>6} Nov {rng.randrange(1, 30):>2} 10:{i:02d} "
            f"{rng.choice(['src', 'lib', 'test'])}/{rng.choice(['cache', 'index', 'store', 'route'])}_{i}.py"
            for i in range(20)
        )
        for _ in range(3)
    ]

    def start(copied: str) -> str:
        return copied[: copied.find(" ", 40) + 1]

    return {
        "prose": [
            _user("Write a long story about a lighthouse keeper who finds a strange map."),
            _user("Explain in detail how a bicycle stays upright, for a curious ten-year-old."),
            _user("Write a warm letter to a friend describing a week spent hiking in the mountains."),
        ],
        "rag-quote": [
            f"Document:\n{doc}\n\nQuestion: what does the document say, word for word?\n"
            f'Answer: The document says: "{start(doc)}'
            for doc in docs
        ],
        "code-edit": [
            f"```python\n{src}```\n\nThe same code with `text` renamed to `source`:\n\n```python\n"
            f"{start(src.replace('text', 'source'))}"
            for src in sources
        ],
        "tool-args": [
            f"Text:\n{doc[:700]}\n\nA call of the tool save_note with the text above:\n"
            f'{{"name": "save_note", "arguments": {{"text": "{start(doc)}'
            for doc in docs
        ],
        "agent-echo": [
            f"$ ls -l src lib test\n{listing}\n$ git stash && ls -l src lib test\n{start(listing)}"
            for listing in listings
        ],
    }
