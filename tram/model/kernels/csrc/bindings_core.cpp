// The core family: what every model calls (attention, norms, rotary, activations, float linears). Its functions are listed in tram/model/kernels/families.py.
#include "kernels.h"

// torch's pybind11 type casters (at::Tensor, optional) and pybind11's STL casters, not <torch/extension.h>:
// that also parses the whole C++ frontend (torch/all.h), seconds of every build that nothing here uses.
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Tram CPU kernels: core";
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
  m.def("moe_route", &tram::moe_route,
        "A router's choice (CPU): (logits [T,E], top_k, softmax_first, renormalize) -> (weights [T,k] float32, "
        "ids [T,k] int32), largest weight first; softmax_first: softmax over E then top k (divided by their sum "
        "when renormalize), else top k logits then softmax over them",
        py::arg("logits"), py::arg("top_k"), py::arg("softmax_first"), py::arg("renormalize"));
  m.def("write_kv_cache_", &tram::write_kv_cache_,
        "key/value [T,Hkv,D] into their slots of kv_cache [2,N,bs,Hkv,D] (CPU; the cache's dtype): (kv_cache, "
        "key, value, slot_mapping [T] int64, < 0: skipped)",
        py::arg("kv_cache"), py::arg("key"), py::arg("value"), py::arg("slot_mapping"));
  m.def("rms_norm", &tram::rms_norm, "transformers' RMSNorm (CPU): (x [T,N], weight [N], eps) -> [T,N]; a float32 weight for 16-bit x "
        "multiplies the unrounded normalised row (Gemma's, OLMo 2's)",
        py::arg("x"), py::arg("weight"), py::arg("eps"));
  m.def("rms_norm_add", &tram::rms_norm_add,
        "(s, rms_norm(s, next_weight) or empty) with s = residual + rms_norm(x, weight) (CPU; Gemma's "
        "sandwich norms): (x [T,N], residual [T,N], weight [N], eps, next_weight [N] or None)",
        py::arg("x"), py::arg("residual"), py::arg("weight"), py::arg("eps"), py::arg("next_weight") = py::none());
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
