"""Tram: an LLM inference and serving engine with a paged KV cache and continuous batching."""
from tram.entrypoints.llm import LLM
from tram.engine.arg_utils import EngineArgs
from tram.engine.llm_engine import LLMEngine
from tram.outputs import CompletionOutput, Logprob, RequestOutput
from tram.sampling_params import SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "LLMEngine", "EngineArgs", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob"]
