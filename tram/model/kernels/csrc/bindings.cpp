#include "kernels.h"

#include <torch/extension.h>

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Tram CPU kernels";
  m.def("paged_decode_attention", &tram::paged_decode_attention,
        "Decode attention over a paged KV cache (CPU): (query [B,H,D], kv_cache [2,N,bs,Hkv,D], "
        "block_tables [B,M], seq_lens [B], scale, sliding_window (0 = none), k_scale, v_scale (an fp8 cache's "
        "K/V are read as stored * scale), logits_soft_cap (0 = none, else scores -> cap * tanh(score / cap)), "
        "sinks ([H] float32 or None: attention sinks, logits that join the softmax's denominator)) -> [B,H,D]",
        py::arg("query"), py::arg("kv_cache"), py::arg("block_tables"), py::arg("seq_lens"), py::arg("scale"),
        py::arg("sliding_window") = 0, py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0,
        py::arg("logits_soft_cap") = 0.0, py::arg("sinks") = py::none());
  m.def("paged_prefill_attention_", &tram::paged_prefill_attention_,
        "Causal prefill attention over a paged KV cache, written into out (CPU): (out [T,H,D], query [T,H,D], "
        "kv_cache [2,N,bs,Hkv,D], block_tables [R,M] int32, query_starts [R], query_lens [R], seq_lens [R], "
        "scale, sliding_window (0 = none), k_scale, v_scale (an fp8 cache's K/V are read as stored * scale), "
        "logits_soft_cap (0 = none, else scores -> cap * tanh(score / cap)), sinks ([H] float32 or None))",
        py::arg("out"), py::arg("query"), py::arg("kv_cache"), py::arg("block_tables"), py::arg("query_starts"),
        py::arg("query_lens"), py::arg("seq_lens"), py::arg("scale"), py::arg("sliding_window") = 0,
        py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0, py::arg("logits_soft_cap") = 0.0,
        py::arg("sinks") = py::none());
  m.def("skinny_linear", &tram::skinny_linear,
        "y = x W^T + b for a few rows of x (CPU): (x [M,K], weight [N,K], bias [N] or None) -> [M,N]",
        py::arg("x"), py::arg("weight"), py::arg("bias") = py::none());
  m.def("skinny_linear_n", &tram::skinny_linear_n,
        "skinny_linear for several weights sharing x (CPU): (x [M,K], [weight [N_i,K]], [bias [N_i] or None]) "
        "-> [[M,N_i]]",
        py::arg("x"), py::arg("weights"), py::arg("biases"));
  m.def("pair_linear_built", &tram::pair_linear_built, "whether this build has pair_linear (AVX512-BF16)");
  m.def("pair_linear_preferred", &tram::pair_linear_preferred,
        "whether this build multiplies a bfloat16 weight by few rows of x faster packed in pairs of k (pair_pack, "
        "pair_linear) than oneDNN: AVX512-BF16 without AMX");
  m.def("pair_pack", &tram::pair_pack,
        "weight [N,K] bfloat16 -> [N/16,K/2,16] int32: blocks of 16 rows of W, each k pair one int32 (pair_linear's "
        "layout)", py::arg("weight"));
  m.def("pair_linear", &tram::pair_linear,
        "y = x W^T + b on pair_pack's layout (CPU, AVX512-BF16): (x [M,K] bfloat16, packed, N, bias [N] or None) "
        "-> [M,N] bfloat16, every output the same sum whatever M",
        py::arg("x"), py::arg("packed"), py::arg("n"), py::arg("bias") = py::none());
  m.def("quant_linear", &tram::quant_linear,
        "y = x W^T + b for a few rows of x, W in int8 or int4 (CPU): (x [M,K], qweight [N,K] int8 or [N,K/2] "
        "uint8, scale [N] or [N,K/group] float32, group (0: int8), bias [N] or None, int4 zero points "
        "[N,K/group] uint8 or None: all 8) -> [M,N]",
        py::arg("x"), py::arg("qweight"), py::arg("scale"), py::arg("group"), py::arg("bias") = py::none(),
        py::arg("zero") = py::none());
  m.def("quant_dequantize_", &tram::quant_dequantize_,
        "quant_linear's W dequantized into out (CPU): (out [N,K] float32 or bfloat16, qweight, scale, group, "
        "zero or None)",
        py::arg("out"), py::arg("qweight"), py::arg("scale"), py::arg("group"), py::arg("zero") = py::none());
  m.def("gguf_linear", &tram::gguf_linear,
        "y = x W^T + b for a few rows of x, W in a GGUF block layout (CPU): (x [M,K] float32 or bfloat16, "
        "data [N,row_bytes] uint8, ggml_type (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K), bias [N] or None) -> [M,N]",
        py::arg("x"), py::arg("data"), py::arg("ggml_type"), py::arg("bias") = py::none());
  m.def("quant_gemm", &tram::quant_gemm,
        "quant_linear for many rows of x (CPU): W decoded a tile at a time, not into an [N,K] copy; the same "
        "arguments and bit for bit the same result",
        py::arg("x"), py::arg("qweight"), py::arg("scale"), py::arg("group"), py::arg("bias") = py::none(),
        py::arg("zero") = py::none());
  m.def("gguf_gemm", &tram::gguf_gemm,
        "gguf_linear for many rows of x (CPU): W decoded a tile at a time, not into an [N,K] copy; the same "
        "arguments and bit for bit the same result",
        py::arg("x"), py::arg("data"), py::arg("ggml_type"), py::arg("bias") = py::none());
  m.def("gguf_linear_int8", &tram::gguf_linear_int8,
        "gguf_linear with x quantized to int8 per 32 k and integer dot products (llama.cpp's numerics), any "
        "number of rows; invariant to batch, threads and instruction set",
        py::arg("x"), py::arg("data"), py::arg("ggml_type"), py::arg("bias") = py::none());
  m.def("gguf_linear_int8_n", &tram::gguf_linear_int8_n,
        "gguf_linear_int8 for several weights sharing x (CPU): (x [M,K], [data [N_i,row_bytes]], [ggml_type], "
        "[bias [N_i] or None]) -> [[M,N_i]]; x quantized once, each output as gguf_linear_int8 gives it",
        py::arg("x"), py::arg("data"), py::arg("ggml_types"), py::arg("biases"));
  m.def("gguf_x8_pack", &tram::gguf_x8_pack,
        "Q4_K or Q6_K rows [N,row_bytes] (N a multiple of 8) -> [N,K/256*row bytes] uint8, repacked 8 rows at a "
        "time for gguf_linear_int8's type gguf_x8_type(ggml_type)", py::arg("data"), py::arg("ggml_type"));
  m.def("gguf_x8_unpack", &tram::gguf_x8_unpack, "gguf_x8_pack's inverse, bit for bit: (packed, repacked type)",
        py::arg("packed"), py::arg("type"));
  m.def("gguf_x8_type", &tram::gguf_x8_type, "the repacked type id of a ggml type, -1 where there is none",
        py::arg("ggml_type"));
  m.def("cpu_amx", &tram::cpu_amx,
        "whether the kernels use AMX tiles (the K-quant GEMM, bfloat16 experts: built for them, granted by the OS, "
        "allowed); enable=True/False "
        "allows or forbids them first",
        py::arg("enable") = py::none());
  m.def("gguf_x8_preferred", &tram::gguf_x8_preferred,
        "whether this build multiplies a ggml type (Q4_K, Q6_K) faster repacked eight rows at a time",
        py::arg("ggml_type"));
  m.def("quantize_activations_int8", &tram::quantize_activations_int8,
        "x [M,K] -> (int8 [M,K], scales [M,K/block]): gguf_linear_int8's activations (block 256: the K-quants')",
        py::arg("x"), py::arg("block") = 32);
  m.def("gguf_dequantize_", &tram::gguf_dequantize_,
        "gguf_linear's W dequantized into out (CPU): (out [N,K] float32 or bfloat16, data, ggml_type)",
        py::arg("out"), py::arg("data"), py::arg("ggml_type"));
  m.def("fused_moe", &tram::fused_moe,
        "A mixture-of-experts layer's experts (CPU): (x [T,H] float32 or bfloat16, topk_ids [T,k] int32 (-1: skip), "
        "topk_weights [T,k] float32, w13 [E,2I,...], w13_scale or None, w13_format, w13_param, w2 [E,H,...], "
        "w2_scale or None, w2_format, w2_param, b13 [E,2I] or None, b2 [E,H] or None, activation (0 silu, "
        "1 swiglu_oai), alpha, limit, w13_zero, w2_zero) -> [T,H]; formats: 0 float (x's dtype), 1 int8, 2 int4 "
        "(param: group; zero [E,N,K/group] uint8 or None: 8), 3 GGUF (param: ggml type), 4 GGUF K-quants with int8 "
        "activations",
        py::arg("x"), py::arg("topk_ids"), py::arg("topk_weights"), py::arg("w13"), py::arg("w13_scale"),
        py::arg("w13_format"), py::arg("w13_param"), py::arg("w2"), py::arg("w2_scale"), py::arg("w2_format"),
        py::arg("w2_param"), py::arg("b13"), py::arg("b2"), py::arg("activation"), py::arg("alpha") = 1.702,
        py::arg("limit") = 7.0, py::arg("w13_zero") = py::none(), py::arg("w2_zero") = py::none());
  m.def("fused_moe_tiles", &tram::fused_moe_tiles,
        "whether fused_moe multiplies bfloat16 experts of (hidden, intermediate) with several tokens each on AMX "
        "tiles (built for them, granted by the OS, allowed, sizes multiples of 32)",
        py::arg("hidden"), py::arg("intermediate"));
  m.def("moe_route", &tram::moe_route,
        "A router's choice (CPU): (logits [T,E], top_k, softmax_first, renormalize) -> (weights [T,k] float32, "
        "ids [T,k] int32), largest weight first; softmax_first: softmax over E then top k (divided by their sum "
        "when renormalize), else top k logits then softmax over them",
        py::arg("logits"), py::arg("top_k"), py::arg("softmax_first"), py::arg("renormalize"));
  m.def("write_kv_cache_", &tram::write_kv_cache_,
        "key/value [T,Hkv,D] into their slots of kv_cache [2,N,bs,Hkv,D] (CPU; the cache's dtype): (kv_cache, "
        "key, value, slot_mapping [T] int64, < 0: skipped)",
        py::arg("kv_cache"), py::arg("key"), py::arg("value"), py::arg("slot_mapping"));
  m.def("rms_norm", &tram::rms_norm, "transformers' RMSNorm (CPU): (x [T,N], weight [N], eps) -> [T,N]",
        py::arg("x"), py::arg("weight"), py::arg("eps"));
  m.def("add_rms_norm", &tram::add_rms_norm,
        "(rms_norm(x + residual), x + residual) (CPU): (x [T,N], residual [T,N], weight [N], eps)",
        py::arg("x"), py::arg("residual"), py::arg("weight"), py::arg("eps"));
  m.def("silu_and_mul", &tram::silu_and_mul,
        "silu(gate) * up, gate and up side by side (CPU): (gate_up [T,2I]) -> [T,I]", py::arg("gate_up"));
  m.def("silu_and_mul_pair", &tram::silu_and_mul_pair, "silu(gate) * up from two tensors (CPU): (gate, up [T,I]) -> [T,I]",
        py::arg("gate"), py::arg("up"));
  m.def("argmax_rows", &tram::argmax_rows,
        "torch.argmax(dim=-1) of float32 rows (CPU): (logits [N,V]) -> [N] int64", py::arg("logits"));
  m.def("widen_to_float", &tram::widen_to_float,
        "bfloat16 / float16 to float32 (CPU; float32 passes through): (x) -> float32, contiguous", py::arg("x"));
  m.def("rotary_", &tram::rotary_,
        "Rotate-half rotary embedding in place (CPU): (query [T,H,D], key [T,Hkv,D], cos [T,R], sin [T,R])",
        py::arg("query"), py::arg("key"), py::arg("cos"), py::arg("sin"));
  m.def("vector_bits", [] {
#if defined(__AVX512F__)
    return 512;
#elif defined(__AVX__)
    return 256;
#else
    return 128;
#endif
  }, "The widest vector registers the build targets (-march): 512 with AVX-512, 256 with AVX2");
}
