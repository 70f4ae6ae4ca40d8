"""Quantized linear weights, two ways (names.py lists both kinds' names, without torch):

  * made at load from a float checkpoint (`quantization="int8"` / `"int4"`): weights.py holds the
    formats, apply.py quantizes a loaded model's Linears;
  * read from a quantized checkpoint (GPTQ, AWQ, compressed-tensors, as its config.json's
    quantization_config names them): formats/ registers one module per format, checkpoints.py
    loads their Linears, unpacked.py and checkpoint_weight.py repack them for the kernels,
    checkpoint_shards.py cuts a tensor-parallel rank's slice.
check.py validates either at start. This package imports nothing itself (import its modules), so
that the API process can import names.py and check.py without torch.
"""
