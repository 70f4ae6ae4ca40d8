"""The sections of benchmarks/gpu_bench.py, one file each, and what runs and reports them.

common.py       flags-derived context, device helpers, the model under test, measured ceilings
decode.py       decode step time against the memory-bandwidth bound
throughput.py   offline throughput, Tram against transformers' continuous batching
kernels.py      Tram's Triton kernels against PyTorch SDPA
quant.py        Tram's Triton int8 / int4 weight-only GEMMs against F.linear
sections.py     each section in its own child process; the JSON report
summary.py      the summary tables printed at the end
cli.py          the command line
"""
