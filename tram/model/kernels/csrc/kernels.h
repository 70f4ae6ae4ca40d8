// The C++ CPU kernels, exposed by one extension module per family (bindings_<family>.cpp,
// tram/model/kernels/families.py); each is documented in its file.
//
// Only ATen's core headers here: pybind11 and torch's casters add seconds to the compile of every file
// that includes them, so only the bindings files do. That keeps the set-up's build short.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include <tuple>
#include <vector>

namespace tram {

// paged_decode.cpp: decode attention straight from the paged KV cache (the query's dtype, or fp8 read as
// stored * k_scale / v_scale), scores soft-capped when logits_soft_cap > 0.
at::Tensor paged_decode_attention(const at::Tensor& query, const at::Tensor& kv_cache,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale,
                                  int64_t sliding_window, double k_scale, double v_scale, double logits_soft_cap,
                                  const c10::optional<at::Tensor>& sinks);

// paged_prefill.cpp: causal prefill attention of query chunks over their paged context, into out.
void paged_prefill_attention_(at::Tensor& out, const at::Tensor& query, const at::Tensor& kv_cache,
                              const at::Tensor& block_tables, const std::vector<int64_t>& query_starts,
                              const std::vector<int64_t>& query_lens, const std::vector<int64_t>& seq_lens,
                              double scale, int64_t sliding_window, double k_scale, double v_scale,
                              double logits_soft_cap, const c10::optional<at::Tensor>& sinks);

// Attention sinks (gpt-oss), the optional last argument of both attention kernels: a float32 logit per
// query head that joins the softmax's denominator; nullptr when absent. Checks shape, dtype and device.
inline const float* sinks_data(const c10::optional<at::Tensor>& sinks, int64_t num_heads, const char* kernel) {
  if (!sinks.has_value()) return nullptr;
  const at::Tensor& s = *sinks;
  TORCH_CHECK(s.device().is_cpu() && s.scalar_type() == at::kFloat && s.is_contiguous() && s.dim() == 1 &&
                  s.size(0) == num_heads,
              kernel, ": sinks must be a contiguous float32 CPU tensor [", num_heads, "]");
  return s.data_ptr<float>();
}

// skinny_linear.cpp: y = x W^T + b for few rows of x.
at::Tensor skinny_linear(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias);
// The same for several weights that read one x (q/k/v, gate/up), in one parallel region.
std::vector<at::Tensor> skinny_linear_n(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                                        const std::vector<c10::optional<at::Tensor>>& biases);

// pair_linear.cpp: y = x W^T + b in bfloat16 on W packed in pairs of k (AVX512-BF16 builds only);
// preferred where the build has AVX512-BF16 and no AMX (whose oneDNN kernels are faster).
bool pair_linear_built();
bool pair_linear_preferred();
at::Tensor pair_pack(const at::Tensor& weight);
at::Tensor pair_linear(const at::Tensor& x, const at::Tensor& packed, int64_t N, const c10::optional<at::Tensor>& bias);

// quant_linear.cpp: y = x W^T + b for few rows of x, W in int8 (group 0: a scale per row) or int4
// (a scale per `group` k, and optionally a zero point per group; else 8).
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scale, int64_t group,
                        const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& zero);
// The same W dequantized into out ([N, K], float32 or bfloat16), for GEMMs of many rows.
void quant_dequantize_(at::Tensor& out, const at::Tensor& qweight, const at::Tensor& scale, int64_t group,
                       const c10::optional<at::Tensor>& zero);
// quant_linear for many rows: W decoded a tile at a time into float32 and multiplied there
// (tiled_gemm.h); bit for bit quant_linear's outputs.
at::Tensor quant_gemm(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scale, int64_t group,
                      const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& zero);

// gguf_linear.cpp: y = x W^T + b for few rows of x, W in a GGUF block layout ([N, row_bytes] uint8 of
// ggml type Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K or Q6_K).
at::Tensor gguf_linear(const at::Tensor& x, const at::Tensor& data, int64_t ggml_type,
                       const c10::optional<at::Tensor>& bias);
// The same W dequantized into out ([N, K], float32 or bfloat16), for GEMMs of many rows.
void gguf_dequantize_(at::Tensor& out, const at::Tensor& data, int64_t ggml_type);
// gguf_linear for several weights sharing x (q/k/v, gate/up): one parallel region; each output as
// gguf_linear gives it.
std::vector<at::Tensor> gguf_linear_n(const at::Tensor& x, const std::vector<at::Tensor>& data,
                                      const std::vector<int64_t>& ggml_types,
                                      const std::vector<c10::optional<at::Tensor>>& biases);
// gguf_linear for many rows, tiled as quant_gemm; bit for bit gguf_linear's outputs.
at::Tensor gguf_gemm(const at::Tensor& x, const at::Tensor& data, int64_t ggml_type,
                     const c10::optional<at::Tensor>& bias);
