"""The OpenAI-compatible HTTP server: FastAPI routes over an `AsyncLLM` whose core runs in its own process."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import uvicorn
from fastapi import APIRouter, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

import tram.envs as envs
from tram.config import EngineArgs, EngineConfig, ServerArgs
from tram.engine.async_llm import AsyncLLM
from tram.engine.engine_config import create_engine_config
from tram.server.handlers.anthropic import AnthropicServingMessages
from tram.server.handlers.anthropic_errors import AnthropicRoute
from tram.server.handlers.chat import OpenAIServingChat
from tram.server.handlers.completion import OpenAIServingCompletion
from tram.server.handlers.generate import LegacyGenerate
from tram.server.handlers.responses import OpenAIServingResponses
from tram.server.handlers.tokenization import ServingTokenization
from tram.server.handlers.tokenizer_threads import TokenizerThreads
from tram.server.http.access_log import AccessLogMiddleware
from tram.server.http.body_limit import BodySizeLimit
from tram.server.http.body_timeout import BodyReadTimeout
from tram.server.http.connections import ConnectionLimits, protocol_class, raise_open_file_limit
from tram.server.http.gc_policy import FullCollections
from tram.server.http.large_json import LargeJSONRoute
from tram.server.http.listen import bind_socket, server_url
from tram.server.http.openapi import openapi_document
from tram.server.protocol.anthropic import CountTokensRequest, MessagesRequest
from tram.server.protocol.errors import error_response, install_exception_handlers
from tram.server.protocol.generate import GenerateRequest
from tram.server.protocol.openai import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from tram.server.protocol.responses import ResponsesRequest
from tram.version import __version__

logger = logging.getLogger(__name__)


def load_chat_template(value: str | None) -> str | None:
    """A path to a Jinja file, or the template itself."""
    if value is None:
        return None
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if "{" not in value:
        raise ValueError(f"--chat-template {value!r} is neither a file nor a Jinja template")
    return value


class Handlers:
    """The serving objects, created once the engine is up."""

    def __init__(
        self,
        engine: AsyncLLM,
        names: list[str],
        chat_template: str | None,
        response_role: str = "assistant",
        tool_call_parser: str | None = None,
        enable_auto_tool_choice: bool = False,
        reasoning_parser: str | None = None,
    ) -> None:
        template = load_chat_template(chat_template)
        self.engine = engine
        # The tokenizer threads every endpoint shares (tokenizer_threads.py).
        self.threads = TokenizerThreads()
        self.completion = OpenAIServingCompletion(engine, names, template, self.threads)
        self.chat = OpenAIServingChat(
            engine,
            names,
            template,
            self.threads,
            response_role=response_role,
            tool_call_parser=tool_call_parser,
            enable_auto_tool_choice=enable_auto_tool_choice,
            reasoning_parser=reasoning_parser,
        )
        self.responses = OpenAIServingResponses(self.chat)
        self.anthropic = AnthropicServingMessages(self.chat)
        self.generate = LegacyGenerate(engine, names, template, self.threads)
        self.tokenization = ServingTokenization(self.chat)


def _auth_middleware(app: FastAPI, api_key: str) -> None:
    expected = f"Bearer {api_key}"

    @app.middleware("http")
    async def check_key(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if request.url.path.startswith("/v1") and request.method != "OPTIONS":
            # Anthropic's clients send the key as `x-api-key`.
            given = request.headers.get("authorization") or f"Bearer {request.headers.get('x-api-key', '')}"
            if not secrets.compare_digest(given.encode(), expected.encode()):
                return error_response(401, "Invalid or missing API key", code="invalid_api_key")
        return await call_next(request)


def _install_middleware(app: FastAPI, server_args: ServerArgs) -> None:
    """Outermost last: the access log times everything (401s and CORS preflights included), and
    CORS wraps the key check so that even a 401 carries the headers a browser needs to read it."""
    if server_args.api_key:
        _auth_middleware(app, server_args.api_key)
    app.add_middleware(BodySizeLimit, max_bytes=server_args.max_request_body_bytes)
    app.add_middleware(BodyReadTimeout, timeout=server_args.timeout_read_body)
    app.add_middleware(
        CORSMiddleware,
        allow_origins=server_args.allowed_origins,
        allow_credentials=server_args.allow_credentials,
        allow_methods=server_args.allowed_methods,
        allow_headers=server_args.allowed_headers,
    )
    if not server_args.disable_uvicorn_access_log:
        app.add_middleware(AccessLogMiddleware)


def build_app(engine_args: EngineArgs, server_args: ServerArgs, engine_config: EngineConfig | None = None) -> FastAPI:
    config = engine_config or create_engine_config(engine_args)
    names = server_args.served_model_name or [engine_args.model]

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = AsyncLLM(
            config,
            names[0],
            server_args.max_queued_requests,
            server_args.log_stats_interval,
            server_args.enable_log_requests,
            server_args.max_log_len,
        )
        gc_task: asyncio.Task | None = None
        try:
            await engine.start()
            app.state.handlers = Handlers(
                engine,
                names,
                server_args.chat_template,
                server_args.response_role,
                server_args.tool_call_parser,
                server_args.enable_auto_tool_choice,
                server_args.reasoning_parser,
            )
            collections = FullCollections()
            collections.start()
            gc_task = asyncio.create_task(_collect_when_quiet(engine, collections))
            yield
        finally:
            if gc_task is not None:
                gc_task.cancel()
            if hasattr(app.state, "handlers"):
                app.state.handlers.threads.shutdown()
            engine.shutdown()

    app = FastAPI(title="Tram", version=__version__, lifespan=lifespan, root_path=server_args.root_path or "")
    app.openapi = lambda: openapi_document(app)  # type: ignore[method-assign]
    install_exception_handlers(app)
    _install_middleware(app, server_args)
    app.router.route_class = LargeJSONRoute  # before the routes: each takes its class when added
    _add_routes(app)
    _add_anthropic_routes(app)
    _add_vllm_routes(app)
    if envs.TRAM_SERVER_DEV_MODE:
        _add_dev_routes(app)
    return app


async def _collect_when_quiet(engine: AsyncLLM, collections: FullCollections) -> None:
    """Full garbage collections between requests, not in the middle of them (see gc_policy.py)."""
    while True:
        await asyncio.sleep(1.0)
        collections.tick(busy=bool(engine.output_processor.requests))


def _h(request: Request) -> Handlers:
    return request.app.state.handlers


def _liveness(request: Request) -> Response:
    engine = _h(request).engine
    if not engine.is_running:
        return error_response(503, f"The engine is not running: {engine.dead_reason}")
    return JSONResponse({"status": "ok"})


def _add_routes(app: FastAPI) -> None:
    @app.get("/health")
    async def health(request: Request) -> Response:
        return _liveness(request)

    @app.get("/version")
    async def version() -> dict:
        return {"version": __version__}

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        h = _h(request)
        return {"object": "list", "data": [_model_card(h, name) for name in h.completion.served_model_names]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await _h(request).completion.create_completion(body, request)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        return await _h(request).chat.create_chat_completion(body, request)

    @app.post("/v1/responses")
    async def responses(body: ResponsesRequest, request: Request) -> Response:
        return await _h(request).responses.create_response(body, request)

    @app.post("/generate")
    async def generate(body: GenerateRequest, request: Request) -> Response:
        return await _h(request).generate.generate(body, request)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest, request: Request) -> dict:
        return await _h(request).tokenization.tokenize(body)

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest, request: Request) -> dict:
        return await _h(request).tokenization.detokenize(body)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics(request: Request) -> Response:
        return Response(generate_latest(_h(request).engine.prometheus.registry), media_type=CONTENT_TYPE_LATEST)


def _add_anthropic_routes(app: FastAPI) -> None:
    """Anthropic's Messages API, whose failures are answered in its own error shape."""
    router = APIRouter(route_class=AnthropicRoute)

    @router.post("/v1/messages")
    async def messages(body: MessagesRequest, request: Request) -> Response:
        return await _h(request).anthropic.create_message(body, request)

    @router.post("/v1/messages/count_tokens")
    async def count_tokens(body: CountTokensRequest, request: Request) -> dict:
        return await _h(request).anthropic.count_tokens(body)

    app.include_router(router)


