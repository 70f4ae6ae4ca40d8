// The mixture-of-experts family: the fused expert kernel. Its functions are listed in tram/model/kernels/families.py.
#include "kernels.h"

// torch's pybind11 type casters (at::Tensor, optional) and pybind11's STL casters, not <torch/extension.h>:
// that also parses the whole C++ frontend (torch/all.h), seconds of every build that nothing here uses.
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include "amx.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Tram CPU kernels: moe";
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
  m.def("cpu_amx", &tram::amx::cpu_amx,
        "whether the kernels use AMX tiles (the K-quant GEMM, bfloat16 experts: built for them, granted by the OS, "
        "allowed); enable=True/False "
        "allows or forbids them first",
        py::arg("enable") = py::none());
}