// gguf_int8.cpp: the same product with x quantized to int8 per 32 k (llama.cpp's numerics), any M.
at::Tensor gguf_linear_int8(const at::Tensor& x, const at::Tensor& data, int64_t ggml_type,
                            const c10::optional<at::Tensor>& bias);
// The same for several weights that read one x (q/k/v): x quantized once and, for K-quants on the row
// kernel, one parallel region; each output as gguf_linear_int8 gives it.
std::vector<at::Tensor> gguf_linear_int8_n(const at::Tensor& x, const std::vector<at::Tensor>& data,
                                           const std::vector<int64_t>& ggml_types,
                                           const std::vector<c10::optional<at::Tensor>>& biases);
// gguf_x8.cpp: Q4_K, Q6_K, Q5_0 and Q8_0 rows repacked eight at a time (gguf_x8.h; type ids 1012, 1014,
// 1006 and 1008, which gguf_linear_int8(_n) takes to gguf_x8_linear(_n)), the inverse, and whether this
// build prefers them.
at::Tensor gguf_x8_pack(const at::Tensor& data, int64_t ggml_type);
at::Tensor gguf_x8_unpack(const at::Tensor& packed, int64_t type);
at::Tensor gguf_x8_linear(const at::Tensor& x, const at::Tensor& packed, int64_t type,
                          const c10::optional<at::Tensor>& bias);
std::vector<at::Tensor> gguf_x8_linear_n(const at::Tensor& x, const std::vector<at::Tensor>& packed,
                                         const std::vector<int64_t>& types,
                                         const std::vector<c10::optional<at::Tensor>>& biases);
int64_t gguf_x8_type(int64_t ggml_type);
bool gguf_x8_preferred(int64_t ggml_type);
// cpu_amx (whether the kernels use AMX tiles): amx.h, bound by each family that has tile code.
// x [M, K] -> (int8 quants [M, K], scales [M, K / block]): the activations gguf_linear_int8 multiplies
// (block 32; 256 for the K-quants).
std::vector<at::Tensor> quantize_activations_int8(const at::Tensor& x, int64_t block);

// fused_moe.cpp: a mixture-of-experts layer's experts in one call (tokens grouped by expert, gate/up with
// the activation, down, and a combine in slot order). Formats: 0 float (x's dtype), 1 int8 (scale [E, N]),
// 2 int4 (param = group, scale [E, N, K / group]), 3 GGUF (param = ggml type); activation 0 silu, 1 swiglu_oai.
at::Tensor fused_moe(const at::Tensor& x, const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                     const at::Tensor& w13, const c10::optional<at::Tensor>& w13_scale, int64_t w13_format,
                     int64_t w13_param, const at::Tensor& w2, const c10::optional<at::Tensor>& w2_scale,
                     int64_t w2_format, int64_t w2_param, const c10::optional<at::Tensor>& b13,
                     const c10::optional<at::Tensor>& b2, int64_t activation, double alpha, double limit,
                     const c10::optional<at::Tensor>& w13_zero, const c10::optional<at::Tensor>& w2_zero);
// Whether fused_moe multiplies bfloat16 experts of these sizes with several tokens each on AMX tiles.
bool fused_moe_tiles(int64_t hidden, int64_t intermediate);

// moe_route.cpp: each token's top_k experts ([T, k] int32, largest weight first) and their float32 weights
// from router logits [T, E]: softmax then top k (renormalised when asked), or top k then softmax.
std::tuple<at::Tensor, at::Tensor> moe_route(const at::Tensor& logits, int64_t top_k, bool softmax_first,
                                             bool renormalize);

// kv_write.cpp: key/value [T, Hkv, D] into their slots of the paged cache (same dtype; slot < 0 skipped).
void write_kv_cache_(at::Tensor& kv_cache, const at::Tensor& key, const at::Tensor& value,
                     const at::Tensor& slot_mapping);

// rms_norm.cpp: transformers' RMSNorm, optionally after adding the residual.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
std::tuple<at::Tensor, at::Tensor> rms_norm_add(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps,
                                                const c10::optional<at::Tensor>& next_weight);
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps);

// silu_and_mul.cpp: silu(gate) * up from gate and up side by side ([T, 2I] -> [T, I]).
at::Tensor silu_and_mul(const at::Tensor& gate_up);
at::Tensor silu_and_mul_pair(const at::Tensor& gate, const at::Tensor& up);

// argmax.cpp: torch.argmax(dim=-1) of float32 rows (first index of the maximum, NaN first).
at::Tensor argmax_rows(const at::Tensor& logits);

// widen.cpp: bfloat16 / float16 to float32 (exact), any shape.
at::Tensor widen_to_float(const at::Tensor& x);

// rotary.cpp: rotate-half rotary embedding, in place on query and key.
void rotary_(at::Tensor& query, at::Tensor& key, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace tram