def _model_card(h: Handlers, name: str) -> dict:
    """OpenAI's model object (plus vLLM's root, parent and max_model_len) for a served name."""
    return {
        "id": name,
        "object": "model",
        "created": h.completion.created(),
        "owned_by": "tram",
        "root": h.engine.config.model_config.model,
        "parent": None,
        "max_model_len": h.completion.max_model_len,
    }


def _add_vllm_routes(app: FastAPI) -> None:
    """Routes vLLM's server has beside OpenAI's: clients and load balancers written for it call them."""

    @app.get("/ping")
    @app.post("/ping")
    async def ping(request: Request) -> Response:  # vLLM's (and SageMaker's) liveness probe = /health
        return _liveness(request)

    # A served name may hold slashes ("org/model"): the id is the rest of the path.
    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> dict:
        h = _h(request)
        h.completion.check_model(model_id)  # 404 with OpenAI's error body for an unknown id
        return _model_card(h, model_id)


def _add_dev_routes(app: FastAPI) -> None:
    """Endpoints for tests and debugging only (TRAM_SERVER_DEV_MODE=1), as vLLM's dev mode."""

    @app.get("/debug/kv_integrity")
    async def kv_integrity(request: Request) -> dict:
        engine = _h(request).engine
        stats = await engine.get_stats()
        return {
            "blocks": await engine.check_kv_integrity(),
            "num_running_reqs": stats.num_running_reqs,
            "num_waiting_reqs": stats.num_waiting_reqs,
            "kv_cache_usage": stats.kv_cache_usage,
            "num_unfinished_in_frontend": len(engine.output_processor.requests),
        }

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(request: Request) -> dict:
        return {"reset": await _h(request).engine.reset_prefix_cache()}


