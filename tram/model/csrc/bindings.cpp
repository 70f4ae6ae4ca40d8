#include "kernels.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Tram CPU kernels";
  m.def("paged_decode_attention", &tram::paged_decode_attention,
        "Decode attention over a paged KV cache (CPU): (query [B,H,D], kv_cache [2,N,bs,Hkv,D], "
        "block_tables [B,M], seq_lens [B], scale, sliding_window (0 = none)) -> [B,H,D]",
        py::arg("query"), py::arg("kv_cache"), py::arg("block_tables"), py::arg("seq_lens"), py::arg("scale"),
        py::arg("sliding_window") = 0);
  m.def("skinny_linear", &tram::skinny_linear,
        "y = x W^T + b for a few rows of x (CPU): (x [M,K], weight [N,K], bias [N] or None) -> [M,N]",
        py::arg("x"), py::arg("weight"), py::arg("bias") = py::none());
}
