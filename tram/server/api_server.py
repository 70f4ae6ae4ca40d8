"""The OpenAI-compatible HTTP server: FastAPI routes over an `AsyncLLM` whose core runs in its own process."""
from __future__ import annotations

import asyncio
import logging
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

import tram
from tram.config import EngineArgs, EngineConfig, ServerArgs
from tram.engine.async_llm import AsyncLLM
from tram.server.body_limit import BodySizeLimit
from tram.server.errors import APIError, error_response, install_exception_handlers
from tram.server.gc_policy import FullCollections
from tram.server.openapi import openapi_document
from tram.server.protocol_generate import GenerateRequest
from tram.server.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from tram.server.protocol_responses import ResponsesRequest
from tram.server.serving_chat import OpenAIServingChat
from tram.server.serving_completion import OpenAIServingCompletion
from tram.server.serving_generate import LegacyGenerate
from tram.server.serving_responses import OpenAIServingResponses

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

    def __init__(self, engine: AsyncLLM, names: list[str], chat_template: str | None) -> None:
        template = load_chat_template(chat_template)
        self.engine = engine
        # One tokenizer thread for every endpoint (see OpenAIServing).
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="tram-tokenize")
        self.completion = OpenAIServingCompletion(engine, names, template, self.pool)
        self.chat = OpenAIServingChat(engine, names, template, self.pool)
        self.responses = OpenAIServingResponses(self.chat)
        self.generate = LegacyGenerate(engine, names, template, self.pool)


def _auth_middleware(app: FastAPI, api_key: str) -> None:
    expected = f"Bearer {api_key}"

    @app.middleware("http")
    async def check_key(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if request.url.path.startswith("/v1") and request.method != "OPTIONS":
            given = request.headers.get("authorization", "")
            if not secrets.compare_digest(given.encode(), expected.encode()):
                return error_response(401, "Invalid or missing API key", code="invalid_api_key")
        return await call_next(request)


def build_app(engine_args: EngineArgs, server_args: ServerArgs, engine_config: EngineConfig | None = None) -> FastAPI:
    config = engine_config or engine_args.create_engine_config()
    names = server_args.served_model_name or [engine_args.model]

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = AsyncLLM(config, names[0], server_args.max_queued_requests, server_args.log_stats_interval)
        gc_task: asyncio.Task | None = None
        try:
            await engine.start()
            app.state.handlers = Handlers(engine, names, server_args.chat_template)
            collections = FullCollections()
            collections.start()
            gc_task = asyncio.create_task(_collect_when_quiet(engine, collections))
            logger.info("Ready: http://%s:%d (OpenAI API under /v1)", server_args.host, server_args.port)
            yield
        finally:
            if gc_task is not None:
                gc_task.cancel()
            if hasattr(app.state, "handlers"):
                app.state.handlers.pool.shutdown(wait=False, cancel_futures=True)
            engine.shutdown()

    app = FastAPI(title="Tram", version=tram.__version__, lifespan=lifespan)
    app.openapi = lambda: openapi_document(app)  # type: ignore[method-assign]
    install_exception_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=server_args.max_request_body_bytes)
    if server_args.api_key:
        _auth_middleware(app, server_args.api_key)
    _add_routes(app)
    if os.environ.get("TRAM_SERVER_DEV_MODE") == "1":
        _add_dev_routes(app)
    return app


async def _collect_when_quiet(engine: AsyncLLM, collections: FullCollections) -> None:
    """Full garbage collections between requests, not in the middle of them (see gc_policy.py)."""
    while True:
        await asyncio.sleep(1.0)
        collections.tick(busy=bool(engine.output_processor.requests))


def _h(request: Request) -> Handlers:
    return request.app.state.handlers


def _add_routes(app: FastAPI) -> None:
    @app.get("/health")
    async def health(request: Request) -> Response:
        engine = _h(request).engine
        if not engine.is_running:
            return error_response(503, f"The engine is not running: {engine.dead_reason}")
        return JSONResponse({"status": "ok"})

    @app.get("/version")
    async def version() -> dict:
        return {"version": tram.__version__}

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        h = _h(request)
        s = h.completion
        data = [{"id": name, "object": "model", "created": s.created(), "owned_by": "tram",
                 "root": h.engine.config.model_config.model, "parent": None, "max_model_len": s.max_model_len}
                for name in s.served_model_names]
        return {"object": "list", "data": data}

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
        h = _h(request)
        h.completion.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give exactly one of 'prompt' and 'messages'")
        if body.messages is not None:
            ids = await h.chat.render(body)
        else:
            ids = await h.completion.tokenize(body.prompt, body.add_special_tokens, check_length=False)
        return {"tokens": ids, "count": len(ids), "max_model_len": h.completion.max_model_len}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest, request: Request) -> dict:
        h = _h(request)
        h.completion.check_model(body.model)
        vocab = h.engine.config.model_config.vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"token ids outside the vocabulary [0, {vocab}): {bad[:5]}", "tokens")
        if h.engine.tokenizer is None:
            raise APIError(400, "This server has no tokenizer")
        return {"prompt": h.engine.tokenizer.decode(body.tokens)}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics(request: Request) -> Response:
        return Response(generate_latest(_h(request).engine.prometheus.registry), media_type=CONTENT_TYPE_LATEST)


def _add_dev_routes(app: FastAPI) -> None:
    """Endpoints for tests and debugging only (TRAM_SERVER_DEV_MODE=1), as vLLM's dev mode."""

    @app.get("/debug/kv_integrity")
    async def kv_integrity(request: Request) -> dict:
        engine = _h(request).engine
        stats = await engine.get_stats()
        return {"blocks": await engine.check_kv_integrity(), "num_running_reqs": stats.num_running_reqs,
                "num_waiting_reqs": stats.num_waiting_reqs, "kv_cache_usage": stats.kv_cache_usage,
                "num_unfinished_in_frontend": len(engine.output_processor.requests)}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(request: Request) -> dict:
        return {"reset": await _h(request).engine.reset_prefix_cache()}


def run_server(engine_args: EngineArgs, server_args: ServerArgs) -> None:
    """Serve until SIGINT/SIGTERM; the engine process is stopped on the way out."""
    app = build_app(engine_args, server_args)
    config = uvicorn.Config(
        app, host=server_args.host, port=server_args.port, log_level=server_args.uvicorn_log_level,
        timeout_graceful_shutdown=3, access_log=False,
    )
    server = uvicorn.Server(config)
    logger.info("Tram %s serving %s on http://%s:%d", tram.__version__, engine_args.model,
                server_args.host, server_args.port)
    asyncio.run(server.serve())