class _Server(uvicorn.Server):
    """uvicorn's server, which says Ready once its socket listens (after the engine is up), not before."""

    def __init__(self, config: uvicorn.Config, url: str) -> None:
        super().__init__(config)
        self.url = url

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            logger.info("Ready: %s (OpenAI API under /v1)", self.url)


def run_server(engine_args: EngineArgs, server_args: ServerArgs, sock: socket.socket | None = None) -> None:
    """Serve on `sock` (bound to host:port before the engine starts) until SIGINT/SIGTERM; the engine
    process is stopped on the way out. SystemExit if the port is taken or the engine fails to start."""
    raise_open_file_limit()  # every connection is a file descriptor
    sock = sock or bind_socket(server_args.host, server_args.port)
    url = server_url(server_args.host, server_args.port, tls=server_args.ssl_certfile is not None)
    logger.info(
        "Tram %s starting: loading %s; %s answers once the engine is up (the log says Ready)",
        __version__,
        engine_args.model,
        url,
    )
    app = build_app(engine_args, server_args)
    limits = ConnectionLimits(server_args.timeout_read_headers, server_args.limit_concurrency)
    config = uvicorn.Config(
        app,
        http=protocol_class(limits),
        timeout_keep_alive=server_args.timeout_keep_alive,  # uvicorn declares int; a float works (call_later)
        log_level=server_args.uvicorn_log_level,
        timeout_graceful_shutdown=3,
        access_log=False,
        ssl_keyfile=server_args.ssl_keyfile,
        ssl_certfile=server_args.ssl_certfile,
    )
    try:
        config.load()  # builds the TLS context: a bad key or certificate fails now, not after the engine starts
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"cannot load --ssl-keyfile/--ssl-certfile: {e}") from e
    asyncio.run(_Server(config, url).serve(sockets=[sock]))
