"""Settings of ``kvproxy serve`` (``Settings``), and ``ServerSettings``, which it shares with
``kvproxy route`` (``proxy.router.settings``). Environment variables: ``KVPROXY_<FIELD>``; CLI flags:
``--<field>``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit
from urllib.request import url2pathname

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from engine.model.chat_template import read_chat_template
from engine.model.fetch import ModelError
from engine.model.formats import DtypeChoice, WeightsChoice
from proxy.env_names import PREFIX, unknown_variables, warn_once
from proxy.setting_values import Bytes, key_file
from store.block_format import BlockFormat
from store.index.embedded.files import EMBEDDED_URL
from store.index.redis.connect import check_url, redact_url
from store.index.redis.faults import RedisPlace
from store.index.redis.schemes import SCHEMES


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "kvproxy"


class ServerSettings(BaseSettings):
    """What both commands are told: where to listen, the Redis, keys and request bounds."""

    # NOTE: no NaN or infinity: a float setting that is not a number is refused as such
    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="ignore", allow_inf_nan=False)
    command: ClassVar[str] = "kvproxy"
    """The command these settings are of, as the warnings about unknown variables name it."""
    serves: ClassVar[bool] = True
    """Whether that command is a server that ``api_keys`` guards (``proxy.env_names.CLIENT_KEY``)."""

    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(8000, ge=1, le=65535, description="Port to listen on.")
    chat_template: Path | None = Field(
        None,
        description="A Jinja chat template file that renders every chat in place of the tokenizer's own.",
    )
    cache_dir: Path = Field(
        default_factory=default_cache_dir,
        description="Where converted models and, by default, the blobs and the embedded index live "
        "(default: ~/.cache/kvproxy).",
    )
    redis_url: str = Field(
        EMBEDDED_URL,
        description="Redis holding the block index: redis://, rediss:// (TLS), unix://, "
        "redis+cluster://HOST:PORT[,HOST:PORT...] or redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB] "
        "(Redis >= 7); default embedded://: a Valkey server of kvproxy's own on a unix socket in "
        "CACHE_DIR/index, kept there and shared by this host's kvproxy processes (give a Redis URL once "
        "replicas on several hosts share one index); memory:// keeps it in this process (one process "
        "alone, forgotten at restart).",
    )
    key_prefix: str = Field("kvp:", description="Prefix of every Redis key the server writes.")
    admin_key: str | None = Field(
        None,
        description="Bearer key of the operator: the /v1/cache/* admin routes (and, once any key is "
        "set, /metrics) need it; the key itself or a file holding it.",
    )
    api_keys: str | None = Field(
        None,
        description="Require Bearer keys on /v1: comma-separated `key` or `key=tenant`, or a file of "
        "one per line. Keys naming the same tenant share its cache; others never share.",
    )
    max_body_bytes: Bytes = Field(
        4 * 1024 * 1024, gt=0, description="Largest request body accepted, in bytes."
    )
    header_timeout: float = Field(
        10.0,
        gt=0,
        description="Seconds a client has to send its request line and headers, and at most between "
        "two chunks of its body; then the connection is closed.",
    )
    redis_timeout: float = Field(0.25, gt=0, description="Seconds before a Redis operation fails.")
    redis_retry: float = Field(
        5.0, gt=0, description="Seconds to serve uncached after a Redis failure before trying again."
    )

    @model_validator(mode="before")
    @classmethod
    def _warn_unknown_variables(cls, data: Any) -> Any:
        """A misspelt ``KVPROXY_*`` variable is ignored (``extra="ignore"``), but never without a
        word: before the fields are validated, so a required setting missing for a typo gets its
        hint too."""
        given = data if isinstance(data, dict) else {}
        for message in unknown_variables(cls.command, cls.model_fields, os.environ, given, serves=cls.serves):
            warn_once(message)
        return data

    @field_validator("admin_key")
    @classmethod
    def _key_or_file(cls, value: str | None) -> str | None:
        """The key, read from the file it names when it names one (``key_file``); an empty key is
        no key."""
        if value is not None and (path := key_file(value, "--admin-key")) is not None:
            value = path.read_text().strip()
        return value or None

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, url: str) -> str:
        if url in ("", EMBEDDED_URL):
            return EMBEDDED_URL  # NOTE: an empty KVPROXY_REDIS_URL is the default, as no variable
        if url.startswith(EMBEDDED_URL):
            raise ValueError(f"{EMBEDDED_URL} takes nothing after it: the index lives in CACHE_DIR/index")
        if url.partition("://")[0] not in (*SCHEMES, "memory"):
            kinds = ", ".join(s + "://" for s in (*SCHEMES, "memory"))
            raise ValueError(f"the scheme must be one of {kinds} or {EMBEDDED_URL}")
        check_url(url)  # NOTE: a RedisURLError is a ValueError: pydantic reports it as this field's
        return url

    @field_validator("chat_template")
    @classmethod
    def _template_file(cls, path: Path | None) -> Path | None:
        """``--chat-template``: a file that exists and parses as a Jinja template, or a ValueError
        naming the file and the fault (the start stops)."""
        if path is not None:
            try:
                read_chat_template(path)
            except ModelError as exc:
                raise ValueError(str(exc)) from None
        return path

    @property
    def chat_template_text(self) -> str | None:
        """The text of ``--chat-template``, or None (the tokenizer's own template)."""
        return None if self.chat_template is None else read_chat_template(self.chat_template)


class Settings(ServerSettings):
    """Everything ``kvproxy serve`` can be told; read once at start-up by the CLI or the app factory."""

    command: ClassVar[str] = "kvproxy serve"

    allow_anonymous_admin: bool = Field(
        False,
        description="Serve the /v1/cache/* admin routes (export, import, clear, gc, stats) to clients "
        "without a key when neither --admin-key nor --api-keys is set: only on a trusted, single-user "
        "machine (an import writes K/V every tenant is served).",
    )

    model: str = Field(
        "smollm2-135m-instruct",
        description="Known model name, Hugging Face checkpoint directory, .gguf file or hub id.",
    )
    chat_template: Path | None = Field(
        None,
        description="A Jinja chat template file that renders every chat for the model, in place of the "
        "template its tokenizer has (or lacks), as vLLM's and llama.cpp's --chat-template.",
    )
    served_model_name: str | None = Field(
        None,
        description="Names requests may use for the model, comma-separated; the first is the one "
        "listed first (default: the model's own name).",
    )
    blob_dir: Path | None = Field(None, description="Block blob directory (default: CACHE_DIR/blobs).")
    blob_url: str | None = Field(
        None,
        description="Where block blobs live: file:///path (as --blob-dir) or s3://bucket/prefix (endpoint "
        "and credentials from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...; needs --max-cache-bytes).",
    )
    blob_disk_cache: Path | None = Field(
        None,
        description="A local directory keeping copies of the blobs an s3:// --blob-url reads and writes, "
        "so a hit (also after a restart) reads the disk, not the bucket.",
    )
    blob_disk_cache_bytes: Bytes = Field(
        10 * 2**30, gt=0, description="Byte budget of --blob-disk-cache; the least recently read go first."
    )
    ttl: int = Field(3600, gt=0, description="Seconds a block stays cached after its last hit.")
    max_ttl: int = Field(
        86400, gt=0, description="Longest TTL granted to a request's prompt_cache_retention, in seconds."
    )
    client_ttl: Literal["floor", "exact"] = Field(
        "floor",
        description="What a request's own TTL (Anthropic cache_control ttl, OpenAI prompt_cache_retention) "
        "does: floor: lengthens retention, never shortens it below --ttl; exact: blocks expire at the TTL "
        "the client asked, as on the hosted API.",
    )
    keep_client_metadata: bool = Field(
        False,
        description="Render known client metadata (Claude Code's x-anthropic-billing-header system block) "
        "into the prompt as sent, instead of leaving it out.",
    )
    max_cache_bytes: Bytes | None = Field(
        None, gt=0, description="Byte budget of the blob store (default: half the free disk at start)."
    )
    max_pinned_bytes: Bytes = Field(
        2**30,
        ge=0,
        description="Budget of named caches' pinned blocks, apart from --max-cache-bytes, which never "
        "evicts them (0: no named caches).",
    )
    gc_interval: float = Field(30.0, gt=0, description="Seconds between garbage collections.")
    gc_grace: float = Field(60.0, ge=0, description="Seconds an unindexed blob is kept before collection.")
    responses_ttl: int = Field(
        30 * 86_400,
        gt=0,
        description="Seconds a stored response (/v1/responses, for previous_response_id) is kept after "
        "it was created (OpenAI keeps them 30 days).",
    )
    responses_max_bytes: Bytes = Field(
        256 * 2**20, gt=0, description="Byte budget of the stored responses together; the oldest go first."
    )
    tenant_share: float = Field(
        0.25,
        gt=0,
        le=1,
        description="Fraction of each budget tenants share (--max-cache-bytes, --responses-max-bytes, "
        "--max-pinned-bytes) that one tenant may hold, with --api-keys (without them the one tenant "
        "holds it all): a tenant past its share evicts its own oldest blocks and responses first and "
        "gets a 429 for a named cache, never takes another's.",
    )
    no_cache: bool = Field(False, description="Serve with prefix caching completely off.")
    no_tails: bool = Field(
        False, description="Cache whole 128-token blocks only, no tails (the tokens after the last one)."
    )
    no_render_ahead: bool = Field(
        False, description="Do not compute the start of a chat's next turn in idle time after each turn."
    )
    dtype: DtypeChoice = Field(
        "auto",
        description="Activation and KV dtype; auto: float32, the exact mode.",
    )
    block_format: BlockFormat = Field(
        "exact",
        description="How cached blocks are held at rest: exact (every bit, compressed losslessly), "
        "bfloat16 or int8 (lossy: fewer bytes, answers may differ; see the README's Formats).",
    )
    weights: WeightsChoice = Field(
        "auto",
        description="What the decode step computes on: source (the GGUF file's own block codes, in "
        "float32) or full (the checkpoint's weights); auto: source where the model has a GGUF source, "
        "the dtype is float32, the device the CPU and a C++ compiler is found, else full.",
    )
    decode_threads: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Threads of the native decode step (default: torch's, the cores); they share each step's "
        "work as they run, so a busy core does not hold a step up.",
    )
    no_speculation: bool = Field(
        False,
        description="Decode one token a step. By default a sequence drafts tokens from its own prompt and "
        "answer (a quoted document, code, echoed tool output) and the native step checks them several at a "
        "time: the same tokens, greedy or seeded, faster where drafts are right.",
    )
    device: str = Field("cpu", description="Torch device for the model (cpu, cuda, cuda:1, ...).")
    default_max_tokens: int = Field(
        2048,
        ge=1,
        description="Longest answer when a request sets no token limit (tokens; legacy completions get 16, "
        "as OpenAI's; a Responses request without max_output_tokens may fill the context, as the hosted "
        "API's).",
    )
    max_queue: int = Field(64, ge=1, description="Requests that may wait for the engine.")
    max_batch: int = Field(
        4, ge=1, description="Requests running at once; their decode steps share one forward pass."
    )
    audit_rate: float = Field(
        0.01,
        ge=0,
        le=1,
        description="Fraction of cache hits recomputed cold in idle time to check them (0: off).",
    )
    audit_imports: bool = Field(
        False,
        description="Serve an imported snapshot's blocks only once the model, in idle time, has "
        "recomputed them and found them equal (an import is a trust decision).",
    )
    max_import_bytes: Bytes = Field(
        16 * 1024**3, gt=0, description="Largest snapshot archive POST /v1/cache/import takes (then: 413)."
    )
    ram_cache_bytes: Bytes = Field(
        1024**3, ge=0, description="Byte budget of the in-process RAM tier of hot blocks (0: none)."
    )
    cache_read_timeout: float = Field(
        5.0,
        gt=0,
        description="Seconds a request waits for its cached blocks to be read before it is computed "
        "as a miss instead (a stuck disk or mount).",
    )

    @model_validator(mode="after")
    def _one_blob_location(self) -> Settings:
        if self.blob_disk_cache is not None and not (self.blob_url or "").startswith("s3:"):
            raise ValueError(
                "--blob-disk-cache keeps local copies of blobs in S3: it needs --blob-url s3://bucket/prefix "
                "(blobs in a directory are on disk already)"
            )
        if self.blob_url is None:
            return self
        if self.blob_dir is not None:
            raise ValueError(
                "give --blob-dir or --blob-url, not both (--blob-dir DIR is --blob-url file://DIR)"
            )
        url = urlsplit(self.blob_url)
        if "@" in url.netloc:
            raise ValueError(
                f"--blob-url {redact_url(self.blob_url)!r} carries credentials: give them the AWS way "
                "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, a profile or a role)"
            )
        if not (url.scheme == "s3" and url.netloc) and not (
            url.scheme == "file" and url.path and not url.netloc
        ):
            shown = redact_url(self.blob_url)
            raise ValueError(f"--blob-url {shown!r} is neither file:///path nor s3://bucket/prefix")
        return self

    @property
    def blob_root(self) -> Path:
        """The directory of a file blob store: ``--blob-url file://...``, ``--blob-dir`` or
        CACHE_DIR/blobs."""
        if self.blob_url is not None and self.blob_url.startswith("file:"):
            return Path(url2pathname(urlsplit(self.blob_url).path))
        return self.blob_dir if self.blob_dir is not None else self.cache_dir / "blobs"

    def tenant_budget(self, total: int) -> int:
        """One tenant's share of a budget of ``total`` bytes that tenants share: ``--tenant-share``
        of it (at least 1) while ``--api-keys`` names tenants, else all of it (a server without
        keys has one tenant, everyone's). Every such budget takes its share here."""
        if not (self.api_keys or "").strip():
            return total
        return max(1, int(total * self.tenant_share))

    @property
    def blob_location(self) -> str:
        """Where blobs live, as a URL: ``s3://bucket/prefix`` or ``file:///path``."""
        if self.blob_url is not None and self.blob_url.startswith("s3:"):
            return self.blob_url
        return self.blob_root.absolute().as_uri()


STATE_TIMEOUT_S = 2.0
"""The least time a Redis operation on stored responses or named caches may take: they are state,
not cache, so a slow Redis delays them rather than losing them (the cache's ``--redis-timeout``
may be 0.25 s)."""


def state_timeout(settings: Settings) -> float:
    """Seconds a Redis operation on stored responses or named caches may take."""
    return max(settings.redis_timeout, STATE_TIMEOUT_S)


def state_place(settings: Settings) -> RedisPlace:
    """The Redis of stored responses and named caches as their warnings name it: its URL and their
    own timeout (``state_timeout``)."""
    longer = f"--redis-timeout or {STATE_TIMEOUT_S:g} s if longer"
    return RedisPlace(redact_url(settings.redis_url), state_timeout(settings), longer)


class ToolSettings(Settings):
    """``kvproxy serve``'s settings as the commands that open its cache or its models directly read
    them (``kvproxy cache``, ``kvproxy models``): no server, so ``KVPROXY_API_KEY``, the key
    ``kvproxy cache`` sends, is no mistake here."""

    command: ClassVar[str] = "kvproxy cache/models"
    serves: ClassVar[bool] = False
