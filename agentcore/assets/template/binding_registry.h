// binding_registry.h -- fixed, protected file of every workspace (do not edit).
//
// Each kernels/<name>_binding.cpp defines `static void register_<name>(pybind11::module& m)`
// that adds its functions to `m`, then writes `REGISTER_BINDING(<name>, register_<name>);`.
// The one fixed module file, binding.cpp, builds the Python module `cuda_extension` and
// applies every registered binding (sorted by name). Header-only and light on purpose: it
// pulls in pybind11 only, so it adds nothing to a binding's compile time.
#pragma once

#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace cuda_agent {

using BindingFn = void (*)(pybind11::module&);

struct Binding {
    const char* name;
    BindingFn fn;
};

// One list per loaded module: an inline function's static has a single instance per .so.
inline std::vector<Binding>& registered_bindings() {
    static std::vector<Binding> bindings;
    return bindings;
}

struct BindingRegistrar {
    BindingRegistrar(const char* name, BindingFn fn) { registered_bindings().push_back({name, fn}); }
};

// Static initialisers run in an unspecified order across files: sort so the module is the
// same on every build, and refuse a name registered twice (raised as ImportError).
inline void apply_bindings(pybind11::module& m) {
    auto bindings = registered_bindings();
    std::sort(bindings.begin(), bindings.end(),
              [](const Binding& a, const Binding& b) { return std::strcmp(a.name, b.name) < 0; });
    for (size_t i = 0; i < bindings.size(); ++i) {
        if (i > 0 && std::strcmp(bindings[i - 1].name, bindings[i].name) == 0) {
            throw std::runtime_error(std::string("REGISTER_BINDING name used twice: ") + bindings[i].name);
        }
        bindings[i].fn(m);
    }
}

}  // namespace cuda_agent

// REGISTER_BINDING(name, fn): `fn` has type void(pybind11::module&); `name` is an identifier.
#define REGISTER_BINDING(name, fn) \
    static ::cuda_agent::BindingRegistrar cuda_agent_registrar_##name(#name, fn)
