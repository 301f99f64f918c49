// binding.cpp -- fixed, protected file of every workspace (do not edit).
// The one module file: every kernels/*_binding.cpp registers itself with REGISTER_BINDING.
#include <pybind11/pybind11.h>

#include "binding_registry.h"

PYBIND11_MODULE(cuda_extension, m) {
    m.doc() = "Kernels of this workspace, one function per REGISTER_BINDING call.";
    cuda_agent::apply_bindings(m);
}
