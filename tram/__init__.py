"""Tram: an LLM inference and serving engine with a paged KV cache and continuous batching."""
from tram.logger import configure_logging

configure_logging()

from tram.entrypoints.llm import LLM  # noqa: E402
from tram.engine.arg_utils import EngineArgs
from tram.engine.llm_engine import LLMEngine
from tram.outputs import CompletionOutput, Logprob, RequestOutput
from tram.sampling_params import SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "LLMEngine", "EngineArgs", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob"]
