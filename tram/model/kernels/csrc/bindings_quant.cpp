// The int8/int4 family: linears on GPTQ, AWQ and compressed-tensors weights. Its functions are listed in tram/model/kernels/families.py.
#include "kernels.h"

// torch's pybind11 type casters (at::Tensor, optional) and pybind11's STL casters, not <torch/extension.h>:
// that also parses the whole C++ frontend (torch/all.h), seconds of every build that nothing here uses.
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Tram CPU kernels: quant";
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
  m.def("quant_gemm", &tram::quant_gemm,
        "quant_linear for many rows of x (CPU): W decoded a tile at a time, not into an [N,K] copy; the same "
        "arguments and bit for bit the same result",
        py::arg("x"), py::arg("qweight"), py::arg("scale"), py::arg("group"), py::arg("bias") = py::none(),
        py::arg("zero") = py::none());
}
