// The GGUF family: linears on llama.cpp block formats (float and int8 activations, repacked rows). Its functions are listed in tram/model/kernels/families.py.
#include "kernels.h"

// torch's pybind11 type casters (at::Tensor, optional) and pybind11's STL casters, not <torch/extension.h>:
// that also parses the whole C++ frontend (torch/all.h), seconds of every build that nothing here uses.
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include "amx.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Tram CPU kernels: gguf";
  m.def("gguf_linear", &tram::gguf_linear,
        "y = x W^T + b for a few rows of x, W in a GGUF block layout (CPU): (x [M,K] float32 or bfloat16, "
        "data [N,row_bytes] uint8, ggml_type (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K), bias [N] or None) -> [M,N]",
        py::arg("x"), py::arg("data"), py::arg("ggml_type"), py::arg("bias") = py::none());
  m.def("gguf_linear_n", &tram::gguf_linear_n,
        "gguf_linear for several weights sharing x (CPU): (x [M,K], [data [N_i,row_bytes]], [ggml_type], "
        "[bias [N_i] or None]) -> [[M,N_i]]; one parallel region, each output as gguf_linear gives it",
        py::arg("x"), py::arg("data"), py::arg("ggml_types"), py::arg("biases"));
  m.def("gguf_gemm", &tram::gguf_gemm,
        "gguf_linear for many rows of x (CPU): W decoded a tile at a time, not into an [N,K] copy; the same "
        "arguments and bit for bit the same result",
        py::arg("x"), py::arg("data"), py::arg("ggml_type"), py::arg("bias") = py::none());
  m.def("gguf_dequantize_", &tram::gguf_dequantize_,
        "gguf_linear's W dequantized into out (CPU): (out [N,K] float32 or bfloat16, data, ggml_type)",
        py::arg("out"), py::arg("data"), py::arg("ggml_type"));
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
  m.def("gguf_x8_preferred", &tram::gguf_x8_preferred,
        "whether this build multiplies a ggml type (Q4_K, Q6_K) faster repacked eight rows at a time",
        py::arg("ggml_type"));
  m.def("quantize_activations_int8", &tram::quantize_activations_int8,
        "x [M,K] -> (int8 [M,K], scales [M,K/block]): gguf_linear_int8's activations (block 256: the K-quants')",
        py::arg("x"), py::arg("block") = 32);
  m.def("cpu_amx", &tram::amx::cpu_amx,
        "whether the kernels use AMX tiles (the K-quant GEMM, bfloat16 experts: built for them, granted by the OS, "
        "allowed); enable=True/False "
        "allows or forbids them first",
        py::arg("enable") = py::none());
}
