"""Settings of an api pod: llama-server's HTTP, auth and chat-template flags, plus ours."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Self

from pydantic import model_validator

from api.net.policy import FetchPolicy, parse_networks
from scheduler.affinity import DEFAULT_MIN_CHARS
from scheduler.common_settings import RoleSettings
from scheduler.config.settings import flag

REASONING_FORMATS = ("none", "deepseek", "deepseek-legacy", "auto")
ON_OFF_AUTO = ("on", "off", "auto")


def read_key_file(path: str) -> set[str]:
    """The keys of an --api-key-file: one per line; empty lines and # comments skipped."""
    lines = (line.strip() for line in Path(path).read_text().splitlines())
    return {line for line in lines if line and not line.startswith("#")}


class ApiSettings(RoleSettings):
    """llamaq api pod: serves the llama-server HTTP API and submits jobs to workers."""

    prog: ClassVar[str] = "llamaq-api"

    # listening
    host: str = flag("127.0.0.1", "--host", env="LLAMA_ARG_HOST",
                     help="IP addresses to listen on, comma-separated, or UNIX socket paths "
                     "ending in .sock")
    port: int = flag(9931, "--port", env="LLAMA_ARG_PORT", help="port to listen")
    timeout: int = flag(3600, "-to", "--timeout", env="LLAMA_ARG_TIMEOUT",
                        help="server read/write timeout in seconds")
    body_timeout: float = flag(60.0, "--body-timeout", env="LLAMAQ_BODY_TIMEOUT",
                               help="seconds a request's headers and body may take to arrive "
                               "(a file upload: each part of it), for every client; a "
                               "client too slow gets 408 and the connection closes")
    queue_max: int = flag(0, "--queue-max", env="LLAMAQ_QUEUE_MAX",
                          help="jobs of the model that may wait in Redis for a slot; past it a "
                          "request gets 503 with Retry-After (0 = 4 x the fleet's live slots; "
                          "a model with no live slot queues without bound)")
    cold_start_timeout: float = flag(300.0, "--cold-start-timeout",
                                     env="LLAMAQ_COLD_START_TIMEOUT",
                                     help="ours: seconds a request for a model with no live "
                                     "worker is held while one starts (scale from zero; "
                                     "SSE comments meanwhile), then 503 with Retry-After "
                                     "(0 = no hold: as before, docs/deployment.md)")
    fair_share: bool = flag(True, "--fair-share", negative=("--no-fair-share",),
                            env="LLAMAQ_FAIR_SHARE",
                            help="ours: tenants share the waiting room by weight (weighted "
                            "fair queueing, docs/fairness.md); --no-fair-share: first come, "
                            "first served within a priority (a baseline for measurements)")
    migration_limit: int = flag(3, "--migration-limit", env="LLAMAQ_MIGRATION_LIMIT",
                                help="how many times a streamed completion whose worker died "
                                "continues on another worker (Dynamo's name); past it, the "
                                "poison-job 500 (0 = a job that sent tokens ends with 503)")
    sse_ping_interval: int = flag(30, "--sse-ping-interval", env="LLAMA_ARG_SSE_PING_INTERVAL",
                                  help="server SSE ping interval in seconds (-1 = disabled)")
    threads_http: int = flag(-1, "--threads-http", env="LLAMA_ARG_THREADS_HTTP",
                             help="no-op in llamaq: HTTP is served by Sanic's event loop; "
                             "scale with --workers")
    api_prefix: str = flag("", "--api-prefix", env="LLAMA_ARG_API_PREFIX",
                           help="prefix path the server serves from, without the trailing slash")
    path: str = flag("", "--path", env="LLAMA_ARG_STATIC_PATH",
                     help="path to serve static files from")
    reuse_port: bool = flag(False, "--reuse-port", env="LLAMA_ARG_REUSE_PORT",
                            help="allow multiple sockets to bind to the same port "
                            "(SO_REUSEPORT: several api pods on one port)")
    ssl_key_file: str | None = flag(None, "--ssl-key-file", env="LLAMA_ARG_SSL_KEY_FILE",
                                    help="path to file a PEM-encoded SSL private key")
    ssl_cert_file: str | None = flag(None, "--ssl-cert-file", env="LLAMA_ARG_SSL_CERT_FILE",
                                     help="path to file a PEM-encoded SSL certificate")
    # auth and CORS
    api_key: list[str] = flag([], "--api-key", env="LLAMA_API_KEY",
                              help="API keys for authentication, comma-separated")
    api_key_file: str | None = flag(None, "--api-key-file", env="LLAMA_ARG_API_KEY_FILE",
                                    help="path to file containing API keys, one per line; "
                                    "lines starting with a hash are comments")
    tenants: str | None = flag(None, "--tenants", env="LLAMAQ_TENANTS",
                               help="ours: JSON file (a path or s3://bucket/key) of tenants: "
                               "each one's name, keys and limits (max_concurrent, "
                               "requests_per_minute, tokens_per_minute, priority, "
                               "max_file_bytes, max_stored_bytes, admin); re-read on SIGHUP; "
                               "--api-key's keys are the tenant 'default' (docs/tenants.md)")
    cors_origins: list[str] = flag(["*"], "--cors-origins", env="LLAMA_ARG_CORS_ORIGINS",
                                   help="comma-separated list of allowed origins for CORS "
                                   "('localhost': reflect the Origin only if it is localhost)")
    cors_methods: list[str] = flag(["GET", "POST", "DELETE", "OPTIONS"], "--cors-methods",
                                   env="LLAMA_ARG_CORS_METHODS",
                                   help="comma-separated list of allowed methods for CORS")
    cors_headers: list[str] = flag(["*"], "--cors-headers", env="LLAMA_ARG_CORS_HEADERS",
                                   help="comma-separated list of allowed headers for CORS")
    cors_credentials: bool = flag(True, "--cors-credentials", env="LLAMA_ARG_CORS_CREDENTIALS",
                                  negative=("--no-cors-credentials",),
                                  help="whether to allow credentials for CORS")
    # endpoints
    metrics: bool = flag(False, "--metrics", env="LLAMA_ARG_ENDPOINT_METRICS",
                         help="enable prometheus compatible metrics endpoint")
    props: bool = flag(False, "--props", env="LLAMA_ARG_ENDPOINT_PROPS",
                       help="enable changing global properties via POST /props")
    slots: bool = flag(True, "--slots", env="LLAMA_ARG_ENDPOINT_SLOTS", negative=("--no-slots",),
                       help="expose slots monitoring endpoint")
    ui: bool = flag(True, "--ui", "--webui", env="LLAMA_ARG_UI",
                    negative=("--no-ui", "--no-webui"), help="whether to enable the Web UI")
    ui_config: str | None = flag(None, "--ui-config", "--webui-config", env="LLAMA_ARG_UI_CONFIG",
                                 help="JSON that provides default UI settings")
    ui_config_file: str | None = flag(None, "--ui-config-file", "--webui-config-file",
                                      env="LLAMA_ARG_UI_CONFIG_FILE",
                                      help="JSON file that provides default UI settings")
    # server tools, MCP servers and the web UI's MCP proxy (api/tools/; docs/tools.md)
    tools: list[str] = flag([], "--tools", env="LLAMA_ARG_TOOLS",
                            help="built-in tools for AI agents, comma-separated, or 'all' "
                            "(read_file, file_glob_search, grep_search, exec_shell_command, "
                            "write_file, edit_file, get_info); they run on the api pod - do not "
                            "enable in untrusted environments; --cors-origins defaults to "
                            "localhost with it")
    tools_runtime: str = flag("", "--tools-runtime", env="LLAMA_ARG_TOOLS_RUNTIME",
                              help="run tools in 'docker:<image>' / 'podman:<image>' (one "
                              "container per api pod, removed at exit) or an existing "
                              "'docker-container:<id>' / 'podman-container:<id>', or on "
                              "'ssh:<target>' (key-based auth and a trusted host key required)")
    tools_ssh_config: str | None = flag(None, "--tools-ssh-config", env="LLAMAQ_TOOLS_SSH_CONFIG",
                                        help="ours: the ssh config file of the ssh: tools "
                                        "runtime (ssh -F: the targets' ports, keys, "
                                        "known_hosts); default ssh's own (~/.ssh/config)")
    tools_runtime_allow: list[str] = flag([], "--tools-runtime-allow",
                                          env="LLAMAQ_TOOLS_RUNTIME_ALLOW",
                                          help="ours: runtimes a caller's x-tool-runtime header "
                                          "may name besides --tools-runtime, comma-separated "
                                          "(an entry ending in '*' is a prefix, e.g. "
                                          "'podman-container:*'); any other header is a 403")
    tools_root: str | None = flag(None, "--tools-root", env="LLAMAQ_TOOLS_ROOT",
                                  help="ours: confine the file tools and the x-tool-cwd header "
                                  "to this folder (symlink and .. escapes refused); relative "
                                  "paths and commands start there")
    mcp_servers_config: str | None = flag(None, "--mcp-servers-config",
                                          env="LLAMA_ARG_MCP_SERVERS_CONFIG",
                                          help="path to JSON file with MCP server definitions "
                                          "(Cursor-compatible format)")
    mcp_servers_json: str | None = flag(None, "--mcp-servers-json",
                                        env="LLAMA_ARG_MCP_SERVERS_JSON",
                                        help="inline JSON with MCP server definitions "
                                        "(Cursor-compatible format)")
    agent: bool = flag(False, "-ag", "--agent", env="LLAMA_ARG_AGENT",
                       negative=("-no-ag", "--no-agent"),
                       help="enable the CORS proxy and all built-in tools - do not enable in "
                       "untrusted environments")
    ui_mcp_proxy: bool = flag(False, "--ui-mcp-proxy", "--webui-mcp-proxy",
                              env="LLAMA_ARG_UI_MCP_PROXY",
                              negative=("--no-ui-mcp-proxy", "--no-webui-mcp-proxy"),
                              help="enable the MCP CORS proxy (/cors-proxy) of the web UI - do "
                              "not enable in untrusted environments")
    # chat templates and reasoning
    jinja: bool = flag(True, "--jinja", env="LLAMA_ARG_JINJA", negative=("--no-jinja",),
                       help="whether to use jinja template engine for chat")
    chat_template: str | None = flag(None, "--chat-template", env="LLAMA_ARG_CHAT_TEMPLATE",
                                     help="set custom jinja chat template (none: the model's)")
    chat_template_file: str | None = flag(None, "--chat-template-file",
                                          env="LLAMA_ARG_CHAT_TEMPLATE_FILE",
                                          help="set custom jinja chat template file")
    chat_template_kwargs: str | None = flag(None, "--chat-template-kwargs",
                                            env="LLAMA_ARG_CHAT_TEMPLATE_KWARGS",
                                            help="additional params for the json template "
                                            "parser, a JSON object string")
    skip_chat_parsing: bool = flag(False, "--skip-chat-parsing",
                                   env="LLAMA_ARG_SKIP_CHAT_PARSING",
                                   negative=("--no-skip-chat-parsing",),
                                   help="force a pure content parser, even with a Jinja template")
    prefill_assistant: bool = flag(True, "--prefill-assistant",
                                   env="LLAMA_ARG_PREFILL_ASSISTANT",
                                   negative=("--no-prefill-assistant",),
                                   help="whether to prefill the assistant's response if the last "
                                   "message is an assistant message")
    reasoning_format: str = flag("auto", "--reasoning-format", env="LLAMA_ARG_THINK",
                                 choices=REASONING_FORMATS,
                                 help="whether thought tags are allowed and/or extracted from the "
                                 "response, and in which format they are returned")
    reasoning: str = flag("auto", "-rea", "--reasoning", env="LLAMA_ARG_REASONING",
                          choices=ON_OFF_AUTO,
                          help="use reasoning/thinking in the chat (auto: detect from template)")
    reasoning_effort: str = flag("default", "--reasoning-effort",
                                 env="LLAMA_ARG_REASONING_EFFORT",
                                 help="reasoning effort level given to the chat template")
    reasoning_budget: int = flag(-1, "--reasoning-budget", env="LLAMA_ARG_THINK_BUDGET",
                                 help="token budget for thinking: -1 unrestricted, "
                                 "0 immediate end, N>0 budget")
    reasoning_budget_message: str | None = flag(None, "--reasoning-budget-message",
                                                env="LLAMA_ARG_THINK_BUDGET_MESSAGE",
                                                help="message injected before the end-of-"
                                                "thinking tag when the budget is exhausted")
    reasoning_preserve: bool = flag(True, "--reasoning-preserve",
                                    env="LLAMA_ARG_REASONING_PRESERVE",
                                    negative=("--no-reasoning-preserve",),
                                    help="preserve reasoning trace in the full history")
    log_prompts_dir: str | None = flag(None, "--log-prompts-dir",
                                       help="log prompts to directory (auto-created if not "
                                       "present; only used for debugging)")
    media_path: str | None = flag(None, "--media-path",
                                  help="directory for loading local media files; files can be "
                                  "accessed via file:// URLs using relative paths (read by the "
                                  "api pods, api/media/)")
    fetch_allow: list[str] = flag([], "--fetch-allow", env="LLAMAQ_FETCH_ALLOW",
                                  help="ours: networks (10.0.0.0/8) or addresses, comma-separated, "
                                  "that media URLs and /cors-proxy may reach although they are "
                                  "private, loopback or link-local (refused by default)")
    tags: list[str] = flag([], "--tags", env="LLAMA_ARG_TAGS",
                           help="set model tags, comma-separated (informational, listed by "
                           "/v1/models)")
    # router mode (started without a model)
    models_dir: str | None = flag(None, "--models-dir", env="LLAMA_ARG_MODELS_DIR",
                                  help="directory containing models for the router server")
    models_preset: str | None = flag(None, "--models-preset", env="LLAMA_ARG_MODELS_PRESET",
                                     help="path to INI file containing model presets for the "
                                     "router server")
    models_max: int = flag(4, "--models-max", env="LLAMA_ARG_MODELS_MAX",
                           help="for router server, maximum number of models loaded at once "
                           "across the fleet (0 = unlimited); the least recently used unloads")
    models_download_max_bytes: int = flag(64 << 30, "--models-download-max-bytes",
                                          env="LLAMAQ_MODELS_DOWNLOAD_MAX_BYTES",
                                          help="ours: POST /models refuses a model whose files "
                                          "(with its sidecars) are larger, in bytes "
                                          "(0 = no cap)")
    models_allow: list[str] = flag([], "--models-allow", env="LLAMAQ_MODELS_ALLOW",
                                   help="ours: Hugging Face repos POST /models may download, "
                                   "comma-separated shell patterns (`ggml-org/*`); empty: any")
    models_downloads_max: int = flag(2, "--models-downloads-max",
                                     env="LLAMAQ_MODELS_DOWNLOADS_MAX",
                                     help="ours: POST /models downloads running at once, "
                                     "fleet-wide; past it 503 with Retry-After (0 = no bound)")
    models_autoload: bool = flag(True, "--models-autoload", env="LLAMA_ARG_MODELS_AUTOLOAD",
                                 negative=("--no-models-autoload",),
                                 help="for router server, whether to automatically load models")
    # ours
    workers: int = flag(1, "--workers", env="LLAMAQ_API_WORKERS",
                        help="number of Sanic worker processes")
    prefix_affinity: int = flag(DEFAULT_MIN_CHARS, "--prefix-affinity",
                                env="LLAMAQ_PREFIX_AFFINITY",
                                help="cache-aware routing: a completion whose prompt begins with "
                                "at least this many characters that a worker's slots hold goes "
                                "to that worker when it has a free slot (0 = off: every "
                                "completion goes to the shared queue)")
    coalesce_embeddings: bool = flag(True, "--coalesce-embeddings",
                                     env="LLAMAQ_COALESCE_EMBEDDINGS",
                                     negative=("--no-coalesce-embeddings",),
                                     help="embedding requests for a model that arrive while this "
                                     "pod's job for it is in flight go to Redis as one job once "
                                     "it ends (off: one job per request)")

    def enabled_tools(self) -> list[str]:
        """--tools, or all of them with --agent."""
        return ["all"] if self.agent else [t for t in self.tools if t]

    def mcp_configured(self) -> bool:
        return bool(self.mcp_servers_config or self.mcp_servers_json)

    def tools_on(self) -> bool:
        """Built-in tools or MCP servers: /tools answers, and CORS defaults to localhost."""
        return bool(self.enabled_tools()) or self.mcp_configured()

    def cors_proxy_on(self) -> bool:
        return self.ui_mcp_proxy or self.agent

    def router_mode(self) -> bool:
        """No -m/-hf/-mu/-dr: a router, unless --default-model asks for Gemma; --models-dir or
        --models-preset make it a router anyway."""
        if self.model or self.hf_repo or self.model_url or self.docker_repo:
            return False
        return not self.default_model or bool(self.models_dir or self.models_preset)

    def fetch_policy(self) -> FetchPolicy:
        """What media URLs and /cors-proxy may reach (api/net/)."""
        return FetchPolicy.from_flags(self.fetch_allow)

    @model_validator(mode="after")
    def _fetch_allow_parses(self) -> Self:
        parse_networks(self.fetch_allow)  # ValueError: the pod does not start
        return self

    @model_validator(mode="after")
    def _tls_pair(self) -> Self:
        if bool(self.ssl_key_file) != bool(self.ssl_cert_file):
            raise ValueError("--ssl-key-file and --ssl-cert-file must be given together")
        return self

    @model_validator(mode="after")
    def _keys_given_are_keys(self) -> Self:
        """A key setting that names no key would turn authentication off without a word
        (`LLAMA_API_KEY=","`, an empty --api-key-file): refused at start."""
        if "api_key" in self.model_fields_set and not self.api_key:
            raise ValueError("--api-key (LLAMA_API_KEY) names no key; leave it unset to serve "
                             "without authentication")
        if self.api_key_file is not None:
            try:
                keys = read_key_file(self.api_key_file)
            except OSError as exc:
                raise ValueError(f"--api-key-file: {exc}") from None
            if not keys:
                raise ValueError(f"--api-key-file {self.api_key_file} holds no key (only empty "
                                 "or # lines)")
        return self
