"""What a request asks of sampling: `SamplingParams` (vLLM's names, defaults and validation), the
structured-output constraint it may carry, and the range of every numeric parameter, stated once
(ranges.py) for both SamplingParams' checks and the server's request models.

A leaf of the floors: it imports nothing of Tram's outside this package, so every layer, the API
process included, may use it.
"""

from tram.sampling_params.checks import SamplingParamError
from tram.sampling_params.params import SAMPLING_EPS, RequestOutputKind, SamplingParams, SamplingType
from tram.sampling_params.ranges import SAMPLING_RANGES, Range
from tram.sampling_params.structured import StructuredOutputsParams

__all__ = [
    "SAMPLING_EPS",
    "SAMPLING_RANGES",
    "Range",
    "RequestOutputKind",
    "SamplingParamError",
    "SamplingParams",
    "SamplingType",
    "StructuredOutputsParams",
]
