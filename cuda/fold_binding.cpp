// Python binding of cuda/fold.cu (loaded by prism/runtime/fold_cuda.py through torch.utils.cpp_extension).
#include <torch/extension.h>

#include <vector>

torch::Tensor fold_cuda(const std::vector<torch::Tensor>& inputs, int64_t op);
torch::Tensor finish_avg_cuda(const torch::Tensor& acc, int64_t n);
void fold_into_cuda(const std::vector<torch::Tensor>& inputs, torch::Tensor out, int64_t op);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("fold", &fold_cuda, "Left fold of same-shaped CUDA contributions, elementwise, rounding after each step",
        pybind11::arg("inputs"), pybind11::arg("op"));
  m.def("finish_avg", &finish_avg_cuda, "AVG's final division by the group size (true division; floor on ints)",
        pybind11::arg("acc"), pybind11::arg("n"));
  m.def("fold_into", &fold_into_cuda, "Left fold of contributions on the GPU or in pinned host memory into `out` "
        "(either place; no device allocation), synchronised", pybind11::arg("inputs"), pybind11::arg("out"),
        pybind11::arg("op"));
}
